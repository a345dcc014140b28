"""Which process of this machine a lock belongs to.

``lock run`` holds its lock for itself and its command's process group: it marks its
lock record with a :class:`~coordinator.config.models.RunClaim` (coordinator/ops/api.py writes it),
and while that process or its group is alive, other commands on this machine leave the
lock alone. This module answers the one question that takes: is the process, or the
group, that a claim names still alive?

A process is named by its pid, its start time (field 22 of ``/proc/PID/stat``, in clock
ticks since boot) and the boot's id (``/proc/sys/kernel/random/boot_id``): a pid given to
another process later, or the same pid after a reboot, never passes for it. A group is
named by its id (its leader's pid) and the leader's start time. While any member of a
group is alive, the kernel does not give its id to a new process, so members found under
that id are the group's own, unless a process with that pid runs and started at another
time (then the group had ended, and the id is someone else's).

Without ``/proc`` (not Linux), a claim names the pid alone, and a pid that exists counts
as alive: a release then waits rather than frees a lock too early.

Claims are judged in this machine's pid namespace: a container with a pid namespace of
its own that shares the config directory sees other pids (its claims are judged by start
time and boot id all the same, so a stranger's pid does not pass for them, but a live
``lock run`` outside the container is not seen as alive from inside it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.config.models import RunClaim


def boot_id() -> str:
    """This boot's id, or "" where the system does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc/PID/stat`` shows it."""

    state: str
    pgid: int
    started: int


def read_proc(pid: int) -> Proc | None:
    """Process ``pid``, or None if there is none (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ... starttime(22) ...": comm may hold spaces and parentheses.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return Proc(state=fields[0].decode(), pgid=int(fields[2]), started=int(fields[19]))
    except (IndexError, ValueError):
        return None


def proc_available() -> bool:
    return os.path.isdir("/proc/self")


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def start_time(pid: int) -> int | None:
    found = read_proc(pid)
    return found.started if found is not None else None


def same_boot(claim: RunClaim) -> bool:
    here = boot_id()
    return not claim.boot or not here or claim.boot == here


def owner_alive(claim: RunClaim) -> bool:
    """Is the ``lock run`` process of ``claim`` alive (a zombie is not)?"""
    if not same_boot(claim):
        return False
    if claim.started is None or not proc_available():
        return pid_exists(claim.pid)
    found = read_proc(claim.pid)
    return found is not None and found.started == claim.started and found.state not in ("Z", "X", "x")


def group_alive(claim: RunClaim) -> bool:
    """Is any process of the command's group of ``claim`` alive?"""
    if claim.pgid is None or not same_boot(claim):
        return False
    if not proc_available():
        try:
            os.killpg(claim.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    from coordinator.local.procgroup import group_members  # not for commands that only look

    leader = read_proc(claim.pgid)
    if leader is not None and claim.group_started is not None and leader.started != claim.group_started:
        return False  # the id is another process's: the group had ended
    return bool(group_members(claim.pgid))


def busy(claim: RunClaim) -> bool:
    """Does the claim still hold: its ``lock run`` or its command's group alive?"""
    return owner_alive(claim) or group_alive(claim)


def is_self(claim: RunClaim) -> bool:
    """Is ``claim`` this very process's?"""
    return claim.pid == os.getpid() and (claim.started is None or claim.started == start_time(claim.pid))


def in_group(claim: RunClaim) -> bool:
    """Is this process a member of the claim's command group (the command itself, or
    what it started)?"""
    return claim.pgid is not None and os.getpgrp() == claim.pgid and group_alive(claim)


def claim_this_process(grace_s: float) -> RunClaim:
    """A claim naming this process (its group is added once the command runs)."""
    from coordinator.config.models import RunClaim

    pid = os.getpid()
    return RunClaim(pid=pid, started=start_time(pid), boot=boot_id(), grace_s=grace_s)
