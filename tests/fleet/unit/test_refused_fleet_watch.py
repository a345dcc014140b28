"""A fleet watch the server refuses backs off instead of listing every Lease twice a second."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from coordinator.kube.client import KubeError

integration = pytest.mark.integration


class _RefusedWatches:
    """A cluster set whose clusters list fine and refuse every watch (403), as with a
    binding made by an older `rbac print --fleet` (list only)."""

    timeout = 3.0

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0

    async def check_identity(self, name: str) -> None:
        return None

    def client(self, name: str) -> Any:
        from coordinator.kube.client import ApiResponse

        outer = self

        class Client:
            async def request(self, method: str, path: str, **kw: Any) -> ApiResponse:
                outer.lists += 1
                return ApiResponse(200, {"metadata": {"resourceVersion": "1"}, "items": []}, None)

            async def watch(self, path: str, **kw: Any) -> Any:
                outer.watches += 1
                raise KubeError("forbidden", 'HTTP 403: User "u" cannot watch resource "leases"', status=403)
                yield {}  # an async generator, as the real one

        return Client()


def test_a_refused_fleet_watch_backs_off_instead_of_listing_twice_a_second() -> None:
    """Found: with `list` and no `watch`, `lock status --all --watch` listed every Lease
    of each cluster about twice a second. Now the wait before listing again doubles."""
    from coordinator.config.models import ClusterRecord, LocalConfig
    from coordinator.ops.fleet import FleetWatch

    rec = ClusterRecord(name="c1", context="c", identity="i", identity_source="kube-system-uid")
    clusters = _RefusedWatches()
    watch = FleetWatch(LocalConfig(clusters={"c1": rec}), clusters)  # type: ignore[arg-type]

    async def follow() -> None:
        with anyio.move_on_after(8):
            await watch._follow("c1")

    anyio.run(follow)
    # 0.5 + 1 + 2 + 4 s of waits fit in 8 s: 4 or 5 LISTs, not 16.
    assert 3 <= clusters.lists <= 5, clusters.lists
    assert watch.fleet().clusters == {"c1": "ok"}  # what the LISTs say is shown meanwhile
