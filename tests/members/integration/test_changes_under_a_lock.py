"""Third adversary round, against the membership machinery (issue 15): the member set
stored in the clusters, the check every command makes, and the changes through a joint
configuration. Every attempt is kept, whether it broke something or not: each test
asserts the safe behaviour; where the attempt broke it, the test is a strict xfail whose
reason gives the repro.

Everything runs on the real sandbox API servers (the 5-cluster sandbox). "Machines" are
separate local configs (copies of one, as a second laptop or CI runner that created or
imported the deployment before the change)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import COMMIT_EVERYWHERE, COMMIT_TIMEOUT_S, Env
from helpers.members import (
    DEP,
    LEASE,
    PY,
    STATE,
    acquire,
    drop_policies,
    ids,
    json_doc,
    kubectl_on,
    machine,
    pay,
    record,
    refuse_state_data,
    replica,
    stored_on,
    succeeded,
    write_partially,
)

from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.kube.resources import configmaps_path
from coordinator.membership import A_MEMBERSHIP, Membership
from coordinator.register import checksum

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# -- helpers


# -- 1. a change made under a lock that a longer-lived process holds (`lock run`)

# Broke before the fix: lock run's renewals and its final release use the LockEngine built from
# the record at its start: lock.py:LockEngine._lease_body writes self.membership (epoch 1) on
# every lease it renews/releases, so `lock run pay -- coordinator deployment replace-cluster pay
# c3 c4` leaves c1,c2,c3 storing epoch 1 {c1,c2,c3} after the commit; the stale machine then takes
# the lock (exit 0, not 5)


def test_a_change_run_inside_lock_run_is_not_undone_by_its_release(dep5: Env, tmp_path: Path) -> None:
    """The documented way to run a step under the lock, with the member change as the
    step: the change picks the lock id up from COORDINATOR_LOCK_ID. After it, the old
    members must store the committed set, so a machine whose record predates the change
    is refused, and this machine (whose record followed) can take the lock."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    run = dep5.cli("lock", "run", DEP, "--ttl", "6s", "--holder", "ci", "--",
                   *PY, "deployment", "replace-cluster", DEP, "c3", "c4", "--ttl", "6s",
                   env=COMMIT_EVERYWHERE)  # fmt: skip
    succeeded(run)
    rec = record(dep5)
    assert rec.clusters == ["c1", "c2", "c4"] and rec.epoch == 3, rec
    refused = acquire(stale, "bob", "--ttl", "10s")
    stored = {i: stored_on(dep5, i) for i in (1, 2, 3, 4)}
    assert refused.returncode == 5, (refused.returncode, {i: s and s.epoch for i, s in stored.items()})
    assert all(s is not None and s.epoch == 3 for s in stored.values()), stored
    ok = acquire(dep5, "alice", "--ttl", "10s", "--wait", "30s", "--max-server-skew", "0s")
    assert ok.returncode == 0, ok.stderr


# Broke before the fix: `lock run pay --ttl 6s -- sh -c 'coordinator deployment replace-cluster
# pay c3 c4 --ttl 6s && coordinator deployment replace-cluster pay c2 c5 --ttl 6s'`: lock run's
# release (engine of epoch 1) rewrites epoch 1 {c1,c2,c3} on c1,c2,c3 while c4,c5 store epoch 5
# {c1,c4,c5}; a machine with the old record takes {c1,c2,c3} and this machine takes {c4,c5}: two
# holders at once


def test_two_changes_inside_one_lock_run_never_give_two_holders(dep5: Env, tmp_path: Path) -> None:
    """{c1,c2,c3} becomes {c1,c4,c5} by two replaces run under one `lock run`. A machine
    whose record still says {c1,c2,c3} and this machine (record {c1,c4,c5}) must never both
    hold the lock: their majorities {c2,c3} and {c4,c5} are disjoint."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    py = " ".join(PY)
    step = (f"{py} deployment replace-cluster {DEP} c3 c4 --ttl 6s && "
            f"{py} deployment replace-cluster {DEP} c2 c5 --ttl 6s")  # fmt: skip
    succeeded(dep5.cli("lock", "run", DEP, "--ttl", "6s", "--holder", "ci", "--", "sh", "-c", step))
    assert record(dep5).clusters == ["c1", "c4", "c5"]
    b = acquire(stale, "bob", "--ttl", "60s")
    a = acquire(dep5, "alice", "--ttl", "60s", "--wait", "40s", "--max-server-skew", "0s")
    both = a.returncode == 0 and b.returncode == 0
    tokens = (json_doc(a).get("fencing_token"), json_doc(b).get("fencing_token")) if both else None
    assert not both, (
        f"two holders: alice on {[c['name'] for c in json_doc(a)['clusters'] if c['outcome'] == 'ok']}, "
        f"bob on {[c['name'] for c in json_doc(b)['clusters'] if c['outcome'] == 'ok']}, tokens {tokens}"
    )


# Broke before the fix: Coordinator.lock() keeps renewing and finally releases with the engine
# made before change_members(c, 'pay', ..., lock_id=held.lock_id) ran: the release writes the old
# member set (epoch 1) over the commit on c1,c2,c3


def test_a_change_inside_the_python_api_lock_block_is_not_undone_by_its_release(dep5: Env) -> None:
    from coordinator.reconfig import change_members

    pay(dep5, "c1", "c2", "c3")

    async def main() -> None:
        async with dep5.api(timeout=COMMIT_TIMEOUT_S) as c, c.lock(DEP, ttl=6, holder="api") as held:
            await change_members(c, DEP, ["c1", "c2", "c4"], lock_id=held.lock_id, ttl=6)

    anyio.run(main)
    assert record(dep5).epoch == 3
    stored = {i: stored_on(dep5, i) for i in (1, 2, 4)}
    assert all(s is not None and s.epoch == 3 for s in stored.values()), {i: s and s.epoch for i, s in stored.items()}


# Broke before the fix: LockEngine.release never checks the member set: machine A takes the lock,
# machine B (same record) runs `deployment replace-cluster pay c3 c4 --lock-id L`, then `lock
# release pay` on A (record epoch 1) writes epoch 1 {c1,c2,c3} back on c1,c2,c3; A's stale record
# is accepted again (exit 0, not 5)


def test_a_release_from_a_machine_whose_record_is_stale_does_not_undo_a_change(dep5: Env, tmp_path: Path) -> None:
    """A CI job takes the lock on one runner; a later step on another runner changes the
    members under that lock id; the first runner releases at the end. The release must
    not put the old member set back."""
    pay(dep5, "c1", "c2", "c3")
    runner = machine(dep5, tmp_path, "runner-2")
    lock = json_doc(succeeded(acquire(dep5, "ci", "--ttl", "30s")))
    succeeded(
        runner.cli("deployment", "replace-cluster", DEP, "c3", "c4", "--lock-id", lock["lock_id"], "--ttl", "30s")
    )
    released = dep5.cli("lock", "release", DEP, "--holder", "ci")
    assert released.returncode in (0, 5), released.stderr
    for i in (1, 2, 3):
        stored = stored_on(dep5, i)
        assert stored is not None and stored.epoch == 3, (i, stored)
    refused = acquire(dep5, "again", "--ttl", "10s")
    assert refused.returncode == 5, refused.stderr


# -- 2. the state copy to the new member


# Broke before the fix: reconfig.py:change_members ignores what StateClient.sync could not repair:
# release=1.3.0 confirmed on {c1,c3} (c2 paused), an admission policy refuses state data writes on
# c2 and c4, `replace-cluster pay c3 c4` still commits {c1,c2,c4}; with c1 down, `state get`
# returns 1.2.0


def test_a_replace_whose_state_copy_failed_does_not_lose_a_confirmed_write(dep5: Env) -> None:
    """Replacing c3 by c4 in {c1,c2,c3}: the newest confirmed write is on {c1,c3} only (c2
    was down). If the copy cannot bring it to a majority of the new set {c1,c2,c4}, the
    change must not commit; a read with one member of the new set down must never return
    the older value."""
    pay(dep5, "c1", "c2", "c3")
    write_partially(dep5, "1.3.0", paused=2)
    made = refuse_state_data(dep5, (2, 4))
    try:
        changed = dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4")
    finally:
        drop_policies(dep5, made)
    if changed.returncode != 0:
        return  # refused to commit without the copy: safe
    dep5.sandbox.pause(1)
    try:
        got = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
        # the next holder writes on what it read (c1 still down) ...
        lock = json_doc(succeeded(acquire(dep5, "next", "--ttl", "30s")))
        succeeded(dep5.cli("--timeout", "2s", "state", "set", DEP, "note=after", "--lock-id", lock["lock_id"]))
        succeeded(dep5.cli("--timeout", "2s", "lock", "release", DEP, "--holder", "next"))
    finally:
        dep5.sandbox.resume(1)
    # ... and once c1 is back, the confirmed 1.3.0 must still be the value
    later = dep5.cli("state", "get", DEP, "release")
    assert (got.returncode != 0 or got.stdout.strip() == "1.3.0") and later.stdout.strip() == "1.3.0", (
        changed.stdout,
        got.stdout,
        later.stdout,
    )


def test_a_replace_with_the_new_member_down_keeps_the_state_readable_with_another_member_down(dep5: Env) -> None:
    """c4 is paused for the whole `replace-cluster pay c3 c4` (it gets neither lease nor
    state). Held: the change commits on {c1,c2}; the state is there. With c2 down, c4
    stores no member set yet, and a member that stores nothing confirms nothing (it could
    be a removed member that was wiped: test_adversary_round5_membership.py), so the read
    is refused as unobservable (exit 4) rather than answered from c1 alone; with c2 back
    the newest value is returned and c4 is repaired."""
    pay(dep5, "c1", "c2", "c3")
    dep5.sandbox.pause(4)
    try:
        succeeded(dep5.cli("--timeout", "2s", "deployment", "replace-cluster", DEP, "c3", "c4"))
    finally:
        dep5.sandbox.resume(4)
    dep5.sandbox.pause(2)
    try:
        refused = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
    finally:
        dep5.sandbox.resume(2)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "c4 store no member set" in refused.stderr and "c2 could not be read" in refused.stderr
    got = succeeded(dep5.cli("--timeout", "2s", "state", "get", DEP, "release"))
    assert got.stdout.strip() == "1.2.0"
    assert (replica(dep5, 4) or {}).get("data", {}).get("release") == "1.2.0"


def _forged_envelope(env: Env, data: dict[str, Any], token: int) -> str:
    """An envelope in coordinator's format (the code is public), for deployment `pay`,
    with a token as high as the attacker likes."""
    doc = replica(env, 1)
    assert doc is not None
    doc.update(data=data, checksum=checksum(data), token=token, version=doc["version"] + 1, write_id="ab" * 16)
    return json.dumps(doc, separators=(",", ":"))


# Broke before the fix: a user granted only deployment `other` on c4 (rbac print) creates Lease
# coordinator-lock-pay (no member set, fencing-token 1000000) and ConfigMap coordinator-state-pay
# (an envelope of token 1000000) on c4; `deployment add-cluster pay c4` takes the lease for a
# legacy one, counts its token as lease evidence, and its state sync copies the planted data over
# pay's state on c1,c2,c3


def test_add_cluster_does_not_copy_a_state_planted_on_the_new_member(dep5: Env, tmp_path: Path) -> None:
    """Threat model: a user with the printed rights of another deployment in the namespace
    can create objects under any name, and can change nothing of `pay`. Planting `pay`'s
    lease and state object on a cluster before it is added must not let it rewrite `pay`'s
    state on the members."""
    from helpers.rbac import grant, mint_user

    pay(dep5, "c1", "c2", "c3")
    user, minted = mint_user(dep5.sandbox, tmp_path, "other-team")
    grant(dep5.sandbox, dep5, dep5.namespace, user, clusters=(4,), deployments=("other",))
    ns = dep5.namespace
    planted_lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": ns, "annotations": {"coordinator.io/fencing-token": "1000000"}},
        "spec": {},
    }
    planted_state = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": STATE, "namespace": ns},
        "data": {"envelope.json": _forged_envelope(dep5, {"release": "evil"}, 1000000)},
    }

    async def plant() -> None:
        client = KubeClient(Endpoint("u4", minted.contexts[3], str(minted.path)), timeout=5)
        try:
            await client.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", body=planted_lease)
            await client.request("POST", configmaps_path(ns), body=planted_state)
            with pytest.raises(KubeError):  # it may not touch `pay`'s objects otherwise
                await client.request("GET", f"{configmaps_path(ns)}/{STATE}")
        finally:
            await client.close()

    anyio.run(plant)
    added = dep5.cli("deployment", "add-cluster", DEP, "c4")
    after = {i: ((replica(dep5, i) or {}).get("data") or {}).get("release") for i in (1, 2, 3)}
    got = dep5.cli("state", "get", DEP, "release")
    assert after == {1: "1.2.0", 2: "1.2.0", 3: "1.2.0"}, (added.returncode, added.stdout, after)
    assert got.returncode != 0 or got.stdout.strip() == "1.2.0", got.stdout


# -- 3. the check, against edits of the stored set and deleted leases

# Broke before the fix: membership.py:in_lease_object takes a lease without the membership
# annotation for a LEGACY one, which check() counts as agreeing (and a set equal to the local
# record counts whoever wrote it): after {c1,c2,c3} -> {c1,c4,c5} by two replaces, `kubectl
# annotate lease coordinator-lock-pay coordinator.io/membership-` on c2 and c3 (or re-annotating
# the old set), c1 down, lets the old record hold {c2,c3} while the new one holds {c4,c5}


@pytest.mark.parametrize("edit", ["remove-annotation", "write-the-old-set"])
def test_an_edited_member_set_on_removed_members_never_gives_two_holders(dep5: Env, tmp_path: Path, edit: str) -> None:
    """Someone with write access to the namespace edits the member-set annotation of the
    two removed members' leases. README: a set not written by coordinator stops commands
    (exit 5); a lease whose set is gone must not pass for one from before member sets."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    old = json.dumps({"epoch": 1, "members": ids(dep5, "c1", "c2", "c3")}, separators=(",", ":"))
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4"))
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c2", "c5"))
    for i in (2, 3):
        if edit == "remove-annotation":
            args = ["annotate", "lease", LEASE, f"{A_MEMBERSHIP}-"]
        else:
            args = ["annotate", "--overwrite", "lease", LEASE, f"{A_MEMBERSHIP}={old}"]
        done = kubectl_on(dep5, i, *args)
        assert done.returncode == 0, done.stderr
    dep5.sandbox.pause(1)
    try:
        b = acquire(stale, "bob", "--ttl", "60s")
        a = acquire(dep5, "alice", "--ttl", "60s")
    finally:
        dep5.sandbox.resume(1)
    assert not (a.returncode == 0 and b.returncode == 0), (a.stdout, b.stdout)


# Broke before the fix: state.py:StateClient._refuse_other_members looks at leases only: after
# `replace-cluster pay c3 c4` and release=2.0 confirmed on {c1,c4}, deleting the leases on c2 and
# c3 and c1 being down lets a machine with the old record {c1,c2,c3} read release=1.2.0 (c2's
# state object stores the committed set; reads look at leases only)


def test_a_stale_record_cannot_read_old_state_once_leases_are_deleted(dep5: Env, tmp_path: Path) -> None:
    """README: a member whose lease was deleted stores nothing, and state envelopes speak
    for deleted leases. A stale machine's state read must stop (exit 5) rather than
    return a value older than a confirmed write."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4"))
    write_partially(dep5, "2.0", paused=2)  # confirmed on c1, c4
    for i in (2, 3):
        assert kubectl_on(dep5, i, "delete", "lease", LEASE).returncode == 0
    dep5.sandbox.pause(1)
    try:
        got = stale.cli("--timeout", "2s", "state", "get", DEP, "release")
    finally:
        dep5.sandbox.resume(1)
    assert got.returncode != 0 or got.stdout.strip() == "2.0", got.stdout


# -- 4. interrupted changes, imports during them, and races between machines

_SLOW_THEN_KILLED = """
import os, signal, sys
import anyio
from coordinator.state import StateClient
async def sync(self, *a, **kw):  # the state copy is slow (a big state, a slow member), then the run dies
    await anyio.sleep(float(os.environ["ADVERSARY_SLEEP"]))
    os.kill(os.getpid(), signal.SIGKILL)
StateClient.sync = sync
sys.argv = ["coordinator", *sys.argv[1:]]
from coordinator.cli import main
main()
"""

# Broke before the fix: reconfig.py:change_members renews its lock with the engine of the old
# configuration (keep_renewed(engine, ...)), and each renewal writes the old member set (epoch 1)
# over the joint one on c1,c2,c3; `add-cluster pay c4 --ttl 3s` killed 2.5 s into the state copy
# leaves the joint set on c4 only, and a machine with the old record takes the lock (exit 0, not
# 5)


def test_a_change_killed_after_renewing_during_the_copy_still_leaves_the_joint_set(dep5: Env, tmp_path: Path) -> None:
    """README: an interrupted change leaves the joint set stored; every other command on a
    record that did not follow stops with exit 5. Here the change is killed after its
    record followed (joint), during a slow state copy through which it kept renewing."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    script = tmp_path / "slow_killer.py"
    script.write_text(_SLOW_THEN_KILLED)
    killed = subprocess.run(
        [sys.executable, str(script), "deployment", "add-cluster", DEP, "c4", "--ttl", "3s"],
        env=dep5.environ(ADVERSARY_SLEEP="2.5"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    assert record(dep5).joint == ["c1", "c2", "c3", "c4"]
    stored = {i: stored_on(dep5, i) for i in (1, 2, 3, 4)}
    b = acquire(stale, "bob", "--ttl", "10s", "--wait", "20s", "--max-server-skew", "0s")
    assert b.returncode == 5, (b.returncode, {i: s and (s.epoch, s.joint is not None) for i, s in stored.items()})
    succeeded(dep5.cli("deployment", "add-cluster", DEP, "c4", "--wait", "30s"))


def test_import_during_a_joint_configuration_then_the_commit_elsewhere(dep5: Env, tmp_path: Path) -> None:
    """A change is SIGKILLed right after the joint configuration was stored. Another machine
    imports at that moment: it gets the joint set (a majority of both sets store it), may
    take the lock under it (a majority of both), may not write the state. Once the first
    machine finishes the change, the importer is refused (exit 5). Held."""
    pay(dep5, "c1", "c2", "c3")
    importer = machine(dep5, tmp_path, "importer")
    succeeded(importer.cli("deployment", "delete", DEP))
    killed = dep5.cli("deployment", "add-cluster", DEP, "c4", "--ttl", "5s",
                      env={"COORDINATOR_TEST_KILL_AFTER": "joint"})  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    succeeded(importer.cli("--timeout", "3s", "deployment", "import", DEP, "--cluster", "c2", "-n", dep5.namespace))
    rec = record(importer)
    assert rec.joint == ["c1", "c2", "c3", "c4"] and rec.epoch == 2, rec
    held = json_doc(succeeded(acquire(importer, "imp", "--ttl", "10s", "--wait", "30s", "--max-server-skew", "0s")))
    assert held["fencing_token"] is not None
    wrote = importer.cli("state", "set", DEP, "release=joint", "--lock-id", held["lock_id"])
    assert wrote.returncode != 0
    succeeded(importer.cli("lock", "release", DEP, "--holder", "imp"))
    succeeded(dep5.cli("deployment", "add-cluster", DEP, "c4", "--wait", "30s", env=COMMIT_EVERYWHERE))
    refused = acquire(importer, "imp2", "--ttl", "10s")
    assert refused.returncode == 5, refused.stderr
    stored = {i: stored_on(dep5, i) for i in (1, 2, 3, 4)}
    assert all(s is not None and s.epoch == 3 for s in stored.values()), {
        i: s and (s.epoch, s.joint is not None) for i, s in stored.items()
    }
    for i in (1, 2, 3, 4):
        assert ((replica(dep5, i) or {}).get("data") or {}).get("release") == "1.2.0"


def test_two_machines_changing_the_members_at_once(dep5: Env, tmp_path: Path) -> None:
    """Machine A replaces c3 by c4 while machine B (same record) replaces c3 by c5, both
    started at once. At most one commits; the members agree on one set; the two machines
    never both hold the lock afterwards, and tokens keep rising. Held."""
    pay(dep5, "c1", "c2", "c3")
    b = machine(dep5, tmp_path, "machine-b")
    pa = dep5.popen("deployment", "replace-cluster", DEP, "c3", "c4", "--ttl", "10s",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    pb = b.popen("deployment", "replace-cluster", DEP, "c3", "c5", "--ttl", "10s",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    outs = [p.communicate(timeout=90) for p in (pa, pb)]
    codes = [pa.returncode, pb.returncode]
    assert codes.count(0) == 1, (codes, outs)  # one commits, the other is refused (3: held, 5: changed)
    winner, loser = (dep5, b) if codes[0] == 0 else (b, dep5)
    members = record(winner).clusters
    sets = {i: stored_on(dep5, i) for i in (1, 2, 3, 4, 5)}
    committed = Membership.of(ids(dep5, *members), 3)
    assert all(sets[int(m[1:])] == committed for m in members), sets
    la = acquire(winner, "w", "--ttl", "30s", "--wait", "30s", "--max-server-skew", "0s")
    lb = acquire(loser, "l", "--ttl", "30s")
    assert la.returncode == 0, la.stderr
    assert lb.returncode == 5, lb.stderr


def test_force_dead_on_a_paused_member_that_comes_back(dep5: Env, tmp_path: Path) -> None:
    """c3 is only paused when `remove-cluster pay c3 --force-dead` runs, then resumes with
    the old set (and a lease it still stores as epoch 1). Held: a machine with the old
    record is refused even when it reads c3 (another member tells it), the new set locks
    with a higher token, and c3 cannot be added back while it stores the old state."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    before = json_doc(succeeded(acquire(dep5, "t0", "--ttl", "10s")))
    succeeded(dep5.cli("lock", "release", DEP, "--holder", "t0"))
    dep5.sandbox.pause(3)
    try:
        succeeded(dep5.cli("--timeout", "2s", "deployment", "remove-cluster", DEP, "c3", "--force-dead"))
    finally:
        dep5.sandbox.resume(3)
    assert stored_on(dep5, 3) is not None and stored_on(dep5, 3).epoch == 1  # type: ignore[union-attr]
    for paused in (1, 2):  # the stale machine reads c3 and one other member
        dep5.sandbox.pause(paused)
        try:
            refused = acquire(stale, "old", "--ttl", "10s")
        finally:
            dep5.sandbox.resume(paused)
        assert refused.returncode in (4, 5), refused.stderr  # never 0
    after = json_doc(succeeded(acquire(dep5, "t1", "--ttl", "10s")))
    assert after["fencing_token"] > before["fencing_token"]
    succeeded(dep5.cli("lock", "release", DEP, "--holder", "t1"))
