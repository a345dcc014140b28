"""B12: scale, on the simulator's in-memory API servers (tests/sim/apiserver.py).

No sandbox: the in-memory servers stand in for 3 to 50 clusters in this process, so the
rows count exactly what the client asks of each cluster and how much CPU the client spends
on it, at sizes a 2-core machine cannot run real API servers for. The servers' own work is
timed apart and left out of the client's CPU. Each command is what the CLI does: a fresh
`Coordinator` (identity checks included) for one acquisition or one fleet view, on
asyncio, the CLI's event loop.

- per acquisition and per fleet view at 3, 9, 25 and 50 clusters: requests per cluster
  (the target: the same at every size) and client CPU, with the CPU each extra cluster adds
  (the slope from the smallest size to the largest: at most 5 ms);
- the fleet view (`lock status --all`) over 500 deployments on 50 clusters: client CPU at
  most 2 s. The 500 deployments' leases are copies of two real ones (one held, one free),
  stored under other names.
"""

from __future__ import annotations

import gc
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from sim.apiserver import ApiServer, World

from bench.report import TARGETS, Report, Row
from bench.stats import median

if TYPE_CHECKING:
    from coordinator.ops.api import Coordinator

NAMESPACE = "apps"


class _ServerClock:
    """The CPU the in-memory servers spend answering (thread time), to leave out of the
    client's."""

    def __init__(self) -> None:
        self.spent = 0.0

    @contextmanager
    def timing(self) -> Iterator[None]:
        original = ApiServer.handle

        def handle(server: ApiServer, request: Any) -> Any:
            began = time.thread_time()
            try:
                return original(server, request)
            finally:
                self.spent += time.thread_time() - began

        ApiServer.handle = handle  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            ApiServer.handle = original  # type: ignore[method-assign]


def _world(n: int) -> World:
    world = World(clock=lambda: datetime.now(UTC), rng=random.Random(12))
    for i in range(n):
        world.cluster(f"c{i + 1}")
    return world


async def _make(world: World, config: str, deployments: dict[str, list[str]]) -> None:
    from coordinator.config.store import ConfigStore
    from coordinator.engine.clusters import ClusterSet
    from coordinator.ops.admin import connect_cluster, create_deployment

    store = ConfigStore(config)
    for name in world.clusters:
        await connect_cluster(store, name, name, None, transport_factory=world.transport_factory)
    clusters = ClusterSet(store.load(), timeout=30, transport_factory=world.transport_factory)
    try:
        for dep, members in deployments.items():
            await create_deployment(store, clusters, dep, NAMESPACE, members, "configmap")
    finally:
        await clusters.aclose()


def _requests(world: World) -> int:
    return sum(s.requests for c in world.clusters.values() for s in c.servers)


def _fresh(world: World, config: str) -> Coordinator:
    """A command's own `Coordinator`, as the CLI makes one, on the in-memory servers."""
    from coordinator.ops.api import Coordinator

    return Coordinator.from_config(config, transport_factory=world.transport_factory, lease_events=False)


async def _measured(world: World, servers: _ServerClock, body: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(client CPU seconds, requests per cluster) of one command. What the process held
    before (the servers' objects above all) is frozen out of the garbage collector's
    passes: a CLI process has no such heap, and its collections would not walk it."""
    gc.collect()
    gc.freeze()
    try:
        asked, spent, began = _requests(world), servers.spent, time.thread_time()
        await body()
        cpu = time.thread_time() - began - (servers.spent - spent)
    finally:
        gc.unfreeze()
    return cpu, (_requests(world) - asked) / len(world.clusters)


async def _per_command(world: World, config: str, servers: _ServerClock, reps: int) -> dict[str, dict[str, float]]:
    from coordinator.cli.lockview import claim_document
    from coordinator.ops.fleet import fleet_document, survey

    samples: dict[str, list[tuple[float, float]]] = {"acquire": [], "fleet": []}
    for i in range(reps + 1):  # the first of each is a warm-up
        held: list[Any] = []

        async def acquire(held: list[Any] = held, holder: str = f"bench-{i}") -> None:
            async with _fresh(world, config) as c:
                held.append(await c.acquire("web", ttl=60, holder=holder))

        took = await _measured(world, servers, acquire)
        assert held and held[0].acquired, held

        async def fleet() -> None:
            async with _fresh(world, config) as c:
                view = await survey(c.config, c.clusters, c.max_server_skew_s)
                fleet_document(view, claim_document)

        looked = await _measured(world, servers, fleet)
        async with _fresh(world, config) as c:
            await c.release("web", lock_id=held[0].lock_id)
        if i:
            samples["acquire"].append(took)
            samples["fleet"].append(looked)
    return {
        k: {"cpu_s": median([s[0] for s in v]), "requests_per_cluster": median([s[1] for s in v])}
        for k, v in samples.items()
    }


async def _big_fleet(world: World, config: str, servers: _ServerClock, deployments: int) -> dict[str, float]:
    """The fleet view over ``deployments`` deployments on every cluster of ``world``."""
    from coordinator.cli.lockview import claim_document
    from coordinator.ops.fleet import fleet_document, survey
    from coordinator.rules.resources import LABEL_DEPLOYMENT, lease_name

    async with _fresh(world, config) as c:
        held = await c.acquire("held", ttl=600, holder="bench")
        assert held.acquired
    rng = random.Random(500)
    names = [f"d{i:04}" for i in range(deployments)]
    for cluster in world.clusters.values():
        store = cluster.store
        for i, dep in enumerate(names):
            source = store.get(("leases", NAMESPACE, lease_name("held" if i % 2 else "free")))
            assert source is not None
            meta = source["metadata"]
            meta["name"] = lease_name(dep)
            meta["labels"] = {**meta.get("labels", {}), LABEL_DEPLOYMENT: dep}
            meta["uid"] = f"{rng.getrandbits(128):032x}"
            store.put(("leases", NAMESPACE, meta["name"]), source)
    async with _fresh(world, config) as c:
        record = c.config.deployments["held"]
        for dep in names:
            c.config.deployments[dep] = record.model_copy(update={"name": dep})
        shown: list[dict[str, Any]] = []

        async def fleet() -> None:
            shown.append(fleet_document(await survey(c.config, c.clusters, c.max_server_skew_s), claim_document))

        cpu, per_cluster = await _measured(world, servers, fleet)
    entries = {e["deployment"]: e for e in shown[0]["deployments"]}
    assert len(entries) == deployments + 2, len(entries)
    held_shown = sum(1 for dep in names if entries[dep]["status"] == "held")
    assert held_shown == deployments // 2, held_shown
    return {"cpu_s": cpu, "requests_per_cluster": per_cluster, "deployments": len(entries)}


def bench_b12(rep: Report, *, sizes: list[int], reps: int, fleet_deployments: int) -> None:
    print(
        f"B12: in-memory API servers, {', '.join(map(str, sizes))} clusters; fleet of {fleet_deployments}", flush=True
    )
    from sim.simulate import _harness_patches

    servers = _ServerClock()
    per_size: dict[int, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-b12-") as tmp, _harness_patches(), servers.timing():
        for n in sizes:
            world, config = _world(n), str(Path(tmp) / f"n{n}.yaml")
            anyio.run(_make, world, config, {"web": list(world.clusters)})
            per_size[n] = anyio.run(_per_command, world, config, servers, reps)
        big = max(sizes)
        world, config = _world(big), str(Path(tmp) / "fleet.yaml")
        anyio.run(_make, world, config, {"held": list(world.clusters), "free": list(world.clusters)})
        fleet = anyio.run(_big_fleet, world, config, servers, fleet_deployments)
    rep.raw["B12"] = {"per_size": per_size, "fleet": fleet}
    small = min(sizes)
    for what, label in (("acquire", "acquisition"), ("fleet", "fleet view (`lock status --all`)")):
        counts = {n: per_size[n][what]["requests_per_cluster"] for n in sizes}
        cpus = {n: per_size[n][what]["cpu_s"] for n in sizes}
        steady = max(counts.values()) - min(counts.values()) <= TARGETS["B12requests"]
        rep.add(
            Row(
                f"B12.{what[0]}r",
                f"requests per cluster, one {label}, at {', '.join(map(str, sizes))} clusters",
                " / ".join(f"{counts[n]:.2f}" for n in sizes),
                "",
                max(counts.values()) - min(counts.values()),
                f"spread <= {TARGETS['B12requests']:g}",
                steady,
            )
        )
        slope = (cpus[big] - cpus[small]) / (big - small)
        rep.add(
            Row(
                f"B12.{what[0]}c",
                f"client CPU per extra cluster, one {label} ({small} to {big} clusters)",
                f"{slope * 1000:.2f} ms ({' / '.join(f'{cpus[n] * 1000:.0f}' for n in sizes)} ms)",
                "",
                slope,
                f"<= {TARGETS['B12cpu'] * 1000:g} ms",
                slope <= TARGETS["B12cpu"],
            )
        )
    rep.add(
        Row(
            "B12.fleet",
            f"fleet view over {fleet_deployments} deployments x {big} clusters: client CPU",
            f"{fleet['cpu_s']:.2f} s ({fleet['requests_per_cluster']:.0f} requests per cluster)",
            "",
            fleet["cpu_s"],
            f"<= {TARGETS['B12fleet']:g} s",
            fleet["cpu_s"] <= TARGETS["B12fleet"],
        )
    )
