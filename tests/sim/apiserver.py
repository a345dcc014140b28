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
  selectors, bookmarks (about 2 s before the watch's end), 410 Gone (an ERROR event)
  for a resourceVersion older than the history kept (``Store.compact``);
- faults: 429 with Retry-After (``ApiServer.throttle``), admission rejections like a
  ValidatingAdmissionPolicy's (``ApiServer.reject``), size limits (413, 422, 500 as the
  real server answers), a paused server that never answers (``pause``; what it was asked
  meanwhile is done when it resumes, for senders still waiting), a stopped one
  (``stop``: connection refused), answers lost on the way back (``lose_answers``: the
  request was done), per-request latency, a per-server clock offset (an HA pair's
  skewed member).

Time comes from the ``clock`` given (an aware datetime), and waiting (watch deadlines,
latency, bookmarks) from anyio, so a virtual clock and a virtual event loop can drive
it; every random choice (uids, Audit-Ids, which server of an HA pair answers) comes
from the ``random.Random`` given.
"""

from __future__ import annotations

import copy
import json
import random
import re
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import format_datetime
from typing import Any, ClassVar

import anyio
import yaml

from coordinator.kube.kubeconfig import Endpoint
from coordinator.kube.transport import Request, TransportError
from sim import fields
from sim.objects import (
    JSON,
    KINDS,
    MAX_REQUEST_BYTES,
    ApiError,
    Kind,
    bad_request,
    check_stored_size,
    decode,
    field_selector,
    label_selector,
    not_found,
    server_time,
    validate,
)

Clock = Callable[[], datetime]
Key = tuple[str, str, str]  # resource, namespace ("" for a cluster-scoped one), name

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


class Store:
    """The etcd of one cluster: the objects, one revision counter, the history of changes
    (the last ``keep`` of them, or since ``compact``), and the watches to tell."""

    def __init__(self, *, keep: int = 10_000) -> None:
        self.revision = 1
        self.objects: dict[Key, JSON] = {}
        self.history: deque[Change] = deque()
        self.keep = keep
        self.compacted = 0  # changes at or below this revision are forgotten
        self.watches: set[_Watch] = set()

    def get(self, key: Key) -> JSON | None:
        found = self.objects.get(key)
        return copy.deepcopy(found) if found is not None else None

    def put(self, key: Key, obj: JSON) -> JSON:
        """Store ``obj`` under a new revision; return it as stored."""
        prev = self.objects.get(key)
        self.revision += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.revision)
        self.objects[key] = stored
        self._record(Change(self.revision, "ADDED" if prev is None else "MODIFIED", key, stored, prev))
        return copy.deepcopy(stored)

    def delete(self, key: Key) -> JSON:
        """Remove the object; return it as it was, with the revision of its deletion."""
        prev = self.objects.pop(key)
        self.revision += 1
        gone = copy.deepcopy(prev)
        gone["metadata"]["resourceVersion"] = str(self.revision)
        self._record(Change(self.revision, "DELETED", key, gone, prev))
        return copy.deepcopy(gone)

    def _record(self, change: Change) -> None:
        self.history.append(change)
        while len(self.history) > self.keep:
            self.compacted = self.history.popleft().revision
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
        headers["Date"] = format_datetime(self.now(), usegmt=True)
        return _Answer(status, headers, json.dumps(body).encode())

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
        route = _route(request.path)
        if route == "version":
            if request.method != "GET":
                raise _method_not_allowed()
            return 200, dict(KUBE_VERSION)
        if route == "access-review":
            if request.method != "POST":
                raise _method_not_allowed()
            review = _json_body(request) or {}
            review = review if isinstance(review, dict) else {}
            return 201, {**review, "status": {"allowed": True}}
        if not isinstance(route, Route):
            raise _no_such_resource()
        if query.get("watch") in ("true", "1"):
            raise bad_request("a watch is answered through the transport's watch, not send")
        handler = _Handler(self, route.kind, route.namespace, route.name, query, request)
        return handler.run(route.sub)

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
            route = _route(request.path)
            if not isinstance(route, Route) or route.name or route.sub:
                raise _no_such_resource()
            labels = label_selector(query.get("labelSelector", ""))
            names = field_selector(query.get("fieldSelector", ""))
            _resource_version(query.get("resourceVersion", ""))
            seconds = float(query.get("timeoutSeconds") or timeout)
        except ApiError as err:
            headers.update(err.headers)
            headers["Date"] = format_datetime(self.now(), usegmt=True)
            return _WatchReply(self, err.code, headers, json.dumps(err.status()).encode())
        headers["Date"] = format_datetime(self.now(), usegmt=True)
        watch = _Watch(self, route.kind, route.namespace, labels, names, seconds, query)
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
        return b"" if event is None else json.dumps(event).encode() + b"\n"

    def close(self) -> None:
        if self._watch is not None:
            self.server.store.watches.discard(self._watch)
            self._watch = None


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
                    self.queue.append({"type": "ADDED", "object": copy.deepcopy(obj)})
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
        selection is ADDED or DELETED)."""
        if change.revision <= self.since:
            return
        now_in = change.type != "DELETED" and self._wanted(change.key, change.obj)
        was_in = change.prev is not None and self._wanted(change.key, change.prev)
        if change.type == "DELETED":
            if was_in:
                self.queue.append({"type": "DELETED", "object": copy.deepcopy(change.obj)})
        elif now_in and was_in:
            self.queue.append({"type": "MODIFIED", "object": copy.deepcopy(change.obj)})
        elif now_in:
            self.queue.append({"type": "ADDED", "object": copy.deepcopy(change.obj)})
        elif was_in:
            gone = copy.deepcopy(change.prev)
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


# ------------------------------------------------------------------ requests on objects


class _Handler:
    """One request on objects of one kind."""

    def __init__(
        self,
        server: ApiServer,
        kind: Kind,
        namespace: str | None,
        name: str | None,
        query: Mapping[str, str],
        request: Request,
    ) -> None:
        self.server = server
        self.store = server.store
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.query = query
        self.request = request

    def key(self, name: str) -> Key:
        return (self.kind.resource, self.namespace or "", name)

    def now(self) -> str:
        return server_time(self.server.now())

    def manager(self) -> str:
        """The field manager: the one named, or the User-Agent's first word (as the real server)."""
        given = self.query.get("fieldManager")
        if given:
            return given
        agent = next((v for k, v in self.request.headers.items() if k.lower() == "user-agent"), "")
        return agent.split("/")[0]

    def run(self, sub: str | None) -> tuple[int, JSON]:
        method = self.request.method
        if self.name is None:
            if method == "GET":
                return self.list_objects()
            if method == "POST" and (self.namespace is not None or not self.kind.namespaced):
                return self.create(self.body_object())
            if method == "DELETE" and self.namespace is not None:
                return self.delete_collection()
            raise _method_not_allowed()
        if sub == "finalize":
            if method != "PUT":
                raise _method_not_allowed()
            return self.finalize(self.body_object())
        if sub is not None:
            raise _no_such_resource()
        if method == "GET":
            found = self.store.get(self.key(self.name))
            if found is None:
                raise not_found(self.kind, self.name)
            return 200, found
        if method == "PUT":
            return self.update(self.body_object())
        if method == "PATCH":
            return self.patch()
        if method == "DELETE":
            return self.delete(_json_body(self.request))
        raise _method_not_allowed()

    def body_object(self) -> JSON:
        doc = _json_body(self.request)
        obj = decode(self.kind, doc)
        given = obj["metadata"].get("namespace")
        if self.kind.namespaced:
            if given is not None and given != self.namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            obj["metadata"]["namespace"] = self.namespace
        return obj

    # ------------------------------------------------------------ reads

    def list_objects(self) -> tuple[int, JSON]:
        wanted = _resource_version(self.query.get("resourceVersion", ""))
        if wanted > self.store.revision:
            # The real server first waits 3 s for its cache to catch up; one store has
            # nothing to catch up with.
            raise ApiError(
                504,
                "Timeout",
                f"Timeout: Too large resource version: {wanted}, current: {self.store.revision}",
                {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                 "retryAfterSeconds": 1},
                headers={"Retry-After": "1"},
            )  # fmt: skip
        labels = label_selector(self.query.get("labelSelector", ""))
        names = field_selector(self.query.get("fieldSelector", ""))
        items = []
        for key in sorted(self.store.objects):
            if key[0] != self.kind.resource or (self.namespace is not None and key[1] != self.namespace):
                continue
            obj = self.store.objects[key]
            if labels(obj["metadata"].get("labels") or {}) and names(obj):
                item = copy.deepcopy(obj)
                del item["kind"], item["apiVersion"]
                items.append(item)
        body = {
            "kind": f"{self.kind.kind}List",
            "apiVersion": self.kind.api_version,
            "metadata": {"resourceVersion": str(self.store.revision)},
            "items": items,
        }
        return 200, body

    # ------------------------------------------------------------ writes

    def _namespace_open(self, name: str) -> None:
        """NamespaceLifecycle: nothing is created in a namespace that is missing or going."""
        if not self.kind.namespaced:
            return
        ns = self.store.objects.get(("namespaces", "", self.namespace or ""))
        if ns is None:
            raise not_found(KINDS["namespaces"], self.namespace or "")
        if ns["metadata"].get("deletionTimestamp"):
            message = f"unable to create new content in namespace {self.namespace} because it is being terminated"
            cause = {"reason": "NamespaceTerminating", "message": f"namespace {self.namespace} is being terminated",
                     "field": "metadata.namespace"}  # fmt: skip
            details = {**self.kind.details(name), "causes": [cause]}
            raise ApiError(403, "Forbidden", f'{self.kind.qualified} "{name}" is forbidden: {message}', details)

    def _admit(self, operation: str, obj: JSON, old: JSON | None) -> None:
        for policy in self.server.policies.values():
            if policy.rejects(operation, self.kind, obj, old):
                name = obj["metadata"].get("name", "")
                said = f"ValidatingAdmissionPolicy '{policy.name}' with binding '{policy.name}' denied request: " + (
                    policy.message
                )
                details = {**self.kind.details(name), "causes": [{"message": said}]}
                raise ApiError(422, "Invalid", f'{self.kind.qualified} "{name}" is forbidden: {said}', details)

    def _write(self, key: Key, obj: JSON) -> JSON:
        check_stored_size("/registry/" + "/".join(k for k in key if k), obj)
        return self.store.put(key, obj)

    def create(self, obj: JSON, entries: list[fields.Entry] | None = None) -> tuple[int, JSON]:
        """POST; ``entries``: the managedFields an apply that creates the object made."""
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                self.server.rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
            )
        name = meta.get("name", "")
        self._namespace_open(name)
        validate(self.kind, obj, None)
        self._admit("CREATE", obj, None)
        if meta.get("resourceVersion"):
            raise ApiError(500, None, "resourceVersion should not be set on objects to be created")
        key = self.key(name)
        if key in self.store.objects:
            raise ApiError(
                409, "AlreadyExists", f'{self.kind.qualified} "{name}" already exists', self.kind.details(name)
            )
        if entries is None:
            # Entries the body carries are the starting point; the creating manager then
            # takes every field it sets from them.
            given = fields.read_entries(obj)
            entries = fields.record_update(
                given, self.kind.empty(), obj, self.kind.schema, self.manager(), self.kind.api_version, self.now()
            )
        for stamp in ("deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            meta.pop(stamp, None)
        meta["uid"] = str(uuid.UUID(int=self.server.rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = self.now()
        _set_entries(obj, entries)
        if self.kind.resource == "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        return 201, self._write(key, obj)

    def update(self, obj: JSON) -> tuple[int, JSON]:
        assert self.name is not None
        meta = obj["metadata"]
        if meta.get("name") and meta["name"] != self.name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({self.name})"
            )
        meta["name"] = self.name
        key = self.key(self.name)
        cur = self.store.get(key)
        if cur is None:
            if not self.kind.create_on_update:
                raise not_found(self.kind, self.name)
            # A Lease is created by a PUT, whatever resourceVersion it names.
            meta.pop("resourceVersion", None)
            return self.create(obj)
        old_meta = cur["metadata"]
        if not meta.get("resourceVersion") and not self.kind.unconditional_update:
            message = "Invalid value: 0: must be specified for an update"
            cause = {"reason": "FieldValueInvalid", "message": message, "field": "metadata.resourceVersion"}
            raise ApiError(
                422,
                "Invalid",
                f'{self.kind.qualified} "{self.name}" is invalid: metadata.resourceVersion: {message}',
                {**self.kind.details(self.name), "causes": [cause]},
            )
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise _conflict(self.kind, self.name)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise _invalid_immutable(self.kind, self.name, "metadata.uid", meta["uid"])
        given = fields.read_entries(obj) if meta.get("managedFields") else fields.read_entries(cur)
        for stamp in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if stamp in old_meta:
                meta[stamp] = old_meta[stamp]
            else:
                meta.pop(stamp, None)
        validate(self.kind, obj, cur)
        self._admit("UPDATE", obj, cur)
        # An object without managedFields gets none from an update (only a create or an
        # apply starts tracking).
        entries = (
            fields.record_update(given, cur, obj, self.kind.schema, self.manager(), self.kind.api_version, self.now())
            if given
            else []
        )
        if self.kind.resource == "namespaces":
            # Changed only through finalize and by the server; the entries above are
            # made before this, as the real server's are.
            obj["spec"], obj["status"] = cur["spec"], cur["status"]
        _set_entries(obj, entries)
        return self._store_update(key, obj, cur)

    def _store_update(self, key: Key, obj: JSON, cur: JSON) -> tuple[int, JSON]:
        meta = obj["metadata"]
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not (obj.get("spec") or {}).get("finalizers")
        ):
            self.store.delete(key)
            return 200, obj  # the last finalizer gone: the object goes with it
        if obj == cur:
            return 200, cur  # nothing changed: nothing is written
        return 200, self._write(key, obj)

    def patch(self) -> tuple[int, JSON]:
        assert self.name is not None
        ctype = next((v for k, v in self.request.headers.items() if k.lower() == "content-type"), "")
        ctype = ctype.split(";")[0].strip()
        if ctype == "application/apply-patch+yaml":
            return self.apply()
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json",
                         "application/json-patch+json"):  # fmt: skip
            raise ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
        cur = self.store.get(self.key(self.name))
        if cur is None:
            raise not_found(self.kind, self.name)
        patch = _json_body(self.request)
        if ctype == "application/json-patch+json":
            target = _json_patch(cur, patch)
        else:
            if not isinstance(patch, dict):
                raise bad_request("the patch is not a JSON object")
            target = _merge_patch(cur, patch, strategic=ctype.startswith("application/strategic"))
        obj = decode(self.kind, target)
        if self.kind.namespaced:
            obj["metadata"]["namespace"] = self.namespace
        return self.update(obj)

    def apply(self) -> tuple[int, JSON]:
        assert self.name is not None
        manager = self.query.get("fieldManager")
        if not manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
                {"group": "meta.k8s.io", "kind": "PatchOptions",
                 "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch",
                             "field": "fieldManager"}]},
            )  # fmt: skip
        try:
            doc = yaml.load((self.request.body or b"").decode(), Loader=_Yaml11Loader)
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise bad_request(f"error decoding YAML: {err}") from None
        try:
            config = decode(self.kind, doc)
        except ApiError as err:
            what = f"/{self.name}; {self.kind.api_version}, Kind={self.kind.kind}"
            raise ApiError(500, None, f"failed to create typed patch object ({what}): {err.message}") from None
        meta = config["metadata"]
        if meta.get("name") and meta["name"] != self.name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({self.name})"
            )
        meta["name"] = self.name
        if self.kind.namespaced:
            meta["namespace"] = self.namespace
        if self.kind.resource == "namespaces":
            config.pop("status", None)
        key = self.key(self.name)
        cur = self.store.get(key)
        if (
            cur is not None
            and meta.get("resourceVersion")
            and meta["resourceVersion"] != cur["metadata"]["resourceVersion"]
        ):
            raise _conflict(self.kind, self.name)
        meta.pop("resourceVersion", None)
        force = self.query.get("force") in ("true", "1")
        entries = fields.read_entries(cur) if cur is not None else []
        try:
            merged, entries, _ = fields.record_apply(
                entries,
                cur,
                config,
                self.kind.schema,
                manager,
                self.kind.api_version,
                self.now(),
                force=force,
                empty={**self.kind.empty(), "kind": self.kind.kind, "apiVersion": self.kind.api_version,
                       "metadata": {"name": self.name, **({"namespace": self.namespace} if self.namespace else {})}},
            )  # fmt: skip
        except fields.ApplyConflict as err:
            raise _apply_conflict(err) from None
        if cur is None:
            obj = decode(self.kind, merged)
            if self.kind.namespaced:
                obj["metadata"]["namespace"] = self.namespace
            return self.create(obj, entries)
        validate(self.kind, merged, cur)
        self._admit("UPDATE", merged, cur)
        _set_entries(merged, entries)
        return self._store_update(key, merged, cur)

    def finalize(self, obj: JSON) -> tuple[int, JSON]:
        """PUT …/namespaces/NAME/finalize: set the namespace's spec.finalizers."""
        assert self.name is not None
        key = self.key(self.name)
        cur = self.store.get(key)
        if cur is None:
            raise not_found(self.kind, self.name)
        new = copy.deepcopy(cur)
        finalizers = (obj.get("spec") or {}).get("finalizers") or []
        new["spec"] = {"finalizers": finalizers} if finalizers else {}
        return self._store_update(key, new, cur)

    def delete(self, options: Any) -> tuple[int, JSON]:
        assert self.name is not None
        key = self.key(self.name)
        cur = self.store.get(key)
        if cur is None:
            raise not_found(self.kind, self.name)
        meta = cur["metadata"]
        pre = (options or {}).get("preconditions") if isinstance(options, dict) else None
        if isinstance(pre, dict):
            where = f'Operation cannot be fulfilled on {self.kind.kind} "{self.name}": '
            details = {"name": self.name, "kind": self.kind.kind}
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise ApiError(
                    409,
                    "Conflict",
                    where + f"the UID in the precondition ({pre['uid']}) does not match the UID in record "
                    f"({meta['uid']}). The object might have been deleted and then recreated",
                    details,
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    where + f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not match the "
                    f"ResourceVersion in record ({meta['resourceVersion']}). The object might have been modified",
                    details,
                )
        self._admit("DELETE", cur, cur)
        keeps = meta.get("finalizers") or (
            self.kind.resource == "namespaces" and (cur.get("spec") or {}).get("finalizers")
        )
        if keeps:
            if meta.get("deletionTimestamp"):
                return 200, cur
            new = copy.deepcopy(cur)
            new["metadata"]["deletionTimestamp"] = self.now()
            if self.kind.resource == "namespaces":
                new["status"] = {"phase": "Terminating"}
            else:
                new["metadata"]["deletionGracePeriodSeconds"] = 0
            return 200, self._write(key, new)
        gone = self.store.delete(key)
        if self.kind.resource == "namespaces":
            return 200, gone
        details = {**self.kind.details(self.name), "uid": meta["uid"]}
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def delete_collection(self) -> tuple[int, JSON]:
        labels = label_selector(self.query.get("labelSelector", ""))
        names = field_selector(self.query.get("fieldSelector", ""))
        items = []
        for key in sorted(self.store.objects):
            if key[0] != self.kind.resource or key[1] != (self.namespace or ""):
                continue
            obj = self.store.objects[key]
            if not (labels(obj["metadata"].get("labels") or {}) and names(obj)):
                continue
            self.name = key[2]
            _, answer = self.delete(None)
            if answer.get("kind") == "Status":
                answer = self.store.history[-1].obj
            item = copy.deepcopy(answer)
            item.pop("kind", None)
            item.pop("apiVersion", None)
            items.append(item)
        self.name = None
        body = {
            "kind": f"{self.kind.kind}List",
            "apiVersion": self.kind.api_version,
            "metadata": {"resourceVersion": str(self.store.revision)},
            "items": items,
        }
        return 200, body


class _Yaml11Loader(yaml.SafeLoader):
    """YAML as the API server reads an apply: YAML 1.1, where y and n are booleans too."""

    bool_values: ClassVar[dict[str, bool]] = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


_Yaml11Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


def _set_entries(obj: JSON, entries: list[fields.Entry]) -> None:
    written = fields.write_entries(entries)
    if written:
        obj["metadata"]["managedFields"] = written
    else:
        obj["metadata"].pop("managedFields", None)


def _conflict(kind: Kind, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {kind.qualified} "{name}": the object has been modified; please apply '
        "your changes to the latest version and try again",
        kind.details(name),
    )


def _invalid_immutable(kind: Kind, name: str, field: str, value: str) -> ApiError:
    message = f'Invalid value: "{value}": field is immutable'
    details = {"name": name, "kind": kind.kind, "causes": [{"reason": "FieldValueInvalid", "message": message,
                                                             "field": field}]}  # fmt: skip
    return ApiError(422, "Invalid", f'{kind.kind} "{name}" is invalid: {field}: {message}', details)


def _apply_conflict(err: fields.ApplyConflict) -> ApiError:
    """409 for an apply's conflicts, worded as the real server words them (an Update
    entry's manager with its API version, an Apply entry's by name)."""

    def who(manager: str, operation: str, version: str) -> str:
        return f'"{manager}" using {version}' if operation == "Update" else f'"{manager}"'

    by: dict[str, list[str]] = {}
    for manager, operation, version, path in err.conflicts:
        by.setdefault(who(manager, operation, version), []).append(fields.describe(path))
    n = len(err.conflicts)
    if n == 1:
        ((name, (where,)),) = by.items()
        text = f"Apply failed with 1 conflict: conflict with {name}: {where}"
    else:
        parts = []
        for name, paths in by.items():
            if len(paths) == 1:
                parts.append(f"conflict with {name}: {paths[0]}")
            else:
                parts.append(f"conflicts with {name}:\n" + "\n".join(f"- {p}" for p in paths))
        text = f"Apply failed with {n} conflicts: " + "\n".join(parts)
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {who(manager, operation, version)}",
         "field": fields.describe(path)}
        for manager, operation, version, path in err.conflicts
    ]  # fmt: skip
    return ApiError(409, "Conflict", text, {"causes": causes})


def _resource_version(text: str) -> int:
    """A resourceVersion parameter as a number (0 when not given); 400 when it is none."""
    if not text:
        return 0
    if not text.isdigit():
        raise bad_request(
            f'invalid resource version: resourceVersion: Invalid value: "{text}": strconv.ParseUint: '
            f'parsing "{text}": invalid syntax'
        )
    return int(text)


def _no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _method_not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})


def _json_body(request: Request) -> Any:
    if not request.body:
        return None
    try:
        return json.loads(request.body)
    except (ValueError, RecursionError) as err:
        raise bad_request(f"error decoding JSON: {err}") from None


@dataclass(frozen=True)
class Route:
    kind: Kind
    namespace: str | None
    name: str | None
    sub: str | None = None


def _route(path: str) -> Route | str | None:
    """Where a path leads: objects of a kind, "version", "access-review", or nowhere."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts == ["version"]:
        return "version"
    if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]:
        return "access-review"
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:3] == ["apis", "coordination.k8s.io", "v1"]:
        group, rest = "coordination.k8s.io", parts[3:]
    else:
        return None
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
        if group == "" and rest == ["finalize"]:
            return Route(KINDS["namespaces"], None, namespace, "finalize")
    if not rest:
        return None
    kind = KINDS.get(rest[0])
    if kind is None or kind.group != group or len(rest) > 3:
        return None
    if not kind.namespaced and namespace is not None:
        return None
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    return Route(kind, namespace, name, sub)


def _merge_patch(target: Any, patch: Any, *, strategic: bool = False, key: str = "") -> Any:
    """RFC 7386 merge patch; ``strategic``: a list of finalizers is merged (union), as
    Kubernetes' strategic merge patch merges it."""
    if not isinstance(patch, dict):
        if strategic and key == "finalizers" and isinstance(target, list) and isinstance(patch, list):
            return target + [x for x in patch if x not in target]
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v, strategic=strategic, key=k)
    return out


def _json_patch(target: JSON, ops: Any) -> JSON:
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    doc: Any = copy.deepcopy(target)
    if not isinstance(ops, list):
        raise bad_request("a JSON patch is a list of operations")
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise bad_request("a JSON patch operation needs an op and a path")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = (
                parent[int(part)]
                if isinstance(parent, list)
                else parent.get(part)
                if isinstance(parent, dict)
                else None
            )
            if parent is None:
                raise ApiError(422, "Invalid", f"doc is missing path: {op['path']}")
        last = parts[-1] if parts else ""
        kind = op.get("op")
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ApiError(422, "Invalid", f"testing value {op['path']} failed: test failed")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, op.get("value"))
                else:
                    parent[index] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(
                        422, "Invalid", f"replace operation does not apply: doc is missing key: {op['path']}"
                    )
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"remove operation does not apply: doc is missing path: {op['path']}")
        else:
            raise bad_request(f"unexpected JSON patch operation {kind!r}")
    assert isinstance(doc, dict)
    return doc


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
