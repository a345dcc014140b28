"""A waiting acquire makes its attempts under one lock id. An attempt that lost leaves its
writes still on the wire running; one that lands afterwards is given back. The give-back
must undo that write only: the next attempt of the same acquire may since have renewed
that very lease and counted it toward its majority.

Found by the fault suite in CI (`run1g0 (token 20) entered while api1g0 (token 19) was
still inside`, 0.4 s apart) and reproduced here on real kube-apiservers: the only thing
arranged is when the answers reach the waiting contender (one take's answer late, as
under latency or a loaded machine, and its first reads of two members a little late).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from coord_fixtures import Env

from coordinator.errors import LockHeldError
from coordinator.rules.lease import boot_clock

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEP = "web"
LATE_TAKE_S = 2.0  # the first take's answer on c1 reaches the waiter this late
LATE_READS_S = {"c2": 0.25, "c3": 0.6}  # its first attempt's reads of these, this late


def test_a_lost_attempts_late_take_does_not_give_back_the_lease_the_next_attempt_counted(dep3: Env) -> None:
    async def main() -> None:
        h_api, a_api, b_api = dep3.api(timeout=5.0), dep3.api(timeout=5.0), dep3.api(timeout=5.0)
        async with h_api, a_api, b_api:
            h_engine = h_api.lock_engine(DEP)
            h = await h_engine.acquire(ttl_s=30, holder="H")
            # H's lock on c2 and c3 (a majority) only: c1 is free.
            assert (await h_engine._release.release_one("c1", h.lock_id)).ok

            a_engine = a_api.lock_engine(DEP)
            attempts: list[Any] = []
            late: list[str] = []
            answered = anyio.Event()

            c1 = a_api.clusters.client("c1")
            c1_request = c1.request

            async def late_take(method: str, path: str, *args: Any, **kw: Any) -> Any:
                resp = await c1_request(method, path, *args, **kw)
                if method == "PUT" and path.endswith(f"leases/coordinator-lock-{DEP}") and not late:
                    late.append("landed")  # on the server; its answer comes late
                    await anyio.sleep(LATE_TAKE_S)
                    late.append("answered")
                    answered.set()
                return resp

            c1.request = late_take  # type: ignore[method-assign]

            for name, delay in LATE_READS_S.items():
                client = a_api.clusters.client(name)

                def slow(original: Any, delay: float = delay) -> Any:
                    async def request(method: str, path: str, *args: Any, **kw: Any) -> Any:
                        resp = await original(method, path, *args, **kw)
                        if method == "GET" and path.endswith(f"leases/coordinator-lock-{DEP}") and not attempts:
                            await anyio.sleep(delay)
                        return resp

                    return request

                client.request = slow(client.request)  # type: ignore[method-assign]

            first_attempt = a_engine._acquire._attempt

            async def attempt(*args: Any, **kw: Any) -> Any:
                result = await first_attempt(*args, **kw)
                attempts.append(result)
                if len(attempts) == 1:
                    await h_engine._release.release_one("c2", h.lock_id)  # H frees c2; it holds c3
                return result

            a_engine._acquire._attempt = attempt  # type: ignore[method-assign]
            a = await a_engine.acquire(ttl_s=30, holder="A", wait_s=15)

            first = attempts[0]
            assert not first.acquired and "c1" not in first.results, (
                "the set-up needs the first attempt lost while its take of c1 was unanswered: "
                f"{ {k: (str(r.outcome), r.detail) for k, r in first.results.items()} }"
            )
            assert a.acquired and a.results["c1"].ok and a.results["c2"].ok, a.results
            with anyio.fail_after(LATE_TAKE_S + 10):
                await answered.wait()
            await anyio.sleep(1.0)  # whatever the late answer leads to is done by now

            # A still holds the two leases its winning attempt counted.
            seen = {k: await a_engine.core.read(k) for k in ("c1", "c2")}
            assert {k: v.lock_id for k, v in seen.items()} == {"c1": a.lock_id, "c2": a.lock_id}, (
                "the late answer of a lost attempt gave back a lease the winning attempt had counted"
            )

            # So when H is done, nobody else gets the lock while A's validity runs.
            assert (await h_engine._release.release_one("c3", h.lock_id)).ok
            assert a.valid_until() - boot_clock() > 5
            with pytest.raises(LockHeldError):
                await b_api.lock_engine(DEP).acquire(ttl_s=30, holder="B")

    anyio.run(main)
