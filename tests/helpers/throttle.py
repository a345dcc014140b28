"""Real HTTP 429s on the sandbox: a FlowSchema that throttles one user and an admission webhook that answers 429."""

from __future__ import annotations

import base64
import http.server
import json
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env

from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.rules.resources import configmaps_path
from coordinator_sandbox import pki
from helpers.rbac import connect, grant, mint_user, stdout_ok, user_env

# The API Priority and Fairness API group's path.
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"


# Where validating webhook configurations are made.
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


# (cluster index, operation, resource, object name) of one admission request
Request = tuple[int, str, str, str]


def _one_object(cluster: int, name: str) -> Callable[[Request], bool]:
    return lambda k: k[0] == cluster and k[3] == name


@dataclass
class Rule:
    """What the webhook does with the admission requests ``match`` selects: hold, throttle or deny."""

    match: Callable[[Request], bool]
    hold_s: float = 0.0  # with ``release``: the longest it waits for it
    release: threading.Event | None = None  # hold until the test sets it
    throttle_s: int | None = None  # deny with 429 and this Retry-After
    deny: str | None = None  # deny with 403 and this message
    times: int | None = None  # None: every matching request


@dataclass
class Webhook:
    """A validating admission webhook (HTTPS on 127.0.0.1, one URL path per cluster) whose
    answers the test programs: hold a request for a while, or deny it with a 429."""

    sandbox: Any
    workdir: Path
    rules: list[Rule] = field(default_factory=list)
    seen: list[Request] = field(default_factory=list)
    installed: list[tuple[int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        pki_dir = Path(self.sandbox.dir) / "pki"
        ca = pki.KeyPair((pki_dir / "ca.crt").read_bytes(), (pki_dir / "ca.key").read_bytes())
        pair = pki.issue(ca, "coordinator-test-webhook", ip_addresses=["127.0.0.1"], server=True)
        pair.write(self.workdir / "webhook.crt", self.workdir / "webhook.key")
        self.ca_pem = ca.cert_pem
        self.lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                cluster = int(self.path.split("?")[0].strip("/c") or 0)
                answer = hook._decide(cluster, request)
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": request["uid"], **answer},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.workdir / "webhook.crt", self.workdir / "webhook.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _decide(self, cluster: int, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("name") or ((request.get("object") or {}).get("metadata") or {}).get("name") or ""
        key: Request = (cluster, request["operation"], request["resource"]["resource"], name)
        chosen: Rule | None = None
        with self.lock:
            self.seen.append(key)
            for rule in self.rules:
                if rule.match(key) and rule.times != 0:
                    chosen = rule
                    if rule.times is not None:
                        rule.times -= 1
                    break
        if chosen is None:
            return {"allowed": True}
        if chosen.release is not None:
            chosen.release.wait(timeout=chosen.hold_s or 60)
        elif chosen.hold_s:
            time.sleep(chosen.hold_s)
        if chosen.deny is not None:
            return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": chosen.deny}}
        if chosen.throttle_s is None:
            return {"allowed": True}
        return {
            "allowed": False,
            "status": {
                "code": 429,
                "reason": "TooManyRequests",
                "message": "too many writes, come back later",
                "details": {"retryAfterSeconds": chosen.throttle_s},
            },
        }

    def configuration(self, name: str, cluster: int, namespace: str) -> dict[str, Any]:
        port = self.server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": f"{name}.coordinator.test",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 30,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/c{cluster}",
                        "caBundle": base64.b64encode(self.ca_pem).decode(),
                    },
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "rules": [
                        {
                            "operations": ["CREATE", "UPDATE", "DELETE"],
                            "apiGroups": ["", "coordination.k8s.io"],
                            "apiVersions": ["v1"],
                            "resources": ["configmaps", "leases"],
                            "scope": "Namespaced",
                        }
                    ],
                }
            ],
        }

    def install(self, namespace: str, tag: str) -> None:
        """Register this webhook for ``namespace`` on the three clusters, and wait until each
        API server calls it (a new configuration takes effect asynchronously)."""
        for i in (1, 2, 3):
            name = f"coordinator-test-{tag}-c{i}"
            self.sandbox.admin(i).create(WEBHOOKS, self.configuration(name, i, namespace), exist_ok=False)
            self.installed.append((i, f"{WEBHOOKS}/{name}"))
        deadline = time.monotonic() + 30
        for i in (1, 2, 3):
            probe = f"probe-{secrets.token_hex(3)}"
            admin = self.sandbox.admin(i)
            while not self.saw(i, probe):
                assert time.monotonic() < deadline, f"the webhook is not called on cluster {i}"
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": probe}}
                admin.create(configmaps_path(namespace), body)
                admin.delete(f"{configmaps_path(namespace)}/{probe}")
                time.sleep(0.1)

    def saw(self, cluster: int, name: str) -> bool:
        with self.lock:
            return any(k[0] == cluster and k[3] == name for k in self.seen)

    def close(self) -> None:
        for i, path in self.installed:
            self.sandbox.admin(i).delete(path)
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Throttled:
    """A deployment ``web`` on three clusters, used by a user that the API servers can be
    made to throttle."""

    env: Env
    user: str
    minted: Any
    webhook: Webhook
    tag: str
    cleanup: list[tuple[int, str]] = field(default_factory=list)
    blockers: list[threading.Thread] = field(default_factory=list)

    def allow_one_request_at_a_time(self, *clusters: int) -> None:
        """API Priority and Fairness on ``clusters``: this user's requests get no seats of
        their own and may borrow none, and are rejected (not queued) when one is running."""
        level = f"one-at-a-time-{self.tag}"
        for i in clusters:
            admin = self.env.sandbox.admin(i)
            admin.create(
                f"{FLOWCONTROL}/prioritylevelconfigurations",
                {
                    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                    "kind": "PriorityLevelConfiguration",
                    "metadata": {"name": level},
                    "spec": {
                        "type": "Limited",
                        "limited": {
                            "nominalConcurrencyShares": 0,
                            "lendablePercent": 0,
                            "borrowingLimitPercent": 0,
                            "limitResponse": {"type": "Reject"},
                        },
                    },
                },
                exist_ok=False,
            )
            admin.create(
                f"{FLOWCONTROL}/flowschemas",
                {
                    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                    "kind": "FlowSchema",
                    "metadata": {"name": level},
                    "spec": {
                        "priorityLevelConfiguration": {"name": level},
                        "matchingPrecedence": 100,
                        "distinguisherMethod": {"type": "ByUser"},
                        "rules": [
                            {
                                "subjects": [{"kind": "User", "user": {"name": self.user}}],
                                "resourceRules": [
                                    {
                                        "verbs": ["*"],
                                        "apiGroups": ["*"],
                                        "resources": ["*"],
                                        "namespaces": ["*"],
                                        "clusterScope": True,
                                    }
                                ],
                                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                            }
                        ],
                    },
                },
                exist_ok=False,
            )
            self.cleanup += [
                (i, f"{FLOWCONTROL}/flowschemas/{level}"),
                (i, f"{FLOWCONTROL}/prioritylevelconfigurations/{level}"),
            ]
        self._wait_for_the_flow_schema(clusters, level)

    def _wait_for_the_flow_schema(self, clusters: tuple[int, ...], level: str) -> None:
        """The API server applies a new FlowSchema asynchronously: wait until it is in force,
        that is until a request of the user's is refused while another one runs."""
        deadline = time.monotonic() + 30
        for i in clusters:
            while True:
                self.hold_a_request(i, 1.0)
                refused = self._refused(i)
                for thread in self.blockers:  # the seat is free again before anything else
                    thread.join(timeout=30)
                if refused:
                    break
                assert time.monotonic() < deadline, f"FlowSchema {level} is not in force on cluster {i}"

    def _refused(self, cluster: int) -> bool:
        async def probe() -> bool:
            client = self.client(cluster, timeout=0.5)  # too short to wait out Retry-After
            try:
                await client.request("GET", "/version")
            except KubeError as err:
                return err.kind == "throttled"
            finally:
                await client.close()
            return False

        return anyio.run(probe)

    def cli(self, *args: str) -> Any:
        """The command line as this user, holding locks as ``busy``."""
        return self.env.cli(*args, env={"COORDINATOR_HOLDER": "busy"})

    def client(self, cluster: int, timeout: float = 5.0) -> KubeClient:
        return KubeClient(
            Endpoint(f"u{cluster}", self.minted.contexts[cluster - 1], str(self.minted.path)), timeout=timeout
        )

    def hold_a_request(self, cluster: int, seconds: float) -> None:
        """Keep one of this user's requests executing on ``cluster`` for ``seconds`` (the
        webhook holds it), and return once it is: its seat is taken meanwhile."""
        name = f"blocker-{secrets.token_hex(3)}"
        self.webhook.rules.insert(0, Rule(_one_object(cluster, name), hold_s=seconds, times=1))

        async def create() -> None:
            client = self.client(cluster, timeout=seconds + 10)
            try:
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
                await client.request("POST", configmaps_path(self.env.namespace), body=body)
            finally:
                await client.close()

        thread = threading.Thread(target=lambda: anyio.run(create), daemon=True)
        thread.start()
        self.blockers.append(thread)
        deadline = time.monotonic() + 15
        while not self.webhook.saw(cluster, name):
            assert time.monotonic() < deadline, "the held request never reached the webhook"
            time.sleep(0.05)

    def throttle_writes(self, cluster: int, name: str, *, retry_after: int, times: int | None) -> None:
        """The webhook denies writes of ``name`` on ``cluster`` with 429 and Retry-After."""
        self.webhook.rules.append(Rule(_one_object(cluster, name), throttle_s=retry_after, times=times))

    def finish(self) -> None:
        for thread in self.blockers:
            thread.join(timeout=60)
        for i, path in self.cleanup:
            self.env.sandbox.admin(i).delete(path)


@pytest.fixture
def throttled(sandbox3: Any, namespace: str, tmp_path: Path) -> Iterator[Throttled]:
    """A Throttled set-up in a fresh namespace of sandbox3, removed after the test."""
    user, minted = mint_user(sandbox3, tmp_path, "busy")
    env = user_env(sandbox3, tmp_path, namespace, "busy")
    grant(sandbox3, env, namespace, user, deployments=("web",))
    connect(env, minted)
    members = ["--cluster", "u1", "--cluster", "u2", "--cluster", "u3"]
    stdout_ok(env.cli("deployment", "create", "web", "-n", namespace, *members))
    env.clusters = ["u1", "u2", "u3"]
    tag = secrets.token_hex(3)
    webhook = Webhook(sandbox3, tmp_path)
    setup = Throttled(env, user, minted, webhook, tag)
    try:
        webhook.install(namespace, tag)
        yield setup
    finally:
        setup.finish()
        webhook.close()


def outcomes_of(proc: Any) -> dict[str, str]:
    """Each cluster's outcome in a command's JSON output, by cluster name."""
    return {c["name"]: c["outcome"] for c in json.loads(proc.stdout)["clusters"]}


def retried(stderr: str) -> int:
    """How many times a command's stderr says it retried after a 429."""
    return stderr.count("throttled; retrying after the server's Retry-After")
