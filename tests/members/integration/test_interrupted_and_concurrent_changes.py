"""Member changes killed half-way, run from two machines at once, or met by a stale
machine: never two holders, never a lost change."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from coord_fixtures import COMMIT_EVERYWHERE, UNHURRIED, Env
from helpers import web
from helpers.members import (
    DEP,
    KILL_AFTER_JOINT,
    LEASE,
    acquire,
    connected_machine,
    identities,
    ids,
    json_doc,
    kubectl_on,
    machine,
    pay,
    record,
    replica,
    replica_data,
    stored_on,
    stored_set,
    succeeded,
)
from helpers.web import doc, other_machine

from coordinator.config.models import DeploymentRecord
from coordinator.config.store import ConfigStore
from coordinator.rules.membership import A_MEMBERSHIP, Membership

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_waiter_on_another_machine_does_not_follow_a_change_made_elsewhere(dep3: Env, tmp_path: Path) -> None:
    """Machine B waits for the lock with the record {c1, c2, c3}; machine A, holding the
    lock, removes c3 and releases. B's record did not follow (the change was made on A),
    so B must stop with exit 5 (import), never take the lock under the old set."""
    b = other_machine(dep3, tmp_path, "machine-b")
    a = web.acquire(dep3, "alice", "--ttl", "60s")
    assert a.returncode == 0, a.stderr
    lock_id = doc(a)["lock_id"]
    # (a change before the first state write is stuck: see the last test of this file)
    assert dep3.cli("state", "set", "web", "replicas=3", "--lock-id", lock_id).returncode == 0
    import subprocess

    waiter = b.popen("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--wait", "20s",
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        time.sleep(3)
        removed = dep3.cli("deployment", "remove-cluster", "web", "c3", "--lock-id", lock_id)
        assert removed.returncode == 0, removed.stderr
        assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
        out, err = waiter.communicate(timeout=90)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 5, (waiter.returncode, out, err)
    assert "import" in err, err
    # A, with the new set, takes the lock; B with the old one is refused again.
    assert web.acquire(dep3, "carol").returncode == 0
    assert b.cli("lock", "acquire", "web", "--holder", "dave").returncode == 5


@pytest.mark.parametrize("edit", ["remove-annotation", "write-the-old-set"])
def test_an_edited_member_set_on_removed_members_never_gives_two_holders(dep5: Env, tmp_path: Path, edit: str) -> None:
    """Someone with write access to the namespace edits the member-set annotation of the
    two removed members' leases. docs/design.md: a set not written by coordinator stops commands
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


_SLOW_THEN_KILLED = """
import os, signal, sys
import anyio
from coordinator.engine.state import StateClient
async def carry(self, *a, **kw):  # the state copy is slow (a big state, a slow member), then the run dies
    await anyio.sleep(float(os.environ["ADVERSARY_SLEEP"]))
    os.kill(os.getpid(), signal.SIGKILL)
StateClient.carry = carry
sys.argv = ["coordinator", *sys.argv[1:]]
from coordinator.cli import main
main()
"""


def test_a_change_killed_after_renewing_during_the_copy_still_leaves_the_joint_set(dep5: Env, tmp_path: Path) -> None:
    """docs/design.md: an interrupted change leaves the joint set stored; every other command on a
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
    # Refused, bob waits out his --wait. Were the old record to pass, he would take the lock
    # once the killed run's leases (3 s TTL) lapsed: 3 s + 2 s after its last renewal.
    b = acquire(stale, "bob", "--ttl", "10s", "--wait", "12s", "--max-server-skew", "0s")
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
                      env=KILL_AFTER_JOINT)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    succeeded(importer.cli("--timeout", "3s", "deployment", "import", DEP, "--cluster", "c2", "-n", dep5.namespace))
    rec = record(importer)
    assert rec.joint == ["c1", "c2", "c3", "c4"] and rec.epoch == 2, rec
    held = json_doc(succeeded(acquire(importer, "imp", "--ttl", "10s", "--wait", "30s", "--max-server-skew", "0s")))
    assert held["fencing_token"] is not None
    wrote = importer.cli("state", "set", DEP, "release=joint", "--lock-id", held["lock_id"])
    assert wrote.returncode != 0
    # Released on every member (a release that missed one under load leaves the lease
    # there held, and the commit rightly passes it by: then not every member stores it).
    succeeded(importer.cli("lock", "release", DEP, "--holder", "imp", env=UNHURRIED))
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


def _stale_machine(env: Env, tmp_path: Path, deployment: str, members: list[str]) -> Env:
    """Another machine whose record of ``deployment`` names ``members`` at epoch 1."""
    other = connected_machine(env, tmp_path)
    with ConfigStore(other.config).edit() as cfg:
        cfg.deployments[deployment] = DeploymentRecord(name=deployment, namespace=env.namespace, clusters=members)
    other.deployment = deployment
    return other


_KILLER = """
import os, signal, sys
from coordinator.engine.lock.engine import LockEngine
after = int(os.environ["ADVERSARY_KILL_AFTER_ADOPT"])
original = LockEngine.adopt_membership
count = [0]
async def adopt(self, *a, **kw):
    out = await original(self, *a, **kw)
    count[0] += 1
    if count[0] == after:
        os.kill(os.getpid(), signal.SIGKILL)
    return out
LockEngine.adopt_membership = adopt
sys.argv = ["coordinator", *sys.argv[1:]]
from coordinator.cli import main
main()
"""


def _killed_change(env: Env, tmp_path: Path, after: int, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a member change that is SIGKILLed right after its ``after``-th write of a member
    set to the leases (1: the joint set, 2: the commit) returns, before the local record
    follows."""
    script = tmp_path / "killer.py"
    script.write_text(_KILLER)
    return subprocess.run([sys.executable, str(script), *args],
                          env=env.environ(ADVERSARY_KILL_AFTER_ADOPT=str(after)),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.slow
def test_a_stale_machine_is_refused_after_a_change_killed_before_its_record_followed(dep5: Env, tmp_path: Path) -> None:
    """SIGKILL right after the joint set reached the leases, before this machine's record
    followed: a machine whose record predates the change is refused (the members store
    a newer epoch) and cannot write the state."""
    after = 1
    pay(dep5, "c1", "c2", "c3")
    stale = _stale_machine(dep5, tmp_path / "stale", "pay", ["c1", "c2", "c3"])
    killed = _killed_change(dep5, tmp_path, after, "deployment", "add-cluster", "pay", "c4", "--ttl", "5s")
    assert killed.returncode == -9, killed.stderr
    refused = stale.cli("--timeout", "3s", "lock", "acquire", "pay", "--holder", "x", "--wait", "10s")
    assert refused.returncode == 5, refused.stderr
    wrote = stale.cli("--timeout", "3s", "state", "set", "pay", "release=stale")
    assert wrote.returncode != 0
    assert replica_data(dep5, 1)["release"] == "1.2.0"


@pytest.mark.slow
@pytest.mark.parametrize("after", [1, 2], ids=["joint-written-record-not", "commit-written-record-not"])
def test_a_change_killed_before_its_record_followed_is_finished_by_running_it_again(
    dep5: Env, tmp_path: Path, after: int
) -> None:
    pay(dep5, "c1", "c2", "c3")
    killed = _killed_change(dep5, tmp_path, after, "deployment", "add-cluster", "pay", "c4", "--ttl", "5s")
    assert killed.returncode == -9, killed.stderr
    again = dep5.cli("deployment", "add-cluster", "pay", "c4", "--wait", "30s")
    assert again.returncode == 0, again.stderr + again.stdout
    for i in (1, 2, 3, 4):
        assert stored_set(dep5, i).epoch == 3
        assert set(stored_set(dep5, i).members) == identities(dep5, "c1", "c2", "c3", "c4")
    assert replica_data(dep5, 4)["release"] == "1.2.0"
