"""`cluster connect NAME --in-cluster`: a pod's ServiceAccount credentials, against a
sandbox API server, with a real token from the TokenRequest API written where a pod
would have it mounted (a temporary directory standing in for
/var/run/secrets/kubernetes.io/serviceaccount)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from coordinator.kube.client import FORBIDDEN, Endpoint, KubeClient, KubeError
from coordinator.rules.resources import namespace_path

pytestmark = pytest.mark.integration


async def _admin(sandbox: Any, method: str, path: str, body: Any = None) -> dict[str, Any]:
    client = KubeClient(Endpoint("c1", "sandbox-1", str(sandbox.kubeconfig)), timeout=10)
    try:
        return (await client.request(method, path, body=body)).body
    finally:
        await client.close()


def _service_account(sandbox: Any) -> tuple[str, str]:
    """A ServiceAccount bound to cluster-admin on cluster 1: (namespace, name)."""
    namespace, name = "default", "ci-" + secrets.token_hex(4)

    async def go() -> None:
        await _admin(sandbox, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
        await _admin(
            sandbox,
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        )

    anyio.run(go)
    return namespace, name


def _token(sandbox: Any, namespace: str, name: str) -> str:
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    return str(anyio.run(_admin, sandbox, "POST", path, request)["status"]["token"])


def _mount(sandbox: Any, where: Path, token: str) -> None:
    """What the kubelet puts in a pod: token and ca.crt (and the namespace)."""
    where.mkdir(parents=True, exist_ok=True)
    kubeconfig = yaml.safe_load(Path(sandbox.kubeconfig).read_text())
    cluster = next(c["cluster"] for c in kubeconfig["clusters"] if c["cluster"]["server"] == sandbox.server(1))
    (where / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    (where / "namespace").write_text("default")
    _rotate(where, token)


def _rotate(where: Path, token: str) -> None:
    """Replace the token the way the kubelet does: a new file swapped in by rename."""
    new = where / ".token.new"
    new.write_text(token)
    os.replace(new, where / "token")


def _pod_env(sandbox: Any, config: Path, sa_dir: Path | None = None) -> dict[str, str]:
    host, port = sandbox.server(1).removeprefix("https://").rsplit(":", 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_") and k != "KUBECONFIG"}
    env.update(
        {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "COORDINATOR_CONFIG": str(config),
            "XDG_STATE_HOME": str(config.parent / "state"),
            "KUBECONFIG": str(config.parent / "no-kubeconfig"),  # nothing to fall back on
            "NO_COLOR": "1",
        }
    )
    if sa_dir is not None:
        env["COORDINATOR_SERVICEACCOUNT_DIR"] = str(sa_dir)
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_connect_in_cluster_and_take_a_lock(sandbox3: Any, tmp_path: Path) -> None:
    namespace, name = _service_account(sandbox3)
    sa_dir = tmp_path / "serviceaccount"
    _mount(sandbox3, sa_dir, _token(sandbox3, namespace, name))
    env = _pod_env(sandbox3, tmp_path / "config" / "config.yaml", sa_dir)

    proc = _cli(env, "cluster", "connect", "home", "--in-cluster", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    uid = anyio.run(_admin, sandbox3, "GET", namespace_path("kube-system"))["metadata"]["uid"]
    assert (rec["context"], rec["in_cluster"], rec["identity"]) == ("in-cluster", str(sa_dir), uid)
    assert rec["server"] == sandbox3.server(1)

    dep_ns = "t-" + secrets.token_hex(4)
    for args in (
        ("deployment", "create", "ci", "-n", dep_ns, "--cluster", "home"),
        ("lock", "acquire", "ci", "--ttl", "60"),
    ):
        proc = _cli(env, *args)
        assert proc.returncode == 0, f"{args}: {proc.stderr}"
    status = json.loads(_cli(env, "lock", "status", "ci", "-o", "json").stdout)
    assert status["held_by_majority"] is True, status
    assert _cli(env, "lock", "release", "ci").returncode == 0


def test_a_rotated_token_is_read_again(sandbox3: Any, tmp_path: Path) -> None:
    """One client, three tokens: a valid one, a revoked stand-in (an invalid token, 401),
    and a fresh one from the TokenRequest API; each request uses the file's token."""
    namespace, name = _service_account(sandbox3)
    sa_dir = tmp_path / "serviceaccount"
    _mount(sandbox3, sa_dir, _token(sandbox3, namespace, name))
    host, port = sandbox3.server(1).removeprefix("https://").rsplit(":", 1)

    async def go() -> None:
        client = KubeClient(Endpoint("home", "in-cluster", None, str(sa_dir)), timeout=10)
        try:
            assert (await client.request("GET", namespace_path("default"))).status == 200
            _rotate(sa_dir, "not-a-valid-token")
            with pytest.raises(KubeError) as refused:
                await client.request("GET", namespace_path("default"))
            assert refused.value.kind == FORBIDDEN and refused.value.status == 401
            _rotate(sa_dir, await anyio.to_thread.run_sync(_token, sandbox3, namespace, name))
            assert (await client.request("GET", namespace_path("default"))).status == 200
        finally:
            await client.close()

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBERNETES_SERVICE_HOST", host)
        mp.setenv("KUBERNETES_SERVICE_PORT", port)
        anyio.run(go)


def test_outside_a_pod_in_cluster_says_what_is_missing(sandbox3: Any, tmp_path: Path) -> None:
    env = _pod_env(sandbox3, tmp_path / "config.yaml", tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    proc = _cli(env, "cluster", "connect", "home", "--in-cluster")
    assert proc.returncode == 2 and "No ServiceAccount token at" in proc.stderr, proc.stderr
    del env["KUBERNETES_SERVICE_HOST"]
    proc = _cli(env, "cluster", "connect", "home", "--in-cluster")
    assert proc.returncode == 2 and "KUBERNETES_SERVICE_HOST" in proc.stderr, proc.stderr
    proc = _cli(env, "cluster", "connect", "home", "--in-cluster", "--context", "sandbox-1")
    assert proc.returncode == 2 and "either --context" in proc.stderr, proc.stderr
