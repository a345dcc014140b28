"""The member set: what each lease stores, following a member change made on this machine,
creating the leases of a new deployment, and writing the set during a member change."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from coordinator.clusters import failed
from coordinator.errors import CoordinatorError, MembershipError, NoQuorumError
from coordinator.fanout import ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.kube.resources import FIELD_MANAGER, leases_path
from coordinator.lease import LeaseView, Standing
from coordinator.lock.core import EngineCore, recorded_membership
from coordinator.lock.reports import held_detail
from coordinator.lock.results import ClusterLease, Decision
from coordinator.logs import get_logger
from coordinator.membership import Check, Membership, Stored, Verdict, explain_existing, foreign_set, stored_in_lease
from coordinator.membership import check as check_membership
from coordinator.outcome import Outcome

log = get_logger("coordinator.lock")  # one logger for the whole engine


def membership_error(result: Check, deployment: str, names: Mapping[str, str]) -> MembershipError | NoQuorumError:
    """The error for members that do not confirm this machine's member set: exit 4 when
    more answers could still confirm it, else exit 5. ``names``: local names by identity."""
    text = result.explain(deployment, names)
    if result.verdict is Verdict.UNOBSERVABLE:
        return NoQuorumError(text)
    return MembershipError(text)


class Members(EngineCore):
    """The member-set side of the engine."""

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
            named = recorded_membership(self.clusters, fresh)
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

    def stored_membership(self, view: LeaseView) -> Stored:
        """What one member's lease says about the member set: nothing when it is missing
        or a tombstone (a tombstone is written by whoever found the lease missing, so it
        proves nothing), LEGACY for a lease from before stored member sets."""
        return stored_in_lease(view)

    def check_members(self, stored: Mapping[str, Stored]) -> Check:
        return check_membership(self.membership, stored, self.members, self.majorities.groups)

    def membership_error(self, result: Check) -> MembershipError | NoQuorumError:
        return membership_error(result, self.dep.name, self._identity_names())

    def _identity_names(self) -> dict[str, str]:
        return {self.clusters.record(m).identity: m for m in self.members}

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
                if made.uid:
                    made = await self._name_created(cluster, made)
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

    async def verify_members(self) -> None:
        """Read every member's lease and stop on a conflicting stored member set."""

        results = await self._read_everywhere()
        self._raise_on_mismatch(results)
        self._raise_on_member_conflict(results)

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

    async def adopt_membership(
        self, lock_id: str, token: int, ttl_s: float, holder: str, *, seed: Iterable[str] = ()
    ) -> dict[str, ClusterResult[ClusterLease]]:
        """For a member change, under the lock ``lock_id``: write this engine's member set
        on every member's lease that still names ``lock_id``; where the lease names another
        lock id (a new member in ``seed``, or a member this lock's take did not reach) take
        it for ``lock_id`` with ``token`` — unless it is held by someone else, has seen a
        higher token or stores another deployment's set. OK where the lease now names
        ``lock_id`` and stores the set."""
        seeding = set(seed)

        async def one(cluster: str) -> ClusterResult[ClusterLease]:
            stamp: datetime | None = None
            try:
                view, stamp = await self._probed(cluster, await self._checked_read(cluster), lock_id)
            except KubeError as err:
                if err.kind != kube.CONFLICT:
                    return failed(cluster, err)  # type: ignore[return-value]
                try:
                    view = await self._read(cluster)  # written meanwhile: decide on that
                except KubeError as err2:
                    return failed(cluster, err2)  # type: ignore[return-value]

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
                # Not ours: a new member (seeded here), or a member whose lease this lock
                # did not get (the take reached a majority without it, or it lapsed since).
                # Either is taken as an acquisition would take it: only when free or lapsed,
                # and only when it has seen no higher token.
                # A current member is this deployment's by the record itself (other_set
                # above refuses a set made meanwhile); only a seeded cluster can be some
                # other deployment's, whatever wrote its set.
                if cluster in seeding and foreign_set(self.stored_membership(view), self.membership):
                    # another deployment of this name and namespace lives there (or
                    # someone planted a set): seeding would take it over
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "another member set"),
                        detail="its lease stores another member set",
                    )
                if view.held and self._stand(cluster, view, lock_id, stamp) is not Standing.LAPSED:
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(view, "held"),
                        detail=held_detail(view, self.max_ttl_s),
                    )
                if view.token > token or view.token_malformed:
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "newer token"),
                        detail=f"the new member's lease has token {view.token}, above this lock's {token}",
                    )
                body = self._lease_body(view, lock_id=lock_id, token=token, ttl_s=ttl_s, holder=holder)
                return body, "seeded with the lock" if cluster in seeding else "taken with the lock", ""

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
