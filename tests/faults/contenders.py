"""Contender processes: take the lock, enter the critical section, write and read the
state, renew, leave, release; and report every step as a JSON line on stdout.

Each runs as ``python -m faults.contenders worker ...``, started by :mod:`faults.rig`.

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
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from coordinator.rules.lease import remaining_validity
from faults.clock import boot_to_machine, machine_clock
from faults.tree import TREE_SCRIPT, TREE_TICK_S, alive

if TYPE_CHECKING:
    from coordinator.engine.state import StateClient
    from coordinator.ops.api import Coordinator, HeldLock


DEPLOYMENT = "torture"
STATE_KEY = "v"
# A holder enters, and starts each step, only with at least this much validity left:
# a step of a command-line holder starts a process, which takes seconds.
STEP_MARGIN_S = {"api": 0.5, "cli": 3.0}

Mode = Literal["cli", "api", "run", "reader"]
MODES = ("cli", "api", "run", "reader")


def tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())[:1500]


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

    Command-line holders get a longer TTL: every step starts a process (forked from the
    contender's preloaded command server), which on a loaded machine can take a second.
    Both stay short: how long a dead holder, a deleted Lease or a stripped one blocks the
    lock grows with them (the maximum TTL is the longest), and a soak needs turns.
    """
    offsets = [None, None, "-5m", "+7m", "+13m", "-11m"]
    specs = []
    for i in range(count):
        mode: Mode = "api" if i % 2 == 0 else "cli"
        specs.append(
            ContenderSpec(
                name=f"{mode}{i // 2 + 1}",
                mode=mode,
                ttl=8.0 if mode == "api" else 10.0,
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
        shown = "coordinator " + " ".join(argv)
        try:
            # Forked from this contender's preloaded command server (tests/cliserver.py),
            # where a fork can stand for a fresh interpreter: still a process of its own, in
            # this contender's process group (so the faults that signal the group reach it),
            # minus a second of imports. (This contender's stdin is /dev/null.)
            import cliserver

            proc = cliserver.run(list(argv), dict(os.environ), timeout=timeout)
        except subprocess.TimeoutExpired:
            self.problem("hung", f"`{shown}` did not finish within {timeout:g}s")
            return None, ""
        if proc.returncode not in allowed:
            self.problem(f"exit {proc.returncode}", f"`{shown}`: {tail(proc.stderr)}")
        elif "Traceback (most recent call last)" in proc.stderr:
            self.problem("traceback", f"`{shown}` (exit {proc.returncode}): {tail(proc.stderr)}")
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

        from coordinator.ops.api import Coordinator

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
            self.problem("internal", f"Coordinator.lock raised {type(err).__name__}: {tail(traceback.format_exc())}")
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
            self.problem("internal", f"state.set raised {type(err).__name__}: {tail(traceback.format_exc())}")
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
            self.problem("internal", f"state.get raised {type(err).__name__}: {tail(traceback.format_exc())}")
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

        from coordinator.ops.api import Coordinator

        while not self.stopping():
            self.reopen = False
            async with Coordinator.from_config(timeout=self.args.timeout) as c:
                state = c.state(self.args.deployment)
                while not self.stopping() and not self.reopen:
                    await self.read(state)
                    await anyio.sleep(self.rng.uniform(0.2, 1.0))


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
            self.problem(f"exit {rc}", f"`lock run`: {tail(text)}")
        elif "Traceback (most recent call last)" in text:
            self.problem("traceback", f"`lock run` (exit {rc}): {tail(text)}")
        self.stat(f"lock run exit {rc}")
        # The section lasts until the last process of the tree is gone.
        until = machine_clock() + ticks * TREE_TICK_S + 60
        while True:
            pids = {int(line.split()[0]) for line in marks.read_text().splitlines() if line.split()[:1] != []
                    and line.split()[0].isdigit()}  # fmt: skip
            if not any(alive(pid) for pid in pids) or machine_clock() > until:
                break
            time.sleep(0.1)
        if any(alive(pid) for pid in pids):
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
    """Entry point of one contender process (``python -m faults.contenders worker``)."""
    parser = argparse.ArgumentParser(prog="contenders worker")
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
        emit("problem", what="contender crashed", detail=f"{type(err).__name__}: {tail(traceback.format_exc(), 12)}")
        return 1
    emit("done")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["worker"]:
        return worker_main(args[1:])
    print("usage: python -m faults.contenders worker ... (the harness: scripts/torture.py)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
