"""The engine's base: one deployment's members, reading and writing one lease, the
compare-and-swap of one lease, and handing events to the lock's history."""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, assert_never

import anyio
from anyio.abc import TaskGroup

from coordinator import clock, quorum
from coordinator.clusters import ClusterSet, failed
from coordinator.errors import IdentityMismatchError
from coordinator.evidence import with_records
from coordinator.fanout import ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.kube.resources import FIELD_MANAGER, lease_name, lease_path, leases_path
from coordinator.lease import (
    A_MAX_TTL,
    A_MEMBERS,
    A_NAMESPACE,
    A_NEXT,
    A_PROBE,
    A_UID,
    DEFAULT_MAX_SERVER_SKEW_S,
    LINE_MANAGER,
    PROBE_MANAGER,
    TIMESTAMP_SLACK_S,
    LeaseView,
    Sighting,
    Standing,
    boot_clock,
    history_known,
    lapsed_by_observation,
    manager_time,
    next_token,
    observe,
    standing,
)
from coordinator.lock.bodies import fresh_lease, lease_body, with_annotation
from coordinator.lock.reports import identity_report
from coordinator.lock.results import AcquireResult, ClusterLease, Decision
from coordinator.logs import get_logger
from coordinator.membership import A_MEMBERSHIP, Check, Membership
from coordinator.outcome import Outcome
from coordinator.records import DeploymentRecord

if TYPE_CHECKING:
    from coordinator.history import HistoryStore

log = get_logger("coordinator.lock")  # one logger for the whole engine


def only_the_line_moved(before: LeaseView, after: LeaseView) -> bool:
    """Did the lease change between two reads only in the waiters' line (and in what
    every write moves: its resourceVersion and the field managers' stamps)?"""

    def rest(view: LeaseView) -> Any:
        meta = dict(view.obj.get("metadata") or {})
        ann = {k: v for k, v in (meta.pop("annotations", None) or {}).items() if k != A_NEXT}
        meta.pop("resourceVersion", None)
        meta.pop("managedFields", None)
        return {**view.obj, "metadata": meta}, ann

    return before.exists and after.exists and rest(before) == rest(after)


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


async def checked(clusters: ClusterSet, cluster: str, *reads: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``reads`` on ``cluster`` in flight together with its identity check (one round
    trip); raise the error first_kube_error picks. The caller writes nothing to the
    cluster before this returns."""
    try:
        async with anyio.create_task_group() as tg:
            for read in reads:
                tg.start_soon(read)
            await clusters.check_identity(cluster)
    except BaseExceptionGroup as group:
        raise first_kube_error(group) from None


def recorded_membership(clusters: ClusterSet, deployment: DeploymentRecord) -> Membership:
    """The member set ``deployment`` (a machine's record) names, by identity, as the
    leases and state objects store it (see coordinator/membership.py). Raises for a
    member this process does not know."""
    joint = deployment.joint
    return Membership.of(
        (clusters.record(m).identity for m in deployment.clusters),
        deployment.epoch,
        [clusters.record(m).identity for m in joint] if joint else None,
    )


# How long a history write in the background waits before it starts (see _remember).
HISTORY_DEFER_S = 0.25


class DeferredHistory:
    """History events of one owner's engines (a Coordinator makes an engine per call)
    waiting to be written, and when the owner closes: see EngineCore._remember. Shared,
    so that what waited together is written together, whichever engine decided it."""

    def __init__(self) -> None:
        self.closing = anyio.Event()  # set when the owner starts closing
        self.events: list[tuple[HistoryStore, list[dict[str, Any]]]] = []
        self.flushing = False


class EngineCore:
    """The lock of one deployment over its member clusters: its members, and one lease's I/O."""

    def __init__(
        self,
        clusters: ClusterSet,
        deployment: DeploymentRecord,
        *,
        background: TaskGroup | None = None,
        max_server_skew_s: float = DEFAULT_MAX_SERVER_SKEW_S,
        follow: Callable[[], DeploymentRecord | None] | None = None,
        deferred: DeferredHistory | None = None,
        membership: Membership | None = None,
    ) -> None:
        self.clusters = clusters
        # The member set this engine writes and counts as agreeing, where it is not the one
        # the record names (a member change commits the new set on the old members, and
        # releases on the union of both under the set in force).
        self._membership = membership
        self.background = background
        # History writes of the owner of ``background``, waiting: see _remember.
        self.deferred = deferred
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
        joint = list(deployment.joint or [])
        # One group normally; the old and the new set while a member change is under way.
        self.majorities = quorum.Majorities([list(deployment.clusters), *([joint] if joint else [])])
        self.members = self.majorities.members
        self.n = len(self.members)
        self.q = self.majorities.quorum  # for display: q of the current set
        self.max_ttl_s = float(deployment.max_ttl_s)
        self._history: HistoryStore | None = None  # of these members, made on first use
        # The member set this machine's record names, by identity: what every member
        # must store (see coordinator/membership.py).
        self.membership = self._membership or recorded_membership(self.clusters, deployment)

    @property
    def timeout(self) -> float:
        return self.clusters.timeout

    @property
    def history(self) -> HistoryStore:
        """The lock's history (coordinator/history.py), of the members bound now; made on
        first use (a command that only reads the lock never imports it)."""
        if self._history is None:
            from coordinator.history import HistoryStore

            self._history = HistoryStore(self.clusters, self.dep.name, self.dep.namespace, self.members)
        return self._history

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

    async def _checked_read(self, cluster: str, *more: Callable[[], Coroutine[Any, Any, None]]) -> LeaseView:
        """Identity check and lease read (and ``more`` reads) in flight together; nothing
        is written to a cluster before its identity is proven."""
        view: LeaseView | None = None

        async def read() -> None:
            nonlocal view
            view = await self._read(cluster)

        await checked(self.clusters, cluster, read, *more)
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

    async def _probed(self, cluster: str, view: LeaseView, lock_id: str) -> tuple[LeaseView, datetime | None]:
        """``view`` with a probe's server stamp where it is another lock id's lease that the
        Date hint says may have lapsed (Standing.PROBE): only a stamp can say it has. The
        view as it is, and no stamp, otherwise."""
        if view.held and self._stand(cluster, view, lock_id) is Standing.PROBE:
            return await self._probe(cluster, view)
        return view, None

    async def _probe(self, cluster: str, view: LeaseView) -> tuple[LeaseView, datetime | None]:
        """Get a fresh server time stamp on the lease (a compare-and-swap write of a
        nonce under the probe manager): the second stamp of the expiry rule. Also checks
        the response's Date against it, to know whether this cluster's Date can serve as
        a hint."""
        body = with_annotation(view.obj, A_PROBE, clock.token_hex(6))
        new = await self._write(cluster, view, body, manager=PROBE_MANAGER)
        stamp = manager_time(new.obj, PROBE_MANAGER)
        if stamp is not None and new.server_now is not None:
            offset = abs((new.server_now - stamp).total_seconds())
            if offset > self.max_server_skew_s + TIMESTAMP_SLACK_S:
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

    def _token_proven(self, reads: Mapping[str, LeaseView], state_majority: bool) -> bool:
        """Do these reads prove a new token (see lease.next_token)? "A majority" means one
        of every group of the configuration."""
        if self.majorities.reached(c for c, v in reads.items() if history_known(v)):
            return True
        return state_majority and all(m in reads for m in self.members)

    def _token(self, reads: Mapping[str, LeaseView], state_tokens: list[int], state_majority: bool) -> int | None:
        """The new fencing token from these reads (see lease.next_token)."""
        return next_token(list(reads.values()), state_tokens, proven=self._token_proven(reads, state_majority))

    def _fresh_lease(self, *, vanished: bool, floor: int = 0) -> dict[str, Any]:
        """A holderless lease: free, or a tombstone for one found missing (see bodies.fresh_lease)."""
        return fresh_lease(self.name, self.dep.name, self._annotations_common(), vanished=vanished, floor=floor)

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
        """The body of a take, renewal or release of ``view`` (see bodies.lease_body);
        ``with_set``: whether it writes this engine's member set (by default a take does)."""
        if with_set is None:
            with_set = lock_id is not None and not renew_only  # a take
        return lease_body(
            view,
            name=self.name,
            deployment=self.dep.name,
            common=self._annotations_common(with_set=with_set),
            lock_id=lock_id,
            token=token,
            ttl_s=ttl_s,
            holder=holder,
            reason=reason,
            command=command,
            renew_only=renew_only,
            keep_claim=keep_claim,
        )

    async def _write(
        self, cluster: str, view: LeaseView, body: dict[str, Any], *, manager: str = FIELD_MANAGER
    ) -> LeaseView:
        client = self.clusters.client(cluster)
        query = {"fieldManager": manager}
        if view.exists:
            body = with_records(body, view.obj, clock.token_hex(6))
            resp = await client.request("PUT", self.path, body=body, query=query)
        else:
            resp = await client.request("POST", leases_path(self.dep.namespace), body=body, query=query)
            made = LeaseView.parse(resp.body, resp.server_time)
            if not made.uid:
                return made
            # If naming it fails the lease is still ours, only unnamed until the next write.
            try:
                return await self._name_created(cluster, made, manager=manager)
            except KubeError as err:
                log.info("could not name a lease just created", cluster=cluster, error=str(err))
                return made
        return LeaseView.parse(resp.body, resp.server_time)

    async def _name_created(self, cluster: str, made: LeaseView, *, manager: str = FIELD_MANAGER) -> LeaseView:
        """Write a lease's own uid on it right after creating it (the uid is known only
        then), as every later write does: a lease coordinator made is then told from one
        another client made (or a restored copy), even after its managedFields are
        stripped; unnamed, it would also block like a recreated copy for a maximum TTL."""
        return await self._write(cluster, made, with_annotation(made.obj, A_UID, made.uid or ""), manager=manager)

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
        from coordinator import cas  # the write side: a command that only reads never needs it

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
            lambda: self._read(cluster),
            step,
            write,
            current=view,
            reread_last=True,
            # Waiters list and refresh their claims in the lease (coordinator/turnline.py)
            # while a holder renews or releases it: a race lost to a claim alone costs the
            # holder no attempt (up to twice its attempts), or waiters could take every one
            # of them.
            harmless=None if manager == LINE_MANAGER else only_the_line_moved,
            harmless_extra=2 * cas.ATTEMPTS,
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

    def _result(
        self,
        lock_id: str,
        holder: str,
        token: int | None,
        ttl_s: float,
        started: float,
        results: dict[str, ClusterResult[ClusterLease]],
        *,
        membership: Check | None = None,
        lost: str | None = None,
    ) -> AcquireResult:
        """An attempt's or a renewal's result over this engine's members, not (yet) counted
        as held: the caller sets ``acquired`` and ``validity_s`` once it is."""
        return AcquireResult(
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
            lost=lost,
            membership=membership,
        )

    async def _remember(self, events: list[dict[str, Any]]) -> None:
        """Hand ``events`` to the history (coordinator/history.py): in the background when
        this engine has a task group, so the caller does not wait for it; best effort.
        The store is the one of the members bound now (a record followed later does not
        move events decided under this one)."""
        if not events:
            return
        store, timeout = self.history, self.timeout
        if self.background is not None and self.deferred is not None:
            # Bookkeeping goes after the lock's own requests: a history write right after
            # a release lands in the middle of the next holder's take (on the same API
            # servers and disks, and in this process when it also waits for the lock),
            # which made a handoff about a third slower (scripts/bench.py, B3'). Events
            # wait a little, or until the owner closes (a command ends without waiting for
            # them), and what waited together is written together: one read-merge-write
            # per member, not several racing for the same copy.
            deferred = self.deferred
            deferred.events.append((store, events))
            if deferred.flushing:
                return
            try:
                self.background.start_soon(self._flush_deferred, deferred)
                deferred.flushing = True
                return
            except RuntimeError:  # the task group has already closed: record here
                deferred.events.pop()
        elif self.background is not None:
            try:
                self.background.start_soon(lambda: store.record(events, timeout=timeout))
                return
            except RuntimeError:
                pass
        await store.record(events, timeout=timeout)

    async def _flush_deferred(self, deferred: DeferredHistory) -> None:
        try:
            with anyio.move_on_after(HISTORY_DEFER_S):
                await deferred.closing.wait()
            while deferred.events:
                batch, deferred.events = deferred.events, []
                by_store: dict[int, tuple[HistoryStore, list[dict[str, Any]]]] = {}
                for store, events in batch:
                    by_store.setdefault(id(store), (store, []))[1].extend(events)
                for store, events in by_store.values():
                    await store.record(events, timeout=self.timeout)
        finally:
            deferred.flushing = False

    def _raise_on_mismatch(self, results: dict[str, ClusterResult[ClusterLease]]) -> None:
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            raise IdentityMismatchError(identity_report(bad), payload=results)

    async def _read_everywhere(self) -> dict[str, ClusterResult[ClusterLease]]:
        """Every member's lease, identity checked, read at once (no write)."""

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self._checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "read"))

        return await fan_out(self.members, on_cluster, timeout=self.timeout)
