"""Planted bugs: patches that put back, one at a time, a bug this project fixed, so that
the simulator can show it finds each (docs/simulator.md has the table). Each is selected
by name (``python scripts/simulate.py --plant NAME``) and undone when the run ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Plant:
    name: str
    bug: str  # what it puts back
    fix: str  # the commit that fixed it
    patch: Callable[[ExitStack], None]
    options: dict[str, Any]  # simulator options that reach the bug (fault kinds, sizes)


PLANTS: dict[str, Plant] = {}


def _set(stack: ExitStack, owner: Any, name: str, value: Any) -> None:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, saved)


@contextmanager
def planted(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    plant = PLANTS.get(name)
    if plant is None:
        raise KeyError(f"no planted bug {name!r} (known: {', '.join(sorted(PLANTS))})")
    with ExitStack() as stack:
        plant.patch(stack)
        yield
