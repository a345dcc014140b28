"""Writes and probes throttled with 429 by an admission webhook: never reported written,
never a lapsed lease taken, renewals retried."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

# The fixture `throttled`: a minted user with exactly the printed rights, and an admission
# webhook that can answer 429 (registered under its own name).
from helpers.throttle import throttled  # noqa: F401

from coordinator.rules.lease import lock_id_of
from coordinator.rules.resources import configmaps_path, lease_path

integration = pytest.mark.integration


@pytest.fixture
def busy(request: pytest.FixtureRequest) -> Any:
    """test_throttling's `throttled` (imported above so that pytest finds it)."""
    return request.getfixturevalue("throttled")


def _throttle_all(webhook: Any, match: Any, *, retry_after: int | None) -> None:
    """The webhook answers matching requests with 429; without ``retry_after``, with no
    retryAfterSeconds (so the API server sends no Retry-After)."""
    decide = webhook._decide

    def custom(cluster: int, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("name") or ((request.get("object") or {}).get("metadata") or {}).get("name") or ""
        key = (cluster, request["operation"], request["resource"]["resource"], name)
        if match(key):
            status: dict[str, Any] = {"code": 429, "reason": "TooManyRequests", "message": "slow down"}
            if retry_after is not None:
                status["details"] = {"retryAfterSeconds": retry_after}
            with webhook.lock:
                webhook.seen.append(key)
            return {"allowed": False, "status": status}
        return decide(cluster, request)

    webhook._decide = custom


@integration
def test_a_429_without_retry_after_is_throttled_and_the_write_not_written(busy: Any) -> None:
    from helpers.throttle import outcomes_of, retried

    env = busy.env
    assert busy.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert busy.cli("state", "set", "web", "owner=team").returncode == 0
    path = f"{configmaps_path(env.namespace)}/coordinator-state-web"
    before = [env.sandbox.admin(i).get(path)["metadata"]["resourceVersion"] for i in (1, 2, 3)]
    _throttle_all(busy.webhook, lambda k: k[3] == "coordinator-state-web", retry_after=None)
    proc = busy.env.cli("-v", "--timeout", "3s", "-o", "json", "state", "set", "web", "owner=other",
                             env={"COORDINATOR_HOLDER": "busy"})  # fmt: skip
    assert proc.returncode != 0
    assert "Outcome unknown" not in proc.stderr and "Nothing was written" in proc.stderr, proc.stderr
    assert set(outcomes_of(proc).values()) == {"throttled"}, proc.stdout
    assert retried(proc.stderr) == 0, proc.stderr  # no Retry-After: not sent again
    assert [env.sandbox.admin(i).get(path)["metadata"]["resourceVersion"] for i in (1, 2, 3)] == before


@integration
def test_data_throttled_everywhere_after_the_promise_is_reported_as_not_written(busy: Any) -> None:
    """The promise goes through on every member; then every data write is refused with
    429 past the deadline: nothing but the promise landed, so "not written", never
    "outcome unknown"."""
    from helpers.throttle import Rule, outcomes_of

    env = busy.env
    assert busy.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert busy.cli("state", "set", "web", "owner=team").returncode == 0
    for i in (1, 2, 3):
        busy.webhook.rules.append(Rule(lambda k, c=i: k[0] == c and k[3] == "coordinator-state-web", times=1))
        busy.throttle_writes(i, "coordinator-state-web", retry_after=30, times=None)
    proc = busy.cli("--timeout", "3s", "-o", "json", "state", "set", "web", "owner=other")
    assert proc.returncode != 0
    assert "Outcome unknown" not in proc.stderr, proc.stderr
    assert set(outcomes_of(proc).values()) == {"throttled"}, proc.stdout
    assert json.loads(busy.cli("-o", "json", "state", "get", "web").stdout) == {"owner": "team"}
    path = f"{configmaps_path(env.namespace)}/coordinator-state-web"
    assert all('owner":"other' not in env.sandbox.admin(i).get(path)["data"]["envelope.json"] for i in (1, 2, 3))


@integration
def test_a_throttled_probe_never_takes_a_lapsed_lease(busy: Any) -> None:
    """Alice's lease lapses; Bob's take-over needs a probe write on each lease, and the
    probe (every lease write) is refused with 429 past the deadline on two members: Bob
    does not get the lock, the two leases still name Alice's lock id."""
    from helpers.throttle import outcomes_of

    env = busy.env
    took = _json_ok(env.cli("-o", "json", "lock", "acquire", "web", "--ttl", "3s", env={"COORDINATOR_HOLDER": "alice"}))

    def alices(i: int) -> bool:
        lease = env.sandbox.admin(i).get(lease_path(env.namespace, "coordinator-lock-web"))
        return bool(lock_id_of(lease["spec"].get("holderIdentity")) == took["lock_id"])

    # A won acquisition does not wait for a straggling member: under load one of the three
    # may never have carried Alice's lease. The two throttled members are two that do.
    held = [i for i in (1, 2, 3) if alices(i)]
    assert len(held) >= 2, held
    chosen = held[:2]
    time.sleep(12)  # 3 s TTL + 2 s + 5 s skew margin, and some
    for i in chosen:
        busy.throttle_writes(i, "coordinator-lock-web", retry_after=30, times=None)
    proc = env.cli("--timeout", "3s", "-o", "json", "lock", "acquire", "web", env={"COORDINATOR_HOLDER": "bob"})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    outcomes = outcomes_of(proc)
    assert [outcomes[f"u{i}"] for i in chosen] == ["throttled", "throttled"], outcomes
    assert all(alices(i) for i in chosen), chosen


def _json_ok(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@integration
def test_a_renewal_throttled_once_inside_a_longer_lock_run_is_retried(busy: Any, tmp_path: Path) -> None:
    """A renewal inside `lock run` meets one 429 (Retry-After 1) on 2 of 3 members: it is
    sent again and the child runs to its end. A TTL of 15 s leaves a busy machine's delays
    room; the schedule's arithmetic at the shortest TTL (6 s, where one throttled renewal
    once lost the lock) is held on a virtual clock by
    tests/sim/test_renewals.py::test_one_throttled_renewal_in_the_shortest_lock_run_is_sent_again_in_time."""
    env = busy.env
    ready = tmp_path / "running"
    run = env.popen(
        "-v", "--timeout", "5s", "lock", "run", "web", "--ttl", "15s", "--",
        "sh", "-c", f"touch {ready}; sleep 8",
        env={"COORDINATOR_HOLDER": "busy"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        while not ready.exists():
            assert time.monotonic() < deadline and run.poll() is None, "lock run did not start its child"
            time.sleep(0.1)
        for i in (1, 2):
            busy.throttle_writes(i, "coordinator-lock-web", retry_after=1, times=1)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err[-800:]
    assert "throttled; retrying" in err, err[-800:]
