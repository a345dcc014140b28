"""Pure quorum arithmetic: the size of a majority, and the rule of a member set or of a
joint configuration (a majority of every group). No I/O, no clocks.

When a lease has expired and how long a holder may act are the lease's rules
(coordinator/rules/lease.py); which replica is newest is the register's (coordinator/engine/register.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.rules.outcome import Outcome


def quorum_size(n: int) -> int:
    """q = floor(n/2) + 1: any two sets of q members out of n share at least one."""
    if n < 1:
        raise ValueError("a deployment has at least one cluster")
    return n // 2 + 1


def majority_expiry(remaining: Sequence[float], n: int) -> float | None:
    """When a majority holder stops being one: the q-th longest remaining lease time."""
    q = quorum_size(n)
    if len(remaining) < q:
        return None
    return sorted(remaining, reverse=True)[q - 1]


@dataclass(frozen=True)
class PossibleHolders:
    """The answer of :meth:`Majorities.possible_holders`: the lock ids seen that may hold
    the lock, and whether one nobody saw may (``unseen``)."""

    lock_ids: list[str]
    unseen: bool

    def __bool__(self) -> bool:
        return bool(self.lock_ids) or self.unseen


class Majorities:
    """The quorum rule of a member set, or of a joint configuration while the set changes:
    a decision needs a majority of *every* group (Raft's joint consensus), so that no
    majority of the old set and no majority of the new set can decide apart."""

    def __init__(self, groups: Sequence[Sequence[str]]) -> None:
        if not groups or any(not g for g in groups):
            raise ValueError("a configuration has at least one non-empty group")
        self.groups = [list(dict.fromkeys(g)) for g in groups]
        self.members = list(dict.fromkeys(m for g in self.groups for m in g))

    @property
    def joint(self) -> bool:
        return len(self.groups) > 1

    def reached(self, clusters: Iterable[str]) -> bool:
        chosen = set(clusters)
        return all(len(chosen.intersection(g)) >= quorum_size(len(g)) for g in self.groups)

    def impossible(self, failed: Iterable[str]) -> bool:
        """True once so many clusters said no that some group can no longer reach q."""
        lost = set(failed)
        return any(len(g) - len(lost.intersection(g)) < quorum_size(len(g)) for g in self.groups)

    def reached_by(self, results: Mapping[str, Outcome]) -> bool:
        return self.reached(c for c, o in results.items() if o is Outcome.OK)

    def impossible_by(self, results: Mapping[str, Outcome]) -> bool:
        return self.impossible(c for c, o in results.items() if o is not Outcome.OK)

    def holder(self, holders: Mapping[str, str | None]) -> str | None:
        """The lock id holding live leases on a majority of every group, if any."""
        for lock_id in dict.fromkeys(h for h in holders.values() if h):
            if self.reached(c for c, h in holders.items() if h == lock_id):
                return lock_id
        return None

    def possible_holders(self, live: Mapping[str, str | None], undecided: Iterable[str]) -> PossibleHolders:
        """Who may hold the lock when no lock id is seen on a majority: a lock id seen live
        on some members may hold a majority of every group if the ``undecided`` members
        (not observed, or blocking for an unknown holder: a deleted lease, a tombstone) are
        its too; a lock id seen nowhere may if the undecided members alone make one.
        Unobservable is never free: only when nobody may hold the lock is it not held."""
        open_ = set(undecided)
        lock_ids = [
            lock_id
            for lock_id in dict.fromkeys(h for h in live.values() if h)
            if self.reached(open_ | {c for c, h in live.items() if h == lock_id})
        ]
        return PossibleHolders(lock_ids, unseen=self.reached(open_))

    def expiry(self, remaining: Mapping[str, float]) -> float | None:
        """When a majority holder stops being one: the soonest of each group's q-th
        longest remaining lease time."""
        ends = []
        for g in self.groups:
            times = [remaining[c] for c in g if c in remaining]
            end = majority_expiry(times, len(g))
            if end is None:
                return None
            ends.append(end)
        return min(ends)

    @property
    def quorum(self) -> int:
        """For display: the q of the first (the current) group."""
        return quorum_size(len(self.groups[0]))

    def describe(self) -> str:
        parts = [f"{quorum_size(len(g))} of {len(g)} ({', '.join(g)})" for g in self.groups]
        return " and ".join(parts)
