"""The environment of a run, the report as a Markdown table, and the plots."""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.report import Report
from bench.stats import median


def environment() -> dict[str, Any]:
    free = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "free_g": free,
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def markdown(rep: Report, env: dict[str, Any], mode: str) -> str:
    lines = [
        f"Benchmarks ({mode}) — {env['date']}, nproc {env['nproc']}, load {env['loadavg'][0]:.1f}",
        "",
        "```",
        env["free_g"],
        "```",
        "",
        "| id | figure | measured | baseline | target | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rep.rows:
        lines.append(
            f"| {row.id} | {row.what} | {row.measured} | {row.baseline or '-'} | {row.target} | {row.verdict} |"
        )
    return "\n".join(lines)


def plot(rep: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(17, 10))
    axes = list(grid[0]) + list(grid[1])
    b1 = rep.raw.get("B1")
    ax = axes[0]
    if b1:
        for kind, style in (("parallel", "o-"), ("sequential", "s--")):
            ns = sorted(int(k.split("-")[1]) for k in b1 if k.startswith(kind))
            med = [b1[f"{kind}-{n}"]["median"] * 1000 for n in ns]
            lo = [m - b1[f"{kind}-{n}"]["p25"] * 1000 for n, m in zip(ns, med, strict=False)]
            hi = [b1[f"{kind}-{n}"]["p75"] * 1000 - m for n, m in zip(ns, med, strict=False)]
            ax.errorbar(ns, med, yerr=[lo, hi], fmt=style, capsize=4, label=f"{kind}, fresh clients per command")
        warm = rep.raw.get("B1-warm") or {}
        for kind, style in (("parallel", "^:"), ("sequential", "v:")):
            ns = sorted(int(k.split("-")[1]) for k in warm if k.startswith(kind))
            if ns:
                ax.plot(
                    ns, [warm[f"{kind}-{n}"]["median"] * 1000 for n in ns], style, label=f"{kind}, open Coordinator"
                )
        ax.set_xlabel("clusters (each +100 ms)")
        ax.set_ylabel("acquire latency, ms (median, p25-p75)")
        ax.set_title("B1: lock acquire vs number of clusters")
        ax.legend()
        ax.grid(alpha=0.3)
    b3 = rep.raw.get("B3")
    ax = axes[1]
    if b3:
        for kind, label in (("wait", "--wait (watch-woken)"), ("poll", "polling every 2 s")):
            xs = sorted(v * 1000 for v in b3[kind]["samples"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f"{label}, median {median(xs):.0f} ms")
        ax.set_xscale("log")
        ax.set_xlabel("handoff latency, ms (log)")
        ax.set_ylabel("fraction of handoffs (CDF)")
        ax.set_title("B3: handoff latency distribution (3 clusters)")
        ax.legend()
        ax.grid(alpha=0.3)
    b7 = rep.raw.get("B7")
    ax = axes[2]
    if b7:
        sizes = sorted(int(k) for k in b7)
        for op, style in (("write", "o-"), ("read", "s-")):
            ax.plot(sizes, [b7[str(k)][op]["median"] * 1000 for k in sizes], style, label=op)
        ref0 = b7[str(sizes[0])]["write"]["median"] * 1000
        ax.plot(sizes, [ref0 * k / sizes[0] for k in sizes], ":", color="grey", label="linear from 1 KiB write")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("state document size, KiB")
        ax.set_ylabel("latency, ms (median)")
        ax.set_title("B7: state latency vs document size (3 clusters)")
        ax.legend()
        ax.grid(alpha=0.3)
    ax = axes[3]
    shown = ("B1a", "B4'a", "B5.set", "B5.get", "B8a", "B9")
    ratios = [(row.id, row.value, row.passed) for row in rep.rows if row.id in shown]
    if ratios:
        ax.bar(
            [r_[0] for r_ in ratios],
            [r_[1] or 0 for r_ in ratios],
            color=["tab:green" if r_[2] else "tab:red" for r_ in ratios],
        )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("ratio to the baseline measured beside it")
        ax.set_title("side-by-side ratios (green: target met)")
        ax.grid(alpha=0.3, axis="y")
    b9 = rep.raw.get("B9")
    ax = axes[4]
    if b9:
        ax.boxplot([[x * 1000 for x in b9[k]["samples"]] for k in ("n3", "n9")])
        ax.set_xticks([1, 2], ["3 clusters", "9 clusters"])
        ax.set_ylabel("acquire latency, ms (fresh clients, +50 ms each)")
        ax.set_title("B9: acquire over 3 vs 9 clusters")
        ax.grid(alpha=0.3)
    b11 = rep.raw.get("B11")
    ax = axes[5]
    if b11 and b11.get("rss"):
        ts, kib = zip(*b11["rss"], strict=True)
        ax.plot(ts, [k / 1024 for k in kib], label="RSS of the watcher")
        ax.axvline(b11["warmup"], color="grey", ls=":", label="end of warm-up")
        ax.set_xlabel("seconds")
        ax.set_ylabel("MiB")
        finite = [x * 1000 for x in b11["lags"] if x != math.inf]
        worst = f"{max(finite):.0f} ms" if finite else "-"
        ax.set_title(f"B11: lock status --all --watch (worst delay shown {worst})")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
