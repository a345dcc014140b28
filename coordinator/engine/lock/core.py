"""What every part of the lock engine shares: the configuration it counts with (one
deployment's members and the member set they must store, and how a stored set is
judged), reading and writing one lease, the compare-and-swap of one lease, and handing
events to the lock's history."""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeGuard, assert_never

import anyio
from anyio.abc import TaskGroup

from coordinator import clock
from coordinator.config.records import DeploymentRecord
from coordinator.engine.clusters import ClusterSet, failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.bodies import fresh_lease, lease_body, with_annotation
from coordinator.engine.lock.reports import identity_report
from coordinator.engine.lock.results import AcquireResult, ClusterLease, Decision
from coordinator.errors import CoordinatorError, IdentityMismatchError, MembershipError, NoQuorumError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules import quorum
from coordinator.rules.evidence import with_records
from coordinator.rules.lease import (
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
from coordinator.rules.membership import (
    A_MEMBERSHIP,
    Check,
    Membership,
    Stored,
    Verdict,
    behind_stand_in,
    newer_set,
    stored_in_lease,
)
from coordinator.rules.membership import check as check_membership
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import FIELD_MANAGER, lease_name, lease_path, leases_path

if TYPE_CHECKING:
    from coordinator.engine.history import HistoryStore
    from coordinator.engine.lock.kubeevents import LeaseEvents, Touched

log = get_logger("coordinator.engine.lock")  # one logger for the whole engine


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
    leases and state objects store it (see coordinator/rules/membership.py). Raises for a
    member this process does not know."""
    joint = deployment.joint
    return Membership.of(
        (clusters.record(m).identity for m in deployment.clusters),
        deployment.epoch,
        [clusters.record(m).identity for m in joint] if joint else None,
    )


def local_names(clusters: ClusterSet, members: list[str]) -> dict[str, str]:
    """Local names by identity: of every cluster connected here, not only of the
    ``members`` of a record (a set the members store may name a cluster this record
    lacks, which a message then names as the user knows it)."""
    names = {c.identity: c.name for c in clusters.config.clusters.values()}
    return names | {clusters.record(m).identity: m for m in members}


def membership_error(result: Check, deployment: str, names: Mapping[str, str]) -> MembershipError | NoQuorumError:
    """The error for members that do not confirm this machine's member set: exit 4 when
    more answers could still confirm it, else exit 5. ``names``: local names by identity."""
    text = result.explain(deployment, names)
    if result.verdict is Verdict.UNOBSERVABLE:
        return NoQuorumError(text)
    return MembershipError(text)


def of_this_change(stored: Stored) -> TypeGuard[Membership]:
    """Whether a set a lease stores may be a step of the change being finished (when it
    equals one): written by coordinator, or its managedFields stripped (writer unknown; a
    set another client wrote names that client). Refusing a stripped step wedged the change
    for good: only the commit rewrites the annotation, and so owns it again."""
    return isinstance(stored, Membership) and (stored.written_by_us or stored.unowned)


def of_this_change_on(stored: Stored, view: LeaseView | None) -> TypeGuard[Membership]:
    """``of_this_change`` on ``view``: a stripped set counts only on a lease coordinator
    made (it names its own uid), not on one another client created and then stripped."""
    return of_this_change(stored) and (stored.written_by_us or (view is not None and view.names_itself))


# How long a history write in the background waits before it starts (see EngineCore.remember).
HISTORY_DEFER_S = 0.25


class DeferredHistory:
    """History events of one owner's engines (a Coordinator makes an engine per call)
    waiting to be written, and when the owner closes: see EngineCore.remember. Shared,
    so that what waited together is written together, whichever engine decided it."""

    def __init__(self) -> None:
        self.closing = anyio.Event()  # set when the owner starts closing
        self.events: list[tuple[HistoryStore, list[dict[str, Any]]]] = []
        # Kubernetes Events about the Lease (lock/kubeevents.py), written after the history.
        self.posts: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self.flushing = False


@dataclass(frozen=True)
class Configuration:
    """What a lock engine counts with, as a value: the members of ``deployment`` (this
    machine's record; two groups while a member change is under way, each deciding by
    its majority), its epoch and maximum TTL, and the member set every member must store.

    ``membership``: the set to write and count as agreeing where it is not the one the
    record names (a member change commits the new set on the old members, and releases
    on the union of both under the set in force). ``finishing``: the set before a member
    change, its joint configuration and its commit, while that change is being finished:
    a member storing any of them agrees (any may be where an interrupted run left it, and
    the lock is taken on majorities of the old and the new set, which meet every majority
    any of them decides with). ``follow``: this machine's record of the deployment as it
    is now (another command here may change the members while the engine holds the
    lock; see EngineCore.follow_record)."""

    deployment: DeploymentRecord
    membership: Membership | None = None
    finishing: tuple[Membership, Membership, Membership] | None = None
    follow: Callable[[], DeploymentRecord | None] | None = field(default=None, compare=False)


@dataclass
class Observations:
    """What a lock engine has seen of the leases themselves, whatever configuration it
    counts them under: leases without evidence of ours, and clusters whose Date header
    disagreed with their own stamps (always probed there)."""

    sightings: dict[str, Sighting] = field(default_factory=dict)
    date_untrusted: set[str] = field(default_factory=set)


class EngineCore:
    """What every part of a lock engine shares: the configuration it counts with (a
    :class:`Configuration`), what it has observed of the leases, and one lease's reads,
    writes and compare-and-swap. The parts (members, release, floor, turns, acquire,
    renew, status) each hold it; see lock/engine.py."""

    lease_events: LeaseEvents | None = None

    def __init__(
        self,
        clusters: ClusterSet,
        config: Configuration,
        *,
        background: TaskGroup | None = None,
        max_server_skew_s: float = DEFAULT_MAX_SERVER_SKEW_S,
        deferred: DeferredHistory | None = None,
        lease_events: LeaseEvents | None = None,
        observations: Observations | None = None,
    ) -> None:
        self.clusters = clusters
        # Writes the history's moments as Kubernetes Events about the Lease too (see
        # remember); None: none are written (the simulator's engines).
        self.lease_events = lease_events
        self.background = background
        # History writes of the owner of ``background``, waiting: see remember.
        self.deferred = deferred
        self.max_server_skew_s = max_server_skew_s
        self.observations = observations if observations is not None else Observations()
        self._bind(config)

    @property
    def dep(self) -> DeploymentRecord:
        return self.config.deployment

    @property
    def finishing(self) -> tuple[Membership, Membership, Membership] | None:
        return self.config.finishing

    @property
    def follow(self) -> Callable[[], DeploymentRecord | None] | None:
        return self.config.follow

    def _bind(self, config: Configuration) -> None:
        """Count with ``config``."""
        self.config = config
        deployment = config.deployment
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
        # must store (see coordinator/rules/membership.py).
        self.membership = config.membership or recorded_membership(self.clusters, deployment)

    @property
    def timeout(self) -> float:
        return self.clusters.timeout

    @property
    def history(self) -> HistoryStore:
        """The lock's history (coordinator/engine/history.py), of the members bound now; made on
        first use (a command that only reads the lock never imports it)."""
        if self._history is None:
            from coordinator.engine.history import HistoryStore

            self._history = HistoryStore(self.clusters, self.dep.name, self.dep.namespace, self.members)
        return self._history

    async def read(self, cluster: str) -> LeaseView:
        client = self.clusters.client(cluster)
        try:
            resp = await client.request("GET", self.path)
        except KubeError as err:
            if err.kind == kube.NOT_FOUND:
                # A 404 is an answer: the lease does not exist (yet) on this cluster.
                return LeaseView(exists=False)
            raise
        return LeaseView.parse(resp.body, resp.server_time)

    async def checked_read(self, cluster: str, *more: Callable[[], Coroutine[Any, Any, None]]) -> LeaseView:
        """Identity check and lease read (and ``more`` reads) in flight together; nothing
        is written to a cluster before its identity is proven."""
        view: LeaseView | None = None

        async def read() -> None:
            nonlocal view
            view = await self.read(cluster)

        await checked(self.clusters, cluster, read, *more)
        assert view is not None
        return view

    def stand(self, cluster: str, view: LeaseView, lock_id: str, stamp: datetime | None = None) -> Standing:
        """Where ``view`` stands for ``lock_id``, with this engine's local observation
        of leases that carry no evidence of ours and its trust in the cluster's Date."""
        now = boot_clock()
        if view.exists and view.blocking:
            self.observations.sightings[cluster] = observe(self.observations.sightings.get(cluster), view, now)
        observed = lapsed_by_observation(
            self.observations.sightings.get(cluster),
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
            date_trusted=cluster not in self.observations.date_untrusted,
        )

    async def probed(self, cluster: str, view: LeaseView, lock_id: str) -> tuple[LeaseView, datetime | None]:
        """``view`` with a probe's server stamp where it is another lock id's lease that the
        Date hint says may have lapsed (Standing.PROBE): only a stamp can say it has. The
        view as it is, and no stamp, otherwise."""
        if view.held and self.stand(cluster, view, lock_id) is Standing.PROBE:
            return await self.probe(cluster, view)
        return view, None

    async def probe(self, cluster: str, view: LeaseView) -> tuple[LeaseView, datetime | None]:
        """Get a fresh server time stamp on the lease (a compare-and-swap write of a
        nonce under the probe manager): the second stamp of the expiry rule. Also checks
        the response's Date against it, to know whether this cluster's Date can serve as
        a hint."""
        body = with_annotation(view.obj, A_PROBE, clock.token_hex(6))
        new = await self.write(cluster, view, body, manager=PROBE_MANAGER)
        stamp = manager_time(new.obj, PROBE_MANAGER)
        if stamp is not None and new.server_now is not None:
            offset = abs((new.server_now - stamp).total_seconds())
            if offset > self.max_server_skew_s + TIMESTAMP_SLACK_S:
                if cluster not in self.observations.date_untrusted:
                    log.warning("the Date header disagrees with the server's stamps", cluster=cluster, offset=offset)
                self.observations.date_untrusted.add(cluster)
            else:
                self.observations.date_untrusted.discard(cluster)
        return new, stamp

    def _annotations_common(self, *, with_set: bool = True) -> dict[str, str]:
        ann = {A_NAMESPACE: self.dep.namespace, A_MAX_TTL: str(math.ceil(self.max_ttl_s))}
        if with_set:
            ann |= {A_MEMBERS: ",".join(self.members), A_MEMBERSHIP: self.membership.dump()}
        return ann

    def token_proven(self, reads: Mapping[str, LeaseView], state_majority: bool) -> bool:
        """Do these reads prove a new token (see lease.next_token)? "A majority" means one
        of every group of the configuration."""
        if self.majorities.reached(c for c, v in reads.items() if history_known(v)):
            return True
        return state_majority and all(m in reads for m in self.members)

    def new_token(self, reads: Mapping[str, LeaseView], state_tokens: list[int], state_majority: bool) -> int | None:
        """The new fencing token from these reads (see lease.next_token)."""
        return next_token(list(reads.values()), state_tokens, proven=self.token_proven(reads, state_majority))

    def fresh_lease(self, *, vanished: bool, floor: int = 0) -> dict[str, Any]:
        """A holderless lease: free, or a tombstone for one found missing (see bodies.fresh_lease)."""
        return fresh_lease(self.name, self.dep.name, self._annotations_common(), vanished=vanished, floor=floor)

    async def record_missing(self, cluster: str, floor: int) -> LeaseView | None:
        """Record a tombstone where the lease was found missing; None if one appeared
        meanwhile (the caller reads again)."""
        client = self.clusters.client(cluster)
        try:
            resp = await client.request(
                "POST",
                leases_path(self.dep.namespace),
                body=self.fresh_lease(vanished=True, floor=floor),
                query={"fieldManager": FIELD_MANAGER},
            )
        except KubeError as err:
            if err.kind == kube.ALREADY_EXISTS:
                return None
            raise
        log.warning("lease found missing; recorded it as held by an unknown holder", cluster=cluster)
        return LeaseView.parse(resp.body, resp.server_time)

    def lease_body(
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

    async def write(
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
                return await self.name_created(cluster, made, manager=manager)
            except KubeError as err:
                log.info("could not name a lease just created", cluster=cluster, error=str(err))
                return made
        return LeaseView.parse(resp.body, resp.server_time)

    async def name_created(self, cluster: str, made: LeaseView, *, manager: str = FIELD_MANAGER) -> LeaseView:
        """Write a lease's own uid on it right after creating it (the uid is known only
        then), as every later write does: a lease coordinator made is then told from one
        another client made (or a restored copy), even after its managedFields are
        stripped; unnamed, it would also block like a recreated copy for a maximum TTL."""
        return await self.write(cluster, made, with_annotation(made.obj, A_UID, made.uid or ""), manager=manager)

    async def cas(
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
        from coordinator.engine import cas  # the write side: a command that only reads never needs it

        def step(view: LeaseView) -> cas.Put[tuple[dict[str, Any], str, str]] | cas.Keep[ClusterResult[ClusterLease]]:
            decision = decide(view)
            return cas.Keep(decision) if isinstance(decision, ClusterResult) else cas.Put(decision)

        async def write(view: LeaseView, decision: tuple[dict[str, Any], str, str]) -> ClusterResult[ClusterLease]:
            body, action, detail = decision
            new_view = await self.write(cluster, view, body, manager=manager)
            return ClusterResult(
                cluster, Outcome.OK, ClusterLease(new_view, action, previous=view), detail=detail or action
            )

        result = await cas.compare_and_swap(
            lambda: self.read(cluster),
            step,
            write,
            current=view,
            reread_last=True,
            # Waiters list and refresh their claims in the lease (coordinator/rules/turnline.py)
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

    def result(
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

    async def remember(self, events: list[dict[str, Any]], touched: Mapping[str, Touched] | None = None) -> None:
        """Hand ``events`` to the history (coordinator/engine/history.py): in the background when
        this engine has a task group, so the caller does not wait for it; best effort.
        The store is the one of the members bound now (a record followed later does not
        move events decided under this one). With ``lease_events``, the same events go
        as Kubernetes Events about the Lease to the members in ``touched`` (the leases the
        decision found and left there), after the history and just as best effort."""
        if not events:
            return
        if self.lease_events is not None and touched:
            self._post_lease_events(events, touched)
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
            while deferred.events or deferred.posts:
                batch, deferred.events = deferred.events, []
                by_store: dict[int, tuple[HistoryStore, list[dict[str, Any]]]] = {}
                for store, events in batch:
                    by_store.setdefault(id(store), (store, []))[1].extend(events)
                for store, events in by_store.values():
                    await store.record(events, timeout=self.timeout)
                posts, deferred.posts = deferred.posts, []
                for post in posts:
                    await post()
        finally:
            deferred.flushing = False

    def _post_lease_events(self, events: list[dict[str, Any]], touched: Mapping[str, Touched]) -> None:
        """Queue the Events of ``events`` for the deferred flush (see remember), or start
        them in the background; dropped when there is neither (never written inline: they
        must not hold up the command)."""
        writer = self.lease_events
        assert writer is not None
        clusters, namespace, lease, timeout = self.clusters, self.dep.namespace, self.name, self.timeout
        events, touched = [dict(e) for e in events], dict(touched)

        async def post() -> None:
            await writer.post(clusters, events, touched, namespace=namespace, lease=lease, timeout=timeout)

        if self.background is None:
            return
        if self.deferred is not None:
            # remember goes on to queue the history and start the flush, which writes these.
            self.deferred.posts.append(post)
            return
        try:
            self.background.start_soon(post)
        except RuntimeError:  # the task group has already closed
            pass

    def raise_on_mismatch(self, results: dict[str, ClusterResult[ClusterLease]]) -> None:
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            raise IdentityMismatchError(identity_report(bad), payload=results)

    async def read_everywhere(self) -> dict[str, ClusterResult[ClusterLease]]:
        """Every member's lease, identity checked, read at once (no write)."""

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self.checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "read"))

        return await fan_out(self.members, on_cluster, timeout=self.timeout, silent=self.clusters.silent)

    def follow_record(self, stored: Iterable[Membership]) -> bool:
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
            named = recorded_membership(self.clusters, fresh)
        except CoordinatorError:  # names a cluster this process does not know
            return False
        if not any(s == named and s.written_by_us for s in stored):
            return False
        log.info("following the member change made here", deployment=fresh.name, epoch=fresh.epoch)
        self._bind(replace(self.config, deployment=fresh))
        return True

    def agrees(self, stored: Membership) -> bool:
        """Whether a set a member stores is the one this engine counts with (finishing a
        change: any of its steps)."""
        if self.finishing is not None:
            return stored in self.finishing
        return stored == self.membership

    def other_set(self, view: LeaseView | None) -> Membership | None:
        """The member set ``view`` stores when it is another configuration than this
        engine's, at the same or a newer epoch, whoever wrote it: this engine's record is
        behind (a change made since) or divergent, or the set was edited. A lease storing
        it is neither taken nor renewed by this engine, nor its set written over."""
        return self.newer_set(self.stored_membership(view) if view is not None else None)

    def newer_set(self, stored: Stored) -> Membership | None:
        """``stored`` when it is another configuration than this engine's, at the same or
        a newer epoch (see other_set)."""
        return newer_set(stored, self.membership, self.agrees)

    def hear_state_objects(
        self, stored: Mapping[str, Stored], states: Mapping[str, ClusterResult[tuple[int, Stored]]]
    ) -> dict[str, Stored]:
        """What each member stores (``stored``, from the leases) once its state object is
        heard too (``states``, as TokenFloor.state_one reads them): a state object that
        keeps a newer set than this engine's speaks against its member whatever the
        lease says (a lease can miss the steps of a change that the state object saw),
        and a member whose state object could not be read (unreachable, or an envelope
        garbled) may be such a one, so it is not heard at all."""
        heard: dict[str, Stored] = {}
        for c, found in stored.items():
            on_state = states.get(c)
            if on_state is None or not on_state.ok:
                continue
            newer = self.newer_set(on_state.value[1]) if on_state.value is not None else None
            heard[c] = newer if newer is not None else found
        return heard

    def stored_membership(self, view: LeaseView) -> Stored:
        """What one member's lease says about the member set: nothing when it is missing
        or a tombstone (a tombstone is written by whoever found the lease missing, so it
        proves nothing), UNSTATED for a lease without the member-set annotation."""
        stored = stored_in_lease(view)
        if (
            self.finishing is not None
            and isinstance(stored, Membership)
            and not stored.written_by_us
            and of_this_change_on(stored, view)
            and self.agrees(stored)
        ):
            # Stripped, on a lease coordinator made (it names its own uid): a step of the
            # change being finished whose record of its writer is gone. Counted as
            # coordinator's from here on. Stripped on a lease that does not name its own
            # uid (another client made it, or copied one), it stays a set nobody known
            # wrote, which never agrees.
            return replace(stored, writers=None)
        return stored

    def _agreeing(self, stored: Stored) -> Stored:
        """Finishing a change: a step of it that coordinator wrote, as this engine's set."""
        if isinstance(stored, Membership) and stored.written_by_us and self.agrees(stored):
            return self.membership
        return stored

    def check_members(self, stored: Mapping[str, Stored]) -> Check:
        if self.finishing is None:
            return check_membership(self.membership, stored, self.members, self.majorities.groups)
        result = check_membership(
            self.membership, {k: self._agreeing(v) for k, v in stored.items()}, self.members, self.majorities.groups
        )
        old, new = self.majorities.groups[0], self.majorities.groups[-1]
        return behind_stand_in(result, stored, old, new, self.finishing[0])

    def evidence_of(self, found: dict[str, tuple[int, Stored]]) -> dict[str, tuple[int, Stored]]:
        """The state objects' evidence (token, stored set) as this engine counts it.
        Finishing a change, with the leases deleted, the state objects speak for the
        members: one that still carries the set from before the change agrees, as such
        a lease would (an engine otherwise takes no set older than its own from a state
        object)."""
        if self.finishing is None:
            return found
        return {k: (token, self._agreeing(kept)) for k, (token, kept) in found.items()}

    def membership_error(self, result: Check) -> MembershipError | NoQuorumError:
        return membership_error(result, self.dep.name, self.identity_names())

    def identity_names(self) -> dict[str, str]:
        return local_names(self.clusters, self.members)

    def raise_on_member_conflict(self, results: Mapping[str, ClusterResult[ClusterLease]]) -> None:
        """Stop when a member stores another member set under the same or a newer epoch
        (this machine's record is stale or divergent). Missing confirmation alone does
        not stop commands that only read or clear."""
        stored = {
            k: self.stored_membership(r.value.view) for k, r in results.items() if r.ok and r.value and r.value.view
        }
        verdict = self.check_members(stored)
        if verdict.verdict is Verdict.CONFLICT:
            raise self.membership_error(verdict)

    async def verify_members(self) -> None:
        """Read every member's lease and stop on a conflicting stored member set."""

        results = await self.read_everywhere()
        self.raise_on_mismatch(results)
        self.raise_on_member_conflict(results)
