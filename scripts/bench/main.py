"""Run the rows asked for on one rig, print the table, write the JSON and the plots."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

import bench
from bench.b1 import bench_b1
from bench.b2 import bench_b2
from bench.b3 import bench_b3
from bench.b4 import bench_b4
from bench.b5 import bench_b5
from bench.b6 import bench_b6, contender_main
from bench.b7 import bench_b7
from bench.b8 import bench_b8
from bench.b9 import bench_b9
from bench.b10 import bench_b10
from bench.b11 import bench_b11
from bench.b12 import bench_b12
from bench.output import environment, markdown, plot
from bench.report import TARGETS, Report, Row
from bench.rig import Interrupted, Rig, rig


def guarded(fig: str, fn: Callable[..., None], r: Rig, rep: Report, *args: Any, **kwargs: Any) -> None:
    """Run one figure; if it raises, say so as a failed row and go on with the others."""
    try:
        fn(r, rep, *args, **kwargs)
    except Exception as err:
        import traceback

        traceback.print_exc()
        r.clear()
        rep.add(
            Row(f"{fig}.error", f"{fig} could not be measured", f"{type(err).__name__}: {err}", "", None, "runs", False)
        )


class _NoRig(Exception):
    """Only rows that need no sandbox were asked for."""


def compile_package() -> None:
    """Compile coordinator's bytecode before measuring, as installing a wheel does.

    The library it is compared with (B4') was compiled when pip installed it; the package
    under test is an editable install whose bytecode is written on first import — unless
    PYTHONDONTWRITEBYTECODE is set, as on some machines, and then every command compiles
    the whole package from source again (about 70 ms of a 0.6 s start-up)."""
    import compileall

    import coordinator

    if not compileall.compile_dir(Path(coordinator.__file__).parent, quiet=1):
        raise SystemExit("could not compile the coordinator package")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and clusters (a few minutes)")
    ap.add_argument("--json", type=Path, help="write every figure, its target and PASS/FAIL here")
    ap.add_argument("--plot", type=Path, help="write the plots (PNG) here")
    ap.add_argument("--only", default="", help="comma-separated figures to run, e.g. B1,B4")
    ap.add_argument("--sandbox-dir", type=Path, help="use this running sandbox instead of starting one")
    ap.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="ID=VALUE",
        help=f"override a round-two target, e.g. B10=0 to see the row fail ({', '.join(TARGETS)})",
    )
    ap.add_argument("--contender", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for item in args.target:
        key, _, value = item.partition("=")
        if key not in TARGETS:
            ap.error(f"--target {item}: unknown target {key!r}")
        TARGETS[key] = float(value)
    if args.contender:
        spec = json.loads(args.contender)
        anyio.run(
            lambda: contender_main(spec["config"], spec["deployment"], spec["holder"], spec["duration"], spec["hold"])
        )
        return 0

    compile_package()
    quick = args.quick
    only = {x.strip().upper() for x in args.only.split(",") if x.strip()}

    def wanted(fig: str) -> bool:
        return not only or fig in only

    sizes = [1, 3, 5] if quick else [1, 3, 5, 7]
    n = 9 if wanted("B9") else max(sizes) if wanted("B1") else 5
    signal.signal(signal.SIGTERM, _on_sigterm)
    rep = Report()
    env = environment()
    mode = "quick" if quick else "full"
    t_start = time.monotonic()
    if wanted("B12"):  # on in-memory API servers: no sandbox
        try:
            bench_b12(rep, sizes=[3, 9, 25, 50], reps=2 if quick else 5, fleet_deployments=500)
        except Exception as err:
            import traceback

            traceback.print_exc()
            rep.add(
                Row("B12.error", "B12 could not be measured", f"{type(err).__name__}: {err}", "", None, "runs", False)
            )
    try:
        if only == {"B12"}:
            raise _NoRig()
        with rig(n, sandbox_dir=args.sandbox_dir) as r:
            # the fleet rows first: the fleet view shows every deployment on the clusters
            if wanted("B8"):
                guarded("B8", bench_b8, r, rep, deployments=20, clusters=5, reps=4 if quick else 12, warmup=1)
            if wanted("B11"):
                guarded(
                    "B11",
                    bench_b11,
                    r,
                    rep,
                    deployments=20,
                    clusters=5,
                    duration=45 if quick else 600,
                    warmup=15 if quick else 60,
                )
            if wanted("B10"):
                bench_b10(r, rep)
            if wanted("B4"):
                guarded("B4", bench_b4, r, rep, reps=6 if quick else 15, warmup=1 if quick else 2)
            if wanted("B1"):
                guarded("B1", bench_b1, r, rep, sizes=sizes, reps=5 if quick else 15, warmup=1 if quick else 2)
            if wanted("B5"):
                guarded("B5", bench_b5, r, rep, reps=5 if quick else 15, warmup=1 if quick else 2)
            if wanted("B2"):
                guarded(
                    "B2",
                    bench_b2,
                    r,
                    rep,
                    reps=4 if quick else 10,
                    warmup=1,
                    fail_reps=1 if quick else 3,
                    cli_reps=2 if quick else 4,
                )
            if wanted("B9"):
                guarded("B9", bench_b9, r, rep, reps=4 if quick else 15, warmup=1 if quick else 2)
            if wanted("B3"):
                with r.only_first(3):  # B3 runs on c1..c3
                    guarded("B3", bench_b3, r, rep, count=10 if quick else 100)
            if wanted("B7"):
                sizes_kib = [1, 16, 128, 512] if quick else [1, 4, 16, 64, 128, 256, 512]
                guarded("B7", bench_b7, r, rep, sizes_kib=sizes_kib, reps=3 if quick else 7, warmup=1)
            if wanted("B6"):
                guarded("B6", bench_b6, r, rep, duration=40 if quick else 120)
    except _NoRig:
        pass
    except (KeyboardInterrupt, Interrupted):
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    env["loadavg_end"] = os.getloadavg()
    env["elapsed_s"] = round(time.monotonic() - t_start, 1)
    table = markdown(rep, env, mode)
    print()
    print(table)
    failed = [row.id for row in rep.rows if row.passed is False]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "environment": env,
            "mode": mode,
            "rows": [asdict(row) | {"result": row.verdict} for row in rep.rows],
            "raw": rep.raw,
            "failed": failed,
        }
        args.json.write_text(json.dumps(doc, indent=2, default=str))
        print(f"\nJSON: {args.json}")
    if args.plot:
        plot(rep, args.plot)
        print(f"plot: {args.plot}")
    print(f"\n{len(rep.rows)} rows, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}")
    return 1 if failed else 0
