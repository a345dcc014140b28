"""B9: acquire over 9 vs 3 clusters; client CPU per extra cluster."""

from __future__ import annotations

from bench.measure import (
    cold,
    interleaved,
    parallel_acquire_on,
)
from bench.report import TARGETS, Report, Row
from bench.rig import Rig
from bench.stats import median, ms, summary


def bench_b9(r: Rig, rep: Report, *, reps: int, warmup: int, latency_ms: int = 50) -> None:
    print(f"B9: acquire over 9 vs 3 clusters at +{latency_ms} ms per cluster, fresh clients", flush=True)
    if len(r.names) < 9:
        raise RuntimeError(f"B9 needs 9 clusters, the rig has {len(r.names)}")
    deps = {n: r.deployment(f"b9-n{n}", r.names[:n]) for n in (3, 9)}
    r.clear()
    r.latency(latency_ms)
    try:
        cpu: dict[str, list[float]] = {}
        samples = interleaved(
            {f"n{n}": cold(r, parallel_acquire_on, dep) for n, dep in deps.items()}, reps, warmup, cpu
        )
    finally:
        r.clear()
    rep.raw["B9"] = {k: {"samples": v, "cpu": cpu.get(k, []), **summary(v)} for k, v in samples.items()}
    w3, w9 = median(samples["n3"]), median(samples["n9"])
    c3, c9 = median(cpu["n3"]), median(cpu["n9"])
    per_extra = (c9 - c3) / 6
    rep.add(
        Row(
            "B9",
            f"`lock acquire` over 9 / over 3 clusters at +{latency_ms} ms, fresh clients",
            f"{w9 / w3:.2f} ({ms(w9)} vs {ms(w3)})",
            f"3 clusters {ms(w3)}",
            w9 / w3,
            f"<= {TARGETS['B9']:g}",
            w9 / w3 <= TARGETS["B9"],
        )
    )
    rep.add(
        Row(
            "B9.cpu",
            "client CPU per extra cluster (acquire, fresh clients)",
            f"{per_extra * 1000:.1f} ms ({c9 * 1000:.0f} ms over 9 vs {c3 * 1000:.0f} ms over 3)",
            "",
            per_extra,
            "-",
            None,
        )
    )
