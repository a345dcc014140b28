"""B1: lock acquire over N clusters, parallel fan-out vs the same steps cluster after cluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from bench.measure import (
    LAST_CPU,
    AcquireOn,
    cold,
    interleaved,
    parallel_acquire_on,
    warm_series,
)
from bench.report import Report, Row
from bench.rig import HOLDER, LATENCY_MS, Rig
from bench.stats import median, ms, summary
from coordinator.engine.lock.results import new_lock_id
from coordinator.ops.api import Coordinator


async def sequential_acquire_on(c: Coordinator, dep: str) -> float:
    """The baseline: the same per-cluster steps, one cluster after the other.

    Per cluster: the identity-checked read of the lease and the read of the state object
    (its token floor); then, with the token chosen from those reads, the per-cluster take
    (compare-and-swap write); then, as an acquisition does once it has won, the token
    floor raised on the state objects and the leases read again, each until a majority
    has answered (the parallel fan-out stops there too). Like a naive script or Redlock's
    reference loop, it visits every cluster in turn.
    """
    engine = c.lock_engine(dep)
    lock_id = new_lock_id()
    t0, cpu0 = time.perf_counter(), time.process_time()
    views = {}
    states = {}
    for name in engine.members:
        views[name] = await engine.core.checked_read(name)
        states[name] = await engine._floor.state_one(name)
    floors = [found[0] for k in engine._floor.present(states) if (found := states[k].value)]
    token = engine.core.new_token(views, floors, engine._floor.judge_state(states) is not None)
    if token is None:
        raise RuntimeError("sequential baseline: leases were deleted, no fencing token can be proven new")
    over = {"lost": False, "won": False, "mismatch": False, "membership": False}
    won = 0
    for name in engine.members:
        res = await engine._acquire._take_one(name, views[name], lock_id, token, 60, HOLDER, "bench", "bench", over)
        won += res.ok
    raised = 0
    for name in engine.members:
        if raised < engine.q:
            raised += (await engine._floor._raise_floor(name, token)).ok
    confirmed = 0
    for name in engine.members:
        if confirmed < engine.q:
            confirmed += (await engine.core.read(name)).lock_id == lock_id
    elapsed = time.perf_counter() - t0
    LAST_CPU[0] = time.process_time() - cpu0
    if min(won, raised, confirmed) < engine.q:
        raise RuntimeError(
            f"sequential baseline: took {won}, raised the floor on {raised}, confirmed {confirmed} "
            f"of {engine.n} clusters"
        )
    await engine.release(lock_id)
    return elapsed


def bench_b1(r: Rig, rep: Report, *, sizes: Sequence[int], reps: int, warmup: int) -> None:
    print(f"B1: acquire over N = {list(sizes)} clusters at +{LATENCY_MS} ms, parallel vs sequential", flush=True)
    deps = {n: r.deployment(f"b1-n{n}", r.names[:n]) for n in sizes}
    r.clear()
    r.latency(LATENCY_MS)
    variants: dict[str, Callable[[], float]] = {}
    for n, dep in deps.items():
        variants[f"parallel-{n}"] = cold(r, parallel_acquire_on, dep)
        variants[f"sequential-{n}"] = cold(r, sequential_acquire_on, dep)
    cpu: dict[str, list[float]] = {}
    samples = interleaved(variants, reps, warmup, cpu)
    warm_variants: dict[str, tuple[AcquireOn, str]] = {}
    for n, dep in deps.items():
        warm_variants[f"parallel-{n}"] = (parallel_acquire_on, dep)
        warm_variants[f"sequential-{n}"] = (sequential_acquire_on, dep)
    warm = warm_series(r, warm_variants, reps, warmup)
    r.clear()
    rep.raw["B1"] = {k: {"samples": v, "cpu": cpu.get(k, []), **summary(v)} for k, v in samples.items()}
    rep.raw["B1-warm"] = {k: {"samples": v, **summary(v)} for k, v in warm.items()}
    for n in sizes:
        p, s = median(samples[f"parallel-{n}"]), median(samples[f"sequential-{n}"])
        rep.add(
            Row(
                f"B1.n{n}",
                f"acquire over {n} at +{LATENCY_MS} ms: parallel / sequential median",
                f"{ms(p)} / {ms(s)}",
                "",
                p,
                "-",
                None,
            )
        )
    p1, p5, s5 = (median(samples[k]) for k in ("parallel-1", "parallel-5", "sequential-5"))
    rep.add(
        Row(
            "B1a",
            "acquire parallel(5) / parallel(1), one command's work (fresh clients)",
            f"{p5 / p1:.2f} ({ms(p5)} vs {ms(p1)})",
            f"parallel(1) {ms(p1)}",
            p5 / p1,
            "<= 1.3",
            p5 / p1 <= 1.3,
        )
    )
    rep.add(
        Row(
            "B1b",
            "acquire sequential(5) / parallel(5), one command's work (fresh clients)",
            f"{s5 / p5:.2f} ({ms(s5)} vs {ms(p5)})",
            f"parallel(5) {ms(p5)}",
            s5 / p5,
            ">= 3",
            s5 / p5 >= 3,
        )
    )
    c1, c5 = median(cpu["parallel-1"]), median(cpu["parallel-5"])
    rep.add(
        Row(
            "B1.cpu",
            "client CPU time of one acquire (fresh clients), parallel(5) vs parallel(1)",
            f"{ms(c5)} vs {ms(c1)} (+{(c5 - c1) * 1000 / 4:.0f} ms per extra cluster)",
            "",
            c5 - c1,
            "-",
            None,
        )
    )
    w1, w5, ws5 = (median(warm[k]) for k in ("parallel-1", "parallel-5", "sequential-5"))
    rep.add(
        Row(
            "B1.warm",
            "same, open Coordinator (connections and identities established): p(5)/p(1); s(5)/p(5)",
            f"{w5 / w1:.2f} ({ms(w5)} vs {ms(w1)}); {ws5 / w5:.2f} ({ms(ws5)} vs {ms(w5)})",
            "",
            w5 / w1,
            "-",
            None,
        )
    )
