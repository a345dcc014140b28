"""``lock run``: hold the lock around a command and everything it starts.

The command runs in a new session, so in a new process group whose id is the command's
pid. What it starts stays in that group unless it leaves on purpose, so the group *is*
the critical section:

- Signals sent to ``lock run`` (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) are
  forwarded to the whole group. A signal that was ignored when ``lock run`` started
  (``nohup``, a background job of a script) stays ignored, as it does for the command.
- When the lock is lost (a renewal finds it taken or broken, or its validity ends before
  a renewal reaches a majority), the group gets SIGTERM, then SIGKILL after ``--grace``,
  and the exit status is 7, even if the command then exits 0.
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

import contextlib
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from coordinator.errors import CoordinatorError, ExitCode, LockHeldError, StateConflictError, UsageError
from coordinator.lease import boot_clock
from coordinator.logs import get_logger
from coordinator.text import printable

if TYPE_CHECKING:
    from coordinator.api import Coordinator
    from coordinator.lock import AcquireResult

log = get_logger(__name__)

# Interrupting signals end the run: forwarded, and the command's end is then reported as
# an interruption. The others are only forwarded.
INTERRUPTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED = (*INTERRUPTING, signal.SIGUSR1, signal.SIGUSR2)
# The watchdog acts this long (at most --grace) before the end of the validity it was last
# told of, and SIGKILLs no later than that end: after it, a contender may hold the lock.
# ``lock run`` itself declares a loss earlier (--grace, at most a third of the TTL, ahead)
# and must be the one to act when it can.
WATCHDOG_LEAD_S = 1.0
# The watchdog's exit status when it had to stop the group (not a failure of its own).
WATCHDOG_ACTED = 3
TICK_S = 0.25
POLL_S = 0.05


def _say(text: str) -> None:
    # A closed or broken stderr (`2>&1 | head -1`, a cancelled CI job's pipe) must never
    # end `lock run` or its watchdog: what they do next is what keeps the lock safe.
    try:
        sys.stderr.write(f"coordinator: {printable(text)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _signame(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _seconds(value: float) -> str:
    return f"{value:g}s"


# ------------------------------------------------------------------ the process group


def group_members(pgid: int) -> list[int] | None:
    """Pids of the live (not zombie) processes of group ``pgid``; None without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    members = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in (b"Z", b"X", b"x") and int(fields[2]) == pgid:
            members.append(int(name))
    return members


@dataclass
class Ended:
    """How the command ended: its exit status, or the signal that killed it."""

    code: int
    signum: int | None = None

    @property
    def status(self) -> int:
        """As a shell reports it: 128+N for a command killed by signal N."""
        return 128 + self.signum if self.signum is not None else self.code

    def __str__(self) -> str:
        if self.signum is not None:
            return f"was killed by {_signame(self.signum)} (exit {self.status})"
        return f"exited {self.code}"

    def brief(self) -> str:
        if self.signum is not None:
            return f"killed by {_signame(self.signum)}, exit {self.status}"
        return f"exit {self.code}"


class ProcessGroup:
    """The command, started as the leader of a new session and process group.

    The leader is waited for without being reaped (``WNOWAIT``): while it is a zombie
    its pid, which is the group's id, cannot be given to another process, so signalling
    the group can never reach an unrelated one. :meth:`reap` ends that.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self.ended: Ended | None = None

    @classmethod
    def start(cls, command: list[str], env: dict[str, str]) -> ProcessGroup:
        return cls(subprocess.Popen(command, env=env, start_new_session=True))

    def signal(self, signum: int) -> None:
        if self.ended is not None and not self.members():
            return
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as err:  # members that changed user (setuid programs)
            log.warning("could not signal the child's process group", signal=_signame(signum), error=str(err))

    def members(self) -> list[int]:
        found = group_members(self.pgid)
        if found is None:  # no /proc: only the command itself can be followed
            return [] if self.ended is not None else [self.pgid]
        return found

    def _peek(self) -> Ended | None:
        try:
            info = os.waitid(os.P_PID, self.pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.ended or Ended(0)
        if info is None or info.si_pid == 0:
            return None
        if info.si_code == os.CLD_EXITED:
            return Ended(info.si_status)
        return Ended(0, info.si_status)

    async def wait(self) -> Ended:
        """Until the leader has exited (it stays unreaped)."""
        try:
            pidfd: int | None = os.pidfd_open(self.pgid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            while (ended := self._peek()) is None:
                if pidfd is not None:
                    await anyio.wait_readable(pidfd)
                else:
                    await anyio.sleep(POLL_S)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        self.ended = ended
        return ended

    async def wait_empty(self, every: float = POLL_S) -> None:
        waited = 0.0
        while members := self.members():
            await anyio.sleep(every)
            waited += every
            if waited >= 10:
                log.warning("processes of the child's group are still alive", pids=members[:10])
                waited = 0.0

    def reap(self) -> None:
        try:
            os.waitpid(self.pgid, 0)
        except ChildProcessError:
            pass
        # Popen must not wait for (or report) a pid that is no longer its child.
        self.proc.returncode = self.ended.status if self.ended else 0


# ------------------------------------------------------------------ the watchdog


class Watchdog:
    """The parent's side of the watchdog: a pipe it writes to, never reads.

    Lines: ``group PGID`` (what to stop), ``deadline T`` (CLOCK_BOOTTIME seconds until
    which the lock is confirmed), ``done`` (the group is gone: exit without acting).
    """

    def __init__(self, proc: subprocess.Popen[bytes], fd: int) -> None:
        self.proc = proc
        self.fd = fd
        self.broken = False

    @classmethod
    def start(cls, grace_s: float) -> Watchdog | None:
        import coordinator

        read_end, write_end = os.pipe()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(coordinator.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-m",
                    "coordinator.lockrun",
                    "--watchdog",
                    str(read_end),
                    str(os.getpid()),
                    repr(grace_s),
                ],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as err:
            os.close(write_end)
            _say(f"warning: could not start the watchdog ({err}); if this process dies, its child is not stopped")
            return None
        finally:
            os.close(read_end)
        return cls(proc, write_end)

    def send(self, line: str) -> None:
        if self.check():
            try:
                os.write(self.fd, line.encode() + b"\n")
            except OSError as err:
                self._gone(str(err))

    def check(self) -> bool:
        """Whether the watchdog is still there (said once when it is not)."""
        if not self.broken and self.proc.poll() is not None:
            if self.proc.returncode == WATCHDOG_ACTED:  # it stopped the group, as it should
                self.broken = True
            else:
                self._gone(f"exit status {self.proc.returncode}")
        return not self.broken

    def _gone(self, why: str) -> None:
        self.broken = True
        _say(f"warning: the watchdog is gone ({why}); if this process dies, its child is not stopped")

    def disarm(self) -> None:
        """The group is gone: the watchdog exits without acting (waited for, so that the
        group's id is not given away while it could still signal it)."""
        try:
            os.write(self.fd, b"done\n")
        except OSError:  # it has exited already
            pass
        os.close(self.fd)
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _watchdog(fd: int, parent: int, grace_s: float) -> int:
    """Stop group PGID when the pipe closes, or when the deadline passes unconfirmed."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(signum, signal.SIG_IGN)
    pgid: int | None = None
    deadline: float | None = None
    pending = b""
    open_pipe = True
    while True:
        # Act ahead of the validity's end, so that the group is gone before it ends.
        lead = min(grace_s, WATCHDOG_LEAD_S)
        wait = None if pgid is None or deadline is None else max(0.0, deadline - lead - boot_clock())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            why = "has not confirmed its lock, and the lock's validity is about to end (stopped or hung)"
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            why = "is gone"
            open_pipe = False
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            word, _, arg = line.decode().partition(" ")
            if word == "group":
                pgid = int(arg)
            elif word == "deadline":
                deadline = float(arg)
            elif word == "done":
                return 0
    if pgid is None or not group_members(pgid):
        return 0
    _say(
        f"watchdog: `lock run` (pid {parent}) {why}; stopping its child's process group "
        f"{pgid} (SIGTERM, then SIGKILL after {_seconds(grace_s)} at most, and no later than the lock's validity)"
    )
    for signum in (signal.SIGTERM, signal.SIGCONT):
        _killpg_quietly(pgid, signum)
    kill_at = boot_clock() + grace_s
    if deadline is not None:
        kill_at = min(kill_at, deadline)  # never past the validity: a contender may take it then
    while group_members(pgid):
        if boot_clock() >= kill_at:
            _killpg_quietly(pgid, signal.SIGKILL)
            kill_at = float("inf")
        if open_pipe and select.select([fd], [], [], POLL_S)[0]:
            chunk = os.read(fd, 4096)
            open_pipe = bool(chunk)
            if b"done" in chunk:
                break
        elif not open_pipe:
            time.sleep(POLL_S)
    return WATCHDOG_ACTED


def _killpg_quietly(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except OSError:
        pass


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
                log.info("forwarding signal to the child's group", signal=_signame(signum))
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
        _say(
            f"LOCK LOST on {self.opts.deployment}: {reason}; stopping the child's process group "
            f"(SIGTERM, then SIGKILL after {_seconds(self.opts.grace_s)})"
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
        opts = self.opts
        tty = sys.stderr.isatty() and opts.on_wait is not None
        with anyio.CancelScope() as scope:
            self.acquire_scope = scope
            try:
                if opts.lock_id:
                    return await self.c.renew(opts.deployment, opts.lock_id, ttl=opts.ttl_s, holder=opts.holder)
                return await self.c.acquire(
                    opts.deployment,
                    ttl=opts.ttl_s if opts.ttl_s is not None else 180.0,
                    wait=opts.wait_s,
                    reason=opts.reason or shlex.join(opts.command)[:120],
                    holder=opts.holder,
                    on_wait=opts.on_wait,
                )
            except LockHeldError as err:
                raise self._with_hint(err) from None
            finally:
                self.acquire_scope = None
                if tty:
                    with contextlib.suppress(OSError, ValueError):
                        sys.stderr.write("\n")
        return None

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
        opts = self.opts
        held = await self.take()
        if held is not None and self.interrupted is None:
            self.held = held
            return await self.run_held(held)
        assert self.interrupted is not None
        if held is None:
            what = "nothing was taken"
        elif opts.lock_id and not opts.release:
            what = f"lock {held.lock_id} stays held"
        else:
            problem = await self.release(held)
            what = f"could not release it again ({problem})" if problem else "released it again"
        _say(f"interrupted by {_signame(self.interrupted)} while taking the lock; {what}")
        return 128 + self.interrupted

    async def run_held(self, held: AcquireResult) -> int:
        opts = self.opts
        env = dict(os.environ)
        env.update(
            {
                "COORDINATOR_LOCK_ID": held.lock_id,
                "COORDINATOR_FENCING_TOKEN": str(held.fencing_token),
                "COORDINATOR_DEPLOYMENT": opts.deployment,
            }
        )
        how = "running under" if opts.lock_id else "locked"
        _say(
            f"{how} {opts.deployment} (lock {held.lock_id}, token {held.fencing_token}); "
            f"running {shlex.join(opts.command)}"
        )
        from coordinator.lock import keep_renewed

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
                self.watchdog = Watchdog.start(opts.grace_s)
                # No checkpoint from here to phase "run": a signal is either handled
                # before the command exists or forwarded to it.
                try:
                    self.group = ProcessGroup.start(opts.command, env)
                except OSError as err:
                    start_error = err
                else:
                    if self.watchdog is not None:
                        self.watchdog.send(f"group {self.group.pgid}")
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
        assert ended is not None
        return await self.finish(held, ended)

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
        _say(f"cannot run {self.opts.command[0]!r}: {err.strerror or err}; {after}")
        return code

    async def finish(self, held: AcquireResult, ended: Ended) -> int:
        opts, dep = self.opts, self.opts.deployment
        grace = _seconds(opts.grace_s)
        if self.lost is not None:
            await self.release(held)  # whatever is still ours, e.g. on a minority
            if not self.stop_started:
                how = f"the child {ended}"
            elif self.killed:
                how = f"stopped the child (SIGTERM, then SIGKILL after {grace})"
            else:
                how = "stopped the child (SIGTERM)"
            _say(f"lost the lock on {dep} ({self.lost}): {how}; exit 7")
            return int(ExitCode.LOCK_LOST)
        left = ""
        if self.leftovers:
            how = f"SIGTERM, then SIGKILL after {grace}" if self.killed else "SIGTERM"
            left = f"{self.leftovers} process(es) it left in its group: {how}"
        if opts.lock_id and not opts.release:
            valid = _seconds(round(held.expires_in()))
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
            _say(f"interrupted by {_signame(self.interrupted)}: stopped the child ({detail}); {outcome}")
        elif outcome.startswith("released"):
            _say(f"{outcome} after the child {ended}" + (f" (then stopped {left})" if left else ""))
        else:
            _say(f"the child {ended}" + (f" (then stopped {left})" if left else "") + f"; {outcome}")
        return ended.status


def run_locked(c: Coordinator, opts: RunOptions) -> int:
    """``lock run``: the exit status as documented (the command's; 126/127; 7 if lost)."""
    if not opts.command:
        raise UsageError("lock run needs a command after `--`, e.g. `coordinator lock run dep -- ./deploy.sh`.")
    problem = unrunnable(opts.command, os.environ.get("PATH"))
    if problem is not None:
        code, why = problem
        _say(f"cannot run {opts.command[0]!r}: {why}; the lock was not taken")
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
        return code

    return anyio.run(main)


if __name__ == "__main__" and sys.argv[1:2] == ["--watchdog"]:
    sys.exit(_watchdog(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
