"""B3 and B3': handoff to a waiting contender, watch-woken vs polling every 2 s."""

from __future__ import annotations

import random
import time
from typing import Any

import anyio

from bench.report import TARGETS, Report, Row
from bench.rig import Rig
from bench.stats import median, ms, percentile, summary
from coordinator.errors import LockHeldError
from coordinator.ops.api import Coordinator


async def wait_for_lock(
    c: Coordinator, dep: str, holder: str, got: dict[str, Any], done: anyio.Event, polling: bool, poll_every: float
) -> None:
    """The contender: ``acquire --wait`` (woken by lease watches), or a loop that tries
    and sleeps ``poll_every`` seconds between tries (the baseline)."""
    if polling:
        while True:
            try:
                got["res"] = await c.acquire(dep, ttl=60, holder=holder)
                break
            except LockHeldError:
                await anyio.sleep(poll_every)
    else:
        got["res"] = await c.acquire(dep, ttl=60, holder=holder, wait=60)
    got["t"] = time.perf_counter()
    done.set()


async def handoffs(r: Rig, dep: str, count: int, *, polling: bool, poll_every: float = 2.0) -> list[float]:
    """Alternate the lock between two holders in one process; return the handoff times:
    from the moment the holder starts releasing to the moment the waiter holds it."""
    out: list[float] = []
    a, b = r.coordinator(5.0), r.coordinator(5.0)
    names = {id(a): "bench-a", id(b): "bench-b"}
    async with a, b:
        holder_c, waiter_c = a, b
        held = await holder_c.acquire(dep, ttl=60, holder=names[id(a)])
        for _ in range(count):
            got: dict[str, Any] = {}
            done = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_lock, waiter_c, dep, names[id(waiter_c)], got, done, polling, poll_every)
                # the release lands at a random phase of the waiter's cycle
                await anyio.sleep(random.uniform(0.6, 2.6))
                t0 = time.perf_counter()
                await holder_c.release(dep, held.lock_id)
                with anyio.fail_after(30):
                    await done.wait()
            out.append(got["t"] - t0)
            held = got["res"]
            holder_c, waiter_c = waiter_c, holder_c
        await holder_c.release(dep, held.lock_id)
    return out


def bench_b3(r: Rig, rep: Report, *, count: int) -> None:
    print(f"B3: handoff on 3 clusters, {count} handoffs each: watch-woken waiter vs polling every 2 s", flush=True)
    dep = r.deployment("b3", r.names[:3])
    r.clear()
    samples: dict[str, list[float]] = {"wait": [], "poll": []}
    # interleave in blocks so that both see the same background load
    block = max(1, count // 3)
    done = 0
    while done < count:
        k = min(block, count - done)
        samples["wait"] += anyio.run(lambda k=k: handoffs(r, dep, k, polling=False))  # type: ignore[misc]
        samples["poll"] += anyio.run(lambda k=k: handoffs(r, dep, k, polling=True))  # type: ignore[misc]
        done += k
    rep.raw["B3"] = {k: {"samples": v, **summary(v)} for k, v in samples.items()}
    w, p = samples["wait"], samples["poll"]
    rep.add(
        Row(
            "B3.p95",
            "handoff with --wait: p95 (info); polling p95",
            f"{ms(percentile(w, 95))}; polling {ms(percentile(p, 95))}",
            "",
            percentile(w, 95),
            "-",
            None,
        )
    )
    rep.add(
        Row(
            "B3'a",
            f"handoff with --wait: median over {len(w)}",
            ms(median(w)),
            "",
            median(w),
            f"<= {TARGETS['B3median'] * 1000:.0f} ms",
            median(w) <= TARGETS["B3median"],
        )
    )
    rep.add(
        Row(
            "B3'b",
            f"handoff with --wait: p99 over {len(w)} (max {ms(max(w))})",
            ms(percentile(w, 99)),
            "",
            percentile(w, 99),
            f"<= {TARGETS['B3p99'] * 1000:.0f} ms",
            percentile(w, 99) <= TARGETS["B3p99"],
        )
    )
    rep.add(
        Row(
            "B3b",
            "handoff median, --wait / polling every 2 s",
            f"{median(w) / median(p):.3f} ({ms(median(w))} vs {ms(median(p))})",
            f"polling {ms(median(p))}",
            median(w) / median(p),
            "<= 1/3",
            median(w) / median(p) <= 1 / 3,
        )
    )
