"""An in-memory API server that behaves like kube-apiserver in everything coordinator's
engines rely on, reached through the product's own transport protocol
(coordinator/kube/transport.py): no sockets, no processes, no wall clock of its own.

    world = World(clock=lambda: now, rng=random.Random(7))
    c1 = world.cluster("c1")                          # etcd + one kube-apiserver
    ha = world.cluster("c2", apiservers=2)            # two servers on one store
    ha.servers[0].offset = timedelta(seconds=3)       # one of them with a skewed clock
    Coordinator.from_config(path, transport_factory=world.transport_factory)

What it models (tests/sim/test_conformance.py checks each against a real kube-apiserver):

- the objects coordinator uses: namespaces (kube-system among them, with its uid; deleted,
  a namespace is Terminating until it is finalized, as in the sandbox, which runs no
  controller-manager), Leases, ConfigMaps, Secrets; GET, LIST (per namespace and across
  namespaces, label and field selectors, the list's resourceVersion), POST, PUT with
  resourceVersion compare-and-swap, DELETE (preconditions, finalizers), merge, strategic
  and JSON patches, server-side apply (``force``, conflicts), DELETE of a collection;
- the server's stamps: uid, creationTimestamp, managedFields per field manager with
  times in whole seconds (sim/fields.py), the ``Date`` header, one resourceVersion
  counter per cluster;
- watch: from a resourceVersion or from now (with the current objects first),
  selectors, bookmarks (about 2 s before the watch's end, when the store has moved on),
  410 Gone (an ERROR event) for a resourceVersion older than the history kept
  (``Store.compact``);
- faults: 429 with Retry-After (``ApiServer.throttle``), admission rejections like a
  ValidatingAdmissionPolicy's (``ApiServer.reject``), size limits (413, 422, 500 as the
  real server answers), a paused server that never answers (``pause``; what it was asked
  meanwhile is done when it resumes, for senders still waiting), a stopped one
  (``stop``: connection refused), answers lost on the way back (``lose_answers``: the
  request was done), per-request latency, a per-server clock offset (an HA pair's
  skewed member).

Time comes from the ``clock`` given (an aware datetime), and waiting (watch deadlines,
latency, bookmarks) from anyio, so a virtual clock and a virtual event loop can drive
it; every random choice (uids, generated names, which server of an HA pair answers)
comes from the ``random.Random`` given.

Where it knowingly differs from a real server: sizes are those of the objects' JSON
(etcd stores protobuf, about as long for objects of text); a LIST from a resourceVersion
not reached yet answers 504 at once (the real one waits 3 s); bookmarks come once,
2 s before the end (the real server's one-second dispatch sends none, one or two).
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from functools import lru_cache
from typing import Any

import anyio

from coordinator.kube.kubeconfig import Endpoint
from coordinator.kube.transport import Request, TransportError
from sim import fields
from sim.handlers import (
    Handler,
    Key,
    Route,
    json_body,
    method_not_allowed,
    no_such_resource,
    resource_version,
    route,
)
from sim.objects import (
    JSON,
    MAX_REQUEST_BYTES,
    ApiError,
    Kind,
    bad_request,
    clone,
    field_selector,
    label_selector,
    whole_second,
)

Clock = Callable[[], datetime]

KUBE_VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.4-sim", "platform": "linux/amd64"}
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
BOOKMARK_BEFORE_END_S = 2.0  # a watch's bookmark comes this long before the watch ends
BOOKMARK_EVERY_S = 60.0  # and once a minute in a longer watch


@dataclass
class Change:
    revision: int
    type: str  # ADDED, MODIFIED, DELETED
    key: Key
    obj: JSON  # the object after the change (before it, for DELETED, with the new revision)
    prev: JSON | None


def http_date(when: datetime) -> str:
    """The ``Date`` header for the server's time ``when`` (whole seconds)."""
    return _http_date(whole_second(when))  # every answer carries one: a second's share it


@lru_cache(maxsize=64)
def _http_date(second: int) -> str:
    return format_datetime(datetime.fromtimestamp(second, UTC), usegmt=True)


class Store:
    """The etcd of one cluster: the objects, one revision counter, the history of changes
    (the last ``keep`` of them, or since ``compact``), and the watches to tell.

    A stored object is never changed in place: a write stores a new one. So readers that
    only look (a GET's answer, an update's comparison) take it as it is (:meth:`peek`),
    and its JSON, made once when it is stored, is every answer's body that carries it."""

    def __init__(self, *, keep: int = 10_000) -> None:
        self.revision = 1
        self.objects: dict[Key, JSON] = {}
        self.history: deque[Change] = deque()
        self.keep = keep
        self.compacted = 0  # changes at or below this revision are forgotten
        self.watches: set[_Watch] = set()
        # Told every change as it is made (the simulator's record of who held which lease).
        self.observers: list[Callable[[Change], None]] = []
        # id(object) -> (the object, its JSON), for the objects stored now.
        self._encoded: dict[int, tuple[JSON, bytes]] = {}
        # id(object) -> (the object, its managedFields read), made when first asked for.
        self._entries: dict[int, tuple[JSON, tuple[fields.Entry, ...]]] = {}

    def get(self, key: Key) -> JSON | None:
        """A copy of the object, to change and write back."""
        found = self.objects.get(key)
        return clone(found) if found is not None else None

    def peek(self, key: Key) -> JSON | None:
        """The object as stored, to look at only."""
        return self.objects.get(key)

    def encoded(self, obj: JSON) -> bytes | None:
        """The JSON of ``obj`` if it is an object stored now (made when it was stored)."""
        found = self._encoded.get(id(obj))
        return found[1] if found is not None and found[0] is obj else None

    def entries(self, obj: JSON) -> list[fields.Entry]:
        """``fields.read_entries(obj)``, read once per stored object (every update of an
        object reads the managedFields it holds). Copies: the caller may change them."""
        found = self._entries.get(id(obj))
        if found is None or found[0] is not obj:
            read = tuple(fields.read_entries(obj))
            if self.encoded(obj) is None:  # not stored now: not remembered
                return list(read)
            found = self._entries[id(obj)] = (obj, read)
        return [fields.Entry(e.manager, e.operation, e.api_version, e.fields, e.time) for e in found[1]]

    def _replace(self, key: Key, stored: JSON | None, encoded: bytes | None = None) -> JSON | None:
        prev = self.objects.pop(key, None)
        if prev is not None:
            del self._encoded[id(prev)]
            self._entries.pop(id(prev), None)
        if stored is not None:
            self.objects[key] = stored
            self._encoded[id(stored)] = (stored, json.dumps(stored).encode() if encoded is None else encoded)
        return prev

    def put(self, key: Key, obj: JSON, *, check: Callable[[bytes], None] | None = None) -> JSON:
        """Store a copy of ``obj`` under a new revision; return it as stored (not to be changed).
        ``check`` is given the stored object's JSON first, and may refuse it by raising:
        then nothing changes."""
        stored = clone(obj)
        stored["metadata"]["resourceVersion"] = str(self.revision + 1)
        encoded = json.dumps(stored).encode()
        if check is not None:
            check(encoded)
        self.revision += 1
        prev = self._replace(key, stored, encoded)
        self._record(Change(self.revision, "ADDED" if prev is None else "MODIFIED", key, stored, prev))
        return stored

    def delete(self, key: Key) -> JSON:
        """Remove the object; return it as it was, with the revision of its deletion."""
        prev = self._replace(key, None)
        assert prev is not None, key
        self.revision += 1
        gone = clone(prev)
        gone["metadata"]["resourceVersion"] = str(self.revision)
        self._record(Change(self.revision, "DELETED", key, gone, prev))
        return gone

    def _record(self, change: Change) -> None:
        self.history.append(change)
        while len(self.history) > self.keep:
            self.compacted = self.history.popleft().revision
        for observe in self.observers:
            observe(change)
        for watch in list(self.watches):
            watch.offer(change)

    def compact(self, revision: int | None = None) -> None:
        """Forget the changes up to ``revision`` (by default all of them), as the API
        server's periodic etcd compaction does: a watch from before then gets 410 Gone."""
        upto = self.revision if revision is None else revision
        while self.history and self.history[0].revision <= upto:
            self.history.popleft()
        self.compacted = max(self.compacted, upto)

    def since(self, revision: int) -> list[Change]:
        return [c for c in self.history if c.revision > revision]


@dataclass
class Policy:
    """An admission policy: ``rejects(operation, kind, obj, old)`` says whether a write is
    turned away (operation CREATE, UPDATE or DELETE; ``old`` None on CREATE)."""

    name: str
    rejects: Callable[[str, Kind, JSON, JSON | None], bool]
    message: str


@dataclass
class _Held:
    """A request a paused server was sent: done when the server resumes, unless its
    sender gave up waiting first."""

    request: Request
    done: anyio.Event
    answer: _Answer | None = None
    abandoned: bool = False


@dataclass
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class ApiServer:
    """One kube-apiserver over a :class:`Store`, with its own clock offset and faults."""

    def __init__(self, store: Store, *, name: str, clock: Clock, rng: random.Random) -> None:
        self.store = store
        self.name = name
        self.clock = clock
        self.rng = rng
        self.offset = timedelta(0)  # this server's clock minus the true time
        self.latency = 0.0  # seconds before each answer
        self.policies: dict[str, Policy] = {}
        self.stopped = False
        self._throttled: tuple[str, int | None] | None = None
        self._paused = False
        self._held: list[_Held] = []
        self._resumed: anyio.Event | None = None
        self._lost: int | None = 0  # answers still to lose (None: all)
        self.requests = 0  # requests answered (not counting watches)

    @property
    def url(self) -> str:
        return f"https://{self.name}.sim:6443"

    def now(self) -> datetime:
        return self.clock() + self.offset

    # ---------------------------------------------------------------- faults

    def throttle(self, retry_after: str = "1", *, count: int | None = None) -> None:
        """Answer the next ``count`` requests (all, if None, until :meth:`unthrottle`)
        with 429 and this Retry-After, as API Priority and Fairness does."""
        self._throttled = (retry_after, count)

    def unthrottle(self) -> None:
        self._throttled = None

    def reject(self, name: str, rejects: Callable[[str, Kind, JSON, JSON | None], bool], message: str) -> None:
        """Put an admission policy in force (like a ValidatingAdmissionPolicy and its
        binding, both named ``name``)."""
        self.policies[name] = Policy(name, rejects, message)

    def allow(self, name: str) -> None:
        self.policies.pop(name, None)

    def pause(self) -> None:
        """Accept requests and answer none, until :meth:`resume`."""
        self._paused = True

    def resume(self) -> None:
        """Answer again. The requests sent meanwhile are done now, in order, those whose
        senders still wait: a request whose sender gave up is not done (a stopped
        kube-apiserver that continues finds its client gone and drops it; see
        tests/sim/test_conformance.py::test_a_paused_server_answers_who_still_waits)."""
        self._paused = False
        held, self._held = self._held, []
        for item in held:
            if not item.abandoned:
                item.answer = self.handle(item.request)
                item.done.set()
        if self._resumed is not None:
            self._resumed.set()
            self._resumed = None

    @property
    def paused(self) -> bool:
        return self._paused

    async def until_resumed(self) -> None:
        while self._paused:
            if self._resumed is None:
                self._resumed = anyio.Event()
            await self._resumed.wait()

    def stop(self) -> None:
        """Refuse connections (a killed server), until :meth:`start`."""
        self.stopped = True

    def start(self) -> None:
        self.stopped = False

    def lose_answers(self, count: int | None = 1) -> None:
        """Do the next ``count`` requests (all, if None; none, if 0) but lose their
        answers on the way back (the connection breaks): a write whose sender cannot
        know whether it was made."""
        self._lost = count

    # ---------------------------------------------------------------- serving

    async def answer(self, request: Request) -> _Answer:
        """The answer to one request, as the wire would carry it."""
        if self.stopped:
            raise TransportError(f"cannot connect to {self.url}: connection refused")
        if self.latency:
            await anyio.sleep(self.latency)
        if self._paused:
            held = _Held(request, anyio.Event())
            self._held.append(held)
            try:
                await held.done.wait()
            finally:
                held.abandoned = not held.done.is_set()
            assert held.answer is not None
            answer = held.answer
        else:
            answer = self.handle(request)
        if self._lost != 0:
            if self._lost is not None:
                self._lost -= 1
            raise TransportError(f"connection to {self.url} failed: Connection reset by peer")
        return answer

    def handle(self, request: Request) -> _Answer:
        self.requests += 1
        headers = {"Content-Type": "application/json"}
        try:
            status, body = self._serve(request)
        except ApiError as err:
            status, body = err.code, err.status()
            headers.update(err.headers)
        headers["Date"] = http_date(self.now())
        encoded = self.store.encoded(body)
        return _Answer(status, headers, encoded if encoded is not None else json.dumps(body).encode())

    def _serve(self, request: Request) -> tuple[int, JSON]:
        if self._throttled is not None:
            retry_after, count = self._throttled
            if count is not None:
                self._throttled = (retry_after, count - 1) if count > 1 else None
            raise ApiError(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                {"retryAfterSeconds": int(float(retry_after))} if retry_after.isdigit() else {},
                headers={"Retry-After": retry_after},
            )
        if request.body is not None and len(request.body) > MAX_REQUEST_BYTES:
            raise ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_REQUEST_BYTES}")
        query = dict(request.query)
        where = route(request.path)
        if isinstance(where, Route):  # first: nearly every request is one on objects
            if query.get("watch") in ("true", "1"):
                raise bad_request("a watch is answered through the transport's watch, not send")
            handler = Handler(self, where.kind, where.namespace, where.name, query, request)
            return handler.run(where.sub)
        if where == "version":
            if request.method != "GET":
                raise method_not_allowed()
            return 200, dict(KUBE_VERSION)
        if where == "access-review":
            if request.method != "POST":
                raise method_not_allowed()
            review = json_body(request) or {}
            review = review if isinstance(review, dict) else {}
            return 201, {**review, "status": {"allowed": True}}
        raise no_such_resource()

    # ---------------------------------------------------------------- watch

    @asynccontextmanager
    async def watch(self, request: Request, *, timeout: float) -> AsyncIterator[_WatchReply]:
        """A watch: its answer's status and headers, then its events line by line."""
        if self.stopped:
            raise TransportError(f"watch on {self.url} failed: connection refused")
        await self.until_resumed()
        if self.latency:
            await anyio.sleep(self.latency)
        reply = self._start_watch(request, timeout)
        try:
            yield reply
        finally:
            reply.close()

    def _start_watch(self, request: Request, timeout: float) -> _WatchReply:
        query = dict(request.query)
        headers = {"Content-Type": "application/json"}
        try:
            if self._throttled is not None:
                self._serve(request)  # raises the 429
            where = route(request.path)
            if not isinstance(where, Route) or where.name or where.sub:
                raise no_such_resource()
            labels = label_selector(query.get("labelSelector", ""))
            names = field_selector(query.get("fieldSelector", ""))
            resource_version(query.get("resourceVersion", ""))
            seconds = float(query.get("timeoutSeconds") or timeout)
        except ApiError as err:
            headers.update(err.headers)
            headers["Date"] = http_date(self.now())
            return _WatchReply(self, err.code, headers, json.dumps(err.status()).encode())
        headers["Date"] = http_date(self.now())
        watch = _Watch(self, where.kind, where.namespace, labels, names, seconds, query)
        return _WatchReply(self, 200, headers, b"", watch)


class _WatchReply:
    """A watch's answer as the transport's Reply: an error body, or events line by line
    until the watch ends (the server's timeoutSeconds) or ``deadline`` (the client's)."""

    def __init__(
        self, server: ApiServer, status: int, headers: dict[str, str], body: bytes, watch: _Watch | None = None
    ) -> None:
        self.server = server
        self._status = status
        self._headers = {k.lower(): v for k, v in headers.items()}
        self._body = body
        self._watch = watch
        self.deadline = float("inf")
        if watch is not None:
            server.store.watches.add(watch)

    @property
    def status(self) -> int:
        return self._status

    def header(self, name: str) -> str | None:
        return self._headers.get(name.lower())

    async def read(self) -> bytes:
        body, self._body = self._body, b""
        return body

    async def readline(self) -> bytes:
        if self._watch is None:
            return await self.read()
        event: JSON | None = None
        with anyio.move_on_after(max(0.0, self.deadline - anyio.current_time())) as scope:
            event = await self._watch.next()
        if scope.cancelled_caught:
            raise TransportError(f"watch on {self.server.url} broke: timed out")
        if event is None:
            return b""
        # An object stored now has its JSON made already: the event's JSON is that, in
        # json.dumps's own frame (the same bytes json.dumps(event) gives).
        obj = self.server.store.encoded(event["object"])
        if obj is not None and tuple(event) == ("type", "object") and event["type"] in _EVENT_TYPES:
            return b'{"type": "' + _EVENT_TYPES[event["type"]] + b'", "object": ' + obj + b"}\n"
        return json.dumps(event).encode() + b"\n"

    def close(self) -> None:
        if self._watch is not None:
            self.server.store.watches.discard(self._watch)
            self._watch = None


_EVENT_TYPES = {t: t.encode() for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")}


class _Watch:
    """One watch's events: first what it asked to catch up on (the current objects, or
    the changes since its resourceVersion), then each change as it is stored."""

    def __init__(
        self,
        server: ApiServer,
        kind: Kind,
        namespace: str | None,
        labels: Callable[[Mapping[str, str]], bool],
        names: Callable[[Mapping[str, Any]], bool],
        seconds: float,
        query: Mapping[str, str],
    ) -> None:
        self.server = server
        self.kind = kind
        self.namespace = namespace
        self.labels = labels
        self.names = names
        self.bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        started = anyio.current_time()
        self.ends = started + max(1.0, seconds)
        self.next_bookmark = self._after(started)
        self.queue: deque[JSON] = deque()
        self.wake: anyio.Event | None = None
        self.since = 0  # the newest revision told: changes up to it are not the watch's
        store = server.store
        rv = query.get("resourceVersion", "")
        if rv in ("", "0"):
            for key in sorted(store.objects):
                obj = store.objects[key]
                if self._wanted(key, obj):
                    self.queue.append({"type": "ADDED", "object": obj})
            self.since = store.revision
            return
        self.since = int(rv)  # checked by the caller
        if self.since < store.compacted:
            message = f"too old resource version: {self.since} ({store.compacted})"
            self._fail(_error_event(410, "Expired", message), started)
            return
        # A resourceVersion not reached yet is waited for, as long as the watch lasts.
        for change in store.since(self.since):
            self.offer(change)

    def _fail(self, event: JSON, now: float) -> None:
        self.queue.append(event)
        self.ends = now
        self.bookmarks = False

    def _after(self, now: float) -> float:
        """When the next bookmark is due: a minute on, or shortly before the end."""
        last = self.ends - BOOKMARK_BEFORE_END_S
        return min(now + BOOKMARK_EVERY_S, last) if now < last else float("inf")

    def _wanted(self, key: Key, obj: JSON) -> bool:
        if key[0] != self.kind.resource or (self.namespace is not None and key[1] != self.namespace):
            return False
        return bool(self.labels((obj.get("metadata") or {}).get("labels") or {})) and bool(self.names(obj))

    def offer(self, change: Change) -> None:
        """Queue what ``change`` means to this watch (an object entering or leaving its
        selection is ADDED or DELETED). The objects are queued as stored (never changed:
        :class:`Store`); an event is encoded when it is read."""
        if change.revision <= self.since:
            return
        now_in = change.type != "DELETED" and self._wanted(change.key, change.obj)
        was_in = change.prev is not None and self._wanted(change.key, change.prev)
        if change.type == "DELETED":
            if was_in:
                self.queue.append({"type": "DELETED", "object": change.obj})
        elif now_in and was_in:
            self.queue.append({"type": "MODIFIED", "object": change.obj})
        elif now_in:
            self.queue.append({"type": "ADDED", "object": change.obj})
        elif was_in:
            gone = clone(change.prev)
            assert gone is not None
            gone["metadata"]["resourceVersion"] = str(change.revision)
            self.queue.append({"type": "DELETED", "object": gone})
        if self.wake is not None:
            self.wake.set()

    async def next(self) -> JSON | None:
        """The next event, or None when the watch ends (its time is up)."""
        while True:
            await self.server.until_resumed()
            now = anyio.current_time()
            if self.queue:
                event = self.queue.popleft()
                told = (event["object"].get("metadata") or {}).get("resourceVersion")
                if isinstance(told, str) and told.isdigit():
                    self.since = max(self.since, int(told))
                return event
            if now >= self.ends:
                return None
            if self.bookmarks and now >= self.next_bookmark:
                self.next_bookmark = self._after(now)
                # A bookmark tells a newer resourceVersion than the watch has, or is not sent.
                if self.server.store.revision > self.since:
                    self.since = self.server.store.revision
                    return self._bookmark()
                continue
            wake_at = min(self.ends, self.next_bookmark if self.bookmarks else self.ends)
            self.wake = anyio.Event()
            with anyio.move_on_after(max(0.0, wake_at - now)):
                await self.wake.wait()
            self.wake = None

    def _bookmark(self) -> JSON:
        """An empty object of the kind (a Lease's has its empty spec) with the revision."""
        obj = {"kind": self.kind.kind, "apiVersion": self.kind.api_version, **self.kind.empty()}
        obj["metadata"] = {"resourceVersion": str(self.server.store.revision)}
        obj.pop("status", None)
        return {"type": "BOOKMARK", "object": obj}


def _error_event(code: int, reason: str, message: str) -> JSON:
    return {"type": "ERROR", "object": ApiError(code, reason, message).status()}


# ------------------------------------------------------------------ clusters and transports


class Cluster:
    """One cluster: a store and its API servers (two or more: an HA control plane, each
    request answered by one of them picked at random, as the sandbox's front proxy does)."""

    def __init__(self, name: str, *, clock: Clock, rng: random.Random, apiservers: int = 1) -> None:
        self.name = name
        self.rng = rng
        self.store = Store()
        self.servers = [
            ApiServer(self.store, name=f"{name}-{i}" if apiservers > 1 else name, clock=clock, rng=rng)
            for i in range(1, apiservers + 1)
        ]
        self._bootstrap()

    @property
    def server(self) -> ApiServer:
        return self.servers[0]

    def _bootstrap(self) -> None:
        """The namespaces every cluster starts with, made by the server itself."""
        for ns in SYSTEM_NAMESPACES:
            request = Request(
                "POST",
                "/api/v1/namespaces",
                headers={"User-Agent": "kube-apiserver/v1.34.4", "Content-Type": "application/json"},
                body=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}).encode(),
            )
            answer = self.server.handle(request)
            assert answer.status == 201, answer.body
        self.server.requests = 0

    @property
    def identity(self) -> str:
        """The uid of kube-system: the cluster's identity to coordinator."""
        return str(self.store.objects[("namespaces", "", "kube-system")]["metadata"]["uid"])

    def transport(self, server: int | None = None) -> SimTransport:
        """A transport to this cluster (to one given server, 0-based, or to any)."""
        return SimTransport(self, None if server is None else self.servers[server])

    def pick(self) -> ApiServer:
        return self.servers[0] if len(self.servers) == 1 else self.rng.choice(self.servers)


class SimTransport:
    """The product's Transport protocol, answered by a :class:`Cluster`'s servers (by one
    given server, if ``server``; by none, refusing every connection, if no cluster)."""

    def __init__(self, cluster: Cluster | None, server: ApiServer | None = None, *, name: str = "") -> None:
        self.cluster = cluster
        self.fixed = server
        self.name = name or (cluster.name if cluster else "nowhere")

    @property
    def server(self) -> str:
        if self.cluster is None:
            return f"https://{self.name}.sim:6443"
        return (self.fixed or self.cluster.server).url

    def _pick(self) -> ApiServer:
        if self.cluster is None:
            raise TransportError(f"cannot connect to {self.server}: no such host")
        return self.fixed or self.cluster.pick()

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @asynccontextmanager
    async def send(self, request: Request, *, timeout: float) -> AsyncIterator[_Reply]:
        server = self._pick()
        with anyio.fail_after(timeout):
            answer = await server.answer(request)
        yield _Reply(answer)

    @asynccontextmanager
    async def watch(self, request: Request, *, timeout: float, connect_timeout: float) -> AsyncIterator[_WatchReply]:
        server = self._pick()
        deadline = anyio.current_time() + timeout
        with anyio.fail_after(connect_timeout):
            await server.until_resumed()
        async with server.watch(request, timeout=timeout) as reply:
            reply.deadline = deadline
            yield reply


class Front:
    """A transport in front of a cluster's :class:`SimTransport` (the simulator's links,
    the stepped network): the server it names, and no connection to open or close."""

    def __init__(self, cluster: str, target: Cluster | None) -> None:
        self.cluster = cluster
        self.inner = SimTransport(target, name=cluster)

    @property
    def server(self) -> str:
        return self.inner.server

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass


class _Reply:
    def __init__(self, answer: _Answer) -> None:
        self._answer = answer
        self._headers = {k.lower(): v for k, v in answer.headers.items()}
        self._body = answer.body

    @property
    def status(self) -> int:
        return self._answer.status

    def header(self, name: str) -> str | None:
        return self._headers.get(name.lower())

    async def read(self) -> bytes:
        body, self._body = self._body, b""
        return body

    async def readline(self) -> bytes:
        line, sep, rest = self._body.partition(b"\n")
        self._body = rest
        return line + sep


@dataclass
class World:
    """The clusters of one simulation, on one clock and one source of randomness; its
    ``transport_factory`` is what a ``ClusterSet`` or ``Coordinator`` is given. A
    kubeconfig context names a cluster by the cluster's name."""

    clock: Clock
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    clusters: dict[str, Cluster] = field(default_factory=dict)

    def cluster(self, name: str, *, apiservers: int = 1) -> Cluster:
        made = Cluster(name, clock=self.clock, rng=self.rng, apiservers=apiservers)
        self.clusters[name] = made
        return made

    def transport_factory(self, endpoint: Endpoint) -> SimTransport:
        cluster = self.clusters.get(endpoint.context)
        return SimTransport(None, name=endpoint.context) if cluster is None else cluster.transport()
