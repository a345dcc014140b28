"""Durations as users type them: ``90s``, ``3m``, ``1h``, ``1m30s`` or bare seconds."""

from __future__ import annotations

import re

from coordinator.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str | float | int, *, what: str = "duration") -> float:
    """Return seconds; raise :class:`UsageError` with an example on anything else."""
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
    return seconds


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
