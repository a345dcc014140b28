"""Renewal schedules on a virtual clock: the arithmetic of keep_renewed (when it renews,
how long a throttled renewal waits, when the loss is declared) run by the real engine on
in-memory API servers, with nothing of a busy machine's delays in it. The real-server
test of the same rule keeps a TTL with room for those delays
(tests/kube/integration/test_throttled_writes.py)."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pytest

from coordinator import clock
from coordinator.engine.lock.renew import keep_renewed
from coordinator.engine.lock.results import new_lock_id
from coordinator.ops.api import Coordinator
from sim import simulate as sim
from sim.apiserver import World

pytestmark = pytest.mark.unit

NAMES = ["c1", "c2", "c3"]
GRACE_S = 10.0  # lock run's default --grace, its lead (capped at a third of the TTL)


def _held_through(
    tmp_path: Path, *, ttl_s: float, hold_s: float, throttled: list[str], times: int | None = 1
) -> tuple[bool, str | None, int]:
    """Take the lock with ``ttl_s``, and one second later answer the next ``times`` requests (every one, if
    None) on each of ``throttled`` with 429 and Retry-After 1, keep the lock renewed as
    `lock run` does for ``hold_s`` virtual seconds: (lost, the reason, on how many of
    ``throttled`` the 429s were all given)."""
    from trio.testing import MockClock

    async def go() -> tuple[bool, str | None, int]:
        sim._T0[0] = anyio.current_time()
        world = World(clock=sim.server_time, rng=random.Random(2))
        for name in NAMES:
            world.cluster(name)
        with clock.using(sim.SimClock(1.0, 0.0, 0.0), sim.SeededChance(random.Random(1)), sim.SimProcess("t", 1)):
            config = await sim._setup(world, tmp_path, NAMES, NAMES)
            async with Coordinator(
                config, store=None, timeout=5, transport_factory=world.transport_factory, lease_events=False
            ) as c:
                engine = c.lock_engine(sim.DEPLOYMENT)
                held = await engine.acquire(
                    ttl_s=ttl_s, holder="busy", reason="", command="", wait_s=0, lock_id=new_lock_id()
                )
                assert held.acquired, held.results
                await anyio.sleep(1.0)  # what follows an acquisition (its history entry) is done
                for name in throttled:
                    world.clusters[name].servers[0].throttle("1", count=times)
                async with keep_renewed(engine, held, lead_s=GRACE_S) as lost:
                    with anyio.move_on_after(hold_s):
                        await lost.wait()
                    answered = sum(world.clusters[n].servers[0]._throttled is None for n in throttled)
                    for name in throttled:
                        world.clusters[name].servers[0].unthrottle()
                    await engine.release(held.lock_id)
                    return lost.is_set(), held.lost, answered

    return anyio.run(go, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


def test_one_throttled_renewal_in_the_shortest_lock_run_is_sent_again_in_time(tmp_path: Path) -> None:
    """`lock run --ttl 6s`: a lead of 2 s (its --grace, capped at a third of the TTL), so
    the validity less the lead ends about 3.9 s after the acquisition and renewals come
    every 4/3 s. The first renewal meets a 429 (Retry-After 1) on 2 of 3 members: it
    reaches no majority, is sent again half a second later and lands in time. On a real
    API server a busy machine's delays eat that margin, so the real-server test keeps a
    TTL of 15 s (tests/kube/integration/test_throttled_writes.py); renewals every TTL/2
    would not renew once before the loss."""
    lost, reason, throttled = _held_through(tmp_path, ttl_s=6, hold_s=9, throttled=["c1", "c2"])
    assert throttled == 2, "the 429s were never given"
    assert not lost, reason


def test_throttling_that_outlasts_the_validity_is_a_lost_lock(tmp_path: Path) -> None:
    """The control: every request to c1 and c2 throttled for good; the lock is lost before
    its validity ends (less the lead), and the reason says so."""
    lost, reason, _ = _held_through(tmp_path, ttl_s=6, hold_s=9, throttled=["c1", "c2"], times=None)
    assert lost and reason is not None and "could not be renewed on a majority" in reason, reason
