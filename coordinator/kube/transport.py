"""The wire under the Kubernetes client: one small protocol for an HTTP exchange with an
API server, so that what sits above it does not know what carries its requests.

:class:`~coordinator.kube.client.KubeClient` encodes a request (JSON body, query,
headers), hands it to a :class:`Transport`, and reads the answer: it classifies the
status, reads ``Date`` and ``Retry-After``, retries throttled requests and tells the
fan-out when a request goes out and when its answer is in. A transport only moves the
bytes: :class:`~coordinator.kube.wire.AiohttpTransport` over HTTPS with the kubeconfig's
credentials (the default), or any other implementation of this protocol (the test
suite's in-memory API server, ``tests/sim/``).

A transport raises :class:`TransportError` when a request gets no HTTP answer (the
server cannot be reached, the connection broke, TLS or credential settings made it
impossible) and lets ``TimeoutError`` through when its own timeout ends the exchange.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from coordinator.kube.kubeconfig import Endpoint


@dataclass(frozen=True)
class Request:
    """One HTTP request, encoded: the query as text pairs in order, the body as bytes."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None


class Reply(Protocol):
    """An answer whose status line and headers are in; its body is read on demand."""

    @property
    def status(self) -> int: ...

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or None."""
        ...

    async def read(self) -> bytes:
        """The whole body (what is left of it)."""
        ...

    async def readline(self) -> bytes:
        """The next line of the body, with its line break; ``b""`` at its end."""
        ...


class TransportError(Exception):
    """A request that got no HTTP answer. ``unreachable``: the server could not be
    reached or the connection broke (worth trying again later); otherwise the settings
    (TLS, credentials) make every request fail."""

    def __init__(self, detail: str, *, unreachable: bool = True) -> None:
        super().__init__(detail)
        self.detail = detail
        self.unreachable = unreachable


class Transport(Protocol):
    """The exchanges with one API server."""

    @property
    def server(self) -> str:
        """The server's address, for messages and records (known once opened)."""
        ...

    async def open(self) -> None:
        """Get ready to send (read settings, make the session); raises
        :class:`~coordinator.errors.UsageError` for settings that cannot work. Called
        before the first exchange, and again after :meth:`close`."""
        ...

    def send(self, request: Request, *, timeout: float) -> AbstractAsyncContextManager[Reply]:
        """One request; its answer once the status and headers are in, the exchange
        bounded by ``timeout`` seconds in all (body included)."""
        ...

    def watch(self, request: Request, *, timeout: float, connect_timeout: float) -> AbstractAsyncContextManager[Reply]:
        """A long-running request whose body is read line by line (a watch), for up to
        ``timeout`` seconds; ``connect_timeout`` bounds getting connected."""
        ...

    async def close(self) -> None:
        """Let go of connections (nothing to do when not open); the transport may be
        opened again."""
        ...


# What a ClusterSet (and everything that makes clients) is given to reach a cluster.
TransportFactory = Callable[["Endpoint"], Transport]
