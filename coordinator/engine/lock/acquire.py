"""Taking the lock: one attempt on every member at once, waiting (with turns) for another."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

import anyio

from coordinator import clock
from coordinator.engine import cas, history
from coordinator.engine.clusters import failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.core import EngineCore
from coordinator.engine.lock.floor import TokenFloor, kept_set_speaks
from coordinator.engine.lock.kubeevents import Touched
from coordinator.engine.lock.release import Release
from coordinator.engine.lock.reports import acquire_report, first_in_line, held_detail, next_expiry, reserved_detail
from coordinator.engine.lock.results import AcquireResult, ClusterLease, Decision, new_lock_id
from coordinator.engine.lock.turns import Turns, Wake
from coordinator.errors import IdentityMismatchError, LockHeldError, NoQuorumError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.rules.evidence import Writer
from coordinator.rules.lease import A_TOKEN, LeaseView, Standing, TurnClaim, boot_clock, remaining_validity, token_taken
from coordinator.rules.membership import Check, Stored, Verdict, says_nothing
from coordinator.rules.outcome import Outcome


class Acquire:
    """Acquisition."""

    def __init__(self, core: EngineCore, floor: TokenFloor, turns: Turns, releases: Release) -> None:
        self.core = core
        self.floor = floor
        self.turns = turns
        self.releases = releases

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
        deadline = clock.monotonic() + wait_s
        if wait_s <= 0:
            taken = self._settle(await self._attempt(lock_id, ttl_s, holder, reason, command), final=True)
            return await self._remember_take(taken, reason)
        changed = anyio.Event()
        seen: dict[str, str | None] = {}
        wake = Wake(changed)
        result: AcquireResult | None = None
        async with anyio.create_task_group() as watchers:
            for cluster in self.core.members:
                watchers.start_soon(self.turns.watch_leases, cluster, wake, seen, lock_id)
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
                    left = deadline - clock.monotonic()
                    if result.acquired or left <= 0 or self._mismatch(result) or self._moved(result):
                        break
                    if on_wait is not None:
                        maybe = on_wait(result, left)
                        if maybe is not None:
                            await maybe
                    if wake.mine is not None:
                        await self.turns.claim_turns(result, wake.mine, wake.claimed)
                    expiry = next_expiry(result, self.core.max_ttl_s, self.core.max_server_skew_s)
                    sleep = min(left, backoff * (0.5 + clock.fraction()), expiry)
                    backoff = min(backoff * 2, 2.0)
                    with anyio.move_on_after(max(0.0, sleep)):
                        await wake.event.wait()
                        if wake.behind:
                            # Several waiters woken by the same release, one of them
                            # first in line: the others spread out a little. The first
                            # goes at once (its turn is reserved for it).
                            await anyio.sleep(clock.fraction() * 0.03)
            finally:
                watchers.cancel_scope.cancel()
                # Claims this call leaves behind would reserve the next turn for nobody:
                # a waiter that gives up withdraws all of them, a winner those where it
                # did not take the lease (its other claims are spent by holding it).
                # Best effort: they lapse by themselves after the grace.
                won = result.results if result is not None and result.acquired else {}
                leftover = sorted(c for c in wake.claimed if not (c in won and won[c].ok))
                if leftover and self.core.background is not None:
                    self.core.background.start_soon(self.turns.withdraw_claims, leftover, lock_id)
                elif leftover and not won:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(self.core.timeout):
                        await self.turns.withdraw_claims(leftover, lock_id)
        # Settled outside the watchers' task group, so that the documented errors reach
        # the caller as themselves, not wrapped in an ExceptionGroup.
        assert result is not None
        return await self._remember_take(self._settle(result, final=True), reason)

    async def _remember_take(self, result: AcquireResult, reason: str) -> AcquireResult:
        await self.floor.record_token_floor(result)
        lapsed = {
            name: r.value.previous
            for name, r in result.results.items()
            if r.ok and r.value and r.value.previous and r.value.action.startswith("took over")
        }
        await self.core.remember(
            history.take_events(
                result.lock_id,
                holder=result.holder,
                host=clock.host(),
                pid=str(clock.pid()),
                reason=reason,
                token=result.fencing_token,
                lapsed=lapsed,
            ),
            {
                name: Touched(r.value.previous, r.value.view)
                for name, r in result.results.items()
                if r.ok and r.value and r.value.view and r.value.view.lock_id == result.lock_id
            },
        )
        # Last, after the floor and the history: a break that lands while they are written
        # must be seen (docs/design.md, *Why a majority*).
        await self._confirm_take(result)
        return result

    async def _confirm_take(self, result: AcquireResult) -> None:
        """Read the leases again once the acquisition has won, and count it only if a
        majority of every set still carries its lock id. An attempt's takes are spread
        over time: a `lock break` (or another client) may clear a lease it took before its
        last take lands, and the attempt would count that lease while another contender
        takes it; the first renewal would find out, after both had entered. A break or an
        edit after this read is one of a held lock, which the holder's renewals report."""
        lock_id = result.lock_id

        async def one(cluster: str) -> ClusterResult[LeaseView]:
            try:
                return ClusterResult(cluster, Outcome.OK, await self.core.read(cluster))
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]

        # The versions its takes wrote: a lease read at that version is the take itself,
        # whatever its managedFields say (a holder field another client had set to the same
        # value keeps no recorded writer after the take). A later version counts only while
        # it still names this lock id as coordinator's and names itself, not a copy restored
        # from a backup (its uid note names the object it was copied from).
        written = {
            k: r.value.view.resource_version
            for k, r in result.results.items()
            if r.ok and r.value is not None and r.value.view is not None
        }

        def still_ours(cluster: str, view: LeaseView) -> bool:
            at_take = written.get(cluster)
            if at_take is not None and view.resource_version == at_take:
                return True
            return view.lock_id == lock_id and view.names_itself

        def ours(results: Mapping[str, ClusterResult[LeaseView]]) -> list[str]:
            return [k for k, r in results.items() if r.ok and r.value is not None and still_ours(k, r.value)]

        results = await fan_out(
            self.core.members,
            one,
            timeout=self.core.timeout,
            until=lambda rs: self.core.majorities.reached(ours(rs)),
            silent=self.core.clusters.silent,
        )
        spent = ""
        if self.core.majorities.reached(ours(results)):
            if result.expires_in() > 0:
                return
            spent = "its validity was used up by the time its token and history were recorded"
        undone = await self.releases.give_back(lock_id, "leases it still held")
        if spent:
            raise NoQuorumError(
                f"Took the leases of {self.core.dep.name!r} with fencing token {result.fencing_token}, but {spent} "
                f"(TTL {result.ttl_s:g}s). {undone} The lock is not taken; retry, or use a longer --ttl.",
                payload=result,
            )
        found = []
        others = False
        for name, r in sorted(results.items()):
            view = r.value if r.ok else None
            if view is None:
                found.append(f"{name}: {r.detail or r.outcome}")
            elif still_ours(name, view):
                found.append(f"{name}: still ours")
            elif view.lock_id == lock_id:
                found.append(f"{name}: a copy naming its lock id, not the lease it took")
            elif view.lock_id is not None:
                others = True
                found.append(f"{name}: held by lock {view.lock_id}")
            elif view.broken_for(lock_id):
                found.append(f"{name}: cleared by a break")
            else:
                found.append(f"{name}: no longer ours")
        why = (
            f"Took the leases of {self.core.dep.name!r} with fencing token {result.fencing_token}, but when the "
            f"acquisition finished a majority no longer carried its lock id ({'; '.join(found)}): a `lock break` "
            f"or another client changed them while it was under way. {undone} The lock is not taken; retry."
        )
        raise (LockHeldError if others else NoQuorumError)(why, payload=result)

    def _mismatch(self, result: AcquireResult) -> bool:
        return any(r.outcome is Outcome.IDENTITY_MISMATCH for r in result.results.values())

    @staticmethod
    def _moved(result: AcquireResult) -> bool:
        """A member stores another member set at this record's epoch or a newer one:
        waiting under this record cannot end in a take, so the caller learns it now (and
        a record this machine's change moved on is followed at once, see api.acquire)."""
        return result.membership is not None and result.membership.verdict is Verdict.CONFLICT

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
        state_reads: dict[str, ClusterResult[tuple[int, Stored]]] = {}

        members_check: list[Check] = []

        async def maybe_choose_token(final: bool = False) -> None:
            """Choose the token once a majority was read and the reads prove one (see
            lease.next_token), or, ``final``, with what was read by then."""
            if token_ready.is_set():
                return
            enough = self.core.majorities.reached(reads)
            if not enough and reads_done < self.core.n:
                return
            evidence = self.floor.judge_state(state_reads)
            if (
                enough
                and not self.core.token_proven(reads, evidence is not None)
                and reads_done < self.core.n
                and not final
            ):
                return  # the other members' answers may still make up for it
            views = list(reads.values())
            stored = self.core.hear_state_objects(
                {c: self.core.stored_membership(v) for c, v in reads.items()}, state_reads
            )
            verdict = self.core.check_members(stored)
            if verdict.verdict in (Verdict.UNOBSERVABLE, Verdict.UNCONFIRMED) and evidence:
                # Leases deleted (or their sets removed): the state objects' sets may
                # confirm the member set for those members.
                for c, (_, kept) in evidence.items():
                    speaks = kept_set_speaks(stored.get(c), kept, self.core.membership)
                    if speaks is not None:
                        stored[c] = speaks
                verdict = self.core.check_members(stored)
            if verdict.verdict is Verdict.UNCONFIRMED and evidence is None and not self.floor.everyone(state_reads):
                # Too few state objects answered to judge them: a member whose lease says
                # nothing of the set may still be spoken for by its state object, so it is
                # not observed (exit 4), not known to store nothing (exit 5).
                def may_speak(c: str) -> bool:
                    r = state_reads.get(c)
                    if r is None or not r.ok:
                        return True
                    kept = r.value[1] if r.value is not None else None
                    return kept_set_speaks(stored.get(c), kept, self.core.membership) is not None

                unjudged = {
                    c: s for c, s in stored.items() if not (says_nothing(s, self.core.membership) and may_speak(c))
                }
                verdict = self.core.check_members(unjudged)
            if verdict.verdict is Verdict.UNOBSERVABLE and reads_done < self.core.n and not final:
                return  # members still to answer may confirm the set: hear them first
            floors = [t for c in self.floor.present(state_reads) if (found := state_reads[c].value) for t in found[:1]]
            chosen["token"] = self.core.new_token(reads, floors, evidence is not None) if enough else None
            members_check.append(verdict)
            line["ahead"] = first_in_line(views, lock_id, mine)
            token_ready.set()

        async def on_cluster(cluster: str) -> ClusterResult[ClusterLease]:
            nonlocal reads_done

            async def read_state() -> None:
                state_reads[cluster] = await self.floor.state_one(cluster)

            error: KubeError | None = None
            try:
                view = await self.core.checked_read(cluster, read_state)
            except KubeError as err:
                if err.kind == kube.IDENTITY_MISMATCH:
                    attempt_over["mismatch"] = True
                error = err
            else:
                reads[cluster] = view
            finally:
                reads_done += 1
            await maybe_choose_token()  # the last answer, a failure too, may be what decides
            if error is not None:
                return failed(cluster, error)  # type: ignore[return-value]
            if not token_ready.is_set():
                # Waiting for members that may not answer: after a while, decide with what
                # was read (a missing lease is still recorded as a tombstone then).
                with anyio.move_on_after(self.core.timeout / 2):
                    await token_ready.wait()
                await maybe_choose_token(final=True)
            await token_ready.wait()
            if members_check and not members_check[0].ok and self.core.majorities.reached(reads):
                attempt_over["membership"] = True
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "not attempted"),
                    detail="not attempted: a majority of the members do not confirm this machine's member set",
                )
            if not self.core.majorities.reached(reads):
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
                    recorded = await self.core.record_missing(cluster, floor)
                except KubeError as err:
                    return failed(cluster, err)  # type: ignore[return-value]
                if recorded is not None:
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(recorded, "missing"),
                        detail=held_detail(recorded, self.core.max_ttl_s),
                    )
            if token is None:
                return ClusterResult(
                    cluster,
                    Outcome.ERROR,
                    ClusterLease(view, "no safe token"),
                    detail="not attempted: no fencing token can be proven new: that needs the state objects "
                    "of a majority (with their token floor) and the leases of a majority that kept their "
                    "token history (or every member's lease), and too few of them answered or kept it",
                )
            outcome = await self._take_one(
                cluster,
                view,
                lock_id,
                token,
                ttl_s,
                holder,
                reason,
                command,
                attempt_over,
                mine,
                line.get("ahead"),
                state_reads.get(cluster),
            )
            if outcome.ok and (attempt_over["lost"] or attempt_over["mismatch"]):
                # Landed after the attempt was already decided lost: give back this write,
                # and only while it is the lease's latest. The next attempt of this acquire
                # (the same lock id) may have renewed the lease since and counted it toward
                # its majority; clearing that would leave a holder that holds no majority.
                written = outcome.value.view.resource_version if outcome.value and outcome.value.view else None
                if written is not None:
                    await self.releases.release_one(cluster, lock_id, keep_claim=True, only_version=written)
                outcome.value = ClusterLease(outcome.value.view if outcome.value else None, "released")
            return outcome

        def decided(results: Mapping[str, ClusterResult[ClusterLease]]) -> bool:
            outcomes = [r.outcome for r in results.values()]
            if any(o is Outcome.IDENTITY_MISMATCH for o in outcomes):
                attempt_over["mismatch"] = True
                return True
            if self.core.majorities.reached_by({k: r.outcome for k, r in results.items()}):
                attempt_over["won"] = True
                return True
            if self.core.majorities.impossible_by({k: r.outcome for k, r in results.items()}):
                attempt_over["lost"] = True
                return True
            return False

        results = await fan_out(
            self.core.members,
            on_cluster,
            timeout=self.core.timeout,
            until=decided,
            background=self.core.background,
            # A won attempt does not wait for stragglers (a lease of ours that lands late is
            # freed by release or expiry); a lost one lets them finish and give back.
            leave_running=lambda: not attempt_over["won"],
            silent=self.core.clusters.silent,
            # Cancelled (Ctrl-C), the attempt is lost: what has not been written is not,
            # what lands now gives itself back, and the caller's release (by lock id)
            # runs only once every take that was sent has been answered.
            finish_on_cancel=lambda: attempt_over.__setitem__("lost", True),
        )
        token = chosen.get("token")
        result = self.core.result(
            lock_id, holder, token, ttl_s, started, results, membership=members_check[0] if members_check else None
        )
        refused = attempt_over["mismatch"] or attempt_over["membership"]
        won = self.core.majorities.reached_by({k: r.outcome for k, r in results.items()}) and not refused
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
            await self.releases.release_many(taken, lock_id, results)
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
        state: ClusterResult[tuple[int, Stored]] | None = None,
    ) -> ClusterResult[ClusterLease]:
        """Take one lease by compare-and-swap. ``mine`` is our place in line, ``ahead``
        the earliest waiter before us seen on any cluster of this attempt: while someone
        has waited longer, free leases are theirs to take, on every cluster alike (so
        that contenders do not split the clusters between them). ``state``: the member's
        state object as this attempt read it (its set is brought up before the take)."""

        stamp: datetime | None = None
        # The token was drawn from this read. Where it showed the token history written by
        # coordinator, a later version of the lease that no longer does (another client
        # overwrote, removed or stripped the token annotation meanwhile) may hide a token
        # granted since the read: that lease is not taken.
        history_at_read = view.exists and view.token_writer is Writer.OURS
        for _ in range(cas.ATTEMPTS):
            st = self.core.stand(cluster, view, lock_id)
            try:
                if st is Standing.MISSING and not attempt_over["lost"]:
                    # the highest token this attempt saw elsewhere: a lower bound to keep
                    recorded = await self.core.record_missing(cluster, token - 1)
                    if recorded is None:
                        view = await self.core.read(cluster)
                        continue
                    return ClusterResult(
                        cluster,
                        Outcome.HELD_BY_OTHER,
                        ClusterLease(recorded, "missing"),
                        detail=held_detail(recorded, self.core.max_ttl_s),
                    )
                if st is Standing.PROBE and not attempt_over["lost"]:
                    view, stamp = await self.core.probe(cluster, view)
            except KubeError as err:
                if err.kind not in (kube.CONFLICT, kube.ALREADY_EXISTS):
                    return failed(cluster, err)  # type: ignore[return-value]
                try:
                    view = await self.core.read(cluster)
                except KubeError as err2:
                    return failed(cluster, err2)  # type: ignore[return-value]
                continue
            break

        def decide(view: LeaseView) -> Decision:
            # The probe's stamp stays good evidence after a re-read: it was taken after
            # our last write to the lease, and a later write of ours moves that write.
            st = self.core.stand(cluster, view, lock_id, stamp)
            if st in (Standing.HELD, Standing.PROBE, Standing.MISSING):
                return ClusterResult(
                    cluster,
                    Outcome.HELD_BY_OTHER,
                    ClusterLease(view, "held"),
                    detail=held_detail(view, self.core.max_ttl_s),
                )
            first = ahead or (view.live_claim if view.reserved_for_other(lock_id, mine) else None)
            if first is not None:
                return ClusterResult(
                    cluster,
                    Outcome.HELD_BY_OTHER,
                    ClusterLease(view, "reserved"),
                    detail=reserved_detail(first),
                    extra={"next": first},
                )
            moved = self.core.other_set(view)
            if moved is not None:
                return ClusterResult(
                    cluster,
                    Outcome.CONFLICT,
                    ClusterLease(view, "other member set"),
                    detail=f"not taken: it stores member set epoch {moved.epoch}, not this machine's "
                    f"(epoch {self.core.membership.epoch})",
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
            if history_at_read and view.lock_id != lock_id and view.token_writer is not Writer.OURS:
                return ClusterResult(
                    cluster,
                    Outcome.CONFLICT,
                    ClusterLease(view, "token rewritten"),
                    detail="not taken: another client rewrote or removed its fencing token while this attempt "
                    "was under way, so the token drawn may not be new; the next attempt reads again",
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
            body = self.core.lease_body(
                view, lock_id=lock_id, token=token, ttl_s=ttl_s, holder=holder, reason=reason, command=command
            )
            return body, action, ""

        # A take stores this engine's member set on the lease: the state object first.
        refused = await self.floor.before_lease_write(cluster, view, decide, state, refused_as="not taken")
        return refused if refused is not None else await self.core.cas(cluster, view, decide)

    def _settle(self, result: AcquireResult, *, final: bool) -> AcquireResult:
        if result.acquired:
            return result
        report = acquire_report(result)
        if self._mismatch(result):
            raise IdentityMismatchError(report, payload=result)
        # Too few members answered to confirm the member set: that is the attempt's own
        # story of who did not answer (below), told cluster by cluster.
        unanswered = result.membership is not None and result.membership.verdict is Verdict.UNOBSERVABLE
        if result.membership is not None and not result.membership.ok and not unanswered:
            err = self.core.membership_error(result.membership)
            err.payload = result
            raise err
        # Held by others when enough clusters were seen to say so (clusters that never
        # answered count as unreachable); otherwise too few could be observed.
        seen = [k for k, r in result.results.items() if r.outcome.observable]
        if self.core.majorities.reached(seen):
            raise LockHeldError(report, payload=result)
        raise NoQuorumError(report, payload=result)
