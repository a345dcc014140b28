"""What the lock's operations return: per-cluster rows, acquisitions, status; who is asking."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeAlias

from coordinator import clock
from coordinator.engine.fanout import ClusterResult, outcomes, short_text
from coordinator.rules.lease import (
    DEFAULT_MAX_TTL_S,
    LeaseView,
    TurnClaim,
    boot_clock,
    effective_ttl,
    remaining_validity,
)
from coordinator.rules.membership import Check


def default_holder() -> str:
    """``COORDINATOR_HOLDER``, else ``user@host`` and the CI job this runs in, if any
    (:func:`ci_job`): two jobs of one runner share the user and the host."""
    environ = clock.environ()
    env = environ.get("COORDINATOR_HOLDER")
    if env:
        return env
    user, host = clock.user(), clock.host()
    job = ci_job(environ, host)
    return f"{user}@{host} {job}" if job else f"{user}@{host}"


def ci_job(env: Mapping[str, str], host: str) -> str | None:
    """The CI job this process runs in, as the CI's own environment names it, or None.

    - GitHub Actions: ``GITHUB_RUN_ID``, ``GITHUB_RUN_ATTEMPT`` and ``GITHUB_JOB`` (the
      job's id in the workflow). The legs of a matrix share all three, so
      ``RUNNER_NAME`` is added: a runner runs one job at a time.
    - GitLab CI: ``CI_JOB_ID``, unique to each job (and each retry) on the instance.
    - A Kubernetes pod (Tekton, Argo Workflows, a runner in a pod): the host name, in
      the holder already, is the pod's name unless the pod sets ``spec.hostname``;
      ``POD_NAME``, when the pod sets it from the downward API and it differs, is added.
    """

    def word(name: str) -> str:
        return "".join(ch for ch in env.get(name, "") if ch.isprintable() and not ch.isspace())[:64]

    if run := word("GITHUB_RUN_ID"):
        parts = [f"github-run:{run}.{word('GITHUB_RUN_ATTEMPT') or '1'}"]
        if job := word("GITHUB_JOB"):
            parts.append(f"job:{job}")
        if runner := word("RUNNER_NAME"):
            parts.append(f"runner:{runner}")
        return " ".join(parts)
    if job := word("CI_JOB_ID"):
        return f"ci-job:{job}"
    if (pod := word("POD_NAME")) and pod != host:
        return f"pod:{pod}"
    return None


def new_lock_id() -> str:
    return clock.token_hex(8)


def utc_now() -> datetime:
    return clock.wall_now()


@dataclass
class ClusterLease:
    """What an operation left on one cluster (the report's row)."""

    view: LeaseView | None = None
    action: str = ""
    previous: LeaseView | None = None  # the lease as read before this write (for the history)


# What a compare-and-swap step decides on a lease as read: a final result, or the body
# to write with the action (and detail, if other than the action) to report.


# What a compare-and-swap step decides on a lease as read: a final result, or the body
# to write with the action (and detail, if other than the action) to report.
Decision: TypeAlias = ClusterResult[ClusterLease] | tuple[dict[str, Any], str, str]


@dataclass
class AcquireResult:
    deployment: str
    namespace: str
    lock_id: str
    holder: str
    fencing_token: int | None
    acquired: bool
    quorum: int
    results: dict[str, ClusterResult[ClusterLease]]
    members: list[str]
    ttl_s: float
    validity_s: float = 0.0
    started: float = 0.0  # boot-clock time before the writes were sent
    lost: str | None = None  # a renewal that found the lock taken or broken says why
    membership: Check | None = None  # what the members store, against the local record

    def valid_until(self) -> float:
        return self.started + remaining_validity(self.ttl_s, 0.0)

    def __repr__(self) -> str:
        # A few hundred characters: the leases as read are left out (``results[name].value``).
        held = f", fencing_token={self.fencing_token}, expires_in={self.expires_in():.1f}" if self.acquired else ""
        return (
            f"AcquireResult(deployment={self.deployment!r}, acquired={self.acquired}, lock_id={self.lock_id!r}, "
            f"holder={short_text(self.holder, 60)!r}{held}, clusters={outcomes(self.results)})"
        )

    def expires_in(self) -> float:
        return max(0.0, self.valid_until() - boot_clock())


@dataclass
class ClusterStatus:
    name: str
    status: str
    holder: str | None = None
    lock_id: str | None = None
    acquired_at: datetime | None = None
    renewed_at: datetime | None = None
    ttl_s: int | None = None
    transitions: int | None = None
    error: str | None = None
    token: int | None = None
    remaining_s: float | None = None
    info: dict[str, str] = field(default_factory=dict)
    # Seconds since coordinator last wrote this lease (taken or renewed), by the server's
    # own clock: its stamp on the write and its Date on the read (each to the second).
    renewed_ago_s: float | None = None


@dataclass
class LockStatus:
    deployment: str
    namespace: str
    quorum: int
    holder: str | None
    lock_id: str | None
    fencing_token: int | None
    held_by_majority: bool
    expires_in_s: float | None
    clusters: list[ClusterStatus]
    info: dict[str, str] = field(default_factory=dict)
    next_in_line: TurnClaim | None = None  # the waiter whose turn is next, if any
    # held (a lock id on a majority), unknown (the members seen do not decide it: someone
    # may hold it), partly-held (live leases, but nobody can hold a majority) or free
    verdict: str = "free"
    possible: list[PossibleHolder] = field(default_factory=list)  # with "unknown"
    possible_unseen: bool = False  # with "unknown": a holder nobody saw may hold it
    unobserved: list[str] = field(default_factory=list)  # members whose lease was not read
    # members read but blocking for a holder nobody can name (a deleted lease, a holder
    # field another client wrote): with ``unobserved``, where an unseen holder may be
    unnamed: list[str] = field(default_factory=list)
    # With a majority holder: the latest renewal of its leases (a sign of life), in seconds.
    renewed_ago_s: float | None = None

    def __repr__(self) -> str:
        holder = short_text(self.holder, 60) if self.holder is not None else None
        return (
            f"LockStatus(deployment={self.deployment!r}, verdict={self.verdict!r}, holder={holder!r}, "
            f"lock_id={self.lock_id!r}, fencing_token={self.fencing_token}, expires_in_s={self.expires_in_s}, "
            f"clusters={ {c.name: c.status for c in self.clusters} })"
        )


@dataclass
class PossibleHolder:
    """A lock id seen live on some members that may hold a majority with the members not
    observed (``lock status`` says "unknown" and names it)."""

    lock_id: str
    holder: str | None
    clusters: list[str]


def lease_expiry_s(view: LeaseView, max_ttl_s: float = DEFAULT_MAX_TTL_S) -> float | None:
    """The one expiry figure people are shown for a lease ("expires in", "majority held
    for", "valid for"): how long its holder may still count on it, as the holder counts
    its own validity (``remaining_validity``: the TTL less the drift allowance, from its
    last write), by the server's clock (its stamp on coordinator's last write and the
    read's ``Date``). Never below zero; None without those stamps.

    For display only. Whether a contender may take the lease over is the lease rules'
    question (``lease.lapsed_by_stamps``), with their margins: a lease shown expiring in
    0s can still be held for those few seconds."""
    if view.own_write is None or view.server_now is None:
        return None
    elapsed = (view.server_now - view.own_write).total_seconds()
    return max(0.0, remaining_validity(effective_ttl(view, max_ttl_s), elapsed))


def renewed_ago(view: LeaseView) -> float | None:
    """Seconds since coordinator's last take or renewal of ``view``, by the server's clock
    (its stamp on that write and the ``Date`` of the read, both to the second); never
    below zero. None when either is missing."""
    if view.own_write is None or view.server_now is None:
        return None
    return max(0.0, round((view.server_now - view.own_write).total_seconds(), 1))


def current_command() -> str:
    """The command line as a reader of `lock status` knows it: the program's base name
    (``coordinator`` also when run as ``python -m coordinator``, whose argv[0] is the
    package's ``__main__.py``) and its arguments."""
    argv = clock.argv()
    if not argv:
        return ""
    program = os.path.basename(argv[0])
    if program == "__main__.py" and os.path.basename(os.path.dirname(argv[0])) == "coordinator":
        program = "coordinator"
    return " ".join([program, *argv[1:]])[:200]
