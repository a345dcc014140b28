#!/usr/bin/env python3
"""Benchmarks of coordinator against local control planes: the entry point of the
package next to it, scripts/bench/ (its ``__init__`` explains the rows; ``--help`` too).

    python scripts/bench.py --quick
    python scripts/bench.py --json bench-results/full.json --plot bench-results/bench.png
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))  # the fault harness's toxiproxy controller: tests/faults

# This file's folder is on sys.path when it runs: ``bench`` is the package scripts/bench/.
from bench.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
