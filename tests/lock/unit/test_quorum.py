"""Quorum arithmetic (coordinator/rules/quorum.py), checked exhaustively where the space is small."""

from __future__ import annotations

import itertools

import pytest

from coordinator.rules import lease, quorum
from coordinator.rules.outcome import Outcome


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


def test_forbidden_is_never_observable() -> None:
    assert not Outcome.FORBIDDEN.observable
    assert not Outcome.UNREACHABLE.observable
    assert Outcome.HELD_BY_OTHER.observable


def test_holder_validity_ends_before_any_contender_may_take_over() -> None:
    # The lease's rules (coordinator/rules/lease.py): the holder's validity, counted from before
    # its write, ends before a contender adds the lapse margin to the TTL from the
    # server's write stamp, whatever the TTL and with no server skew allowed at all.
    for ttl in (1, 5, 15, 180, 3600):
        assert lease.remaining_validity(ttl, 0.0) < ttl + lease.lapse_margin(ttl, 0.0) - lease.TIMESTAMP_SLACK_S


def test_majority_expiry_is_qth_longest() -> None:
    assert quorum.majority_expiry([30, 10, 20], 3) == 20
    assert quorum.majority_expiry([30], 3) is None
    assert quorum.majority_expiry([5, 50, 40, 30, 1], 5) == 30
