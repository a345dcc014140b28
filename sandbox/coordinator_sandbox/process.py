"""Start, observe and signal the sandbox's long-running processes (Linux only).

Processes are started with ``posix_spawn`` in a session of their own, with stdin on
/dev/null and stdout/stderr appended to a log file, so they outlive the command that
started them and never hold its pipes open. A process is identified by its pid *and*
its start time (from ``/proc``), so a recycled pid is never mistaken for ours.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ProcessState = Literal["running", "paused", "gone"]

# Variables that must not leak into the control plane: a contender run under faketime
# may start a sandbox, and the servers must keep real time.
_DROPPED_ENV_PREFIXES = ("LD_PRELOAD", "FAKETIME", "DONT_FAKE_MONOTONIC")


@dataclass(frozen=True)
class ProcessRef:
    """A process as the sandbox knows it: pid plus start time (clock ticks since boot)."""

    pid: int
    start_ticks: int


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _reap(pid: int) -> None:
    # Our own children linger as zombies until waited for; others' are not ours to reap.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def state(ref: ProcessRef) -> ProcessState:
    """``running``, ``paused`` (SIGSTOPped) or ``gone`` (exited, zombie, or pid reused)."""
    fields = _stat_fields(ref.pid)
    if fields is None or int(fields[19]) != ref.start_ticks:
        return "gone"
    if fields[0] in ("Z", "X"):
        # A multi-threaded program (Go's servers are) shows its main thread as a zombie
        # while the other threads are still exiting; until the last one is gone its
        # files, listening sockets included, are still open.
        if fields[0] == "Z" and int(fields[17]) > 1:
            return "running"
        _reap(ref.pid)
        return "gone"
    if fields[0] in ("T", "t"):
        return "paused"
    return "running"


def spawn(args: Sequence[str], log: Path, *, append: bool = False) -> ProcessRef:
    """Start ``args`` detached (new session), output to ``log``; return its reference."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES)}
    log.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(log, flags, 0o644)
    try:
        pid = os.posix_spawn(
            args[0],
            list(args),
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=(signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
        )
    finally:
        os.close(fd)
    # Our own child stays readable in /proc (as a zombie at worst) until it is reaped.
    ticks = start_ticks(pid)
    return ProcessRef(pid, -1 if ticks is None else ticks)


def send(ref: ProcessRef, sig: signal.Signals) -> bool:
    """Signal ``ref`` if it is still our process; False when it is already gone."""
    if state(ref) == "gone":
        return False
    try:
        os.kill(ref.pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_gone(refs: Iterable[ProcessRef], timeout: float) -> list[ProcessRef]:
    """Wait up to ``timeout`` seconds for every process to end; return those still there."""
    pending = list(refs)
    deadline = time.monotonic() + timeout
    while True:
        pending = [ref for ref in pending if state(ref) != "gone"]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.05)


def wait_paused(ref: ProcessRef, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = state(ref)
        if current != "running":
            return current == "paused"
        time.sleep(0.01)
    return False


def find_by_markers(markers: Sequence[str], program_names: Iterable[str]) -> list[ProcessRef]:
    """Processes running one of ``program_names`` with an argument containing a marker.

    This finds servers of a sandbox even when its state file is lost or was never
    written (for example when ``sandbox up`` was killed half-way).
    """
    names = set(program_names)
    found: list[ProcessRef] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0]:
            continue
        if os.path.basename(os.fsdecode(argv[0])) not in names:
            continue
        args = [os.fsdecode(arg) for arg in argv[1:]]
        if not any(marker in arg for arg in args for marker in markers):
            continue
        ref = ProcessRef(int(entry.name), start_ticks(int(entry.name)) or -1)
        if state(ref) != "gone":
            found.append(ref)
    return found


def reap_exited_children(program_names: Iterable[str]) -> list[int]:
    """Reap this process's exited children that ran one of ``program_names``.

    Servers started by another (since exited) process can end up as children of this
    one when it is a child subreaper; when they die they would stay zombies otherwise.
    """
    names = set(program_names)
    me = str(os.getpid())
    reaped: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        if fields[0] == "Z" and fields[1] == me and comm in names:
            _reap(int(entry.name))
            reaped.append(int(entry.name))
    return reaped


def memory_bytes(pid: int) -> tuple[int, int] | None:
    """(current resident set size, peak resident set size) in bytes, if readable."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    if "VmRSS" not in values:
        return None
    return values["VmRSS"], values.get("VmHWM", values["VmRSS"])


def wait_port_free(port: int, timeout: float = 5.0, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` is free, or becomes free within ``timeout`` seconds (a server that
    was just killed may hold its socket for a moment)."""
    deadline = time.monotonic() + timeout
    while not port_is_free(port, host):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def pick_ports(count: int, *, avoid: Iterable[int] = ()) -> list[int]:
    """``count`` distinct ports that are free on loopback right now.

    They are drawn outside the kernel's ephemeral range, so an outgoing connection is
    unlikely to take one before the server binds it; a collision is still possible, and
    the caller retries with fresh ports when a server reports "address already in use".
    """
    taken = set(avoid)
    low, high = _ephemeral_range()
    candidates = [p for p in range(10000, 30000) if not low <= p <= high]
    rng = random.SystemRandom()
    chosen: list[int] = []
    for _ in range(2000):
        if len(chosen) == count:
            break
        port = rng.choice(candidates) if candidates else 0
        if port in taken:
            continue
        if port == 0 or not port_is_free(port):
            continue
        taken.add(port)
        chosen.append(port)
    while len(chosen) < count:  # fall back to whatever the kernel hands out
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            taken.add(port)
            chosen.append(port)
    return chosen
