"""`lock status` never calls a lock free when the members it could not see may hold it.

Unobservable is not free: when no lock id is seen on a majority, but one seen on some
members (or a holder nobody saw) could have a majority together with the members that
did not answer, the status is "unknown", names who may hold it, and exits 4 — for one
deployment, the fleet, and each `--watch` round.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from coord_fixtures import Env
from faults.kubectl import kubectl as run_kubectl


@contextmanager
def paused(env: Env, *indexes: int) -> Iterator[None]:
    for i in indexes:
        env.sandbox.pause(i)
    try:
        yield
    finally:
        for i in indexes:
            env.sandbox.resume(i)


def _acquire(env: Env, holder: str) -> str:
    proc = env.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "web", "--holder", holder, "--ttl", "120s")
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["lock_id"])


def _acquire_for(env: Env, holder: str, ttl: str) -> str:
    proc = env.cli("-o", "json", "lock", "acquire", "web", "--holder", holder, "--ttl", ttl)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["lock_id"])


def _status(env: Env, *extra: str) -> subprocess.CompletedProcess[str]:
    return env.cli("--timeout", "2s", "lock", "status", *extra)


def test_a_lock_held_on_a_member_that_stops_answering_is_unknown_never_free(dep3: Env) -> None:
    # Alice takes c1 and c2 while c3 is down; then c2 stops answering and c3 is back.
    with paused(dep3, 3):
        lock_id = _acquire(dep3, "alice")
    with paused(dep3, 2):
        proc = _status(dep3, "web", "-o", "json")
        assert proc.returncode == 4, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["status"] == "unknown"
        assert doc["holder"] is None and doc["held_by_majority"] is False
        assert doc["possible_holders"] == [{"holder": "alice", "lock_id": lock_id, "clusters": ["c1"]}]
        assert "is unknown" in proc.stderr and "alice" in proc.stderr and "c2 (unreachable)" in proc.stderr

        text = _status(dep3, "web")
        assert text.returncode == 4, text.stderr
        assert "UNKNOWN whether it is held" in text.stdout and "alice" in text.stdout
        assert "not held" not in text.stdout

        # The same conclusion an acquisition draws at that moment: it cannot take it.
        bob = dep3.cli("--timeout", "2s", "lock", "acquire", "web", "--holder", "bob")
        assert bob.returncode == 3, bob.stderr

        fleet = _status(dep3, "--all", "-o", "json")
        assert fleet.returncode == 4, fleet.stderr
        entry = next(d for d in json.loads(fleet.stdout)["deployments"] if d["namespace"] == dep3.namespace)
        assert entry["status"] == "unknown" and entry["possible_holders"] == ["alice"], entry
        assert "is unknown" in fleet.stderr

    # Seen again, it is alice's, exit 0; released, free.
    held = _status(dep3, "web", "-o", "json")
    assert held.returncode == 0 and json.loads(held.stdout)["status"] == "held", held.stderr
    assert dep3.cli("lock", "release", "web", "--lock-id", lock_id).returncode == 0
    with paused(dep3, 2):
        free = _status(dep3, "web", "-o", "json")
        assert free.returncode == 0, free.stderr
        assert json.loads(free.stdout)["status"] == "free"


def test_five_members_splits_of_held_free_and_unseen(dep5: Env) -> None:
    # Alice holds c1, c2, c3 (c4, c5 were down when she took it, and stay free).
    with paused(dep5, 4, 5):
        lock_id = _acquire(dep5, "alice")
    with paused(dep5, 3, 4):
        # c1, c2 alice; c3, c4 unseen; c5 free: alice may have 3 of 5.
        proc = _status(dep5, "web", "-o", "json")
        assert proc.returncode == 4, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        assert doc["status"] == "unknown" and doc["holder"] is None
        assert [(p["lock_id"], p["clusters"]) for p in doc["possible_holders"]] == [(lock_id, ["c1", "c2"])]
    with paused(dep5, 1, 2, 3):
        # c4, c5 free; c1..c3 unseen: a holder this command did not see may have 3 of 5.
        proc = _status(dep5, "web", "-o", "json")
        assert proc.returncode == 4, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["status"] == "unknown"
        assert doc["possible_holders"] == [{"holder": None, "lock_id": None, "clusters": ["c1", "c2", "c3"]}]
    with paused(dep5, 4, 5):
        # c1..c3 alice: held, whatever c4 and c5 say.
        proc = _status(dep5, "web", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["status"] == "held"
    assert dep5.cli("lock", "release", "web", "--lock-id", lock_id).returncode == 0
    with paused(dep5, 1, 2):
        # c3..c5 free: nobody can have 3 of 5, though two members are unseen.
        proc = _status(dep5, "web", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["status"] == "free"


def test_status_watch_says_unknown_in_each_round(dep3: Env) -> None:
    with paused(dep3, 3):
        _acquire(dep3, "alice")
    with paused(dep3, 2):
        proc = dep3.popen(
            "--timeout",
            "2s",
            "-o",
            "json",
            "lock",
            "status",
            "web",
            "--watch",
            "--interval",
            "1s",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
        assert first["status"] == "unknown" and first["holder"] is None
        assert [p["holder"] for p in first["possible_holders"]] == ["alice"]


def test_status_is_unknown_where_an_acquisition_refuses_a_young_copy(dep3: Env) -> None:
    # A deployment made just now (maximum TTL 10 minutes); another client removes the uid
    # note from two leases. Nothing says those objects are the ones coordinator wrote (a
    # lease recreated from a copy looks the same), so for a maximum TTL after their
    # creation they count as held by a holder nobody can name: an acquisition is refused,
    # and status says the same, not "free".
    for i in (1, 2):
        proc = run_kubectl(dep3.kubeconfig, i, dep3.namespace, "annotate", "lease", "coordinator-lock-web",
                           "coordinator.io/uid-")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    st = _status(dep3, "web", "-o", "json")
    assert st.returncode == 4, st.stdout + st.stderr
    doc = json.loads(st.stdout)
    assert doc["status"] == "unknown" and doc["holder"] is None, doc
    rows = {row["name"]: row for row in doc["clusters"]}
    for name in ("c1", "c2"):
        assert rows[name]["status"] == "held", rows[name]
        assert "after its creation" in (rows[name]["error"] or ""), rows[name]
    assert rows["c3"]["status"] == "free", rows["c3"]
    text = _status(dep3, "web")
    assert text.returncode == 4 and "UNKNOWN whether it is held" in text.stdout, text.stdout + text.stderr
    bob = dep3.cli("--timeout", "2s", "lock", "acquire", "web", "--holder", "bob", "--ttl", "10s")
    assert bob.returncode == 3, bob.stderr


def test_status_through_api_servers_whose_clock_runs_ahead_never_shows_a_held_lock_expired(
    dep3: Env, tmp_path: Path
) -> None:
    """Found by outside attacks (HA members whose API servers are 4 s apart, inside the
    default --max-server-skew of 5 s). Bob reads every member through a proxy whose Date
    runs 60 s ahead and counts with --max-server-skew 30s (a proxy stamping its own Date
    is beyond any bound: the numbers only make one skew, the fleet view's default bound
    and three skews tell apart). Alice takes a 30 s lock; seconds later, well inside her
    validity, bob's acquisition is refused and his `lock status` must say so too: held by
    alice, for the deployment and in the fleet view. Status judged expiry by the Date
    without the skew margin and showed every lease expired and the lock "not held" (exit
    0); then with one skew, short of the three a takeover may need; the fleet view ignored
    --max-server-skew."""
    from dateproxy import machine_through_proxies

    alice = _acquire_for(dep3, "alice", "30s")
    with machine_through_proxies(dep3, tmp_path, 60.0, "bob") as (bob, _):
        time.sleep(4)  # alice's leases are 4 s old: 64 s by the proxies' Date
        shown = bob.cli("-o", "json", "lock", "status", "web", "--max-server-skew", "30s")
        fleet = bob.cli("-o", "json", "lock", "status", "-n", dep3.namespace, "--max-server-skew", "30s")
        taken = bob.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--max-server-skew", "30s")
    assert taken.returncode == 3, taken.stderr
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["lock_id"] == alice and status["holder"] == "alice", status
    assert all(row["status"] == "held" for row in status["clusters"]), status["clusters"]
    # the fleet view too, with the bound it is given
    # (other tests' deployments named web live in other namespaces of the shared sandbox)
    found = json.loads(fleet.stdout)["deployments"]
    entry = next(d for d in found if d["deployment"] == "web" and d["namespace"] == dep3.namespace)
    assert entry["status"] == "held" and entry["lock_id"] == alice, entry
