"""A `lock run` keeps its lock while the credential it reaches the members with is replaced
and the old one revoked, as a cloud provider's exec plugin token is (an EKS token lives
15 minutes, a long rollout outlives it).

Each member is reached as a ServiceAccount whose token comes from an exec plugin in the
kubeconfig. The tokens are bound to a Secret (TokenRequest's boundObjectRef): deleting
the Secret revokes them at once, which the test checks on its own before it relies on it.
Mid-hold the plugin starts giving tokens bound to another Secret and the first Secret is
deleted on every member; renewals are then refused (401) everywhere until the plugin is
run again."""

from __future__ import annotations

import http.client
import json
import secrets
import ssl
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from coord_fixtures import UNHURRIED, Env

from coordinator.rules.resources import lease_path, parse_time

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Long enough that renewals under a heavily loaded machine (the exec plugin is a Python
# process started again after the rotation) still land within one validity period: at 8 s
# the lock run lost its lock in 2 of 5 runs at a load average of 20-30, rotation or not.
TTL_S = 15
PLUGIN = """\
import datetime, json, os, sys
from pathlib import Path
token_file, runs = Path(sys.argv[1]), Path(sys.argv[2])
with runs.open("a") as log:
    log.write(f"{os.getppid()}:{token_file.name}\\n")
later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1",
    "kind": "ExecCredential",
    "status": {"token": token_file.read_text().strip(), "expirationTimestamp": later.strftime("%Y-%m-%dT%H:%M:%SZ")},
}))
"""


def _secret_bound_token(admin: Any, namespace: str, account: str, secret: str) -> str:
    made = admin.create(f"/api/v1/namespaces/{namespace}/secrets", {"metadata": {"name": secret}}, exist_ok=False)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": secret, "uid": made["metadata"]["uid"]},
        },
    }
    reply = admin.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)
    assert reply.status == 201, reply.json()
    return str(reply.json()["status"]["token"])


def _status_with(token: str, server: str) -> int:
    """What the API server at ``server`` answers a plain read made with ``token``."""
    host, port = server.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only the status matters
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        conn.request("GET", "/api/v1/namespaces/kube-system", headers={"Authorization": f"Bearer {token}"})
        return conn.getresponse().status
    finally:
        conn.close()


def _until(check: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_lock_run_holds_through_a_rotated_and_revoked_exec_token(dep3: Env, tmp_path: Path) -> None:
    sandbox, namespace = dep3.sandbox, dep3.namespace
    account = "rot-" + secrets.token_hex(3)
    tokens, runs = tmp_path / "tokens", tmp_path / "plugin-runs"
    tokens.mkdir()
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    first: dict[int, str] = {}
    second: dict[int, str] = {}
    for i in (1, 2, 3):
        admin = sandbox.admin(i)
        admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}})
        admin.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": f"{account}-{namespace}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            },
        )
        first[i] = _secret_bound_token(admin, namespace, account, f"{account}-1")
        second[i] = _secret_bound_token(admin, namespace, account, f"{account}-2")
        (tokens / f"c{i}").write_text(first[i])

    # The sandbox's contexts, each reached as the ServiceAccount through the plugin.
    kubeconfig = yaml.safe_load(Path(dep3.kubeconfig).read_text())
    for entry in kubeconfig["contexts"]:
        if entry["name"] in ("sandbox-1", "sandbox-2", "sandbox-3"):
            entry["context"]["user"] = f"rotating-{entry['name'][-1]}"
    kubeconfig["users"] = [
        {
            "name": f"rotating-{i}",
            "user": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": sys.executable,
                    "args": [str(plugin), str(tokens / f"c{i}"), str(runs)],
                    "interactiveMode": "Never",
                }
            },
        }
        for i in (1, 2, 3)
    ]
    rotating = tmp_path / "rotating.kubeconfig"
    rotating.write_text(yaml.safe_dump(kubeconfig))
    config = yaml.safe_load(dep3.config.read_text())
    for record in config["clusters"].values():
        record["kubeconfig"] = str(rotating)
    config_path = tmp_path / "rotating-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {**UNHURRIED, "COORDINATOR_CONFIG": str(config_path)}

    started, stop = tmp_path / "started", tmp_path / "stop"
    step = f"touch {started}; while [ ! -e {stop} ]; do sleep 0.2; done"
    run = dep3.popen(
        "lock", "run", dep3.deployment, "--ttl", f"{TTL_S}s", "--holder", "long-rollout", "--", "sh", "-c", step,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _until(lambda: started.exists() or run.poll() is not None, "the step did not start")
        assert run.poll() is None, run.communicate()
        loaded = runs.read_text().split()

        # Rotate: the plugin gives the second token from now on; the first is revoked.
        for i in (1, 2, 3):
            (tokens / f"c{i}").write_text(second[i])
            sandbox.admin(i).delete(f"/api/v1/namespaces/{namespace}/secrets/{account}-1")
        for i in (1, 2, 3):
            _until(
                lambda i=i: _status_with(first[i], sandbox.server(i)) == 401,
                f"cluster {i} still takes the revoked token",
            )
            assert _status_with(second[i], sandbox.server(i)) == 200
        # Without a new token every renewal since the revocation is refused, and the lock
        # is lost within one validity period: wait until a majority's leases were renewed
        # (renewTime, this machine's clock) more than one TTL after every member refused
        # the old token, which only renewals made with the new one can do.
        revoked_at = datetime.now(UTC)

        def renewed_past_one_ttl() -> bool:
            assert run.poll() is None, run.communicate()
            late = 0
            for i in (1, 2, 3):
                lease = sandbox.admin(i).get(lease_path(namespace, f"coordinator-lock-{dep3.deployment}"))
                renewed = parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
                late += renewed is not None and (renewed - revoked_at).total_seconds() > TTL_S
            return late >= 2

        _until(renewed_past_one_ttl, "no majority renewed more than one TTL after the revocation", timeout=120)
        assert run.poll() is None, run.communicate()
        status = dep3.cli("-o", "json", "lock", "status", dep3.deployment, env=env)
        assert status.returncode == 0, status.stderr
        held = json.loads(status.stdout)
        assert held["holder"] == "long-rollout" and held["held_by_majority"], held
        stop.touch()
        _, err = run.communicate(timeout=60)
    finally:
        stop.touch()
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err
    # The hold ran the plugin once per member when it started, and again for every member
    # once its token was refused (the plugin logs who ran it: its parent process).
    by_run = [line.split(":")[1] for line in runs.read_text().split() if line.split(":")[0] == str(run.pid)]
    assert sorted(by_run[:3]) == ["c1", "c2", "c3"] and len(loaded) >= 3, by_run
    assert {"c1", "c2", "c3"} <= set(by_run[3:]), by_run
