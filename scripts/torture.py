#!/usr/bin/env python3
"""Safety under faults: contenders take the lock and write the state while faults are injected.

    python scripts/torture.py --quick                 # CI: a few minutes, every fault kind once
    python scripts/torture.py --minutes 60            # soak: every kind at least 20 times
    python scripts/torture.py --quick --clusters 5 --seed 7
    python scripts/torture.py --quick --kinds delete-lease-all,sigkill-lock-run --min-each 3
    python scripts/torture.py --quick --apiservers 2 --date-offset 2 --kinds pause-minority,latency

Starts its own sandbox clusters (etcd + kube-apiserver, in a temporary directory) with a
toxiproxy proxy in front of each API server, its own local config, and a deployment; runs
command-line and Python-API contenders (some under faketime, minutes off), `lock run`
contenders whose critical section is a process tree, and unfenced readers, while API
servers are paused, killed, slowed down and cut off, holders are SIGKILLed and SIGSTOPped
inside their critical sections, other clients edit the Lease, objects and a namespace are
deleted, an admission policy rejects state writes, an operator breaks the lock and
`lock run` is SIGKILLed, and members are added, removed and replaced (the run starts a
spare cluster for that); then checks mutual exclusion of the lock (no overlap, fencing
tokens rising) and linearizability of the state (no lost acknowledged write). See
tests/faults/contenders.py for what exactly is recorded.

The last line of the output is always

    N lock sections, M state ops, F faults injected (KIND n, ...), V violations

and the exit status is 0 only when V is 0 and every check could decide. On failure
the work directory (logs of every process, the histories as JSON) is kept and named.
Needs the control-plane and toxiproxy builds (scripts/build-controlplane.sh,
scripts/build-toxiproxy.sh); faketime is optional (without it every clock is real).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fault harness: tests/faults

from faults.contenders import default_contenders, extra_contenders
from faults.kinds import FAULT_KINDS, TARGETED_KINDS
from faults.rig import TortureOptions
from faults.run import run_torture, sigterm_as_interrupt

QUICK_SECONDS = 60.0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="torture.py",
        description="Run contenders against a sandbox deployment under injected faults and check the histories.",
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_SECONDS:g}s and on until every kind ran once, short faults (default)",
    )
    length.add_argument("--minutes", type=float, help="minutes of workload (a soak)")
    parser.add_argument("--clusters", type=int, choices=(3, 5), default=3, help="member clusters (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault schedule (default: random)")
    parser.add_argument("--contenders", type=int, default=4, help="CLI and API contender processes (default 4)")
    parser.add_argument("--runners", type=int, default=1, help="`lock run` contenders, process trees (default 1)")
    parser.add_argument("--readers", type=int, default=2, help="unfenced reader processes (default 2)")
    parser.add_argument(
        "--kinds",
        default=None,
        help=f"comma-separated fault kinds (default: all): {', '.join(FAULT_KINDS)}; "
        f"targeted schedules, only when named: {', '.join(TARGETED_KINDS)}",
    )
    parser.add_argument(
        "--min-each",
        type=int,
        default=None,
        help="go on until every kind ran this often (default: 1 for --quick, a third of the minutes for a soak)",
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="per-cluster request timeout, s (default 2)")
    parser.add_argument(
        "--apiservers",
        type=int,
        choices=(1, 2),
        default=1,
        help="kube-apiservers per cluster; 2 starts HA clusters (on one etcd, behind a front proxy)",
    )
    parser.add_argument(
        "--date-offset",
        type=float,
        default=0.0,
        help="with --apiservers 2: one kube-apiserver of every cluster answers this many seconds off",
    )
    parser.add_argument(
        "--spares",
        type=int,
        default=None,
        help="clusters started besides the members, for the membership kinds (default: 1 if one is chosen, else 0)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="work directory to use and keep (default: temporary)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be positive")
    if args.contenders < 2:
        parser.error("--contenders must be at least 2")
    if args.runners < 0 or args.readers < 0:
        parser.error("--runners and --readers must not be negative")
    if args.kinds is not None:
        args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        unknown = sorted(set(args.kinds) - set(FAULT_KINDS) - set(TARGETED_KINDS))
        if unknown or not args.kinds:
            parser.error(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS + TARGETED_KINDS)}")
    if args.min_each is not None and args.min_each < 0:
        parser.error("--min-each must not be negative")
    if args.date_offset and args.apiservers < 2:
        parser.error("--date-offset needs --apiservers 2")
    if args.spares is not None and args.spares < 0:
        parser.error("--spares must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    seconds = QUICK_SECONDS if args.minutes is None else args.minutes * 60.0

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    options = TortureOptions(
        clusters=args.clusters,
        seconds=seconds,
        seed=seed,
        contenders=default_contenders(args.contenders) + extra_contenders(args.runners, args.readers),
        request_timeout=args.timeout,
        workdir=args.dir,
        progress=progress,
        apiservers=args.apiservers,
        date_offset=args.date_offset,
        spares=args.spares,
    )
    if args.kinds:
        options.kinds = args.kinds
    if args.minutes is None:
        # Quick: shorter faults and gaps, and on past the time until every kind ran once.
        options.fault_gap, options.fault_length = (0.3, 1.0), (1.2, 2.5)
        options.min_each, options.overtime = 1, 480.0  # every kind once: on a busy machine a break took 57 s
        options.long_stop = 12.0  # long SIGSTOPs of API holders only (TTL 8 s)
    else:
        # A soak: every kind at least 20 times an hour (rounds of every kind, shuffled,
        # take about 3 minutes; the run goes on for up to a sixth longer if needed).
        options.min_each, options.overtime = max(1, int(args.minutes // 3)), max(120.0, seconds / 6)
    if args.min_each is not None:
        options.min_each = args.min_each
    try:
        with sigterm_as_interrupt():
            report = run_torture(options)
    except KeyboardInterrupt:
        print("interrupted; everything that was started has been stopped", file=sys.stderr)
        return 130
    print(report.render())
    for violation in report.violations:
        print(f"VIOLATION: {violation}")
    print(report.summary_line(), flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
