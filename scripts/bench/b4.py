"""B4 and B4': `coordinator lock status` as a whole process vs importing kubernetes_asyncio.client."""

from __future__ import annotations

import random
import sys

from bench.measure import (
    ProcessRun,
    run_process,
)
from bench.report import TARGETS, Report, Row
from bench.rig import Rig
from bench.stats import median, summary


def bench_b4(r: Rig, rep: Report, *, reps: int, warmup: int) -> None:
    print("B4: `coordinator lock status` over 5 clusters as a whole process vs importing kubernetes_asyncio.client")
    dep = r.deployment("b4", r.names[:5])
    r.clear()
    env = r.environ()
    cmds = {
        "status": [sys.executable, "-m", "coordinator", "lock", "status", dep],
        "import": [sys.executable, "-c", "import kubernetes_asyncio.client"],
        "python": [sys.executable, "-c", "pass"],
    }
    runs: dict[str, list[ProcessRun]] = {k: [] for k in cmds}
    order = list(cmds)
    for i in range(warmup + reps):
        random.shuffle(order)
        for k in order:
            run = run_process(cmds[k], env)
            if run.code != 0:
                raise RuntimeError(f"{cmds[k]} exited {run.code}: {run.stderr}")
            if i >= warmup:
                runs[k].append(run)
    rep.raw["B4"] = {
        k: {
            "wall": [x.wall for x in v],
            "cpu": [x.cpu for x in v],
            "rss_kib": [x.rss_kib for x in v],
            **summary([x.wall for x in v]),
        }
        for k, v in runs.items()
    }
    ws, wi, wp = (median([x.wall for x in runs[k]]) for k in ("status", "import", "python"))
    cs, ci = (median([x.cpu for x in runs[k]]) for k in ("status", "import"))
    peak = max(x.rss_kib for x in runs["status"]) / 1024
    rep.add(
        Row(
            "B4'a",
            "`lock status` (5 clusters) wall / `import kubernetes_asyncio.client` wall",
            f"{ws / wi:.2f} ({ws:.2f} s vs {wi:.2f} s; bare python {wp:.2f} s)",
            f"import {wi:.2f} s",
            ws / wi,
            f"<= {TARGETS['B4']:g}",
            ws / wi <= TARGETS["B4"],
        )
    )
    rep.add(
        Row(
            "B4'.cpu",
            "same, CPU time (user+sys) ratio, less sensitive to a busy machine",
            f"{cs / ci:.2f} ({cs:.2f} s vs {ci:.2f} s)",
            f"import {ci:.2f} s",
            cs / ci,
            "-",
            None,
        )
    )
    rep.add(
        Row(
            "B4'b",
            "`lock status` peak RSS (max of runs)",
            f"{peak:.0f} MiB (import alone {max(x.rss_kib for x in runs['import']) / 1024:.0f} MiB)",
            "",
            peak,
            f"<= {TARGETS['B4rss']:g} MB",
            peak * 2**20 <= TARGETS["B4rss"] * 1e6,
        )
    )
