"""Taking turns: the waiter who began waiting first gets the lock next.

Waiters list their claims on leases held by others (and refresh them while they wait),
and lease watches wake a waiting contender when a lease is freed."""

from __future__ import annotations

import contextlib

import anyio

from coordinator.engine.fanout import ClusterResult
from coordinator.engine.lock.bodies import with_line
from coordinator.engine.lock.core import EngineCore
from coordinator.engine.lock.results import AcquireResult, ClusterLease, Decision
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules.lease import A_VANISHED, LINE_MANAGER, LeaseView, TurnClaim, lock_id_of
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import leases_path

log = get_logger("coordinator.engine.lock")  # one logger for the whole engine


class Wake:
    """What a waiting acquire shares with its lease watches."""

    def __init__(self, event: anyio.Event) -> None:
        self.event = event
        self.mine: TurnClaim | None = None  # our place in line, once known
        self.claimed: set[str] = set()  # clusters where a claim of ours may stand
        # The release that set ``event`` showed another waiter ahead of us in line.
        self.behind = False


class Turns:
    """Claims of the next turn and the lease watches of a waiting acquisition."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    async def claim_turns(self, result: AcquireResult, mine: TurnClaim, ours: set[str]) -> None:
        """Take (or keep) our place in line on every cluster where the lease is held by
        another: list our claim, or refresh it when its server stamp has aged, so that
        it is not taken for a dead waiter's. The clusters where the claim may stand are
        added to ``ours``. Best effort: a claim that cannot be written only costs this
        waiter its place until the next round of the wait loop."""
        lock_id = mine.lock_id

        def decide(cluster: str, view: LeaseView) -> Decision:
            if not view.live_for_other(lock_id):
                # free or expired: the next attempt decides, no claim needed
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "not held"))
            line = view.line_joined(mine)
            if line is None:
                listed = any(c.lock_id == lock_id for c in view.line)
                if listed:
                    ours.add(cluster)
                detail = "claimed already" if listed else "the line is full of earlier waiters"
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, detail))
            ours.add(cluster)  # before the write: one cut short may still have landed
            return with_line(view.obj, view, line), "claimed", ""

        async def one(cluster: str, view: LeaseView) -> None:
            # One write, on the lease as this attempt read it. A lost race is not retried
            # (the next round of the wait loop comes soon): the holder's own writes
            # (renewals, the release) are compare-and-swaps too, and waiters that swarm
            # back after every 409 would keep them losing.
            decision = decide(cluster, view)
            if isinstance(decision, ClusterResult):
                return
            try:
                await self.core.write(cluster, view, decision[0], manager=LINE_MANAGER)
            except KubeError as err:
                if err.kind != kube.CONFLICT:
                    log.debug("could not claim the next turn", cluster=cluster, detail=err.detail)

        with anyio.move_on_after(self.core.timeout):
            async with anyio.create_task_group() as tg:
                for cluster, r in result.results.items():
                    view = r.value.view if r.value else None
                    if view is not None and r.outcome is Outcome.HELD_BY_OTHER:
                        tg.start_soon(one, cluster, view)

    async def withdraw_claims(self, clusters: list[str], lock_id: str) -> None:
        def decide(cluster: str, view: LeaseView) -> Decision:
            if all(c.lock_id != lock_id for c in view.line):
                return ClusterResult(cluster, Outcome.OK, ClusterLease(view, "no claim of ours"))
            return with_line(view.obj, view, view.line_without(lock_id)), "withdrawn", ""

        async def one(cluster: str) -> None:
            with anyio.move_on_after(self.core.timeout), contextlib.suppress(KubeError):
                view = await self.core.read(cluster)
                await self.core.cas(cluster, view, lambda v: decide(cluster, v), manager=LINE_MANAGER)

        async with anyio.create_task_group() as tg:
            for cluster in clusters:
                tg.start_soon(one, cluster)

    async def watch_leases(self, cluster: str, wake: Wake, seen: dict[str, str | None], lock_id: str) -> None:
        """Wake the waiting contender when this cluster's lease is freed or deleted.

        A change of holder, or a renewal, does not make the lock available; an expiry is
        waited for by time. Our own writes (their resourceVersions are in ``seen``) are
        ignored, so a contender does not wake itself up by releasing a partial attempt.
        Claims are not written from events: every write of the lease is an event for
        every waiter, and waiters answering events with writes set off one another, in
        the middle of the holder's compare-and-swaps (a release, a renewal). The wait
        loop lists and refreshes our claim each round instead.
        """
        client = self.core.clusters.client(cluster)
        query = {"fieldSelector": f"metadata.name={self.core.name}"}
        delay = 0.5
        while True:
            try:
                async for event in client.watch(leases_path(self.core.dep.namespace), query=query, timeout=55):
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    holder_id = lock_id_of((obj.get("spec") or {}).get("holderIdentity"))
                    tombstone = A_VANISHED in ((obj.get("metadata") or {}).get("annotations") or {})
                    freed = not holder_id and not tombstone and rv != seen.get(cluster)
                    if event.get("type") == "DELETED" or freed:
                        if not wake.event.is_set():
                            # The event is the release itself, so its claim is within the
                            # grace (an event has no server time to judge freshness by).
                            ahead = LeaseView.parse(obj, None).claim_ahead(lock_id, wake.mine) if freed else None
                            wake.behind = ahead is not None
                        wake.event.set()
                delay = 0.5
            except KubeError as err:
                log.debug("lease watch interrupted", cluster=cluster, detail=err.detail)
                await anyio.sleep(delay)
                delay = min(delay * 2, 5.0)
