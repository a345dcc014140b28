"""Member changes and writes whose process stalls at the worst moment (a write in flight
across a replace, two changes under one lock id, a fault between the state copy and the
commit) and stale releases over an edited newer set: never two holders, no lost write.

Found in the fourth adversary round, against the membership fixes of 98eca81
(docs/regressions.md). Everything runs on the real 5-cluster sandbox; "machines" are
separate local configs (helpers.members)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from coord_fixtures import COMMIT_EVERYWHERE, Env
from helpers.members import (
    DEP,
    KILL_AFTER_JOINT,
    LEASE,
    PY,
    acquire,
    holders,
    ids,
    json_doc,
    kubectl_on,
    lease_on,
    machine,
    pay,
    pay_short,
    record,
    stored_on,
    succeeded,
    write_partially,
)

from coordinator.rules.membership import A_MEMBERSHIP, Membership, annotation_writers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _strip_managed_fields(env: Env, index: int) -> None:
    done = kubectl_on(env, index, "patch", "lease", LEASE, "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}')
    assert done.returncode == 0, done.stderr
    lease = lease_on(env, index)
    assert lease is not None and not annotation_writers(lease), lease["metadata"].get("managedFields")


def _reformat_member_set(env: Env, index: int) -> None:
    """`kubectl annotate --overwrite` with the very same set, only formatted differently
    (what a tool that pretty-prints annotations does): the annotation's owner becomes
    kubectl; the set it names does not change."""
    lease = lease_on(env, index)
    assert lease is not None
    same = json.dumps(json.loads(lease["metadata"]["annotations"][A_MEMBERSHIP]), indent=1)
    done = kubectl_on(env, index, "annotate", "--overwrite", "lease", LEASE, f"{A_MEMBERSHIP}={same}")
    assert done.returncode == 0, done.stderr
    assert Membership.parse(same) == stored_on(env, index)


# -- 1. the never-lower rule, when the newer set is not (visibly) coordinator's


# Broke: lock.py:LockEngine._newer_stored_set keeps a newer set only when a coordinator field
# manager owns the annotation. `kubectl annotate --overwrite` of the removed members' (c2, c3)
# very same epoch-5 set, pretty-printed, makes kubectl its owner; runner 1's `lock release`
# (record epoch 1) then writes epoch 1 {c1,c2,c3} there under coordinator's own manager. With
# c1 down the old record takes {c2,c3} and the new one {c4,c5}: two holders, both token 3.
# Removing the annotation (`kubectl annotate lease ... coordinator.io/membership-`, which round 3
# showed acquisitions take for silence) breaks the same way: the release writes epoch 1 there.
# (Stripping managedFields instead held: the set stays unowned, so silent, and c2's state
# object, noting epoch 4, stops the old record.)


@pytest.mark.parametrize(
    "edit",
    [
        "strip-managed-fields",
        pytest.param("reformat-annotation"),
        pytest.param("remove-annotation"),
    ],
)
def test_a_stale_release_does_not_put_the_old_set_back_over_an_edited_newer_one(
    dep5: Env, tmp_path: Path, edit: str
) -> None:
    """Runner 1 holds lock L (record {c1,c2,c3}); runner 2 moves the members to {c1,c4,c5}
    by two replaces under L. Someone then strips the managedFields of the removed members'
    leases (docs/design.md: anyone may; "handled"), or reformats their member-set annotation.
    Runner 1's release must not write its old set (epoch 1) back there: with c1 down, the
    old record and the new one would hold {c2,c3} and {c4,c5} at once."""
    # Until c1 is paused every command waits for every member (COMMIT_EVERYWHERE): on a
    # loaded machine the suite's 3 s can fail the set-up (exit 4), leave a removed
    # member without the set the edits are about, or let runner 1's release give up on
    # c2 and c3 before writing there, which is what the test watches.
    pay(dep5, "c1", "c2", "c3", environ=COMMIT_EVERYWHERE)
    runner = machine(dep5, tmp_path, "runner-2")
    lock = json_doc(succeeded(dep5.cli("-o", "json", "lock", "acquire", DEP, "--holder", "ci", "--ttl", "40s",
                                       env=COMMIT_EVERYWHERE)))  # fmt: skip
    for old, new in (("c3", "c4"), ("c2", "c5")):
        succeeded(runner.cli("deployment", "replace-cluster", DEP, old, new, "--lock-id", lock["lock_id"],
                             "--ttl", "40s", env=COMMIT_EVERYWHERE))  # fmt: skip
    assert record(runner).clusters == ["c1", "c4", "c5"]
    for i in (2, 3):
        if edit == "remove-annotation":
            assert kubectl_on(dep5, i, "annotate", "lease", LEASE, f"{A_MEMBERSHIP}-").returncode == 0
        else:
            (_strip_managed_fields if edit == "strip-managed-fields" else _reformat_member_set)(dep5, i)
    dep5.cli("lock", "release", DEP, "--holder", "ci", env=COMMIT_EVERYWHERE)  # runner 1, record epoch 1
    succeeded(runner.cli("lock", "release", DEP, "--lock-id", lock["lock_id"], env=COMMIT_EVERYWHERE))
    stored = {i: stored_on(dep5, i) for i in (2, 3)}
    dep5.sandbox.pause(1)
    try:
        b = acquire(dep5, "old-record", "--ttl", "30s")
        a = acquire(runner, "new-record", "--ttl", "30s")
    finally:
        dep5.sandbox.resume(1)
    epochs = {i: s and s.epoch for i, s in stored.items()}
    assert not (a.returncode == 0 and b.returncode == 0), (holders(a, b), epochs)


# -- 2. the engine follows this machine's record: to whatever it says?

_REWRITE_RECORD = """
import sys, time
from coordinator.config.store import ConfigStore
store = ConfigStore(sys.argv[1])
with store.edit() as cfg:
    rec = cfg.deployments[sys.argv[2]]
    new = {"clusters": sys.argv[4].split(","), "epoch": int(sys.argv[3]), "joint": None}
    cfg.deployments[sys.argv[2]] = rec.model_copy(update=new)
"""


# Broke: lock.py:LockEngine.release calls _follow_record, which binds any record of this
# deployment with a higher epoch, unchecked; the release then writes that record's set on every
# lease it frees (_lease_body). `lock run pay --ttl 8s -- <replace the config's pay record with
# epoch 3 {c1,c4,c5}>` leaves c1 storing epoch 3 {c1,c4,c5}, written by coordinator: that record
# (refused before) takes {c1,c4,c5}, and with c1 down the real record takes {c2,c3}: two holders.


# Broke before the fix: lock run's release stamps an unchecked record's set on the leases: two holders.
def test_a_record_replaced_during_lock_run_is_not_written_to_the_members(dep5: Env, tmp_path: Path) -> None:
    """`lock run` holds {c1,c2,c3} (epoch 1). Its step replaces this machine's config with
    one naming {c1,c4,c5} at epoch 3 (a config restored from another runner's cache, a
    botched hand edit): a set that no change ever committed. Alone, that record is
    refused by every command (c1 stores epoch 1 {c1,c2,c3}). The run's release must not
    make the members store it: else this record takes {c1,c4,c5}, and once c1 is down
    a machine with the real record takes {c2,c3} at the same time."""
    pay_short(dep5, "c1", "c2", "c3")
    real = machine(dep5, tmp_path, "real")
    script = tmp_path / "rewrite.py"
    script.write_text(_REWRITE_RECORD)
    step = f"{sys.executable} {script} {dep5.config} {DEP} 3 c1,c4,c5"
    run = dep5.cli("lock", "run", DEP, "--ttl", "8s", "--holder", "ci", "--", "sh", "-c", step)
    succeeded(run)
    epochs = {i: (s.epoch if (s := stored_on(dep5, i)) else None) for i in (1, 2, 3)}
    # Refused, this waits out its --wait. Were c1 storing the bogus set, it would take c1 at
    # once and c4 and c5 once the tombstones it leaves there lapse: 8 s + 2 s after it first
    # looked (no skew allowed), well within the wait.
    a = acquire(dep5, "bogus", "--ttl", "8s", "--wait", "20s", "--max-server-skew", "0s")
    if a.returncode != 0:
        return  # the bogus record is refused: safe
    dep5.sandbox.pause(1)
    try:
        b = acquire(real, "real", "--ttl", "8s", "--wait", "20s", "--max-server-skew", "0s")
        # the first holder still holds: its renewal succeeds after the second took the lock
        still = dep5.cli("--timeout", "2s", "lock", "renew", DEP, "--holder", "bogus")
    finally:
        dep5.sandbox.resume(1)
    assert not (b.returncode == 0 and still.returncode == 0), (holders(a, b), epochs)


# -- 3. a state write in flight across a member change

_STALLED_WRITER = """
import os, sys, time
from pathlib import Path
from coordinator.engine.state.replicas import Replicas
checked = Replicas.refuse_other_members
def stalled(self, results):  # the write has read and checked the members; then its process stalls
    checked(self, results)
    Path(os.environ["ADVERSARY_DIR"], "read").touch()
    while not Path(os.environ["ADVERSARY_DIR"], "go").exists():
        time.sleep(0.1)
Replicas.refuse_other_members = stalled
sys.argv = ["coordinator", *sys.argv[1:]]
from coordinator.cli import main
main()
"""


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


# Broke (both): state.py:StateClient.write checks the member set (and the lock) once, when it
# reads; its promise and data compare-and-swaps (register.judge) look at stamps only, neither at
# the member set the state objects now note (raise_token_floor stored the joint set there before
# the copy) nor at their token floor. reconfig.py:change_members checks the copy (_confirm_copy)
# against the value its sync read, so a write that read before the joint step and lands after
# the copy is confirmed on {c2,c3} only, a majority of the old set and no majority of the new.
# Repro: c1 killed; `state set release=2.0` stalled after its read; `replace-cluster pay c3 c4`;
# the write resumes and exits 0; c1 back, c2 down: `state get` says 1.2.0.
# Broke before the fix: a write checked before the joint step landed after the copy on the old
# majority only, and was lost (by the change's own holder, and by a holder that lost the lock).


@pytest.mark.parametrize(
    "writer",
    [
        pytest.param("same-lock"),
        pytest.param("expired-lock"),
    ],
)
def test_a_write_in_flight_across_a_replace_is_not_lost(dep5: Env, tmp_path: Path, writer: str) -> None:
    """c1 is down. A `state set release=2.0` reads the members ({c1,c2,c3}, epoch 1) and
    its process stalls; meanwhile `replace-cluster pay c3 c4` copies the state (1.2.0) and
    commits {c1,c2,c4}; then the write goes on and lands on c2 and c3, a majority of the
    set it checked. The writer is the change's own lock holder (`same-lock`: both run
    under one `lock run`) or a holder whose lock expired meanwhile (`expired-lock`: the
    change took the lock with a higher token and raised the token floor on the state
    objects). Either the write is refused, or it is not lost: with c1 back and c2 down,
    the new set must read 2.0."""
    pay(dep5, "c1", "c2", "c3")
    script = tmp_path / "stalled_writer.py"
    script.write_text(_STALLED_WRITER)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = dep5.environ(ADVERSARY_DIR=str(marks))
    dep5.sandbox.kill(1)  # refused at once: no request of the writer waits there to land later
    try:
        if writer == "same-lock":
            step = (f"{sys.executable} {script} --timeout 2s state set {DEP} release=2.0 & "
                    f"while [ ! -f {marks}/read ]; do sleep 0.1; done; "
                    f"{' '.join(PY)} --timeout 2s deployment replace-cluster {DEP} c3 c4 --ttl 20s; "
                    f"echo change=$?; touch {marks}/go; wait $!; echo write=$?")  # fmt: skip
            run = dep5.cli("--timeout", "2s", "lock", "run", DEP, "--ttl", "20s", "--holder", "ci", "--",
                           "sh", "-c", step, timeout=120, env={"ADVERSARY_DIR": str(marks)})  # fmt: skip
            out = run.stdout
        else:
            lock = json_doc(succeeded(acquire(dep5, "w", "--ttl", "3s", "--timeout", "2s")))
            w = subprocess.Popen([sys.executable, str(script), "--timeout", "2s", "state", "set", DEP,
                                  "release=2.0", "--lock-id", lock["lock_id"]], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
            _wait_for(marks / "read")
            change = dep5.cli("--timeout", "2s", "deployment", "replace-cluster", DEP, "c3", "c4",
                              "--ttl", "20s", "--wait", "30s")  # fmt: skip
            (marks / "go").touch()
            _, werr = w.communicate(timeout=60)
            out = f"change={change.returncode}\nwrite={w.returncode}\n{werr[-600:]}"
    finally:
        dep5.sandbox.start(1)
    assert "change=0" in out, out
    assert record(dep5).clusters == ["c1", "c2", "c4"]
    if "write=0" not in out:
        return  # the late write was refused: safe
    # c1 is back; a lock taken and given back under the new set brings its lease up to date
    succeeded(acquire(dep5, "next", "--ttl", "20s", "--wait", "30s", "--max-server-skew", "0s"))
    succeeded(dep5.cli("lock", "release", DEP, "--holder", "next"))
    dep5.sandbox.pause(2)
    try:
        got = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
    finally:
        dep5.sandbox.resume(2)
    assert got.returncode != 0 or got.stdout.strip() == "2.0", (out, got.stdout, got.stderr[-500:])


# Broke: lock.py:LockEngine._follow_record binds any record named like the engine's deployment
# whose epoch is higher, also one of another namespace; _bind keeps self.path (the first
# namespace's lease) but takes the new record's member set and namespace annotation. `lock run
# pay` (namespace A, {c1,c2,c3}, epoch 1) whose step runs `deployment delete pay && deployment
# import pay --cluster c4 -n B` (another deployment pay, epoch 5 {c1,c4,c5}) releases on namespace
# A's lease of c1 writing B's set there; c2 and c3 stay held (released only "over" c1,c4,c5).


# Broke before the fix: lock run follows a record of another namespace and writes its set on A's lease.
def test_lock_run_does_not_follow_a_record_of_another_namespace(dep5: Env, tmp_path: Path) -> None:
    pay(dep5, "c1", "c2", "c3")
    other = machine(dep5, tmp_path, "team-b")
    ns_b = dep5.namespace + "-b"
    succeeded(other.cli("deployment", "delete", DEP))
    succeeded(
        other.cli("deployment", "create", DEP, "-n", ns_b, "--cluster", "c1", "--cluster", "c4", "--cluster", "c5")
    )
    succeeded(other.cli("deployment", "add-cluster", DEP, "c2", "--ttl", "10s"))
    succeeded(other.cli("deployment", "remove-cluster", DEP, "c2", "--ttl", "10s"))
    assert record(other).epoch == 5
    step = f"{' '.join(PY)} deployment delete {DEP} && {' '.join(PY)} deployment import {DEP} --cluster c4 -n {ns_b}"
    run = dep5.cli("lock", "run", DEP, "--ttl", "20s", "--holder", "ci", "--", "sh", "-c", step)
    assert run.returncode == 0, run.stderr
    assert record(dep5).namespace == ns_b
    a = Membership.of(ids(dep5, "c1", "c2", "c3"), 1)
    stored = {i: stored_on(dep5, i) for i in (1, 2, 3)}
    held = {i: ((lease_on(dep5, i) or {}).get("spec") or {}).get("holderIdentity") for i in (1, 2, 3)}
    assert all(s == a for s in stored.values()) and not any(held.values()), (stored, held, run.stderr[-800:])


# -- 4. held: a change finished by a second run under the same `lock run`


def test_a_change_killed_after_the_joint_step_and_finished_under_the_same_lock_run(dep5: Env, tmp_path: Path) -> None:
    """The first replace is SIGKILLed right after the joint step (record joint, epoch 2);
    the second, under the same `lock run`, finishes it (the _Resuming engine, which now
    follows too). Held: every member of both sets stores the commit, the old record is
    refused, this machine takes the lock."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    py = " ".join(PY)
    killed = f"PYTHONPATH={shlex.quote(KILL_AFTER_JOINT['PYTHONPATH'])}"
    step = (f"{killed} {py} deployment replace-cluster {DEP} c3 c4 --ttl 6s; "
            f"{py} deployment replace-cluster {DEP} c3 c4 --ttl 6s")  # fmt: skip
    succeeded(dep5.cli("lock", "run", DEP, "--ttl", "6s", "--holder", "ci", "--", "sh", "-c", step,
                 env=COMMIT_EVERYWHERE))  # fmt: skip
    assert record(dep5).clusters == ["c1", "c2", "c4"] and record(dep5).epoch == 3
    final = Membership.of(ids(dep5, "c1", "c2", "c4"), 3)
    assert all(stored_on(dep5, i) == final for i in (1, 2, 3, 4)), {i: stored_on(dep5, i) for i in (1, 2, 3, 4)}
    assert acquire(stale, "old", "--ttl", "10s").returncode == 5
    succeeded(acquire(dep5, "new", "--ttl", "10s", "--wait", "30s", "--max-server-skew", "0s"))


def test_two_lock_runs_on_two_machines_with_a_change_in_one(dep5: Env, tmp_path: Path) -> None:
    """Machine A's `lock run` replaces c3 by c4; machine B's `lock run --wait` on the old
    record waits meanwhile. Held: B is refused (exit 5) once A is done, never runs its
    command."""
    pay(dep5, "c1", "c2", "c3")
    b = machine(dep5, tmp_path, "machine-b")
    marker = tmp_path / "b-ran"
    pa = dep5.popen("lock", "run", DEP, "--ttl", "6s", "--holder", "a", "--", "sh", "-c",
                    f"sleep 2; {' '.join(PY)} deployment replace-cluster {DEP} c3 c4 --ttl 6s; sleep 2",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    time.sleep(1.5)
    pb = b.popen("lock", "run", DEP, "--ttl", "6s", "--holder", "b", "--wait", "40s", "--", "touch", str(marker),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    outs = [p.communicate(timeout=90) for p in (pa, pb)]
    assert pa.returncode == 0, outs[0]
    assert pb.returncode == 5 and not marker.exists(), (pb.returncode, outs[1])


# -- 5. two changes under one lock id: the joint step's confirmation

_STALLING_CHANGE = """
import os, sys, time
from pathlib import Path
import anyio
from coordinator.ops import reconfig
point = os.environ["ADVERSARY_STALL"]
original = getattr(reconfig, point)
marks = Path(os.environ["ADVERSARY_DIR"])
async def stalled(*a, **kw):  # the run is slow right here (a slow machine, a long GC pause)
    result = original(*a, **kw)
    if hasattr(result, "__await__"):
        result = await result
    (marks / f"{point}-reached").touch()
    while not (marks / f"{point}-go").exists():
        await anyio.sleep(0.1)
    return result
def stalled_sync(*a, **kw):
    result = original(*a, **kw)
    (marks / f"{point}-reached").touch()
    while not (marks / f"{point}-go").exists():
        time.sleep(0.1)
    return result
setattr(reconfig, point, stalled if point == "_refuse_foreign" else stalled_sync)
sys.argv = ["coordinator", *sys.argv[1:]]
from coordinator.cli import main
main()
"""


# Broke: lock.py:LockEngine.adopt_membership reports "member set written" (OK) for a lease that
# names the lock, whatever _lease_body did with it; since 98eca81 _lease_body *keeps* a newer set it
# finds (the never-lower rule), so the joint step and the commit count leases that store another
# change's set. Runner A and runner B both run a replace under lock L (A: c3 -> c4; B: c2 -> c5).
# A commits {c1,c2,c4} (epoch 3) while c3 is down; B then "stores" its joint set and "commits"
# {c1,c3,c5} (epoch 3) — c1 and c2 kept A's set, counted as B's — and reports success. c1,c2,c4
# store A's set, c3,c5 B's: with c1 down A takes {c2,c4} and B {c3,c5}.


# Broke before the fix: adopt_membership counts leases that kept another change's set: two commits, two holders.
def test_two_changes_under_one_lock_id_never_both_commit(dep5: Env, tmp_path: Path) -> None:
    pay(dep5, "c1", "c2", "c3")
    b = machine(dep5, tmp_path, "runner-b")
    script = tmp_path / "stalling_change.py"
    script.write_text(_STALLING_CHANGE)
    marks = tmp_path / "marks"
    marks.mkdir()
    lock = json_doc(succeeded(acquire(dep5, "ci", "--ttl", "90s")))

    def change(env: Env, stall: str, old: str, new: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(script), "--timeout", "2s", "deployment", "replace-cluster",
                                 DEP, old, new, "--lock-id", lock["lock_id"], "--ttl", "90s"],
                                env=env.environ(ADVERSARY_DIR=str(marks), ADVERSARY_STALL=stall), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    pb = change(b, "_refuse_foreign", "c2", "c5")  # B has checked its lock; it stalls before its joint step
    _wait_for(marks / "_refuse_foreign-reached")
    pa = change(dep5, "_confirm_copy", "c3", "c4")  # A stores its joint set and copies; stalls before the commit
    _wait_for(marks / "_confirm_copy-reached")
    dep5.sandbox.kill(3)
    try:
        (marks / "_confirm_copy-go").touch()
        out_a = pa.communicate(timeout=90)
    finally:
        dep5.sandbox.start(3)
    assert pa.returncode == 0, out_a
    (marks / "_refuse_foreign-go").touch()
    out_b = pb.communicate(timeout=90)
    committed = {i: (s.epoch, tuple(sorted(s.members))) if (s := stored_on(dep5, i)) else None for i in range(1, 6)}
    if pb.returncode != 0:
        return  # B's change was refused: safe
    succeeded(dep5.cli("lock", "release", DEP, "--lock-id", lock["lock_id"]))
    b.cli("lock", "release", DEP, "--lock-id", lock["lock_id"])
    dep5.sandbox.pause(1)
    try:
        la = acquire(dep5, "a", "--ttl", "30s", "--wait", "20s", "--max-server-skew", "0s")
        lb = acquire(b, "b", "--ttl", "30s", "--wait", "20s", "--max-server-skew", "0s")
    finally:
        dep5.sandbox.resume(1)
    assert not (la.returncode == 0 and lb.returncode == 0), (holders(la, lb), committed, out_b[1][-600:])


# -- 6. held: faults between the copy and the commit


def _stalled_change(env: Env, script: Path, marks: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(script), "--timeout", "2s", "deployment", *args],
                            env=env.environ(ADVERSARY_DIR=str(marks), ADVERSARY_STALL="_confirm_copy"),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


@pytest.mark.parametrize("fault", ["kill-c1-during-commit", "delete-c4-lease-and-state"])
def test_a_fault_between_the_copy_and_the_commit(dep5: Env, tmp_path: Path, fault: str) -> None:
    """release=1.3.0 is confirmed on {c1,c3} only (c2 was down). `replace-cluster pay c3
    c4` copies it and stalls before its commit; then c1's API server is killed for the
    commit (c1 keeps the joint set), or kubectl deletes c4's lease and state object.
    Held: the old record is refused, and the new set reads 1.3.0 with any one member
    down."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    write_partially(dep5, "1.3.0", paused=2)
    script = tmp_path / "stalling_change.py"
    script.write_text(_STALLING_CHANGE)
    marks = tmp_path / "marks"
    marks.mkdir()
    p = _stalled_change(dep5, script, marks, "replace-cluster", DEP, "c3", "c4", "--ttl", "30s")
    _wait_for(marks / "_confirm_copy-reached")
    if fault == "kill-c1-during-commit":
        dep5.sandbox.kill(1)
    else:
        for kind, name in (("lease", LEASE), ("configmap", f"coordinator-state-{DEP}")):
            assert kubectl_on(dep5, 4, "delete", kind, name).returncode == 0
    try:
        (marks / "_confirm_copy-go").touch()
        out = p.communicate(timeout=90)
    finally:
        dep5.sandbox.start(1)
    assert p.returncode == 0, out
    assert record(dep5).clusters == ["c1", "c2", "c4"]
    for down in (1, 2, 3):
        dep5.sandbox.pause(down)
        try:
            refused = acquire(stale, "old", "--ttl", "10s")
        finally:
            dep5.sandbox.resume(down)
        assert refused.returncode in (4, 5), (down, refused.stdout)
    succeeded(acquire(dep5, "new", "--ttl", "20s", "--wait", "30s", "--max-server-skew", "0s"))
    succeeded(dep5.cli("lock", "release", DEP, "--holder", "new"))
    for down in (1, 2, 4):
        dep5.sandbox.pause(down)
        try:
            got = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
        finally:
            dep5.sandbox.resume(down)
        assert got.returncode != 0 or got.stdout.strip() == "1.3.0", (down, got.stdout)
    assert succeeded(dep5.cli("state", "get", DEP, "release")).stdout.strip() == "1.3.0"
