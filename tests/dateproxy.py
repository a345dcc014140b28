"""A TLS-terminating HTTP proxy in front of a sandbox API server that stamps its own
``Date`` header from a shifted clock — what nginx and some load balancers do, from a
clock that may be minutes off.

It serves with the sandbox's own serving certificate (so clients trust it through the
sandbox CA), forwards each request with its headers (bearer tokens pass through) and
streams the answer back, replacing only ``Date``. Used by the lock tests to show that a
foreign ``Date`` never lets a contender take a live lease.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "date",
    "content-encoding",
}


class DateShiftingProxy:
    """``DateShiftingProxy(upstream, pki_dir, shift_s)``; ``start()`` returns its URL."""

    def __init__(self, upstream: str, pki_dir: Path, shift_s: float) -> None:
        self.upstream = upstream.rstrip("/")
        self.pki = Path(pki_dir)
        self.shift_s = shift_s
        self.requests = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ready = threading.Event()
        self.url = ""

    def start(self) -> str:
        self._thread = threading.Thread(target=self._run, name="date-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the Date-shifting proxy did not start")
        return self.url

    def stop(self) -> None:
        if self._loop is not None:
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            fut.result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> DateShiftingProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inside the proxy's own event loop

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._startup())
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def _startup(self) -> None:
        upstream_tls = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream_tls))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(self.pki / "serving.crt"), str(self.pki / "serving.key"))
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=serving)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"https://127.0.0.1:{port}"

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        self.requests += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
        body = await request.read()
        url = self.upstream + request.rel_url.path_qs
        async with self._session.request(
            request.method, url, headers=headers, data=body or None, allow_redirects=False, auto_decompress=True
        ) as up:
            out = web.StreamResponse(status=up.status)
            for key, value in up.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    out.headers[key] = value
            out.headers["Date"] = formatdate(time.time() + self.shift_s, usegmt=True)
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out


def proxy_kubeconfig(path: Path, pki_dir: Path, token: str, servers: dict[str, str]) -> Path:
    """A kubeconfig with one bearer-token context per proxy (``servers``: context → URL)."""
    import base64

    import yaml

    ca = base64.b64encode((Path(pki_dir) / "ca.crt").read_bytes()).decode()
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": url, "certificate-authority-data": ca}}
            for name, url in servers.items()
        ],
        "users": [{"name": "proxy-user", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "proxy-user"}} for name in servers],
        "current-context": next(iter(servers)),
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


@contextmanager
def machine_through_proxies(env: Any, tmp_path: Path, shift_s: float, label: str) -> Iterator[tuple[Any, list[Any]]]:
    """Another machine (``label``) that reaches every member of ``env``'s 3-cluster sandbox
    through a proxy whose Date runs ``shift_s`` ahead, and records deployment ``web`` (as
    `deployment import` would); with the proxies, stopped on leaving."""
    import anyio
    from coord_fixtures import Env

    from coordinator.config.records import DeploymentRecord
    from coordinator.config.store import ConfigStore
    from coordinator.ops.admin import connect_cluster

    pki = env.sandbox.dir / "pki"
    proxies = [DateShiftingProxy(env.sandbox.server(i), pki, shift_s) for i in (1, 2, 3)]
    urls = {f"{label}-{i}": p.start() for i, p in zip((1, 2, 3), proxies, strict=True)}
    try:
        kc = proxy_kubeconfig(tmp_path / f"{label}.kubeconfig", pki, env.sandbox.token, urls)
        machine = Env(sandbox=env.sandbox, config=tmp_path / label / "config.yaml", namespace=env.namespace)
        store = ConfigStore(machine.config)

        async def setup() -> None:
            for i in (1, 2, 3):
                await connect_cluster(store, f"c{i}", f"{label}-{i}", str(kc))

        anyio.run(setup)
        with store.edit() as cfg:
            cfg.deployments["web"] = DeploymentRecord(name="web", namespace=env.namespace, clusters=["c1", "c2", "c3"])
        yield machine, proxies
    finally:
        for p in proxies:
            p.stop()
