"""Safety under faults: contenders hammer one deployment while faults are injected.

:func:`run_torture` starts its own sandbox clusters, puts a toxiproxy proxy in front of
every API server (the kubeconfig it writes points at the proxies), connects the clusters
into a private local config and creates a deployment. Then several contender *processes*
loop: take the lock, enter the critical section, write the state (unique values), read
it, renew, leave, release, read again. Some use the command line (``coordinator lock
acquire`` / ``state set`` / ``state get`` / ``lock renew`` / ``lock release``), some the
Python API (``Coordinator.lock`` and ``state().set`` / ``get``); some run under
``faketime`` minutes ahead of or behind the real clock. Meanwhile a seeded fault schedule
pauses and resumes API servers (a minority, and a majority), kills and restarts them,
adds latency, cuts connections, black-holes requests or responses (a write whose answer
is lost has an unknown outcome), and SIGKILLs or SIGSTOPs holders inside their critical
section. It also acts as other clients and operators would: edits the Lease under other
field managers (annotations, labels, a server-side apply, managedFields stripped,
leaseDurationSeconds cut), deletes the Lease (on one member or all), the state object or
the whole namespace, rejects state writes with a ValidatingAdmissionPolicy (on a minority
or a majority), breaks the lock of a live holder, SIGKILLs ``lock run`` while its
process tree runs, and adds, removes and replaces members (spare clusters are started for
that; the contenders then share the one local config the changes are made with). With
``apiservers=2`` every cluster is HA: two kube-apiservers on one etcd behind the sandbox's
front proxy (toxiproxy sits in front of it), one answering ``date_offset`` seconds off.
A ``lock run`` contender's critical section is a process tree, and readers read the
state without the lock all the time. At the end every fault is undone,
the contenders stop, a final read is taken, and the histories are judged by
:mod:`faults.checkers`.

One clock
---------
Every time in the histories is a reading of ``CLOCK_BOOTTIME`` taken with a raw system
call (:func:`machine_clock`): one clock for the whole machine, which libfaketime cannot
fake (it replaces the C library's ``clock_gettime``, not the kernel's), so a contender
under faketime stamps its history on the same clock as everyone else.

What a critical section is
--------------------------
A holder reads the clock, and enters only if its lock is still valid at that reading
(with a margin); it records the reading and its fencing token. Validity is the holder's
own count, as the product defines it: TTL − elapsed − drift allowance, counted from just
before the lock was asked for, extended by renewals (a command-line holder counts from
just before it started ``lock acquire`` or ``lock renew``, which is earlier than the
product's own count, so never longer). The section ends when the holder leaves it, or
when its validity ends, whichever comes first: a holder frozen past its validity is no
longer protected by the lock, only by fencing, and what it writes then is judged by the
register checks. A holder killed inside its section is out of it when it died (or when
its validity ended, if that came first). A ``lock run`` section is the life of its process tree, from
the first mark one of its processes wrote to the last (no clipping: ``lock run`` promises
that the whole tree is stopped before the lock can pass on). An operator's ``lock break``
ends the broken holder's section, for the check, where the break began
(:func:`faults.checkers.apply_breaks`). So the lock check asks exactly what the lock
promises: no two holders ever believe, on their own clocks, that they hold it at the
same time, and fencing tokens rise.

The register
------------
The state key ``v`` is the register. Writes are ``state set v=<unique value>``: exit 0
is ``ok``, exit 3 or 6 (refused, nothing written) is ``fail``, exit 4 (outcome unknown,
or no quorum), a timeout, or a contender killed during the write is ``unknown``. Reads
are ``state get``; a failed read carries no information. Any exit code outside the
documented table, exit 1 (a bug, by definition), or a traceback is a violation too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import inspect
import itertools
import json
import os
import platform
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from coordinator.quorum import quorum_size, remaining_validity

if TYPE_CHECKING:
    from coordinator.api import Coordinator, HeldLock
    from coordinator.sandbox import Sandbox
    from coordinator.state import StateClient
    from faults.checkers import CheckResult, HistoryStats
    from faults.toxiproxy import Proxy, ToxiproxyServer

__all__ = [
    "DEPLOYMENT",
    "FAULT_KINDS",
    "ContenderSpec",
    "Report",
    "TortureOptions",
    "default_contenders",
    "extra_contenders",
    "machine_clock",
    "run_torture",
]

DEPLOYMENT = "torture"
# Where this harness lives (tests/, holding the package ``faults``): contender processes
# import it from there, since it is not part of the installed tool.
TESTS_DIR = str(Path(__file__).resolve().parent.parent)
STATE_KEY = "v"
# A holder enters, and starts each step, only with at least this much validity left:
# a step of a command-line holder starts a process, which takes seconds.
STEP_MARGIN_S = {"api": 0.5, "cli": 3.0}

Mode = Literal["cli", "api", "run", "reader"]
MODES = ("cli", "api", "run", "reader")
Progress = Callable[[str], None]


# ------------------------------------------------------------------------- the clock

_CLOCK_BOOTTIME = 7
_SYS_CLOCK_GETTIME = {"x86_64": 228, "amd64": 228, "aarch64": 113, "arm64": 113}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _raw_boottime_reader() -> Callable[[], float] | None:
    """CLOCK_BOOTTIME straight from the kernel, past any LD_PRELOADed clock faker."""
    number = _SYS_CLOCK_GETTIME.get(platform.machine().lower())
    if number is None or not sys.platform.startswith("linux"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long

    def read() -> float:
        ts = _Timespec()
        if syscall(ctypes.c_long(number), ctypes.c_long(_CLOCK_BOOTTIME), ctypes.byref(ts)) != 0:
            raise OSError(ctypes.get_errno(), "clock_gettime(CLOCK_BOOTTIME) failed")
        return float(ts.tv_sec) + float(ts.tv_nsec) / 1e9

    try:
        read()
    except OSError:
        return None
    return read


_read_boottime = _raw_boottime_reader()


def machine_clock() -> float:
    """Seconds on one clock shared by every process of the machine, faked or not."""
    if _read_boottime is not None:
        return _read_boottime()
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def monotonic_to_machine(reading: float) -> float:
    """Convert a ``time.monotonic()`` reading of this process to :func:`machine_clock`.

    Under faketime the two differ by a constant offset (the rates are the same), which
    is read afresh on every call.
    """
    return reading + (machine_clock() - time.monotonic())


def boot_to_machine(reading: float) -> float:
    """Convert a reading of the lock's validity clock (:func:`coordinator.lease.boot_clock`)
    of this process to :func:`machine_clock` (under faketime they differ by an offset)."""
    from coordinator.lease import boot_clock

    return reading + (machine_clock() - boot_clock())


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())[:1500]


# ----------------------------------------------------------------------- contenders


@dataclass(frozen=True)
class ContenderSpec:
    """One contender process: how it talks to the tool, its lease TTL, its clock."""

    name: str
    mode: Mode  # cli | api | run (``lock run`` around a process tree) | reader (no lock)
    ttl: float
    faketime: str | None = None  # e.g. "+7m": run under faketime this far off

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"contender mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.ttl < 2:
            raise ValueError("a contender's TTL must be at least 2 s")


def default_contenders(count: int = 4) -> list[ContenderSpec]:
    """API and command-line contenders, alternating; every second pair off by minutes.

    Command-line holders get a longer TTL: every step starts a Python process, which
    on a loaded machine takes seconds.
    """
    offsets = [None, None, "-5m", "+7m", "+13m", "-11m"]
    specs = []
    for i in range(count):
        mode: Mode = "api" if i % 2 == 0 else "cli"
        specs.append(
            ContenderSpec(
                name=f"{mode}{i // 2 + 1}",
                mode=mode,
                ttl=8.0 if mode == "api" else 15.0,
                faketime=offsets[i % len(offsets)],
            )
        )
    return specs


def extra_contenders(runners: int = 1, readers: int = 2) -> list[ContenderSpec]:
    """``lock run`` contenders (a process tree as the critical section) and unfenced
    readers (``state get`` in a loop, no lock), which make register operations overlap."""
    specs = [ContenderSpec(name=f"run{i + 1}", mode="run", ttl=8.0) for i in range(runners)]
    specs += [ContenderSpec(name=f"read{i + 1}", mode="reader", ttl=8.0) for i in range(readers)]
    return specs


class _Emitter:
    """Events go to stdout as JSON lines; the harness reads them as they come."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, **fields}, default=str)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


@dataclass
class _WorkerArgs:
    name: str
    generation: int
    mode: Mode
    ttl: float
    wait: float
    deployment: str
    stop_file: str
    deadline: float
    seed: int
    timeout: float
    # The member set may change under the contender (the membership faults): a command
    # that finds this machine's record out of date (exit 5, before the change made here
    # is recorded) is then expected, and retried.
    member_changes: bool = False
    # While this file exists no new acquisition starts (one already waiting goes on):
    # a member change, which waits for the lock like anyone, gets a turn.
    hold_off_file: str = ""

    @property
    def instance(self) -> str:
        return f"{self.name}g{self.generation}"


class _Contender:
    def __init__(self, args: _WorkerArgs, emit: _Emitter) -> None:
        self.args = args
        self.emit = emit
        self.instance = args.instance
        self.rng = random.Random(f"{args.seed}:{self.instance}")
        self.values = 0
        self.ops = 0
        self.margin = STEP_MARGIN_S.get(args.mode, 0.5)
        # Exit 5 (this machine's record of the member set is out of date) is expected
        # only while the member set changes.
        self.stale = {5} if args.member_changes else set()
        self.reopen = False

    def stopping(self) -> bool:
        return os.path.exists(self.args.stop_file) or machine_clock() > self.args.deadline

    def held_off(self) -> bool:
        """Whether the harness asks for no new acquisition now (see ``hold_off_file``)."""
        return bool(self.args.hold_off_file) and os.path.exists(self.args.hold_off_file) and not self.stopping()

    def next_value(self) -> str:
        self.values += 1
        return f"{self.instance}n{self.values}"

    def begin(self, kind: str, value: str | None) -> str:
        self.ops += 1
        op = f"{self.instance}:{self.ops}"
        self.emit("invoke", op=op, kind=kind, value=value, t=machine_clock())
        return op

    def end(self, op: str, status: str, value: Any = None) -> None:
        self.emit("complete", op=op, status=status, value=value, t=machine_clock())

    def problem(self, what: str, detail: str) -> None:
        self.emit("problem", what=what, detail=detail)

    def stat(self, name: str) -> None:
        self.emit("stat", name=f"{self.args.mode} {name}")

    def steps(self) -> int:
        return self.rng.randint(1, 3) if self.args.mode == "cli" else self.rng.randint(1, 4)


class _CliContender(_Contender):
    """Everything through the command line, one process per command."""

    def cli(self, *argv: str, allowed: set[int], timeout: float = 120.0) -> tuple[int | None, str]:
        command = [sys.executable, "-m", "coordinator", *argv]
        shown = "coordinator " + " ".join(argv)
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self.problem("hung", f"`{shown}` did not finish within {timeout:g}s")
            return None, ""
        if proc.returncode not in allowed:
            self.problem(f"exit {proc.returncode}", f"`{shown}`: {_tail(proc.stderr)}")
        elif "Traceback (most recent call last)" in proc.stderr:
            self.problem("traceback", f"`{shown}` (exit {proc.returncode}): {_tail(proc.stderr)}")
        return proc.returncode, proc.stdout

    def run(self) -> None:
        while not self.stopping():
            if self.held_off():
                time.sleep(0.2)
                continue
            self.iteration()
            time.sleep(self.rng.uniform(0.05, 0.5))

    def iteration(self) -> None:
        a = self.args
        # Validity is counted from just before the command starts, so waiting inside it
        # would use the lease up: wait a little there, and retry out here.
        wait = self.rng.choice((0.0, 2.0, 5.0))
        asked = machine_clock()
        rc, out = self.cli(
            "-o", "json", "lock", "acquire", a.deployment,
            "--ttl", f"{a.ttl:g}s", "--wait", f"{wait:g}s",
            "--holder", self.instance, "--reason", "torture",
            allowed={0, 3, 4} | self.stale, timeout=wait + 120,
        )  # fmt: skip
        self.stat(f"acquire exit {rc}")
        if rc != 0:
            time.sleep(self.rng.uniform(0.5, 2.5))  # every attempt costs a process start
            return
        try:
            doc = json.loads(out)
            lock_id, token = str(doc["lock_id"]), int(doc["fencing_token"])
        except (ValueError, KeyError, TypeError) as err:
            self.problem("bad output", f"`lock acquire -o json` printed {out[:300]!r}: {err}")
            return
        try:
            self.critical(lock_id, token, asked + remaining_validity(a.ttl, 0.0))
        finally:
            self.cli(
                "lock", "release", a.deployment, "--lock-id", lock_id, "--holder", self.instance,
                allowed={0, 4, 6} | self.stale,
            )  # fmt: skip
        if not self.stopping() and self.rng.random() < 0.4:
            self.read()

    def critical(self, lock_id: str, token: int, valid_until: float) -> None:
        entered = machine_clock()
        if entered >= valid_until - self.margin:
            self.stat("validity gone before entry")
            return
        self.emit("enter", t=entered, token=token, valid_until=valid_until, lock_id=lock_id)
        try:
            for _ in range(self.steps()):
                if self.stopping() or machine_clock() >= valid_until - self.margin:
                    break
                action = self.rng.choices(("write", "read", "renew", "hold"), weights=(6, 2, 1, 1))[0]
                if action == "write":
                    self.write(lock_id)
                elif action == "read":
                    self.read()
                elif action == "renew":
                    asked = machine_clock()
                    rc, _ = self.cli(
                        "-o", "json", "lock", "renew", self.args.deployment,
                        "--lock-id", lock_id, "--holder", self.instance,
                        allowed={0, 4, 6} | self.stale,
                    )  # fmt: skip
                    self.stat(f"renew exit {rc}")
                    if rc != 0:
                        break  # lost, or not known to be held: leave
                    valid_until = max(valid_until, asked + remaining_validity(self.args.ttl, 0.0))
                    self.emit("valid", valid_until=valid_until)
                else:
                    time.sleep(max(0.0, min(self.rng.uniform(0.1, 1.0), valid_until - machine_clock())))
        finally:
            left = machine_clock()
            self.emit("exit", t=min(left, valid_until), overstay=left > valid_until)

    def write(self, lock_id: str) -> None:
        value = self.next_value()
        op = self.begin("write", value)
        rc, _ = self.cli(
            "-o", "json", "state", "set", self.args.deployment, f"{STATE_KEY}={value}", "--lock-id", lock_id,
            allowed={0, 3, 4, 6} | self.stale,
        )  # fmt: skip
        if rc == 5:
            self.stat("write exit 5")
        # Exit 5 counts as unknown: nothing is assumed about what it did not write.
        self.end(op, "ok" if rc == 0 else "fail" if rc in (3, 6) else "unknown")

    def read(self) -> None:
        op = self.begin("read", None)
        rc, out = self.cli("-o", "json", "state", "get", self.args.deployment, allowed={0, 4} | self.stale)
        if rc != 0:
            self.end(op, "fail")
            return
        try:
            doc = json.loads(out)
        except ValueError:
            self.problem("bad output", f"`state get -o json` printed {out[:300]!r}")
            self.end(op, "fail")
            return
        if not isinstance(doc, dict):
            self.problem("bad output", f"`state get -o json` printed a {type(doc).__name__}, not a mapping")
            self.end(op, "fail")
            return
        self.end(op, "ok", doc.get(STATE_KEY))


class _ApiContender(_Contender):
    """Everything through the Python API, in one long-lived process."""

    async def run(self) -> None:
        import anyio

        from coordinator.api import Coordinator

        while not self.stopping():
            # Opened again when this machine's record of the member set went out of date.
            self.reopen = False
            async with Coordinator.from_config(timeout=self.args.timeout) as c:
                while not self.stopping() and not self.reopen:
                    if self.held_off():
                        await anyio.sleep(0.2)
                        continue
                    await self.iteration(c)
                    # In-process contenders are quick to come back: give the others a chance.
                    await anyio.sleep(self.rng.uniform(0.2, 1.2))

    def stale_record(self, where: str, err: Exception) -> bool:
        """Whether ``err`` says this machine's record of the member set is out of date
        while the member set may change: then the contender reads its config again."""
        from coordinator.errors import MembershipError

        if not (self.args.member_changes and isinstance(err, MembershipError)):
            return False
        self.stat(f"{where} exit 5")
        self.reopen = True
        return True

    async def iteration(self, c: Coordinator) -> None:
        from coordinator.errors import CoordinatorError, LockHeldError, NoQuorumError

        a = self.args
        # A new state client each time: the member set may have changed since the last.
        state = c.state(a.deployment)
        # Mostly short waits: a contender always waiting wins every release, and the
        # command-line ones (a process start per attempt) would hardly ever get a turn.
        wait = self.rng.choice((0.0, 2.0, 5.0, a.wait))
        try:
            async with c.lock(a.deployment, ttl=a.ttl, wait=wait, holder=self.instance, reason="torture") as held:
                self.stat("acquire exit 0")
                await self.critical(state, held)
        except LockHeldError:
            self.stat("acquire exit 3")
        except NoQuorumError:
            self.stat("acquire exit 4")
        except CoordinatorError as err:
            if self.stale_record("acquire", err):
                return
            self.problem(f"exit {int(err.exit_code)}", f"Coordinator.lock: {type(err).__name__}: {err.message[:800]}")
        except Exception as err:
            self.problem("internal", f"Coordinator.lock raised {type(err).__name__}: {_tail(traceback.format_exc())}")
        if not self.stopping() and self.rng.random() < 0.4:
            await self.read(state)

    async def critical(self, state: StateClient, held: HeldLock) -> None:
        import anyio

        def valid_until() -> float:
            return boot_to_machine(held.result.valid_until())

        entered = machine_clock()
        until = valid_until()
        if not held.valid or entered >= until - self.margin:
            self.stat("validity gone before entry")
            return
        self.emit("enter", t=entered, token=held.fencing_token, valid_until=until, lock_id=held.lock_id)
        reported = until

        async def report_renewals() -> None:
            # Renewals run in the background: tell the harness at once how far they
            # extended validity, so that a holder killed just after one is judged right.
            nonlocal reported
            while True:
                await anyio.sleep(0.1)
                now = valid_until()
                if now > reported + 0.01:
                    reported = now
                    self.emit("valid", valid_until=now)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(report_renewals)
                try:
                    for _ in range(self.steps()):
                        if self.stopping() or not held.valid or machine_clock() >= valid_until() - self.margin:
                            break
                        action = self.rng.choices(("write", "burst", "read", "hold"), weights=(5, 2, 2, 1))[0]
                        if action == "write":
                            await self.write(state, held)
                        elif action == "burst":
                            # Several writes of one holder at once: the register must
                            # order them, and they overlap each other and the readers.
                            async with anyio.create_task_group() as burst:
                                for _ in range(self.rng.randint(2, 3)):
                                    burst.start_soon(self.write, state, held)
                        elif action == "read":
                            await self.read(state)
                        else:
                            hold = min(self.rng.uniform(0.05, 0.6), valid_until() - machine_clock())
                            await anyio.sleep(max(0.0, hold))
                finally:
                    tg.cancel_scope.cancel()
        finally:
            left = machine_clock()
            until = valid_until()
            self.emit("exit", t=min(left, until), overstay=left > until)

    async def write(self, state: StateClient, held: HeldLock) -> None:
        import anyio

        from coordinator.errors import CoordinatorError, LockHeldError, NoQuorumError, StateConflictError

        value = self.next_value()
        op = self.begin("write", value)
        status = "unknown"
        try:
            with anyio.fail_after(120):
                await state.set({STATE_KEY: value}, lock=held)
            status = "ok"
        except NoQuorumError:
            status = "unknown"
        except (StateConflictError, LockHeldError):
            status = "fail"
        except TimeoutError:
            self.problem("hung", "state.set did not finish within 120 s")
        except CoordinatorError as err:
            # Out of date: unknown, nothing is assumed about what it did not write.
            if not self.stale_record("write", err):
                self.problem(f"exit {int(err.exit_code)}", f"state.set: {type(err).__name__}: {err.message[:800]}")
        except Exception as err:
            self.problem("internal", f"state.set raised {type(err).__name__}: {_tail(traceback.format_exc())}")
        self.end(op, status)

    async def read(self, state: StateClient) -> None:
        import anyio

        from coordinator.errors import CoordinatorError, NoQuorumError

        op = self.begin("read", None)
        try:
            with anyio.fail_after(120):
                data = await state.get()
        except NoQuorumError:
            self.end(op, "fail")
            return
        except TimeoutError:
            self.problem("hung", "state.get did not finish within 120 s")
            self.end(op, "fail")
            return
        except CoordinatorError as err:
            if not self.stale_record("read", err):
                self.problem(f"exit {int(err.exit_code)}", f"state.get: {type(err).__name__}: {err.message[:800]}")
            self.end(op, "fail")
            return
        except Exception as err:
            self.problem("internal", f"state.get raised {type(err).__name__}: {_tail(traceback.format_exc())}")
            self.end(op, "fail")
            return
        if not isinstance(data, dict):
            self.problem("bad value", f"state.get returned a {type(data).__name__}, not a mapping")
            self.end(op, "fail")
            return
        self.end(op, "ok", data.get(STATE_KEY))


class _ReaderContender(_ApiContender):
    """Reads the state in a loop, without the lock: reads overlap every kind of write."""

    async def run(self) -> None:
        import anyio

        from coordinator.api import Coordinator

        while not self.stopping():
            self.reopen = False
            async with Coordinator.from_config(timeout=self.args.timeout) as c:
                state = c.state(self.args.deployment)
                while not self.stopping() and not self.reopen:
                    await self.read(state)
                    await anyio.sleep(self.rng.uniform(0.2, 1.0))


# The critical section of a `lock run` contender: a shell that starts children, one of
# them left running when the shell exits (nobody waits for it). Every process appends
# marks "PID start|tick|end READING" (the machine clock, from /proc/uptime, which is
# CLOCK_BOOTTIME in centiseconds) and the shell the fencing token it was given; the
# section is judged from the first mark to the last (checkers.section_from_marks).
TREE_SCRIPT = r"""#!/bin/sh
m=$1; n=$2; role=${3:-top}
mark() { read -r up _rest < /proc/uptime; echo "$$ $1 $up" >> "$m"; }
if [ "$role" = top ]; then
  echo "$$ token ${COORDINATOR_FENCING_TOKEN:-none}" >> "$m"
fi
mark start
if [ "$role" = top ]; then
  sh "$0" "$m" "$n" child &
  sh "$0" "$m" $(( n / 2 + 1 )) child &
  ( sh "$0" "$m" $(( n + 10 )) child & )
fi
i=0
while [ "$i" -lt "$n" ]; do sleep 0.2; mark tick; i=$((i + 1)); done
if [ "$role" = top ]; then wait; fi
mark end
"""
TREE_TICK_S = 0.2


def _alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (an orphan's zombie may linger
    where nothing reaps orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


class _RunContender(_Contender):
    """``coordinator lock run`` around a process tree; the section is the tree's life."""

    def run(self) -> None:
        script = Path("tree.sh").resolve()
        script.write_text(TREE_SCRIPT)
        while not self.stopping():
            if self.held_off():
                time.sleep(0.2)
                continue
            self.iteration(script)
            time.sleep(self.rng.uniform(0.1, 1.0))

    def iteration(self, script: Path) -> None:
        a = self.args
        self.values += 1
        marks = Path(f"marks-{self.values}.txt").resolve()
        marks.write_text("")
        # Mostly short trees (the lock is busy while they run); a few outlive several
        # renewals. The sigkill-lock-run fault starts a long one of its own.
        long = self.rng.random() < 0.1
        ticks = self.rng.randint(45, 65) if long else self.rng.randint(2, 10)
        wait = self.rng.choice((2.0, 5.0, 10.0))
        errors = Path(f"lockrun-{self.values}.err").resolve()
        command = [
            sys.executable, "-m", "coordinator", "lock", "run", a.deployment,
            "--ttl", f"{a.ttl:g}s", "--wait", f"{wait:g}s", "--holder", self.instance,
            "--reason", "torture", "--grace", "1s",
            "--", "sh", str(script), str(marks), str(ticks),
        ]  # fmt: skip
        with errors.open("w") as err:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.emit("lrun", pid=proc.pid, marks=str(marks), ticks=ticks)
        try:
            rc = proc.wait(timeout=wait + ticks * TREE_TICK_S * 3 + 180)
        except subprocess.TimeoutExpired:
            self.problem("hung", f"`lock run` did not finish ({' '.join(command[2:])})")
            proc.kill()
            rc = proc.wait()
        self.emit("lrun_end", pid=proc.pid, rc=rc)
        text = errors.read_text(errors="replace")
        if rc not in {0, 3, 4, 7, -signal.SIGKILL} | self.stale:
            self.problem(f"exit {rc}", f"`lock run`: {_tail(text)}")
        elif "Traceback (most recent call last)" in text:
            self.problem("traceback", f"`lock run` (exit {rc}): {_tail(text)}")
        self.stat(f"lock run exit {rc}")
        # The section lasts until the last process of the tree is gone.
        until = machine_clock() + ticks * TREE_TICK_S + 60
        while True:
            pids = {int(line.split()[0]) for line in marks.read_text().splitlines() if line.split()[:1] != []
                    and line.split()[0].isdigit()}  # fmt: skip
            if not any(_alive(pid) for pid in pids) or machine_clock() > until:
                break
            time.sleep(0.1)
        if any(_alive(pid) for pid in pids):
            self.problem("tree outlived", f"processes of a `lock run` tree still ran a minute after it: {sorted(pids)}")
        from faults.checkers import section_from_marks

        tree = section_from_marks(marks.read_text().splitlines())
        if tree is None:
            return
        if tree.token is None:
            self.problem("no token", "the child of `lock run` had no COORDINATOR_FENCING_TOKEN")
            return
        self.emit("tree", token=tree.token, enter=tree.enter, exit=tree.exit, processes=tree.processes, rc=rc)


def worker_main(argv: Sequence[str]) -> int:
    """Entry point of one contender process (``python -m faults.workload worker``)."""
    parser = argparse.ArgumentParser(prog="workload worker")
    parser.add_argument("--name", required=True)
    parser.add_argument("--generation", type=int, default=0)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--wait", type=float, default=20.0)
    parser.add_argument("--deployment", default=DEPLOYMENT)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--deadline", type=float, required=True, help="on the machine clock")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--member-changes", action="store_true")
    parser.add_argument("--hold-off-file", default="")
    ns = parser.parse_args(list(argv))
    args = _WorkerArgs(**vars(ns))
    emit = _Emitter()
    emit("start", pid=os.getpid(), mode=args.mode, faketime=os.environ.get("FAKETIME"), wall=time.time())
    try:
        if args.mode == "cli":
            _CliContender(args, emit).run()
        elif args.mode == "run":
            _RunContender(args, emit).run()
        elif args.mode == "reader":
            import anyio

            anyio.run(_ReaderContender(args, emit).run)
        else:
            import anyio

            anyio.run(_ApiContender(args, emit).run)
    except Exception as err:
        emit("problem", what="contender crashed", detail=f"{type(err).__name__}: {_tail(traceback.format_exc(), 12)}")
        return 1
    emit("done")
    return 0


# ------------------------------------------------------------------------ histories


@dataclass
class _Section:
    process: str
    mode: str
    token: int
    enter: float
    valid_until: float
    exit: float | None = None
    how: str = ""  # left | clipped (stayed past validity) | killed | vanished | tree | broken


class Recorder:
    """Collects the contenders' events into lock sections and register operations.

    Thread-safe: one reader thread per contender feeds it.
    """

    def __init__(self, event_log: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._log = event_log.open("a") if event_log is not None else None
        self.sections: list[_Section] = []
        self.inside: dict[str, _Section] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.in_flight: dict[str, set[str]] = {}
        self.problems: list[str] = []
        self.stats: Counter[str] = Counter()
        self.modes: dict[str, str] = {}
        self.lruns: dict[str, dict[str, Any]] = {}  # instance -> the `lock run` it is in
        self.breaks: list[tuple[float, float]] = []  # successful `lock break`s: (invoked, completed)

    def handle(self, instance: str, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        with self._lock:
            if self._log is not None:
                self._log.write(json.dumps({"instance": instance, "at": machine_clock(), **event}) + "\n")
                self._log.flush()
            try:
                self._handle(instance, kind, event)
            except (KeyError, TypeError, ValueError) as err:
                self.problems.append(f"{instance}: malformed event {event!r}: {err}")

    def _handle(self, instance: str, kind: Any, event: dict[str, Any]) -> None:
        if kind == "start":
            self.modes[instance] = str(event.get("mode"))
        elif kind == "enter":
            self.inside[instance] = _Section(
                instance,
                self.modes.get(instance, "?"),
                int(event["token"]),
                float(event["t"]),
                float(event["valid_until"]),
            )
        elif kind == "valid":
            renewed = self.inside.get(instance)
            if renewed is not None:
                renewed.valid_until = max(renewed.valid_until, float(event["valid_until"]))
        elif kind == "exit":
            left = self.inside.pop(instance, None)
            if left is not None:
                left.exit = max(left.enter, float(event["t"]))
                left.how = "clipped" if event.get("overstay") else "left"
                self.sections.append(left)
        elif kind == "invoke":
            op_id = str(event["op"])
            self.ops[op_id] = {
                "process": instance,
                "kind": str(event["kind"]),
                "value": event.get("value"),
                "invoke": float(event["t"]),
                "complete": None,
                "status": "unknown",
            }
            self.in_flight.setdefault(instance, set()).add(op_id)
        elif kind == "complete":
            op_id = str(event["op"])
            op = self.ops[op_id]
            op["status"] = str(event["status"])
            op["complete"] = float(event["t"])
            if op["kind"] == "read":
                op["value"] = event.get("value")
            self.in_flight.get(instance, set()).discard(op_id)
            self.stats[f"{self.modes.get(instance, '?')} {op['kind']} {op['status']}"] += 1
        elif kind == "tree":
            t_in, t_out = float(event["enter"]), float(event["exit"])
            tree = _Section(instance, "run", int(event["token"]), t_in, t_out, max(t_in, t_out), "tree")
            self.sections.append(tree)
            self.stats[f"run tree of {int(event['processes'])} processes"] += 1
        elif kind == "lrun":
            self.lruns[instance] = {
                "pid": int(event["pid"]),
                "marks": str(event["marks"]),
                "ticks": int(event["ticks"]),
            }
        elif kind == "lrun_end":
            self.lruns.pop(instance, None)
        elif kind == "problem":
            self.problems.append(f"{instance}: {event.get('what')}: {event.get('detail')}")
        elif kind == "stat":
            self.stats[str(event["name"])] += 1

    def gone(self, instance: str, when: float, how: str) -> None:
        """The contender died (``how``: killed | vanished): close what it had open."""
        with self._lock:
            section = self.inside.pop(instance, None)
            if section is not None:
                section.exit = max(section.enter, min(when, section.valid_until))
                section.how = how
                self.sections.append(section)
            for op_id in self.in_flight.pop(instance, set()):
                op = self.ops[op_id]
                op["status"], op["complete"] = "unknown", None
                self.stats[f"{self.modes.get(instance, '?')} {op['kind']} unknown ({how})"] += 1

    def add_op(self, op: dict[str, Any]) -> None:
        with self._lock:
            self.ops[f"{op['process']}:{len(self.ops)}"] = op

    def holders_inside(self) -> list[str]:
        with self._lock:
            return list(self.inside)

    def trees_running(self) -> dict[str, dict[str, Any]]:
        """``lock run``s whose tree has started (it wrote a mark): the lock is held."""
        with self._lock:
            runs = dict(self.lruns)
        started = {}
        for instance, run in runs.items():
            with contextlib.suppress(OSError):
                if " start " in Path(run["marks"]).read_text():
                    started[instance] = run
        return started

    def add_break(self, invoked: float, completed: float) -> None:
        with self._lock:
            self.breaks.append((invoked, completed))

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None


# ---------------------------------------------------------------------------- report


@dataclass
class Report:
    """What happened, and the verdict."""

    sections: list[dict[str, Any]]
    operations: list[dict[str, Any]]
    faults: Counter[str]
    checks: list[CheckResult]
    problems: list[str]
    stats: Counter[str]
    seconds: float = 0.0
    seed: int = 0
    clusters: int = 0
    workdir: Path | None = None
    kinds: Sequence[str] = ()
    min_each: int = 0
    breaks: int = 0
    workload_seconds: float = 0.0
    ha: str = ""  # HA clusters: what their front proxies counted
    members: str = ""  # the member set at the end, when it changed

    @property
    def kinds_short(self) -> list[str]:
        """Fault kinds injected fewer times than asked for."""
        return [k for k in self.kinds if self.faults[k] < self.min_each]

    def history(self) -> HistoryStats:
        from faults.checkers import history_stats

        return history_stats(self.operations)

    @property
    def violations(self) -> list[str]:
        found = [v.message for c in self.checks for v in c.violations]
        return found + self.problems

    @property
    def undecided(self) -> list[str]:
        return [f"{c.check}: {c.undecided}" for c in self.checks if c.undecided]

    @property
    def passed(self) -> bool:
        return not self.violations and not self.undecided and not self.kinds_short

    def summary_line(self) -> str:
        kinds = list(self.kinds) or sorted(self.faults)
        per_kind = ", ".join(f"{k} {self.faults[k]}" for k in kinds)
        return (
            f"{len(self.sections)} lock sections, {len(self.operations)} state ops, "
            f"{sum(self.faults.values())} faults injected ({per_kind}), {len(self.violations)} violations"
        )

    def render(self) -> str:
        how = Counter(str(s["how"]) for s in self.sections)
        modes = Counter(str(s["mode"]) for s in self.sections)
        ops = Counter(f"{o['kind']} {o['status']}" for o in self.operations)
        lines = [
            f"seed {self.seed}, {self.clusters} clusters, {self.seconds:.0f}s of workload",
            "lock sections: "
            + ", ".join(f"{k} {v}" for k, v in sorted(modes.items()))
            + "; ended by "
            + ", ".join(f"{k} {v}" for k, v in sorted(how.items())),
            "state ops: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())),
            "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())),
            "contender outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())),
            self.history().summary(),
        ]
        if self.workload_seconds > 0:
            per_minute = len(self.sections) / (self.workload_seconds / 60.0)
            enters = sorted(float(s["enter"]) for s in self.sections)
            gap = max((b - a for a, b in itertools.pairwise(enters)), default=0.0)
            lines.append(
                f"throughput: {per_minute:.1f} lock sections per minute over {self.workload_seconds:.0f}s "
                f"(about {per_minute * 60:.0f} an hour); {self.breaks} broken by an operator; "
                f"longest time between two sections {gap:.0f}s"
            )
        if self.ha:
            lines.append(self.ha)
        if self.members:
            lines.append(self.members)
        if self.kinds_short:
            lines.append(f"INCOMPLETE: injected fewer than {self.min_each} times: {', '.join(self.kinds_short)}")
        for check in self.checks:
            extra = f" ({check.states_explored} states, {check.segments} segments)" if check.segments else ""
            lines.append(check.summary() + extra)
        if self.problems:
            lines.append(f"problems: {len(self.problems)}")
            lines += [f"  - {p}" for p in self.problems[:50]]
        for text in self.undecided:
            lines.append(f"UNDECIDED: {text}")
        if self.workdir is not None:
            lines.append(f"artifacts kept in {self.workdir}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- options


@dataclass
class TortureOptions:
    """How big, how long, how random."""

    clusters: int = 3
    seconds: float = 100.0
    seed: int = 1
    contenders: list[ContenderSpec] = field(default_factory=default_contenders)
    request_timeout: float = 2.0
    wait: float = 20.0
    workdir: Path | None = None  # kept afterwards; default: a temporary directory, removed
    fault_gap: tuple[float, float] = (1.0, 3.0)  # quiet time between fault episodes, s
    fault_length: tuple[float, float] = (2.0, 6.0)  # how long most faults last, s
    progress: Progress | None = None
    kinds: Sequence[str] | None = None  # fault kinds to inject (default: every one, FAULT_KINDS)
    min_each: int = 1  # the run goes on past ``seconds`` until every kind ran this often...
    overtime: float = 300.0  # ...for at most this long
    max_ttl: float = 15.0  # the deployment's --max-ttl: how long a deleted Lease blocks
    long_stop: float = 60.0  # the longest SIGSTOP of a holder (a long one is its TTL + 3 s)
    # kube-apiservers per cluster: 2 starts the HA sandbox (two on one etcd behind a front
    # proxy, toxiproxy in front of that), one of which answers ``date_offset`` seconds off.
    apiservers: int = 1
    date_offset: float = 0.0
    # Clusters started besides the members, for the membership faults to add (default:
    # one when a membership kind is in the schedule, else none).
    spares: int | None = None

    @property
    def member_changes(self) -> bool:
        return any(k in _MEMBER_FAULTS for k in (self.kinds or FAULT_KINDS))

    @property
    def spare_clusters(self) -> int:
        if self.spares is not None:
            return self.spares
        return 1 if self.member_changes else 0


def _say(progress: Progress | None, started: float) -> Progress:
    def say(text: str) -> None:
        if progress is not None:
            progress(f"[{machine_clock() - started:7.1f}s] {text}")

    return say


# ------------------------------------------------------------------------------ rig


class _Rig:
    """Sandbox clusters behind toxiproxy, and a local config that reaches them."""

    def __init__(
        self,
        workdir: Path,
        n: int,
        say: Progress,
        max_ttl: float = 15.0,
        *,
        spares: int = 0,
        apiservers: int = 1,
        date_offset: float = 0.0,
    ) -> None:
        self.workdir = workdir
        self.n = n
        self.spares = spares
        self.apiservers = apiservers
        self.date_offset = date_offset
        # Cluster indices (1-based) of the deployment's members now; the membership
        # faults change it. Every other cluster started is a spare.
        self.members = list(range(1, n + 1))
        self.max_ttl = max_ttl
        self.say = say
        self.sandbox: Sandbox | None = None
        self.toxiproxy: ToxiproxyServer | None = None
        self.proxies: list[Proxy] = []
        self.kubeconfig = workdir / "kubeconfig"
        self.config = workdir / "config" / "config.yaml"
        self.namespace = "torture-" + secrets.token_hex(3)

    def start(self) -> None:
        from coordinator import sandbox as sb
        from faults.toxiproxy import ToxiproxyServer

        sandbox_dir = self.workdir / "sandbox"
        self.sandbox = sb.Sandbox(sandbox_dir)  # known before start-up, to be stopped even if it fails
        total = self.n + self.spares
        ha = (
            f", {self.apiservers} kube-apiservers each (date offset {self.date_offset:g}s)"
            if self.apiservers > 1
            else ""
        )
        self.say(f"starting {total} sandbox clusters ({self.spares} spare){ha} in {sandbox_dir}")
        ha_args: dict[str, Any] = {"apiservers": self.apiservers, "date_offset": self.date_offset}
        sb.up(
            total,
            sandbox_dir,
            on_progress=lambda msg: self.say(f"sandbox: {msg}"),
            **(ha_args if self.apiservers > 1 else {}),  # (older sandboxes start one kube-apiserver only)
        )
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.toxiproxy = ToxiproxyServer.start(log_path=self.workdir / "logs" / "toxiproxy.log")
        for c in self.sandbox.record.clusters:
            self.proxies.append(self.toxiproxy.create_proxy(f"apiserver-{c.index}", ("127.0.0.1", c.apiserver_port)))
        self._write_kubeconfig()
        self._connect()

    def _write_kubeconfig(self) -> None:
        import yaml

        assert self.sandbox is not None
        doc = yaml.safe_load(self.sandbox.kubeconfig.read_text())
        ports = {f"sandbox-{i}": proxy.port for i, proxy in enumerate(self.proxies, start=1)}
        for entry in doc["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{ports[entry['name']]}"
        fd = os.open(self.kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(doc, fh, sort_keys=False)

    def _connect(self) -> None:
        import anyio

        from coordinator.admin import connect_cluster, create_deployment
        from coordinator.clusters import ClusterSet
        from coordinator.config import ConfigStore

        store = ConfigStore(self.config)
        names = [f"c{i}" for i in range(1, self.n + 1)]
        spares = [f"c{i}" for i in range(self.n + 1, self.n + self.spares + 1)]

        extra: dict[str, Any] = {}
        if "max_ttl_s" in inspect.signature(create_deployment).parameters:
            extra["max_ttl_s"] = self.max_ttl  # how long a vanished Lease blocks the lock

        async def setup() -> None:
            for i, name in enumerate(names + spares, start=1):
                await connect_cluster(store, name, f"sandbox-{i}", str(self.kubeconfig), timeout=15)
            cs = ClusterSet(store.load(), timeout=15)
            try:
                await create_deployment(store, cs, DEPLOYMENT, self.namespace, names, "configmap", **extra)
            finally:
                await cs.aclose()

        anyio.run(setup)
        # A spare is prepared as an operator would before adding it: the namespace exists.
        assert self.sandbox is not None
        for i in range(self.n + 1, self.n + self.spares + 1):
            self.sandbox.admin(i, timeout=15).create(
                "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
            )
        extra_text = f"; spares {', '.join(spares)}" if spares else ""
        where = f"on {', '.join(names)}{extra_text}"
        self.say(f"deployment {DEPLOYMENT} in namespace {self.namespace} {where} (through toxiproxy)")

    def read_members(self) -> tuple[list[int], list[int] | None]:
        """The members (and the joint target, if a change is in progress) that the local
        config records, as cluster indices."""
        from coordinator.config import ConfigStore

        rec = ConfigStore(self.config).load().deployments[DEPLOYMENT]
        members = sorted(int(name[1:]) for name in rec.clusters)
        joint = sorted(int(name[1:]) for name in rec.joint) if rec.joint is not None else None
        return members, joint

    def ha_summary(self) -> str:
        """For HA clusters: the requests each kube-apiserver served through the front
        proxy, and how many time stamps the skewed one's answers had shifted."""
        if self.apiservers < 2 or self.sandbox is None:
            return ""
        served, shifted = [], 0
        for i in range(1, self.n + self.spares + 1):
            try:
                stats = self.sandbox.proxy_stats(i)
            except Exception as err:  # the report says so; the run itself is judged elsewhere
                served.append(f"c{i} unknown ({type(err).__name__})")
                continue
            served.append(f"c{i} " + "/".join(str(b["requests"]) for b in stats["backends"]))
            shifted += int(stats.get("stamps_rewritten", 0))
        return (
            f"HA: {self.apiservers} kube-apiservers per cluster, one {self.date_offset:+g}s off; requests served "
            f"{', '.join(served)}; {shifted} time stamps shifted"
        )

    def heal(self) -> None:
        if self.toxiproxy is not None and self.toxiproxy.running:
            self.toxiproxy.reset()
        if self.sandbox is not None and self.sandbox.exists:
            self.sandbox.heal()

    def stop(self) -> None:
        try:
            if self.toxiproxy is not None:
                self.toxiproxy.stop()
        finally:
            if self.sandbox is not None:
                self.sandbox.down(grace=5.0)


# ------------------------------------------------------------------------ processes


@dataclass
class _Worker:
    spec: ContenderSpec
    generation: int
    proc: subprocess.Popen[str]
    log: IO[bytes]
    reader: threading.Thread | None = None
    killed: bool = False
    paused: bool = False
    done: bool = False
    reaped: bool = False

    @property
    def instance(self) -> str:
        return f"{self.spec.name}g{self.generation}"


class _Workers:
    """The contender processes: started, watched, frozen, killed, replaced, stopped."""

    def __init__(self, opts: TortureOptions, rig: _Rig, recorder: Recorder, deadline: float, say: Progress) -> None:
        self.opts = opts
        self.rig = rig
        self.recorder = recorder
        self.deadline = deadline
        self.say = say
        self.stop_file = rig.workdir / "stop"
        self.hold_off_file = rig.workdir / "hold-off"
        self.all: list[_Worker] = []
        self.live: dict[str, _Worker] = {}  # spec name -> current worker
        self.faketime = shutil.which("faketime")

    def _environ(self, instance: str, config: Path) -> dict[str, str]:
        import coordinator

        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("COORDINATOR_LOCK_ID", "COORDINATOR_HOLDER", "COORDINATOR_CONFIG", "COORDINATOR_TIMEOUT")
            and not k.startswith(("FAKETIME", "LD_PRELOAD"))
        }
        root = str(Path(coordinator.__file__).resolve().parent.parent)
        env.update(
            {
                "COORDINATOR_CONFIG": str(config),
                "KUBECONFIG": str(self.rig.kubeconfig),
                "COORDINATOR_TIMEOUT": f"{self.opts.request_timeout:g}s",
                "XDG_STATE_HOME": str(config.parent / "state"),
                "NO_COLOR": "1",
                "PYTHONUNBUFFERED": "1",
                # the package, and this harness (tests/faults) for the contender processes
                "PYTHONPATH": os.pathsep.join(p for p in (root, TESTS_DIR, os.environ.get("PYTHONPATH")) if p),
            }
        )
        return env

    def config_for(self, home: Path) -> Path:
        """The config file a process living in ``home`` uses."""
        if self.opts.member_changes:
            return self.rig.config
        config = home / "config.yaml"
        if not config.exists():
            shutil.copyfile(self.rig.config, config)
        return config

    def spawn(self, spec: ContenderSpec, generation: int = 0) -> _Worker:
        instance = f"{spec.name}g{generation}"
        home = self.rig.workdir / "contenders" / instance
        home.mkdir(parents=True, exist_ok=True)
        # Each contender is its own machine: its own copy of the config and lock records.
        # While members change, all of them are one machine, the one that makes the
        # changes: they share its config, which each change updates (a waiting acquire
        # follows it; the others read it again when told their record is out of date).
        config = self.config_for(home)
        prefix: list[str] = []
        if spec.faketime:
            if self.faketime is None:
                self.say(f"faketime is not installed: {instance} runs on the real clock")
            else:
                prefix = [self.faketime, "-f", spec.faketime]
        command = [
            *prefix, sys.executable, "-m", "faults.workload", "worker",
            "--name", spec.name, "--generation", str(generation), "--mode", spec.mode,
            "--ttl", f"{spec.ttl:g}", "--wait", f"{self.opts.wait:g}", "--deployment", DEPLOYMENT,
            "--stop-file", str(self.stop_file), "--deadline", f"{self.deadline:.3f}",
            "--seed", str(self.opts.seed), "--timeout", f"{self.opts.request_timeout:g}",
            *(["--member-changes", "--hold-off-file", str(self.hold_off_file)] if self.opts.member_changes else []),
        ]  # fmt: skip
        log = (self.rig.workdir / "logs" / f"{instance}.log").open("ab")
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self._environ(instance, config),
            cwd=home,
            start_new_session=True,  # its own process group: it and its commands are signalled together
        )
        worker = _Worker(spec, generation, proc, log)
        worker.reader = threading.Thread(target=self._read, args=(worker,), name=f"events-{instance}", daemon=True)
        self.all.append(worker)
        self.live[spec.name] = worker
        worker.reader.start()
        clock = f", faketime {spec.faketime}" if prefix else ""
        self.say(f"started {spec.mode} contender {instance} (ttl {spec.ttl:g}s{clock})")
        return worker

    def _read(self, worker: _Worker) -> None:
        assert worker.proc.stdout is not None
        for line in worker.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("ev") == "done":
                worker.done = True
            self.recorder.handle(worker.instance, event)

    def _signal(self, worker: _Worker, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.proc.pid, sig)

    def _reap(self, worker: _Worker, how: str, when: float | None = None) -> None:
        worker.proc.wait(timeout=30)
        stamp = machine_clock() if when is None else when
        if worker.reader is not None:
            worker.reader.join(timeout=15)
        worker.log.close()
        worker.reaped = True
        self.recorder.gone(worker.instance, stamp, how)

    def start_all(self) -> None:
        for spec in self.opts.contenders:
            self.spawn(spec)

    def holder_inside(self, rng: random.Random, within: float) -> _Worker | None:
        """A contender inside its critical section right now (waiting up to ``within``)."""
        until = machine_clock() + within
        while True:
            inside = set(self.recorder.holders_inside())
            candidates = [
                w for w in self.live.values() if w.instance in inside and not w.paused and w.proc.poll() is None
            ]
            if candidates:
                return rng.choice(candidates)
            if machine_clock() >= until:
                return None
            time.sleep(0.05)

    def kill(self, worker: _Worker) -> None:
        worker.killed = True
        self._signal(worker, signal.SIGKILL)
        worker.proc.wait(timeout=30)
        self._reap(worker, "killed", machine_clock())

    def replace(self, worker: _Worker) -> _Worker:
        return self.spawn(worker.spec, worker.generation + 1)

    def pause(self, worker: _Worker) -> None:
        worker.paused = True
        self._signal(worker, signal.SIGSTOP)

    def resume(self, worker: _Worker) -> None:
        self._signal(worker, signal.SIGCONT)
        worker.paused = False

    def check(self, replace: bool) -> None:
        """Notice contenders that ended on their own; a crash is a problem (and replaced)."""
        for worker in list(self.live.values()):
            if worker.reaped or worker.proc.poll() is None:
                continue
            self._reap(worker, "vanished")
            if not worker.done:
                self.recorder.problem(
                    f"{worker.instance}: the contender process ended unexpectedly (exit "
                    f"{worker.proc.returncode}); see {self.rig.workdir / 'logs' / (worker.instance + '.log')}"
                )
                if replace:
                    self.replace(worker)

    def stop_all(self, grace: float) -> None:
        self.stop_file.touch()
        for worker in self.live.values():
            if worker.paused:
                self.resume(worker)
        until = machine_clock() + grace
        while machine_clock() < until and any(w.proc.poll() is None for w in self.live.values()):
            time.sleep(0.2)
        for worker in self.live.values():
            if worker.reaped:
                continue
            if worker.proc.poll() is None:
                self.say(f"{worker.instance} did not stop within {grace:g}s: SIGKILL")
                self.kill(worker)
            else:
                self._reap(worker, "vanished")
                if not worker.done:
                    self.recorder.problem(
                        f"{worker.instance}: the contender process ended without finishing (exit "
                        f"{worker.proc.returncode}); see its log in {self.rig.workdir / 'logs'}"
                    )

    def kill_everything(self) -> None:
        """Last resort on the way out: no contender outlives the harness."""
        for worker in self.all:
            if worker.proc.poll() is None:
                self._signal(worker, signal.SIGCONT)
                self._signal(worker, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(timeout=10)
            with contextlib.suppress(Exception):
                worker.log.close()


# ---------------------------------------------------------------------------- faults


FAULT_KINDS = (
    "pause-minority",
    "pause-majority",
    "kill-apiserver",
    "latency",
    "cut-minority",
    "cut-majority",
    "lose-responses",
    "drop-requests",
    "sigkill-holder",
    "sigstop-holder",
    # Other clients of the Lease, while someone holds it.
    "annotate-lease",
    "apply-lease",
    "strip-managed-fields",
    "edit-lease-duration",
    # Objects deleted.
    "delete-lease-one",
    "delete-lease-all",
    "delete-state-one",
    "recreate-namespace",
    # Writes of the state rejected by an admission policy.
    "reject-writes-minority",
    "reject-writes-majority",
    # The operator and `lock run`.
    "break-holder",
    "sigkill-lock-run",
    # The member set changes (and comes back to its size) while contenders run.
    "add-member",
    "remove-member",
    "replace-member",
)
OTHER_MANAGER = "torture-other-client"


_OTHER_CLIENT_FAULTS = ("annotate-lease", "apply-lease", "strip-managed-fields", "edit-lease-duration")
_DELETION_FAULTS = ("delete-lease-one", "delete-lease-all", "delete-state-one", "recreate-namespace")
_MEMBER_FAULTS = ("add-member", "remove-member", "replace-member")
# Targeted schedules, not in the default rounds (``--kinds`` names them).
TARGETED_KINDS = ("split-write",)


class _Faults:
    """A seeded schedule of fault episodes; every episode undoes itself."""

    def __init__(self, rig: _Rig, workers: _Workers, rng: random.Random, say: Progress, opts: TortureOptions) -> None:
        self.rig = rig
        self.workers = workers
        self.rng = rng
        self.say = say
        self.gap = opts.fault_gap
        self.length = opts.fault_length
        self.kinds = tuple(opts.kinds) if opts.kinds else FAULT_KINDS
        self.min_each = opts.min_each
        self.long_stop = opts.long_stop
        self.collectors: list[threading.Thread] = []
        self.count: Counter[str] = Counter()
        self.serial = 0

    @property
    def sandbox(self) -> Sandbox:
        assert self.rig.sandbox is not None
        return self.rig.sandbox

    @property
    def n(self) -> int:
        """Members now (the membership faults change who, not how many, between episodes)."""
        return len(self.rig.members)

    @property
    def q(self) -> int:
        return quorum_size(self.n)

    def _clusters(self, k: int) -> list[int]:
        """``k`` of the current members, as cluster indices."""
        return sorted(self.rng.sample(self.rig.members, k))

    def _minority(self) -> list[int]:
        return self._clusters(self.rng.randint(1, self.n - self.q))

    def _majority(self) -> list[int]:
        return self._clusters(self.rng.randint(self.q, self.n))

    def _sleep(self, seconds: float) -> None:
        until = machine_clock() + seconds
        while True:
            left = until - machine_clock()
            if left <= 0:
                return
            time.sleep(min(left, 0.5))
            self.workers.check(replace=True)

    def short(self) -> list[str]:
        """Kinds injected fewer than ``min_each`` times so far."""
        return [k for k in self.kinds if self.count[k] < self.min_each]

    def run(self, end: float, overtime: float) -> None:
        """Episodes in shuffled rounds (every kind once per round) until ``end``; then
        on, up to ``overtime`` more seconds, until every kind ran ``min_each`` times
        (an episode that found nobody to act on does not count)."""
        bag: list[str] = []
        hard_end = end + overtime
        while True:
            now = machine_clock()
            if now >= hard_end or (now >= end and not self.short()):
                return
            if not bag:
                bag = list(self.kinds) if now < end else self.short()
                self.rng.shuffle(bag)
            kind = bag.pop()
            limit = end if now < end else hard_end
            room = max(1.0, limit - machine_clock())
            self.episode(kind, room)
            self.workers.check(replace=True)
            self._sleep(min(self.rng.uniform(*self.gap), max(0.0, limit - machine_clock())))

    def episode(self, kind: str, room: float) -> None:
        d = min(room, self.rng.uniform(*self.length))
        if kind in ("pause-minority", "pause-majority"):
            targets = self._minority() if kind == "pause-minority" else self._majority()
            self.say(f"fault: pause API servers {targets} for {d:.1f}s")
            self.count[kind] += 1
            paused: list[int] = []
            try:
                for i in targets:
                    self.sandbox.pause(i)
                    paused.append(i)
                self._sleep(d)
            finally:
                for i in paused:
                    self.sandbox.resume(i)
        elif kind == "kill-apiserver":
            targets = self._minority()
            self.say(f"fault: kill API servers {targets}, start them again after {d:.1f}s")
            self.count[kind] += 1
            try:
                for i in targets:
                    self.sandbox.kill(i)
                self._sleep(d)
            finally:
                for i in targets:
                    self.sandbox.start(i)
        elif kind == "latency":
            targets = self._clusters(self.rng.randint(1, self.n))
            ms = self.rng.randint(150, 1200)
            d = min(room, 2 * self.rng.uniform(*self.length))
            self.say(f"fault: {ms} ms latency to {targets} for {d:.1f}s")
            self.count[kind] += 1
            self._with_toxic(targets, d, lambda p: p.add_latency(ms, jitter_ms=ms // 4, name="torture-latency"))
        elif kind in ("cut-minority", "cut-majority"):
            targets = self._minority() if kind == "cut-minority" else self._majority()
            self.say(f"fault: cut connections to {targets} for {d:.1f}s")
            self.count[kind] += 1
            proxies = [self.rig.proxies[i - 1] for i in targets]
            try:
                for p in proxies:
                    p.disable()
                self._sleep(d)
            finally:
                for p in proxies:
                    p.enable()
        elif kind == "lose-responses":
            # Requests arrive and are applied; the answers never come back. Started while
            # someone is inside, so that a write's outcome is likely to be unknown.
            self.workers.holder_inside(self.rng, within=min(room, 8.0))
            targets = self._minority() if self.rng.random() < 0.5 else self._majority()
            self.say(f"fault: answers from {targets} are lost for {d:.1f}s")
            self.count[kind] += 1
            self._with_toxic(targets, d, lambda p: p.add_timeout(0, stream="downstream", name="torture-lose"))
        elif kind == "drop-requests":
            targets = self._minority() if self.rng.random() < 0.5 else self._majority()
            self.say(f"fault: requests to {targets} are dropped (connection closed after 1s) for {d:.1f}s")
            self.count[kind] += 1
            self._with_toxic(targets, d, lambda p: p.add_timeout(1000, stream="upstream", name="torture-drop"))
        elif kind == "sigkill-holder":
            worker = self.workers.holder_inside(self.rng, within=min(room, 15.0))
            if worker is None:
                self.say("fault: no holder inside its critical section to SIGKILL")
                return
            self.say(f"fault: SIGKILL {worker.instance} inside its critical section")
            self.count[kind] += 1
            self.workers.kill(worker)
            self.workers.replace(worker)
        elif kind == "sigstop-holder":
            worker = self.workers.holder_inside(self.rng, within=min(room, 15.0))
            if worker is None:
                self.say("fault: no holder inside its critical section to SIGSTOP")
                return
            # Short: it wakes up still valid. Long: its leases expire meanwhile and others
            # take over; it must notice before acting, and fencing must refuse its writes.
            d = self.rng.uniform(0.5, 2.5) if self.rng.random() < 0.4 else worker.spec.ttl + 3.0
            if d > self.long_stop:
                d = self.rng.uniform(0.5, 2.5)
            self.say(f"fault: SIGSTOP {worker.instance} inside its critical section for {d:.1f}s")
            self.count[kind] += 1
            self.workers.pause(worker)
            try:
                self._sleep(d)
            finally:
                self.workers.resume(worker)
        elif kind in _OTHER_CLIENT_FAULTS:
            self._other_client(kind, d, room)
        elif kind in _DELETION_FAULTS:
            self._delete(kind, room)
        elif kind in ("reject-writes-minority", "reject-writes-majority"):
            self._reject_writes(kind, d)
        elif kind == "break-holder":
            self._break_holder(room)
        elif kind == "sigkill-lock-run":
            self._sigkill_lock_run(room)
        elif kind in _MEMBER_FAULTS:
            self._change_members(kind, room)
        elif kind == "split-write":
            self._split_write()
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    # -- other clients of the Lease ------------------------------------------------

    def _kubectl(self, index: int, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """The real kubectl, straight to the API server (not through the proxy)."""
        exe = shutil.which("kubectl")
        assert exe is not None
        return subprocess.run(
            [exe, "--kubeconfig", str(self.sandbox.kubeconfig), "--context", f"sandbox-{index}",
             "-n", self.rig.namespace, "--request-timeout=10s", *args],
            input=stdin, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def _lease(self) -> str:
        from coordinator.kube.resources import lease_name

        return lease_name(DEPLOYMENT)

    def _held(self, within: float) -> bool:
        """Wait up to ``within`` for someone to hold the lock (inside its section)."""
        until = machine_clock() + within
        while machine_clock() < until:
            if self.workers.recorder.holders_inside() or self.workers.recorder.trees_running():
                return True
            time.sleep(0.05)
        return False

    def _other_client(self, kind: str, d: float, room: float) -> None:
        """Another client edits the Lease of a live holder, again and again for ``d``
        seconds: annotations and labels under its own field manager, a server-side apply
        of a label, managedFields stripped, or leaseDurationSeconds cut to 1 s."""
        if shutil.which("kubectl") is None:
            self.say(f"fault: {kind} needs kubectl, which is not installed")
            return
        self._held(min(room, 10.0))
        targets = self._majority() if kind in ("strip-managed-fields", "edit-lease-duration") else self._minority()
        if self.rng.random() < 0.5:
            targets = self._clusters(self.rng.randint(1, self.n))
        lease = self._lease()
        self.say(f"fault: {kind} on the Lease of {targets} for {d:.1f}s")
        self.count[kind] += 1
        until = machine_clock() + d
        problems: list[str] = []
        while True:
            for i in targets:
                self.serial += 1
                n = str(self.serial)
                if kind == "annotate-lease":
                    runs = [
                        self._kubectl(i, "annotate", "lease", lease, f"torture.example/seen={n}", "--overwrite",
                                      f"--field-manager={OTHER_MANAGER}"),
                        self._kubectl(i, "label", "lease", lease, f"torture.example/round={n}", "--overwrite",
                                      f"--field-manager={OTHER_MANAGER}"),
                    ]  # fmt: skip
                elif kind == "apply-lease":
                    manifest = json.dumps(
                        {
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {"name": lease, "labels": {"torture.example/applied": n}},
                        }
                    )
                    runs = [self._kubectl(i, "apply", "--server-side", "--field-manager=torture-apply", "-f", "-",
                                          stdin=manifest)]  # fmt: skip
                elif kind == "strip-managed-fields":
                    runs = [self._kubectl(i, "patch", "lease", lease, "--type=merge",
                                          "-p", '{"metadata":{"managedFields":[{}]}}',
                                          f"--field-manager={OTHER_MANAGER}")]  # fmt: skip
                else:
                    runs = [self._kubectl(i, "patch", "lease", lease, "--type=merge",
                                          "-p", '{"spec":{"leaseDurationSeconds":1}}',
                                          f"--field-manager={OTHER_MANAGER}")]  # fmt: skip
                # A missing Lease (deleted, or a namespace being recreated) is not a problem here.
                problems += [_tail(r.stderr, 2) for r in runs if r.returncode != 0 and "NotFound" not in r.stderr]
            if machine_clock() >= until:
                break
            self._sleep(min(0.5, max(0.0, until - machine_clock())))
        if problems:
            self.say(f"fault: {kind}: kubectl failed {len(problems)} times, e.g. {problems[0]}")

    # -- deletions -------------------------------------------------------------------

    def _delete(self, kind: str, room: float) -> None:
        from coordinator.kube.resources import configmaps_path, lease_path, state_name

        self._held(min(room, 10.0))
        ns = self.rig.namespace
        if kind == "delete-lease-all":
            targets = list(self.rig.members)
        else:
            targets = self._clusters(1)
        if kind in ("delete-lease-one", "delete-lease-all"):
            self.say(f"fault: delete the Lease on {targets}")
            self.count[kind] += 1
            for i in targets:
                self.sandbox.admin(i).delete(lease_path(ns, self._lease()))
        elif kind == "delete-state-one":
            self.say(f"fault: delete the state object on {targets}")
            self.count[kind] += 1
            for i in targets:
                self.sandbox.admin(i).delete(f"{configmaps_path(ns)}/{state_name(DEPLOYMENT)}")
        else:
            (i,) = targets
            self.say(f"fault: delete namespace {ns} on cluster {i} and create it again, empty")
            self.count[kind] += 1
            self._recreate_namespace(i)

    def _recreate_namespace(self, index: int) -> None:
        """Delete the namespace and create it again, empty. The sandbox runs no
        controller-manager, so nothing would empty and finalize a deleted namespace:
        do its work here. Deleting first makes the namespace Terminating, which turns
        away creations in it; then its objects go, then the finalizer, then it is gone."""
        from coordinator.kube.resources import configmaps_path, leases_path, namespace_path, secrets_path

        admin = self.sandbox.admin(index, timeout=15)
        ns = self.rig.namespace
        admin.delete(namespace_path(ns))
        for collection in (
            leases_path(ns),
            configmaps_path(ns),
            secrets_path(ns),
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        ):
            reply = admin.request("DELETE", collection)
            if reply.status not in (200, 404):
                self.workers.recorder.problem(f"recreate-namespace: DELETE {collection} answered {reply.status}")
        obj = admin.get(namespace_path(ns))
        if obj is not None:
            obj.setdefault("spec", {})["finalizers"] = []
            reply = admin.request("PUT", f"{namespace_path(ns)}/finalize", obj)
            if reply.status != 200:
                self.workers.recorder.problem(f"recreate-namespace: finalize answered {reply.status}")
        until = machine_clock() + 30
        while admin.get(namespace_path(ns)) is not None and machine_clock() < until:
            time.sleep(0.1)
        admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # -- admission -------------------------------------------------------------------

    def _reject_writes(self, kind: str, d: float) -> None:
        """A ValidatingAdmissionPolicy turns away every CREATE and UPDATE of the state
        object (and of a probe, to see when it is in force) on a minority or a majority,
        as a policy engine, a quota or a webhook outage would; then it is removed."""
        from coordinator.kube.resources import state_name

        targets = self._minority() if kind == "reject-writes-minority" else self._majority()
        # All writes, or only those that change the data (the rest of a write, e.g. a
        # promise in the metadata, goes through): partial writes either way.
        data_only = self.rng.random() < 0.5
        what = "data changes of the state" if data_only else "state writes"
        self.say(f"fault: an admission policy rejects {what} on {targets} for {d:.1f}s")
        self.count[kind] += 1
        added: list[int] = []
        try:
            for i in targets:
                self._policy(i, state_name(DEPLOYMENT), create=True, data_only=data_only)
                added.append(i)
            for i in added:
                self._probe(i, rejected=True)
            self._sleep(d)
        finally:
            for i in added:
                self._policy(i, state_name(DEPLOYMENT), create=False)
            for i in added:
                self._probe(i, rejected=False)
        rest = [i for i in self.rig.members if i not in targets]
        if kind == "reject-writes-majority" and rest:
            # The members that took the rejected writes now miss the next ones: their
            # replicas differ from the majority's, which reads must never return.
            self.say(f"fault: then pause API servers {rest} for {d:.1f}s")
            paused: list[int] = []
            try:
                for i in rest:
                    self.sandbox.pause(i)
                    paused.append(i)
                self._sleep(d)
            finally:
                for i in paused:
                    self.sandbox.resume(i)

    def _policy_name(self) -> str:
        return f"{self.rig.namespace}-reject-state"

    def _policy(self, index: int, target: str, *, create: bool, data_only: bool = False) -> None:
        vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
        binding = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
        admin = self.sandbox.admin(index, timeout=15)
        name = self._policy_name()
        if not create:
            admin.delete(f"{binding}/{name}")
            admin.delete(f"{vap}/{name}")
            return
        ns = self.rig.namespace
        allowed = f"object.metadata.namespace != '{ns}' || !(object.metadata.name in ['{target}', '{name}'])"
        if data_only:
            allowed += (
                " || (oldObject != null && (has(object.data) ? (has(oldObject.data) && object.data == oldObject.data)"
                " : !has(oldObject.data)))"
            )
        admin.create(
            vap,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["configmaps"],
                            }
                        ]
                    },
                    "validations": [{"expression": allowed, "message": "state writes rejected by the fault suite"}],
                },
            },
        )
        admin.create(
            binding,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {"policyName": name, "validationActions": ["Deny"]},
            },
        )

    def _probe(self, index: int, *, rejected: bool) -> None:
        """Policies take effect a moment after they change: write a probe ConfigMap
        (which the policy also rejects) until the answer says it is (no longer) in force."""
        from coordinator.kube.resources import configmaps_path

        admin = self.sandbox.admin(index, timeout=15)
        name = self._policy_name()
        path = f"{configmaps_path(self.rig.namespace)}/{name}"
        until = machine_clock() + 20
        status = 0
        while machine_clock() < until:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name},
                "data": {"n": str(time.time())},
            }
            reply = admin.request("PUT", path, body)
            if reply.status == 404:
                reply = admin.request("POST", configmaps_path(self.rig.namespace), body)
            status = reply.status
            if (status >= 400) == rejected and status not in (404, 409):
                return
            time.sleep(0.2)
        self.say(f"fault: the admission policy on cluster {index} did not {'take' if rejected else 'stop taking'} "
                 f"effect within 20 s (last answer {status})")  # fmt: skip

    # -- a targeted schedule -----------------------------------------------------------

    def _split_write(self) -> None:
        """One holder (the harness, on the lock like anyone) writes twice under one token:
        first while an admission policy rejects state writes on member A and member B is
        paused, so the write can land on the third, C, alone (its outcome failed or
        unknown); then, C paused first, A and B back, a write that succeeds on A and B.
        C comes back, and the holder reads with A paused, then with B paused: each read
        sees C's replica next to one holding the confirmed write. C is the middle member
        by name, so whichever way a tie between equal stamps were broken by name, one of
        the reads meets it. Every step is recorded like a contender's."""
        import anyio

        from coordinator.api import Coordinator
        from coordinator.errors import CoordinatorError, LockHeldError, NoQuorumError, StateConflictError
        from coordinator.kube.resources import state_name

        if self.n != 3:
            self.say("fault: split-write needs exactly 3 members")
            return
        a, c, b = self.rig.members
        if self.rng.random() < 0.5:
            a, b = b, a
        self.serial += 1
        instance = f"split{self.serial}"
        recorder = self.workers.recorder
        recorder.handle(instance, {"ev": "start", "mode": "api"})
        self.count["split-write"] += 1
        self.say(f"fault: split-write: reject state writes on c{a}, pause c{b}, write; then pause c{c}, write")
        ops = 0

        def record(event: str, **fields: Any) -> None:
            recorder.handle(instance, {"ev": event, **fields})

        async def write(state: Any, held: Any, value: str) -> None:
            nonlocal ops
            ops += 1
            op = f"{instance}:{ops}"
            record("invoke", op=op, kind="write", value=value, t=machine_clock())
            status = "unknown"
            try:
                with anyio.fail_after(60):
                    await state.set({STATE_KEY: value}, lock=held)
                status = "ok"
            except NoQuorumError:
                status = "unknown"
            except (StateConflictError, LockHeldError):
                status = "fail"
            except (CoordinatorError, TimeoutError) as err:
                self.say(f"fault: split-write: the write of {value} raised {type(err).__name__}")
            record("complete", op=op, status=status, t=machine_clock())
            self.say(f"fault: split-write: write {value}: {status}")

        async def read(state: Any) -> None:
            nonlocal ops
            ops += 1
            op = f"{instance}:{ops}"
            record("invoke", op=op, kind="read", value=None, t=machine_clock())
            try:
                with anyio.fail_after(60):
                    data = await state.get()
            except (CoordinatorError, TimeoutError):
                record("complete", op=op, status="fail", t=machine_clock())
                return
            value = data.get(STATE_KEY) if isinstance(data, dict) else None
            record("complete", op=op, status="ok", value=value, t=machine_clock())
            self.say(f"fault: split-write: read {STATE_KEY}={value!r}")

        def blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

        async def scenario() -> None:
            async with Coordinator.from_config(str(self.rig.config), timeout=2.0) as coord:
                state = coord.state(DEPLOYMENT)
                async with coord.lock(DEPLOYMENT, ttl=self.rig.max_ttl, wait=60, holder=instance) as held:
                    until = boot_to_machine(held.result.valid_until())
                    record("enter", t=machine_clock(), token=held.fencing_token, valid_until=until)
                    try:
                        await blocking(self._policy, a, state_name(DEPLOYMENT), create=True)
                        await blocking(self._probe, a, rejected=True)
                        await blocking(self.sandbox.pause, b)
                        try:
                            await write(state, held, f"{instance}x")
                        finally:
                            # C goes quiet before A and B are back, so that no reader
                            # copies what C took onto them in between.
                            await blocking(self.sandbox.pause, c)
                            await blocking(self._policy, a, state_name(DEPLOYMENT), create=False)
                            await blocking(self.sandbox.resume, b)
                        try:
                            await blocking(self._probe, a, rejected=False)
                            await write(state, held, f"{instance}y")
                        finally:
                            await blocking(self.sandbox.resume, c)
                        for quiet in (a, b):
                            await blocking(self.sandbox.pause, quiet)
                            try:
                                await read(state)
                            finally:
                                await blocking(self.sandbox.resume, quiet)
                    finally:
                        left = machine_clock()
                        until = boot_to_machine(held.result.valid_until())
                        record("exit", t=min(left, until), overstay=left > until)

        try:
            anyio.run(scenario)
        except CoordinatorError as err:
            self.say(f"fault: split-write: {type(err).__name__}: {err.message[:300]}")
        finally:
            recorder.gone(instance, machine_clock(), "vanished")

    # -- membership ------------------------------------------------------------------

    def _change_members(self, kind: str, room: float) -> None:
        """The operator changes the member set while the contenders run, with the CLI
        (``deployment add-cluster/remove-cluster/replace-cluster --wait``, which takes
        the lock like any contender), and brings it back to its size: add a spare, then
        remove a member; remove a member, then add a spare; replace a member by a spare.
        A removed member becomes a spare (its old Lease and state stay, an older set of
        ours, which a later add takes over). The checks judge the histories as always."""
        spares = [i for i in range(1, self.rig.n + self.rig.spares + 1) if i not in self.rig.members]
        if not spares:
            self.say(f"fault: {kind} needs a spare cluster, and there is none (--spares)")
            return
        spare = self.rng.choice(spares)
        member = self.rng.choice(self.rig.members)
        self.count[kind] += 1
        if kind == "add-member":
            self._member_command("add-cluster", f"c{spare}", room=room)
            left = [i for i in self.rig.members if i != spare]
            if spare in self.rig.members and left:
                self._member_command("remove-cluster", f"c{self.rng.choice(left)}", room=room)
        elif kind == "remove-member":
            self._member_command("remove-cluster", f"c{member}", room=room)
            if member not in self.rig.members:
                self._member_command("add-cluster", f"c{spare}", room=room)
        else:
            self._member_command("replace-cluster", f"c{member}", f"c{spare}", room=room)

    def _member_command(self, verb: str, *clusters: str, room: float) -> None:
        """Run one change to its end: again when it could not finish (the lock stayed
        held, or no quorum; a change in progress is finished by running it again)."""
        home = self.rig.workdir / "operator"
        home.mkdir(parents=True, exist_ok=True)
        env = self.workers._environ("operator", self.workers.config_for(home))
        wait = max(20.0, min(room, 60.0))
        give_up = machine_clock() + max(60.0, min(room, 120.0))
        attempt = 0
        while True:
            attempt += 1
            before = list(self.rig.members)
            self.say(
                f"fault: deployment {verb} {' '.join(clusters)} (members {self._names(before)}), attempt {attempt}"
            )
            invoked = machine_clock()
            # Contenders already waiting for the lock wait on (and follow the change);
            # new attempts hold off, or the change could wait behind them for minutes.
            self.workers.hold_off_file.touch()
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "coordinator", "deployment", verb, DEPLOYMENT, *clusters,
                     "--wait", f"{wait:g}s", "--ttl", f"{self.rig.max_ttl:g}s", "--holder", "member-change"],
                    capture_output=True, text=True, env=env, cwd=home, stdin=subprocess.DEVNULL, timeout=wait + 300,
                )  # fmt: skip
            finally:
                self.workers.hold_off_file.unlink(missing_ok=True)
            members, joint = self.rig.read_members()
            self.rig.members = members
            with (self.rig.workdir / "logs" / "member-changes.log").open("a") as log:
                log.write(f"$ deployment {verb} {' '.join(clusters)}: exit {proc.returncode}\n")
                log.write(proc.stdout + proc.stderr + "\n")
            why = f" ({_tail(proc.stderr, 2)})" if proc.returncode != 0 else ""
            self.say(
                f"fault: `deployment {verb}` exit {proc.returncode}{why} after {machine_clock() - invoked:.1f}s; "
                f"members {self._names(members)}" + (f", change to {self._names(joint)} in progress" if joint else "")
            )
            if proc.returncode == 0 and joint is None:
                return
            if proc.returncode not in (0, 3, 4):
                self.workers.recorder.problem(
                    f"operator: `deployment {verb} {' '.join(clusters)}` exit {proc.returncode}: {_tail(proc.stderr)}"
                )
                return
            if machine_clock() >= give_up:
                break
            self._sleep(self.rng.uniform(0.5, 2.0))
        self.workers.recorder.problem(
            f"operator: `deployment {verb} {' '.join(clusters)}` did not finish in {attempt} runs "
            f"(see {self.rig.workdir / 'logs' / 'member-changes.log'})"
        )

    @staticmethod
    def _names(indices: Sequence[int] | None) -> str:
        return ", ".join(f"c{i}" for i in indices or ())

    # -- the operator and `lock run` ---------------------------------------------------

    def _break_holder(self, room: float) -> None:
        """An operator breaks the lock of a live holder (``lock break --yes``). From then
        on the holder no longer holds it: its section ends there for the check
        (checkers.apply_breaks), and fencing must refuse whatever it writes later."""
        if not self._held(min(room, 15.0)):
            self.say("fault: nobody holds the lock to break")
            return
        home = self.rig.workdir / "operator"
        home.mkdir(parents=True, exist_ok=True)
        env = self.workers._environ("operator", self.workers.config_for(home))
        self.say("fault: an operator breaks the lock of its live holder")
        self.count["break-holder"] += 1
        invoked = machine_clock()
        proc = subprocess.run(
            [sys.executable, "-m", "coordinator", "lock", "break", DEPLOYMENT, "--yes", "--reason", "torture operator"],
            capture_output=True, text=True, env=env, cwd=home, stdin=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        completed = machine_clock()
        self.say(f"fault: `lock break` exit {proc.returncode} after {completed - invoked:.1f}s")
        if proc.returncode == 0:
            self.workers.recorder.add_break(invoked, completed)
        elif proc.returncode == 4:
            # Not known to have reached a majority: it may still have cleared some leases.
            self.workers.recorder.add_break(invoked, completed)
            self.say("fault: the break did not reach a majority")
        else:
            self.workers.recorder.problem(f"operator: `lock break` exit {proc.returncode}: {_tail(proc.stderr)}")

    def _sigkill_lock_run(self, room: float) -> None:
        """An operator's ``lock run`` of a long process tree; once the tree runs,
        ``lock run`` itself (not its child) is SIGKILLed. What it started must still be
        stopped before the lock can pass on: the tree's marks are judged like any other
        section (collected in the background once its last process is gone)."""
        self.serial += 1
        instance = f"killedrun{self.serial}"
        home = self.rig.workdir / "killed-runs"
        home.mkdir(parents=True, exist_ok=True)
        script = home / "tree.sh"
        script.write_text(TREE_SCRIPT)
        config = self.workers.config_for(home)
        marks = home / f"marks-{self.serial}.txt"
        marks.write_text("")
        ticks = 50
        wait = max(5.0, min(room, 40.0))
        command = [
            sys.executable, "-m", "coordinator", "lock", "run", DEPLOYMENT, "--ttl", "6s", "--wait", f"{wait:g}s",
            "--holder", instance, "--reason", "torture", "--grace", "1s",
            "--", "sh", str(script), str(marks), str(ticks),
        ]  # fmt: skip
        with (self.rig.workdir / "logs" / f"{instance}.log").open("w") as err:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=self.workers._environ(instance, config),
                cwd=home,
                start_new_session=True,
            )
        until = machine_clock() + wait + 30
        started = False
        while machine_clock() < until and proc.poll() is None:
            if " start " in marks.read_text():
                started = True
                break
            time.sleep(0.05)
        if started:
            self.say(f"fault: SIGKILL `lock run` (pid {proc.pid}) while its tree runs")
            self.count["sigkill-lock-run"] += 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        else:
            self.say("fault: the `lock run` to SIGKILL did not get the lock")
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        collector = threading.Thread(
            target=self._collect_tree, args=(instance, marks, ticks), name=f"tree-{instance}", daemon=True
        )
        collector.start()
        self.collectors.append(collector)

    def _collect_tree(self, instance: str, marks: Path, ticks: int) -> None:
        from faults.checkers import section_from_marks

        until = machine_clock() + ticks * TREE_TICK_S * 3 + 60
        pids: set[int] = set()
        while machine_clock() < until:
            pids = {int(p) for p, *_ in (line.split() for line in marks.read_text().splitlines()) if p.isdigit()}
            if not any(_alive(pid) for pid in pids):
                break
            time.sleep(0.1)
        recorder = self.workers.recorder
        if any(_alive(pid) for pid in pids):
            recorder.problem(f"{instance}: processes of its tree still ran long after `lock run` was killed")
        tree = section_from_marks(marks.read_text().splitlines())
        if tree is None:
            return
        if tree.token is None:
            recorder.problem(f"{instance}: the child of `lock run` had no COORDINATOR_FENCING_TOKEN")
            return
        event = {"ev": "tree", "token": tree.token, "enter": tree.enter, "exit": tree.exit}
        recorder.handle(instance, {**event, "processes": tree.processes})

    def wait_collectors(self, timeout: float) -> None:
        until = machine_clock() + timeout
        for collector in self.collectors:
            collector.join(timeout=max(0.0, until - machine_clock()))
            if collector.is_alive():
                self.workers.recorder.problem(f"{collector.name}: the tree was not collected in time")

    def _with_toxic(self, targets: list[int], seconds: float, add: Callable[[Proxy], str]) -> None:
        added: list[tuple[Proxy, str]] = []
        try:
            for i in targets:
                proxy = self.rig.proxies[i - 1]
                added.append((proxy, add(proxy)))
            self._sleep(seconds)
        finally:
            for proxy, name in added:
                proxy.remove_toxic(name)


# ----------------------------------------------------------------------------- verdict


def _seed_state(rig: _Rig, recorder: Recorder, say: Progress) -> None:
    """Write a first value before the workload starts (recorded like any write). Runs
    with membership kinds need it: a member change on a deployment whose state was never
    written stops at its copy step (``No valid replica of the state ... nothing to sync``,
    exit 2) and leaves the change unfinishable; see the README's fault suite section."""
    import anyio

    from coordinator.api import Coordinator

    async def write() -> None:
        async with Coordinator.from_config(str(rig.config), timeout=10) as c:
            async with c.lock(DEPLOYMENT, ttl=rig.max_ttl, wait=30, holder="seed") as held:
                await c.state(DEPLOYMENT).set({STATE_KEY: "seed"}, lock=held)

    invoked = machine_clock()
    anyio.run(write)
    recorder.add_op(
        {"process": "seed", "kind": "write", "value": "seed", "invoke": invoked, "complete": machine_clock(),
         "status": "ok"}
    )  # fmt: skip
    say(f"seeded the state: {STATE_KEY}='seed'")


def _final_read(rig: _Rig, recorder: Recorder, say: Progress) -> None:
    """After everything healed and every contender stopped: the value that stayed."""
    import anyio

    from coordinator.api import Coordinator
    from coordinator.errors import CoordinatorError

    async def read() -> Any:
        async with Coordinator.from_config(str(rig.config), timeout=10) as c:
            return await c.state(DEPLOYMENT).get()

    last = ""
    for _ in range(6):
        invoked = machine_clock()
        try:
            data = anyio.run(read)
        except CoordinatorError as err:
            last = err.message
            time.sleep(2)
            continue
        value = data.get(STATE_KEY) if isinstance(data, dict) else data
        recorder.add_op(
            {
                "process": "final-read",
                "kind": "read",
                "value": value,
                "invoke": invoked,
                "complete": machine_clock(),
                "status": "ok",
            }
        )
        say(f"final read: {STATE_KEY}={value!r}")
        return
    recorder.problem(f"final read: the state could not be read after every fault was undone: {last}")


def _judge(recorder: Recorder) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[CheckResult]]:
    from faults.checkers import (
        apply_breaks,
        check_linearizable_register,
        check_mutual_exclusion,
        check_no_lost_writes,
    )

    recorded = [
        {
            "process": s.process,
            "mode": s.mode,
            "token": s.token,
            "enter": s.enter,
            "exit": s.exit,
            "how": s.how,
            "valid_until": s.valid_until,
        }
        for s in recorder.sections
        if s.exit is not None
    ]
    # An operator's break ends the broken holder's section (see apply_breaks).
    sections = apply_breaks(recorded, recorder.breaks)
    ops = list(recorder.ops.values())
    checks = [
        check_mutual_exclusion([{k: s[k] for k in ("process", "token", "enter", "exit")} for s in sections]),
        check_linearizable_register(ops, initial=None, max_states=2_000_000, timeout=180),
    ]
    reads = [o for o in ops if o["kind"] == "read" and o["status"] == "ok"]
    if reads and max(reads, key=lambda r: r["invoke"])["process"] == "final-read":
        checks.append(check_no_lost_writes(ops, initial=None))
    return sections, ops, checks


# ------------------------------------------------------------------------------- run


def _check_kinds(kinds: Sequence[str]) -> None:
    unknown = sorted(set(kinds) - set(FAULT_KINDS) - set(TARGETED_KINDS))
    if unknown:
        known = ", ".join(FAULT_KINDS + TARGETED_KINDS)
        raise ValueError(f"unknown fault kinds: {', '.join(unknown)} (known: {known})")


def run_torture(opts: TortureOptions) -> Report:
    """Set everything up, run the workload under faults, tear it all down, judge.

    The work directory is removed afterwards when it was a temporary one and the run
    passed; otherwise it is kept (logs, the histories as JSON) and named in the report.
    """
    if opts.clusters < 3:
        raise ValueError("the torture run needs at least 3 clusters (a minority must be able to fail)")
    if opts.apiservers not in (1, 2):
        raise ValueError("the torture run starts 1 or 2 kube-apiservers per cluster")
    if opts.date_offset and opts.apiservers < 2:
        raise ValueError("a date offset needs 2 kube-apiservers per cluster (one answers shifted)")
    if opts.kinds:
        _check_kinds(opts.kinds)
    started = machine_clock()
    say = _say(opts.progress, started)
    owned = opts.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="torture-")) if opts.workdir is None else Path(opts.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(opts.seed)
    recorder = Recorder(workdir / "events.jsonl")
    if opts.max_ttl < max(s.ttl for s in opts.contenders):
        raise ValueError("max_ttl must be at least every contender's TTL")
    rig = _Rig(
        workdir,
        opts.clusters,
        say,
        opts.max_ttl,
        spares=opts.spare_clusters,
        apiservers=opts.apiservers,
        date_offset=opts.date_offset,
    )
    workers: _Workers | None = None
    faults: _Faults | None = None
    workload_seconds = 0.0
    ha = ""
    try:
        rig.start()
        if opts.member_changes:
            _seed_state(rig, recorder, say)
        end = machine_clock() + opts.seconds
        # Contenders stop by themselves well after the schedule, should the harness die.
        workers = _Workers(opts, rig, recorder, deadline=end + 600, say=say)
        workers.start_all()
        faults = _Faults(rig, workers, rng, say, opts)
        say(f"workload and faults for {opts.seconds:.0f}s (seed {opts.seed})")
        began = machine_clock()
        try:
            faults.run(end, overtime=opts.overtime)
        finally:
            workload_seconds = machine_clock() - began
            say("undoing every fault")
            rig.heal()
        faults.wait_collectors(120)
        grace = max(s.ttl for s in opts.contenders) + opts.wait + 90
        say("stopping the contenders")
        workers.stop_all(grace)
        _final_read(rig, recorder, say)
        ha = rig.ha_summary()
    finally:
        if workers is not None:
            workers.kill_everything()
        say("stopping toxiproxy and the sandbox")
        try:
            rig.stop()
        finally:
            recorder.close()
    say("checking the histories")
    sections, ops, checks = _judge(recorder)
    report = Report(
        sections=sections,
        operations=ops,
        faults=faults.count if faults is not None else Counter(),
        checks=checks,
        problems=list(recorder.problems),
        stats=recorder.stats,
        seconds=opts.seconds,
        seed=opts.seed,
        clusters=opts.clusters,
        kinds=faults.kinds if faults is not None else (),
        min_each=opts.min_each,
        breaks=len(recorder.breaks),
        workload_seconds=workload_seconds,
        ha=ha,
        members=(
            f"members at the end: {', '.join(f'c{i}' for i in rig.members)}"
            if rig.members != list(range(1, opts.clusters + 1))
            else ""
        ),
    )
    if report.passed and owned:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        history = workdir / "history.json"
        history.write_text(json.dumps({"sections": sections, "operations": ops}, indent=1, default=str))
        report.workdir = workdir
    return report


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A CI job killed on timeout gets SIGTERM: unwind like Ctrl-C so clean-up runs."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["worker"]:
        return worker_main(args[1:])
    print("usage: python -m faults.workload worker ... (the harness: scripts/torture.py)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
