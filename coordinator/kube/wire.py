"""The default transport: HTTPS to the API server of a kubeconfig context, with aiohttp.

What it takes from kubernetes_asyncio is its public configuration API only: the
kubeconfig loader fills a ``Configuration`` (server, TLS files, proxy, credentials, and
the refresh hook of exec and auth-provider credentials), and
``Configuration.auth_settings()`` gives the credentials of each request. The HTTP session
is ours (aiohttp, which the library uses too), so no private constructor of the library
is relied on. This is the only module that imports aiohttp (on first use: importing it
costs a command's start-up time, see ``kubeconfig.preload``).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlencode

from coordinator.kube.credentials import refused
from coordinator.kube.kubeconfig import Endpoint, header_value, load_client_configuration
from coordinator.kube.tls import environment_has_proxy_or_netrc, tls_context
from coordinator.kube.transport import Request, TransportError

# Watch events carrying large objects can exceed aiohttp's default read buffer (the
# library raises it the same way; etcd's default request limit is 1.5 MiB).
_READ_BUFSIZE = 2**21


class _Reply:
    """An aiohttp response as a :class:`~coordinator.kube.transport.Reply`; ``broke``
    words a failure while its body is read (a watch's stream)."""

    def __init__(self, resp: Any, broke: str | None = None) -> None:
        self._resp = resp
        self._broke = broke

    @property
    def status(self) -> int:
        return int(self._resp.status)

    def header(self, name: str) -> str | None:
        value = self._resp.headers.get(name)
        return None if value is None else str(value)

    async def read(self) -> bytes:
        return await self._body(self._resp.read)

    async def readline(self) -> bytes:
        return await self._body(self._resp.content.readline)

    async def _body(self, reader: Any) -> bytes:
        if self._broke is None:
            return bytes(await reader())
        import aiohttp

        try:
            return bytes(await reader())
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise TransportError(f"{self._broke}: {err}") from err


class AiohttpTransport:
    """The requests of one process to one cluster over one aiohttp session: they share
    one keep-alive connection (the client sends them one at a time); a watch holds a
    connection of its own."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.server = ""
        self._cfg: Any = None
        self._session: Any = None

    async def open(self) -> None:
        if self._session is None:
            cfg = await load_client_configuration(self.endpoint)
            self.server = str(cfg.host)
            self._session = new_session(cfg)
            self._cfg = cfg

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @asynccontextmanager
    async def send(self, request: Request, *, timeout: float) -> AsyncIterator[_Reply]:
        import aiohttp

        try:
            resp = await self._send_once(request, timeout)
            if resp.status == 401 and refused(self._cfg):
                # The token was revoked or expired, and the credential has another one
                # (kube/credentials.py): the server did nothing with this request.
                resp.release()
                resp = await self._send_once(request, timeout)
            try:
                yield _Reply(resp)
            finally:
                resp.release()
        except TimeoutError:
            raise
        except aiohttp.ClientConnectorCertificateError as err:
            raise TransportError(f"TLS certificate rejected: {err.certificate_error}", unreachable=False) from err
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as err:
            raise TransportError(f"cannot connect to {self.server}: {err}") from err
        except aiohttp.ClientError as err:
            raise TransportError(f"connection to {self.server} failed: {err}") from err
        except ssl.SSLError as err:
            raise TransportError(f"TLS error talking to {self.server}: {err}", unreachable=False) from err
        except OSError as err:
            raise TransportError(f"cannot reach {self.server}: {err}") from err

    async def _send_once(self, request: Request, timeout: float) -> Any:
        import aiohttp

        args = await _request_args(self._cfg, request)
        return await self._session.request(**args, timeout=aiohttp.ClientTimeout(total=timeout))

    @asynccontextmanager
    async def watch(self, request: Request, *, timeout: float, connect_timeout: float) -> AsyncIterator[_Reply]:
        import aiohttp

        try:
            args = await _request_args(self._cfg, request)
            resp = await self._session.request(
                **args, timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise TransportError(f"watch on {self.server} failed: {err}") from err
        try:
            yield _Reply(resp, broke=f"watch on {self.server} broke")
        finally:
            resp.release()


def new_session(cfg: Any) -> Any:
    """An aiohttp session for the cluster of ``cfg``, on the process's shared TLS context.
    Call it in a running event loop."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=cfg.connection_pool_maxsize or 100, ssl=tls_context(cfg)),
        trust_env=environment_has_proxy_or_netrc(),
        read_bufsize=_READ_BUFSIZE,
    )


async def _request_args(cfg: Any, request: Request) -> dict[str, Any]:
    """The arguments of ``ClientSession.request`` for one request to ``cfg.host``: URL and
    query, the credentials of the moment (``auth_settings()`` runs the refresh hook of
    expiring credentials, such as exec plugins and a rotated ServiceAccount token), the
    proxy and the TLS server name of the kubeconfig, and the body."""
    url = str(cfg.host) + request.path
    if request.query:
        url += "?" + urlencode(request.query)
    headers = dict(request.headers)
    for setting in (await cfg.auth_settings()).values():
        if setting.get("in") == "header" and setting.get("value"):
            # A credential refreshed since the kubeconfig was checked (an exec plugin, a
            # rotated token file) may end in a line break too: as kubectl, drop it.
            value = header_value(str(setting["value"]))
            if value is None:
                raise TransportError(
                    "the credential of this context (from its exec plugin, auth provider or token "
                    "file) holds a control character, which no HTTP header may carry",
                    unreachable=False,
                )
            headers[setting["key"]] = value
    args: dict[str, Any] = {"method": request.method, "url": url, "headers": headers}
    if cfg.proxy:
        args["proxy"] = cfg.proxy
        if cfg.proxy_headers:
            args["proxy_headers"] = cfg.proxy_headers
    if cfg.tls_server_name:
        args["server_hostname"] = cfg.tls_server_name
    if request.body is not None:
        args["data"] = request.body
    return args
