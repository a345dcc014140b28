"""A member change takes a lease another lock id holds only on the evidence an acquisition
needs: server stamps, never the `Date` header alone (a front proxy or a skewed HA
kube-apiserver may stamp its own). Found by a review helper: `adopt_membership` believed
a `Date` 120 s ahead and took a lease whose holder had 55 s left."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import anyio
import pytest
from coord_fixtures import Env

from coordinator.rules.outcome import Outcome

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEP = "web"


def test_a_change_does_not_take_a_live_lease_on_a_date_header_ahead(dep3: Env) -> None:
    async def main() -> None:
        h_api, a_api = dep3.api(timeout=5.0), dep3.api(timeout=5.0)
        async with h_api, a_api:
            h_engine = h_api.lock_engine(DEP)
            h = await h_engine.acquire(ttl_s=60, holder="H")
            # H keeps its lease on c3 only (a lease a lock this change holds never got,
            # whose holder has not lapsed there).
            for name in ("c1", "c2"):
                assert (await h_engine._release.release_one(name, h.lock_id)).ok
            a_engine = a_api.lock_engine(DEP)
            a = await a_engine.acquire(ttl_s=30, holder="A")
            # c3 refuses A (held by H), or had not answered when A's majority was reached
            assert a.acquired and ("c3" not in a.results or not a.results["c3"].ok), a.results

            c3 = a_api.clusters.client("c3")
            original = c3.request

            async def ahead(method: str, path: str, *args: Any, **kw: Any) -> Any:
                resp = await original(method, path, *args, **kw)
                if resp.server_time is not None:
                    resp = dataclasses.replace(resp, server_time=resp.server_time + dt.timedelta(seconds=120))
                return resp

            c3.request = ahead  # type: ignore[method-assign]
            results = await a_engine.adopt_membership(a.lock_id, a.fencing_token or 0, 30, "A")
            assert results["c3"].outcome is Outcome.HELD_BY_OTHER, (results["c3"].outcome, results["c3"].detail)
            assert h.expires_in() > 30
            c3.request = original  # type: ignore[method-assign]
            assert (await a_engine.core.read("c3")).lock_id == h.lock_id

    anyio.run(main)
