"""Medians, percentiles and summaries of the samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile, ``p`` in [0, 100]."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "median": median(xs),
        "p25": percentile(xs, 25),
        "p75": percentile(xs, 75),
        "p95": percentile(xs, 95),
        "min": min(xs) if xs else math.nan,
        "max": max(xs) if xs else math.nan,
    }


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"
