"""Every field a rule reads counts only where coordinator wrote it (coordinator/rules/evidence.py).

Another client — `kubectl annotate`, `kubectl edit`, a server-side apply with
``--force-conflicts`` — takes over the fields it writes (the API server hands them to its
field manager). Edits like that never repeat a fencing token, never free a lock, never
end one that is alive, and never keep a dead one past its own TTL plus margin. Each test
acts as that other client with the real kubectl, on real API servers.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env, make_env
from faults.kubectl import kubectl
from helpers.web import on_each

from coordinator.rules.resources import configmaps_path, lease_path, leases_path

LEASE = "coordinator-lock-web"


def _k(env: Env, index: int, *args: str) -> None:
    done = kubectl(env.kubeconfig, index, env.namespace, *args)
    assert done.returncode == 0, done.stderr


def _annotate(env: Env, index: int, key: str, value: str) -> None:
    """A plain `kubectl annotate --overwrite` (kubectl's own field manager)."""
    _k(env, index, "annotate", "--overwrite", "lease", LEASE, f"{key}={value}")


def _acquire(env: Env, holder: str, *args: str) -> subprocess.CompletedProcess[str]:
    return env.cli("-o", "json", "lock", "acquire", "web", "--holder", holder, *args)


def _token(proc: subprocess.CompletedProcess[str]) -> int:
    assert proc.returncode == 0, proc.stderr
    return int(json.loads(proc.stdout)["fencing_token"])


def _lease(env: Env, index: int) -> dict[str, Any]:
    return anyio.run(env.raw, index, "GET", lease_path(env.namespace, LEASE))


def test_kubectl_annotate_of_the_token_never_repeats_a_token(dep3: Env) -> None:
    tokens = []
    for holder in ("first", "second", "third"):
        tokens.append(_token(_acquire(dep3, holder, "--ttl", "30s")))
        assert dep3.cli("state", "set", "web", f"by={holder}", env={"COORDINATOR_HOLDER": holder}).returncode == 0
        assert dep3.cli("lock", "release", "web", "--holder", holder).returncode == 0
    assert tokens == [1, 2, 3]
    # On every member, kubectl's own field manager: no managedFields rewrite, no deletion.
    for i in (1, 2, 3):
        _annotate(dep3, i, "coordinator.io/fencing-token", "0")
    fourth = _acquire(dep3, "fourth", "--ttl", "30s")
    assert _token(fourth) == 4, fourth.stdout
    # Its writes are accepted: the replicas (token 3) are not above it.
    wrote = dep3.cli("state", "set", "web", "by=fourth", env={"COORDINATOR_HOLDER": "fourth"})
    assert wrote.returncode == 0, wrote.stderr
    assert dep3.cli("state", "get", "web", "by").stdout.strip() == "fourth"
    assert dep3.cli("lock", "release", "web", "--holder", "fourth").returncode == 0


def test_a_token_annotated_on_two_members_with_the_third_paused_does_not_repeat(dep3: Env) -> None:
    for holder in ("first", "second", "third"):
        _token(_acquire(dep3, holder, "--ttl", "30s"))
        assert dep3.cli("lock", "release", "web", "--holder", holder).returncode == 0
    _annotate(dep3, 1, "coordinator.io/fencing-token", "0")
    _annotate(dep3, 2, "coordinator.io/fencing-token", "0")
    dep3.sandbox.pause(3)
    try:
        # The leases read keep no history: without the third lease no token is proven new,
        # and the attempt waits for it until its deadline.
        refused = _acquire(dep3, "fourth", "--ttl", "30s", "--timeout", "2s")
        assert refused.returncode == 4, refused.stderr
        assert json.loads(refused.stdout)["fencing_token"] is None
    finally:
        dep3.sandbox.resume(3)
    assert _token(_acquire(dep3, "fourth", "--ttl", "30s")) == 4


def test_a_holder_edited_by_another_client_is_neither_free_nor_ours(dep3: Env) -> None:
    # alice holds (TTL 10 s; the deployment's maximum is 10 minutes); an operator "frees"
    # the lock by hand on every member.
    alice = _acquire(dep3, "alice", "--ttl", "10s")
    lock_id = json.loads(alice.stdout)["lock_id"]
    for i in (1, 2, 3):
        _k(dep3, i, "patch", "lease", LEASE, "--type=merge", "-p", '{"spec":{"holderIdentity":null}}')
    bob = _acquire(dep3, "bob", "--ttl", "10s")
    assert bob.returncode == 3, bob.stdout
    st = json.loads(dep3.cli("-o", "json", "lock", "status", "web").stdout)
    assert st["holder"] is None and st["status"] == "unknown", st
    # Not alice's either: her renewal finds the lock gone from under her.
    renewed = dep3.cli("lock", "renew", "web", "--lock-id", lock_id)
    assert renewed.returncode != 0, renewed.stderr
    # It lapses by coordinator's own last write: alice's TTL plus margin, not the maximum TTL.
    # (No server skew allowed: the sandbox has one API server a member, and the wait is not
    # what this test is about; a maximum TTL would still be 10 minutes past the wait.)
    waited = _acquire(dep3, "bob", "--ttl", "10s", "--wait", "60s", "--max-server-skew", "0s")
    assert waited.returncode == 0, waited.stderr
    assert _lease(dep3, 1)["spec"]["holderIdentity"].endswith(json.loads(waited.stdout)["lock_id"])


def test_a_holder_set_to_another_lock_id_by_another_client_is_not_ours(dep3: Env) -> None:
    alice = _acquire(dep3, "alice", "--ttl", "30s")
    lock_id = json.loads(alice.stdout)["lock_id"]
    # A re-applied manifest names alice's lock again on every member, after... anything.
    for i in (1, 2, 3):
        _k(dep3, i, "patch", "lease", LEASE, "--type=merge", "--field-manager=kubectl-edit",
           "-p", json.dumps({"spec": {"holderIdentity": f"alice/{lock_id}x"}}))  # fmt: skip
        _k(dep3, i, "patch", "lease", LEASE, "--type=merge", "--field-manager=kubectl-edit",
           "-p", json.dumps({"spec": {"holderIdentity": f"alice/{lock_id}"}}))  # fmt: skip
    renewed = dep3.cli("lock", "renew", "web", "--lock-id", lock_id)
    assert renewed.returncode != 0, renewed.stderr
    assert _acquire(dep3, "bob", "--ttl", "10s").returncode == 3


def test_a_planted_vanished_mark_does_not_keep_a_dead_holders_lock(dep3: Env) -> None:
    # The deployment's maximum TTL is the default 10 minutes; alice's lock is 3 s. (bob
    # allows no server skew: her lease lapses 3 s + 2 s after her take, where a tombstone
    # would hold for the 10 minutes.)
    alice = _acquire(dep3, "alice", "--ttl", "3s")
    assert alice.returncode == 0, alice.stderr
    for i in (1, 2, 3):
        _annotate(dep3, i, "coordinator.io/vanished", "2026-12-01T00:00:00Z")
    bob = _acquire(dep3, "bob", "--ttl", "10s", "--wait", "40s", "--max-server-skew", "0s")
    assert bob.returncode == 0, bob.stdout + bob.stderr
    assert "deleted" not in bob.stderr


def test_a_planted_break_note_does_not_end_a_live_lock(dep3: Env) -> None:
    alice = _acquire(dep3, "alice", "--ttl", "30s")
    lock_id = json.loads(alice.stdout)["lock_id"]
    note = json.dumps({"by": "mallory", "previous_lock_id": lock_id})
    for i in (1, 2, 3):
        _annotate(dep3, i, "coordinator.io/last-break", note)
    renewed = dep3.cli("lock", "renew", "web", "--lock-id", lock_id)
    assert renewed.returncode == 0, renewed.stderr


def test_a_planted_claim_does_not_reserve_the_next_turn(dep3: Env) -> None:
    alice = _acquire(dep3, "alice", "--ttl", "30s")
    assert alice.returncode == 0, alice.stderr
    claim = json.dumps({"lock": "ffffffffffffffff", "holder": "mallory", "since": 0})
    for i in (1, 2, 3):
        _annotate(dep3, i, "coordinator.io/next", claim)
    st = json.loads(dep3.cli("-o", "json", "lock", "status", "web").stdout)
    assert st["status"] == "held" and st["next_in_line"] is None, st
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    assert _acquire(dep3, "bob", "--ttl", "10s").returncode == 0


def test_a_uid_note_written_by_another_client_does_not_vouch_for_a_copy(sandbox3: Any, tmp_path: Path) -> None:
    # Tokens 1 and 2 granted; on every member another client deletes the Lease, creates it
    # again with token 0 and the member set copied, then writes its new uid as the uid note.
    # (A maximum TTL of 5 s, and no server skew for the wait: a copy blocks that long.)
    env = make_env(sandbox3, tmp_path, max_ttl_s=5)
    for holder in ("first", "second"):
        assert env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", holder).returncode == 0
        assert env.cli("lock", "release", "web", "--holder", holder).returncode == 0

    async def recreate(index: int) -> None:
        client = env.client(index)
        try:
            old = (await client.request("GET", lease_path(env.namespace, LEASE))).body
            members = old["metadata"]["annotations"]["coordinator.io/membership"]
            await client.request("DELETE", lease_path(env.namespace, LEASE))
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": LEASE,
                    "annotations": {"coordinator.io/membership": members, "coordinator.io/fencing-token": "0"},
                },
                "spec": {"leaseDurationSeconds": 30, "holderIdentity": ""},
            }
            query = {"fieldManager": "kubectl-create"}
            made = (await client.request("POST", leases_path(env.namespace), body=body, query=query)).body
            await client.request(
                "PATCH",
                lease_path(env.namespace, LEASE),
                body={"metadata": {"annotations": {"coordinator.io/uid": made["metadata"]["uid"]}}},
                query={"fieldManager": "kubectl-annotate"},
                content_type="application/merge-patch+json",
            )
        finally:
            await client.close()

    for i in (1, 2, 3):
        anyio.run(recreate, i)
    third = _acquire(env, "third", "--ttl", "5s", "--wait", "40s", "--max-server-skew", "0s")
    assert _token(third) > 2, third.stdout


def test_a_token_floor_annotated_lower_on_the_state_objects_does_not_repeat_a_token(dep3: Env) -> None:
    for holder in ("first", "second"):
        _token(_acquire(dep3, holder, "--ttl", "30s"))
        assert dep3.cli("lock", "release", "web", "--holder", holder).returncode == 0
    path = f"{configmaps_path(dep3.namespace)}/coordinator-state-web"
    for i in (1, 2, 3):
        done = kubectl(dep3.kubeconfig, i, dep3.namespace, "annotate", "--overwrite", "configmap",
                       "coordinator-state-web", "coordinator.io/token-floor=0")  # fmt: skip
        assert done.returncode == 0, done.stderr
    # The floors say nothing now; the leases kept their history (token 2).
    assert _token(_acquire(dep3, "third", "--ttl", "30s")) == 3
    # The acquisition made the floors of a majority coordinator's again, at the new token
    # (it counts once a majority has it: the third may land after the command returned).
    floors = [anyio.run(dep3.raw, i, "GET", path)["metadata"]["annotations"]["coordinator.io/token-floor"]
              for i in (1, 2, 3)]  # fmt: skip
    assert floors.count("3") >= 2 and set(floors) <= {"0", "3"}, floors
    # Both records edited: the leases' tokens too. Nothing proves a new token but every
    # member's lease with a majority of floors, and the floors are gone: nothing is taken.
    assert dep3.cli("lock", "release", "web", "--holder", "third").returncode == 0
    for i in (1, 2, 3):
        _annotate(dep3, i, "coordinator.io/fencing-token", "0")
        done = kubectl(dep3.kubeconfig, i, dep3.namespace, "annotate", "--overwrite", "configmap",
                       "coordinator-state-web", "coordinator.io/token-floor=0")  # fmt: skip
        assert done.returncode == 0, done.stderr
    refused = _acquire(dep3, "fourth", "--ttl", "30s")
    assert refused.returncode == 4, refused.stdout
    assert json.loads(refused.stdout)["fencing_token"] is None


def test_a_well_formed_envelope_another_client_wrote_is_not_the_state(dep3: Env) -> None:
    from coordinator.engine.register import checksum

    assert _acquire(dep3, "alice", "--ttl", "30s").returncode == 0
    env = {"COORDINATOR_HOLDER": "alice"}
    assert dep3.cli("state", "set", "web", "replicas:=3", env=env).returncode == 0
    # On two of three members another client writes a well-formed envelope: newer
    # version, the same token, a checksum that matches its data (kubectl's field manager).
    path = f"{configmaps_path(dep3.namespace)}/coordinator-state-web"
    for i in (1, 2):
        obj = anyio.run(dep3.raw, i, "GET", path)
        doc = json.loads(obj["data"]["envelope.json"])
        doc["data"], doc["version"] = {"replicas": 99}, doc["version"] + 5
        doc["checksum"] = checksum(doc["data"])
        patch = json.dumps({"data": {"envelope.json": json.dumps(doc)}})
        _k(dep3, i, "patch", "configmap", "coordinator-state-web", "--type=merge", "-p", patch)
    # A majority read cannot decide (two replicas are no replica's word): nothing is returned
    # as the state, and surely not 99.
    got = dep3.cli("state", "get", "web", "replicas")
    assert "99" not in got.stdout, got.stdout
    diff = json.loads(dep3.cli("-o", "json", "state", "diff", "web").stdout)
    rows = {r["name"]: r for r in diff}
    assert rows["c1"]["status"] == "corrupt" and "another client" in rows["c1"]["detail"], rows["c1"]
    # They may hide a newer confirmed write: a write that builds on the data needs a
    # majority of replicas that decode (exit 6: every member answered), until the holder
    # writes c3's state over them.
    refused = dep3.cli("state", "set", "web", "replicas:=4", env=env)
    assert refused.returncode == 6 and "counts as unanswered" in refused.stderr, refused.stdout + refused.stderr
    adopted = dep3.cli("state", "sync", "web", "--from", "c3", env=env)
    assert adopted.returncode == 0, adopted.stderr
    assert dep3.cli("state", "get", "web", "replicas").stdout.strip() == "3"
    assert dep3.cli("state", "set", "web", "replicas:=4", env=env).returncode == 0
    assert dep3.cli("state", "get", "web", "replicas").stdout.strip() == "4"


# Found by an outside pass with only the safety argument and the evidence table in hand:
# a field no coordinator field manager owns was believed where nobody was recorded as its
# writer — written under the server's own manager name `before-first-apply`, or written
# and then stripped of managedFields in a second request.

HIDE = ("before-first-apply", "strip")


def _hidden_patch(env: Env, index: int, kind: str, name: str, patch: dict[str, Any], how: str) -> None:
    """Another client's merge patch whose writer the server then names nobody."""
    if how == "before-first-apply":
        named = "--field-manager=before-first-apply"
        _k(env, index, "patch", kind, name, "--type=merge", named, "-p", json.dumps(patch))
    else:
        _k(env, index, "patch", kind, name, "--type=merge", "-p", json.dumps(patch))
        _k(env, index, "patch", kind, name, "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}')


@pytest.mark.parametrize("how", HIDE)
def test_a_forged_envelope_with_no_recorded_writer_is_not_the_state(dep3: Env, how: str) -> None:
    from coordinator.engine.register import checksum

    assert _acquire(dep3, "alice", "--ttl", "30s").returncode == 0
    env = {"COORDINATOR_HOLDER": "alice"}
    assert dep3.cli("state", "set", "web", "app=good", env=env).returncode == 0
    path = f"{configmaps_path(dep3.namespace)}/coordinator-state-web"
    obj = anyio.run(dep3.raw, 1, "GET", path)
    doc = json.loads(obj["data"]["envelope.json"])
    doc["data"], doc["version"] = {"app": "FORGED"}, doc["version"] + 1
    doc["checksum"] = checksum(doc["data"])
    _hidden_patch(dep3, 1, "configmap", "coordinator-state-web", {"data": {"envelope.json": json.dumps(doc)}}, how)
    got = dep3.cli("state", "get", "web", "app")
    assert got.returncode == 0 and got.stdout.strip() == "good", got.stdout + got.stderr
    # and the read did not copy it anywhere
    for i in (2, 3):
        other = json.loads(anyio.run(dep3.raw, i, "GET", path)["data"]["envelope.json"])
        assert other["data"] == {"app": "good"}, (i, other["data"])


@pytest.mark.parametrize("how", HIDE)
def test_a_holder_field_with_no_recorded_writer_naming_a_waiter_lets_no_one_in(
    sandbox3: Any, tmp_path: Path, how: str
) -> None:
    # alice holds; bob waits (his lock id is public in his turn claim); another client names
    # bob the holder of c1 and c2 in a way the server records no writer for. (A maximum TTL
    # of 10 s: a stripped lease lapses only by local observation of that long.)
    dep3 = make_env(sandbox3, tmp_path, max_ttl_s=10)
    alice = _acquire(dep3, "alice", "--ttl", "10s")
    assert alice.returncode == 0, alice.stderr
    bob = dep3.popen("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--ttl", "10s", "--wait", "60s",
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        claim = None
        for _ in range(100):
            raw = _lease(dep3, 1)["metadata"].get("annotations", {}).get("coordinator.io/next")
            if raw:
                claim = json.loads(raw)["lock"]
                break
            time.sleep(0.2)
        assert claim, "bob never claimed his turn"
        for i in (1, 2):
            _hidden_patch(dep3, i, "lease", LEASE, {"spec": {"holderIdentity": f"bob/{claim}"}}, how)
        time.sleep(3)
        # bob did not enter on that: alice's lock is still live (or at most it is unknown)
        assert bob.poll() is None, "bob entered while alice's lock was live"
        st = json.loads(dep3.cli("-o", "json", "lock", "status", "web").stdout)
        assert st["lock_id"] != claim, st
    finally:
        out, _ = bob.communicate(timeout=120)
    # once alice's TTL has passed, bob gets it with a token above hers
    assert bob.returncode == 0, out
    assert json.loads(out)["fencing_token"] > json.loads(alice.stdout)["fencing_token"]


@pytest.mark.parametrize("how", HIDE)
def test_a_token_or_mark_with_no_recorded_writer_is_no_bound_and_no_tombstone(
    sandbox3: Any, tmp_path: Path, how: str
) -> None:
    dep3 = make_env(sandbox3, tmp_path, max_ttl_s=8)
    first = _token(_acquire(dep3, "first", "--ttl", "5s"))
    for i in (1, 2, 3):
        _hidden_patch(dep3, i, "lease", LEASE, {"metadata": {"annotations": {
            "coordinator.io/fencing-token": "9223372036854775807", "coordinator.io/vanished": "2026-12-01T00:00:00Z",
        }}}, how)  # fmt: skip
    # first's lock lapses (by its own TTL; stripped, by observation of the 8 s maximum; no
    # server skew allowed), the mark makes no tombstone of it, and the next token is not
    # pushed past 2^63 by numbers nobody is recorded writing
    second = _acquire(dep3, "second", "--ttl", "5s", "--wait", "60s", "--max-server-skew", "0s")
    token = _token(second)
    assert first < token < 1000, token


def test_after_managed_fields_are_stripped_coordinator_writes_are_evidence_again(sandbox3: Any, tmp_path: Path) -> None:
    # Stripped, the server records no writer of any later update; coordinator's next write
    # of each lease brings the records back, so the next holder's leases are its own again.
    env = make_env(sandbox3, tmp_path, max_ttl_s=10)
    assert _acquire(env, "alice", "--ttl", "5s").returncode == 0
    for i in (1, 2, 3):
        _k(env, i, "patch", "lease", LEASE, "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}')
    # (stripped: lapsed once bob watched it unchanged for the maximum TTL; no server skew)
    bob = _acquire(env, "bob", "--ttl", "10s", "--wait", "60s", "--max-server-skew", "0s")
    assert bob.returncode == 0, bob.stderr
    lock_id = json.loads(bob.stdout)["lock_id"]
    for i in (1, 2, 3):
        managers = {e["manager"] for e in _lease(env, i)["metadata"].get("managedFields") or []}
        assert "coordinator" in managers, (i, managers)
    renewed = env.cli("lock", "renew", "web", "--lock-id", lock_id)
    assert renewed.returncode == 0, renewed.stderr
    assert env.cli("lock", "release", "web", "--lock-id", lock_id).returncode == 0


def _cap(env: Env, index: int) -> list[str]:
    """Another client adds 11 annotations of its own under 11 field managers: the API server
    keeps at most 10 Update entries and merges the oldest ones (coordinator's) into one it
    names ``ancient-changes``. Nothing coordinator wrote is touched. The managers left."""
    for n in range(1, 12):
        _k(
            env,
            index,
            "annotate",
            "--overwrite",
            "lease",
            LEASE,
            f"--field-manager=tool-{n}",
            f"example.com/note-{n}=x",
        )
    return [str(e.get("manager")) for e in _lease(env, index)["metadata"].get("managedFields") or []]


def test_fields_the_server_merged_into_ancient_changes_have_no_known_writer(sandbox3: Any, tmp_path: Path) -> None:
    from coordinator.rules.evidence import Writer, writer

    # alice holds a 5 s lock and dies; another client caps the managedFields of every lease.
    env = make_env(sandbox3, tmp_path, max_ttl_s=10)
    alice = _acquire(env, "alice", "--ttl", "5s")
    assert alice.returncode == 0, alice.stderr
    # (the members side by side; each lease's 11 edits still one after the other)
    for i, managers in enumerate(on_each(lambda i: _cap(env, i)), start=1):
        assert "ancient-changes" in managers and "coordinator" not in managers, managers
        # Nobody can tell who wrote the holder field now: not coordinator, and not another
        # client either (nobody edited it).
        assert writer(_lease(env, i), ("spec", "holderIdentity")) is Writer.UNKNOWN
    st = env.cli("-o", "json", "lock", "status", "web")
    doc = json.loads(st.stdout)
    assert doc["status"] == "unknown", doc
    notes = " ".join(str(row.get("error") or "") for row in doc["clusters"])
    assert "record of who wrote" in notes and "another client edited" not in notes, notes
    refused = _acquire(env, "bob", "--ttl", "5s")
    assert refused.returncode == 3, refused.stderr
    assert "record of who wrote" in refused.stderr and "another client edited" not in refused.stderr, refused.stderr
    # The lock lapses as a stripped one does: by local observation of the maximum TTL
    # (plus margin; no server skew allowed for the wait).
    bob = _acquire(env, "bob", "--ttl", "5s", "--wait", "60s", "--max-server-skew", "0s")
    assert bob.returncode == 0, bob.stderr
    assert _token(bob) > _token(alice)


def test_a_live_lock_whose_records_the_server_merged_is_lost_at_its_next_renewal(dep3: Env) -> None:
    # alice holds for a minute; another client caps every lease's managedFields. Her holder
    # field is then no more her word than a stripped one: her renewal reports the lock lost
    # (the safe direction), and nobody else gets it before a maximum TTL either.
    alice = _acquire(dep3, "alice", "--ttl", "60s")
    lock_id = json.loads(alice.stdout)["lock_id"]
    for managers in on_each(lambda i: _cap(dep3, i)):
        assert "ancient-changes" in managers
    renewed = dep3.cli("lock", "renew", "web", "--lock-id", lock_id)
    assert renewed.returncode != 0, renewed.stdout + renewed.stderr
    assert _acquire(dep3, "bob", "--ttl", "10s").returncode == 3
