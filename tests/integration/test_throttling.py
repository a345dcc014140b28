"""Throttling (HTTP 429) on real API servers: honoured within the deadline, never misread.

Two real sources of 429, each on the sandbox's kube-apiservers:

- **API Priority and Fairness.** A PriorityLevelConfiguration with no seats of its own
  and no borrowing (``Reject`` when full) and a FlowSchema sending one user's requests
  there: that user's requests run one at a time, and while one is executing every other
  is refused by the API server with ``429`` and ``Retry-After: 1``. A request is kept
  executing, on purpose, by an admission webhook that holds it (``_Webhook.hold``): so
  the throttling is deterministic, and it hits reads as well as writes.
- **An admission webhook** denying a write with code 429 and ``retryAfterSeconds``: the
  API server answers the client with that status and a ``Retry-After`` header.

The user is a freshly minted one with exactly what ``rbac print`` grants; only its
requests, in the test's namespace, are affected.
"""

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
from test_rbac_live import _connect, _env, _grant, _json, _ok, _user

from coordinator.kube.client import Endpoint, KubeClient, KubeError, _classify_status, _retry_after
from coordinator.kube.resources import configmaps_path, lease_path
from coordinator.outcome import Outcome
from coordinator.sandbox import pki

pytestmark = pytest.mark.integration

FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"

# (cluster index, operation, resource, object name) of one admission request
Request = tuple[int, str, str, str]


@dataclass
class _Rule:
    match: Callable[[Request], bool]
    hold_s: float = 0.0
    throttle_s: int | None = None  # deny with 429 and this Retry-After
    deny: str | None = None  # deny with 403 and this message
    times: int | None = None  # None: every matching request


@dataclass
class _Webhook:
    """A validating admission webhook (HTTPS on 127.0.0.1, one URL path per cluster) whose
    answers the test programs: hold a request for a while, or deny it with a 429."""

    sandbox: Any
    workdir: Path
    rules: list[_Rule] = field(default_factory=list)
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
        chosen: _Rule | None = None
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
        if chosen.hold_s:
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
    webhook: _Webhook
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
        self.webhook.rules.insert(
            0, _Rule(lambda k, c=cluster, n=name: k[0] == c and k[3] == n, hold_s=seconds, times=1)
        )

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
        self.webhook.rules.append(
            _Rule(lambda k, c=cluster, n=name: k[0] == c and k[3] == n, throttle_s=retry_after, times=times)
        )

    def finish(self) -> None:
        for thread in self.blockers:
            thread.join(timeout=60)
        for i, path in self.cleanup:
            self.env.sandbox.admin(i).delete(path)


@pytest.fixture
def throttled(sandbox3: Any, namespace: str, tmp_path: Path) -> Iterator[Throttled]:
    user, minted = _user(sandbox3, tmp_path, "busy")
    env = _env(sandbox3, tmp_path, namespace, "busy")
    _grant(sandbox3, env, namespace, user, deployments=("web",))
    _connect(env, minted)
    members = ["--cluster", "u1", "--cluster", "u2", "--cluster", "u3"]
    _ok(env.cli("deployment", "create", "web", "-n", namespace, *members))
    env.clusters = ["u1", "u2", "u3"]
    tag = secrets.token_hex(3)
    webhook = _Webhook(sandbox3, tmp_path)
    setup = Throttled(env, user, minted, webhook, tag)
    try:
        webhook.install(namespace, tag)
        yield setup
    finally:
        setup.finish()
        webhook.close()


def _outcomes(proc: Any) -> dict[str, str]:
    return {c["name"]: c["outcome"] for c in json.loads(proc.stdout)["clusters"]}


def _retried(stderr: str) -> int:
    return stderr.count("throttled; retrying after the server's Retry-After")


# ------------------------------------------------------------------ API Priority and Fairness


def test_apf_throttles_a_busy_user_with_429_and_retry_after(throttled: Throttled) -> None:
    """The harness itself: while one of the user's requests runs, the API server refuses
    the next one with 429 and Retry-After, and the client classifies it as throttled."""
    throttled.allow_one_request_at_a_time(1)
    throttled.hold_a_request(1, 4)

    async def ask() -> KubeError:
        client = throttled.client(1, timeout=1.0)  # too short to wait out Retry-After
        try:
            with pytest.raises(KubeError) as caught:
                await client.request("GET", lease_path(throttled.env.namespace, "coordinator-lock-web"))
            return caught.value
        finally:
            await client.close()

    err = anyio.run(ask)
    assert err.kind == "throttled" and err.status == 429, err.detail
    assert err.retry_after == 1.0, err.detail
    assert "not retried" in err.detail, err.detail


def test_a_throttled_read_is_retried_after_retry_after_within_the_deadline(throttled: Throttled) -> None:
    """Two of three clusters refuse the user's reads for a few seconds: the command waits
    out Retry-After and reads them, instead of failing for want of a majority."""
    throttled.allow_one_request_at_a_time(1, 2)
    for i in (1, 2):
        throttled.hold_a_request(i, 2.5)
    proc = throttled.cli("-v", "--timeout", "10s", "-o", "json", "lock", "status", "web")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert {c["status"] for c in status["clusters"]} == {"free"}, status
    assert _retried(proc.stderr) >= 2, proc.stderr  # both throttled clusters were retried


def test_throttling_past_the_deadline_is_unobservable_never_free(throttled: Throttled) -> None:
    throttled.allow_one_request_at_a_time(1, 2)
    for i in (1, 2):
        throttled.hold_a_request(i, 12)
    proc = throttled.cli("--timeout", "2s", "-o", "json", "lock", "acquire", "web")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    outcomes = _outcomes(proc)
    assert outcomes["u1"] == outcomes["u2"] == "throttled", outcomes
    assert "never counted as free" in proc.stderr and "throttled" in proc.stderr, proc.stderr
    for thread in throttled.blockers:
        thread.join(timeout=30)
    # Nothing was left taken where it could be: the lease on u3 is free again.
    status = _json(throttled.cli("-o", "json", "lock", "status", "web"))
    assert not status["held_by_majority"] and {c["status"] for c in status["clusters"]} == {"free"}, status


# ------------------------------------------------------------------ 429 from an admission webhook


def test_a_write_throttled_by_a_webhook_is_written_after_retry_after(throttled: Throttled) -> None:
    _ok(throttled.cli("lock", "acquire", "web", "--ttl", "60s"))
    for i in (1, 2):
        throttled.throttle_writes(i, "coordinator-state-web", retry_after=1, times=1)
    proc = throttled.cli("-v", "--timeout", "5s", "-o", "json", "state", "set", "web", "owner=team")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(json.loads(proc.stdout)["confirmed"]) == ["u1", "u2", "u3"], proc.stdout
    assert _retried(proc.stderr) >= 2, proc.stderr
    assert _json(throttled.cli("-o", "json", "state", "get", "web")) == {"owner": "team"}


def test_a_write_refused_for_load_is_reported_as_not_written(throttled: Throttled) -> None:
    env = throttled.env
    _ok(throttled.cli("lock", "acquire", "web", "--ttl", "60s"))
    _ok(throttled.cli("state", "set", "web", "owner=team"))
    before = [env.sandbox.admin(i).get(f"{configmaps_path(env.namespace)}/coordinator-state-web") for i in (1, 2, 3)]
    for i in (1, 2, 3):  # Retry-After longer than the command may wait
        throttled.throttle_writes(i, "coordinator-state-web", retry_after=30, times=None)
    proc = throttled.cli("--timeout", "3s", "-o", "json", "state", "set", "web", "owner=other")
    assert proc.returncode != 0
    assert "Outcome unknown" not in proc.stderr, proc.stderr
    assert "Nothing was written" in proc.stderr, proc.stderr
    assert set(_outcomes(proc).values()) == {"throttled"}, proc.stdout
    after = [env.sandbox.admin(i).get(f"{configmaps_path(env.namespace)}/coordinator-state-web") for i in (1, 2, 3)]
    assert [a["metadata"]["resourceVersion"] for a in after] == [b["metadata"]["resourceVersion"] for b in before]


def test_a_renewal_throttled_once_is_retried_not_lost(throttled: Throttled) -> None:
    _ok(throttled.cli("lock", "acquire", "web", "--ttl", "60s"))
    for i in (1, 2):
        throttled.throttle_writes(i, "coordinator-lock-web", retry_after=1, times=1)
    proc = throttled.cli("-v", "--timeout", "5s", "-o", "json", "lock", "renew", "web")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "may be lost" not in proc.stderr and "lost" not in proc.stdout, proc.stdout + proc.stderr
    assert _retried(proc.stderr) >= 1, proc.stderr
    status = _json(throttled.cli("-o", "json", "lock", "status", "web"))
    assert status["held_by_majority"] and status["holder"] == "busy", status


# ------------------------------------------------------------------ classification


def test_429_is_throttled_and_unobservable() -> None:
    err = _classify_status(429, b'{"message": "Too many requests"}', {}, retry_after=2.0)
    assert err.kind == "throttled" and err.retry_after == 2.0 and "retry after 2s" in err.detail
    assert not Outcome.THROTTLED.observable
    from coordinator.clusters import outcome_of

    assert outcome_of(err) is Outcome.THROTTLED


@pytest.mark.parametrize(
    ("header", "expected"),
    [("1", 1.0), ("0", 0.0), (" 7 ", 7.0), ("-3", None), ("soon", None), ("nan", None), ("inf", None), (None, None)],
)
def test_retry_after_in_seconds(header: str | None, expected: float | None) -> None:
    assert _retry_after(header, None) == expected


def test_retry_after_as_a_date_is_read_against_the_servers_own_date() -> None:
    from email.utils import parsedate_to_datetime

    server = parsedate_to_datetime("Tue, 01 Dec 2026 10:00:00 GMT")
    assert _retry_after("Tue, 01 Dec 2026 10:00:05 GMT", server) == 5.0
    assert _retry_after("Tue, 01 Dec 2026 10:00:05 GMT", None) is None  # no clock to read it by
