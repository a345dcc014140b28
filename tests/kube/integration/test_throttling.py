"""Throttling (HTTP 429) on real API servers: honoured within the deadline, never misread.

Two real sources of 429, each on the sandbox's kube-apiservers:

- **API Priority and Fairness.** A PriorityLevelConfiguration with no seats of its own
  and no borrowing (``Reject`` when full) and a FlowSchema sending one user's requests
  there: that user's requests run one at a time, and while one is executing every other
  is refused by the API server with ``429`` and ``Retry-After: 1``. A request is kept
  executing, on purpose, by an admission webhook that holds it (``Webhook.hold``): so
  the throttling is deterministic, and it hits reads as well as writes.
- **An admission webhook** denying a write with code 429 and ``retryAfterSeconds``: the
  API server answers the client with that status and a ``Retry-After`` header.

The user is a freshly minted one with exactly what ``rbac print`` grants; only its
requests, in the test's namespace, are affected.
"""

from __future__ import annotations

import json

import anyio
import pytest
from helpers.rbac import stdout_json, stdout_ok
from helpers.throttle import Throttled, outcomes_of, retried
from helpers.throttle import throttled as throttled  # the fixture

from coordinator.kube.client import KubeError, _classify_status, _retry_after
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import configmaps_path, lease_path

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------ API Priority and Fairness


def test_apf_throttles_a_busy_user_with_429_and_retry_after(throttled: Throttled) -> None:
    """The harness itself: while one of the user's requests runs, the API server refuses
    the next one with 429 and Retry-After, and the client classifies it as throttled."""
    throttled.allow_one_request_at_a_time(1)
    throttled.hold_a_request(1, 4)

    async def ask() -> KubeError:
        client = throttled.client(1, timeout=1.0)  # too short to wait out Retry-After
        try:
            with pytest.raises(KubeError) as caught:
                await client.request("GET", lease_path(throttled.env.namespace, "coordinator-lock-web"))
            return caught.value
        finally:
            await client.close()

    err = anyio.run(ask)
    assert err.kind == "throttled" and err.status == 429, err.detail
    assert err.retry_after == 1.0, err.detail
    assert "not retried" in err.detail, err.detail


def test_a_throttled_read_is_retried_after_retry_after_within_the_deadline(throttled: Throttled) -> None:
    """Two of three clusters refuse the user's reads for a few seconds: the command waits
    out Retry-After and reads them, instead of failing for want of a majority."""
    throttled.allow_one_request_at_a_time(1, 2)
    # Held for 5 s: the command's first request must reach both while they are held (a
    # loaded machine took 2.6 s to get a request to an unthrottled member).
    for i in (1, 2):
        throttled.hold_a_request(i, 5)
    proc = throttled.cli("-v", "--timeout", "15s", "-o", "json", "lock", "status", "web")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert {c["status"] for c in status["clusters"]} == {"free"}, status
    assert retried(proc.stderr) >= 2, proc.stderr  # both throttled clusters were retried


def test_throttling_past_the_deadline_is_unobservable_never_free(throttled: Throttled) -> None:
    throttled.allow_one_request_at_a_time(1, 2)
    for i in (1, 2):
        throttled.hold_a_request(i, 12)
    proc = throttled.cli("--timeout", "2s", "-o", "json", "lock", "acquire", "web")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    outcomes = outcomes_of(proc)
    assert outcomes["u1"] == outcomes["u2"] == "throttled", outcomes
    assert "never counted as free" in proc.stderr and "throttled" in proc.stderr, proc.stderr
    for thread in throttled.blockers:
        thread.join(timeout=30)
    # Nothing was left taken where it could be: the lease on u3 is free again.
    status = stdout_json(throttled.cli("-o", "json", "lock", "status", "web"))
    assert not status["held_by_majority"] and {c["status"] for c in status["clusters"]} == {"free"}, status


# ------------------------------------------------------------------ 429 from an admission webhook


def test_a_write_throttled_by_a_webhook_is_written_after_retry_after(throttled: Throttled) -> None:
    stdout_ok(throttled.cli("lock", "acquire", "web", "--ttl", "60s"))
    for i in (1, 2):
        throttled.throttle_writes(i, "coordinator-state-web", retry_after=1, times=1)
    proc = throttled.cli("-v", "--timeout", "5s", "-o", "json", "state", "set", "web", "owner=team")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(json.loads(proc.stdout)["confirmed"]) == ["u1", "u2", "u3"], proc.stdout
    assert retried(proc.stderr) >= 2, proc.stderr
    assert stdout_json(throttled.cli("-o", "json", "state", "get", "web")) == {"owner": "team"}


def test_a_write_refused_for_load_is_reported_as_not_written(throttled: Throttled) -> None:
    env = throttled.env
    stdout_ok(throttled.cli("lock", "acquire", "web", "--ttl", "60s"))
    stdout_ok(throttled.cli("state", "set", "web", "owner=team"))
    before = [env.sandbox.admin(i).get(f"{configmaps_path(env.namespace)}/coordinator-state-web") for i in (1, 2, 3)]
    for i in (1, 2, 3):  # Retry-After longer than the command may wait
        throttled.throttle_writes(i, "coordinator-state-web", retry_after=30, times=None)
    proc = throttled.cli("--timeout", "3s", "-o", "json", "state", "set", "web", "owner=other")
    assert proc.returncode != 0
    assert "Outcome unknown" not in proc.stderr, proc.stderr
    assert "Nothing was written" in proc.stderr, proc.stderr
    assert set(outcomes_of(proc).values()) == {"throttled"}, proc.stdout
    after = [env.sandbox.admin(i).get(f"{configmaps_path(env.namespace)}/coordinator-state-web") for i in (1, 2, 3)]
    assert [a["metadata"]["resourceVersion"] for a in after] == [b["metadata"]["resourceVersion"] for b in before]


def test_a_renewal_throttled_once_is_retried_not_lost(throttled: Throttled) -> None:
    stdout_ok(throttled.cli("lock", "acquire", "web", "--ttl", "60s"))
    for i in (1, 2):
        throttled.throttle_writes(i, "coordinator-lock-web", retry_after=1, times=1)
    proc = throttled.cli("-v", "--timeout", "5s", "-o", "json", "lock", "renew", "web")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "may be lost" not in proc.stderr and "lost" not in proc.stdout, proc.stdout + proc.stderr
    assert retried(proc.stderr) >= 1, proc.stderr
    status = stdout_json(throttled.cli("-o", "json", "lock", "status", "web"))
    assert status["held_by_majority"] and status["holder"] == "busy", status


# ------------------------------------------------------------------ classification


def test_429_is_throttled_and_unobservable() -> None:
    err = _classify_status(429, b'{"message": "Too many requests"}', {}, retry_after=2.0)
    assert err.kind == "throttled" and err.retry_after == 2.0 and "retry after 2s" in err.detail
    assert not Outcome.THROTTLED.observable
    from coordinator.engine.clusters import outcome_of

    assert outcome_of(err) is Outcome.THROTTLED


@pytest.mark.parametrize(
    ("header", "expected"),
    [("1", 1.0), ("0", 0.0), (" 7 ", 7.0), ("-3", None), ("soon", None), ("nan", None), ("inf", None), (None, None)],
)
def test_retry_after_in_seconds(header: str | None, expected: float | None) -> None:
    assert _retry_after(header, None) == expected


def test_retry_after_as_a_date_is_read_against_the_servers_own_date() -> None:
    from email.utils import parsedate_to_datetime

    server = parsedate_to_datetime("Tue, 01 Dec 2026 10:00:00 GMT")
    assert _retry_after("Tue, 01 Dec 2026 10:00:05 GMT", server) == 5.0
    assert _retry_after("Tue, 01 Dec 2026 10:00:05 GMT", None) is None  # no clock to read it by
