"""The lock against the way real clusters get touched: other clients edit, annotate and
delete its Leases, members pause, breaks and releases happen mid-hold.

Every test here runs on real kube-apiservers (the sandbox); the other clients are the
real `kubectl` under their own field managers. Each case was a way to get two holders,
a repeated fencing token, a lost lock or a lock left behind on the earlier code.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import UNHURRIED, Env, make_env
from helpers.web import LEASE, acquire, doc, holder_on, kubectl, lease

from coordinator.errors import LockHeldError
from coordinator.kube.client import KubeError
from coordinator.rules.lease import lock_id_of
from coordinator.rules.resources import lease_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def holder_now(env: Env, index: int) -> str | None:
    try:
        obj = await env.raw(index, "GET", lease_path(env.namespace, LEASE))
    except KubeError as err:
        assert err.kind == "not-found"
        return None
    return lock_id_of(obj["spec"].get("holderIdentity"))


def token_on(env: Env, index: int) -> int:
    obj = lease(env, index)
    assert obj is not None
    return int(obj["metadata"]["annotations"]["coordinator.io/fencing-token"])


@pytest.fixture
def short(sandbox3: Any, tmp_path: Path) -> Env:
    """A deployment whose maximum TTL is 8 s, so that deleted leases free up quickly."""
    return make_env(sandbox3, tmp_path, max_ttl_s=8)


# -- 1. managedFields stripped


def test_stripped_managed_fields_do_not_make_a_live_lease_look_free(dep3: Env) -> None:
    # The lease object must be older than a TTL, as any lease in use for a while is:
    # without our managedFields entry, its creationTimestamp must not pass for a write.
    first = acquire(dep3, "alice", "--ttl", "4s")
    assert first.returncode == 0, first.stderr
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    time.sleep(8)
    a = acquire(dep3, "alice", "--ttl", "20s")
    assert a.returncode == 0, a.stderr
    for i in (1, 2, 3):
        kubectl(dep3, i, "patch", "lease", LEASE, "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}')
        assert not (lease(dep3, i) or {}).get("metadata", {}).get("managedFields")
    # Nothing recorded says coordinator wrote those holders: the lock is not free, and
    # status names every member as where a holder it cannot name may be.
    st = doc(dep3.cli("-o", "json", "lock", "status", "web"))
    assert st["status"] == "unknown", st
    assert st["possible_holders"] == [{"holder": None, "lock_id": None, "clusters": ["c1", "c2", "c3"]}], st
    b = acquire(dep3, "bob")
    assert b.returncode == 3, b.stderr
    assert all(holder_on(dep3, i) == doc(a)["lock_id"] for i in (1, 2, 3))


def test_a_stripped_lease_of_a_gone_holder_is_taken_only_by_a_long_enough_wait(sandbox3: Any, tmp_path: Path) -> None:
    # alice takes the lock and never renews (as if she died); then every lease loses its
    # managedFields, so no stamp says when she last wrote. Lapsed by any clock, the lease
    # still lapses only for a contender that itself watched it unchanged for the maximum
    # TTL plus margin (6 s + 1 % + 2 s, with no skew allowed): 8.1 s. Three contenders that
    # each wait 3 s (a few seconds more under load, still short of 8.1) watch it longer than
    # that together, and are refused all the same.
    short = make_env(sandbox3, tmp_path, max_ttl_s=6)
    a = acquire(short, "alice", "--ttl", "4s")
    assert a.returncode == 0, a.stderr
    for i in (1, 2, 3):
        kubectl(short, i, "patch", "lease", LEASE, "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}')
    time.sleep(12)
    for _ in range(3):
        b = acquire(short, "bob", "--max-server-skew", "0s", "--wait", "3s")
        assert b.returncode == 3, b.stderr
    assert all(holder_on(short, i) == doc(a)["lock_id"] for i in (1, 2, 3))
    # Taken on every member: each must answer (a read that timed out under load would start
    # that member's watch over, and the take would go on with the other two).
    b = acquire(short, "bob", "--max-server-skew", "0s", "--wait", "30s", environ=UNHURRIED)
    assert b.returncode == 0, b.stderr
    assert all(holder_on(short, i) == doc(b)["lock_id"] for i in (1, 2, 3))


# -- 2. another client keeps editing the lease of a dead holder


def test_edits_by_another_client_do_not_keep_a_dead_holders_lock_alive(dep3: Env) -> None:
    # alice takes the lock and never renews (as if she died); another client keeps
    # annotating every lease, one thread a member. Those edits must not count as her
    # writes: bob takes the lock once her TTL has passed. The test holds only if the edits
    # were frequent enough that, counted as her writes, they would have kept her lease
    # alive: no TTL passes on any member without one (checked at the end, on the times of
    # the edits rather than on how many a busy machine managed to make).
    ttl = 8.0  # room for the early look below on a loaded machine; bob waits for it all the same
    a = acquire(dep3, "alice", "--ttl", f"{ttl:.0f}s")
    assert a.returncode == 0, a.stderr
    taken = time.monotonic()
    stop = threading.Event()
    edited: dict[int, list[float]] = {1: [], 2: [], 3: []}

    def labeler(i: int) -> None:
        while not stop.is_set():
            kubectl(dep3, i, "annotate", "--overwrite", "--field-manager=labeler", "lease", LEASE,
                    f"team.example.com/seen={len(edited[i])}")  # fmt: skip
            edited[i].append(time.monotonic())
            stop.wait(0.5)

    threads = [threading.Thread(target=labeler, args=(i,), daemon=True) for i in edited]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while not all(edited.values()):  # every lease edited before bob's first look
            assert time.monotonic() < deadline and all(t.is_alive() for t in threads), edited
            time.sleep(0.05)
        early = acquire(dep3, "bob", "--max-server-skew", "0s")
        assert early.returncode == 3, early.stderr  # alice's lease is still live
        b = acquire(dep3, "bob", "--max-server-skew", "0s", "--wait", "30s")
        assert b.returncode == 0, b.stderr
        done = time.monotonic()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    # The edits went on all along, from alice's take until bob had the lock.
    for i, times in edited.items():
        gaps = [later - earlier for earlier, later in zip([taken, *times], [*times, done], strict=True)]
        assert max(gaps) < ttl, f"c{i} went {max(gaps):.1f}s without an edit: {gaps}"
    assert doc(b)["fencing_token"] > doc(a)["fencing_token"]


def test_a_capped_lease_of_a_dead_holder_lapses_in_a_max_ttl_while_another_client_edits_it(short: Env) -> None:
    # alice takes a 4 s lock and dies. Another client adds 11 annotations under 11 field
    # managers to every lease: the API server merges the oldest entries (coordinator's)
    # into `ancient-changes`, so no stamp says when alice last wrote and the lease lapses
    # only by local observation of the maximum TTL (8 s), as a stripped one does. That
    # client then edits an annotation and the lease's duration every second: neither is a
    # field the lock rules read, so neither restarts the observation.
    a = acquire(short, "alice", "--ttl", "4s")
    assert a.returncode == 0, a.stderr
    for i in (1, 2, 3):
        for n in range(1, 12):
            kubectl(short, i, "annotate", "--overwrite", "lease", LEASE, f"--field-manager=tool-{n}",
                    f"example.com/note-{n}=x")  # fmt: skip
        managers = [e.get("manager") for e in (lease(short, i) or {})["metadata"]["managedFields"]]
        assert "coordinator" not in managers and "ancient-changes" in managers, managers
    stop = threading.Event()
    edits = [0]

    def editor() -> None:
        while not stop.is_set():
            for i in (1, 2, 3):
                kubectl(short, i, "annotate", "--overwrite", "--field-manager=editor", "lease", LEASE,
                        f"team.example.com/seen={edits[0]}")  # fmt: skip
                patch = json.dumps({"spec": {"leaseDurationSeconds": 4 + edits[0] % 2}})
                kubectl(short, i, "patch", "lease", LEASE, "--type=merge", "--field-manager=editor", "-p", patch)
            edits[0] += 1
            stop.wait(1.0)

    thread = threading.Thread(target=editor, daemon=True)
    thread.start()
    try:
        b = acquire(short, "bob", "--max-server-skew", "0s", "--wait", "90s")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert b.returncode == 0, b.stderr[-1500:]
    # The edits went on while bob waited (each round is six kubectl calls: a busy machine
    # makes fewer of them in the same time).
    assert edits[0] >= 2
    assert doc(b)["fencing_token"] > doc(a)["fencing_token"]


# -- 3. a lease vanishes from one member


def test_a_deleted_lease_is_held_by_an_unknown_holder_not_free(dep3: Env) -> None:
    dep3.sandbox.pause(3)
    a = dep3.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "web", "--holder", "alice", "--ttl", "300s")
    assert a.returncode == 0, a.stderr
    dep3.sandbox.resume(3)
    kubectl(dep3, 1, "delete", "lease", LEASE)
    dep3.sandbox.pause(2)
    b = dep3.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "web", "--holder", "bob")
    assert b.returncode in (3, 4), b.stderr  # never a second holder
    outcomes = {c["name"]: c["outcome"] for c in doc(b)["clusters"]}
    assert outcomes["c1"] == "held-by-other", doc(b)
    dep3.sandbox.resume(2)
    # the tombstone recorded on c1 says so to everyone, and carries no holder
    stone = lease(dep3, 1)
    assert stone is not None and "coordinator.io/vanished" in stone["metadata"]["annotations"]
    assert holder_on(dep3, 2) == doc(a)["lock_id"]
    assert holder_on(dep3, 3) is None


# -- 4. every lease deleted: recovers by itself within one maximum TTL, tokens keep rising


def test_all_leases_deleted_recover_within_a_max_ttl_with_a_higher_token(short: Env) -> None:
    a = acquire(short, "alice", "--ttl", "8s")
    assert a.returncode == 0, a.stderr
    first = doc(a)
    wrote = short.cli("state", "set", "web", "replicas=3", "--lock-id", first["lock_id"])
    assert wrote.returncode == 0, wrote.stderr
    assert short.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    # a second holder, so that the state holds a token above 1
    b = acquire(short, "bob", "--ttl", "8s")
    assert b.returncode == 0, b.stderr
    assert short.cli("state", "set", "web", "replicas=4", "--lock-id", doc(b)["lock_id"]).returncode == 0
    state_token = doc(b)["fencing_token"]
    for i in (1, 2, 3):
        kubectl(short, i, "delete", "lease", LEASE)
    at_once = acquire(short, "carol", "--ttl", "8s")
    assert at_once.returncode == 3, at_once.stderr  # deleted leases are not free
    started = time.monotonic()
    c = acquire(short, "carol", "--ttl", "8s", "--wait", "60s", "--max-server-skew", "0s")
    assert c.returncode == 0, c.stderr
    assert time.monotonic() - started < 30
    assert doc(c)["fencing_token"] > state_token
    wrote = short.cli("state", "set", "web", "replicas=5", "--lock-id", doc(c)["lock_id"])
    assert wrote.returncode == 0, wrote.stderr
    assert short.cli("state", "get", "web", "replicas").stdout.strip() == "5"


def test_all_leases_deleted_a_holder_that_never_wrote_the_state_keeps_its_token(short: Env) -> None:
    """The token of a holder that never wrote the state lived on the leases alone; with
    every lease deleted, the next holder still gets a higher one (the token floor the
    acquisition left on the state objects), and the floor is only raised, never lowered."""
    a = acquire(short, "alice", "--ttl", "8s")
    assert a.returncode == 0, a.stderr
    assert short.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    b = acquire(short, "bob", "--ttl", "8s")
    assert b.returncode == 0, b.stderr
    held = doc(b)["fencing_token"]
    assert held > doc(a)["fencing_token"]
    floors = [
        anyio.run(short.raw, i, "GET", f"/api/v1/namespaces/{short.namespace}/configmaps/coordinator-state-web")[
            "metadata"
        ]["annotations"].get("coordinator.io/token-floor")
        for i in (1, 2, 3)
    ]
    assert sum(1 for f in floors if f == str(held)) >= 2, floors
    for i in (1, 2, 3):
        kubectl(short, i, "delete", "lease", LEASE)
    c = acquire(short, "carol", "--ttl", "8s", "--wait", "60s", "--max-server-skew", "0s")
    assert c.returncode == 0, c.stderr
    assert doc(c)["fencing_token"] > held


# -- 5. renewal returns at quorum


def test_renewal_with_one_member_paused_keeps_a_short_lock(dep3: Env) -> None:
    async def hold() -> None:
        async with dep3.api(timeout=5) as c:
            async with c.lock("web", ttl=6, holder="alice") as held:
                dep3.sandbox.pause(3)
                await anyio.sleep(12)  # two TTLs: needs renewals that do not wait for c3
                assert held.valid, "the lock was lost with only one of three members paused"

    anyio.run(hold)


# -- 6 and 12. a break sticks; a renewal that finds the lock taken has lost it at once


def test_a_break_sticks_and_the_broken_holder_knows_at_its_next_renewal(dep3: Env) -> None:
    async def hold() -> None:
        async with dep3.api(timeout=3) as c:
            async with c.lock("web", ttl=30, holder="alice") as held:
                lock_id = held.lock_id
                broke = dep3.cli("lock", "break", "web", "--yes", "--reason", "test")
                assert broke.returncode == 0, broke.stderr
                with anyio.fail_after(15):  # renewals every 10 s; validity would be ~30 s
                    await held.lost.wait()
                assert not held.valid
                # the broken holder did not take anything back
                for i in (1, 2, 3):
                    assert await holder_now(dep3, i) != lock_id

    anyio.run(hold)


def test_a_new_holder_after_a_break_is_seen_at_the_next_renewal(dep3: Env) -> None:
    async def hold() -> None:
        async with dep3.api(timeout=3) as c:
            async with c.lock("web", ttl=30, holder="alice") as held:
                assert dep3.cli("lock", "break", "web", "--yes").returncode == 0
                bob = acquire(dep3, "bob", "--ttl", "60s")
                assert bob.returncode == 0, bob.stderr
                with anyio.fail_after(12):  # the next renewal (every 10 s), not alice's validity (~30 s)
                    await held.lost.wait()
                assert await holder_now(dep3, 1) == doc(bob)["lock_id"]

    anyio.run(hold)


# -- 7. renew from another process keeps the TTL


def test_renew_by_lock_id_keeps_the_leases_ttl(dep3: Env, tmp_path: Path) -> None:
    a = acquire(dep3, "alice", "--ttl", "45s")
    assert a.returncode == 0, a.stderr
    other = {"COORDINATOR_HOLDER": "ci-runner"}
    r = dep3.cli("lock", "renew", "web", "--lock-id", doc(a)["lock_id"], env=other)
    assert r.returncode == 0, r.stderr
    assert {(lease(dep3, i) or {})["spec"]["leaseDurationSeconds"] for i in (1, 2, 3)} == {45}
    r = dep3.cli("lock", "renew", "web", "--lock-id", doc(a)["lock_id"], "--ttl", "50s", env=other)
    assert r.returncode == 0, r.stderr
    # A renewal ends once a majority renewed: a straggler may keep the old duration.
    durations = [(lease(dep3, i) or {})["spec"]["leaseDurationSeconds"] for i in (1, 2, 3)]
    assert durations.count(50) >= 2 and set(durations) <= {45, 50}, durations


# -- 8. a release that reaches a minority


def test_a_release_reaching_a_minority_exits_4_and_keeps_the_record(dep3: Env) -> None:
    a = acquire(dep3, "alice", "--ttl", "60s")
    assert a.returncode == 0, a.stderr
    dep3.sandbox.pause(2)
    dep3.sandbox.pause(3)
    r = dep3.cli("--timeout", "2s", "lock", "release", "web", "--holder", "alice")
    assert r.returncode == 4, r.stderr
    assert "kept" in r.stderr
    dep3.sandbox.resume(2)
    dep3.sandbox.resume(3)
    assert holder_on(dep3, 2) == doc(a)["lock_id"]
    again = dep3.cli("lock", "release", "web", "--holder", "alice")  # the record is still there
    assert again.returncode == 0, again.stderr
    assert all(holder_on(dep3, i) is None for i in (1, 2, 3))
    nothing = dep3.cli("lock", "release", "web", "--holder", "alice", "--if-held")
    assert nothing.returncode == 0, nothing.stderr
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 6


# -- 14. a lock that cannot be recorded is never taken


def test_a_corrupt_lock_record_stops_acquire_before_any_lease_is_taken(dep3: Env) -> None:
    book = dep3.config.with_name(dep3.config.stem + ".locks.yaml")
    book.write_text("locks: [this is not: a lock record\n")
    a = acquire(dep3, "alice")
    assert a.returncode == 2, a.stderr
    assert "Traceback" not in a.stderr
    assert all(holder_on(dep3, i) is None for i in (1, 2, 3))


def test_api_contenders_agree_on_who_holds_after_a_deletion(dep3: Env) -> None:
    """In-process: a contender that finds a lease missing records it and is refused; the
    holder keeps the lock on the two intact leases and renews there."""

    async def go() -> None:
        async with dep3.api(timeout=3) as c:
            async with c.lock("web", ttl=9, holder="alice") as held:
                kubectl(dep3, 2, "delete", "lease", LEASE)
                async with dep3.api(timeout=3) as other:
                    with pytest.raises(LockHeldError):
                        await other.acquire("web", ttl=9, holder="bob")
                await anyio.sleep(7)
                assert held.valid

    anyio.run(go)


# -- 11. a Date that is not the API server's


def test_a_date_header_from_a_clock_ahead_never_takes_a_live_lease(dep3: Env, tmp_path: Path) -> None:
    """Bob reaches every member through a TLS-terminating proxy whose Date runs 90 s
    ahead. Alice's 60 s lease looks long expired by that Date; the probe's server stamp
    says it is seconds old, so Bob is refused."""
    from dateproxy import machine_through_proxies

    a = acquire(dep3, "alice", "--ttl", "60s")
    assert a.returncode == 0, a.stderr
    with machine_through_proxies(dep3, tmp_path, 90.0, "proxied") as (bob, proxies):
        b = bob.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob")
        assert b.returncode == 3, b.stderr
        assert all(p.requests > 0 for p in proxies)
    assert all(holder_on(dep3, i) == doc(a)["lock_id"] for i in (1, 2, 3))


def test_the_holders_validity_runs_on_the_boot_clock() -> None:
    """A laptop that sleeps stops CLOCK_MONOTONIC but not CLOCK_BOOTTIME: validity must be
    counted on the latter, or a suspended holder wakes up believing in its lock."""
    import time as _time

    from coordinator.rules.lease import boot_clock

    before = _time.clock_gettime(_time.CLOCK_BOOTTIME)
    now = boot_clock()
    after = _time.clock_gettime(_time.CLOCK_BOOTTIME)
    assert before <= now <= after


# -- found by trying to break it: a lease restored from a copy, a token read too early


def test_a_lease_restored_from_a_backup_is_not_free(dep3: Env, tmp_path: Path) -> None:
    """A backup of the free lease, taken right after `deployment create`, is restored on
    two members while alice holds the lock (delete + create, as a restore tool or a GitOps
    re-apply does). The copies name another object's uid: they block, they are not free."""
    backup = tmp_path / "lease.json"
    doc_ = json.loads(kubectl(dep3, 1, "get", "lease", LEASE, "-o", "json"))
    for key in ("resourceVersion", "uid", "creationTimestamp"):
        doc_["metadata"].pop(key, None)
    backup.write_text(json.dumps(doc_))
    a = acquire(dep3, "alice", "--ttl", "30s")
    assert a.returncode == 0, a.stderr
    for i in (1, 2):
        kubectl(dep3, i, "delete", "lease", LEASE)
        kubectl(dep3, i, "create", "-f", str(backup))
        assert holder_on(dep3, i) is None
    b = acquire(dep3, "bob")
    assert b.returncode == 3, b.stderr
    assert holder_on(dep3, 3) == doc(a)["lock_id"]


def test_tokens_never_go_back_when_a_surviving_lease_is_not_read(short: Env) -> None:
    """Tokens 1..3 granted; the leases of c1 and c2 deleted. After the maximum TTL, an
    attempt that cannot read c3 (the only lease that remembers token 3) takes nothing;
    with c3 answering, the token is above 3."""
    for who in ("a", "b", "c"):
        got = acquire(short, who, "--ttl", "5s")
        assert got.returncode == 0, got.stderr
        assert short.cli("lock", "release", "web", "--holder", who).returncode == 0
    assert doc(got)["fencing_token"] == 3
    for i in (1, 2):
        kubectl(short, i, "delete", "lease", LEASE)
    first = acquire(short, "d", "--ttl", "5s")  # records the tombstones
    assert first.returncode == 3, first.stderr
    time.sleep(12)  # the maximum TTL (8 s) and its margin pass
    short.sandbox.pause(3)
    blind = short.cli(
        "-o",
        "json",
        "--timeout",
        "2s",
        "lock",
        "acquire",
        "web",
        "--holder",
        "d",
        "--ttl",
        "5s",
        "--max-server-skew",
        "0s",
    )
    assert blind.returncode != 0, blind.stdout
    short.sandbox.resume(3)
    seen = acquire(short, "d", "--ttl", "5s", "--max-server-skew", "0s")
    assert seen.returncode == 0, seen.stderr
    assert doc(seen)["fencing_token"] > 3
