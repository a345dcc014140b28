"""B7: state document size 1 KiB -> 512 KiB: write and read latency growth."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from typing import Any

import anyio

from bench.report import TARGETS, Report, Row
from bench.rig import HOLDER, Rig
from bench.stats import median, ms, summary


def payload(size: int) -> dict[str, Any]:
    """A state document of about ``size`` bytes of JSON: parts of 1 KiB under one key."""
    parts = max(1, size // 1024)
    body = "x" * (1024 - 24)
    return {"blob": {f"part-{i:05d}": body for i in range(parts)}, "rev": 0}


async def size_series(r: Rig, dep: str, size: int, lock_id: str, reps: int, warmup: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"write": [], "read": [], "write_cpu": [], "read_cpu": []}
    c = r.coordinator(10.0)
    async with c:
        s = c.state(dep)
        await s.apply(payload(size), lock=lock_id, command="bench")
        for i in range(warmup + reps):
            t0, c0 = time.perf_counter(), time.process_time()
            await s.set({"rev": i + 1}, lock=lock_id, command="bench")
            t1, c1 = time.perf_counter(), time.process_time()
            await s.get()
            t2, c2 = time.perf_counter(), time.process_time()
            if i >= warmup:
                out["write"].append(t1 - t0)
                out["read"].append(t2 - t1)
                out["write_cpu"].append(c1 - c0)  # the client's CPU (it runs in this process)
                out["read_cpu"].append(c2 - c1)
    return out


def bench_b7(r: Rig, rep: Report, *, sizes_kib: Sequence[int], reps: int, warmup: int) -> None:
    print(f"B7: state size {list(sizes_kib)} KiB on 3 clusters: write and read latency", flush=True)
    dep = r.deployment("b7", r.names[:3])
    r.clear()
    lock: dict[str, str] = {}

    async def take() -> None:
        c = r.coordinator(5.0)
        async with c:
            lock["id"] = (await c.acquire(dep, ttl=600, holder=HOLDER)).lock_id

    anyio.run(take)
    series: dict[int, dict[str, list[float]]] = {}
    for kib in sizes_kib:
        series[kib] = anyio.run(lambda k=kib: size_series(r, dep, k * 1024, lock["id"], reps, warmup))  # type: ignore[misc]

    async def give_back() -> None:
        c = r.coordinator(5.0)
        async with c:
            await c.release(dep, lock["id"])

    anyio.run(give_back)
    rep.raw["B7"] = {str(k): {op: {"samples": v, **summary(v)} for op, v in s.items()} for k, s in series.items()}
    base = sizes_kib[0]
    top = sizes_kib[-1]
    # Where the size dominates: the sizes from 16 KiB up (below it a request's fixed cost
    # dominates and any slope reads as sub-linear).
    upper = [k for k in sizes_kib if k >= 16] or list(sizes_kib)
    for op in ("write", "read"):
        meds = {k: median(series[k][op]) for k in sizes_kib}
        # growth exponent: the least-squares slope of log(latency) on log(size) over the
        # upper sizes; 1 = linear, > 1 = worse than linear. The steepest step between two
        # consecutive sizes is shown too, for information: one noisy median moves it.
        fitted = slope([math.log(k) for k in upper], [math.log(meds[k]) for k in upper])
        steps = [math.log(meds[b] / meds[a]) / math.log(b / a) for a, b in itertools.pairwise(sizes_kib)]
        per_kib = (meds[top] - meds[upper[0]]) / (top - upper[0]) if top > upper[0] else math.nan
        cpu = {k: median(series[k][f"{op}_cpu"]) for k in sizes_kib}
        rep.add(
            Row(
                f"B7.{op}",
                f"state {op} latency {base} KiB -> {top} KiB (x{top // base} size)",
                f"{ms(meds[base])} -> {ms(meds[top])} (x{meds[top] / meds[base]:.1f}); growth exponent "
                f"{fitted:.2f} over {upper[0]}-{top} KiB (steepest step {max(steps):.2f}); "
                f"{per_kib * 1000:.2f} ms per extra KiB; client CPU {ms(cpu[base])} -> {ms(cpu[top])}",
                f"{base} KiB {ms(meds[base])}",
                fitted,
                f"exponent <= {TARGETS['B7']:g} (linear)",
                fitted <= TARGETS["B7"],
            )
        )


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` on ``xs``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else math.nan
