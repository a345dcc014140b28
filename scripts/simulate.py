#!/usr/bin/env python3
"""The deterministic simulator: the real lock and state engines on in-memory API servers,
on a virtual clock, under a fault schedule drawn from a seed (tests/sim/simulate.py).

    python scripts/simulate.py --seed 7                       # one run
    python scripts/simulate.py --seed 1 --runs 50             # seeds 1..50
    python scripts/simulate.py --sections 1000000             # until a million sections
    python scripts/simulate.py --plant expiry-any-manager --until-found --shrink

Every run prints a line; a failing one its violations and the command that replays it.
The last line gives lock sections per CPU-hour beside the real-server soak's. The exit
status is 0 only when no run failed. Runs in a process whose string hashing is fixed
(PYTHONHASHSEED=0), so that a replay in another process runs the same way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from sim.simulate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
