"""Pure decisions about majorities, checked exhaustively where the space is small."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from coordinator import quorum
from coordinator.outcome import Outcome


@pytest.mark.parametrize(("n", "q"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)])
def test_quorum_size(n: int, q: int) -> None:
    assert quorum.quorum_size(n) == q


def test_quorum_size_rejects_empty() -> None:
    with pytest.raises(ValueError):
        quorum.quorum_size(0)


@pytest.mark.parametrize("n", range(1, 8))
def test_any_two_majorities_intersect(n: int) -> None:
    q = quorum.quorum_size(n)
    members = range(n)
    for a in itertools.combinations(members, q):
        for b in itertools.combinations(members, q):
            assert set(a) & set(b), (n, a, b)


@pytest.mark.parametrize("n", range(1, 6))
def test_reached_and_impossible_are_exclusive_and_final(n: int) -> None:
    kinds = [Outcome.OK, Outcome.HELD_BY_OTHER, Outcome.UNREACHABLE]
    for k in range(n + 1):
        for combo in itertools.product(kinds, repeat=k):
            reached = quorum.quorum_reached(combo, n)
            impossible = quorum.quorum_impossible(combo, n)
            assert not (reached and impossible)
            if k == n:
                assert reached or impossible  # every answer in: decided one way


def test_failure_outcome_distinguishes_held_from_unobservable() -> None:
    held, ok, down = Outcome.HELD_BY_OTHER, Outcome.OK, Outcome.UNREACHABLE
    assert quorum.failure_outcome([held, held, ok], 3) is held
    assert quorum.failure_outcome([held, ok, down], 3) is held
    assert quorum.failure_outcome([held, down, down], 3) is down
    assert quorum.failure_outcome([ok, down, down], 3) is down
    assert quorum.failure_outcome([Outcome.FORBIDDEN, held, Outcome.FORBIDDEN], 3) is down


def test_forbidden_is_never_observable() -> None:
    assert not Outcome.FORBIDDEN.observable
    assert not Outcome.UNREACHABLE.observable
    assert Outcome.HELD_BY_OTHER.observable


T0 = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)


def test_expiry_uses_only_server_stamps() -> None:
    ttl = 10
    # 10 s after the last write is not yet expired: slack covers one-second stamps
    assert quorum.lease_expired_by_server(ttl, T0 + timedelta(seconds=10), T0) is False
    assert quorum.lease_expired_by_server(ttl, T0 + timedelta(seconds=12), T0) is False
    assert quorum.lease_expired_by_server(ttl, T0 + timedelta(seconds=13), T0) is True
    assert quorum.lease_expired_by_server(ttl, None, T0) is None
    assert quorum.lease_expired_by_server(ttl, T0, None) is None


def test_holder_validity_ends_before_any_contender_may_take_over() -> None:
    for ttl in (1, 5, 15, 180, 3600):
        # The holder's validity (counted from before its write) ends strictly before
        # a contender sees the lease expired (counted from the server's write stamp).
        holder_end = quorum.remaining_validity(ttl, 0.0)
        contender_wait = quorum.server_remaining(ttl, T0, T0)
        assert contender_wait is not None
        assert holder_end < contender_wait - quorum.TIMESTAMP_SLACK_S + 1e-9


def test_fencing_token_is_above_everything_seen() -> None:
    assert quorum.next_fencing_token([]) == 1
    assert quorum.next_fencing_token([3, 7, 5]) == 8
    assert quorum.next_fencing_token([0]) == 1


def test_majority_holder_needs_q_votes() -> None:
    assert quorum.majority_holder({"a": "x", "b": "x", "c": None}, 3) == "x"
    assert quorum.majority_holder({"a": "x", "b": "y", "c": None}, 3) is None
    assert quorum.majority_holder({"a": "x", "b": "x", "c": "y", "d": "y", "e": None}, 5) is None
    assert quorum.majority_holder({}, 3) is None


def test_majority_expiry_is_qth_longest() -> None:
    assert quorum.majority_expiry([30, 10, 20], 3) == 20
    assert quorum.majority_expiry([30], 3) is None
    assert quorum.majority_expiry([5, 50, 40, 30, 1], 5) == 30


def test_newest_and_behind_order_by_token_then_version() -> None:
    orders = {"a": (2, 5), "b": (3, 1), "c": (2, 9)}
    assert quorum.newest(orders) == "b"
    assert quorum.behind(orders, (3, 1)) == ["a", "c"]
    assert quorum.newest({}) is None
