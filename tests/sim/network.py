"""The links between the simulator's contenders and its clusters.

Every contender reaches every cluster through a :class:`Link`, a transport (the product's
protocol, coordinator/kube/transport.py) in front of the cluster's in-memory API servers.
What a link does to a request is decided, request by request, from the link's state in
the :class:`Network`: a delay on the way there and back, a request lost on the way there
(the server never sees it), an answer lost on the way back (the server did the request:
a write of unknown outcome), a request delivered twice (the copy a moment later), a cut
link (connection refused, or a request that hangs until the client gives up), and a
frozen contender (a process stopped: nothing it sends leaves, nothing comes back, until
it is thawed). Every choice comes from the network's ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import trio
from anyio.abc import TaskGroup

from coordinator.kube.kubeconfig import Endpoint
from coordinator.kube.transport import Request, TransportError
from sim.apiserver import Cluster, Front, _Reply, _WatchReply


@dataclass
class LinkState:
    """What is wrong with one link (contender → cluster) now. Probabilities are per request."""

    delay: float = 0.0  # up to this many seconds each way, uniformly
    loss: float = 0.0  # the request is lost on the way there
    answer_loss: float = 0.0  # the answer is lost on the way back (the request was done)
    duplicate: float = 0.0  # the request is delivered twice
    cut: bool = False  # nothing gets through: refused, or hangs (``hang``)
    hang: bool = False

    def calm(self) -> bool:
        return not (self.delay or self.loss or self.answer_loss or self.duplicate or self.cut)


@dataclass
class Network:
    """Every link's state, and the frozen contenders."""

    rng: random.Random
    links: dict[tuple[str, str], LinkState] = field(default_factory=dict)
    frozen: dict[str, anyio.Event] = field(default_factory=dict)
    background: TaskGroup | None = None  # where duplicated requests are delivered
    requests: int = 0
    # Every leg of every request takes this long (seconds, uniformly): a network, not
    # shared memory. Without it a loop of requests takes no virtual time at all.
    latency: tuple[float, float] = (0.002, 0.015)

    def link(self, contender: str, cluster: str) -> LinkState:
        key = (contender, cluster)
        found = self.links.get(key)
        if found is None:
            found = self.links[key] = LinkState()
        return found

    def freeze(self, contender: str) -> None:
        if contender not in self.frozen:
            self.frozen[contender] = anyio.Event()

    def thaw(self, contender: str) -> None:
        event = self.frozen.pop(contender, None)
        if event is not None:
            event.set()

    async def until_thawed(self, contender: str) -> None:
        while (event := self.frozen.get(contender)) is not None:
            await event.wait()

    def factory(self, contender: str, clusters: dict[str, Cluster]) -> Factory:
        return Factory(self, contender, clusters)


class Factory:
    """A contender's transport factory: a link to the cluster a context names."""

    def __init__(self, network: Network, contender: str, clusters: dict[str, Cluster]) -> None:
        self.network = network
        self.contender = contender
        self.clusters = clusters

    def __call__(self, endpoint: Endpoint) -> Link:
        return Link(self.network, self.contender, endpoint.context, self.clusters.get(endpoint.context))


class Link(Front):
    """One contender's transport to one cluster, through the network's faults."""

    def __init__(self, network: Network, contender: str, cluster: str, target: Cluster | None) -> None:
        super().__init__(cluster, target)
        self.network = network
        self.contender = contender

    async def _leg(self, state: LinkState) -> None:
        """One way along the link: the delay, and a stop while the contender is frozen."""
        net = self.network
        # trio's own sleep and cancel scopes, as anyio's trio backend calls them (the
        # simulator runs on trio only), without anyio's dispatch on every request.
        await trio.sleep(net.rng.uniform(*net.latency) + (net.rng.uniform(0.0, state.delay) if state.delay else 0.0))
        if self.contender in net.frozen:
            await net.until_thawed(self.contender)

    async def _blocked(self, state: LinkState, timeout: float) -> None:
        if state.hang:
            await trio.sleep(timeout + 1.0)  # the caller's deadline ends it first
        raise TransportError(f"cannot connect to {self.server}: connection refused (link cut)")

    def send(self, request: Request, *, timeout: float) -> _Sending:
        """The transport's send: an async context manager whose entry is the request's
        way there and back (a class, not a generator: one is made for every request)."""
        return _Sending(self, request, timeout)

    async def _send(self, request: Request, timeout: float) -> _Reply:
        net = self.network
        net.requests += 1
        state = net.link(self.contender, self.cluster)
        scope = trio.CancelScope(deadline=trio.current_time() + timeout)  # anyio.fail_after(timeout)
        with scope:
            await self._leg(state)
            if state.cut:
                await self._blocked(state, timeout)
            if state.loss and net.rng.random() < state.loss:
                await trio.sleep(timeout + 1.0)  # lost on the way there: no answer ever
            server = self.inner._pick()
            if state.duplicate and net.background is not None and net.rng.random() < state.duplicate:
                later = net.rng.uniform(0.0, max(state.delay, 0.05))
                net.background.start_soon(_deliver_copy, server, request, later)
            answer = await server.answer(request)
            lost = state.answer_loss and net.rng.random() < state.answer_loss
            await self._leg(net.link(self.contender, self.cluster))
            if lost or net.link(self.contender, self.cluster).cut:
                raise TransportError(f"connection to {self.server} failed: Connection reset by peer")
        if scope.cancelled_caught and trio.current_time() >= scope.deadline:
            raise TimeoutError
        return _Reply(answer)

    @asynccontextmanager
    async def watch(self, request: Request, *, timeout: float, connect_timeout: float) -> AsyncIterator[_WatchReply]:
        state = self.network.link(self.contender, self.cluster)
        try:
            with anyio.fail_after(connect_timeout):
                await self._leg(state)
                if state.cut:
                    await self._blocked(state, connect_timeout)
                server = self.inner._pick()
                await server.until_resumed()
        except TimeoutError as err:  # as the wire reports a watch that could not connect in time
            raise TransportError(f"watch on {self.server} failed: connect timed out") from err
        async with server.watch(request, timeout=timeout) as reply:
            reply.deadline = anyio.current_time() + timeout
            yield reply


class _Sending:
    __slots__ = ("link", "request", "timeout")

    def __init__(self, link: Link, request: Request, timeout: float) -> None:
        self.link = link
        self.request = request
        self.timeout = timeout

    async def __aenter__(self) -> _Reply:
        return await self.link._send(self.request, self.timeout)

    async def __aexit__(self, *exc_info: object) -> None:
        return None


async def _deliver_copy(server: object, request: Request, after: float) -> None:
    """A duplicate of a request, delivered ``after`` seconds later; its answer goes nowhere."""
    from sim.apiserver import ApiServer

    assert isinstance(server, ApiServer)
    await anyio.sleep(after)
    try:
        await server.answer(request)
    except TransportError:
        pass
