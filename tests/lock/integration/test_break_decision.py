"""What on-call needs to decide on a break, on real API servers: when the holder last
renewed and what it runs (`lock status`), a break that names the lock it means
(`lock break --lock-id`), and what an unreachable member means for each deployment
(`cluster info`)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from coord_fixtures import Env

pytestmark = pytest.mark.integration


def _json(proc: Any) -> Any:
    assert proc.returncode in (0, 3, 4), proc.stderr
    return json.loads(proc.stdout)


def _take(env: Env, holder: str) -> str:
    proc = env.cli("-o", "json", "lock", "acquire", "web", "--holder", holder, "--ttl", "120s", "--reason", "r")
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["lock_id"])


def test_status_says_when_the_holder_last_renewed_and_what_it_runs(dep3: Env) -> None:
    before = time.monotonic()
    lock_id = _take(dep3, "alice")
    taken = time.monotonic()
    time.sleep(4)
    looked = time.monotonic()
    st = _json(dep3.cli("-o", "json", "lock", "status", "web"))
    assert st["lock_id"] == lock_id
    assert "lock acquire web --holder alice" in st["command"], st["command"]
    # Stamped by the server to the second: at least the time between the take's end and
    # the status read's start, less a second; at most the time since the take began, plus one.
    assert looked - taken - 1 <= st["renewed_ago_s"] <= time.monotonic() - before + 1, st
    rows = st["clusters"]
    assert all(r["command"] == st["command"] and r["renewed_ago_s"] is not None for r in rows), rows

    text = dep3.cli("lock", "status", "web")
    assert text.returncode == 0, text.stderr
    second = text.stdout.splitlines()[1]
    assert second.startswith("Taken ") and " ago), last renewed " in second and "s ago; command: " in second, second
    assert "lock acquire web --holder alice" in second, second
    assert text.stdout.splitlines()[2].split()[:5] == ["CLUSTER", "STATUS", "HOLDER", "RENEWED", "EXPIRES"]

    # A renewal shows at once.
    renewing = time.monotonic()
    assert dep3.cli("lock", "renew", "web", "--holder", "alice").returncode == 0
    st = _json(dep3.cli("-o", "json", "lock", "status", "web"))
    assert st["renewed_ago_s"] <= time.monotonic() - renewing + 1, st
    fleet = _json(dep3.cli("-o", "json", "lock", "status", "--all"))
    web = next(d for d in fleet["deployments"] if (d["deployment"], d["namespace"]) == ("web", dep3.namespace))
    assert web["command"] == st["command"] and web["renewed_ago_s"] is not None, web


def test_break_with_a_lock_id_refuses_another_lock_and_breaks_only_its_own(dep3: Env) -> None:
    alice = _take(dep3, "alice")
    wrong = dep3.cli("lock", "break", "web", "--lock-id", "0123456789abcdef", "--yes")
    assert wrong.returncode == 3, wrong.stderr
    assert "Lock 0123456789abcdef does not hold 'web', and nothing was broken" in wrong.stderr, wrong.stderr
    assert f"c1, c2, c3: held by alice (lock {alice})" in wrong.stderr, wrong.stderr
    assert _json(dep3.cli("-o", "json", "lock", "status", "web"))["lock_id"] == alice

    # Alice's lock ends and Bob's is taken before the break that meant Alice's runs.
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    bob = _take(dep3, "bob")
    late = dep3.cli("-o", "json", "lock", "break", "web", "--lock-id", alice, "--yes")
    assert late.returncode == 3, late.stderr
    doc = json.loads(late.stdout)
    assert doc["broken"] == [] and {c["outcome"] for c in doc["clusters"]} == {"held-by-other"}, doc
    st = _json(dep3.cli("-o", "json", "lock", "status", "web"))
    assert (st["holder"], st["lock_id"]) == ("bob", bob), st

    own = dep3.cli("-o", "json", "lock", "break", "web", "--lock-id", bob, "--yes")
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout)["broken"] == ["c1", "c2", "c3"]
    assert _json(dep3.cli("-o", "json", "lock", "status", "web"))["status"] == "free"


def test_cluster_info_of_an_unreachable_member_says_what_it_means_for_each_deployment(dep3: Env) -> None:
    up = _json(dep3.cli("-o", "json", "cluster", "info", "c2"))
    assert up["reachable"] is True and up["member_of"] is None, up

    dep3.sandbox.pause(2)
    doc = _json(dep3.cli("--timeout", "2s", "-o", "json", "cluster", "info", "c2"))
    assert doc["reachable"] is False
    [web] = doc["member_of"]
    assert (web["deployment"], web["namespace"], web["quorum"]) == ("web", dep3.namespace, "2 of 3"), web
    assert web["answering"] == ["c1", "c3"] and web["majority_without"] is True, web

    dep3.sandbox.pause(3)
    text = dep3.cli("--timeout", "2s", "cluster", "info", "c2")
    assert "c2 does not answer. Without it, web cannot reach a majority" in text.stdout, text.stdout
    row = next(line.split() for line in text.stdout.splitlines() if line.startswith("web "))
    assert row == ["web", dep3.namespace, "2", "of", "3", "c1", "NO"], row


@pytest.mark.parametrize("target", [["web"], ["--all"]])
def test_a_watch_prints_no_round_for_the_clock_alone(dep3: Env, target: list[str]) -> None:
    """The "renewed N s ago" and "expires in" figures move every second: a round is printed when
    something else changes, not every --interval."""
    import signal
    import subprocess

    _take(dep3, "alice")
    watch = dep3.popen(
        "-o", "json", "lock", "status", *target, "--watch", "--interval", "0.3s",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())  # the first round: the view is up
        assert first, first
        time.sleep(4)
    finally:
        watch.send_signal(signal.SIGTERM)
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert out.count("\n") == 0, f"{out.count(chr(10))} more rounds while nothing changed: {out[:500]}"
