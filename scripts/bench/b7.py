"""B7: state document size 1 KiB -> 512 KiB: write and read latency growth."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from typing import Any

import anyio

from bench.report import Report, Row
from bench.rig import HOLDER, Rig
from bench.stats import median, ms, summary


def payload(size: int) -> dict[str, Any]:
    """A state document of about ``size`` bytes of JSON: parts of 1 KiB under one key."""
    parts = max(1, size // 1024)
    body = "x" * (1024 - 24)
    return {"blob": {f"part-{i:05d}": body for i in range(parts)}, "rev": 0}


async def size_series(r: Rig, dep: str, size: int, lock_id: str, reps: int, warmup: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"write": [], "read": []}
    c = r.coordinator(10.0)
    async with c:
        s = c.state(dep)
        await s.apply(payload(size), lock=lock_id, command="bench")
        for i in range(warmup + reps):
            t0 = time.perf_counter()
            await s.set({"rev": i + 1}, lock=lock_id, command="bench")
            t1 = time.perf_counter()
            await s.get()
            t2 = time.perf_counter()
            if i >= warmup:
                out["write"].append(t1 - t0)
                out["read"].append(t2 - t1)
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
    for op in ("write", "read"):
        meds = {k: median(series[k][op]) for k in sizes_kib}
        # local growth exponent between consecutive sizes: 1 = linear, > 1 = worse than linear
        exps = [math.log(meds[b] / meds[a]) / math.log(b / a) for a, b in itertools.pairwise(sizes_kib)]
        worst = max(exps)
        top = sizes_kib[-1]
        rep.add(
            Row(
                f"B7.{op}",
                f"state {op} latency {base} KiB -> {top} KiB (x{top // base} size)",
                f"{ms(meds[base])} -> {ms(meds[top])} (x{meds[top] / meds[base]:.1f}); worst growth exponent "
                f"{worst:.2f}",
                f"{base} KiB {ms(meds[base])}",
                worst,
                "exponent <= 1.1 (linear)",
                worst <= 1.1,
            )
        )
