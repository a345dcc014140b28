"""The API servers the conformance tests (test_conformance.py) run against: the
in-memory one, or the first cluster of the session's real sandbox.

A test runs its body with ``target.run(body)``: the body is given a fresh
:class:`~coordinator.kube.client.KubeClient` (the product's client, over the transport
the target uses), and the target's hooks arrange what only the server's owner can
(pause it, make old resourceVersions expire, put an admission policy in force), the same
way on both.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.rules.resources import configmaps_path
from sim.apiserver import Cluster

T = TypeVar("T")


@dataclass
class Target:
    name: str  # "sim" or "real"
    namespace: str
    cluster: Cluster | None = None  # the in-memory one
    sandbox: Any = None  # the real one's sandbox (cluster 1)
    policies: list[str] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.sandbox is not None

    def client(self, timeout: float = 10.0) -> KubeClient:
        if self.cluster is not None:
            return KubeClient(Endpoint("c1", "c1"), timeout=timeout, transport=self.cluster.transport())
        return KubeClient(Endpoint("c1", "sandbox-1", str(self.sandbox.kubeconfig)), timeout=timeout)

    def run(self, body: Callable[[KubeClient], Awaitable[T]], *, timeout: float = 10.0) -> T:
        async def go() -> T:
            client = self.client(timeout)
            try:
                return await body(client)
            finally:
                await client.close()

        return anyio.run(go)

    # ---------------------------------------------------------------- what the owner does

    async def pause(self) -> None:
        if self.cluster is not None:
            self.cluster.server.pause()
        else:
            await anyio.to_thread.run_sync(self.sandbox.pause, 1)

    async def resume(self) -> None:
        if self.cluster is not None:
            self.cluster.server.resume()
        else:
            await anyio.to_thread.run_sync(self.sandbox.resume, 1)

    async def expire_history(self) -> None:
        """Make every resourceVersion seen so far too old to watch from: the in-memory
        store forgets its history; the real kube-apiserver is restarted, so that its watch
        cache starts over at the current resourceVersion (its etcd compaction runs every
        5 minutes and cannot be asked for)."""
        if self.cluster is not None:
            self.cluster.store.compact()
            return

        def restart() -> None:
            self.sandbox.kill(1)
            self.sandbox.start(1)

        await anyio.to_thread.run_sync(restart)

    async def reject_writes(self, client: KubeClient, name: str, message: str) -> None:
        """Put in force an admission policy that turns away every CREATE and UPDATE of
        ConfigMap ``name`` in the namespace (on the real server, a ValidatingAdmission-
        Policy, in force once a probe write is refused)."""
        policy = f"{self.namespace}-reject"
        self.policies.append(policy)
        if self.cluster is not None:
            self.cluster.server.reject(
                policy,
                lambda op, kind, obj, old: (
                    op in ("CREATE", "UPDATE")
                    and kind.resource == "configmaps"
                    and obj["metadata"].get("namespace") == self.namespace
                    and obj["metadata"].get("name") == name
                ),
                message,
            )
            return
        from faults.admission import add_policy

        expression = f"object.metadata.namespace != '{self.namespace}' || object.metadata.name != '{name}'"
        await anyio.to_thread.run_sync(lambda: add_policy(self.sandbox.admin(1), policy, expression, message))
        # In force a moment after it is made: until a write of the object is refused.
        probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.request("POST", configmaps_path(self.namespace), body=probe)
            except KubeError as err:
                if err.status == 422:
                    return
                if err.kind != "already-exists":
                    raise
            else:
                await client.request("DELETE", f"{configmaps_path(self.namespace)}/{name}")
            assert time.monotonic() < deadline, "the admission policy did not take effect within 30 s"
            await anyio.sleep(0.2)

    def remove_policies(self) -> None:
        if self.cluster is not None:
            for policy in self.policies:
                self.cluster.server.allow(policy)
            return
        from faults.admission import remove_policy

        for policy in self.policies:
            remove_policy(self.sandbox.admin(1), policy)
