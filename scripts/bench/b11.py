"""B11: `lock status --all --watch` while a lock changes hands: RSS growth, and lag."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio

from bench.report import TARGETS, Report, Row
from bench.rig import Rig, fleet_deployments
from bench.stats import median, ms
from coordinator.ops.api import Coordinator


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def bench_b11(r: Rig, rep: Report, *, deployments: int, clusters: int, duration: float, warmup: float) -> None:
    import threading

    print(
        f"B11: `lock status --all --watch` over {deployments} x {clusters} for {duration:g}s, "
        "a lock changing hands every 2 s",
        flush=True,
    )
    deps = fleet_deployments(r, deployments, clusters)
    dep = deps[-1]
    r.clear()
    cmd = [sys.executable, "-m", "coordinator", "lock", "status", "--all", "--watch", "-o", "json"]
    proc = subprocess.Popen(
        cmd, env=r.environ(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", text=True
    )
    shown: list[tuple[float, str | None]] = []  # (when read, lock id of dep)
    errors: list[str] = []  # the watcher's stderr, drained so that a full pipe never blocks it
    rss: list[tuple[float, int]] = []
    stop = threading.Event()
    t_start = time.monotonic()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            t = time.monotonic()
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            for d in doc.get("deployments", []):
                if d.get("deployment") == dep:
                    shown.append((t, d.get("lock_id") if d.get("status") == "held" else None))

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            errors.append(line.rstrip())

    def sample() -> None:
        while not stop.wait(1.0):
            kib = _rss_kib(proc.pid)
            if kib is not None:
                rss.append((time.monotonic() - t_start, kib))

    threads = [threading.Thread(target=f, daemon=True) for f in (read, drain, sample)]
    for t in threads:
        t.start()
    changes: list[tuple[float, float, str]] = []  # (acquire started, acquire done, lock id)
    refused: list[str] = []  # the driver's acquires that did not win (none expected)

    async def drive() -> None:
        async with r.coordinator(5.0) as a, r.coordinator(5.0) as b:
            await anyio.sleep(3.0)  # the watcher's first view
            who = [(a, "bench-a"), (b, "bench-b")]
            held: tuple[Coordinator, str] | None = None
            i = 0
            while time.monotonic() - t_start < duration:
                if proc.poll() is not None:
                    raise RuntimeError(f"the watcher exited {proc.returncode}")
                c, name = who[i % 2]
                if held is not None:
                    await held[0].release(dep, held[1])
                t0 = time.monotonic()
                res = await c.acquire(dep, ttl=30, holder=name, reason="b11")
                if not res.acquired:
                    # not a change of hands: the watcher has nothing new to show
                    refused.append(f"{round(t0 - t_start)} s: {res.lost or 'not acquired'}")
                    held = None
                    await anyio.sleep(0.5)
                    continue
                changes.append((t0, time.monotonic(), res.lock_id))
                held = (c, res.lock_id)
                i += 1
                await anyio.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))
            await anyio.sleep(2.0)  # time for the last change to show
            if held is not None:
                await held[0].release(dep, held[1])

    try:
        anyio.run(drive)
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for t in threads:
            t.join(5)
    if refused:
        print(f"  B11: {len(refused)} of the driver's acquires did not win: {'; '.join(refused[:5])}", flush=True)
    if errors:
        print("  B11: the watcher's stderr (last lines):\n    " + "\n    ".join(errors[-10:]), flush=True)
    lags: list[float] = []
    for started, done, lock_id in changes:
        seen = next((t for t, lid in shown if t >= started and lid == lock_id), None)
        lags.append(math.inf if seen is None else max(0.0, seen - done))
    after = [kib for t, kib in rss if t >= warmup]
    growth_mb = (max(after) - after[0]) * 1024 / 1e6 if after else math.nan
    missed = sum(1 for x in lags if x == math.inf)
    missed_at = [round(c[0] - t_start) for c, lag in zip(changes, lags, strict=True) if lag == math.inf]
    finite = [x for x in lags if x != math.inf]
    rep.raw["B11"] = {
        "lags": lags,
        "rss": rss,
        "changes": len(changes),
        "never_shown_at_s": missed_at,
        "driver_not_acquired": refused,
        "watcher_stderr": errors[-50:],
        "duration": duration,
        "warmup": warmup,
    }
    rep.add(
        Row(
            "B11a",
            f"`lock status --all --watch` ({deployments}x{clusters}, {duration:g} s): RSS growth after {warmup:g} s",
            f"{growth_mb:.1f} MB ({after[0] / 1024:.0f} -> {max(after) / 1024:.0f} MiB)" if after else "no samples",
            "",
            growth_mb,
            f"<= {TARGETS['B11rss']:g} MB",
            bool(after) and growth_mb <= TARGETS["B11rss"],
        )
    )
    worst = max(lags) if lags else math.nan
    rep.add(
        Row(
            "B11b",
            f"each change shown after it happened: worst of {len(changes)} (median, never shown)",
            f"{ms(worst) if worst != math.inf else 'never'} (median {ms(median(finite)) if finite else '-'}; "
            f"{missed} never shown{': at ' + ', '.join(f'{x} s' for x in missed_at[:8]) if missed_at else ''}"
            f"{f'; {len(refused)} driver acquires lost' if refused else ''})",
            "",
            worst,
            f"<= {TARGETS['B11lag'] * 1000:.0f} ms",
            bool(lags) and worst <= TARGETS["B11lag"],
        )
    )
