"""The fleet watch's wait before listing again after a watch broke (no server needed)."""

from __future__ import annotations

from coordinator.ops.fleet import RETRY_S, rewatch_wait


def test_a_watch_that_ran_a_while_is_listed_again_after_the_first_wait() -> None:
    # The wait had doubled to the most; a watch then ran for a minute and broke.
    assert rewatch_wait(RETRY_S[1], 60.0) == RETRY_S[0]
    # Exactly the longest wait counts as having run a while.
    assert rewatch_wait(RETRY_S[1], RETRY_S[1]) == RETRY_S[0]


def test_a_watch_refused_at_once_keeps_the_doubled_wait() -> None:
    for backoff in (RETRY_S[0], 2.0, RETRY_S[1]):
        assert rewatch_wait(backoff, 0.05) == backoff
        assert rewatch_wait(backoff, RETRY_S[1] - 0.01) == backoff
