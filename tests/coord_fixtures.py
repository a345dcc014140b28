"""Fixtures that put coordinator itself on top of the sandbox clusters.

``dep3`` / ``dep5``: a fresh local config with every sandbox cluster connected
(``c1``..``cN``) and a deployment ``web`` in a fresh namespace spanning them all.
``Env.cli(...)`` runs the real command line in a process of its own (forked from a
server that has done the imports already, see ``cliserver``; ``popen`` and commands
under a prefix such as ``faketime`` start a fresh interpreter); ``Env.api()`` gives an
in-process :class:`Coordinator` for the same config.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import cliserver
import pytest

from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet
from coordinator.kube.client import Endpoint, KubeClient
from coordinator.ops.admin import connect_cluster, create_deployment
from coordinator.ops.api import Coordinator

# The environment of a member change whose every member the test then checks: the suite's
# 3 s request timeout is raised. The commit is confirmed on majorities, and a member whose
# write timed out under a full run's load keeps the set before it until the next take, which
# is correct and not what those tests are about.
COMMIT_TIMEOUT_S = 20
COMMIT_EVERYWHERE = {"COORDINATOR_TIMEOUT": f"{COMMIT_TIMEOUT_S}s"}

# The same for a command in a test that is not about timeouts and needs every member's
# answer to check what it checks (a refusal's exit code, replicas left as they were): a
# request that a loaded machine's API server answers after 3 s would otherwise make it an
# "unreachable" member, a write that lands after the command gave up on it, or exit 4. Not
# for commands that meet a paused member, which would cost the whole timeout.
UNHURRIED = COMMIT_EVERYWHERE

# A command run while every server of the sandbox runs gets this request timeout, not the
# suite's 3 s: every member is there to answer, so an answer slower than 3 s is the load of
# a full run (seen: 4.2 s), not a fault the test made, and the test is not about it. While
# a server is paused, stopped or killed the 3 s stands, so that meeting it costs little;
# a test that needs a deadline of its own with every server running passes --timeout.
CALM_TIMEOUT = "10s"


def _every_server_runs(sandbox: Any) -> bool:
    """Whether every etcd, kube-apiserver and front proxy of ``sandbox`` runs (none
    paused, stopped or killed), as `sandbox status` judges them."""
    from coordinator_sandbox.records import Layout, require_record
    from coordinator_sandbox.servers import component_state

    try:
        record = require_record(Layout.of(sandbox.dir))
    except Exception:  # not a sandbox (or gone): keep the suite's deadline
        return False
    return all(component_state(server) == "running" for c in record.clusters for server in c.servers())


@dataclass
class Env:
    sandbox: Any
    config: Path
    namespace: str
    deployment: str = "web"
    clusters: list[str] = field(default_factory=list)
    home: Path | None = None

    @property
    def kubeconfig(self) -> str:
        return str(self.sandbox.kubeconfig)

    def environ(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("COORDINATOR_LOCK_ID", None)
        env.pop("COORDINATOR_HOLDER", None)
        env.update(
            {
                "COORDINATOR_CONFIG": str(self.config),
                "KUBECONFIG": self.kubeconfig,
                "COORDINATOR_TIMEOUT": "3s",
                "XDG_STATE_HOME": str(self.config.parent / "state"),
                "NO_COLOR": "1",
            }
        )
        env.update(extra)
        return env

    def cli(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        prefix: list[str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        calm = {"COORDINATOR_TIMEOUT": CALM_TIMEOUT} if _every_server_runs(self.sandbox) else {}
        environ = self.environ(**{**calm, **(env or {})})
        if not prefix:  # a fresh interpreter's command, without its second of imports
            return cliserver.run(list(args), environ, timeout=timeout, input=input)
        cmd = [*prefix, sys.executable, "-m", "coordinator", *args]
        return subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=timeout, input=input)

    def popen(
        self, *args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None, **kw: Any
    ) -> subprocess.Popen[str]:
        cmd = [*(prefix or []), sys.executable, "-m", "coordinator", *args]
        return subprocess.Popen(cmd, env=self.environ(**(env or {})), text=True, **kw)

    def api(self, timeout: float = 3.0) -> Coordinator:
        return Coordinator.from_config(str(self.config), timeout=timeout)

    def client(self, index: int) -> KubeClient:
        """A raw client to sandbox cluster ``index`` (1-based), for arranging and inspecting."""
        return KubeClient(Endpoint(f"c{index}", f"sandbox-{index}", self.kubeconfig), timeout=5)

    async def raw(self, index: int, method: str, path: str, body: Any = None) -> dict[str, Any]:
        client = self.client(index)
        try:
            return (await client.request(method, path, body=body)).body
        finally:
            await client.close()


async def put_lease(env: Env, index: int, body: dict[str, Any]) -> dict[str, Any]:
    """Write a lease by hand on cluster ``index``, over the one the deployment was created
    with (as another client would), or create it where there is none."""
    from coordinator.kube.client import KubeError
    from coordinator.rules.resources import lease_path, leases_path

    name = body["metadata"]["name"]
    try:
        current = await env.raw(index, "GET", lease_path(env.namespace, name))
    except KubeError as err:
        if err.kind != "not-found":
            raise
        return await env.raw(index, "POST", leases_path(env.namespace), body)
    # Another client editing our lease: what it does not set stays (the annotations that
    # name this very object among them).
    annotations = {**(current["metadata"].get("annotations") or {}), **(body["metadata"].get("annotations") or {})}
    meta = {
        **body["metadata"],
        "annotations": annotations,
        "resourceVersion": current["metadata"]["resourceVersion"],
    }
    return await env.raw(index, "PUT", lease_path(env.namespace, name), {**body, "metadata": meta})


def make_env(
    sandbox: Any,
    tmp_path: Path,
    *,
    deployment: str = "web",
    max_ttl_s: float | None = None,
    storage: str = "configmap",
) -> Env:
    namespace = "t-" + secrets.token_hex(4)
    cfg = tmp_path / "config" / "config.yaml"
    env = Env(sandbox=sandbox, config=cfg, namespace=namespace, deployment=deployment)
    store = ConfigStore(cfg)
    names = [f"c{i}" for i in range(1, sandbox.n + 1)]

    async def setup() -> None:
        for i, name in enumerate(names, start=1):
            await connect_cluster(store, name, f"sandbox-{i}", str(sandbox.kubeconfig))
        cs = ClusterSet(store.load(), timeout=5)
        try:
            await create_deployment(store, cs, deployment, namespace, names, storage, max_ttl_s)
        finally:
            await cs.aclose()

    anyio.run(setup)
    env.clusters = names
    return env


@pytest.fixture
def dep3(sandbox3: Any, tmp_path: Path) -> Iterator[Env]:
    yield make_env(sandbox3, tmp_path)


@pytest.fixture
def dep5(sandbox5: Any, tmp_path: Path) -> Iterator[Env]:
    yield make_env(sandbox5, tmp_path)
