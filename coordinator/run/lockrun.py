"""``lock run``: hold the lock around a command and everything it starts.

The command runs in a new session, so in a new process group whose id is the command's
pid. What it starts stays in that group unless it leaves on purpose, so the group *is*
the critical section:

- Signals sent to ``lock run`` (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) are
  forwarded to the whole group. A signal that was ignored when ``lock run`` started
  (``nohup``, a background job of a script) stays ignored, as it does for the command.
- When the lock is lost (a renewal finds it taken or broken, or released or deleted on so
  many members that a majority can no longer be its own, or its validity ends before a
  renewal reaches a majority), the group gets SIGTERM, then SIGKILL after ``--grace``,
  and the exit status is 7, even if the command then exits 0.
- The lock is this process's and its group's: its record on this machine names them
  (coordinator/local/locallocks.py), so that no other command takes it from the record, and a
  release on this machine waits for the group to end, also after this process died.
- When the command exits, what it left running in its group gets the same SIGTERM /
  SIGKILL sequence (as systemd does with a service's leftovers), and the lock is released
  only once no member of the group is alive. The command itself is reaped last, so the
  group's id cannot be reused by an unrelated group while it is being signalled.
- Ctrl-Z (SIGTSTP) stops the group together with ``lock run``. When ``lock run`` is
  continued, it checks the lock (its validity, then a renewal on a majority) before the
  group may go on; stopped past the validity, the lock is lost.
- A watchdog process, in a session of its own, outlives ``lock run`` only to stop the
  group (SIGTERM, then SIGKILL after ``--grace``) if ``lock run`` dies (SIGKILL, the OOM
  killer): it holds one end of a pipe and sees the other end close. It also stops the
  group if ``lock run`` has not confirmed the lock by a second after its validity ended
  (stopped with SIGSTOP, hung), which also covers a Ctrl-Z that lasts too long.

Not covered: a process that leaves the group (``setsid``, ``setpgid``, a daemon that
forks twice) is out of reach of any signal to the group; and if the watchdog is killed
together with ``lock run`` (``kill -9 -1``, a container killed as a whole) nothing here
is left to act. A step that starts such processes belongs in a cgroup that can be
stopped as a whole (a systemd scope or service, a container, a Kubernetes Job). Finding
the group's members needs ``/proc`` (Linux); elsewhere only the command itself is waited
for.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from coordinator.errors import (
    CoordinatorError,
    ExitCode,
    LockHeldError,
    NoQuorumError,
    StateConflictError,
    UsageError,
)
from coordinator.local.owners import claim_this_process
from coordinator.local.procgroup import (
    Ended,
    ProcessGroup,
    Watchdog,
    say_stderr,
    seconds_text,
    signal_name,
)
from coordinator.logs import get_logger
from coordinator.rules.lease import boot_clock

if TYPE_CHECKING:
    from coordinator.config.models import RunClaim
    from coordinator.engine.lock.results import AcquireResult
    from coordinator.ops.api import Coordinator

log = get_logger(__name__)

# Interrupting signals end the run: forwarded, and the command's end is then reported as
# an interruption. The others are only forwarded.
INTERRUPTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED = (*INTERRUPTING, signal.SIGUSR1, signal.SIGUSR2)
TICK_S = 0.25


# ------------------------------------------------------------------ lock run


@dataclass
class RunOptions:
    deployment: str
    command: list[str]
    ttl_s: float | None  # None: with lock_id, the lease's own TTL
    wait_s: float = 0.0
    reason: str = ""
    holder: str | None = None
    grace_s: float = 10.0
    lock_id: str | None = None  # run under this lock, already held
    release: bool = False  # with lock_id: release it afterwards
    on_wait: Callable[[Any, float], Awaitable[None] | None] | None = None
    on_wait_end: Callable[[], None] | None = None  # after a wait reported through on_wait
    # What `lock run` tells the user (and the warnings of its watchdog): one line each.
    say: Callable[[str], None] = say_stderr
    # This process is `lock run` itself (not a library caller): once the run is over, the
    # interrupting signals are ignored, so that one arriving while the process ends does
    # not replace the exit status it reported with death by the signal.
    own_process: bool = False
    # Asked once the lock is held and before the command starts (`--check-drift`): a
    # CoordinatorError it raises stops the run, with its exit code, and the command is not run.
    before_start: Callable[[Coordinator], Awaitable[None]] | None = None


def unrunnable(command: list[str], path: str | None) -> tuple[int, str] | None:
    """Why ``command`` cannot be started, with the exit status ``env`` would give."""
    name = command[0]
    if "/" in name:
        if not os.path.lexists(name):
            return 127, "no such file"
        if os.path.isdir(name):
            return 126, "it is a directory"
        if not os.access(name, os.X_OK):
            return 126, "it is not executable"
        return None
    if shutil.which(name, path=path) is not None:
        return None
    for directory in (path if path is not None else os.defpath).split(os.pathsep):
        if os.path.isfile(os.path.join(directory or ".", name)):
            return 126, f"{os.path.join(directory or '.', name)} is not executable"
    return 127, "command not found"


class _Run:
    """One ``lock run``: take (or adopt) the lock, supervise the group, release."""

    def __init__(self, c: Coordinator, opts: RunOptions) -> None:
        self.c = c
        self.opts = opts
        self.phase = "acquire"  # then "run", then "done"
        self.interrupted: int | None = None
        self.acquire_scope: anyio.CancelScope | None = None
        self.held: AcquireResult | None = None
        self.group: ProcessGroup | None = None
        self.watchdog: Watchdog | None = None
        self.tg: TaskGroup | None = None
        self.lost: str | None = None
        self.confirmed_until = 0.0  # CLOCK_BOOTTIME, from a renewal of our own
        self.sent_deadline = 0.0
        self.suspended = False
        self.stop_started = False
        self.stop_done = anyio.Event()
        self.killed = False
        self.leftovers = 0
        self.gave_back = "nothing was taken"
        # This run's mark on its lock's record (coordinator/local/owners.py), once it holds one.
        self.claim: RunClaim | None = None
        self.claimed_id: str | None = None

    # -- the lock's validity, on CLOCK_BOOTTIME

    def deadline(self) -> float:
        assert self.held is not None
        return max(boot_clock() + self.held.expires_in(), self.confirmed_until)

    def tell_watchdog(self, deadline: float) -> None:
        if self.watchdog is not None and abs(deadline - self.sent_deadline) > 0.01:
            self.watchdog.send(f"deadline {deadline!r}")
            self.sent_deadline = deadline

    # -- signals

    async def dispatch_signals(self, signals: Any) -> None:
        async for signum in signals:
            if signum == signal.SIGTSTP:
                await self.on_stop()
            elif self.phase == "acquire":
                if signum in INTERRUPTING:
                    self.interrupted = self.interrupted or signum
                    if self.acquire_scope is not None:
                        self.acquire_scope.cancel()
            elif self.phase == "run":
                assert self.group is not None
                if signum in INTERRUPTING and self.interrupted is None:
                    self.interrupted = signum
                log.info("forwarding signal to the child's group", signal=signal_name(signum))
                self.group.signal(signum)
                if self.suspended:
                    # Stopped processes act on a signal only once continued; the lock is
                    # checked first all the same, so it is delivered when they are.
                    log.info("the child's group is stopped; the signal waits for it to continue")

    async def on_stop(self) -> None:
        if self.phase != "run" or self.stop_started:
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        assert self.group is not None and self.tg is not None
        self.suspended = True
        self.group.signal(signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once continued (SIGCONT)
        self.tg.start_soon(self.resume)

    async def resume(self) -> None:
        """After a stop: confirm the lock on a majority before the group may go on."""
        assert self.held is not None and self.group is not None
        held = self.held
        while self.lost is None and not self.stop_started:
            if self.deadline() <= boot_clock():
                self.lose("it was stopped (SIGTSTP) until after the lock's validity ended")
                break
            try:
                with anyio.move_on_after(max(0.1, self.deadline() - boot_clock())):
                    renewed = await self.c.renew(self.opts.deployment, held.lock_id, ttl=held.ttl_s, holder=held.holder)
                    self.confirmed_until = boot_clock() + renewed.expires_in()
                    self.tell_watchdog(self.deadline())
                    self.suspended = False
                    self.group.signal(signal.SIGCONT)
                    log.info("continued after a stop; lock confirmed", valid_for=round(renewed.expires_in(), 1))
                    return
            except StateConflictError as err:
                self.lose(f"the renewal after a stop (SIGTSTP) found it lost: {err.message}")
                break
            except CoordinatorError as err:  # too few clusters answered: try again while valid
                log.warning("could not confirm the lock after a stop", error=err.message)
                await anyio.sleep(0.5)
        self.suspended = False

    # -- losing the lock, stopping the group

    def lose(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        self.opts.say(
            f"LOCK LOST on {self.opts.deployment}: {reason}; stopping the child's process group "
            f"(SIGTERM, then SIGKILL after {seconds_text(self.opts.grace_s)})"
        )
        assert self.tg is not None
        self.tg.start_soon(self.stop_group)

    async def stop_group(self) -> None:
        """SIGTERM to the group, SIGKILL after the grace period, until none is left."""
        if self.stop_started:
            await self.stop_done.wait()
            return
        self.stop_started = True
        group = self.group
        assert group is not None
        # This process is alive and acts itself: the watchdog stands back meanwhile.
        self.tell_watchdog(boot_clock() + self.opts.grace_s + 5)
        group.signal(signal.SIGTERM)
        group.signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        # Never past the lock's validity: after it, a contender may hold the lock.
        window = self.opts.grace_s
        if self.held is not None:
            window = max(0.0, min(window, self.held.expires_in()))
        with anyio.move_on_after(window):
            await group.wait_empty()
        if group.members():
            self.killed = True
            group.signal(signal.SIGKILL)
            await group.wait_empty()
        self.stop_done.set()

    async def watch_loss(self, lost: anyio.Event, reasons: list[str]) -> None:
        await lost.wait()
        reason = reasons[0] if reasons else "it could not be renewed"
        if self.suspended:
            reason = f"it was stopped (SIGTSTP) too long: {reason}"
        self.lose(reason)

    async def tick(self) -> None:
        """Keep the watchdog told of the validity; a validity that ran out is a loss."""
        while True:
            deadline = self.deadline()
            if self.watchdog is not None:
                self.watchdog.check()
            if not self.stop_started:
                self.tell_watchdog(deadline)
            if deadline <= boot_clock() and not self.suspended:
                self.lose("its validity ended before a renewal reached a majority")
            await anyio.sleep(TICK_S)

    # -- the run

    async def take(self) -> AcquireResult | None:
        """The lock, or None when an interrupting signal stopped the acquisition (what it
        had already written is then given back: see ``self.gave_back``)."""
        opts = self.opts
        # The id is chosen here, so that an acquisition stopped half-way (leases written
        # on some members, its answer not yet back) can be undone by it.
        from coordinator.engine.lock.results import new_lock_id

        lock_id = opts.lock_id or new_lock_id()
        # The lock is this process's and its command's: its record says so from the start,
        # so that no other process of this machine uses it through the record.
        claim = claim_this_process(opts.grace_s)
        with anyio.CancelScope() as scope:
            self.acquire_scope = scope
            try:
                if opts.lock_id:
                    held = await self.c.renew(opts.deployment, opts.lock_id, ttl=opts.ttl_s, holder=opts.holder)
                    self.c.claim_for_run(held, claim)
                else:
                    held = await self.c.acquire(
                        opts.deployment,
                        ttl=opts.ttl_s if opts.ttl_s is not None else 180.0,
                        wait=opts.wait_s,
                        reason=opts.reason or shlex.join(opts.command)[:120],
                        holder=opts.holder,
                        on_wait=opts.on_wait,
                        lock_id=lock_id,
                        run=claim,
                    )
                self.claim, self.claimed_id = claim, held.lock_id
                return held
            except LockHeldError as err:
                raise self._with_hint(err) from None
            finally:
                self.acquire_scope = None
                if opts.on_wait is not None and opts.on_wait_end is not None:
                    opts.on_wait_end()
        if not opts.lock_id:
            self.gave_back = await self.give_back(lock_id)
        return None

    async def give_back(self, lock_id: str) -> str:
        """Undo an acquisition stopped half-way: release whatever lease carries its id."""
        with anyio.CancelScope(shield=True):
            try:
                done = await self.c.release(self.opts.deployment, lock_id, if_held=True)
            except CoordinatorError as err:
                log.info("giving back an interrupted acquisition", error=err.message)
                return f"could not give back what it had taken ({err.message}); those leases expire by themselves"
        return "gave back the leases it had already taken" if done.get("held") else "nothing was taken"

    def _with_hint(self, err: LockHeldError) -> LockHeldError:
        """Refused by a lock this very holder took: say how to run under it."""
        rec = self.c.recorded_lock(self.opts.deployment, self.opts.holder)
        results = getattr(err.payload, "results", None) or {}
        holding = {getattr(getattr(r.value, "view", None), "lock_id", None) for r in results.values()}
        if rec is None or rec.lock_id not in holding:
            return err
        return LockHeldError(
            f"{err.message} This holder ({rec.holder}) took lock {rec.lock_id} of {self.opts.deployment} "
            f"on this machine: run under it with `coordinator lock run {self.opts.deployment} --lock-id "
            f"{rec.lock_id} -- ...` (add --release to release it afterwards).",
            payload=err.payload,
        )

    async def run(self) -> int:
        try:
            return await self._run()
        finally:
            self.drop_claim()

    def drop_claim(self) -> None:
        """The run is over: its mark leaves the lock's record (a lock it leaves held, e.g.
        with --lock-id, is offered through the record again)."""
        if self.claim is None or self.claimed_id is None:
            return
        try:
            self.c.drop_run_claim(self.opts.deployment, self.claimed_id, self.claim)
        except (CoordinatorError, OSError) as err:
            log.warning("could not take this run's mark off the lock record", error=str(err))

    async def _run(self) -> int:
        opts = self.opts
        held = await self.take()
        if held is not None and self.interrupted is None and opts.before_start is not None:
            refused = await self.check_before_start(held)
            if refused is not None:
                return refused
            if self.interrupted is not None:
                return await self.interrupted_before_start(held)
        if held is not None and self.interrupted is None:
            self.held = held
            return await self.run_held(held)
        assert self.interrupted is not None
        if held is None:
            what = self.gave_back
        elif opts.lock_id and not opts.release:
            what = f"lock {held.lock_id} stays held"
        else:
            problem = await self.release(held)
            what = f"could not release it again ({problem})" if problem else "released it again"
        self.opts.say(f"interrupted by {signal_name(self.interrupted)} while taking the lock; {what}")
        return 128 + self.interrupted

    async def check_before_start(self, held: AcquireResult) -> int | None:
        """Ask ``before_start``; when it refuses, the lock is given back as after an
        interruption and its exit code returned. An interrupting signal stops the check.
        The lock is not renewed yet: a check still running --grace before the lock's validity
        ends is a refusal, so that the command never starts on a lock about to lapse."""
        assert self.opts.before_start is not None
        refusal: CoordinatorError | None = None
        # The lead the renewals will keep (lock/renew.py: --grace, at most a third of the TTL).
        lead = max(0.0, min(self.opts.grace_s, held.ttl_s / 3))
        budget = max(held.expires_in() - lead, 0.0)
        with anyio.CancelScope(deadline=anyio.current_time() + budget) as scope:
            self.acquire_scope = scope
            try:
                await self.opts.before_start(self.c)
            except CoordinatorError as err:
                refusal = err
            except Exception as err:  # a bug in the check: never a reason to keep the lock
                log.warning("the check before the command failed", exc_info=True)
                refusal = CoordinatorError(
                    f"The check before the command failed unexpectedly ({type(err).__name__}: {err})."
                )
            finally:
                self.acquire_scope = None
        if scope.cancelled_caught and self.interrupted is None:
            refusal = NoQuorumError(
                f"The check before the command did not finish within {budget:.0f}s, while the lock was still "
                "valid without a renewal."
            )
        if refusal is None:
            return None  # passed, or stopped by a signal (the caller sees self.interrupted)
        if self.opts.lock_id and not self.opts.release:
            what = f"lock {held.lock_id} stays held"
        else:
            problem = await self.release(held)
            what = f"could not release it again ({problem})" if problem else "released it again"
        self.opts.say(f"{refusal.message} {shlex.join(self.opts.command)} was not run; {what}.")
        return int(refusal.exit_code)

    async def interrupted_before_start(self, held: AcquireResult) -> int:
        assert self.interrupted is not None
        if self.opts.lock_id and not self.opts.release:
            what = f"lock {held.lock_id} stays held"
        else:
            problem = await self.release(held)
            what = f"could not release it again ({problem})" if problem else "released it again"
        self.opts.say(
            f"interrupted by {signal_name(self.interrupted)} before the command started; "
            f"{shlex.join(self.opts.command)} was not run; {what}"
        )
        return 128 + self.interrupted

    async def run_held(self, held: AcquireResult) -> int:
        opts = self.opts
        env = dict(os.environ)
        env.update(
            {
                "COORDINATOR_LOCK_ID": held.lock_id,
                "COORDINATOR_FENCING_TOKEN": str(held.fencing_token),
                "COORDINATOR_DEPLOYMENT": opts.deployment,
                # The holder the lock was taken as, so that the child's own commands
                # (state set, lock status) act as the same holder.
                "COORDINATOR_HOLDER": held.holder,
                # The members the lock was taken on, comma-separated (cluster names are
                # DNS labels); during a member change, the old and the new set together.
                "COORDINATOR_CLUSTERS": ",".join(held.members),
            }
        )
        how = "running under" if opts.lock_id else "locked"
        self.opts.say(
            f"{how} {opts.deployment} (lock {held.lock_id}, token {held.fencing_token}); "
            f"running {shlex.join(opts.command)}"
        )
        from coordinator.engine.lock.renew import keep_renewed

        engine = self.c.lock_engine(opts.deployment)
        reasons: list[str] = []
        ended: Ended | None = None
        start_error: OSError | None = None
        # Released only after the renewals have stopped: a renewal racing a release
        # could take a freed lease again.
        # The loss is declared --grace ahead of the validity's end (at most a third of the
        # TTL), so that the group is stopped while the lock is still its own.
        async with keep_renewed(engine, held, on_lost=reasons.append, lead_s=opts.grace_s) as lost:
            async with anyio.create_task_group() as tg:
                self.tg = tg
                self.watchdog = Watchdog.start(opts.grace_s, opts.say)
                # No checkpoint from here to phase "run": a signal is either handled
                # before the command exists or forwarded to it.
                # Signalled after the acquisition returned but before the command
                # existed: the command is not started at all.
                if self.interrupted is None:
                    try:
                        self.group = ProcessGroup.start(opts.command, env)
                    except OSError as err:
                        start_error = err
                    else:
                        if self.watchdog is not None:
                            self.watchdog.send(f"group {self.group.pgid}")
                        self.note_group(held, self.group.pgid)
                        self.phase = "run"
                        tg.start_soon(self.watch_loss, lost, reasons)
                        tg.start_soon(self.tick)
                        ended = await self.supervise(self.group)
                tg.cancel_scope.cancel()
        self.phase = "done"
        if self.watchdog is not None:
            self.watchdog.disarm()
        if self.group is not None:
            self.group.reap()
        if start_error is not None:
            return await self.cannot_start(held, start_error)
        if ended is None:
            return await self.interrupted_before_start(held)
        return await self.finish(held, ended)

    def note_group(self, held: AcquireResult, pgid: int) -> None:
        """The group on the lock's record: while it lives, a release on this machine waits
        for it, even once this process is gone."""
        if self.claim is None:
            return
        try:
            self.c.note_run_group(self.opts.deployment, held.lock_id, self.claim, pgid)
        except (CoordinatorError, OSError) as err:
            self.opts.say(
                f"warning: could not note the command's process group on the lock record ({err}); if this "
                "process dies, a release on this machine does not wait for the group"
            )

    async def supervise(self, group: ProcessGroup) -> Ended:
        """Until no process of the group is left; the leader's ending."""
        ended = await group.wait()
        if not self.stop_started and (rest := group.members()):
            self.leftovers = len(rest)
            log.info("the child left processes in its group; stopping them", pids=rest[:10])
            await self.stop_group()
        await group.wait_empty()
        if self.lost is None and self.deadline() <= boot_clock():
            # E.g. this process was frozen (SIGSTOP) and the watchdog stopped the group.
            self.lost = "its validity ended before a renewal reached a majority"
        return ended

    async def release(self, held: AcquireResult) -> str | None:
        """Release ``held``; the failure's message, if any (the leases then expire)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.c.release(self.opts.deployment, held.lock_id)
            except CoordinatorError as err:
                log.info("release after lock run", error=err.message)
                return err.message
        return None

    async def cannot_start(self, held: AcquireResult, err: OSError) -> int:
        code = 127 if isinstance(err, FileNotFoundError) else 126
        kept = self.opts.lock_id and not self.opts.release
        problem = None if kept else await self.release(held)
        after = f"lock {held.lock_id} stays held" if kept else "released the lock"
        if problem:
            after = f"could not release lock {held.lock_id} ({problem})"
        self.opts.say(f"cannot run {self.opts.command[0]!r}: {err.strerror or err}; {after}")
        return code

    async def finish(self, held: AcquireResult, ended: Ended) -> int:
        opts, dep = self.opts, self.opts.deployment
        grace = seconds_text(opts.grace_s)
        if self.lost is not None:
            await self.release(held)  # whatever is still ours, e.g. on a minority
            if not self.stop_started:
                how = f"the child {ended}"
            elif self.killed:
                how = f"stopped the child (SIGTERM, then SIGKILL after {grace})"
            else:
                how = "stopped the child (SIGTERM)"
            self.opts.say(f"lost the lock on {dep} ({self.lost}): {how}; exit 7")
            return int(ExitCode.LOCK_LOST)
        left = ""
        if self.leftovers:
            how = f"SIGTERM, then SIGKILL after {grace}" if self.killed else "SIGTERM"
            left = f"{self.leftovers} process(es) it left in its group: {how}"
        if opts.lock_id and not opts.release:
            valid = seconds_text(round(held.expires_in()))
            outcome = f"lock {held.lock_id} of {dep} stays held (valid for {valid} unless renewed)"
        else:
            problem = await self.release(held)
            outcome = (
                f"could not release lock {held.lock_id} of {dep} ({problem}); its leases expire by themselves"
                if problem
                else f"released lock {held.lock_id} of {dep}"
            )
        if self.interrupted is not None:
            detail = ended.brief() + (f"; then {left}" if left else "")
            self.opts.say(f"interrupted by {signal_name(self.interrupted)}: stopped the child ({detail}); {outcome}")
        elif outcome.startswith("released"):
            self.opts.say(f"{outcome} after the child {ended}" + (f" (then stopped {left})" if left else ""))
        else:
            self.opts.say(f"the child {ended}" + (f" (then stopped {left})" if left else "") + f"; {outcome}")
        return ended.status


def run_locked(c: Coordinator, opts: RunOptions) -> int:
    """``lock run``: the exit status as documented (the command's; 126/127; 7 if lost)."""
    if not opts.command:
        raise UsageError("lock run needs a command after `--`, e.g. `coordinator lock run dep -- ./deploy.sh`.")
    problem = unrunnable(opts.command, os.environ.get("PATH"))
    if problem is not None:
        code, why = problem
        opts.say(f"cannot run {opts.command[0]!r}: {why}; the lock was not taken")
        return code

    async def main() -> int:
        run = _Run(c, opts)
        # Signals ignored at start stay ignored (nohup, background jobs of scripts).
        wanted = [s for s in (*FORWARDED, signal.SIGTSTP) if signal.getsignal(s) is not signal.SIG_IGN]
        code = int(ExitCode.INTERNAL)
        with anyio.open_signal_receiver(*wanted) as signals:
            async with c, anyio.create_task_group() as tg:
                tg.start_soon(run.dispatch_signals, signals)
                try:
                    code = await run.run()
                finally:
                    tg.cancel_scope.cancel()
        if opts.own_process:
            # The group is gone and the lock released (or reported kept): nothing is left
            # for a signal to stop. (The receiver above restored the handlers on leaving.)
            for sig in INTERRUPTING:
                signal.signal(sig, signal.SIG_IGN)
        return code

    return anyio.run(main)


if __name__ == "__main__" and sys.argv[1:2] == ["--watchdog"]:
    # The watchdog's former address: a `lock run` started before an upgrade in place
    # still starts its watchdog here.
    from coordinator.local.procgroup import watchdog_main

    sys.exit(watchdog_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
