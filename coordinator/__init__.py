"""coordinator: majority-wins locks and quorum-replicated state across Kubernetes clusters.

The public API is what ``__all__`` lists, importable from here::

    from coordinator import Coordinator

    async with Coordinator.from_config() as c:
        async with c.lock("payments", ttl=180) as held:
            await c.state("payments").set({"replicas": 3}, lock=held)

The API's classes are imported on first use: every module of the package imports this
one first, and a command that only reads the lock must not pay for the write side,
pydantic or the state engine (tests/cli/unit/test_startup.py).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from coordinator.errors import (
    ConfigError,
    CoordinatorError,
    DriftError,
    ExitCode,
    IdentityMismatchError,
    LockHeldError,
    LockLostError,
    MembershipError,
    NoQuorumError,
    StateConflictError,
    UsageError,
)

__all__ = [
    "AcquireResult",
    "ClusterResult",
    "ConfigError",
    "Coordinator",
    "CoordinatorError",
    "DriftError",
    "ExitCode",
    "HeldLock",
    "IdentityMismatchError",
    "LockHeldError",
    "LockLostError",
    "LockStatus",
    "MembershipError",
    "NoQuorumError",
    "ReadReport",
    "StateClient",
    "StateConflictError",
    "UsageError",
    "WriteReport",
    "__version__",
]

# Imported on first use (the errors above cost nothing): these pull in the API's write
# side, pydantic and the state engine.
_LAZY = {
    "Coordinator": "coordinator.ops.api",
    "HeldLock": "coordinator.ops.api",
    "StateClient": "coordinator.engine.state.client",
    "AcquireResult": "coordinator.engine.lock.results",
    "LockStatus": "coordinator.engine.lock.results",
    "WriteReport": "coordinator.engine.state.results",
    "ReadReport": "coordinator.engine.state.results",
    "ClusterResult": "coordinator.engine.fanout",
}

if TYPE_CHECKING:
    from coordinator.engine.fanout import ClusterResult
    from coordinator.engine.lock.results import AcquireResult, LockStatus
    from coordinator.engine.state.client import StateClient
    from coordinator.engine.state.results import ReadReport, WriteReport
    from coordinator.ops.api import Coordinator, HeldLock


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
