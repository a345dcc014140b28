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

What a critical section is, and what the register's operations are: :mod:`faults.contenders`;
the one clock every time is read on: :mod:`faults.clock`.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faults.clock import machine_clock
from faults.contenders import DEPLOYMENT, STATE_KEY
from faults.kinds import check_kinds
from faults.recorder import Recorder, Report
from faults.rig import Progress, Rig, TortureOptions, Workers
from faults.schedule import Faults

if TYPE_CHECKING:
    from faults.checkers import CheckResult


def _say(progress: Progress | None, started: float, notes: list[tuple[float, str]]) -> Progress:
    """Progress lines, also kept with their machine-clock reading (for Report.explain)."""

    def say(text: str) -> None:
        now = machine_clock()
        notes.append((now, text))
        if progress is not None:
            progress(f"[{now - started:7.1f}s] {text}")

    return say


# ----------------------------------------------------------------------------- verdict


def _seed_state(rig: Rig, recorder: Recorder, say: Progress) -> None:
    """Write a first value before the workload starts (recorded like any write). Runs
    with membership kinds need it: a member change on a deployment whose state was never
    written stops at its copy step (``No valid replica of the state ... nothing to sync``,
    exit 2) and leaves the change unfinishable; see docs/robustness.md, *Fault suite*."""
    import anyio

    from coordinator.ops.api import Coordinator

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


def _final_read(rig: Rig, recorder: Recorder, say: Progress) -> None:
    """After everything healed and every contender stopped: the value that stayed."""
    import anyio

    from coordinator.errors import CoordinatorError
    from coordinator.ops.api import Coordinator

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
        check_mutual_exclusion(
            [{k: s[k] for k in ("process", "token", "enter", "exit", "unordered") if k in s} for s in sections]
        ),
        check_linearizable_register(ops, initial=None, max_states=2_000_000, timeout=180),
    ]
    reads = [o for o in ops if o["kind"] == "read" and o["status"] == "ok"]
    if reads and max(reads, key=lambda r: r["invoke"])["process"] == "final-read":
        checks.append(check_no_lost_writes(ops, initial=None))
    return sections, ops, checks


# ------------------------------------------------------------------------------- run


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
        check_kinds(opts.kinds)
    started = machine_clock()
    notes: list[tuple[float, str]] = []
    say = _say(opts.progress, started, notes)
    wall_offset = time.time() - machine_clock()
    owned = opts.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="torture-")) if opts.workdir is None else Path(opts.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(opts.seed)
    recorder = Recorder(workdir / "events.jsonl")
    if opts.max_ttl < max(s.ttl for s in opts.contenders):
        raise ValueError("max_ttl must be at least every contender's TTL")
    rig = Rig(
        workdir,
        opts.clusters,
        say,
        opts.max_ttl,
        spares=opts.spare_clusters,
        apiservers=opts.apiservers,
        date_offset=opts.date_offset,
    )
    workers: Workers | None = None
    faults: Faults | None = None
    workload_seconds = 0.0
    ha = ""
    try:
        rig.start()
        if opts.member_changes:
            _seed_state(rig, recorder, say)
        end = machine_clock() + opts.seconds
        # Contenders stop by themselves well after the schedule, should the harness die.
        workers = Workers(opts, rig, recorder, deadline=end + 600, say=say)
        workers.start_all()
        faults = Faults(rig, workers, rng, say, opts)
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
        notes=notes,
        started=started,
        wall_offset=wall_offset,
        audit_logs=workdir / "sandbox" / "logs",
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
