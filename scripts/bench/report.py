"""The report's rows, each a target (PASS/FAIL) or a figure for information, and the
round-two targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Targets of the rows added in round two (``--target ID=VALUE`` overrides one, e.g. to
# see a row fail): B10 connections per cluster; B8, B9 ratios; B3' median and p99 in
# seconds; B4' ratio and peak RSS in MB; B11 RSS growth in MB and worst lag in seconds;
# B7 the growth exponent of state latency with size (round one's row); B12 below.
TARGETS: dict[str, float] = {
    "B10": 1,
    "B8": 1.5,
    "B9": 1.3,
    "B3median": 0.100,
    "B3p99": 0.250,
    "B4": 1.3,
    "B4rss": 100,
    "B11rss": 5,
    "B11lag": 0.5,
    "B7": 1.1,
    # B12 (in-memory servers): the spread of requests per cluster across sizes, client CPU
    # seconds per extra cluster, and the fleet view's client CPU seconds over 500 x 50
    "B12requests": 0.5,
    "B12cpu": 0.005,
    "B12fleet": 2.0,
}


@dataclass
class Row:
    """One line of the report: a target (PASS/FAIL) or a figure for information."""

    id: str
    what: str
    measured: str
    baseline: str
    value: float | None
    target: str
    passed: bool | None  # None: information only

    @property
    def verdict(self) -> str:
        return "info" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  {row.id:<6} {row.verdict:<4} {row.what}: {row.measured} (target {row.target})", flush=True)
