"""What a command's per-cluster answers add up to: plain results in, a typed verdict out.

The CLI prints what a command found and then exits with the code the verdict gives
(through the error it returns); it does no majority arithmetic of its own. Pure: no I/O,
no clock, nothing heavier to import than the outcome and quorum rules, so that a
command's ``--help`` does not pay for the engines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from coordinator.errors import LockHeldError, NoQuorumError
from coordinator.rules.outcome import Outcome
from coordinator.rules.quorum import quorum_size

# ``lock status`` row statuses that say who holds a lease (or that nobody does).
OBSERVED_STATUSES = ("held", "free", "expired")
# The rows ``lock status`` names, for people, as not observed.
UNOBSERVABLE_STATUSES = (Outcome.UNREACHABLE, Outcome.FORBIDDEN, Outcome.ERROR, Outcome.IDENTITY_MISMATCH)


class StatusRow(Protocol):
    """One cluster's row of ``lock status`` (``coordinator.engine.lock.ClusterStatus``)."""

    @property
    def name(self) -> str: ...

    @property
    def status(self) -> str: ...


class Answer(Protocol):
    """One cluster's answer to an operation (``coordinator.engine.fanout.ClusterResult``)."""

    @property
    def outcome(self) -> Outcome: ...

    @property
    def detail(self) -> str: ...

    @property
    def ok(self) -> bool: ...


# ------------------------------------------------------------------ lock status


class PossibleHolderView(Protocol):
    """A lock id that may hold the lock (``coordinator.engine.lock.PossibleHolder``)."""

    @property
    def lock_id(self) -> str: ...

    @property
    def holder(self) -> str | None: ...

    @property
    def clusters(self) -> list[str]: ...


class StatusView(Protocol):
    """What ``lock status`` found (``coordinator.engine.lock.LockStatus``)."""

    @property
    def deployment(self) -> str: ...

    @property
    def quorum(self) -> int: ...

    @property
    def verdict(self) -> str: ...

    @property
    def possible(self) -> Sequence[PossibleHolderView]: ...

    @property
    def possible_unseen(self) -> bool: ...

    @property
    def clusters(self) -> Sequence[StatusRow]: ...

    @property
    def unnamed(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class StatusVerdict:
    """Whether ``lock status`` could say who holds the lock: "unknown" when the members it
    saw do not decide it (someone may hold a majority with the members it could not see)."""

    deployment: str
    quorum: int
    verdict: str  # held, unknown, partly-held, free
    observed: list[str]  # clusters whose lease was read (held, free or expired)
    unobserved: list[tuple[str, str]]  # (cluster, status) of the others
    not_seen: list[str]  # named for people: unreachable, forbidden, error, identity mismatch
    possible: list[str] = field(default_factory=list)  # "alice (lock 1f2e..., held on c1)"
    possible_unseen: bool = False
    # observed, but held by a holder nobody can name (a deleted lease, a holder field
    # another client wrote or whose writer's record is gone)
    unnamed: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.observed) + len(self.unobserved)

    @property
    def decided(self) -> bool:
        return self.verdict != "unknown"

    def who_may_hold(self) -> str:
        """The possible holders, in words: "alice (lock X, held on c1) or a holder not seen"."""
        parts = list(self.possible)
        if self.possible_unseen:
            places = [name for name, _ in self.unobserved] + self.unnamed
            parts.append(f"a holder nobody can name (on {', '.join(places)})" if places else "a holder not seen")
        return " or ".join(parts) or "nobody seen"

    def why_undecided(self) -> str:
        """Why the members seen do not decide it, in words."""
        why = []
        if self.unobserved:
            why.append(", ".join(f"{name} ({status})" for name, status in self.unobserved) + " could not be observed")
        if self.unnamed:
            why.append(f"the leases on {', '.join(self.unnamed)} count as held by a holder nobody can name")
        return "; ".join(why) or "the members seen do not decide it"

    def problem(self) -> NoQuorumError | None:
        """The error the command ends with (exit 4) when it cannot say who holds the lock."""
        if self.decided:
            return None
        unseen = ", ".join(f"{name} ({status})" for name, status in self.unobserved) or "none"
        unnamed = (
            f"; on {', '.join(self.unnamed)} the lease counts as held by a holder nobody can name"
            if self.unnamed
            else ""
        )
        return NoQuorumError(
            f"Who holds the lock of {self.deployment!r} is unknown: {len(self.observed)} of {self.total} "
            f"clusters could be observed (not observed: {unseen}){unnamed}, and with those it may be held by "
            f"{self.who_may_hold()}. Nobody is assumed to hold it or not, and an acquisition now would not "
            "take it; check the clusters with `coordinator cluster info NAME`."
        )


def _possible_text(p: PossibleHolderView) -> str:
    from coordinator.text import printable

    who = printable(p.holder) if p.holder else "an unnamed holder"
    return f"{who} (lock {printable(p.lock_id)}, held on {', '.join(p.clusters)})"


def status_verdict(st: StatusView) -> StatusVerdict:
    """``lock status``: its per-cluster rows in the order shown and the engine's verdict."""
    rows = st.clusters
    observed = [r.name for r in rows if r.status in OBSERVED_STATUSES]
    return StatusVerdict(
        deployment=st.deployment,
        quorum=st.quorum,
        verdict=st.verdict,
        observed=observed,
        unobserved=[(r.name, r.status) for r in rows if r.name not in observed],
        not_seen=[r.name for r in rows if r.status in UNOBSERVABLE_STATUSES],
        possible=[_possible_text(p) for p in st.possible],
        possible_unseen=st.possible_unseen,
        unnamed=list(st.unnamed),
    )


# ------------------------------------------------------------------ the fleet


class FleetView(Protocol):
    """What ``lock status --all`` listed (``coordinator.ops.fleet.Fleet``)."""

    @property
    def clusters(self) -> Mapping[str, str]: ...  # connected cluster -> "ok" or why it was not listed

    @property
    def unseen_clusters(self) -> list[str]: ...

    @property
    def too_few_listed(self) -> bool: ...

    @property
    def unknown(self) -> list[str]: ...  # deployments whose holder the clusters listed do not decide


def fleet_problem(fleet: FleetView) -> NoQuorumError | None:
    """The error ``lock status --all`` ends with (exit 4) when fewer than a majority of the
    connected clusters could be listed (``Fleet.too_few_listed`` decides), or when for some
    deployment the members listed do not decide who holds its lock."""
    unseen = fleet.unseen_clusters
    if not fleet.too_few_listed and fleet.unknown:
        return NoQuorumError(
            f"Who holds the lock of {', '.join(fleet.unknown)} is unknown: a holder may have a majority "
            "with the members that could not be listed or list no lease of it (see the table above). "
            "Nothing there is assumed free; check the clusters with `coordinator cluster info NAME`."
        )
    if not fleet.too_few_listed:
        return None
    return NoQuorumError(
        f"Only {len(fleet.clusters) - len(unseen)} of {len(fleet.clusters)} connected clusters could be "
        f"listed ({', '.join(f'{c} ({fleet.clusters[c]})' for c in unseen)}); the view above may miss "
        "most deployments, and nothing there is assumed free. Check the clusters with "
        "`coordinator cluster info NAME`."
    )


# ------------------------------------------------------------------ lock break


@dataclass(frozen=True)
class BreakVerdict:
    """Whether ``lock break`` cleared the lock on a majority of the members; with
    ``--lock-id``, which leases another lock holds (left alone)."""

    deployment: str
    cleared: int
    total: int
    lock_id: str | None = None
    broken: list[str] = field(default_factory=list)  # clusters where a holder was cleared
    held_by_others: list[tuple[str, str]] = field(default_factory=list)  # (cluster, who holds it)

    @property
    def quorum(self) -> int:
        return quorum_size(self.total)

    @property
    def done(self) -> bool:
        return self.cleared >= self.quorum

    def problem(self) -> LockHeldError | NoQuorumError | None:
        if self.held_by_others:
            return self._another_lock()
        if self.done:
            return None
        return NoQuorumError(
            f"The lock of {self.deployment!r} was cleared on only {self.cleared} of {self.total} clusters; "
            "the others could not be observed. Run the command again when they are reachable."
        )

    def _another_lock(self) -> LockHeldError:
        by_holder: dict[str, list[str]] = {}
        for cluster, who in self.held_by_others:
            by_holder.setdefault(who, []).append(cluster)
        held = "; ".join(f"{', '.join(cs)}: {who}" for who, cs in by_holder.items())
        done = (
            f"Lock {self.lock_id} was cleared on {', '.join(self.broken)}, and another lock was left alone "
            if self.broken
            else f"Lock {self.lock_id} does not hold {self.deployment!r}, and nothing was broken: another lock "
            "holds it "
        )
        return LockHeldError(
            done + f"({held}). --lock-id breaks only the lock it names. See `coordinator lock status "
            f"{self.deployment}`, and break that lock by its own id if its holder is gone too."
        )


def break_verdict(deployment: str, results: Mapping[str, Any], lock_id: str | None = None) -> BreakVerdict:
    """``results``: each member's answer to the break (``ClusterResult`` whose value, if
    any, has the ``action`` taken: "broken" where a holder was cleared); with
    ``lock_id``, a lease another lock holds is ``held-by-other``, its detail who holds it."""
    others = [
        (name, r.detail)
        for name, r in sorted(results.items())
        if lock_id is not None and r.outcome is Outcome.HELD_BY_OTHER
    ]
    broken = [name for name, r in sorted(results.items()) if r.ok and getattr(r.value, "action", None) == "broken"]
    return BreakVerdict(deployment, sum(1 for r in results.values() if r.ok), len(results), lock_id, broken, others)


# ------------------------------------------------------------------ lock history


NOT_WAITED_FOR_MEMBER = "not waited for"


@dataclass(frozen=True)
class HistoryVerdict:
    """Which members' copies of the lock history were read, and whether a majority was."""

    deployment: str
    members: list[str]  # the record's members, then any other cluster that answered
    unread: dict[str, str]  # member -> why its copy is missing ("outcome: detail")

    @property
    def read(self) -> int:
        return len(self.members) - len(self.unread)

    @property
    def complete(self) -> bool:
        return self.read >= quorum_size(len(self.members))

    def problem(self) -> NoQuorumError | None:
        if self.complete:
            return None
        return NoQuorumError(
            f"The lock history of {self.deployment!r} was read on only {self.read} of {len(self.members)} "
            "members; entries may be missing. Try again when they answer."
        )


def history_verdict(deployment: str, members: Iterable[str], results: Mapping[str, Answer]) -> HistoryVerdict:
    unread = {name: f"{r.outcome}: {r.detail}" for name, r in sorted(results.items()) if not r.ok}
    everyone = list(dict.fromkeys([*members, *results]))
    unread.update({m: NOT_WAITED_FOR_MEMBER for m in everyone if m not in results})
    return HistoryVerdict(deployment, everyone, unread)


# ------------------------------------------------------------------ a waiting acquire


@dataclass(frozen=True)
class Waiting:
    """Where a waiting ``lock acquire`` stands after one attempt."""

    holders: list[str] = field(default_factory=list)  # who holds the leases it was refused, named
    expires_in_s: float | None = None  # the soonest of those leases to expire
    other_outcomes: list[str] = field(default_factory=list)  # the other answers' outcomes


def waiting(results: Mapping[str, Any], expiry: Callable[[Any], float | None] | None = None) -> Waiting:
    """From an attempt's results (``ClusterResult`` whose value has the lease ``view``);
    ``expiry``: a lease's expiry figure (``lock.results.lease_expiry_s`` of a held lease)."""
    from coordinator.text import printable

    if expiry is None:
        from coordinator.engine.lock.results import lease_expiry_s

        def expiry(view: Any) -> float | None:
            return lease_expiry_s(view) if view.held else None

    def holder_of(view: Any) -> str:
        if view.vanished:
            return "an unknown holder (deleted lease)"
        claim = getattr(view, "live_claim", None)
        if not getattr(view, "held", True) and claim is not None:
            # Free, and handed to the contender that has waited longest: name that one.
            return f"{printable(claim.holder or '') or 'another contender'} (next in line)"
        return printable(view.info.get("holder") or "") or "an unnamed holder"

    refused = [
        r.value.view for r in results.values() if r.outcome is Outcome.HELD_BY_OTHER and r.value and r.value.view
    ]
    remaining = [rem for view in refused if (rem := expiry(view)) is not None]
    return Waiting(
        holders=sorted({holder_of(view) for view in refused}),
        expires_in_s=min(remaining) if remaining else None,
        other_outcomes=sorted({str(r.outcome) for r in results.values() if r.outcome is not Outcome.HELD_BY_OTHER}),
    )


# ------------------------------------------------------------------ state diff


# The replica statuses of ``state diff`` that were read (anything else was not).
READ_REPLICA_STATUSES = ("current", "behind", "absent", "empty", "suspect", "conflict", "corrupt", "newer-schema")


@dataclass(frozen=True)
class ReplicasVerdict:
    """What ``state diff`` concludes from its per-cluster rows."""

    equal: bool  # every replica current, under one stamp, with one checksum
    empty: bool  # no replica holds any state yet
    by_status: dict[str, list[str]]  # status -> clusters, in row order
    behind: list[str]  # behind, then absent: what a read or `state sync` repairs
    behind_data_differs: bool  # the data of current and behind replicas is not all the same
    unread: list[str]  # clusters whose replica could not be read


def replicas_verdict(rows: Sequence[Mapping[str, Any]]) -> ReplicasVerdict:
    """``rows``: ``state diff``'s documents (name, status, token, version, write_id, checksum)."""
    stamps = {(r["token"], r["version"], r["write_id"]) for r in rows}
    sums = {r["checksum"] for r in rows}
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(r["status"], []).append(r["name"])
    return ReplicasVerdict(
        equal=all(r["status"] == "current" for r in rows) and len(stamps) == 1 and len(sums) == 1,
        empty=all(r["status"] == "empty" for r in rows),
        by_status=by,
        behind=by.get("behind", []) + by.get("absent", []),
        behind_data_differs=len({r["checksum"] for r in rows if r["status"] in ("current", "behind")}) > 1,
        unread=[r["name"] for r in rows if r["status"] not in READ_REPLICA_STATUSES],
    )
