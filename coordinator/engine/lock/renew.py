"""Keeping the lock: renewing the leases still ours, and renewing them in the background."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import anyio

from coordinator.engine import history
from coordinator.engine.clusters import failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.core import EngineCore
from coordinator.engine.lock.kubeevents import Touched
from coordinator.engine.lock.reports import held_detail, summarize
from coordinator.engine.lock.results import AcquireResult, ClusterLease, Decision, default_holder
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules.evidence import Writer
from coordinator.rules.lease import LeaseView, RenewVerdict, boot_clock, remaining_validity, renew_verdict
from coordinator.rules.membership import Membership
from coordinator.rules.outcome import Outcome
from coordinator.text import printable

if TYPE_CHECKING:
    from coordinator.engine.lock.engine import LockEngine

log = get_logger("coordinator.engine.lock")  # one logger for the whole engine


class Renew:
    """Renewal."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    async def renew(
        self, lock_id: str, token: int, ttl_s: float, holder: str | None = None, *, _followed: bool = False
    ) -> AcquireResult:
        """Extend the leases still ours; succeed on a majority, returning as soon as one
        is renewed. A renewal never re-takes a lease it no longer holds, and one that
        finds our lease broken or held by another lock id with a token not below ours (a take
        after this lock was granted, or an edit) has lost the lock at once
        (``result.lost`` says why). So has one that finds so many leases no longer ours
        (freed, deleted, broken or taken, whatever the token) that a majority is out of
        reach for this lock id: released by someone else, the lock is over, and waiting
        for its validity to run out would keep a holder acting while another may take it.
        A lease that did not answer is no such evidence: it may still be ours. A lease
        storing a newer member set is not renewed: when this machine's record followed
        that change, the renewal counts over the new members; otherwise it reaches no
        majority (and the lock runs out)."""
        who = holder or default_holder()
        started = boot_clock()
        lost: dict[str, str] = {}
        # Members whose lease can never be renewed by this lock id again (a renewal never
        # re-takes one), with what was found there.
        gone: dict[str, str] = {}
        moved: dict[str, Membership] = {}

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            try:
                view = await self.core.checked_read(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]

            def decide(view: LeaseView) -> Decision:
                verdict = renew_verdict(view, lock_id)
                newer = self.core.other_set(view)
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
                        f"with epoch {self.core.membership.epoch}",
                    )
                if verdict is RenewVerdict.RENEW and (view.token > token or view.token_writer is not Writer.OURS):
                    # Our lock id, but a higher token, or one coordinator did not write:
                    # something else wrote here since; a renewal never writes its token over
                    # a later one. (A lower one is an earlier attempt of this same acquire's.)
                    verdict = RenewVerdict.GONE
                if verdict is RenewVerdict.RENEW:
                    body = self.core.lease_body(view, lock_id=lock_id, token=token, ttl_s=ttl_s, renew_only=True)
                    return body, "renewed", ""
                if verdict is RenewVerdict.BROKEN:
                    note = view.break_note or {}
                    by = printable(str(note.get("by") or "someone"))  # the lease's text: escaped
                    lost[cluster] = f"broken on {cluster} by {by}"
                    detail = f"the lock was broken by {by}"
                elif verdict is RenewVerdict.TAKEN:
                    detail = held_detail(view)
                    # A lower token is a lock older than this one: a lease this lock never
                    # got, its holder's not lapsed yet there. Whoever takes a lease after
                    # this lock was granted read one of its majority and draws a higher
                    # token, so only that is a loss. (An equal token, a losing attempt's or
                    # an edited lease's, counts as one too: to be safe.)
                    # A token coordinator did not write there says nothing of when that lock
                    # was granted: counted as a loss too.
                    if view.token >= token or view.token_writer is not Writer.OURS:
                        lost[cluster] = f"{cluster} is held by another lock ({detail})"
                else:
                    detail = "no longer ours (the lease was freed or deleted)"
                gone[cluster] = {
                    RenewVerdict.BROKEN: "broken",
                    RenewVerdict.TAKEN: "held by another lock",
                }.get(verdict, "released or deleted")
                return ClusterResult(cluster, Outcome.HELD_BY_OTHER, ClusterLease(view, "lost"), detail=detail)

            return await self.core.cas(cluster, view, decide)

        results = await fan_out(
            self.core.members,
            on_cluster,
            timeout=self.core.timeout,
            silent=self.core.clusters.silent,
            until=lambda rs: (
                bool(lost)
                or self.core.majorities.impossible(gone)
                or self.core.majorities.reached_by({k: r.outcome for k, r in rs.items()})
            ),
        )
        self.core.raise_on_mismatch(results)
        if not lost and self.core.majorities.impossible(gone):
            # Released (by `lock release --lock-id`, by a second terminal, by the child
            # itself), deleted, or broken and taken: no majority can be ours again.
            found: dict[str, list[str]] = {}
            for cluster, why in sorted(gone.items()):
                found.setdefault(why, []).append(cluster)
            where = "; ".join(f"{why} on {', '.join(clusters)}" for why, clusters in found.items())
            lost["*"] = f"its leases are no longer its own on a majority ({where})"
        if moved and not lost and not _followed and self.core.follow_record(moved.values()):
            # This machine's record followed the change: renew over the members it names now.
            return await self.renew(lock_id, token, ttl_s, holder, _followed=True)
        result = self.core.result(
            lock_id, who, token, ttl_s, started, results, lost="; ".join(v for _, v in sorted(lost.items())) or None
        )
        validity = remaining_validity(ttl_s, boot_clock() - started)
        renewed = self.core.majorities.reached_by({k: r.outcome for k, r in results.items()})
        if not lost and renewed and validity > 0:
            result.acquired = True
            result.validity_s = validity
        if lost and result.lost:
            await self.core.remember(
                history.lost_events(lock_id, holder=who, token=token, why=result.lost),
                # Every member whose lease the renewal read: where it found its lease gone,
                # and where it still renewed it (the lock is lost there too).
                {k: Touched(after=r.value.view) for k, r in results.items() if r.value and r.value.view},
            )
        return result


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
                log.warning("lock renewal reached no majority", clusters=summarize(renewed.results))
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
