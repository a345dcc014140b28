"""A hostile proxy in front of one member costs that member only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env

integration = pytest.mark.integration


class _HostileProxy:
    """A TLS proxy in front of one sandbox API server (dateproxy's), whose answers the
    test turns hostile after the cluster is connected."""

    def __init__(self, upstream: str, pki_dir: Path) -> None:
        from dateproxy import HOP_BY_HOP, DateShiftingProxy

        self.mode = "pass"
        outer = self

        class Proxy(DateShiftingProxy):
            async def _forward(self, request: Any) -> Any:
                from aiohttp import web

                if outer.mode == "pass":
                    return await super()._forward(request)
                if outer.mode == "deep":
                    return web.Response(status=200, body=b"[" * 5000, content_type="application/json")
                assert self._session is not None
                headers = {
                    k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"
                }
                body = await request.read()
                async with self._session.request(
                    request.method, self.upstream + request.rel_url.path_qs, headers=headers, data=body or None
                ) as up:
                    payload = await up.read()
                    out = web.Response(status=up.status, body=payload)
                    out.headers["Content-Type"] = up.headers.get("Content-Type", "application/json")
                    out.headers["Date"] = "Mon, 01 Jan 2020 00:00:00 -99999999999999999999"
                    return out

        self.proxy = Proxy(upstream, pki_dir, 0.0)

    def start(self) -> str:
        return self.proxy.start()

    def stop(self) -> None:
        self.proxy.stop()


@integration
@pytest.mark.parametrize("mode", ["date", "deep"])
def test_a_hostile_proxy_in_front_of_one_member_costs_that_member_only(dep3: Env, tmp_path: Path, mode: str) -> None:
    """Bob reaches c3 through a proxy that, once connected, answers every request with a
    Date header no datetime holds, or with a body nested 5000 deep. The lock and state
    still work on the two other members; no command crashes."""
    from dateproxy import proxy_kubeconfig

    from coordinator.config.store import ConfigStore
    from coordinator.ops.admin import connect_cluster

    pki = dep3.sandbox.dir / "pki"
    hostile = _HostileProxy(dep3.sandbox.server(3), pki)
    url = hostile.start()
    try:
        kc = proxy_kubeconfig(tmp_path / "proxied.kubeconfig", pki, dep3.sandbox.token, {"proxied-3": url})
        bob = Env(sandbox=dep3.sandbox, config=tmp_path / "bob" / "config.yaml", namespace=dep3.namespace)
        store = ConfigStore(bob.config)

        async def setup() -> None:
            for i in (1, 2):
                await connect_cluster(store, f"c{i}", f"sandbox-{i}", str(dep3.sandbox.kubeconfig))
            await connect_cluster(store, "c3", "proxied-3", str(kc))

        anyio.run(setup)
        imported = bob.cli("deployment", "import", "web", "--cluster", "c1", "-n", dep3.namespace)
        assert imported.returncode == 0, imported.stderr
        hostile.mode = mode
        results = {
            "acquire": bob.cli("-o", "json", "lock", "acquire", "web", "--ttl", "60s", "--holder", "bob"),
            "status": bob.cli("lock", "status", "web"),
            "set": bob.cli("state", "set", "web", "k=v", env={"COORDINATOR_HOLDER": "bob"}),
            "get": bob.cli("state", "get", "web"),
            "info": bob.cli("cluster", "info", "c3"),
            "fleet": bob.cli("lock", "status", "--all"),
        }
    finally:
        hostile.stop()
    codes = {k: p.returncode for k, p in results.items()}
    crashed = sorted(k for k, p in results.items() if p.returncode == 1 or "Internal error" in p.stderr)
    leaked = sorted(k for k, p in results.items() if dep3.sandbox.token in p.stdout + p.stderr)
    assert not crashed and not leaked, f"exit 1: {crashed}; bearer token printed by: {leaked}; exits {codes}"
    assert results["acquire"].returncode == 0, results["acquire"].stderr[-500:]
    assert results["set"].returncode == 0, results["set"].stderr[-500:]
