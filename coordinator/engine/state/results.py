"""What the register's operations return, the lock a write names, and per-cluster outcomes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from coordinator.config.models import StateEnvelope
from coordinator.engine.clusters import failed
from coordinator.engine.fanout import ClusterResult, outcomes
from coordinator.engine.register import Delivery, Replica, Stamp
from coordinator.kube.client import KubeError
from coordinator.rules.lease import LeaseView
from coordinator.rules.outcome import Outcome


class LockHandle(Protocol):
    """What a write needs of a lock held in this process (``api.HeldLock`` is one)."""

    @property
    def lock_id(self) -> str: ...

    @property
    def valid(self) -> bool: ...


LockArg = LockHandle | str | None


@dataclass
class Observed:
    """One cluster's replica and, when asked for, its lease, read together."""

    replica: Replica
    lease: LeaseView | None = None


@dataclass
class WriteReport:
    deployment: str
    version: int
    token: int
    quorum: int
    results: dict[str, ClusterResult[Any]]
    confirmed: list[str]
    write_id: str = ""
    outcome: str = "ok"  # ok | unknown | nothing | refused
    promised: list[str] = field(default_factory=list)
    saved: dict[str, str] = field(default_factory=dict)

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.token, self.version, self.write_id)

    @property
    def lagging(self) -> list[str]:
        return sorted(k for k, r in self.results.items() if not r.ok)

    def __repr__(self) -> str:
        # A few hundred characters: the replicas as read are left out (``results[name].value``).
        return (
            f"WriteReport(deployment={self.deployment!r}, outcome={self.outcome!r}, stamp='{self.stamp.short()}', "
            f"confirmed={self.confirmed}, lagging={self.lagging})"
        )


@dataclass
class ReadReport:
    deployment: str
    envelope: StateEnvelope | None
    winner: str | None
    replicas: dict[str, ClusterResult[Observed]]
    repaired: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    suspect: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        version = self.envelope.version if self.envelope is not None else None
        return (
            f"ReadReport(deployment={self.deployment!r}, winner={self.winner!r}, version={version}, "
            f"replicas={outcomes(self.replicas)}, repaired={self.repaired}, corrupt={self.corrupt})"
        )


def _definite(err: KubeError) -> bool:
    """The server said no: the request was not applied (a timeout or a 5xx says nothing)."""
    return err.status is not None and 400 <= err.status < 500 and err.status != 408


def _delivery(result: ClusterResult[Any]) -> Delivery:
    if result.ok:
        return Delivery.CONFIRMED
    if result.outcome is Outcome.CONFLICT or result.extra.get("definite"):
        return Delivery.REFUSED
    return Delivery.UNANSWERED


def _failed(cluster: str, err: KubeError, *, definite: bool | None = None) -> ClusterResult[Any]:
    result: ClusterResult[Any] = failed(cluster, err)
    result.extra["definite"] = _definite(err) if definite is None else definite
    return result


def _per_cluster(results: Mapping[str, ClusterResult[Any]]) -> str:
    return "; ".join(f"{k}: {r.outcome} ({r.detail})" for k, r in sorted(results.items()))


def _replicas(results: Mapping[str, ClusterResult[Observed]]) -> dict[str, Replica]:
    return {k: r.value.replica for k, r in results.items() if r.ok and r.value}
