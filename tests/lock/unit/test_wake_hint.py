"""When a waiting acquire wakes up for a lease held by another: the Date hint with the
margin a take waits out (coordinator/engine/lock/reports.py next_expiry)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from coordinator.engine.fanout import ClusterResult
from coordinator.engine.lock.reports import next_expiry
from coordinator.engine.lock.results import AcquireResult, ClusterLease
from coordinator.rules.lease import LeaseView, lapse_margin
from coordinator.rules.outcome import Outcome

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def result(*views: LeaseView) -> AcquireResult:
    names = [f"c{i + 1}" for i in range(len(views))]
    held_by_other = Outcome.HELD_BY_OTHER
    rows = {n: ClusterResult(n, held_by_other, ClusterLease(v, "held")) for n, v in zip(names, views, strict=True)}
    return AcquireResult("web", "ns", "mine", "me", None, False, 2, rows, list(rows), 8.0)


def held(ttl: int, written_ago: float, *, owned: bool = True) -> LeaseView:
    return LeaseView(
        exists=True,
        lock_id="theirs",
        ttl_s=ttl,
        ttl_owned=owned,
        server_now=NOW,
        own_write=NOW - timedelta(seconds=written_ago),
    )


def test_a_dead_lease_past_its_ttl_but_inside_the_skew_margin_is_not_retried_at_once() -> None:
    # TTL 8 s, last written 11 s ago: past TTL + drift + slack, not past the 5 s skew allowance.
    view = held(8, 11.0)
    want = 8 + lapse_margin(8, 5.0) - 11.0
    assert want > 3
    assert abs(next_expiry(result(view), 10.0, 5.0) - (want + 0.05)) < 1e-6
    # Counted without the skew allowance (as before), the waiter retried every 0.05 s.
    assert next_expiry(result(view), 10.0, 0.0) == 0.05


def test_a_lease_whose_ttl_another_manager_wrote_waits_for_the_deployments_maximum() -> None:
    view = held(1, 2.0, owned=False)  # leaseDurationSeconds cut to 1 s behind the holder's back
    assert abs(next_expiry(result(view), 10.0, 5.0) - (10 + lapse_margin(10, 5.0) - 2.0 + 0.05)) < 1e-6


def test_the_soonest_lease_wins_and_no_hint_means_two_seconds() -> None:
    soon, late = held(8, 14.0), held(8, 2.0)
    assert next_expiry(result(late, soon), 10.0, 5.0) == next_expiry(result(soon), 10.0, 5.0)
    assert next_expiry(result(LeaseView(exists=True, lock_id="theirs")), 10.0, 5.0) == 2.0
    # Past every margin: retried soon (the next attempt probes and takes it over).
    assert next_expiry(result(held(8, 60.0)), 10.0, 5.0) == 0.05
