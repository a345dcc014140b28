"""The real engines on in-memory API servers, through the transport seam: connecting
clusters, creating a deployment, taking the lock, writing and reading the state,
releasing, with nothing but the transport factory told apart from a real run."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet
from coordinator.ops.admin import connect_cluster, create_deployment
from coordinator.ops.api import Coordinator
from coordinator.rules.lease import A_TOKEN
from coordinator.rules.resources import history_name, lease_name, state_name
from sim.apiserver import World

pytestmark = pytest.mark.unit

NAMES = ("c1", "c2", "c3")


def _setup(tmp_path: Path) -> tuple[World, str]:
    world = World(clock=lambda: datetime.now(UTC), rng=random.Random(11))
    for name in NAMES:
        world.cluster(name)
    config = str(tmp_path / "config.yaml")
    store = ConfigStore(config)

    async def go() -> None:
        for name in NAMES:  # a context names the in-memory cluster; no kubeconfig is read
            record, version = await connect_cluster(store, name, name, None, transport_factory=world.transport_factory)
            assert record.identity == world.clusters[name].identity and version.endswith("-sim")
        clusters = ClusterSet(store.load(), timeout=5, transport_factory=world.transport_factory)
        try:
            await create_deployment(store, clusters, "web", "apps", list(NAMES), "configmap")
        finally:
            await clusters.aclose()

    anyio.run(go)
    return world, config


def _stored(world: World, cluster: str, resource: str, name: str) -> Any:
    return world.clusters[cluster].store.objects.get((resource, "apps", name))


def test_a_lock_and_the_state_go_through_the_seam(tmp_path: Path) -> None:
    world, config = _setup(tmp_path)
    for name in NAMES:  # create_deployment made the objects on every member
        for resource, obj in (("leases", lease_name("web")), ("configmaps", state_name("web")),
                              ("configmaps", history_name("web"))):  # fmt: skip
            assert _stored(world, name, resource, obj) is not None, (name, obj)

    async def go() -> None:
        async with Coordinator.from_config(config, transport_factory=world.transport_factory, lease_events=False) as c:
            held = await c.acquire("web", ttl=30, holder="alice")
            assert held.acquired and held.fencing_token == 1
            await c.state("web").set({"replicas": 3}, lock=held.lock_id)
            assert await c.state("web").get() == {"replicas": 3}
            status = await c.status("web")
            assert status.holder == "alice" and status.held_by_majority
            released = await c.release("web", lock_id=held.lock_id)
            assert released["held"] is True

    anyio.run(go)
    for name in NAMES:
        lease = _stored(world, name, "leases", lease_name("web"))
        # released: the holder field kept, empty, as coordinator's (a removed one is no evidence)
        assert lease["metadata"]["annotations"][A_TOKEN] == "1" and lease["spec"]["holderIdentity"] == ""
        state = _stored(world, name, "configmaps", state_name("web"))
        assert json.loads(state["data"]["envelope.json"])["data"] == {"replicas": 3}
        assert world.clusters[name].server.requests > 10


def test_a_paused_member_leaves_a_majority_to_take_the_lock(tmp_path: Path) -> None:
    world, config = _setup(tmp_path)
    world.clusters["c3"].server.pause()

    async def go() -> None:
        async with Coordinator.from_config(
            config, timeout=1, transport_factory=world.transport_factory, lease_events=False
        ) as c:
            held = await c.acquire("web", ttl=30, holder="bob")
            assert held.acquired
            rows = {r.cluster: r.outcome.value for r in held.results.values()}
            assert rows.get("c3") != "ok" and rows["c1"] == rows["c2"] == "ok", rows
        world.clusters["c3"].server.resume()

    anyio.run(go)
    for name, holder in (("c1", True), ("c2", True), ("c3", False)):
        lease = _stored(world, name, "leases", lease_name("web"))
        assert bool(lease["spec"].get("holderIdentity")) is holder, (name, lease["spec"])
