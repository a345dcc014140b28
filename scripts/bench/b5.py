"""B5: `state set` / `state get` over 5 clusters vs over 1."""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable

import anyio

from bench.measure import (
    LAST_CPU,
    AcquireOn,
    cold,
    interleaved,
    warm_series,
)
from bench.report import Report, Row
from bench.rig import HOLDER, LATENCY_MS, Rig
from bench.stats import median, ms, summary
from coordinator.ops.api import Coordinator


async def state_op_on(c: Coordinator, dep: str, op: str, lock_id: str, i: int) -> float:
    s = c.state(dep)
    t0, cpu0 = time.perf_counter(), time.process_time()
    if op == "set":
        await s.set({"replicas": i, "app.version": f"1.{i}.0"}, lock=lock_id, command="bench")
    else:
        await s.get()
    LAST_CPU[0] = time.process_time() - cpu0
    return time.perf_counter() - t0


def bench_b5(r: Rig, rep: Report, *, reps: int, warmup: int) -> None:
    print(f"B5: state set / get over 5 clusters vs 1 cluster, all at +{LATENCY_MS} ms", flush=True)
    deps = {1: r.deployment("b5-n1", r.names[:1]), 5: r.deployment("b5-n5", r.names[:5])}
    r.clear()
    locks: dict[int, str] = {}

    async def take() -> None:
        async with r.coordinator(5.0) as c:
            for n, dep in deps.items():
                locks[n] = (await c.acquire(dep, ttl=600, holder=HOLDER)).lock_id
                await c.state(dep).set({"replicas": 0}, lock=locks[n])

    anyio.run(take)
    r.latency(LATENCY_MS)
    counter = itertools.count(1)

    def one(n: int, op: str) -> Callable[[Coordinator, str], Awaitable[float]]:
        return lambda c, dep: state_op_on(c, dep, op, locks[n], next(counter))

    variants: dict[str, Callable[[], float]] = {}
    warm_variants: dict[str, tuple[AcquireOn, str]] = {}
    for n, dep in deps.items():
        for op in ("set", "get"):
            variants[f"{op}-{n}"] = cold(r, one(n, op), dep)
            warm_variants[f"{op}-{n}"] = (one(n, op), dep)
    cpu: dict[str, list[float]] = {}
    samples = interleaved(variants, reps, warmup, cpu)
    warm = warm_series(r, warm_variants, reps, warmup)
    r.clear()

    async def give_back() -> None:
        async with r.coordinator(5.0) as c:
            for n, dep in deps.items():
                await c.release(dep, locks[n])

    anyio.run(give_back)
    rep.raw["B5"] = {k: {"samples": v, "cpu": cpu.get(k, []), **summary(v)} for k, v in samples.items()}
    rep.raw["B5-warm"] = {k: {"samples": v, **summary(v)} for k, v in warm.items()}
    for op in ("set", "get"):
        a, b = median(samples[f"{op}-5"]), median(samples[f"{op}-1"])
        rep.add(
            Row(
                f"B5.{op}",
                f"state {op}: 5 clusters / 1 cluster at +{LATENCY_MS} ms, one command's work (fresh clients)",
                f"{a / b:.2f} ({ms(a)} vs {ms(b)})",
                f"1 cluster {ms(b)}",
                a / b,
                "<= 1.3",
                a / b <= 1.3,
            )
        )
    cm = {k: median(v) for k, v in cpu.items()}
    rep.add(
        Row(
            "B5.cpu",
            "client CPU time (fresh clients): set 5 vs 1; get 5 vs 1",
            f"{ms(cm['set-5'])} vs {ms(cm['set-1'])}; {ms(cm['get-5'])} vs {ms(cm['get-1'])}",
            "",
            cm["set-5"] - cm["set-1"],
            "-",
            None,
        )
    )
    wa = {k: median(v) for k, v in warm.items()}
    rep.add(
        Row(
            "B5.warm",
            "same, open Coordinator: set 5/1; get 5/1",
            f"{wa['set-5'] / wa['set-1']:.2f} ({ms(wa['set-5'])} vs {ms(wa['set-1'])}); "
            f"{wa['get-5'] / wa['get-1']:.2f} ({ms(wa['get-5'])} vs {ms(wa['get-1'])})",
            "",
            wa["set-5"] / wa["set-1"],
            "-",
            None,
        )
    )
