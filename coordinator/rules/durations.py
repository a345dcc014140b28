"""Durations as users type them: ``90s``, ``3m``, ``1h``, ``1m30s`` or bare seconds."""

from __future__ import annotations

import re

from coordinator.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(
    text: str | float | int, *, what: str = "duration", at_least: float | None = None, why: str = ""
) -> float:
    """Return seconds; raise :class:`UsageError` with an example on anything else, and on
    a duration shorter than ``at_least`` where a shorter one makes no sense (``why``
    says what it would do)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        raw = str(text).strip().lower()
        try:
            seconds = float(raw)
        except ValueError:
            pos = 0
            seconds = 0.0
            for match in _PART.finditer(raw):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(raw) or not raw:
                raise UsageError(
                    f"{what}: {text!r} is not a duration. Use a number of seconds or a value "
                    "such as 90s, 3m, 1h or 1m30s."
                ) from None
    if seconds != seconds or seconds < 0 or seconds > 10 * 365 * 86400:
        raise UsageError(f"{what}: {text!r} is out of range (0 to 10 years).")
    if at_least is not None and seconds < at_least:
        because = f": {why}" if why else ""
        raise UsageError(f"{what}: {text!r} is too short; it must be at least {at_least:g}s{because}.")
    return seconds


# The shortest durations that make sense where zero does not, with what a shorter one does.
TIMEOUT_MIN = (0.1, "a request given no time to be answered fails on every cluster")
INTERVAL_MIN = (0.1, "the watch would ask the clusters again without pausing")
TTL_MIN = (1.0, "a lease must outlive the requests that take it")


def format_duration(seconds: float) -> str:
    """``130.4`` -> ``2m10s``; short and exact enough for people."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
