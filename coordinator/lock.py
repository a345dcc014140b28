"""The multi-cluster lease engine: acquire, renew, release, break, status.

The per-lease rules (may this lease be taken, has it lapsed, which token, what a
renewal finds) are pure functions in :mod:`coordinator.lease`; this module reads and
writes the leases, fans out over the members and decides the majority.

What it guarantees, and under which assumptions
-----------------------------------------------
A contender holds the lock when its lock id is the ``holderIdentity`` of live leases on
a majority q = floor(n/2) + 1 of the n members. Two majorities share a cluster, and on
one cluster every write is a compare-and-swap on ``resourceVersion``, so at most one
contender holds the lock at a time — provided that a lease is never taken over before
its holder's validity ended, and that a lease that disappears is never taken as free.

* Expiry evidence is the coordinator's own: the server's stamp on the ``coordinator``
  field manager's managedFields entry (our takes and renewals), compared with a fresh
  server stamp from a probe write made after the read. Edits by other field managers
  move neither. The HTTP ``Date`` only tells when to probe. A lease without our entry
  lapses only by local observation (our fields unchanged for a whole TTL on the
  contender's clock). A duration written by someone else is replaced by the
  deployment's maximum TTL.
* The margin before a lapse counts is drift (1 % of the TTL) + 2 s (one-second stamps)
  + ``max_server_skew`` (API servers of one cluster disagreeing on the time).
* The holder counts validity = TTL − elapsed − 1 % on CLOCK_BOOTTIME from the moment
  *before* it sent its writes; every server stamped those writes later, so contenders
  see the lapse strictly after the holder's validity ended, as long as clock rates
  agree within 1 % and server offsets within ``max_server_skew``.
* A lease found missing is recorded as a tombstone that counts as held by an unknown
  holder for one maximum TTL (no lease may be taken for longer). Leases are created
  with the deployment, so a missing one was deleted. A lease whose ``coordinator.io/uid``
  does not name the object itself is a recreated copy: it blocks for a maximum TTL after
  its creation and carries no history.
* Fencing tokens: one more than the highest on a majority of leases that kept their
  history; when deleted leases leave no such majority, every member's lease and the
  state replicas' tokens of a majority are included too; short of that, nothing is taken.
* Renewals return once a majority is renewed, never re-take a lease, and report the
  lock lost at once when a lease names another lock id or a break note names ours.

Assumed: only coordinator writes a lease's ``spec`` holder fields and its
``coordinator.io/`` holder annotations; anyone may label or annotate it, strip its
managedFields, change its duration, or delete it (each handled as above).

Not guaranteed: a holder that stops past its validity may still act, unless it checks
``held.valid`` or the resource checks fencing tokens. A token granted to a holder whose
every lease was then deleted, and which never wrote the state, can be granted again
after the maximum TTL (nothing in the clusters remembers it).
"""

from __future__ import annotations

import base64
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
from typing import Any, TypeAlias, assert_never

import anyio
from anyio.abc import TaskGroup

from coordinator import cas, history, quorum
from coordinator.clusters import ClusterSet, failed
from coordinator.errors import (
    CoordinatorError,
    IdentityMismatchError,
    LockHeldError,
    MembershipError,
    NoQuorumError,
    StateConflictError,
)
from coordinator.fanout import ANSWERED, NOT_WAITED_FOR, ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.kube.resources import (
    FIELD_MANAGER,
    lease_name,
    lease_path,
    leases_path,
    micro_time,
    owned_metadata,
    state_name,
    state_paths,
)
from coordinator.lease import (
    A_COMMAND,
    A_HOLDER,
    A_HOST,
    A_LAST_BREAK,
    A_MAX_TTL,
    A_MEMBERS,
    A_NAMESPACE,
    A_NEXT,
    A_PID,
    A_PROBE,
    A_REASON,
    A_RELEASED,
    A_TOKEN,
    A_UID,
    A_VANISHED,
    DEFAULT_MAX_SERVER_SKEW_S,
    DEFAULT_MAX_TTL_S,
    HANDOFF_GRACE_S,
    HOLDER_ANNOTATIONS,
    LINE_MANAGER,
    PROBE_MANAGER,
    RELEASE_MANAGER,
    LeaseView,
    RenewVerdict,
    Sighting,
    Standing,
    TurnClaim,
    boot_clock,
    history_known,
    holder_identity,
    lapsed_by_observation,
    lock_id_of,
    manager_time,
    next_token,
    observe,
    remaining_validity,
    renew_verdict,
    standing,
    token_taken,
)
from coordinator.logs import get_logger
from coordinator.membership import (
    A_MEMBERSHIP,
    Check,
    Membership,
    Stored,
    Verdict,
    explain_existing,
    foreign_set,
    in_lease_object,
    says_nothing,
    stored_in_lease,
)
from coordinator.membership import check as check_membership
from coordinator.models import DeploymentRecord
from coordinator.outcome import Outcome
from coordinator.text import printable

__all__ = [
    "A_COMMAND",
    "A_HOLDER",
    "A_HOST",
    "A_LAST_BREAK",
    "A_MEMBERS",
    "A_NAMESPACE",
    "A_NEXT",
    "A_PID",
    "A_REASON",
    "A_RELEASED",
    "A_TOKEN",
    "HANDOFF_GRACE_S",
    "LINE_MANAGER",
    "AcquireResult",
    "LeaseView",
    "LockEngine",
    "LockStatus",
    "TurnClaim",
    "default_holder",
    "keep_renewed",
]

log = get_logger(__name__)

MAX_CAS_RETRIES = 4


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


@dataclass
class ClusterLease:
    """What an operation left on one cluster (the report's row)."""

    view: LeaseView | None = None
    action: str = ""
    previous: LeaseView | None = None  # the lease as read before this write (for the history)


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
    started: float = 0.0  # boot-clock time before the writes were sent
    lost: str | None = None  # a renewal that found the lock taken or broken says why
    membership: Check | None = None  # what the members store, against the local record

    def valid_until(self) -> float:
        return self.started + remaining_validity(self.ttl_s, 0.0)

    def expires_in(self) -> float:
        return max(0.0, self.valid_until() - boot_clock())


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
        max_server_skew_s: float = DEFAULT_MAX_SERVER_SKEW_S,
        follow: Callable[[], DeploymentRecord | None] | None = None,
    ) -> None:
        self.clusters = clusters
        self.background = background
        self.max_server_skew_s = max_server_skew_s
        # This machine's record of the deployment as it is now (another command here may
        # have changed the members since this engine was made): see _follow_record.
        self.follow = follow
        # Local observation of leases without evidence of ours, per cluster.
        self._sightings: dict[str, Sighting] = {}
        # Clusters whose Date header disagreed with their own stamps: always probe there.
        self._date_untrusted: set[str] = set()
        self._bind(deployment)

    def _bind(self, deployment: DeploymentRecord) -> None:
        """Count with the members of ``deployment`` (this machine's record)."""
        self.dep = deployment
        self.name = lease_name(deployment.name)
        self.path = lease_path(deployment.namespace, self.name)
        joint = list(getattr(deployment, "joint", None) or [])
        # One group normally; the old and the new set while a member change is under way.
        self.majorities = quorum.Majorities([list(deployment.clusters), *([joint] if joint else [])])
        self.members = self.majorities.members
        self.n = len(self.members)
        self.q = self.majorities.quorum  # for display: q of the current set
        self.max_ttl_s = float(getattr(deployment, "max_ttl_s", DEFAULT_MAX_TTL_S))
        self.history = history.HistoryStore(self.clusters, deployment.name, deployment.namespace, self.members)
        # The member set this machine's record names, by identity: what every member
        # must store (see coordinator/membership.py).
        self.membership = Membership.of(
            (self.clusters.record(m).identity for m in deployment.clusters),
            getattr(deployment, "epoch", 1),
            [self.clusters.record(m).identity for m in joint] if joint else None,
        )

    def _follow_record(self, stored: Iterable[Membership]) -> bool:
        """Take up this machine's record again when it moved on to a configuration that the
        members store (a member change made here, e.g. by the child of `lock run`, while
        this engine held the lock); True if it did. ``stored``: the newer sets coordinator
        wrote on the leases read. A record is followed only when it is the same deployment
        (name, namespace, storage), at a newer epoch, and names exactly one of those sets:
        a record edited by hand, or imported from another namespace, is not."""
        if self.follow is None:
            return False
        fresh = self.follow()
        if fresh is None or fresh.epoch <= self.dep.epoch:
            return False
        if (fresh.name, fresh.namespace, fresh.storage) != (self.dep.name, self.dep.namespace, self.dep.storage):
            return False
        try:
            joint = list(fresh.joint or [])
            named = Membership.of(
                (self.clusters.record(m).identity for m in fresh.clusters),
                fresh.epoch,
                [self.clusters.record(m).identity for m in joint] if joint else None,
            )
        except CoordinatorError:  # names a cluster this process does not know
            return False
        if not any(s == named and s.written_by_us for s in stored):
            return False
        log.info("following the member change made here", deployment=fresh.name, epoch=fresh.epoch)
        self._bind(fresh)
        return True

    def agrees(self, stored: Membership) -> bool:
        """Whether a set a member stores is the one this engine counts with."""
        return stored == self.membership

    def other_set(self, view: LeaseView | None) -> Membership | None:
        """The member set ``view`` stores when it is another configuration than this
        engine's, at the same or a newer epoch, whoever wrote it: this engine's record is
        behind (a change made since) or divergent, or the set was edited. A lease storing
        it is neither taken nor renewed by this engine, nor its set written over."""
        stored = self.stored_membership(view) if view is not None else None
        if not isinstance(stored, Membership) or self.agrees(stored):
            return None
        return stored if stored.epoch >= self.membership.epoch else None

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

    def _stand(self, cluster: str, view: LeaseView, lock_id: str, stamp: datetime | None = None) -> Standing:
        """Where ``view`` stands for ``lock_id``, with this engine's local observation
        of leases that carry no evidence of ours and its trust in the cluster's Date."""
        now = boot_clock()
        if view.exists and view.blocking:
            self._sightings[cluster] = observe(self._sightings.get(cluster), view, now)
        observed = lapsed_by_observation(
            self._sightings.get(cluster),
            view,
            now,
            max_ttl_s=self.max_ttl_s,
            max_server_skew_s=self.max_server_skew_s,
        )
        return standing(
            view,
            lock_id,
            max_ttl_s=self.max_ttl_s,
            max_server_skew_s=self.max_server_skew_s,
            stamp=stamp,
            observed_lapse=observed,
            date_trusted=cluster not in self._date_untrusted,
        )

    async def _probe(self, cluster: str, view: LeaseView) -> tuple[LeaseView, datetime | None]:
        """Get a fresh server time stamp on the lease (a compare-and-swap write of a
        nonce under the probe manager): the second stamp of the expiry rule. Also checks
        the response's Date against it, to know whether this cluster's Date can serve as
        a hint."""
        body = _with_annotation(view.obj, A_PROBE, secrets.token_hex(6))
        new = await self._write(cluster, view, body, manager=PROBE_MANAGER)
        stamp = manager_time(new.obj, PROBE_MANAGER)
        if stamp is not None and new.server_now is not None:
            offset = abs((new.server_now - stamp).total_seconds())
            if offset > self.max_server_skew_s + quorum.TIMESTAMP_SLACK_S:
                if cluster not in self._date_untrusted:
                    log.warning("the Date header disagrees with the server's stamps", cluster=cluster, offset=offset)
                self._date_untrusted.add(cluster)
            else:
                self._date_untrusted.discard(cluster)
        return new, stamp

    def _annotations_common(self, *, with_set: bool = True) -> dict[str, str]:
        ann = {A_NAMESPACE: self.dep.namespace, A_MAX_TTL: str(math.ceil(self.max_ttl_s))}
        if with_set:
            ann |= {A_MEMBERS: ",".join(self.members), A_MEMBERSHIP: self.membership.dump()}
        return ann

    def stored_membership(self, view: LeaseView) -> Stored:
        """What one member's lease says about the member set: nothing when it is missing
        or a tombstone (a tombstone is written by whoever found the lease missing, so it
        proves nothing), LEGACY for a lease from before stored member sets."""
        return stored_in_lease(view)

    def _token(self, reads: Mapping[str, LeaseView], state_tokens: list[int] | None) -> int | None:
        """The new fencing token from these reads (see lease.next_token), with "a
        majority" meaning one of every group of the configuration."""
        known = [c for c, v in reads.items() if history_known(v)]
        return next_token(list(reads.values()), self.q, state_tokens, history_ok=self.majorities.reached(known))

    def check_members(self, stored: Mapping[str, Stored]) -> Check:
        return check_membership(self.membership, stored, self.members, self.majorities.groups)

    def membership_error(self, result: Check) -> MembershipError | NoQuorumError:
        names = {self.clusters.record(m).identity: m for m in self.members}
        text = result.explain(self.dep.name, names)
        if result.verdict is Verdict.UNOBSERVABLE:
            return NoQuorumError(text)
        return MembershipError(text)

    def _fresh_lease(self, *, vanished: bool, floor: int = 0) -> dict[str, Any]:
        """A holderless lease: free (made with the deployment), or a tombstone for one
        found missing (it blocks for a maximum TTL; ``floor`` is the highest token this
        contender saw elsewhere)."""
        meta = owned_metadata(self.name, self.dep.name)
        ann = self._annotations_common()
        if vanished:
            ann[A_VANISHED] = micro_time(_now())
            ann[A_TOKEN] = str(floor)
            ann.pop(A_MEMBERSHIP, None)
        meta["annotations"] = ann
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {}}

    async def _record_missing(self, cluster: str, floor: int) -> LeaseView | None:
        """Record a tombstone where the lease was found missing; None if one appeared
        meanwhile (the caller reads again)."""
        client = self.clusters.client(cluster)
        try:
            resp = await client.request(
                "POST",
                leases_path(self.dep.namespace),
                body=self._fresh_lease(vanished=True, floor=floor),
                query={"fieldManager": FIELD_MANAGER},
            )
        except KubeError as err:
            if err.kind == kube.ALREADY_EXISTS:
                return None
            raise
        log.warning("lease found missing; recorded it as held by an unknown holder", cluster=cluster)
        return LeaseView.parse(resp.body, resp.server_time)

    async def create_leases(self) -> dict[str, ClusterResult[ClusterLease]]:
        """Create the free leases of a new deployment, so that a lease missing later is
        known to have been deleted (an existing one is left as it is)."""

        async def one(cluster: str) -> ClusterResult[ClusterLease]:
            client = self.clusters.client(cluster)
            try:
                await self.clusters.check_identity(cluster)
                resp = await client.request(
                    "POST",
                    leases_path(self.dep.namespace),
                    body=self._fresh_lease(vanished=False),
                    query={"fieldManager": FIELD_MANAGER},
                )
                made = LeaseView.parse(resp.body, resp.server_time)
                if made.uid:  # name this very object; unnamed, it would block for a max TTL
                    made = await self._write(cluster, made, _with_annotation(made.obj, A_UID, made.uid))
                return ClusterResult(cluster, Outcome.OK, ClusterLease(made, "created"))
            except KubeError as err:
                if err.kind != kube.ALREADY_EXISTS:
                    return failed(cluster, err)  # type: ignore[return-value]
                try:
                    view = await self._read(cluster)
                except KubeError as err2:
                    return failed(cluster, err2)  # type: ignore[return-value]
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "exists"), detail="lease exists")

        results = await fan_out(self.members, one, timeout=self.timeout)
        stored = {k: self.stored_membership(r.value.view) for k, r in results.items() if r.value and r.value.view}
        verdict = self.check_members(stored)
        if verdict.verdict is Verdict.CONFLICT:
            raise MembershipError(explain_existing(verdict, self.dep.name, self.dep.namespace, self._identity_names()))
        return results

    def _identity_names(self) -> dict[str, str]:
        return {self.clusters.record(m).identity: m for m in self.members}

    async def _state_evidence(self) -> dict[str, tuple[int, Stored]]:
        """What a majority of the state replicas say: per member, the fencing token its
        object records (its envelope's or its token floor, the higher) and the member set
        it stores. Returns as soon as a majority of state objects answered. A missing
        state object says nothing (it may have held the floor of the token to beat and
        been deleted): it counts, as token 0, only when every member answered and too
        few objects are left to make a majority (a state never recorded anywhere, or
        deleted on a majority, which no record survives)."""
        _, path = state_paths(self.dep.namespace, self.dep.name, self.dep.storage)

        async def one(cluster: str) -> ClusterResult[tuple[int, Stored]]:
            try:
                resp = await self.clusters.client(cluster).request("GET", path)
            except KubeError as err:
                if err.kind == kube.NOT_FOUND:
                    return ClusterResult(cluster, Outcome.OK, (0, None), detail=ABSENT)
                return failed(cluster, err)  # type: ignore[return-value]
            found = _envelope_evidence(resp.body, secret=self.dep.storage == "secret")
            if found is None:
                return ClusterResult(cluster, Outcome.ERROR, detail="unreadable state envelope")
            return ClusterResult(cluster, Outcome.OK, found)

        def present(rs: Mapping[str, ClusterResult[tuple[int, Stored]]]) -> list[str]:
            return [k for k, r in rs.items() if r.ok and r.detail != ABSENT]

        def everyone(rs: Mapping[str, ClusterResult[tuple[int, Stored]]]) -> bool:
            return len(rs) == self.n and all(r.ok for r in rs.values())

        results = await fan_out(
            self.members,
            one,
            timeout=self.timeout,
            until=lambda rs: self.majorities.reached(present(rs)) or everyone(rs),
        )
        counted = present(results)
        if not self.majorities.reached(counted) and everyone(results):
            counted = list(results)
        return {k: v for k in counted if (v := results[k].value) is not None}

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
        with_set: bool | None = None,
    ) -> dict[str, Any]:
        if with_set is None:
            with_set = lock_id is not None and not renew_only  # a take
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
            if not keep_claim:
                # A real release; a failed attempt giving back what it took leaves the
                # stamp alone, so that it does not keep the next turn reserved.
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
            spec["holderIdentity"] = holder_identity(holder or "", lock_id)
            spec["leaseDurationSeconds"] = math.ceil(ttl_s)
            spec["renewTime"] = now
            ann.pop(A_VANISHED, None)  # a tombstone taken: its history starts at our token
            ann.pop(A_RELEASED, None)
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
        if view.exists and view.uid:
            ann[A_UID] = view.uid  # this very object was written by coordinator
        # The member set is written by takes and member changes only, which check first
        # what the lease stores. A renewal or a release leaves it as it is: written there,
        # an engine's set could put an older configuration back over a change made since
        # (or over one someone edited, turning that edit into coordinator's own word).
        ann.update(self._annotations_common(with_set=with_set))
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
            taken = self._settle(await self._attempt(lock_id, ttl_s, holder, reason, command), final=True)
            return await self._remember_take(taken, reason)
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
        return await self._remember_take(self._settle(result, final=True), reason)

    # -- the lock's history: recorded after each decision, never in its way

    async def _remember(self, events: list[dict[str, Any]]) -> None:
        """Hand ``events`` to the history (coordinator/history.py): in the background when
        this engine has a task group, so the caller does not wait for it; best effort."""
        if not events:
            return

        async def record() -> None:
            await self.history.record(events, timeout=self.timeout)

        if self.background is not None:
            try:
                self.background.start_soon(record)
                return
            except RuntimeError:  # the task group has already closed: record here
                pass
        await record()

    async def _remember_take(self, result: AcquireResult, reason: str) -> AcquireResult:
        await self._record_token_floor(result)
        lapsed = {
            name: r.value.previous
            for name, r in result.results.items()
            if r.ok and r.value and r.value.previous and r.value.action.startswith("took over")
        }
        await self._remember(
            history.take_events(
                result.lock_id,
                holder=result.holder,
                host=socket.gethostname(),
                pid=str(os.getpid()),
                reason=reason,
                token=result.fencing_token,
                lapsed=lapsed,
            )
        )
        return result

    # -- the token floor: a granted token outlives the deletion of every lease

    async def _record_token_floor(self, result: AcquireResult) -> None:
        """Raise the token floor of the state objects of a majority to the new token
        before the acquisition counts. The leases are the tokens' history, but a holder
        that never writes the state leaves its token on the leases alone: with every lease
        deleted, the next acquisition would hand it out again. The floor lives on the
        state objects (`coordinator.io/token-floor`), whose tokens the next acquisition
        reads when the leases lost their history. When it cannot be raised on a majority,
        the lock is given back and the acquisition fails (exit 4)."""
        if result.fencing_token is not None:
            await self.raise_token_floor(result.fencing_token, result.lock_id, payload=result)

    async def raise_token_floor(self, token: int, lock_id: str, *, payload: Any = None) -> None:
        """Raise the token floor to ``token`` on a majority of every set of this
        configuration; otherwise give lock ``lock_id`` back and raise NoQuorumError.
        The same write stores this configuration's member set on the state objects
        (annotation ``coordinator.io/membership``) where they carry an older one."""
        results = await fan_out(
            self.members,
            lambda c: self._raise_floor(c, token),
            timeout=self.timeout,
            until=lambda rs: self.majorities.reached(k for k, r in rs.items() if r.ok),
        )
        if self.majorities.reached(k for k, r in results.items() if r.ok):
            return
        with anyio.CancelScope(shield=True):
            try:
                await self.release(lock_id)
                undone = "The leases taken were released."
            except CoordinatorError as err:
                undone = f"Releasing the leases taken failed too ({err}); they expire after their TTL."
        why = "; ".join(f"{k}: {r.detail or r.outcome}" for k, r in sorted(results.items()) if not r.ok)
        raise NoQuorumError(
            f"Took the leases of {self.dep.name!r} with fencing token {token}, but could not record that token "
            f"on the state objects of a majority ({why}). {undone} Without that record a token could be handed "
            "out twice if every lease were deleted, so the lock is not taken. Retry when the members accept "
            "writes of the state object again.",
            payload=payload,
        )

    async def store_set_on_state(self, token: int) -> dict[str, ClusterResult[int]]:
        """Store this configuration's member set (and the floor ``token``) on every
        member's state object; the results per member. A member change calls it once
        the new set is committed: the leases are not the only place that set lives, so
        deleting every lease cannot leave the members unable to confirm it."""
        return await fan_out(self.members, lambda c: self._raise_floor(c, token), timeout=self.timeout)

    async def _raise_floor(self, cluster: str, token: int) -> ClusterResult[int]:
        collection, path = state_paths(self.dep.namespace, self.dep.name, self.dep.storage)
        client = self.clusters.client(cluster)
        query = {"fieldManager": FIELD_MANAGER}

        async def read() -> dict[str, Any] | None:
            try:
                body: dict[str, Any] = (await client.request("GET", path)).body
            except KubeError as err:
                if err.kind != kube.NOT_FOUND:
                    raise
                return None
            return body

        def decide(obj: dict[str, Any] | None) -> cas.Put[dict[str, Any]] | cas.Keep[int]:
            if obj is None:
                body = genesis_state_object(self.dep.name, self.dep.storage, self.membership.document())
                body["metadata"]["annotations"][A_TOKEN_FLOOR] = str(token)
                return cas.Put(body)
            changes: dict[str, str] = {}
            if token_floor(obj) < token:
                changes[A_TOKEN_FLOOR] = str(token)
            if _set_on_state_is_behind(obj, self.membership):
                changes[A_MEMBERSHIP] = self.membership.dump()
            if not changes:
                return cas.Keep(token_floor(obj))
            meta = dict(obj.get("metadata") or {})
            meta["annotations"] = dict(meta.get("annotations") or {}) | changes
            return cas.Put({**obj, "metadata": meta})

        async def write(obj: dict[str, Any] | None, body: dict[str, Any]) -> int:
            if obj is None:
                await client.request("POST", collection, body=body, query=query)
            else:
                await client.request("PUT", path, body=body, query=query)  # resourceVersion: CAS
            return token

        result = await cas.compare_and_swap(read, decide, write, attempts=MAX_CAS_RETRIES)
        match result:
            case cas.Written(value=floor) | cas.Decided(value=floor):
                return ClusterResult(cluster, Outcome.OK, floor)
            case cas.ReadFailed(error=err) | cas.WriteFailed(error=err):
                return failed(cluster, err)  # type: ignore[return-value]
            case cas.Raced():
                return ClusterResult(cluster, Outcome.CONFLICT, detail="lost the compare-and-swap race repeatedly")
        assert_never(result)

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
                    holder_id = lock_id_of((obj.get("spec") or {}).get("holderIdentity"))
                    tombstone = A_VANISHED in ((obj.get("metadata") or {}).get("annotations") or {})
                    freed = not holder_id and not tombstone and rv != seen.get(cluster)
                    if event.get("type") == "DELETED" or freed:
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
        started = boot_clock()
        reads: dict[str, LeaseView] = {}
        reads_done = 0
        token_ready = anyio.Event()
        chosen: dict[str, int | None] = {}
        line: dict[str, TurnClaim | None] = {}
        attempt_over = {"lost": False, "won": False, "mismatch": False, "membership": False}
        choosing = [False]

        members_check: list[Check] = []

        async def maybe_choose_token() -> None:
            if token_ready.is_set() or choosing[0]:
                return
            enough = self.majorities.reached(reads)
            if not enough and reads_done < self.n:
                return
            views = list(reads.values())
            token = self._token(reads, None) if enough else None
            verdict = self.check_members({c: self.stored_membership(v) for c, v in reads.items()})
            needs_more = verdict.verdict in (Verdict.UNOBSERVABLE, Verdict.UNCONFIRMED)
            if enough and (token is None or needs_more):
                # Leases were deleted: the token must also clear what the state replicas
                # have seen, and the member set may be confirmed by them.
                choosing[0] = True
                evidence: dict[str, tuple[int, Stored]] = {}
                try:
                    with anyio.move_on_after(self.timeout * 0.75):
                        evidence = await self._state_evidence()
                finally:
                    choosing[0] = False
                views = list(reads.values())  # more reads may have landed meanwhile
                stored = {c: self.stored_membership(v) for c, v in reads.items()}
                for c, (_, kept) in evidence.items():
                    # an envelope's set counts when it is ours or newer; envelopes keep the
                    # set of their last write, so an older epoch says nothing
                    usable = isinstance(kept, Membership) and kept.epoch >= self.membership.epoch
                    if says_nothing(stored.get(c), self.membership) and usable:
                        stored[c] = kept
                verdict = self.check_members(stored)
                # The state only knows tokens that wrote it; a surviving lease that was
                # not read may know a higher one. So every member's lease must be read.
                everyone = len(reads) == self.n
                state_tokens = (
                    [t for t, _ in evidence.values()] if everyone and self.majorities.reached(evidence) else None
                )
                token = self._token(reads, state_tokens)
            chosen["token"] = token
            members_check.append(verdict)
            line["ahead"] = _first_in_line(views, lock_id, mine)
            token_ready.set()

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            nonlocal reads_done
            try:
                try:
                    view = await self._checked_read(cluster)
                except KubeError as err:
                    if err.kind == kube.IDENTITY_MISMATCH:
                        attempt_over["mismatch"] = True
                    return failed(cluster, err)  # type: ignore[return-value]
                reads[cluster] = view
            finally:
                reads_done += 1
            await maybe_choose_token()
            await token_ready.wait()
            if members_check and not members_check[0].ok and self.majorities.reached(reads):
                attempt_over["membership"] = True
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "not attempted"),
                    detail="not attempted: a majority of the members do not confirm this machine's member set",
                )
            if not self.majorities.reached(reads):
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "not attempted"),
                    detail="not attempted: fewer than a majority of clusters could be read",
                )
            token = chosen["token"]
            if token is None and not view.exists and not attempt_over["lost"]:
                floor = max((v.token for v in reads.values() if v.exists and not v.token_malformed), default=0)
                try:
                    recorded = await self._record_missing(cluster, floor)
                except KubeError as err:
                    return failed(cluster, err)  # type: ignore[return-value]
                if recorded is not None:
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(recorded, "missing"),
                        detail=_held_detail(recorded, self.max_ttl_s),
                    )
            if token is None:
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "no safe token"),
                    detail="not attempted: leases were deleted, so no fencing token can be proven new "
                    "without every member's lease and a majority of the state replicas, and some did not answer",
                )
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
            if self.majorities.reached_by({k: r.outcome for k, r in results.items()}):
                attempt_over["won"] = True
                return True
            if self.majorities.impossible_by({k: r.outcome for k, r in results.items()}):
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
            membership=members_check[0] if members_check else None,
        )
        refused = attempt_over["mismatch"] or attempt_over["membership"]
        won = self.majorities.reached_by({k: r.outcome for k, r in results.items()}) and not refused
        validity = remaining_validity(ttl_s, boot_clock() - started)
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

        stamp: datetime | None = None
        for _ in range(MAX_CAS_RETRIES):
            st = self._stand(cluster, view, lock_id)
            try:
                if st is Standing.MISSING and not attempt_over["lost"]:
                    # the highest token this attempt saw elsewhere: a lower bound to keep
                    recorded = await self._record_missing(cluster, token - 1)
                    if recorded is None:
                        view = await self._read(cluster)
                        continue
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(recorded, "missing"),
                        detail=_held_detail(recorded, self.max_ttl_s),
                    )
                if st is Standing.PROBE and not attempt_over["lost"]:
                    view, stamp = await self._probe(cluster, view)
            except KubeError as err:
                if err.kind not in (kube.CONFLICT, kube.ALREADY_EXISTS):
                    return failed(cluster, err)  # type: ignore[return-value]
                try:
                    view = await self._read(cluster)
                except KubeError as err2:
                    return failed(cluster, err2)  # type: ignore[return-value]
                continue
            break

        def decide(view: LeaseView) -> Decision:
            # The probe's stamp stays good evidence after a re-read: it was taken after
            # our last write to the lease, and a later write of ours moves that write.
            st = self._stand(cluster, view, lock_id, stamp)
            if st in (Standing.HELD, Standing.PROBE, Standing.MISSING):
                return ClusterResult(
                    cluster,
                    Outcome.HELD_BY_OTHER,
                    ClusterLease(view, "held"),
                    detail=_held_detail(view, self.max_ttl_s),
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
            moved = self.other_set(view)
            if moved is not None:
                return ClusterResult(
                    cluster,
                    Outcome.CONFLICT,
                    ClusterLease(view, "other member set"),
                    detail=f"not taken: it stores member set epoch {moved.epoch}, not this machine's "
                    f"(epoch {self.membership.epoch})",
                )
            if view.max_ttl_note is not None and ttl_s > view.max_ttl_note:
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "ttl too long"),
                    detail=f"--ttl {ttl_s:g}s is above the deployment's maximum TTL stored here "
                    f"({view.max_ttl_note}s); contenders wait out that maximum for deleted leases",
                )
            if view.token_malformed:
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "malformed"),
                    detail=f"the lease's {A_TOKEN} annotation is not a whole number; "
                    "`coordinator lock break` rewrites it",
                )
            if token_taken(view, lock_id, token):
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
            if st is Standing.OURS:
                action = "renewed"
            elif st is Standing.LAPSED:
                action = "took over deleted lease" if view.vanished else "took over expired"
            else:
                action = "took free"
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

        def step(view: LeaseView) -> cas.Put[tuple[dict[str, Any], str, str]] | cas.Keep[ClusterResult[ClusterLease]]:
            decision = decide(view)
            return cas.Keep(decision) if isinstance(decision, ClusterResult) else cas.Put(decision)

        async def write(view: LeaseView, decision: tuple[dict[str, Any], str, str]) -> ClusterResult[ClusterLease]:
            body, action, detail = decision
            new_view = await self._write(cluster, view, body, manager=manager)
            return ClusterResult(
                cluster, Outcome.OK, ClusterLease(new_view, action, previous=view), detail=detail or action
            )

        result = await cas.compare_and_swap(
            lambda: self._read(cluster), step, write, current=view, attempts=MAX_CAS_RETRIES, reread_last=True
        )
        match result:
            case cas.Written(value=done) | cas.Decided(value=done):
                return done
            case cas.ReadFailed(error=err) | cas.WriteFailed(error=err):
                return failed(cluster, err)  # type: ignore[return-value]
            case cas.Raced(current=last):
                return ClusterResult(
                    cluster,
                    Outcome.CONFLICT,
                    ClusterLease(last, "raced"),
                    detail="lost the compare-and-swap race repeatedly",
                )
        assert_never(result)

    def _settle(self, result: AcquireResult, *, final: bool) -> AcquireResult:
        if result.acquired:
            return result
        report = acquire_report(result)
        if self._mismatch(result):
            raise IdentityMismatchError(report, payload=result)
        if result.membership is not None and not result.membership.ok:
            err = self.membership_error(result.membership)
            err.payload = result
            raise err
        # Held by others when enough clusters were seen to say so (clusters that never
        # answered count as unreachable); otherwise too few could be observed.
        seen = [k for k, r in result.results.items() if r.outcome.observable]
        if self.majorities.reached(seen):
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

        # A real release is dated under its own field manager: the next turn stays reserved
        # for HANDOFF_GRACE_S from it. A failed attempt giving back what it took writes as
        # a take does, so that it never extends that reservation.
        manager = FIELD_MANAGER if keep_claim else RELEASE_MANAGER
        result = await self._cas(cluster, view, decide, manager=manager)
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
        """Clear the holder wherever it is still ``lock_id`` (never someone else's).

        Succeeds only when a majority answered: a release that reached fewer leaves the
        lock possibly held there until the TTL, so it raises NoQuorumError (4). When this
        machine's record moved on to a member set the leases store (a change made under
        this lock), the release goes to the members it names now too."""
        results = await fan_out(self.members, lambda c: self._release_one(c, lock_id), timeout=self.timeout)
        self._raise_on_mismatch(results)
        moved = [m for r in results.values() if r.value and (m := self.other_set(r.value.view)) is not None]
        if moved and self._follow_record(moved):
            more = [c for c in self.members if c not in results or not results[c].ok]
            if more:
                results |= await fan_out(more, lambda c: self._release_one(c, lock_id), timeout=self.timeout)
                self._raise_on_mismatch(results)
            results = {c: r for c, r in results.items() if c in self.members}
        ours = [k for k, r in results.items() if r.ok and r.extra.get("ours")]
        observable = [k for k, r in results.items() if r.outcome.observable]
        if not self.majorities.reached(observable):
            unseen = sorted(set(self.members) - set(observable))
            done = f"released on {', '.join(sorted(ours))}" if ours else "released nowhere"
            raise NoQuorumError(
                f"Could not release lock {lock_id} of {self.dep.name!r} on a majority: {done}, and "
                f"{', '.join(unseen)} did not answer ({_summarize(results)}). The lock may still be held "
                f"there until its TTL runs out. Run `coordinator lock release {self.dep.name}` again when "
                "they answer; the local record of the lock is kept for that.",
                payload=results,
            )
        if not ours:
            raise StateConflictError(
                f"Lock id {lock_id} holds nothing on deployment {self.dep.name!r}: none of the "
                f"{len(observable)} clusters that answered has it as holder. It was already "
                "released, expired and was taken over, or the id is wrong; see "
                f"`coordinator lock status {self.dep.name}`.",
                payload=results,
            )
        released = {k: r.value.previous for k, r in results.items() if r.extra.get("ours") and r.value}
        await self._remember(history.release_events(lock_id, {k: v for k, v in released.items() if v}))
        return results

    async def renew(
        self, lock_id: str, token: int, ttl_s: float, holder: str | None = None, *, _followed: bool = False
    ) -> AcquireResult:
        """Extend the leases still ours; succeed on a majority, returning as soon as one
        is renewed. A renewal never re-takes a lease it no longer holds, and one that
        finds our lease broken or held by another lock id has lost the lock at once
        (``result.lost`` says why). A lease storing a newer member set is not renewed:
        when this machine's record followed that change, the renewal counts over the new
        members; otherwise it reaches no majority (and the lock runs out)."""
        who = holder or default_holder()
        started = boot_clock()
        lost: dict[str, str] = {}
        moved: dict[str, Membership] = {}

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self._checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]

            def decide(view: LeaseView) -> Decision:
                verdict = renew_verdict(view, lock_id)
                newer = self.other_set(view)
                if verdict is RenewVerdict.RENEW and newer is not None:
                    # The members changed since this engine counted them (e.g. the child of
                    # `lock run` ran `deployment replace-cluster`): a majority of the old set
                    # is no longer the lock. Not renewed here; see below.
                    moved[cluster] = newer
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "other member set"),
                        detail=f"not renewed: it stores member set epoch {newer.epoch}, this machine counts "
                        f"with epoch {self.membership.epoch}",
                    )
                if verdict is RenewVerdict.RENEW:
                    body = self._lease_body(view, lock_id=lock_id, token=token, ttl_s=ttl_s, renew_only=True)
                    return body, "renewed", ""
                if verdict is RenewVerdict.BROKEN:
                    note = view.break_note or {}
                    by = printable(str(note.get("by") or "someone"))  # the lease's text: escaped
                    lost[cluster] = f"broken on {cluster} by {by}"
                    detail = f"the lock was broken by {by}"
                elif verdict is RenewVerdict.TAKEN:
                    lost[cluster] = f"{cluster} is held by another lock ({_held_detail(view)})"
                    detail = _held_detail(view)
                else:
                    detail = "no longer ours (the lease was freed or deleted)"
                return ClusterResult(cluster, Outcome.HELD_BY_OTHER, ClusterLease(view, "lost"), detail=detail)

            return await self._cas(cluster, view, decide)

        results = await fan_out(
            self.members,
            on_cluster,
            timeout=self.timeout,
            until=lambda rs: bool(lost) or self.majorities.reached_by({k: r.outcome for k, r in rs.items()}),
        )
        self._raise_on_mismatch(results)
        if moved and not lost and not _followed and self._follow_record(moved.values()):
            # This machine's record followed the change: renew over the members it names now.
            return await self.renew(lock_id, token, ttl_s, holder, _followed=True)
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
            lost="; ".join(v for _, v in sorted(lost.items())) or None,
        )
        validity = remaining_validity(ttl_s, boot_clock() - started)
        renewed = self.majorities.reached_by({k: r.outcome for k, r in results.items()})
        if not lost and renewed and validity > 0:
            result.acquired = True
            result.validity_s = validity
        if lost and result.lost:
            await self._remember(history.lost_events(lock_id, holder=who, token=token, why=result.lost))
        return result

    async def adopt_membership(
        self, lock_id: str, token: int, ttl_s: float, holder: str, *, seed: Iterable[str] = ()
    ) -> dict[str, ClusterResult[ClusterLease]]:
        """For a member change, under the lock ``lock_id``: write this engine's member set
        on every member's lease that still names ``lock_id``, and on the members in
        ``seed`` (new ones) take the lease for ``lock_id`` with ``token`` — unless it is
        held by someone else or has seen a higher token. OK where the lease now names
        ``lock_id`` and stores the set."""
        seeding = set(seed)

        async def one(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self._checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]

            def decide(view: LeaseView) -> Decision:
                stored = self.stored_membership(view)
                if isinstance(stored, Membership) and stored.epoch > self.membership.epoch and self.agrees(stored):
                    # a later step of this very change (being finished) is there: keep it
                    if view.lock_id == lock_id:
                        return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "member set written"))
                other = self.other_set(view)
                if other is not None:
                    # Another configuration at this epoch or later: a change made meanwhile
                    # (under this very lock id, from another machine) or an edit. Never
                    # written over, and never counted as storing ours.
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "other member set"),
                        detail=f"it stores member set epoch {other.epoch}, another configuration than this "
                        f"change's (epoch {self.membership.epoch})",
                    )
                if view.exists and view.lock_id == lock_id:
                    body = self._lease_body(
                        view, lock_id=lock_id, token=token, ttl_s=ttl_s, renew_only=True, with_set=True
                    )
                    return body, "member set written", ""
                if cluster not in seeding:
                    return ClusterResult(
                        cluster, Outcome.HELD_BY_OTHER, ClusterLease(view, "not ours"), detail="no longer ours"
                    )
                if foreign_set(self.stored_membership(view), self.membership):
                    # another deployment of this name and namespace lives there (or
                    # someone planted a set): seeding would take it over
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "another member set"),
                        detail="its lease stores another member set",
                    )
                if view.held and view.expired(self.max_ttl_s) is not True:
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(view, "held"),
                        detail=_held_detail(view, self.max_ttl_s),
                    )
                if view.token > token or view.token_malformed:
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "newer token"),
                        detail=f"the new member's lease has token {view.token}, above this lock's {token}",
                    )
                body = self._lease_body(view, lock_id=lock_id, token=token, ttl_s=ttl_s, holder=holder)
                return body, "seeded with the lock", ""

            return await self._cas(cluster, view, decide)

        results = await fan_out(self.members, one, timeout=self.timeout)
        self._raise_on_mismatch(results)
        taken = [k for k, r in results.items() if r.value is not None and r.value.action == "another member set"]
        if taken:
            raise MembershipError(
                f"The lease of deployment {self.dep.name!r} on {', '.join(sorted(taken))} stores another member "
                "set (another deployment of this name and namespace lives there, or the set was planted); it "
                "was left as it is. Remove that cluster from the change, or free it first."
            )
        return results

    async def break_lock(self, *, by: str, reason: str = "") -> dict[str, ClusterResult[ClusterLease]]:
        """Clear the lease whatever its holder (admin override), leaving an audit note."""
        await self.verify_members()
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
                if view.vanished and not view.held:
                    return ClusterResult(
                        cluster,
                        Outcome.OK,
                        ClusterLease(view, "deleted"),
                        detail="the lease had been deleted; a break cannot clear that, since its token history "
                        f"is gone: it frees itself {self.max_ttl_s:.0f}s after it was found missing",
                    )
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
        cleared = {
            k: r.value.previous
            for k, r in results.items()
            if r.ok and r.value and r.value.action == "broken" and r.value.previous
        }
        await self._remember(history.break_events(by=by, reason=reason, cleared=cleared))
        return results

    def _raise_on_member_conflict(self, results: Mapping[str, ClusterResult[ClusterLease]]) -> None:
        """Stop when a member stores another member set under the same or a newer epoch
        (this machine's record is stale or divergent). Missing confirmation alone does
        not stop commands that only read or clear."""
        stored = {
            k: self.stored_membership(r.value.view) for k, r in results.items() if r.ok and r.value and r.value.view
        }
        verdict = self.check_members(stored)
        if verdict.verdict is Verdict.CONFLICT:
            raise self.membership_error(verdict)

    async def stored_sets(self) -> dict[str, str]:
        """What each member's lease says about the member set, in words (for `deployment
        show`): the epoch and the members by local name where they are connected here."""
        names = {c.identity: c.name for c in self.clusters.config.clusters.values()}
        order = {c.name: i for i, c in enumerate(self.clusters.config.clusters.values())}

        def listed(identities: tuple[str, ...]) -> str:
            named = sorted((names.get(i, f"?{i[:8]}") for i in identities), key=lambda n: order.get(n, len(order)))
            return ", ".join(named)

        results = await self._read_everywhere()
        out: dict[str, str] = {}
        for member in self.members:
            r = results.get(member)
            if r is None or not r.ok or r.value is None or r.value.view is None:
                out[member] = f"not read ({r.outcome if r else 'no answer'})"
                continue
            stored = self.stored_membership(r.value.view)
            if stored is None:
                out[member] = "nothing (lease missing or deleted)"
            elif not isinstance(stored, Membership):
                out[member] = "nothing (a lease from before stored member sets)"
            else:
                joint = f"; changing to {listed(stored.joint)}" if stored.joint else ""
                same = " (as recorded here)" if stored == self.membership else ""
                who = "" if stored.written_by_us else f" (not written by coordinator: {stored.writer_text()})"
                out[member] = f"epoch {stored.epoch}: {listed(stored.members)}{joint}{same}{who}"
        return out

    async def _read_everywhere(self) -> dict[str, ClusterResult[ClusterLease]]:
        """Every member's lease, identity checked, read at once (no write)."""

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self._checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "read"))

        return await fan_out(self.members, on_cluster, timeout=self.timeout)

    async def verify_members(self) -> None:
        """Read every member's lease and stop on a conflicting stored member set."""

        results = await self._read_everywhere()
        self._raise_on_mismatch(results)
        self._raise_on_member_conflict(results)

    def _raise_on_mismatch(self, results: dict[str, ClusterResult[ClusterLease]]) -> None:
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            raise IdentityMismatchError(identity_report(bad), payload=results)

    # -- status

    async def status(self) -> LockStatus:
        results = await self._read_everywhere()
        self._raise_on_mismatch(results)
        self._raise_on_member_conflict(results)
        rows: list[ClusterStatus] = []
        live: dict[str, str | None] = {}
        remaining: dict[str, float] = {}
        claims: list[TurnClaim] = []
        for name in self.members:
            r = results.get(name)
            if r is None or not r.ok or r.value is None or r.value.view is None:
                status = str(r.outcome) if r else "unreachable"
                if status not in (Outcome.UNREACHABLE, Outcome.FORBIDDEN, Outcome.IDENTITY_MISMATCH):
                    status = "error"
                rows.append(ClusterStatus(name, status, error=r.detail if r else "no answer"))
                continue
            v = r.value.view
            if v.live_claim is not None and v.claim_fresh():
                claims.append(v.live_claim)
            expired = v.expired(self.max_ttl_s)
            note: str | None = None
            if not v.exists:
                st = "held"
                note = "the lease is missing (deleted?): it counts as held by an unknown holder"
            elif v.vanished and not v.held:
                st = "expired" if expired else "held"
                note = "the lease was deleted: it counts as held by an unknown holder for one maximum TTL"
            elif not v.held:
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
                    error="fencing-token annotation is malformed" if v.token_malformed else note,
                )
            )
        winner = self.majorities.holder(live)
        holder_row = next((row for row in rows if winner and row.lock_id == winner), None)
        expires = None
        if winner:
            mine = {c: remaining[c] for c, lid in live.items() if lid == winner and c in remaining}
            expires = self.majorities.expiry(mine)
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
    kube_errors.sort(key=lambda e: e.kind != kube.IDENTITY_MISMATCH)
    return kube_errors[0]


class _Wake:
    """What a waiting acquire shares with its lease watches."""

    def __init__(self, event: anyio.Event) -> None:
        self.event = event
        self.mine: TurnClaim | None = None  # our place in line, once known
        self.claimed: set[str] = set()  # clusters where a claim of ours may stand


def _with_annotation(obj: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    """The lease ``obj`` (resourceVersion kept: a compare-and-swap) with one annotation set."""
    body = {k: v for k, v in obj.items() if k != "status"}
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), key: value}
    body["metadata"] = meta
    return body


def _envelope_evidence(obj: dict[str, Any], *, secret: bool) -> tuple[int, Stored] | None:
    """From a state object: the fencing token its envelope was written with and the
    member set it stores (by identity); None when the envelope is unreadable."""
    raw = (obj.get("data") or {}).get("envelope.json")
    if not isinstance(raw, str):
        return None
    try:
        text = base64.b64decode(raw).decode() if secret else raw
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    token = doc.get("token") if isinstance(doc, dict) else None
    if not isinstance(token, int) or token < 0:
        return None
    token = max(token, token_floor(obj))
    stored: Stored = Membership.parse(doc.get("membership"))
    if stored is None and isinstance(doc.get("member_ids"), dict) and doc["member_ids"]:
        # envelopes from before stored epochs name the writer's members by identity
        stored = Membership.of(str(v) for v in doc["member_ids"].values())
    # The envelope keeps the set of its last write; the annotation, the set of the last
    # acquisition or member change. The newer of the two speaks for this object.
    noted = set_on_state(obj)
    if noted is not None and (not isinstance(stored, Membership) or noted.epoch > stored.epoch):
        stored = noted
    return token, stored


def set_on_state(obj: dict[str, Any]) -> Membership | None:
    """The member set a state object's annotation stores, when a coordinator field
    manager wrote it (anyone allowed to edit the object could have put any set there)."""
    stored = in_lease_object(obj)  # the same annotation, read the same way
    if not isinstance(stored, Membership) or not stored.written_by_us:
        return None
    return stored


def _set_on_state_is_behind(obj: dict[str, Any], ours: Membership) -> bool:
    noted = set_on_state(obj)
    return noted is None or noted.epoch < ours.epoch


A_TOKEN_FLOOR = "coordinator.io/token-floor"
ABSENT = "no state object"


def token_floor(obj: dict[str, Any]) -> int:
    """The token floor a state object carries (0 for none or garbage). Any length a
    lease's token may have is read: a floor read as 0 would let tokens go down."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(A_TOKEN_FLOOR)
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 4000:
        return int(raw)
    return 0


def genesis_state_object(deployment: str, storage: str, membership: dict[str, Any]) -> dict[str, Any]:
    """A state object holding the empty state of ``deployment`` and its member set."""
    from coordinator.register import DATA_KEY, NOTE, NOTE_ANNOTATION, genesis_text

    text = genesis_text(deployment, membership)
    secret = storage == "secret"
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret" if secret else "ConfigMap",
        "metadata": owned_metadata(state_name(deployment), deployment) | {"annotations": {NOTE_ANNOTATION: NOTE}},
        "data": {DATA_KEY: base64.b64encode(text.encode()).decode() if secret else text},
    }
    if secret:
        body["type"] = "Opaque"
    return body


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
    # Holder and lock id are text of whoever wrote the lease: escaped here, where they
    # enter a paragraph whose own line breaks are kept when it is printed.
    who = printable(claim.holder or "another contender")
    return (
        f"free, but the next turn is {who}'s (lock {printable(claim.lock_id)}), who has waited longer; "
        f"it lapses if not taken within {HANDOFF_GRACE_S:.0f}s of the release"
    )


def _held_detail(view: LeaseView, max_ttl_s: float = DEFAULT_MAX_TTL_S) -> str:
    if not view.exists or (view.vanished and not view.held):
        rem = view.remaining_hint(max_ttl_s) if view.exists else None
        tail = f"; free in about {max(rem, 0):.0f}s" if rem is not None else ""
        return (
            "the lease was deleted, so it counts as held by an unknown holder until a maximum TTL "
            f"({max_ttl_s:.0f}s) has passed since it was found missing{tail}"
        )
    # Holder and lock id are text of whoever wrote the lease: escaped where they enter
    # the paragraph (errors keep their own line breaks when printed).
    who = printable(str(view.info.get("holder") or "an unknown holder"))
    lock = printable(str(view.lock_id))
    if view.own_write is None:
        return (
            f"held by {who} (lock {lock}), expiry unknown: the lease carries no write of coordinator's "
            "own (managedFields cleared?), so it counts as held until seen unchanged for a whole TTL"
        )
    rem = view.remaining_hint(max_ttl_s)
    tail = f", expires in {rem:.0f}s unless renewed" if rem is not None else ""
    return f"held by {who} (lock {lock}){tail}"


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
            lines.append(f"{name}: {NOT_WAITED_FOR}")
            continue
        v = r.value.view if r.value else None
        if r.outcome is Outcome.HELD_BY_OTHER and r.value is not None and r.value.action == "reserved":
            lines.append(f"{name}: {r.detail}")
            claim = r.extra.get("next")
            who = claim.holder if isinstance(claim, TurnClaim) else ""
            reserved.setdefault(who or "another contender", []).append(name)
        elif r.outcome is Outcome.HELD_BY_OTHER and v is not None and (v.vanished or not v.exists or not v.held):
            lines.append(f"{name}: {r.detail}")
            holders.setdefault("an unknown holder (deleted lease)", []).append(name)
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
            if not r.outcome.observable and not r.extra.get(ANSWERED):
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
    # One line per cluster: a line break in what the clusters say (holder, reason, a
    # server's message) must not pass for a line of this report.
    return head + "Per cluster:\n" + "".join(f"  {printable(line)}\n" for line in lines) + printable(" ".join(advice))


@contextlib.asynccontextmanager
async def keep_renewed(
    engine: LockEngine,
    held: AcquireResult,
    *,
    on_lost: Callable[[str], None] | None = None,
    lead_s: float = 0.0,
) -> AsyncIterator[anyio.Event]:
    """Renew ``held`` in the background while the block runs; yield an event set if lost.

    Renews every TTL/3. When a majority can no longer be renewed before the validity
    ends, the lock is lost: the event is set and ``on_lost`` is called with the reason.
    ``lead_s`` declares the loss that long *before* the validity ends (capped at a third
    of the TTL), so that a holder with work to stop can stop it while the lock is still
    its own.
    """
    lost = anyio.Event()
    lead = max(0.0, min(lead_s, held.ttl_s / 3))
    # Three renewals fit in what is left once the lead is taken off, so that one refused
    # or throttled renewal (a 429 asking to come back in a second) is not the last chance.
    interval = max(0.5, (held.ttl_s - lead) / 3)
    retry_s = 0.5  # after a renewal that reached no majority

    async def loop() -> None:
        valid_until = held.valid_until() - lead
        reason = f"the lock on {engine.dep.name!r} could not be renewed on a majority before its validity ended"
        pause = interval
        while True:
            await anyio.sleep(min(pause, max(0.05, valid_until - boot_clock())))
            pause = interval
            if boot_clock() >= valid_until:
                break
            try:
                # A renewal still waiting for answers when the loss is due must not delay
                # it: the holder has work to stop while the lock is still its own.
                with anyio.move_on_after(max(0.05, valid_until - boot_clock())) as limit:
                    renewed = await engine.renew(held.lock_id, held.fencing_token or 0, held.ttl_s, held.holder)
                if limit.cancelled_caught:
                    break
            except Exception as err:  # identity mismatch or worse: the lock is not safe
                log.warning("lock renewal failed", error=str(err))
                if boot_clock() >= valid_until:
                    break
                pause = retry_s
                continue
            if renewed.lost:
                reason = f"the lock on {engine.dep.name!r} was lost: {renewed.lost}"
                break
            if renewed.acquired:
                held.started = renewed.started
                valid_until = renewed.valid_until() - lead
                log.info("lock renewed", deployment=engine.dep.name, valid_for=round(renewed.validity_s, 1))
            else:
                log.warning("lock renewal reached no majority", clusters=_summarize(renewed.results))
                pause = retry_s
        held.lost = reason
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
