"""Giving the lock back (release) and clearing it whatever its holder (break)."""

from __future__ import annotations

import json

import anyio

from coordinator import clock
from coordinator.engine import history
from coordinator.engine.clusters import failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.core import EngineCore
from coordinator.engine.lock.kubeevents import Touched
from coordinator.engine.lock.reports import summarize
from coordinator.engine.lock.results import ClusterLease, Decision, utc_now
from coordinator.errors import CoordinatorError, NoQuorumError, StateConflictError
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules.lease import A_LAST_BREAK, A_TOKEN, RELEASE_MANAGER, LeaseView
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import FIELD_MANAGER, micro_time
from coordinator.text import printable

log = get_logger("coordinator.engine.lock")  # one logger for the whole engine


class Release:
    """Release and break."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    async def release_one(
        self, cluster: str, lock_id: str, keep_claim: bool = False, only_version: str | None = None
    ) -> ClusterResult[ClusterLease]:
        """Clear the holder where it is ``lock_id``; with ``only_version``, only while the
        lease is still that write (a resourceVersion): a give-back of one write."""
        try:
            await self.core.clusters.check_identity(cluster)
            view = await self.core.read(cluster)
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]

        def decide(view: LeaseView) -> Decision:
            if view.lock_id != lock_id:
                action, detail = "not ours", "not held by this lock id"
            elif only_version is not None and view.resource_version != only_version:
                action, detail = "written since", "written again by this lock id since: left as it is"
            else:
                action = detail = ""
            if action:
                return ClusterResult(
                    cluster, Outcome.OK, ClusterLease(view, action), detail=detail, extra={"ours": False}
                )
            body = self.core.lease_body(
                view, lock_id=None, token=view.token, ttl_s=view.ttl_s or 1, keep_claim=keep_claim
            )
            return body, "released", ""

        # A real release is dated under its own field manager: the next turn stays reserved
        # for HANDOFF_GRACE_S from it. A failed attempt giving back what it took writes as
        # a take does, so that it never extends that reservation.
        manager = FIELD_MANAGER if keep_claim else RELEASE_MANAGER
        result = await self.core.cas(cluster, view, decide, manager=manager)
        if result.ok and result.value is not None and result.value.action == "released":
            result.extra["ours"] = True
        return result

    async def release_many(
        self, clusters: list[str], lock_id: str, into: dict[str, ClusterResult[ClusterLease]]
    ) -> None:
        released = await fan_out(
            clusters,
            lambda c: self.release_one(c, lock_id, keep_claim=True),
            timeout=self.core.timeout,
            silent=self.core.clusters.silent,
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

    async def give_back(self, lock_id: str, leases: str) -> str:
        """Release ``lock_id`` for an acquisition that will not count, shielded from
        cancellation; the sentence that says how it went (``leases`` names them)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.release(lock_id)
                undone = f"The {leases} were released."
            except CoordinatorError as err:
                undone = f"Releasing the {leases} failed too ({err}); they expire after their TTL."
        return undone

    async def release(self, lock_id: str) -> dict[str, ClusterResult[ClusterLease]]:
        """Clear the holder wherever it is still ``lock_id`` (never someone else's).

        Succeeds only when a majority answered: a release that reached fewer leaves the
        lock possibly held there until the TTL, so it raises NoQuorumError (4). When this
        machine's record moved on to a member set the leases store (a change made under
        this lock), the release goes to the members it names now too."""
        results = await fan_out(
            self.core.members,
            lambda c: self.release_one(c, lock_id),
            timeout=self.core.timeout,
            silent=self.core.clusters.silent,
        )
        self.core.raise_on_mismatch(results)
        moved = [m for r in results.values() if r.value and (m := self.core.other_set(r.value.view)) is not None]
        if moved and self.core.follow_record(moved):
            more = [c for c in self.core.members if c not in results or not results[c].ok]
            if more:
                results |= await fan_out(
                    more,
                    lambda c: self.release_one(c, lock_id),
                    timeout=self.core.timeout,
                    silent=self.core.clusters.silent,
                )
                self.core.raise_on_mismatch(results)
            results = {c: r for c, r in results.items() if c in self.core.members}
        ours = [k for k, r in results.items() if r.ok and r.extra.get("ours")]
        observable = [k for k, r in results.items() if r.outcome.observable]
        if not self.core.majorities.reached(observable):
            unseen = sorted(set(self.core.members) - set(observable))
            done = f"released on {', '.join(sorted(ours))}" if ours else "released nowhere"
            raise NoQuorumError(
                f"Could not release lock {lock_id} of {self.core.dep.name!r} on a majority: {done}, and "
                f"{', '.join(unseen)} did not answer ({summarize(results)}). The lock may still be held "
                f"there until its TTL runs out. Run `coordinator lock release {self.core.dep.name}` again when "
                "they answer; the local record of the lock is kept for that.",
                payload=results,
            )
        if not ours:
            raise StateConflictError(
                f"Lock id {lock_id} holds nothing on deployment {self.core.dep.name!r}: none of the "
                f"{len(observable)} clusters that answered has it as holder. It was already "
                "released, expired and was taken over, or the id is wrong; see "
                f"`coordinator lock status {self.core.dep.name}`.",
                payload=results,
            )
        released = {k: r.value.previous for k, r in results.items() if r.extra.get("ours") and r.value}
        await self.core.remember(
            history.release_events(lock_id, {k: v for k, v in released.items() if v}),
            {k: Touched(r.value.previous, r.value.view) for k, r in results.items() if r.extra.get("ours") and r.value},
        )
        return results

    async def break_lock(
        self, *, by: str, reason: str = "", lock_id: str | None = None
    ) -> dict[str, ClusterResult[ClusterLease]]:
        """Clear the lease whatever its holder (admin override), leaving an audit note.

        With ``lock_id``, only leases that lock holds are cleared (terraform's
        ``force-unlock LOCK_ID``): a lease another lock holds, or one blocking for a holder
        nobody can name, is left alone and answered ``held-by-other``, so that a break
        decided on what `lock status` showed never clears a lock taken since."""
        await self.core.verify_members()
        note = {"by": by, "host": clock.host(), "at": micro_time(utc_now()), "reason": reason}
        # A malformed fencing token is replaced by the highest valid one on the other
        # members, so that tokens keep rising after the break; those clusters wait (a
        # bounded while) for the other reads.
        tokens: list[int] = []
        reads_left = [self.core.n]
        all_read = anyio.Event()

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self.core.checked_read(cluster)
                if not view.token_malformed:
                    tokens.append(view.token)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            finally:
                reads_left[0] -= 1
                if reads_left[0] == 0:
                    all_read.set()
            if view.token_malformed:
                with anyio.move_on_after(self.core.timeout / 2):
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
                        f"is gone: it frees itself {self.core.max_ttl_s:.0f}s after it was found missing",
                    )
                if lock_id is not None and view.lock_id != lock_id:
                    if not view.blocking:
                        return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "free"), detail="already free")
                    who = printable(view.info.get("holder") or "an unknown holder") if view.held else None
                    held = (
                        f"held by {who} (lock {printable(str(view.lock_id))})" if who else "held by an unknown holder"
                    )
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(view, "other"),
                        detail=held,  # left alone: not the lock named
                    )
                if not view.held and not view.holder_edited and not view.token_malformed:
                    return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "free"), detail="already free")
                body = self.core.lease_body(view, lock_id=None, token=view.token, ttl_s=view.ttl_s or 1)
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

            return await self.core.cas(cluster, view, decide)

        results = await fan_out(
            self.core.members, on_cluster, timeout=self.core.timeout, silent=self.core.clusters.silent
        )
        self.core.raise_on_mismatch(results)
        # The command says what it broke; the log line is for -v (the history records it too).
        log.info("lock break", deployment=self.core.dep.name, by=by, clusters={k: r.detail for k, r in results.items()})
        cleared = {
            k: r.value.previous
            for k, r in results.items()
            if r.ok and r.value and r.value.action == "broken" and r.value.previous
        }
        await self.core.remember(
            history.break_events(by=by, reason=reason, cleared=cleared),
            {k: Touched(r.value.previous, r.value.view) for k, r in results.items() if k in cleared and r.value},
        )
        return results
