"""The process group ``lock run`` holds under the lock, and its watchdog.

- :class:`ProcessGroup`: the command, started as the leader of a new session and process
  group; the group is signalled as a whole and followed through ``/proc`` until no member
  is left; the leader is reaped last, so the group's id cannot be reused meanwhile.
- :class:`Watchdog` and :func:`watchdog_main`: a process in a session of its own that
  outlives ``lock run`` only to stop the group (SIGTERM, then SIGKILL after the grace
  period, never past the lock's validity) when ``lock run`` dies, or has not confirmed the
  lock by its validity's end (stopped, hung). It is started as
  ``python -m coordinator.local.procgroup --watchdog FD PID GRACE``.

Nothing here knows about locks or clusters: the deadlines it is told are plain
CLOCK_BOOTTIME seconds (``coordinator.rules.lease.boot_clock``). The rules ``lock run`` keeps
with them are in ``coordinator.run.lockrun``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from coordinator.logs import get_logger
from coordinator.rules.lease import boot_clock
from coordinator.text import printable

log = get_logger(__name__)

# The watchdog acts this long (at most --grace) before the end of the validity it was last
# told of, and SIGKILLs no later than that end: after it, a contender may hold the lock.
# ``lock run`` itself declares a loss earlier (--grace, at most a third of the TTL, ahead)
# and must be the one to act when it can.
WATCHDOG_LEAD_S = 1.0
# The watchdog's exit status when it had to stop the group (not a failure of its own).
WATCHDOG_ACTED = 3
POLL_S = 0.05


def say_stderr(text: str) -> None:
    """One line on stderr, prefixed ``coordinator:``, control characters escaped."""
    # A closed or broken stderr (`2>&1 | head -1`, a cancelled CI job's pipe) must never
    # end `lock run` or its watchdog: what they do next is what keeps the lock safe.
    try:
        sys.stderr.write(f"coordinator: {printable(text)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def seconds_text(value: float) -> str:
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
            return f"was killed by {signal_name(self.signum)} (exit {self.status})"
        return f"exited {self.code}"

    def brief(self) -> str:
        if self.signum is not None:
            return f"killed by {signal_name(self.signum)}, exit {self.status}"
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
            log.warning("could not signal the child's process group", signal=signal_name(signum), error=str(err))

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

    def __init__(self, proc: subprocess.Popen[bytes], fd: int, say: Callable[[str], None] = say_stderr) -> None:
        self.proc = proc
        self.fd = fd
        self.say = say
        self.broken = False

    @classmethod
    def start(cls, grace_s: float, say: Callable[[str], None] = say_stderr) -> Watchdog | None:
        """The watchdog, started; None (said through ``say``) if it cannot be."""
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
                    "coordinator.local.procgroup",
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
            say(f"warning: could not start the watchdog ({err}); if this process dies, its child is not stopped")
            return None
        finally:
            os.close(read_end)
        return cls(proc, write_end, say)

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
        self.say(f"warning: the watchdog is gone ({why}); if this process dies, its child is not stopped")

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


def watchdog_main(fd: int, parent: int, grace_s: float) -> int:
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
    say_stderr(
        f"watchdog: `lock run` (pid {parent}) {why}; stopping its child's process group "
        f"{pgid} (SIGTERM, then SIGKILL after {seconds_text(grace_s)} at most, and no later than the lock's validity)"
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


if __name__ == "__main__" and sys.argv[1:2] == ["--watchdog"]:
    sys.exit(watchdog_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
