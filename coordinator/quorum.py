"""Pure decisions about majorities: no I/O, no clocks read here.

Everything that decides who won, what to release, whether a lease has expired, and
which replica is newest lives here, so it can be tested exhaustively without a cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from coordinator.outcome import Outcome

# How far the holder's clock rate may differ from an API server's, as a fraction.
DRIFT_FACTOR = 0.01
# Server timestamps (managedFields time, the Date header) have one-second resolution;
# two of them bound an interval only to within two seconds.
TIMESTAMP_SLACK_S = 2.0


def quorum_size(n: int) -> int:
    """q = floor(n/2) + 1: any two sets of q members out of n share at least one."""
    if n < 1:
        raise ValueError("a deployment has at least one cluster")
    return n // 2 + 1


def count(outcomes: Iterable[Outcome], wanted: Outcome = Outcome.OK) -> int:
    return sum(1 for o in outcomes if o is wanted)


def quorum_reached(outcomes: Iterable[Outcome], n: int) -> bool:
    return count(outcomes) >= quorum_size(n)


def quorum_impossible(outcomes: Iterable[Outcome], n: int) -> bool:
    """True once so many clusters answered "no" that q successes can no longer happen."""
    failures = sum(1 for o in outcomes if o is not Outcome.OK)
    return n - failures < quorum_size(n)


def failure_outcome(outcomes: Sequence[Outcome], n: int) -> Outcome:
    """Why a majority was not won: held by others (enough clusters were seen to say so),
    or unreachable (too few clusters were observable to decide anything)."""
    observable = sum(1 for o in outcomes if o.observable)
    return Outcome.HELD_BY_OTHER if observable >= quorum_size(n) else Outcome.UNREACHABLE


def drift_allowance(ttl_s: float) -> float:
    return ttl_s * DRIFT_FACTOR + 0.05


def remaining_validity(ttl_s: float, elapsed_s: float) -> float:
    """How long a holder may still act, counted on its own monotonic clock from the
    moment *before* it sent the requests that took or renewed the leases."""
    return ttl_s - elapsed_s - drift_allowance(ttl_s)


def server_elapsed(server_now: datetime | None, last_write: datetime | None) -> float | None:
    if server_now is None or last_write is None:
        return None
    return (server_now - last_write).total_seconds()


def lease_expired_by_server(ttl_s: float, server_now: datetime | None, last_write: datetime | None) -> bool | None:
    """Has a lease expired, judged only by one API server's own clock?

    ``last_write`` is the time the server stamped on the last change of the lease and
    ``server_now`` the time it put on the response we just read: both come from the same
    clock, so no client clock is trusted. ``None`` means no server evidence.
    """
    elapsed = server_elapsed(server_now, last_write)
    if elapsed is None:
        return None
    return elapsed > ttl_s + drift_allowance(ttl_s) + TIMESTAMP_SLACK_S


def server_remaining(ttl_s: float, server_now: datetime | None, last_write: datetime | None) -> float | None:
    """Seconds until a contender may take the lease over, by the server's clock."""
    elapsed = server_elapsed(server_now, last_write)
    if elapsed is None:
        return None
    return ttl_s + drift_allowance(ttl_s) + TIMESTAMP_SLACK_S - elapsed


def next_fencing_token(observed: Iterable[int]) -> int:
    """One more than every token seen on a majority: greater than all granted before."""
    return max([0, *observed]) + 1


def majority_holder(holders: Mapping[str, str | None], n: int) -> str | None:
    """The lock id that holds live leases on at least q of n clusters, if any."""
    tally = Counter(h for h in holders.values() if h)
    if not tally:
        return None
    lock_id, votes = tally.most_common(1)[0]
    return lock_id if votes >= quorum_size(n) else None


def majority_expiry(remaining: Sequence[float], n: int) -> float | None:
    """When a majority holder stops being one: the q-th longest remaining lease time."""
    q = quorum_size(n)
    if len(remaining) < q:
        return None
    return sorted(remaining, reverse=True)[q - 1]


def newest(orders: Mapping[str, tuple[int, int]]) -> str | None:
    """The replica with the highest (fencing token, version); ties go to the first name."""
    best: str | None = None
    for name in sorted(orders):
        if best is None or orders[name] > orders[best]:
            best = name
    return best


def behind(orders: Mapping[str, tuple[int, int]], winner: tuple[int, int]) -> list[str]:
    """Replicas older than the winner: the ones to repair."""
    return sorted(name for name, order in orders.items() if order < winner)


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
