"""The member set's operations: creating the leases of a new deployment, saying what each
lease stores, and writing the set during a member change. (Judging a stored set, and
following a change made on this machine, is the core's: every part needs it.)"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from coordinator.engine.clusters import failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.core import EngineCore
from coordinator.engine.lock.floor import TokenFloor
from coordinator.engine.lock.reports import held_detail
from coordinator.engine.lock.results import ClusterLease, Decision
from coordinator.errors import MembershipError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules.lease import LeaseView, Standing
from coordinator.rules.membership import Membership, Verdict, explain_existing, foreign_set
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import FIELD_MANAGER, leases_path

log = get_logger("coordinator.engine.lock")  # one logger for the whole engine


class Members:
    """The member-set side of the engine."""

    def __init__(self, core: EngineCore, floor: TokenFloor) -> None:
        self.core = core
        self.floor = floor  # a lease stores a set only after its state object does

    async def create_leases(self) -> dict[str, ClusterResult[ClusterLease]]:
        """Create the free leases of a new deployment, so that a lease missing later is
        known to have been deleted (an existing one is left as it is)."""

        async def one(cluster: str) -> ClusterResult[ClusterLease]:
            client = self.core.clusters.client(cluster)
            try:
                await self.core.clusters.check_identity(cluster)
                resp = await client.request(
                    "POST",
                    leases_path(self.core.dep.namespace),
                    body=self.core.fresh_lease(vanished=False),
                    query={"fieldManager": FIELD_MANAGER},
                )
                made = LeaseView.parse(resp.body, resp.server_time)
                if made.uid:
                    made = await self.core.name_created(cluster, made)
                return ClusterResult(cluster, Outcome.OK, ClusterLease(made, "created"))
            except KubeError as err:
                if err.kind != kube.ALREADY_EXISTS:
                    return failed(cluster, err)  # type: ignore[return-value]
                try:
                    view = await self.core.read(cluster)
                except KubeError as err2:
                    return failed(cluster, err2)  # type: ignore[return-value]
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "exists"), detail="lease exists")

        results = await fan_out(self.core.members, one, timeout=self.core.timeout, silent=self.core.clusters.silent)
        stored = {k: self.core.stored_membership(r.value.view) for k, r in results.items() if r.value and r.value.view}
        verdict = self.core.check_members(stored)
        if verdict.verdict is Verdict.CONFLICT:
            raise MembershipError(
                explain_existing(verdict, self.core.dep.name, self.core.dep.namespace, self.core.identity_names())
            )
        return results

    async def stored_sets(self) -> dict[str, str]:
        """What each member's lease says about the member set, in words (for `deployment
        show`): the epoch and the members by local name where they are connected here."""
        names = {c.identity: c.name for c in self.core.clusters.config.clusters.values()}
        order = {c.name: i for i, c in enumerate(self.core.clusters.config.clusters.values())}

        def listed(identities: tuple[str, ...]) -> str:
            named = sorted((names.get(i, f"?{i[:8]}") for i in identities), key=lambda n: order.get(n, len(order)))
            return ", ".join(named)

        results = await self.core.read_everywhere()
        out: dict[str, str] = {}
        for member in self.core.members:
            r = results.get(member)
            if r is None or not r.ok or r.value is None or r.value.view is None:
                out[member] = f"not read ({r.outcome if r else 'no answer'})"
                continue
            stored = self.core.stored_membership(r.value.view)
            if stored is None:
                out[member] = "nothing (lease missing or deleted)"
            elif not isinstance(stored, Membership):
                out[member] = "nothing (its lease states no member set)"
            else:
                joint = f"; changing to {listed(stored.joint)}" if stored.joint else ""
                same = " (as recorded here)" if stored == self.core.membership else ""
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
                view, stamp = await self.core.probed(cluster, await self.core.checked_read(cluster), lock_id)
            except KubeError as err:
                if err.kind != kube.CONFLICT:
                    return failed(cluster, err)  # type: ignore[return-value]
                try:
                    view = await self.core.read(cluster)  # written meanwhile: decide on that
                except KubeError as err2:
                    return failed(cluster, err2)  # type: ignore[return-value]

            def decide(view: LeaseView) -> Decision:
                stored = self.core.stored_membership(view)
                if (
                    isinstance(stored, Membership)
                    and stored.epoch > self.core.membership.epoch
                    and self.core.agrees(stored)
                ):
                    # a later step of this very change (being finished) is there: keep it
                    if view.lock_id == lock_id:
                        return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "member set written"))
                other = self.core.other_set(view)
                if other is not None:
                    # Another configuration at this epoch or later: a change made meanwhile
                    # (under this very lock id, from another machine) or an edit. Never
                    # written over, and never counted as storing ours.
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "other member set"),
                        detail=f"it stores member set epoch {other.epoch}, another configuration than this "
                        f"change's (epoch {self.core.membership.epoch})",
                    )
                if view.exists and view.lock_id == lock_id:
                    body = self.core.lease_body(
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
                if cluster in seeding and foreign_set(self.core.stored_membership(view), self.core.membership):
                    # another deployment of this name and namespace lives there (or
                    # someone planted a set): seeding would take it over
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "another member set"),
                        detail="its lease stores another member set",
                    )
                if view.held and self.core.stand(cluster, view, lock_id, stamp) is not Standing.LAPSED:
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(view, "held"),
                        detail=held_detail(view, self.core.max_ttl_s),
                    )
                if view.token > token or view.token_malformed:
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        ClusterLease(view, "newer token"),
                        detail=f"the new member's lease has token {view.token}, above this lock's {token}",
                    )
                body = self.core.lease_body(view, lock_id=lock_id, token=token, ttl_s=ttl_s, holder=holder)
                return body, "seeded with the lock" if cluster in seeding else "taken with the lock", ""

            # The lease is written only after its state object stores the set.
            refused = await self.floor.before_lease_write(cluster, view, decide)
            return refused if refused is not None else await self.core.cas(cluster, view, decide)

        results = await fan_out(self.core.members, one, timeout=self.core.timeout, silent=self.core.clusters.silent)
        self.core.raise_on_mismatch(results)
        taken = [k for k, r in results.items() if r.value is not None and r.value.action == "another member set"]
        if taken:
            raise MembershipError(
                f"The lease of deployment {self.core.dep.name!r} on {', '.join(sorted(taken))} stores another member "
                "set (another deployment of this name and namespace lives there, or the set was planted); it "
                "was left as it is. Remove that cluster from the change, or free it first."
            )
        return results
