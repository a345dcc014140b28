"""Sixth adversary round, against the membership machinery: the state objects as the
voice of a member whose lease says nothing, their annotations (member set, token
floor) and envelope, and the rule that a behind member of the new set stands in while a
change is finished (``membership.behind_stand_in``).

Every attempt is kept: each test asserts the safe behaviour; where the attempt broke it,
the docstring says exactly what happened (those tests fail on the code they were written
against).

Everything runs on the real sandbox API servers (the 5-cluster sandbox). "Machines" are
separate local configs (copies of one), as in test_adversary_round3_membership.py, whose
helpers this file uses."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from helpers.members import (
    DEP,
    LEASE,
    STATE,
    acquire,
    holders,
    json_doc,
    kubectl_on,
    machine,
    pay,
    pay_short,
    replica,
    stored_on,
    succeeded,
)

from coordinator.kube.resources import configmaps_path
from coordinator.membership import A_MEMBERSHIP

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILL = {"COORDINATOR_TEST_KILL_AFTER": "joint"}
A_FLOOR = "coordinator.io/token-floor"


def _state_object(env: Env, index: int) -> dict[str, Any]:
    return anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/{STATE}")


def _annotate(env: Env, index: int, kind: str, name: str, *edits: str) -> None:
    done = kubectl_on(env, index, "annotate", "--overwrite", kind, name, *edits)
    assert done.returncode == 0, done.stderr


# -- 1. the state object's member-set annotation removed: its envelope's older set speaks


def test_removing_the_state_objects_set_annotation_does_not_let_a_stale_envelope_speak(
    dep5: Env, tmp_path: Path
) -> None:
    """{c1,c2,c3} -> {c1,c4,c5} by two replaces; the stale machine keeps epoch 1. On the
    removed members c2 and c3, someone removes the member-set annotation from the lease
    (round 3 tried that alone: held, because the state objects note the newer set) *and*
    from the state ConfigMap (`kubectl annotate configmap coordinator-state-pay
    coordinator.io/membership-`). The envelopes there still carry the set of their last
    write, epoch 1 — coordinator wrote it, long ago. README: a member whose lease says
    nothing speaks through its state object, and a set another client edited is no
    evidence; nothing was deleted and no member missed a commit, so the concession of
    "What is assumed" does not apply. c1 down: the stale record must not get {c2,c3}
    while the real one gets {c4,c5}.

    BROKE: both acquisitions exit 0 — "two holders: A on ['c4', 'c5'] token 4, B on
    ['c2', 'c3'] token 4" (one token granted twice), c2's envelope membership is epoch 1;
    the stale holder's `state set pay release=9.9` exits 0 ("c2 ok wrote version 2, c3 ok
    wrote version 2"), and the real record's `state get pay release` then prints 1.2.0: a
    confirmed write contradicted. Flaw: lock/floor.py:envelope_evidence takes the envelope's
    own `membership` (written_by_us is True for a set parsed from an envelope) when the
    state object's coordinator-owned annotation is gone, and kept_set_speaks lets it speak
    at the record's own epoch; acquire.py (maybe_choose_token) and
    state/replicas.py:_members_verdict then count it as agreeing."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4"))
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c2", "c5"))
    for i in (2, 3):
        _annotate(dep5, i, "lease", LEASE, f"{A_MEMBERSHIP}-")
        _annotate(dep5, i, "configmap", STATE, f"{A_MEMBERSHIP}-")
    envelopes = {i: (replica(dep5, i) or {}).get("membership") for i in (2, 3)}
    dep5.sandbox.pause(1)
    try:
        b = acquire(stale, "bob", "--ttl", "60s")
        a = acquire(dep5, "alice", "--ttl", "60s")
        wrote = read = None
        if a.returncode == 0 and b.returncode == 0:
            # what the two holders then do with the state
            wrote = stale.cli(
                "--timeout", "2s", "state", "set", DEP, "release=9.9", "--lock-id", json_doc(b)["lock_id"]
            )
            read = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
    finally:
        dep5.sandbox.resume(1)
    assert not (a.returncode == 0 and b.returncode == 0), (
        holders(a, b),
        envelopes,
        wrote and (wrote.returncode, wrote.stdout.strip()),
        read and (read.returncode, read.stdout.strip()),
    )


# -- 2. the token floor annotation removed from the state objects, then every lease deleted


def test_removing_the_token_floor_annotation_does_not_let_a_token_be_granted_again(dep5: Env) -> None:
    """pay on {c1,c2,c3}, state written under token T0. Alice takes the lock (token T1 >
    T0) and never writes the state: her token lives on the leases and, README, on the
    token floor (`coordinator.io/token-floor`) the acquisition raised on the state
    objects. Someone removes that annotation from the three state ConfigMaps (`kubectl
    annotate configmap coordinator-state-pay coordinator.io/token-floor-`: an annotation
    edit, nothing deleted) and deletes the three leases (README: handled). README: "the
    next holder's writes are accepted again with no purge", tokens strictly increase; the
    concession (a token granted again) needs the leases *and the state objects* of a
    majority deleted. Bob's token must be above Alice's.

    BROKE: Bob gets fencing token 2, Alice's token (floors read before the edit: '2' on
    all three). By hand, with no state ever written, `lock history pay` lists alice
    (released) and bob both with token 1. Flaw: lock/floor.py:token_floor reads the
    annotation whoever wrote it and a removed one as 0, and
    TokenFloor._state_evidence / envelope_evidence then give max(envelope token, 0); nothing
    records that the floor was ever higher. Fixed: every state object is created with a
    floor, and one without it counts as having had it removed (no token is proven new
    until a floor is put back)."""
    env = dep5
    pay_short(env, "c1", "c2", "c3", max_ttl="8s")
    alice = json_doc(succeeded(acquire(env, "alice", "--ttl", "8s")))
    succeeded(env.cli("lock", "release", DEP, "--holder", "alice"))
    floors = {i: (_state_object(env, i)["metadata"].get("annotations") or {}).get(A_FLOOR) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        _annotate(env, i, "configmap", STATE, f"{A_FLOOR}-")
        assert kubectl_on(env, i, "delete", "lease", LEASE).returncode == 0
    # Now: an object without a floor had it removed (coordinator creates every state object
    # with one), so no token is proven new: Bob is refused, not given Alice's token.
    bob = acquire(env, "bob", "--ttl", "8s", "--max-server-skew", "0s")
    # (exit 5: with the leases deleted and no state object that counts, nothing confirms
    # the member set either)
    assert bob.returncode in (4, 5), (bob.returncode, bob.stdout, bob.stderr, floors)
    assert json_doc(bob)["fencing_token"] is None and not json_doc(bob)["acquired"], bob.stdout
    # The operator puts a floor back (at least the highest token the lock history shows):
    # the next token is above it.
    for i in (1, 2, 3):  # under coordinator's field manager: another client's floor does not speak
        done = kubectl_on(env, i, "annotate", "--overwrite", "--field-manager=coordinator", "configmap", STATE,
                        f"{A_FLOOR}={alice['fencing_token']}")  # fmt: skip
        assert done.returncode == 0, done.stderr
    bob = acquire(env, "bob", "--ttl", "8s", "--wait", "60s", "--max-server-skew", "0s")
    succeeded(bob)
    assert json_doc(bob)["fencing_token"] > alice["fencing_token"], (alice["fencing_token"], json_doc(bob), floors)


# -- the rule that a behind member of the new set stands in while a change is finished


def _change(env: Env, *args: str, wait: str = "0s") -> subprocess.CompletedProcess[str]:
    return env.cli("--timeout", "3", "deployment", *args, "--ttl", "10s", "--wait", wait)


def _stalled_removal(env: Env, *, write_while_behind: str | None = None) -> None:
    """The situation of test_membership_finish_behind.py: pay on {c1,c2,c3}; c2 misses
    two changes (it keeps epoch 1 while the others reach epoch 5); ``remove-cluster pay
    c1`` then stops with the joint set (epoch 6) on c1 and c3 only. With
    ``write_while_behind``, release=VALUE is written (confirmed on c1 and c3) while c2 is
    still down, so c2's state object is behind too."""
    pay_short(env, "c1", "c2", "c3", max_ttl="10s")
    env.sandbox.pause(2)
    try:
        succeeded(_change(env, "add-cluster", DEP, "c4"))
        succeeded(_change(env, "remove-cluster", DEP, "c4"))
        if write_while_behind is not None:
            lock = json_doc(succeeded(acquire(env, "w", "--ttl", "10s")))
            succeeded(env.cli("--timeout", "2s", "state", "set", DEP, f"release={write_while_behind}",
                        "--lock-id", lock["lock_id"]))  # fmt: skip
            succeeded(env.cli("lock", "release", DEP, "--holder", "w"))
        stopped = _change(env, "remove-cluster", DEP, "c1")
        assert stopped.returncode == 4, stopped.stderr
    finally:
        env.sandbox.resume(2)
    behind, joint = stored_on(env, 2), stored_on(env, 3)
    assert behind is not None and behind.epoch == 1, behind
    assert joint is not None and joint.epoch == 6 and joint.joint is not None, joint


def test_a_finishing_run_whose_copy_to_the_behind_member_is_refused_does_not_commit(dep5: Env) -> None:
    """The behind member c2 stands in for the new set {c2,c3} so that the finishing run
    takes the lock; c2 also missed the confirmed write release=2.0. A
    ValidatingAdmissionPolicy on c2 refuses changing the state object's data (what a
    policy engine or a quota does) for the whole finishing run: the copy to c2 fails.
    README: the new set is committed only once the value is on a majority of the new set
    ({c2,c3}: both). The run must stop in the joint configuration; once the policy is
    gone, the next run finishes and the new set reads release=2.0 (c2's own object
    included).

    HELD: the run exits non-zero with the change still in progress, nothing committed;
    after the policy is gone the rerun commits and release=2.0 is read, on c2 too."""
    from helpers.members import drop_policies, refuse_state_data

    env = dep5
    _stalled_removal(env, write_while_behind="2.0")
    assert (replica(env, 2) or {}).get("data", {}).get("release") != "2.0"
    made = refuse_state_data(env, (2,))
    try:
        refused = _change(env, "remove-cluster", DEP, "c1")
        shown = json_doc(succeeded(env.cli("-o", "json", "deployment", "show", DEP)))
    finally:
        drop_policies(env, made)
    assert refused.returncode != 0, refused.stdout
    assert shown.get("change_in_progress") == {"to": ["c2", "c3"]}, (shown, refused.stderr)
    for i in (2, 3):
        s = stored_on(env, i)
        assert s is not None and s.epoch <= 6, (i, s)
    succeeded(_change(env, "remove-cluster", DEP, "c1", wait="30s"))
    assert succeeded(env.cli("state", "get", DEP, "release")).stdout.strip() == "2.0"
    assert (replica(env, 2) or {}).get("data", {}).get("release") == "2.0"


_STOP_BEFORE_COMMIT = """
import os, sys, time
from pathlib import Path
from coordinator.lock import LockEngine
original = LockEngine.adopt_membership
async def adopt_membership(self, *a, **kw):
    if self.membership.joint is None:  # the commit (the joint step stores a joint set)
        Path(os.environ["ADVERSARY_MARK"]).write_text("at the commit")
        go = Path(os.environ["ADVERSARY_GO"])
        while not go.exists():
            time.sleep(0.1)  # the whole process waits: renewals too
    return await original(self, *a, **kw)
LockEngine.adopt_membership = adopt_membership
sys.argv = ["coordinator", *sys.argv[1:]]
from coordinator.cli import main
main()
"""


def test_an_api_server_paused_at_the_commit_of_a_finishing_run(dep5: Env, tmp_path: Path) -> None:
    """The finishing run of the stalled removal (c2 standing in, c2 behind on the state
    too) reaches its commit; right then c3's API server is stopped (SIGSTOP), so the
    commit lands on c1 and c2 only: a majority of the old set {c1,c2,c3}, not of the new
    set {c2,c3}. While c3 is stopped: a machine whose record is the set before the change
    (epoch 5) and one with the original record (epoch 1, the set c2 stored until this
    run) must take no lock; this machine's state read must not return the value from
    before the confirmed write; an import must not adopt the half-written commit. Once
    c3 is back a rerun finishes, the confirmed write survives and the next token is
    higher than every one seen.

    HELD: the run exits 4; the three machines' acquisitions all fail; the read fails
    rather than answer 1.2.0; the rerun finishes, 2.0 is read, the token rises."""
    env = dep5
    pay_short(env, "c1", "c2", "c3", max_ttl="10s")
    ancient = machine(env, tmp_path, "ancient")  # epoch 1
    env.sandbox.pause(2)
    try:
        succeeded(_change(env, "add-cluster", DEP, "c4"))
        succeeded(_change(env, "remove-cluster", DEP, "c4"))
        lock = json_doc(succeeded(acquire(env, "w", "--ttl", "10s")))
        succeeded(env.cli("--timeout", "2s", "state", "set", DEP, "release=2.0", "--lock-id", lock["lock_id"]))
        succeeded(env.cli("lock", "release", DEP, "--holder", "w"))
        before = machine(env, tmp_path, "before")  # epoch 5
        assert _change(env, "remove-cluster", DEP, "c1").returncode == 4
    finally:
        env.sandbox.resume(2)
    assert stored_on(env, 2) is not None  # c2 answers again before the finishing run starts
    script = tmp_path / "stop_before_commit.py"
    script.write_text(_STOP_BEFORE_COMMIT)
    mark, go = tmp_path / "mark", tmp_path / "go"
    proc = subprocess.Popen(
        # every member answers until the commit: a timeout a busy machine does not reach
        [sys.executable, str(script), "--timeout", "8", "deployment", "remove-cluster", DEP,
         "c1", "--ttl", "10s"],
        env=env.environ(ADVERSARY_MARK=str(mark), ADVERSARY_GO=str(go), PYTHONPATH=str(Path.cwd())),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "never reached the commit"
            time.sleep(0.2)
        env.sandbox.pause(3)
        go.write_text("go")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 4, (proc.returncode, out, err)
        stored = {i: stored_on(env, i) for i in (1, 2)}
        tries = {
            "before": acquire(before, "b", "--ttl", "10s"),
            "ancient": acquire(ancient, "a", "--ttl", "10s"),
            "here": acquire(env, "h", "--ttl", "10s"),
        }
        read = env.cli("--timeout", "2s", "state", "get", DEP, "release")
        fresh = tmp_path / "fresh" / "config.yaml"
        fresh.parent.mkdir()
        shutil.copy(env.config, fresh)
        other = Env(sandbox=env.sandbox, config=fresh, namespace=env.namespace, deployment=DEP,
                    clusters=list(env.clusters))  # fmt: skip
        succeeded(other.cli("deployment", "delete", DEP))
        imported = other.cli("--timeout", "2s", "deployment", "import", DEP, "--cluster", "c2", "-n", env.namespace)
    finally:
        go.write_text("go")
        if proc.poll() is None:
            proc.kill()
        env.sandbox.resume(3)
    assert {k: p.returncode for k, p in tries.items() if p.returncode == 0} == {}, (
        stored,
        {k: p.stdout for k, p in tries.items()},
    )
    assert read.returncode != 0 or read.stdout.strip() == "2.0", read.stdout
    if imported.returncode == 0:
        got = other.cli("--timeout", "2s", "-o", "json", "lock", "acquire", DEP, "--holder", "i", "--ttl", "10s")
        assert got.returncode != 0 or read.returncode != 0, ("import adopted", imported.stdout, got.stdout)
    done = succeeded(_change(env, "remove-cluster", DEP, "c1", wait="30s"))
    assert succeeded(env.cli("state", "get", DEP, "release")).stdout.strip() == "2.0", done.stdout
    after = json_doc(succeeded(acquire(env, "after", "--ttl", "10s", "--wait", "30s")))
    assert after["fencing_token"] > lock["fencing_token"], (lock, after)


# -- HA members: two kube-apiservers on one etcd behind the front proxy, during a change


@pytest.fixture(scope="module")
def ha() -> Any:
    from coordinator import sandbox as sb

    directory = Path(tempfile.mkdtemp(prefix="sandbox-ha-adv6-"))
    handle = sb.Sandbox(directory)
    try:
        yield sb.up(3, directory, apiservers=2)
    finally:
        handle.down(grace=5.0)


def test_a_change_on_ha_members_with_one_api_server_each_stalled_and_skewed(ha: Any, tmp_path: Path) -> None:
    """Every member runs two kube-apiservers on one etcd; kube-apiserver 1 of every
    cluster answers 3 s ahead (inside --max-server-skew), and on c2 and c3 it is stopped
    (SIGSTOP) for the whole change, so about half the requests there hang and time out,
    at random points of each run. `remove-cluster pay c3` is run until it finishes (each
    run that fails must leave a safe state). Then: the stale machine (epoch 1) takes no
    lock, the state written before is read, and tokens keep rising.

    HELD."""
    from coord_fixtures import make_env

    env = make_env(ha, tmp_path)
    ha.set_date_offset(3.0)
    try:
        pay_short(env, "c1", "c2", "c3", max_ttl="10s")
        stale = machine(env, tmp_path, "stale")
        first = json_doc(succeeded(acquire(env, "t0", "--ttl", "10s")))
        succeeded(env.cli("lock", "release", DEP, "--holder", "t0"))
        ha.pause(2, apiserver=1)
        ha.pause(3, apiserver=1)
        runs = []
        try:
            for _ in range(4):  # four tries under the stall; the last one, if needed, after it
                run = _change(env, "remove-cluster", DEP, "c3", wait="20s")
                runs.append((run.returncode, run.stderr.strip().splitlines()[-1:] if run.stderr else []))
                if run.returncode == 0:
                    break
                assert run.returncode in (4, 3, 1), run.stderr
                middle = acquire(stale, "s", "--ttl", "10s")
                if middle.returncode == 0:
                    # (its release meets the stopped apiservers too: exit 4 until it lands)
                    for _ in range(5):
                        if stale.cli("lock", "release", DEP, "--holder", "s").returncode == 0:
                            break
                    else:
                        raise AssertionError("the stale machine's release never reached a majority")
                    shown = json_doc(succeeded(env.cli("-o", "json", "deployment", "show", DEP)))
                    assert shown.get("change_in_progress") is None and shown["epoch"] == 1, (
                        "the stale machine took the lock during the change",
                        shown,
                        runs,
                    )
        finally:
            ha.resume(2, apiserver=1)
            ha.resume(3, apiserver=1)
        if runs[-1][0] != 0:
            succeeded(_change(env, "remove-cluster", DEP, "c3", wait="30s"))
        shown = json_doc(succeeded(env.cli("-o", "json", "deployment", "show", DEP)))
        assert shown["clusters"] == ["c1", "c2"] and shown.get("change_in_progress") is None, (shown, runs)
        refused = acquire(stale, "s2", "--ttl", "10s")
        assert refused.returncode == 5, (refused.returncode, refused.stdout, runs)
        assert succeeded(env.cli("state", "get", DEP, "release")).stdout.strip() == "1.2.0"
        after = json_doc(succeeded(acquire(env, "t1", "--ttl", "10s", "--wait", "30s")))
        assert after["fencing_token"] > first["fencing_token"], (first, after, runs)
    finally:
        ha.set_date_offset(0)
        for i in range(1, ha.n + 1):
            ha.start(i)
