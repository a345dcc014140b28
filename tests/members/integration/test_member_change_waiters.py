"""A contender waiting with --wait on the machine that changes the members waits on under
the new set: it follows the record as soon as the members store the new set, not when its
wait has run out. (Found by two review helpers: the wait loop stopped only on a win, an
identity mismatch or the deadline, so the follow came with the last attempt, 40 s into a
40 s wait although the lock was free after 3 s.)"""

from __future__ import annotations

import time

import anyio
import pytest
from coord_fixtures import COMMIT_TIMEOUT_S, Env

from coordinator.config.store import ConfigStore
from coordinator.ops.reconfig import change_members

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEP = "web"
WAIT_S = 45.0


def test_a_waiter_follows_a_change_made_here_and_gets_the_lock_soon_after_it(dep3: Env) -> None:
    async def main() -> None:
        # one machine: one config. H must hold on every member for the change to be about a
        # waiter: a member H's acquisition left out under load is taken by A's attempts,
        # whose tokens then stop the change from taking it with H's lower one.
        h_api, a_api = dep3.api(timeout=COMMIT_TIMEOUT_S), dep3.api(timeout=5.0)
        async with h_api, a_api:
            h = await h_api.acquire(DEP, ttl=60, holder="H")
            assert {k: r.outcome.value for k, r in h.results.items()} == dict.fromkeys(("c1", "c2", "c3"), "ok"), h
            got: dict[str, float] = {}

            async def waiter() -> None:
                a = await a_api.acquire(DEP, ttl=30, wait=WAIT_S, holder="A")
                got["at"] = time.monotonic()
                got["members"] = float(len(a.members))

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.sleep(1.5)  # A is waiting
                report = await change_members(h_api, DEP, ["c1", "c2"], lock_id=h.lock_id, holder="H", ttl=60)
                assert report.epoch > 1
                h_api.config.deployments[DEP] = ConfigStore(str(dep3.config)).load().deployments[DEP]
                await h_api.release(DEP, lock_id=h.lock_id)
                released = time.monotonic()
            assert got["members"] == 2
            assert got["at"] - released < 12, (
                f"A took the lock {got['at'] - released:.1f}s after it was released (its wait: {WAIT_S:g}s)"
            )

    anyio.run(main)
