"""A state replica coordinator no longer owns keeps what it says as a bound, never as its word.

Another client can make a replica corrupt without touching a byte coordinator wrote: the API
server keeps at most 10 Update entries in managedFields, so 11 annotations under 11 field
managers (``cap``) merge coordinator's entry into ``ancient-changes``; stripping managedFields
(``strip``) names nobody. Or it garbles the envelope. Such a replica is not the state, and
it is not an answer either: a write that builds on the data, and `state sync`, need a
majority of replicas that decode, and a replica never takes (nor does sync write) a stamp
below the newest one it carries, whoever owns the field. Each test acts as that client with
the real kubectl, on real API servers.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import UNHURRIED, Env
from faults.kubectl import kubectl

from coordinator.engine.register import Kind, Stamp, build_envelope, new_write_id
from coordinator.engine.state.results import Observed
from coordinator.errors import NoQuorumError
from coordinator.rules.resources import configmaps_path

pytestmark = pytest.mark.integration

STATE = "coordinator-state-web"


def _k(env: Env, index: int, *args: str) -> None:
    done = kubectl(env.kubeconfig, index, env.namespace, *args)
    assert done.returncode == 0, done.stderr


def _cap(env: Env, index: int) -> None:
    """11 annotations of another client's own, under 11 field managers: nothing coordinator
    wrote is touched, managedFields are neither stripped nor rewritten."""
    for i in range(1, 12):
        _k(env, index, "annotate", "configmap", STATE, f"--field-manager=tool-{i}", f"example.com/note-{i}=x")


def _strip(env: Env, index: int) -> None:
    _k(env, index, "patch", "configmap", STATE, "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}')


def _garble(env: Env, index: int) -> None:
    _k(env, index, "patch", "configmap", STATE, "--type=merge", "-p", '{"data":{"envelope.json":"garbled"}}')


SPOIL = {"cap": _cap, "strip": _strip, "garble": _garble}


def _object(env: Env, index: int) -> dict[str, Any]:
    return anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/{STATE}")


def _data(env: Env, index: int) -> Any:
    return json.loads(_object(env, index)["data"]["envelope.json"])["data"]


def _lock(env: Env) -> None:
    # Unhurried: the tests pause members after this, and each needs the lock on all three.
    proc = env.cli("-o", "json", "lock", "acquire", "web", "--ttl", "180s", env=UNHURRIED)
    assert proc.returncode == 0, proc.stderr


def _set(env: Env, *pairs: str) -> subprocess.CompletedProcess[str]:
    return env.cli("state", "set", "web", *pairs)


def _w1_on_c1_c2_only(env: Env) -> None:
    """k=v0 everywhere, then k=W1 confirmed by c1 and c2 while c3 was paused: c3 is behind."""
    _lock(env)
    assert _set(env, "k=v0").returncode == 0
    env.sandbox.pause(3)
    try:
        wrote = _set(env, "k=W1")
        assert wrote.returncode == 0, wrote.stderr
    finally:
        env.sandbox.resume(3)
    assert _data(env, 3) == {"k": "v0"}


def test_a_fenced_out_write_never_replaces_a_confirmed_write_on_capped_replicas(dep3: Env) -> None:
    async def scenario() -> None:
        async with dep3.api() as c:
            a = await c.acquire("web", ttl=2, holder="A")
            state = c.state("web")
            await state.set({"owner": "A"}, lock=a.lock_id)
            # A's reads, before its lock lapses: what a holder paused between its reads
            # and its writes holds when it resumes.
            stale = {k: (await state.replicas.read_one(k, with_lease=False)).replica for k in ("c1", "c2")}
            b = await c.acquire("web", ttl=60, holder="B", wait=20)
            assert b.fencing_token > a.fencing_token
            await state.set({"owner": "B"}, lock=b.lock_id)
            for i in (1, 2):
                _cap(dep3, i)
            # A resumes: its promise and its data, by compare-and-swap on what it read
            # (the server refuses the stale resourceVersion; the replica is judged again).
            late = Stamp(a.fencing_token, 99, new_write_id())
            doc, text = build_envelope(
                None, {"owner": "A-late"}, late, who="A", host="h", command="t",
                now=datetime.now(UTC), members=["c1", "c2", "c3"], member_ids={}, namespace=dep3.namespace,
                storage="configmap", keys=["owner"], deployment="web",
            )  # fmt: skip
            for k, rep in stale.items():
                for kind, body in ((Kind.PROMISE, None), (Kind.WRITE, text)):
                    got = await state.replicas.cas(rep, late, kind, body)
                    # The data is refused as it is judged on what A read (its promise does
                    # not show there), or on the replica as it is now (fenced by B's token).
                    why = (
                        ("fencing token", "does not show this write's promise")
                        if kind is Kind.WRITE
                        else ("fencing token",)
                    )
                    assert not got.ok and any(w in got.detail for w in why), (k, kind, got.outcome, got.detail)
            # A's whole write with its old token, c3 (which holds B's write) unreachable: no
            # majority answers (two replicas are not coordinator's word, one is silent).
            dep3.sandbox.pause(3)
            try:
                with pytest.raises(NoQuorumError) as err:
                    await state.write(
                        lambda _d: {"owner": "A-late"}, lock=a.lock_id, replaces=True, _token=a.fencing_token
                    )
                assert "0 of 3 clusters answered with a replica that decodes" in err.value.message
            finally:
                dep3.sandbox.resume(3)
            assert doc.data == {"owner": "A-late"}
            for i in (1, 2, 3):
                obj = await dep3.raw(i, "GET", f"{configmaps_path(dep3.namespace)}/{STATE}")
                assert json.loads(obj["data"]["envelope.json"])["data"] == {"owner": "B"}, i
            # Two replicas that are not coordinator's word leave one that decodes: no read
            # decides until B writes a whole state over them (saving them first).
            with pytest.raises(NoQuorumError):
                await state.get()
            await state.adopt("c3", lock=b.lock_id)
            assert await state.get() == {"owner": "B"}

    anyio.run(scenario)


@pytest.mark.parametrize("how", ["strip", "cap", "garble"])
def test_one_corrupt_replica_and_one_down_refuse_a_write_rather_than_lose_a_confirmed_one(dep3: Env, how: str) -> None:
    _w1_on_c1_c2_only(dep3)
    dep3.sandbox.pause(2)
    try:
        SPOIL[how](dep3, 1)
        refused = _set(dep3, "other=x")
        # c1 counts as unanswered: one replica that decodes (c3) is no majority, and c2
        # may make one when it answers.
        assert refused.returncode == 4, refused.stdout + refused.stderr
        assert "counts as unanswered" in refused.stderr, refused.stderr
    finally:
        dep3.sandbox.resume(2)
    if how != "garble":  # untouched: the refused write saved and replaced nothing
        assert _data(dep3, 1) == {"k": "W1"}
    assert dep3.cli("state", "get", "web", "k").stdout.strip() == "W1"
    # With c2 back the next write builds on W1 and replaces c1.
    wrote = _set(dep3, "other=x")
    assert wrote.returncode == 0, wrote.stderr
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web").stdout) == {"k": "W1", "other": "x"}
    assert _data(dep3, 1) == {"k": "W1", "other": "x"}


@pytest.mark.parametrize("how", ["cap", "strip"])
def test_sync_does_not_roll_a_confirmed_write_back_over_unowned_replicas(dep3: Env, how: str, tmp_path: Path) -> None:
    _w1_on_c1_c2_only(dep3)
    for i in (1, 2):
        SPOIL[how](dep3, i)
    rows = {r["name"]: r for r in json.loads(dep3.cli("-o", "json", "state", "diff", "web").stdout)}
    assert rows["c1"]["status"] == rows["c2"]["status"] == "corrupt", rows
    sync = dep3.cli("-o", "json", "state", "sync", "web", "--backup-dir", str(tmp_path / "saved"))
    # Every member answered, one replica decodes: no majority, and no retry makes one.
    assert sync.returncode == 6, sync.stdout + sync.stderr
    assert "counts as unanswered" in sync.stderr, sync.stderr
    for i in (1, 2):
        assert _data(dep3, i) == {"k": "W1"}, i
    assert _data(dep3, 3) == {"k": "v0"}


def test_sync_does_not_overwrite_a_capped_replica_with_an_older_value(dep3: Env, tmp_path: Path) -> None:
    _lock(dep3)
    assert _set(dep3, "k=v0").returncode == 0

    async def partial_write_on_c1() -> None:
        # A write that reached c1 only (promise and data), as a holder that lost the
        # other members mid-write leaves it.
        async with dep3.api() as c:
            state = c.state("web")
            seen: Observed = await state.replicas.read_one("c1", with_lease=False)
            rep = seen.replica
            stamp = Stamp(rep.stamp.token, rep.stamp.version + 1, new_write_id())
            _doc, text = build_envelope(
                rep.envelope, {"k": "W2"}, stamp, who="t", host="h", command="t", now=datetime.now(UTC),
                members=["c1", "c2", "c3"], member_ids={}, namespace=dep3.namespace, storage="configmap",
                keys=["k"], deployment="web",
            )  # fmt: skip
            promised = await state.replicas.cas(rep, stamp, Kind.PROMISE, None)
            assert promised.ok and promised.value is not None, promised.detail
            wrote = await state.replicas.cas(promised.value, stamp, Kind.WRITE, text)
            assert wrote.ok, wrote.detail

    anyio.run(partial_write_on_c1)
    assert _data(dep3, 1) == {"k": "W2"}
    _cap(dep3, 1)
    sync = dep3.cli("-o", "json", "state", "sync", "web", "--backup-dir", str(tmp_path / "saved"))
    assert sync.returncode == 6, sync.stdout + sync.stderr
    assert "replica(s) on c1 carry a newer stamp" in sync.stderr, sync.stderr
    assert _data(dep3, 1) == {"k": "W2"}


def test_sync_does_not_overwrite_a_newer_write_that_reached_a_corrupt_replica_meanwhile(
    dep3: Env, tmp_path: Path
) -> None:
    _lock(dep3)
    assert _set(dep3, "k=v0").returncode == 0
    _cap(dep3, 1)

    async def scenario() -> None:
        async with dep3.api() as c:
            state = c.state("web")
            save = state.replicas.save_replica

            def save_then_write(rep: Any, backup_dir: Path | None, reason: str) -> Path:
                # Between sync's read (c1 corrupt, naming v0) and its compare-and-swap, a
                # write reaches every member, c1 included.
                path = save(rep, backup_dir, reason)
                wrote = _set(dep3, "k=W2")
                assert wrote.returncode == 0, wrote.stderr
                return path

            state.replicas.save_replica = save_then_write  # type: ignore[method-assign]
            result = await state.sync(backup_dir=tmp_path / "saved")
            assert result["winner"] != "c1" and "c1" in result["failed"], result

    anyio.run(scenario)
    for i in (1, 2, 3):
        assert _data(dep3, i) == {"k": "W2"}, i


def test_a_planted_bound_no_lease_has_seen_costs_one_replica_until_sync_from_overwrites_it(
    dep3: Env, tmp_path: Path
) -> None:
    _lock(dep3)
    assert _set(dep3, "k=v0").returncode == 0
    _k(dep3, 1, "annotate", "--overwrite", "configmap", STATE, "coordinator.io/state-promise=999999/1/x")
    # The token is above every token the leases have seen: no holder promised it. c1 is
    # suspect and refuses the write below its bound; the others take it.
    wrote = _set(dep3, "k=v1")
    assert wrote.returncode == 0, wrote.stderr
    rows = {r["name"]: r for r in json.loads(dep3.cli("-o", "json", "state", "diff", "web").stdout)}
    assert rows["c1"]["status"] == "suspect" and "999999" in rows["c1"]["detail"], rows["c1"]
    assert (rows["c2"]["status"], rows["c3"]["status"]) == ("current", "current"), rows
    assert dep3.cli("state", "get", "web", "k").stdout.strip() == "v1"
    adopted = dep3.cli("state", "sync", "web", "--from", "c2", "--backup-dir", str(tmp_path / "saved"))
    assert adopted.returncode == 0, adopted.stderr
    rows = {r["name"]: r for r in json.loads(dep3.cli("-o", "json", "state", "diff", "web").stdout)}
    assert {r["status"] for r in rows.values()} == {"current"}, rows
    assert _data(dep3, 1) == {"k": "v1"}


def test_a_deleted_state_object_is_no_answer_to_a_read_or_a_write(dep3: Env) -> None:
    # k=W1 is confirmed by c1 and c2 only; another client deletes c1's state object and c2
    # stops answering. c3 (behind) and c1 (nothing there) are no majority that knows the
    # newest confirmed state: a read must not return k=v0, nor a write build on it.
    _w1_on_c1_c2_only(dep3)
    _k(dep3, 1, "delete", "configmap", STATE)
    dep3.sandbox.pause(2)
    try:
        got = dep3.cli("state", "get", "web", "k")
        assert got.returncode == 4, got.stdout + got.stderr
        assert "no state object (deleted?)" in got.stderr, got.stderr
        wrote = _set(dep3, "other=x")
        assert wrote.returncode == 4, wrote.stdout + wrote.stderr
    finally:
        dep3.sandbox.resume(2)
    # Every member answers again: c2's k=W1 is the newest confirmed state; the write and
    # the read go through, and the missing object is written again.
    wrote = _set(dep3, "other=x")
    assert wrote.returncode == 0, wrote.stderr
    assert dep3.cli("state", "get", "web", "k").stdout.strip() == "W1"
    assert _data(dep3, 1) == {"k": "W1", "other": "x"}


def test_an_empty_object_a_lock_made_where_one_was_deleted_is_no_answer(dep3: Env) -> None:
    # Taking the lock records its token on every member's state object, making one where
    # it is missing. Where another client deleted the one replica of k=W1 that was up,
    # that new empty object must not stand in for it.
    _w1_on_c1_c2_only(dep3)
    assert dep3.cli("lock", "release", "web").returncode == 0
    _k(dep3, 1, "delete", "configmap", STATE)
    took = dep3.cli("-o", "json", "lock", "acquire", "web", "--ttl", "180s", "--holder", "A")
    assert took.returncode == 0, took.stderr
    lock_id = json.loads(took.stdout)["lock_id"]
    assert _object(dep3, 1)["metadata"]["annotations"].get("coordinator.io/token-floor"), "no floor made"
    dep3.sandbox.pause(2)
    try:
        got = dep3.cli("state", "get", "web", "k")
        assert got.returncode == 4, got.stdout + got.stderr
        assert "an empty object made since the deployment was created" in got.stderr, got.stderr
        wrote = _set(dep3, "other=x", "--lock-id", lock_id)
        assert wrote.returncode == 4, wrote.stdout + wrote.stderr
    finally:
        dep3.sandbox.resume(2)
    assert dep3.cli("state", "get", "web", "k").stdout.strip() == "W1"


def test_a_whole_state_applied_with_a_member_silent_needs_a_majority_that_answers(dep3: Env, tmp_path: Path) -> None:
    # k=W1 on c1 and c2 only; c1's object deleted; c3 (behind) and a missing object do not
    # tell which stamp is newest, so `state apply` could be ordered below k=W1 and be
    # rolled back by it once c2 answers: it is refused.
    _w1_on_c1_c2_only(dep3)
    _k(dep3, 1, "delete", "configmap", STATE)
    doc = tmp_path / "doc.json"
    doc.write_text('{"k": "APPLIED"}')
    dep3.sandbox.pause(2)
    try:
        applied = dep3.cli("state", "apply", "web", "-f", str(doc))
        assert applied.returncode == 4, applied.stdout + applied.stderr
    finally:
        dep3.sandbox.resume(2)
    applied = dep3.cli("state", "apply", "web", "-f", str(doc))
    assert applied.returncode == 0, applied.stderr
    assert dep3.cli("state", "get", "web", "k").stdout.strip() == "APPLIED"


def test_a_deployment_that_exists_is_never_created_again(dep3: Env, tmp_path: Path) -> None:
    # Another machine (a fresh runner) runs `deployment create` for a deployment that
    # exists, after another client deleted its lease and state object on c1 and c2 while
    # A holds the lock. Creating it again would make free leases and seeded empty state
    # there: a second holder with token 1, and empty state answering for k=W1.
    _w1_on_c1_c2_only(dep3)
    held = json.loads(dep3.cli("-o", "json", "lock", "status", "web").stdout)
    assert held["held_by_majority"], held
    for i in (1, 2):
        _k(dep3, i, "delete", "configmap", STATE, "coordinator-history-web")
        _k(dep3, i, "delete", "lease", "coordinator-lock-web")
    other = str(tmp_path / "other" / "config.yaml")
    for i in (1, 2, 3):
        done = dep3.cli("--config", other, "cluster", "connect", f"c{i}", "--context", f"sandbox-{i}")
        assert done.returncode == 0, done.stderr
    again = ("--config", other, "deployment", "create", "web", "-n", dep3.namespace, "--cluster", "c1")
    made = dep3.cli(*again, "--cluster", "c2", "--cluster", "c3")
    assert made.returncode == 6, made.stdout + made.stderr
    assert "already exists" in made.stderr and "deployment import web" in made.stderr, made.stderr
    # With the member that still holds it silent, nothing says it is new: refused too.
    dep3.sandbox.pause(3)
    try:
        made = dep3.cli(*again, "--cluster", "c2", "--cluster", "c3")
        assert made.returncode == 4, made.stdout + made.stderr
    finally:
        dep3.sandbox.resume(3)
    # Nothing was made where the objects were deleted: no lease there is free, and no
    # other holder gets the lock (refused: held by an unknown holder, or, with lease and
    # state gone on a majority, the member set unconfirmed).
    for i in (1, 2):
        got = kubectl(dep3.kubeconfig, i, dep3.namespace, "get", "configmap", STATE)
        assert got.returncode != 0 and "NotFound" in got.stderr, got.stdout + got.stderr
    st = dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "B")
    assert st.returncode in (3, 5), st.stdout + st.stderr


@pytest.mark.parametrize("left", ["state-of-the-other-kind", "lease-without-its-uid-note"])
def test_whatever_is_left_of_a_deployment_stops_its_create(dep3: Env, tmp_path: Path, left: str) -> None:
    # A holds the lock. Another client deletes every lease (the ConfigMap state stays, and
    # a create asks for Secret storage), or deletes everything but c3's lease and strips
    # that lease's uid note. Either way a create from a fresh config must refuse: free
    # leases would give a second holder token 1.
    assert dep3.cli("lock", "acquire", "web", "--ttl", "180s", "--holder", "A").returncode == 0
    storage = "configmap"
    if left == "state-of-the-other-kind":
        for i in (1, 2, 3):
            _k(dep3, i, "delete", "lease", "coordinator-lock-web")
        storage = "secret"
    else:
        for i in (1, 2, 3):
            _k(dep3, i, "delete", "configmap", STATE, "coordinator-history-web")
        for i in (1, 2):
            _k(dep3, i, "delete", "lease", "coordinator-lock-web")
        _k(dep3, 3, "annotate", "lease", "coordinator-lock-web", "coordinator.io/uid-")
    other = str(tmp_path / "other" / "config.yaml")
    for i in (1, 2, 3):
        assert dep3.cli("--config", other, "cluster", "connect", f"c{i}", "--context", f"sandbox-{i}").returncode == 0
    members = ("--cluster", "c1", "--cluster", "c2", "--cluster", "c3")
    made = dep3.cli(
        "--config", other, "deployment", "create", "web", "-n", dep3.namespace, "--storage", storage, *members
    )
    assert made.returncode == 6, made.stdout + made.stderr
    b = dep3.cli("--config", other, "lock", "acquire", "web", "--holder", "B")
    assert b.returncode != 0, b.stdout + b.stderr


def test_nothing_written_one_replica_corrupt_and_one_member_silent_is_no_quorum_not_a_conflict(dep3: Env) -> None:
    """Nothing was ever written; another client writes c2's promise (c2 is corrupt); c1
    does not answer. c3 holds no state, and c1's answer decides whether a majority holds
    none (the state is empty) or c1 holds the newest write: a read cannot decide yet, which
    is exit 4 ("retry when more clusters are reachable"), not the exit 6 that sends an
    operator to repair replicas. Found by the simulator (seed 1022, foreign promise writes
    and a cut minority). Once c1 answers, the state is known to be empty."""
    _k(dep3, 2, "annotate", "--overwrite", "configmap", STATE, "coordinator.io/state-promise=5/1/x")
    dep3.sandbox.pause(1)
    try:
        got = dep3.cli("-o", "json", "state", "get", "web")
    finally:
        dep3.sandbox.resume(1)
    assert got.returncode == 4, (got.returncode, got.stderr)
    assert "c1" in got.stderr and "not known to be empty" in got.stderr, got.stderr
    heard = dep3.cli("-o", "json", "state", "get", "web")
    assert heard.returncode == 0, heard.stderr


# Broke before the fix (third outside attack on the write rule, finding 1): another
# client's promise annotation naming version 9999999999999999999 on c1 alone made the
# next write draw version 10**19, which no stamp can name: its promises made c2's and c3's
# replicas unreadable too, and no write could land until c1 was edited back.


@pytest.mark.parametrize("version", [str(10**19 - 1), str(2**62 + 5)])
def test_a_planted_huge_version_on_one_member_does_not_stop_the_writes(dep3: Env, version: str) -> None:
    """With the planted promise on c1, `state set` still confirms on c2 and c3 (c1, a
    minority, refuses or is skipped), and the value reads back."""
    from helpers.web import acquire, doc, kubectl

    lock = doc(acquire(dep3, "w", "--ttl", "60s"))["lock_id"]
    assert dep3.cli("state", "set", "web", "a=1", "--lock-id", lock).returncode == 0
    planted = f"coordinator.io/state-promise=1/{version}/x"
    kubectl(
        dep3, 1, "annotate", "configmap", "coordinator-state-web", planted, "--overwrite", "--field-manager=mallory"
    )
    for value in ("2", "3"):
        wrote = dep3.cli("state", "set", "web", f"b={value}", "--lock-id", lock)
        assert wrote.returncode == 0, (wrote.stdout, wrote.stderr)
    read = dep3.cli("-o", "json", "state", "get", "web")
    assert read.returncode == 0 and json.loads(read.stdout) == {"a": "1", "b": "3"}, (read.stdout, read.stderr)
