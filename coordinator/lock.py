"""The multi-cluster lease: acquire, renew, release, break, status.

What it guarantees
------------------
A deployment spans n clusters; its lock is one ``coordination.k8s.io/v1`` Lease named
``coordinator-lock-<deployment>`` in the deployment's namespace on every member. A
contender holds the lock when its lock id is the ``holderIdentity`` of live leases on a
majority q = floor(n/2) + 1 of them. Two majorities of the same n always share a
cluster, and on one cluster a Lease has one holder at a time, because every write is a
compare-and-swap on ``resourceVersion`` (a 409 means someone else wrote first: we
re-read and decide again, never overwrite). So at most one contender holds the lock at a
time, as long as leases are not taken over before they really expired.

Expiry without trusting clocks
------------------------------
A contender may take over a lease held by someone else only when it has expired, and
that is judged from one API server's clock alone: the server stamps the time of every
change of the lease in ``metadata.managedFields[].time``, and stamps its current time
on every response in the HTTP ``Date`` header. The lease has expired when

    Date − last change > leaseDurationSeconds + drift allowance + 2 s

(the two seconds cover the one-second resolution of both stamps). No client's wall
clock enters this rule, so a contender whose clock is minutes off behaves exactly like
one whose clock is right. When a server gives no such evidence, a waiting contender
falls back to local observation the way client-go's leader election does: a lease whose
``resourceVersion`` has not changed for a whole TTL, timed on the contender's own
monotonic clock, has expired.

The holder, for its part, counts its validity on its own monotonic clock from the
moment *before* it sent the writes that took (or renewed) the leases:
validity = TTL − elapsed − drift allowance. Each server stamped its write after that
moment, so the server-side expiry above comes strictly later than the end of the
holder's validity, provided the clocks' *rates* differ by less than the drift allowance
(1 % of the TTL). Offsets between clocks do not matter at all.

What it does not guarantee
--------------------------
A holder that stops (paused, swapped out) and resumes after its validity ended may
still believe it holds the lock: it must check validity before acting. That is what the
fencing token is for: every successful acquisition gets an integer strictly greater than
every token granted before for that deployment (it is one more than the highest token
found on a majority of leases, and any two majorities share a cluster), and the state
replicas refuse writes carrying a token lower than one they have seen. A lock is only as
good as the checks its holder makes: an unobservable cluster is never treated as free.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import math
import os
import random
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias

import anyio
from anyio.abc import TaskGroup

from coordinator import quorum
from coordinator.clusters import ClusterSet, failed
from coordinator.errors import (
    IdentityMismatchError,
    LockHeldError,
    NoQuorumError,
    StateConflictError,
)
from coordinator.fanout import ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.kube.resources import (
    ANNOTATION_PREFIX,
    FIELD_MANAGER,
    last_write_time,
    lease_name,
    lease_path,
    leases_path,
    micro_time,
    owned_metadata,
    parse_time,
)
from coordinator.logs import get_logger
from coordinator.models import DeploymentRecord
from coordinator.outcome import Outcome

log = get_logger(__name__)

A_HOLDER = ANNOTATION_PREFIX + "holder"
A_HOST = ANNOTATION_PREFIX + "host"
A_PID = ANNOTATION_PREFIX + "pid"
A_REASON = ANNOTATION_PREFIX + "reason"
A_COMMAND = ANNOTATION_PREFIX + "command"
A_TOKEN = ANNOTATION_PREFIX + "fencing-token"
A_MEMBERS = ANNOTATION_PREFIX + "members"
A_NAMESPACE = ANNOTATION_PREFIX + "namespace"
A_LAST_BREAK = ANNOTATION_PREFIX + "last-break"
A_NEXT = ANNOTATION_PREFIX + "next"
A_RELEASED = ANNOTATION_PREFIX + "released-at"
# Claims on the next turn are written under their own field manager, so that the server's
# time stamp of a claim never counts as a write of the lease: a waiter's claim must not
# make a dead holder's lease look renewed.
LINE_MANAGER = "coordinator-line"
HOLDER_ANNOTATIONS = (A_HOLDER, A_HOST, A_PID, A_REASON, A_COMMAND)
MAX_CAS_RETRIES = 4
# How long a freed (or expired) lease stays reserved for the contender that has waited
# longest, by the server's clock, before anyone may take it.
HANDOFF_GRACE_S = 2.0


def default_holder() -> str:
    env = os.environ.get("COORDINATOR_HOLDER")
    if env:
        return env
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def new_lock_id() -> str:
    return secrets.token_hex(8)


def _now() -> datetime:
    return datetime.now(UTC)


# ------------------------------------------------------------------ one lease, observed


@dataclass
class LeaseView:
    """One cluster's lease as read, with expiry judged by that server's clock."""

    exists: bool
    obj: dict[str, Any] = field(default_factory=dict)
    lock_id: str | None = None
    ttl_s: int | None = None
    acquired_at: datetime | None = None
    renewed_at: datetime | None = None
    transitions: int | None = None
    token: int = 0
    token_malformed: bool = False
    info: dict[str, str] = field(default_factory=dict)
    server_now: datetime | None = None
    last_write: datetime | None = None
    resource_version: str | None = None
    next_claim: TurnClaim | None = None

    @classmethod
    def parse(cls, obj: dict[str, Any] | None, server_now: datetime | None) -> LeaseView:
        if not obj:
            return cls(exists=False, server_now=server_now)
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        ann = meta.get("annotations") or {}
        token, malformed = 0, False
        raw = ann.get(A_TOKEN)
        if raw is not None:
            try:
                token = int(raw)
                malformed = token < 0
            except (TypeError, ValueError):
                malformed = True
        ttl = spec.get("leaseDurationSeconds")
        return cls(
            exists=True,
            obj=obj,
            lock_id=spec.get("holderIdentity") or None,
            ttl_s=int(ttl) if isinstance(ttl, int) else None,
            acquired_at=parse_time(spec.get("acquireTime")),
            renewed_at=parse_time(spec.get("renewTime")),
            transitions=spec.get("leaseTransitions"),
            token=max(token, 0),
            token_malformed=malformed,
            info={k[len(ANNOTATION_PREFIX) :]: str(v) for k, v in ann.items() if k in HOLDER_ANNOTATIONS},
            server_now=server_now,
            last_write=_lease_write_time(obj),
            resource_version=meta.get("resourceVersion"),
            next_claim=TurnClaim.parse(ann.get(A_NEXT)),
        )

    @property
    def held(self) -> bool:
        return self.lock_id is not None

    def expired(self) -> bool | None:
        """True/False by the server's clock; None when the server gave no evidence."""
        if not self.held:
            return True
        if self.ttl_s is None:
            return True  # a lease without a duration cannot be live
        return quorum.lease_expired_by_server(self.ttl_s, self.server_now, self.last_write)

    def remaining_s(self) -> float | None:
        if not self.held or self.ttl_s is None:
            return None
        return quorum.server_remaining(self.ttl_s, self.server_now, self.last_write)

    def live_for_other(self, lock_id: str) -> bool:
        """Held by another lock id and not provably expired."""
        return self.held and self.lock_id != lock_id and self.expired() is not True

    @property
    def live_claim(self) -> TurnClaim | None:
        """The next-turn claim, unless it is the current holder's own: a claimant keeps
        its claim while it takes the leases (an attempt that loses gives them back and
        keeps its place in line); once it holds, the claim means nothing."""
        claim = self.next_claim
        return claim if claim is not None and claim.lock_id != self.lock_id else None

    def claim_fresh(self) -> bool:
        """Does the next-turn claim still bind? While the lease is live, and for
        HANDOFF_GRACE_S after it was freed or expired, by the server's clock. Without
        server evidence a claim does not bind: fairness is best effort, never a reason
        to leave the lock idle."""
        left = self.reserved_left_s() if self.live_claim is not None else None
        if left is None:
            return False
        return left > 0 if self.held else left >= 0

    def binding_claim(self, lock_id: str, mine: TurnClaim | None = None) -> TurnClaim | None:
        """The claim here of a contender that has waited longer than us (``mine``: our
        place in line; None for one who has not waited), if it still binds. A claim by a
        later waiter does not bind an earlier one: claims on different clusters may not
        have converged yet, and the earliest waiter must never be kept out by them."""
        claim = self.live_claim
        if claim is None or claim.lock_id == lock_id or (mine is not None and mine < claim):
            return None
        return claim if self.claim_fresh() else None

    def reserved_for_other(self, lock_id: str, mine: TurnClaim | None = None) -> bool:
        """Not ours, and the next turn here belongs to someone who has waited longer."""
        return self.lock_id != lock_id and self.binding_claim(lock_id, mine) is not None

    def reserved_left_s(self) -> float | None:
        """Seconds until a reservation stops binding, by the server's clock."""
        if self.held:
            rem = self.remaining_s()
            return None if rem is None else rem + HANDOFF_GRACE_S
        elapsed = quorum.server_elapsed(self.server_now, self.last_write)
        return None if elapsed is None else HANDOFF_GRACE_S - elapsed


@dataclass(frozen=True, order=True)
class TurnClaim:
    """A waiting contender's claim on the next turn of one cluster's lease.

    Waiters order themselves by when they began waiting, as that cluster's server saw
    it (the ``Date`` of their first read), ties broken by lock id; the oldest claim
    wins. Claims only ever delay a take, so they cannot break mutual exclusion.
    """

    since: int
    lock_id: str
    holder: str = field(default="", compare=False)

    @classmethod
    def parse(cls, raw: Any) -> TurnClaim | None:
        if not isinstance(raw, str):
            return None
        try:
            doc = json.loads(raw)
            return cls(int(doc["since"]), str(doc["lock"]), str(doc.get("holder") or ""))
        except (ValueError, TypeError, KeyError):
            return None  # malformed: ignored, and overwritten by the next claim

    def dump(self) -> str:
        return json.dumps({"lock": self.lock_id, "holder": self.holder, "since": self.since}, separators=(",", ":"))


@dataclass
class ClusterLease:
    """What an operation left on one cluster (the report's row)."""

    view: LeaseView | None = None
    action: str = ""


# What a compare-and-swap step decides on a lease as read: a final result, or the body
# to write with the action (and detail, if other than the action) to report.
Decision: TypeAlias = ClusterResult[ClusterLease] | tuple[dict[str, Any], str, str]

# ------------------------------------------------------------------ results


@dataclass
class AcquireResult:
    deployment: str
    namespace: str
    lock_id: str
    holder: str
    fencing_token: int | None
    acquired: bool
    quorum: int
    results: dict[str, ClusterResult[ClusterLease]]
    members: list[str]
    ttl_s: float
    validity_s: float = 0.0
    started: float = 0.0  # monotonic time before the writes were sent

    def valid_until(self) -> float:
        return self.started + quorum.remaining_validity(self.ttl_s, 0.0)

    def expires_in(self) -> float:
        return max(0.0, self.valid_until() - time.monotonic())


@dataclass
class ClusterStatus:
    name: str
    status: str
    holder: str | None = None
    lock_id: str | None = None
    acquired_at: datetime | None = None
    renewed_at: datetime | None = None
    ttl_s: int | None = None
    transitions: int | None = None
    error: str | None = None
    token: int | None = None
    remaining_s: float | None = None
    info: dict[str, str] = field(default_factory=dict)


@dataclass
class LockStatus:
    deployment: str
    namespace: str
    quorum: int
    holder: str | None
    lock_id: str | None
    fencing_token: int | None
    held_by_majority: bool
    expires_in_s: float | None
    clusters: list[ClusterStatus]
    info: dict[str, str] = field(default_factory=dict)
    next_in_line: TurnClaim | None = None  # the waiter whose turn is next, if any


# ------------------------------------------------------------------ the engine


class LockEngine:
    """The lock of one deployment over its member clusters."""

    def __init__(
        self,
        clusters: ClusterSet,
        deployment: DeploymentRecord,
        *,
        background: TaskGroup | None = None,
    ) -> None:
        self.clusters = clusters
        self.dep = deployment
        self.name = lease_name(deployment.name)
        self.path = lease_path(deployment.namespace, self.name)
        self.members = list(deployment.clusters)
        self.n = len(self.members)
        self.q = quorum.quorum_size(self.n)
        self.background = background

    @property
    def timeout(self) -> float:
        return self.clusters.timeout

    # -- reading

    async def _read(self, cluster: str) -> LeaseView:
        client = self.clusters.client(cluster)
        try:
            resp = await client.request("GET", self.path)
        except KubeError as err:
            if err.kind == kube.NOT_FOUND:
                # A 404 is an answer: the lease does not exist (yet) on this cluster.
                return LeaseView(exists=False)
            raise
        return LeaseView.parse(resp.body, resp.server_time)

    async def _checked_read(self, cluster: str) -> LeaseView:
        """Identity check and lease read in flight together (two requests, one round trip);
        nothing is written to a cluster before its identity is proven."""
        view: LeaseView | None = None

        async def read() -> None:
            nonlocal view
            view = await self._read(cluster)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await self.clusters.check_identity(cluster)
        except BaseExceptionGroup as group:
            raise first_kube_error(group) from None
        assert view is not None
        return view

    # -- writing one lease

    def _lease_body(
        self,
        view: LeaseView,
        *,
        lock_id: str | None,
        token: int,
        ttl_s: float,
        holder: str | None = None,
        reason: str | None = None,
        command: str | None = None,
        renew_only: bool = False,
        keep_claim: bool = False,
    ) -> dict[str, Any]:
        now = micro_time(_now())
        if view.exists:
            obj = {k: v for k, v in view.obj.items() if k not in ("status",)}
            meta = dict(obj.get("metadata") or {})
            spec = dict(obj.get("spec") or {})
        else:
            obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
            meta = owned_metadata(self.name, self.dep.name)
            spec = {}
        ann = dict(meta.get("annotations") or {})
        if lock_id is None:  # release: clear the holder, keep the object and the token
            for key in HOLDER_ANNOTATIONS:
                ann.pop(key, None)
            if not keep_claim and view.held and view.live_claim is None:
                ann.pop(A_NEXT, None)  # the holder's own claim, used up by its turn
            ann[A_RELEASED] = now
            spec.pop("holderIdentity", None)
            spec.pop("acquireTime", None)
            spec.pop("renewTime", None)
        elif renew_only:
            spec["renewTime"] = now
            spec["leaseDurationSeconds"] = math.ceil(ttl_s)
        else:
            if view.lock_id != lock_id:
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if view.exists else 0)
                spec["acquireTime"] = now
            spec["holderIdentity"] = lock_id
            spec["leaseDurationSeconds"] = math.ceil(ttl_s)
            spec["renewTime"] = now
            if view.next_claim is not None and (view.live_claim is None or not view.claim_fresh()):
                # the previous holder's own claim (used up), or one whose turn has passed
                ann.pop(A_NEXT, None)
            ann.update(
                {
                    A_HOLDER: holder or "",
                    A_HOST: socket.gethostname(),
                    A_PID: str(os.getpid()),
                    A_REASON: reason or "",
                    A_COMMAND: command or "",
                }
            )
        if lock_id is not None:
            ann[A_TOKEN] = str(token)
        ann[A_MEMBERS] = ",".join(self.members)
        ann[A_NAMESPACE] = self.dep.namespace
        meta["annotations"] = ann
        labels = dict(meta.get("labels") or {})
        labels.update(owned_metadata(self.name, self.dep.name)["labels"])
        meta["labels"] = labels
        obj["metadata"] = meta
        obj["spec"] = spec
        return obj

    async def _write(
        self, cluster: str, view: LeaseView, body: dict[str, Any], *, manager: str = FIELD_MANAGER
    ) -> LeaseView:
        client = self.clusters.client(cluster)
        query = {"fieldManager": manager}
        if view.exists:
            resp = await client.request("PUT", self.path, body=body, query=query)
        else:
            resp = await client.request("POST", leases_path(self.dep.namespace), body=body, query=query)
        return LeaseView.parse(resp.body, resp.server_time)

    # -- acquire

    async def acquire(
        self,
        *,
        ttl_s: float,
        holder: str,
        reason: str = "",
        command: str = "",
        wait_s: float = 0.0,
        lock_id: str | None = None,
        on_wait: Callable[[AcquireResult, float], Awaitable[None] | None] | None = None,
    ) -> AcquireResult:
        """Take the lock on a majority, waiting up to ``wait_s`` (woken by lease watches).

        Raises LockHeldError (3), NoQuorumError (4) or IdentityMismatchError (5) with a
        report; returns an :class:`AcquireResult` on success.
        """
        lock_id = lock_id or new_lock_id()
        deadline = time.monotonic() + wait_s
        if wait_s <= 0:
            return self._settle(await self._attempt(lock_id, ttl_s, holder, reason, command), final=True)
        changed = anyio.Event()
        seen: dict[str, str | None] = {}
        wake = _Wake(changed)
        result: AcquireResult | None = None
        async with anyio.create_task_group() as watchers:
            for cluster in self.members:
                watchers.start_soon(self._watch_leases, cluster, wake, seen, lock_id)
            backoff = 0.2
            try:
                while True:
                    wake.event = anyio.Event()
                    result = await self._attempt(lock_id, ttl_s, holder, reason, command, wake.mine)
                    stamps = []
                    for name, r in result.results.items():
                        view = r.value.view if r.value else None
                        if view is not None:
                            seen[name] = view.resource_version
                            if view.server_now is not None:
                                stamps.append(int(view.server_now.timestamp()))
                    if wake.mine is None and stamps:
                        # When this call began waiting: its place in line. The median of
                        # the servers' clocks at the first reads (one skewed server cannot
                        # move it much), the same on every cluster so that all agree.
                        wake.mine = TurnClaim(sorted(stamps)[(len(stamps) - 1) // 2], lock_id, holder)
                    left = deadline - time.monotonic()
                    if result.acquired or left <= 0 or self._mismatch(result):
                        break
                    if on_wait is not None:
                        maybe = on_wait(result, left)
                        if maybe is not None:
                            await maybe
                    if wake.mine is not None:
                        await self._claim_turns(result, wake.mine, wake.claimed)
                    sleep = min(left, backoff * (0.5 + random.random()), _next_expiry(result))
                    backoff = min(backoff * 2, 2.0)
                    with anyio.move_on_after(max(0.0, sleep)):
                        await wake.event.wait()
                        # Several waiters woken by the same release: spread them a little.
                        await anyio.sleep(random.random() * 0.03)
            finally:
                watchers.cancel_scope.cancel()
                # Claims this call leaves behind would reserve the next turn for nobody:
                # a waiter that gives up withdraws all of them, a winner those where it
                # did not take the lease (its other claims are spent by holding it).
                # Best effort: they lapse by themselves after the grace.
                won = result.results if result is not None and result.acquired else {}
                leftover = sorted(c for c in wake.claimed if not (c in won and won[c].ok))
                if leftover and self.background is not None:
                    self.background.start_soon(self._withdraw_claims, leftover, lock_id)
                elif leftover and not won:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeout):
                        await self._withdraw_claims(leftover, lock_id)
        # Settled outside the watchers' task group, so that the documented errors reach
        # the caller as themselves, not wrapped in an ExceptionGroup.
        assert result is not None
        return self._settle(result, final=True)

    def _mismatch(self, result: AcquireResult) -> bool:
        return any(r.outcome is Outcome.IDENTITY_MISMATCH for r in result.results.values())

    # -- taking turns: the waiter who waited longest gets the lock next

    async def _claim_turns(self, result: AcquireResult, mine: TurnClaim, ours: set[str]) -> None:
        """Claim the next turn on every cluster where the lease is held by another and
        no earlier waiter has claimed it; the clusters where the claim may be ours are
        added to ``ours``. Best effort: a claim that cannot be written only costs this
        waiter its place. (Later changes are followed by the lease watches.)"""
        lock_id = mine.lock_id

        def decide(cluster: str, view: LeaseView) -> Decision:
            current = view.live_claim
            if not view.live_for_other(lock_id):
                # free or expired: the next attempt decides, no claim needed
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "not held"))
            if current is not None and current.lock_id == lock_id:
                ours.add(cluster)
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "claimed already"))
            if current is not None and view.claim_fresh() and current <= mine:
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "someone waited longer"))
            ours.add(cluster)  # before the write: one cut short may still have landed
            return _with_claim(view.obj, mine), "claimed", ""

        async def one(cluster: str, view: LeaseView) -> None:
            r = await self._cas(cluster, view, lambda v: decide(cluster, v), manager=LINE_MANAGER)
            if not r.ok:
                log.debug("could not claim the next turn", cluster=cluster, detail=r.detail)

        with anyio.move_on_after(self.timeout):
            async with anyio.create_task_group() as tg:
                for cluster, r in result.results.items():
                    view = r.value.view if r.value else None
                    if view is not None and r.outcome is Outcome.HELD_BY_OTHER:
                        tg.start_soon(one, cluster, view)

    async def _claim_from_event(self, cluster: str, obj: dict[str, Any], wake: _Wake) -> None:
        mine = wake.mine
        if mine is None:
            return
        view = LeaseView.parse(obj, None)
        live = view.live_claim
        if live is not None and live <= mine:
            return  # ours already, or someone has waited longer
        try:
            await self.clusters.check_identity(cluster)  # proven once per process: no request
        except KubeError:
            return  # nothing is written to a cluster whose identity is not proven
        wake.claimed.add(cluster)
        try:
            await self._write(cluster, view, _with_claim(obj, mine), manager=LINE_MANAGER)
        except KubeError as err:
            if err.kind != kube.CONFLICT:
                log.debug("could not claim the next turn", cluster=cluster, detail=err.detail)

    async def _withdraw_claims(self, clusters: list[str], lock_id: str) -> None:
        def decide(cluster: str, view: LeaseView) -> Decision:
            if view.next_claim is None or view.next_claim.lock_id != lock_id:
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "no claim of ours"))
            return _with_claim(view.obj, None), "withdrawn", ""

        async def one(cluster: str) -> None:
            with anyio.move_on_after(self.timeout), contextlib.suppress(KubeError):
                view = await self._read(cluster)
                await self._cas(cluster, view, lambda v: decide(cluster, v), manager=LINE_MANAGER)

        async with anyio.create_task_group() as tg:
            for cluster in clusters:
                tg.start_soon(one, cluster)

    async def _watch_leases(self, cluster: str, wake: _Wake, seen: dict[str, str | None], lock_id: str) -> None:
        """Wake the waiting contender when this cluster's lease is freed or deleted; claim
        the next turn when the lease is held by another and its claim (if any) is younger
        than ours.

        A change of holder, or a renewal, does not make the lock available; an expiry is
        waited for by time. Our own writes (their resourceVersions are in ``seen``) are
        ignored, so a contender does not wake itself up by releasing a partial attempt.
        Claims are written straight from the event (its resourceVersion makes the write
        a compare-and-swap); a lost race needs no retry, since the winning write is the
        next event.
        """
        client = self.clusters.client(cluster)
        query = {"fieldSelector": f"metadata.name={self.name}"}
        delay = 0.5
        while True:
            try:
                async for event in client.watch(leases_path(self.dep.namespace), query=query, timeout=55):
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    holder_id = (obj.get("spec") or {}).get("holderIdentity")
                    if event.get("type") == "DELETED" or (not holder_id and rv != seen.get(cluster)):
                        wake.event.set()
                    elif holder_id and holder_id != lock_id and event.get("type") in ("ADDED", "MODIFIED"):
                        await self._claim_from_event(cluster, obj, wake)
                delay = 0.5
            except KubeError as err:
                log.debug("lease watch interrupted", cluster=cluster, detail=err.detail)
                await anyio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _attempt(
        self, lock_id: str, ttl_s: float, holder: str, reason: str, command: str, mine: TurnClaim | None = None
    ) -> AcquireResult:
        """One acquisition attempt on every member at once (``mine``: our place in line)."""
        started = time.monotonic()
        reads: dict[str, LeaseView] = {}
        reads_done = 0
        token_ready = anyio.Event()
        chosen: dict[str, int] = {}
        line: dict[str, TurnClaim | None] = {}
        attempt_over = {"lost": False, "won": False, "mismatch": False}
        result_holder: dict[str, AcquireResult] = {}

        def maybe_choose_token() -> None:
            if token_ready.is_set():
                return
            if len(reads) >= self.q or reads_done >= self.n:
                chosen["token"] = quorum.next_fencing_token(v.token for v in reads.values())
                line["ahead"] = _first_in_line(reads.values(), lock_id, mine)
                token_ready.set()

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            nonlocal reads_done
            try:
                try:
                    view = await self._checked_read(cluster)
                except KubeError as err:
                    if err.kind == "identity-mismatch":
                        attempt_over["mismatch"] = True
                    return failed(cluster, err)  # type: ignore[return-value]
                reads[cluster] = view
            finally:
                reads_done += 1
                maybe_choose_token()
            await token_ready.wait()
            if len(reads) < self.q:
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "not attempted"),
                    detail="not attempted: fewer than a majority of clusters could be read",
                )
            token = chosen["token"]
            outcome = await self._take_one(
                cluster, view, lock_id, token, ttl_s, holder, reason, command, attempt_over, mine, line.get("ahead")
            )
            if outcome.ok and (attempt_over["lost"] or attempt_over["mismatch"]):
                # Landed after the attempt was already decided lost: give it back now.
                await self._release_one(cluster, lock_id, keep_claim=True)
                outcome.value = ClusterLease(outcome.value.view if outcome.value else None, "released")
            return outcome

        def decided(results: Mapping[str, ClusterResult[ClusterLease]]) -> bool:
            outcomes = [r.outcome for r in results.values()]
            if any(o is Outcome.IDENTITY_MISMATCH for o in outcomes):
                attempt_over["mismatch"] = True
                return True
            if quorum.quorum_reached(outcomes, self.n):
                attempt_over["won"] = True
                return True
            if quorum.quorum_impossible(outcomes, self.n):
                attempt_over["lost"] = True
                return True
            return False

        results = await fan_out(
            self.members,
            on_cluster,
            timeout=self.timeout,
            until=decided,
            background=self.background,
            # A won attempt does not wait for stragglers (a lease of ours that lands late is
            # freed by release or expiry); a lost one lets them finish and give back.
            leave_running=lambda: not attempt_over["won"],
        )
        token = chosen.get("token")
        result = AcquireResult(
            deployment=self.dep.name,
            namespace=self.dep.namespace,
            lock_id=lock_id,
            holder=holder,
            fencing_token=token,
            acquired=False,
            quorum=self.q,
            results=results,
            members=self.members,
            ttl_s=ttl_s,
            started=started,
        )
        result_holder["r"] = result
        outcomes = [r.outcome for r in results.values()]
        won = quorum.quorum_reached(outcomes, self.n) and not attempt_over["mismatch"]
        validity = quorum.remaining_validity(ttl_s, time.monotonic() - started)
        if won and validity > 0:
            result.acquired = True
            result.validity_s = validity
            return result
        # Lost (or won too late to be of use): give back everything this attempt took.
        attempt_over["lost"] = True
        if won:
            for r in results.values():
                if r.ok:
                    r.detail = "taken, but validity ran out before a majority answered"
        taken = [name for name, r in results.items() if r.ok]
        if taken:
            await self._release_many(taken, lock_id, results)
        return result

    async def _take_one(
        self,
        cluster: str,
        view: LeaseView,
        lock_id: str,
        token: int,
        ttl_s: float,
        holder: str,
        reason: str,
        command: str,
        attempt_over: dict[str, bool],
        mine: TurnClaim | None = None,
        ahead: TurnClaim | None = None,
    ) -> ClusterResult[ClusterLease]:
        """Take one lease by compare-and-swap. ``mine`` is our place in line, ``ahead``
        the earliest waiter before us seen on any cluster of this attempt: while someone
        has waited longer, free leases are theirs to take, on every cluster alike (so
        that contenders do not split the clusters between them)."""

        def decide(view: LeaseView) -> Decision:
            if view.live_for_other(lock_id):
                return ClusterResult(
                    cluster,
                    Outcome.HELD_BY_OTHER,
                    ClusterLease(view, "held"),
                    detail=_held_detail(view),
                )
            first = ahead or (view.live_claim if view.reserved_for_other(lock_id, mine) else None)
            if first is not None:
                return ClusterResult(
                    cluster,
                    Outcome.HELD_BY_OTHER,
                    ClusterLease(view, "reserved"),
                    detail=_reserved_detail(first),
                    extra={"next": first},
                )
            if view.token_malformed:
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "malformed"),
                    detail=f"the lease's {A_TOKEN} annotation is not a whole number; "
                    "`coordinator lock break` rewrites it",
                )
            if view.token > token:
                return ClusterResult(
                    cluster,
                    Outcome.CONFLICT,
                    ClusterLease(view, "newer token"),
                    detail=f"a concurrent attempt recorded token {view.token} here",
                )
            if attempt_over["lost"] or attempt_over["mismatch"]:
                return ClusterResult(
                    cluster,
                    Outcome.CONFLICT,
                    ClusterLease(view, "skipped"),
                    detail="free, but not taken: the attempt was already lost elsewhere",
                )
            action = (
                "created"
                if not view.exists
                else ("renewed" if view.lock_id == lock_id else ("took over expired" if view.held else "took free"))
            )
            body = self._lease_body(
                view, lock_id=lock_id, token=token, ttl_s=ttl_s, holder=holder, reason=reason, command=command
            )
            return body, action, ""

        return await self._cas(cluster, view, decide)

    async def _cas(
        self,
        cluster: str,
        view: LeaseView,
        decide: Callable[[LeaseView], Decision],
        *,
        manager: str = FIELD_MANAGER,
    ) -> ClusterResult[ClusterLease]:
        """Compare-and-swap one lease: ``decide`` looks at the lease as read and returns
        either a final result, or the body to write and the action to report. A write
        that loses the race (409) is never retried blindly: the lease is read again and
        decided again."""
        for _ in range(MAX_CAS_RETRIES):
            decision = decide(view)
            if isinstance(decision, ClusterResult):
                return decision
            body, action, detail = decision
            try:
                new_view = await self._write(cluster, view, body, manager=manager)
                return ClusterResult(cluster, Outcome.OK, ClusterLease(new_view, action), detail=detail or action)
            except KubeError as err:
                if err.kind not in (kube.CONFLICT, kube.ALREADY_EXISTS):
                    return failed(cluster, err)  # type: ignore[return-value]
            try:
                view = await self._read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
        return ClusterResult(
            cluster, Outcome.CONFLICT, ClusterLease(view, "raced"), detail="lost the compare-and-swap race repeatedly"
        )

    def _settle(self, result: AcquireResult, *, final: bool) -> AcquireResult:
        if result.acquired:
            return result
        outcomes = [r.outcome for r in result.results.values()]
        # clusters that never answered count as unreachable
        outcomes += [Outcome.UNREACHABLE] * (self.n - len(outcomes))
        report = acquire_report(result)
        if self._mismatch(result):
            raise IdentityMismatchError(report, payload=result)
        if quorum.failure_outcome(outcomes, self.n) is Outcome.HELD_BY_OTHER:
            raise LockHeldError(report, payload=result)
        raise NoQuorumError(report, payload=result)

    # -- release / renew / break

    async def _release_one(self, cluster: str, lock_id: str, keep_claim: bool = False) -> ClusterResult[ClusterLease]:
        try:
            await self.clusters.check_identity(cluster)
            view = await self._read(cluster)
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]

        def decide(view: LeaseView) -> Decision:
            if view.lock_id != lock_id:
                return ClusterResult(
                    cluster,
                    Outcome.OK,
                    ClusterLease(view, "not ours"),
                    detail="not held by this lock id",
                    extra={"ours": False},
                )
            body = self._lease_body(view, lock_id=None, token=view.token, ttl_s=view.ttl_s or 1, keep_claim=keep_claim)
            return body, "released", ""

        result = await self._cas(cluster, view, decide)
        if result.ok and result.value is not None and result.value.action == "released":
            result.extra["ours"] = True
        return result

    async def _release_many(
        self, clusters: list[str], lock_id: str, into: dict[str, ClusterResult[ClusterLease]]
    ) -> None:
        released = await fan_out(
            clusters, lambda c: self._release_one(c, lock_id, keep_claim=True), timeout=self.timeout
        )
        for name, r in released.items():
            prev = into.get(name)
            if prev is not None and prev.ok:
                prev.detail = (
                    f"{prev.detail}; then released"
                    if r.ok
                    else (f"{prev.detail}; release failed ({r.outcome}: {r.detail}) — it expires by itself")
                )
                if prev.value:
                    prev.value.action = "released" if r.ok else prev.value.action
                    if r.ok and r.value and r.value.view:
                        prev.value.view = r.value.view

    async def release(self, lock_id: str) -> dict[str, ClusterResult[ClusterLease]]:
        """Clear the holder wherever it is still ``lock_id`` (never someone else's)."""
        results = await fan_out(self.members, lambda c: self._release_one(c, lock_id), timeout=self.timeout)
        self._raise_on_mismatch(results)
        ours = [r for r in results.values() if r.ok and r.extra.get("ours")]
        observable = [r for r in results.values() if r.outcome.observable]
        if not ours and len(observable) >= self.q:
            raise StateConflictError(
                f"Lock id {lock_id} holds nothing on deployment {self.dep.name!r}: none of the "
                f"{len(observable)} clusters that answered has it as holder. It was already "
                "released, expired and was taken over, or the id is wrong; see "
                f"`coordinator lock status {self.dep.name}`.",
                payload=results,
            )
        if not ours:
            raise NoQuorumError(
                f"Could not release lock {lock_id} of {self.dep.name!r}: only "
                f"{len(observable)} of {self.n} clusters answered "
                f"({_summarize(results)}). Leases left behind expire by themselves after their TTL.",
                payload=results,
            )
        return results

    async def renew(self, lock_id: str, token: int, ttl_s: float, holder: str | None = None) -> AcquireResult:
        """Extend the leases still ours; re-take free ones (in the name of ``holder``, the
        lock's holder); succeed only on a majority."""
        who = holder or default_holder()
        started = time.monotonic()

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self._checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]

            def decide(view: LeaseView) -> Decision:
                if view.lock_id == lock_id:
                    body = self._lease_body(view, lock_id=lock_id, token=token, ttl_s=ttl_s, renew_only=True)
                    return body, "renewed", ""
                if not view.live_for_other(lock_id) and view.token <= token and not view.token_malformed:
                    body = self._lease_body(view, lock_id=lock_id, token=token, ttl_s=ttl_s, holder=who)
                    return body, "re-taken", ""
                return ClusterResult(
                    cluster,
                    Outcome.HELD_BY_OTHER,
                    ClusterLease(view, "lost"),
                    detail=_held_detail(view) if view.held else "no longer ours",
                )

            return await self._cas(cluster, view, decide)

        results = await fan_out(
            self.members,
            on_cluster,
            timeout=self.timeout,
            until=lambda rs: quorum.quorum_reached([r.outcome for r in rs.values()], self.n) and len(rs) == self.n,
        )
        self._raise_on_mismatch(results)
        result = AcquireResult(
            deployment=self.dep.name,
            namespace=self.dep.namespace,
            lock_id=lock_id,
            holder=who,
            fencing_token=token,
            acquired=False,
            quorum=self.q,
            results=results,
            members=self.members,
            ttl_s=ttl_s,
            started=started,
        )
        validity = quorum.remaining_validity(ttl_s, time.monotonic() - started)
        if quorum.quorum_reached([r.outcome for r in results.values()], self.n) and validity > 0:
            result.acquired = True
            result.validity_s = validity
        return result

    async def break_lock(self, *, by: str, reason: str = "") -> dict[str, ClusterResult[ClusterLease]]:
        """Clear the lease whatever its holder (admin override), leaving an audit note."""
        note = {"by": by, "host": socket.gethostname(), "at": micro_time(_now()), "reason": reason}
        # A malformed fencing token is replaced by the highest valid one on the other
        # members, so that tokens keep rising after the break; those clusters wait (a
        # bounded while) for the other reads.
        tokens: list[int] = []
        reads_left = [self.n]
        all_read = anyio.Event()

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self._checked_read(cluster)
                if not view.token_malformed:
                    tokens.append(view.token)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            finally:
                reads_left[0] -= 1
                if reads_left[0] == 0:
                    all_read.set()
            if view.token_malformed:
                with anyio.move_on_after(self.timeout / 2):
                    await all_read.wait()

            def decide(view: LeaseView) -> Decision:
                if not view.exists:
                    return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "absent"), detail="no lease")
                if not view.held and not view.token_malformed:
                    return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "free"), detail="already free")
                body = self._lease_body(view, lock_id=None, token=view.token, ttl_s=view.ttl_s or 1)
                ann = body["metadata"]["annotations"]
                previous = view.lock_id or "-"
                ann[A_LAST_BREAK] = json.dumps(note | {"previous_lock_id": previous})
                detail = f"cleared holder {previous}"
                if view.token_malformed:
                    floor = max(tokens, default=0)
                    if floor:
                        ann[A_TOKEN] = str(floor)
                        detail += f"; the malformed fencing token is now {floor}, the highest on the others"
                    else:  # nothing valid seen anywhere: the next acquisition starts over
                        ann.pop(A_TOKEN, None)
                        detail += "; the malformed fencing token was removed (no valid one anywhere)"
                return body, "broken", detail

            return await self._cas(cluster, view, decide)

        results = await fan_out(self.members, on_cluster, timeout=self.timeout)
        self._raise_on_mismatch(results)
        log.warning("lock broken", deployment=self.dep.name, by=by, clusters={k: r.detail for k, r in results.items()})
        return results

    def _raise_on_mismatch(self, results: dict[str, ClusterResult[ClusterLease]]) -> None:
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            raise IdentityMismatchError(identity_report(bad), payload=results)

    # -- status

    async def status(self) -> LockStatus:
        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self._checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "read"))

        results = await fan_out(self.members, on_cluster, timeout=self.timeout)
        self._raise_on_mismatch(results)
        rows: list[ClusterStatus] = []
        live: dict[str, str | None] = {}
        remaining: dict[str, float] = {}
        claims: list[TurnClaim] = []
        for name in self.members:
            r = results.get(name)
            if r is None or not r.ok or r.value is None or r.value.view is None:
                status = str(r.outcome) if r else "unreachable"
                if status not in ("unreachable", "forbidden", "identity-mismatch"):
                    status = "error"
                rows.append(ClusterStatus(name, status, error=r.detail if r else "no answer"))
                continue
            v = r.value.view
            if v.live_claim is not None and v.claim_fresh():
                claims.append(v.live_claim)
            expired = v.expired()
            if not v.held:
                st = "free"
            elif expired:
                st = "expired"
            else:
                st = "held"
                live[name] = v.lock_id
                rem = v.remaining_s()
                if rem is not None:
                    remaining[name] = rem
            rows.append(
                ClusterStatus(
                    name,
                    st,
                    holder=v.info.get("holder") or None,
                    lock_id=v.lock_id,
                    acquired_at=v.acquired_at,
                    renewed_at=v.renewed_at,
                    ttl_s=v.ttl_s,
                    transitions=v.transitions,
                    token=v.token if v.exists else None,
                    remaining_s=v.remaining_s() if st == "held" else None,
                    info=v.info,
                    error="fencing-token annotation is malformed" if v.token_malformed else None,
                )
            )
        winner = quorum.majority_holder(live, self.n)
        holder_row = next((row for row in rows if winner and row.lock_id == winner), None)
        expires = None
        if winner:
            expires = quorum.majority_expiry(
                [remaining[c] for c, lid in live.items() if lid == winner and c in remaining], self.n
            )
        return LockStatus(
            deployment=self.dep.name,
            namespace=self.dep.namespace,
            quorum=self.q,
            holder=holder_row.holder if holder_row else None,
            lock_id=winner,
            fencing_token=holder_row.token if holder_row else None,
            held_by_majority=winner is not None,
            expires_in_s=round(expires, 1) if expires is not None else None,
            clusters=rows,
            info=holder_row.info if holder_row else {},
            # the claim found on the most clusters (earliest on a tie)
            next_in_line=min(claims, key=lambda c: (-claims.count(c), c)) if claims else None,
        )


def first_kube_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report from a group of concurrent requests to one cluster: an identity
    mismatch first, then any other classified failure, else the group itself."""
    found: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                found.append(e)

    walk(group)
    kube_errors = [e for e in found if isinstance(e, KubeError)]
    if len(kube_errors) != len(found):
        return group
    kube_errors.sort(key=lambda e: e.kind != "identity-mismatch")
    return kube_errors[0]


class _Wake:
    """What a waiting acquire shares with its lease watches."""

    def __init__(self, event: anyio.Event) -> None:
        self.event = event
        self.mine: TurnClaim | None = None  # our place in line, once known
        self.claimed: set[str] = set()  # clusters where a claim of ours may stand


def _lease_write_time(obj: dict[str, Any]) -> datetime | None:
    """The server's time of the last change to the lease by anyone but the claims'
    manager: takes, renewals and releases (a release stamps ``released-at`` so that it
    is dated too; removing fields alone would leave the stamp as it was)."""
    meta = obj.get("metadata") or {}
    entries = meta.get("managedFields") or []
    kept = [e for e in entries if not (isinstance(e, dict) and e.get("manager") == LINE_MANAGER)]
    return last_write_time({"metadata": {**meta, "managedFields": kept}})


def _with_claim(obj: dict[str, Any], claim: TurnClaim | None) -> dict[str, Any]:
    """The lease ``obj`` (resourceVersion kept: a compare-and-swap) with ``claim``, or
    without any claim for None."""
    body = {k: v for k, v in obj.items() if k != "status"}
    meta = dict(body.get("metadata") or {})
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k != A_NEXT}
    if claim is not None:
        ann[A_NEXT] = claim.dump()
    meta["annotations"] = ann
    body["metadata"] = meta
    return body


def _next_expiry(result: AcquireResult) -> float:
    """Seconds until the soonest lease held by another could expire (a wake-up hint)."""
    hints = []
    for r in result.results.values():
        if r.outcome is Outcome.HELD_BY_OTHER and r.value and r.value.view:
            view = r.value.view
            rem = view.reserved_left_s() if r.value.action == "reserved" else view.remaining_s()
            if rem is not None:
                hints.append(max(0.05, rem + 0.05))
    return min(hints) if hints else 2.0


def _first_in_line(views: Iterable[LeaseView], lock_id: str, mine: TurnClaim | None) -> TurnClaim | None:
    """The earliest binding claim among ``views`` by a waiter before us, if any."""
    return min((c for v in views if (c := v.binding_claim(lock_id, mine)) is not None), default=None)


def _reserved_detail(claim: TurnClaim) -> str:
    who = claim.holder or "another contender"
    return (
        f"free, but the next turn is {who}'s (lock {claim.lock_id}), who has waited longer; "
        f"it lapses if not taken within {HANDOFF_GRACE_S:.0f}s of the release"
    )


def _held_detail(view: LeaseView) -> str:
    who = view.info.get("holder") or "an unknown holder"
    rem = view.remaining_s()
    tail = f", expires in {rem:.0f}s unless renewed" if rem is not None else ""
    return f"held by {who} (lock {view.lock_id}){tail}"


def _summarize(results: dict[str, ClusterResult[ClusterLease]]) -> str:
    return ", ".join(f"{k}: {r.outcome}" for k, r in sorted(results.items()))


def identity_report(bad: dict[str, ClusterResult[ClusterLease]]) -> str:
    parts = [f"cluster {name!r}: {r.detail}" for name, r in sorted(bad.items())]
    return (
        "Cluster identity mismatch — nothing was written to these clusters: "
        + "; ".join(parts)
        + ". A kubeconfig context was pointed at another cluster. Fix the context, or if "
        "the cluster was really rebuilt, run `coordinator cluster disconnect NAME --force` "
        "and connect it again."
    )


def _fmt_time(when: datetime | None) -> str:
    if when is None:
        return "?"
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def acquire_report(result: AcquireResult) -> str:
    """The paragraph a person reads when the lock could not be had."""
    from coordinator.durations import format_duration

    n = len(result.members)
    got = [k for k, r in result.results.items() if r.ok]
    lines = []
    holders: dict[str, list[str]] = {}
    reserved: dict[str, list[str]] = {}
    unseen: list[str] = []
    for name in result.members:
        r = result.results.get(name)
        if r is None:
            lines.append(f"{name}: unreachable (no answer in time)")
            unseen.append(name)
            continue
        v = r.value.view if r.value else None
        if r.outcome is Outcome.HELD_BY_OTHER and r.value is not None and r.value.action == "reserved":
            lines.append(f"{name}: {r.detail}")
            claim = r.extra.get("next")
            who = claim.holder if isinstance(claim, TurnClaim) else ""
            reserved.setdefault(who or "another contender", []).append(name)
        elif r.outcome is Outcome.HELD_BY_OTHER and v is not None:
            who = v.info.get("holder") or "?"
            rem = v.remaining_s()
            until = f"expires in {format_duration(rem)}" if rem is not None else "expiry unknown"
            host = v.info.get("host") or "?"
            pid = v.info.get("pid") or "?"
            why = v.info.get("reason") or "no reason given"
            lines.append(
                f"{name}: held by {who} (host {host}, pid {pid}, lock {v.lock_id}, "
                f"reason: {why}) since {_fmt_time(v.acquired_at)}, renewed "
                f"{_fmt_time(v.renewed_at)}, {until}"
            )
            holders.setdefault(who, []).append(name)
        else:
            lines.append(f"{name}: {r.outcome} — {r.detail}")
            if not r.outcome.observable:
                unseen.append(name)
    head = (
        f"Could not lock deployment {result.deployment!r}: a majority of {result.quorum} of "
        f"{n} clusters is needed, this attempt got {len(got)}"
        + (f" ({', '.join(got)}), which were released again" if got else "")
        + ". "
    )
    advice = []
    if holders:
        who = ", ".join(f"{h} on {', '.join(cs)}" for h, cs in holders.items())
        views = [r.value.view for r in result.results.values() if r.value and r.value.view]
        first = _first_in_line(views, result.lock_id, None)
        line = (
            f" {first.holder or 'Another contender'} is already waiting and is next in line; --wait "
            "queues you behind everyone who began waiting earlier."
            if first is not None
            else ""
        )
        advice.append(
            f"It is held by {who}.{line} Wait for it with --wait 5m, ask the holder to release "
            f"it, or if the holder is gone for good, run `coordinator lock break {result.deployment}`."
        )
    if reserved:
        who = ", ".join(f"{h} on {', '.join(cs)}" for h, cs in reserved.items())
        advice.append(
            f"It was just freed and is being handed to the contender that waited longest ({who}); "
            f"waiters take turns in the order they began waiting. Wait for your turn with --wait."
        )
    if unseen:
        advice.append(
            f"Could not observe {', '.join(unseen)}; an unobservable cluster is never counted "
            f"as free. Check `coordinator cluster info NAME` for reachability and permissions."
        )
    return head + "Per cluster:\n" + "".join(f"  {line}\n" for line in lines) + " ".join(advice)


@contextlib.asynccontextmanager
async def keep_renewed(
    engine: LockEngine,
    held: AcquireResult,
    *,
    on_lost: Callable[[str], None] | None = None,
) -> AsyncIterator[anyio.Event]:
    """Renew ``held`` in the background while the block runs; yield an event set if lost.

    Renews every TTL/3. When a majority can no longer be renewed before the validity
    ends, the lock is lost: the event is set and ``on_lost`` is called with the reason.
    """
    lost = anyio.Event()
    interval = max(0.5, held.ttl_s / 3)

    async def loop() -> None:
        valid_until = held.valid_until()
        while True:
            await anyio.sleep(min(interval, max(0.05, valid_until - time.monotonic())))
            if time.monotonic() >= valid_until:
                break
            try:
                renewed = await engine.renew(held.lock_id, held.fencing_token or 0, held.ttl_s, held.holder)
            except Exception as err:  # identity mismatch or worse: the lock is not safe
                reason = f"renewal failed: {err}"
                log.warning("lock renewal failed", error=str(err))
                if time.monotonic() >= valid_until:
                    break
                await anyio.sleep(0.5)
                continue
            if renewed.acquired:
                held.started = renewed.started
                valid_until = renewed.valid_until()
                log.info("lock renewed", deployment=engine.dep.name, valid_for=round(renewed.validity_s, 1))
            else:
                log.warning("lock renewal reached no majority", clusters=_summarize(renewed.results))
        reason = f"the lock on {engine.dep.name!r} could not be renewed on a majority before its validity ended"
        lost.set()
        if on_lost is not None:
            on_lost(reason)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop)
            try:
                yield lost
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The renewal loop never raises, so the group holds the block's own exception:
        # give it back to the caller as it was raised, not wrapped.
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
            raise group.exceptions[0] from None
        raise


def current_command() -> str:
    return " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200]
