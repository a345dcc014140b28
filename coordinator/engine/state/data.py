"""The state document: dotted keys into it, what changed, and what JSON can hold exactly."""

from __future__ import annotations

import math
from typing import Any

from coordinator.errors import UsageError


def get_path(data: Any, key: str) -> Any:
    cur = data
    for part in key.split("."):
        # a list index is ASCII digits ('²' is a digit to str.isdigit, and no int)
        index = int(part) if part.isascii() and part.isdigit() and len(part) <= 18 else None
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and index is not None and index < len(cur):
            cur = cur[index]
        else:
            raise UsageError(f"Key {key!r} is not in the state (no {part!r} there).")
    return cur


def set_path(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if not all(parts):
        raise UsageError(f"Key {key!r} has an empty part; use names like replicas or app.version.")
    cur: Any = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if nxt is None:
            nxt = cur[part] = {}
        if not isinstance(nxt, dict):
            raise UsageError(f"Cannot set {key!r}: {part!r} holds a {type(nxt).__name__}, not a mapping.")
        cur = nxt
    cur[parts[-1]] = value


def changed_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        path = f"{prefix}{k}"
        a, b = old.get(k, _MISSING), new.get(k, _MISSING)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, path + ".")
        elif a != b:
            keys.append(path)
    return keys


_MISSING = object()


def plain_data_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as JSON exactly as given, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        cur, where = stack.pop()
        at = f" at {where}" if where else ""
        if isinstance(cur, dict):
            for k, v in cur.items():
                if not isinstance(k, str):
                    return f"the key {k!r}{at} is a {type(k).__name__}, not a string"
                stack.append((v, f"{where}.{k}" if where else k))
        elif isinstance(cur, list):
            stack.extend((v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(cur))
        elif isinstance(cur, float):
            if not math.isfinite(cur):
                return f"{cur!r}{at} is not a finite number"
        elif not (cur is None or isinstance(cur, str | int | bool)):
            return f"{cur!r}{at} is a {type(cur).__name__}"
    return None
