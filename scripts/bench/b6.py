"""B6: 8 contender processes cycling acquire/release on 3 clusters: cycles/s, fairness."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from bench.report import Report, Row
from bench.rig import Rig
from bench.stats import median, ms, percentile
from coordinator.config.store import ConfigStore
from coordinator.errors import LockHeldError
from coordinator.ops.api import Coordinator

# The contenders are processes of the benchmarks' entry point, scripts/bench.py.
ENTRY = Path(__file__).resolve().parent.parent / "bench.py"


async def contender_main(config: str, deployment: str, holder: str, duration: float, hold: float) -> None:
    """One contender process: cycle acquire(wait) / release for ``duration`` seconds after
    the parent says go; print the wins (and how the failed attempts failed) as one JSON line.

    Times are ``time.monotonic()``, one clock for every process of the machine.
    """
    store = ConfigStore(config)
    cfg = store.load()
    wins: list[float] = []
    tokens: list[int] = []
    released: list[float] = []
    errors: list[str] = []
    attempts = {"won": 0, "split": 0, "held": 0}
    c = Coordinator(cfg, store=None, timeout=5.0)

    def on_wait(result: Any, left: float) -> None:
        got = sum(1 for r in result.results.values() if r.ok)
        attempts["split" if got else "held"] += 1

    async with c:
        await c.status(deployment)  # connections up and identities proven before the start
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        start = time.monotonic()
        end = start + duration
        with anyio.move_on_after(duration):
            while True:
                try:
                    left = max(0.1, end - time.monotonic())
                    res = await c.acquire(deployment, ttl=30, holder=holder, wait=left, on_wait=on_wait)
                except LockHeldError:
                    continue
                except Exception as err:  # reported, not fatal
                    errors.append(f"{type(err).__name__}: {err}"[:200])
                    await anyio.sleep(0.2)
                    continue
                wins.append(time.monotonic())
                tokens.append(res.fencing_token or 0)
                attempts["won"] += 1
                try:
                    if hold > 0:
                        await anyio.sleep(hold)
                finally:
                    with anyio.CancelScope(shield=True):
                        await c.release(deployment, res.lock_id)
                        released.append(time.monotonic())
    doc = {
        "holder": holder,
        "start": start,
        "wins": wins,
        "tokens": tokens,
        "released": released,
        "attempts": attempts,
        "errors": errors[:5],
        "n_errors": len(errors),
    }
    print(json.dumps(doc), flush=True)


def bench_b6(r: Rig, rep: Report, *, duration: float, contenders: int = 8, hold: float = 0.0) -> None:
    print(f"B6: {contenders} contender processes on 3 clusters for {duration:g}s", flush=True)
    dep = r.deployment("b6", r.names[:3])
    r.clear()
    env = r.environ()
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in range(contenders):
            cmd = [
                sys.executable,
                str(ENTRY),
                "--contender",
                json.dumps(
                    {
                        "config": str(r.config_path),
                        "deployment": dep,
                        "holder": f"contender-{i + 1}",
                        "duration": duration,
                        "hold": hold,
                    }
                ),
            ]
            procs.append(
                subprocess.Popen(
                    cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"contender did not start: {line!r} {p.stderr.read() if p.stderr else ''}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=duration + 60)
            lines = [x for x in out.splitlines() if x.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"contender failed ({p.returncode}): {err[-2000:]}")
            results.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    t0 = min(x["start"] for x in results)
    wins = {x["holder"]: [w - t0 for w in x["wins"]] for x in results}
    counts = [len(v) for v in wins.values()]
    total = sum(counts)
    gaps = []
    for v in wins.values():
        marks = [0.0, *v, duration]
        gaps.append(max(b - a for a, b in itertools.pairwise(marks)))
    worst_gap = max(gaps)
    # the lock idle between a release and the next win (by anyone)
    events = sorted(
        [(w, "win") for x in results for w in x["wins"]] + [(t, "rel") for x in results for t in x["released"]]
    )
    idle = [b[0] - a[0] for a, b in itertools.pairwise(events) if a[1] == "rel" and b[1] == "win"]
    tries = {k: sum(x["attempts"][k] for x in results) for k in ("won", "split", "held")}
    order = sorted((w, x["holder"]) for x in results for w in x["wins"])
    again = sum(1 for a, b in itertools.pairwise(order) if a[1] == b[1])
    rep.raw["B6"] = {
        "duration": duration,
        "results": results,
        "max_gap_s": gaps,
        "idle_s": idle,
        "attempts": tries,
        "same_holder_again": again,
    }
    errs = sum(x["n_errors"] for x in results)
    rep.add(
        Row(
            "B6.rate",
            f"{contenders} contenders on 3 clusters: cycles/s; wins min/max per contender",
            f"{total / duration:.1f} cycles/s; wins min {min(counts)} / max {max(counts)}; errors {errs}",
            "",
            total / duration,
            "-",
            None,
        )
    )
    rep.add(
        Row(
            "B6.idle",
            "lock idle from a release to the next win: median / p95; failed attempts per win",
            f"{ms(median(idle))} / {ms(percentile(idle, 95))}; {(tries['split'] + tries['held']) / max(1, total):.1f} "
            f"(split votes {tries['split']}, found held {tries['held']}, wins {tries['won']}); "
            f"{again} of {max(0, total - 1)} wins went to the previous holder again",
            "",
            median(idle),
            "-",
            None,
        )
    )
    granted = sorted(t for x in results for t in x.get("tokens", []))
    rise = (granted[-1] - granted[0]) / (len(granted) - 1) if len(granted) > 1 else 0.0
    rep.add(
        Row(
            "B6.tokens",
            "fencing tokens: how far they rise per win (attempts that lose give theirs back)",
            f"{rise:.2f} per win ({granted[0] if granted else '-'} .. {granted[-1] if granted else '-'} over "
            f"{len(granted)} wins)",
            "",
            rise,
            "<= 3 per win",
            rise <= 3,
        )
    )
    rep.add(
        Row(
            "B6a",
            "longest time a contender went without a win",
            f"{worst_gap:.1f} s (min wins {min(counts)})",
            "",
            worst_gap,
            "<= 30 s, every contender wins",
            worst_gap <= 30 and min(counts) > 0,
        )
    )
