"""A network whose requests to the state objects wait until the test delivers them.

The simulator's network (sim/network.py) decides each request's fate from the seed as it
passes. Some checks need more: one request held while others go, delivered in an order
the test picks, with a fate the test picks. Here every request a contender sends to a
deployment's state object is parked; :meth:`Stepped.deliver` takes one off the wire and
does to it what the test says: answer it, lose its answer on the way back (the server
did it), drop it (the server never saw it) or have an admission policy reject it. Every
other request (identity checks, leases, the lock history) is answered at once: the state
register is what these checks step through.

Each cluster has a mode, as seen by its state object: ``UP``, ``REJECTS_WRITES`` (an
admission policy turns writes away) or ``DOWN`` (nothing it is sent is done). A sender
that gives up (its task cancelled) takes its reads off the wire; its writes stay on it,
to be delivered later with nobody waiting for the answer.

The driver (:func:`quiet`) waits until every task is blocked, so that a choice is made
only when nothing else can move; trio's MockClock then jumps virtual time only while the
driver waits for a request or an operation's end.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import trio
import trio.testing

from coordinator.kube.kubeconfig import Endpoint
from coordinator.kube.transport import Request, TransportError
from sim.apiserver import Front, World, _Answer, _Reply, _WatchReply

DELIVER, LOSE, DROP, REJECT = "deliver", "lose", "drop", "reject"
UP, REJECTS_WRITES, DOWN = "up", "rejects-writes", "down"
POLICY = "stepped-rejects-writes"


@dataclass(eq=False)
class Parked:
    """One request on the wire, waiting for the test."""

    process: str
    cluster: str
    request: Request
    done: trio.Event
    seq: int
    answer: _Answer | None = None
    error: str | None = None
    orphan: bool = False  # its sender gave up; a write still on the wire

    @property
    def method(self) -> str:
        return self.request.method

    @property
    def body(self) -> dict[str, Any] | None:
        return json.loads(self.request.body) if self.request.body else None


class Stepped:
    """The parked requests of every contender, and each cluster's mode."""

    def __init__(self, world: World, state_object: str) -> None:
        self.world = world
        self.state_object = state_object
        self.pending: list[Parked] = []
        self.modes = dict.fromkeys(world.clusters, UP)
        self.on_park: Callable[[Parked], None] = lambda _p: None
        self.on_deliver: Callable[[Parked, str], None] = lambda _p, _f: None
        self._moved = trio.Event()
        self._seq = 0

    def factory(self, process: str) -> Callable[[Endpoint], SteppedLink]:
        return lambda endpoint: SteppedLink(self, process, endpoint.context)

    def holds(self, request: Request) -> bool:
        path = request.path.rstrip("/")
        if path.endswith(f"/configmaps/{self.state_object}"):
            return True
        if request.method == "POST" and path.endswith("/configmaps") and request.body:
            name = json.loads(request.body).get("metadata", {}).get("name")
            return bool(name == self.state_object)
        return False

    def moved(self) -> None:
        """Something the driver waits for happened: a request parked, an operation ended."""
        self._moved.set()

    async def until_moved(self) -> None:
        await self._moved.wait()
        self._moved = trio.Event()

    def park(self, process: str, cluster: str, request: Request) -> Parked:
        self._seq += 1
        item = Parked(process, cluster, request, trio.Event(), self._seq)
        self.pending.append(item)
        self.on_park(item)
        self.moved()
        return item

    def deliver(self, index: int, fate: str = DELIVER) -> Parked:
        """Take the ``index``-th parked request (modulo their number) off the wire and do
        to it what ``fate`` and its cluster's mode say."""
        item = self.pending.pop(index % len(self.pending))
        mode = self.modes[item.cluster]
        if mode == DOWN:
            fate = DROP
        elif mode == REJECTS_WRITES and item.method != "GET":
            fate = REJECT
        if item.method == "GET" and fate == REJECT:
            fate = DROP
        server = self.world.clusters[item.cluster].server
        if fate == DROP:
            item.error = f"cannot connect to {server.url}: connection refused"
        elif fate == REJECT:
            server.reject(POLICY, lambda *_: True, "the test's admission policy rejects every write")
            try:
                item.answer = server.handle(item.request)
            finally:
                server.allow(POLICY)
        else:
            item.answer = server.handle(item.request)
            if fate == LOSE:
                item.answer, item.error = None, f"connection to {server.url} failed: Connection reset by peer"
        self.on_deliver(item, fate)
        item.done.set()
        return item

    def forget(self, item: Parked) -> None:
        """Its sender gave up: a read leaves the wire, a write stays on it."""
        if item.method == "GET":
            self.pending.remove(item)
        else:
            item.orphan = True


async def quiet() -> None:
    """Until every other task is blocked (on the wire, a sleep, an event)."""
    await trio.testing.wait_all_tasks_blocked()


class SteppedLink(Front):
    """One contender's transport to one cluster: the state object's requests parked,
    everything else answered by the cluster at once."""

    def __init__(self, net: Stepped, process: str, cluster: str) -> None:
        super().__init__(cluster, net.world.clusters.get(cluster))
        self.net = net
        self.process = process

    @asynccontextmanager
    async def send(self, request: Request, *, timeout: float) -> AsyncIterator[_Reply]:
        if not self.net.holds(request):
            async with self.inner.send(request, timeout=timeout) as reply:
                yield reply
            return
        item = self.net.park(self.process, self.cluster, request)
        try:
            with anyio.fail_after(timeout):
                await item.done.wait()
        except BaseException:
            if not item.done.is_set():
                self.net.forget(item)
            raise
        if item.answer is None:
            raise TransportError(item.error or "no answer")
        yield _Reply(item.answer)

    @asynccontextmanager
    async def watch(self, request: Request, *, timeout: float, connect_timeout: float) -> AsyncIterator[_WatchReply]:
        async with self.inner.watch(request, timeout=timeout, connect_timeout=connect_timeout) as reply:
            yield reply
