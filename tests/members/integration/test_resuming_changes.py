"""Resuming an interrupted member change: a change in progress in this machine's record is
re-run with the ``_Resuming`` engine, which counts a member storing the set from before
the change, its joint set or its commit as agreeing, on a lease or on a state object when
the leases were deleted. A stale joint record must not finish a change the members moved
on from.

Found in the fifth adversary round (docs/regressions.md). Everything runs on the real
5-cluster sandbox; "machines" are separate local configs (helpers.members)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from coord_fixtures import Env
from helpers.members import (
    DEP,
    KILL_AFTER_JOINT,
    LEASE,
    STATE,
    acquire,
    ids,
    json_doc,
    kubectl_on,
    machine,
    pay_short,
    stored_on,
    succeeded,
    until_admission,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _where(p: subprocess.CompletedProcess[str]) -> list[str]:
    return sorted(c["name"] for c in json_doc(p)["clusters"] if c["outcome"] == "ok")


def _show(env: Env) -> Any:
    return json_doc(succeeded(env.cli("-o", "json", "deployment", "show", DEP)))


def _wipe(env: Env, index: int, *, lease: bool = True, state: bool = True) -> None:
    """What an operator does to a cluster that left the deployment (docs/design.md, --force-dead:
    "wiped (remove its lease and state)"): delete the deployment's objects there, with
    kubectl, as any other client would."""
    if lease:
        done = kubectl_on(env, index, "delete", "lease", LEASE, "--ignore-not-found")
        assert done.returncode == 0, done.stderr
    if state:
        done = kubectl_on(env, index, "delete", "configmap", STATE, "--ignore-not-found")
        assert done.returncode == 0, done.stderr


def _interrupted_removal_then_moved_on(
    env: Env, tmp_path: Path, *, c3_down_while_finishing: bool = False
) -> tuple[Env, Env]:
    """pay on c1,c2,c3 (release=1.2.0). Machine A starts `remove-cluster pay c3` and is
    killed right after the joint step (its record: epoch 2, change to c1,c2 in
    progress). Machine B, a copy of A's config taken then, finishes that change (epoch 3,
    {c1,c2}) and moves the deployment on, one cluster at a time, to {c4,c5} (epoch 11).
    ``c3_down_while_finishing``: c3 is paused while B finishes the change, so its lease
    keeps the joint set (epoch 2) and its state object the set from before (epoch 1).
    Returns (A, B)."""
    pay_short(env, "c1", "c2", "c3", max_ttl="10s")
    killed = env.cli("deployment", "remove-cluster", DEP, "c3", "--ttl", "5s", env=KILL_AFTER_JOINT)
    assert killed.returncode == -9, killed.stderr
    assert _show(env)["change_in_progress"] == {"to": ["c1", "c2"]}
    b = machine(env, tmp_path, "b")
    if c3_down_while_finishing:
        env.sandbox.pause(3)
    try:
        # The paused c3 costs this command a request timeout at each of its steps (about
        # four: 2 s made it 20 s long, 10 s 52 s, on a loaded machine), and c1 and c2 must
        # answer within it: 2 s, which a loaded machine's API servers missed, is 5 s.
        succeeded(b.cli("--timeout", "5s", "deployment", "remove-cluster", DEP, "c3", "--ttl", "10s", "--wait", "30s"))
    finally:
        if c3_down_while_finishing:
            env.sandbox.resume(3)
    for step in (("add-cluster", "c4"), ("add-cluster", "c5"), ("remove-cluster", "c1"), ("remove-cluster", "c2")):
        succeeded(b.cli("deployment", step[0], DEP, step[1], "--ttl", "10s", "--wait", "30s"))
    shown = _show(b)
    assert shown["clusters"] == ["c4", "c5"] and shown["change_in_progress"] is None, shown
    return env, b


def _hold_with_lock_run(env: Env, tmp_path: Path, assignment: str) -> subprocess.Popen[str]:
    """`lock run` on ``env`` holding the lock (renewed) and writing ``assignment`` under it;
    returns once the write is confirmed. The caller stops it with _stop."""
    mark = tmp_path / f"wrote-{env.config.parent.name}"
    step = (
        f'{sys.executable} -m coordinator state set {DEP} {assignment} --lock-id "$COORDINATOR_LOCK_ID" '
        f"&& echo $COORDINATOR_FENCING_TOKEN > {mark} && sleep 300"
    )
    # The deployment's maximum TTL (10 s; 8 s before): each renewal has ~4 s, not ~3.5 s, to
    # reach a majority on a loaded machine. The run must still hold when the test looks.
    proc = env.popen("lock", "run", DEP, "--ttl", "10s", "--holder", "b", "--wait", "30s", "--", "sh", "-c", step,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (mark.exists() and mark.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            out, err = proc.communicate()
            raise AssertionError(f"lock run did not hold and write: {proc.returncode} {out} {err}")
        time.sleep(0.3)
    return proc


def _token_of_b(tmp_path: Path, env: Env) -> str:
    return (tmp_path / f"wrote-{env.config.parent.name}").read_text().strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# -- 1. a stale joint record after the change was finished elsewhere and moved on


def test_a_stale_joint_record_does_not_finish_a_change_after_the_members_moved_on(dep5: Env, tmp_path: Path) -> None:
    """BREAK (fails today). A's record says "change {c1,c2,c3} -> {c1,c2} in progress
    (epoch 2)"; B finished it and moved the deployment on to {c4,c5} (epoch 11); c1 and
    c2, no longer members, were wiped (lease and state deleted with kubectl); c3, removed
    by the very change A has in progress, is left alone: its lease still stores that
    change's commit (epoch 3, written on the old members too), its state object the joint
    set (epoch 2). B holds the lock on c4,c5.

    What happened: A re-runs `deployment remove-cluster pay c3`: exit 0. The resuming
    engine counts c3 (epoch-3 commit = "its commit": agreeing) and c1, c2 (silent: no lease,
    no state object) as majorities of both {c1,c2,c3} and {c1,c2}; it takes the lock on
    c1,c2,c3, copies c3's old state (release=1.2.0) to c1,c2 and commits {c1,c2} at epoch
    3. A then takes the lock on c1,c2 (token 6 in one run, 9 in another) while B's
    `lock run` still holds it on c4,c5 (token 8): two holders (and, in the first run, a
    token lower than one already granted); A's
    `state get` returns release=1.2.0 after B confirmed release=2.0.0. A's plain `lock
    acquire` just before is refused (exit 5: c3's lease stores epoch 3, newer than A's
    epoch 2): it is the resuming engine that opens the door. Not new with 39f0315: it
    breaks the same way with coordinator/ops/reconfig.py of 5c5cc4d (c3's lease shows the
    change, so that version used the resuming engine too)."""
    a, b = _interrupted_removal_then_moved_on(dep5, tmp_path)
    holding = _hold_with_lock_run(b, tmp_path, "release=2.0.0")
    try:
        for i in (1, 2):
            _wipe(a, i)
        # A's plain engine (joint record, epoch 2) meets c3's epoch-3 commit: refused
        plain = acquire(a, "a0", "--ttl", "8s")
        # the tombstones that a first look at c1, c2 writes block for the maximum TTL (10s)
        # plus the lapse margin (about 7 s): the old bug took the lock about 20 s in, under
        # load; the refused rerun waits out its whole --wait, so it is no longer than needed
        rerun = a.cli("deployment", "remove-cluster", DEP, "c3", "--ttl", "8s", "--wait", "30s")
        held_a = acquire(a, "a", "--ttl", "8s", "--wait", "20s")
        read = a.cli("-o", "json", "state", "get", DEP)
        b_alive = holding.poll() is None
    finally:
        _stop(holding)
    assert b_alive, "B's lock run ended early"
    assert plain.returncode == 5, plain.stdout + plain.stderr
    assert held_a.returncode != 0, (
        f"two holders: B (lock run on c4,c5, token {_token_of_b(tmp_path, b)}, wrote release=2.0.0), "
        f"A on {_where(held_a)} token "
        f"{json_doc(held_a)['fencing_token']}; the rerun exited {rerun.returncode}: {rerun.stdout} {rerun.stderr}; "
        f"A reads {read.stdout}"
    )
    assert rerun.returncode == 5, rerun.stdout + rerun.stderr


def test_a_stale_joint_record_cannot_lock_with_only_a_removed_members_state_object(dep5: Env, tmp_path: Path) -> None:
    """BREAK (fails today), not through the rerun: the plain lock engine of a record in a
    joint configuration. Same story as above, but c3's lease was deleted too (only its
    state object is left, noting the joint set, epoch 2, since the change removed c3 no
    later write touched it). What happened: A's `lock acquire pay` (its record: joint
    epoch 2) exits 0 on c1,c2,c3 with token 4 while B's `lock run` holds on c4,c5 with
    token 8: c3's state object
    agrees with A's joint set, c1 and c2 say nothing, and silence counts as soon as one
    member agrees, also for the group {c1,c2} where none does. Not about reconfig.py: the
    check (membership.check) and lock/acquire's use of state evidence."""
    a, b = _interrupted_removal_then_moved_on(dep5, tmp_path)
    holding = _hold_with_lock_run(b, tmp_path, "release=2.0.0")
    try:
        for i in (1, 2):
            _wipe(a, i)
        _wipe(a, 3, state=False)
        held_a = acquire(a, "a", "--ttl", "8s", "--wait", "30s")
        b_alive = holding.poll() is None
    finally:
        _stop(holding)
    assert b_alive, "B's lock run ended early"
    assert held_a.returncode != 0, (
        f"two holders: B (lock run on c4,c5, token {_token_of_b(tmp_path, b)}), A on {_where(held_a)} "
        f"token {json_doc(held_a)['fencing_token']}"
    )
    assert held_a.returncode == 5, held_a.stderr


def test_a_stale_joint_record_does_not_finish_on_the_set_from_before_it_noted_on_a_state_object(
    dep5: Env, tmp_path: Path
) -> None:
    """BREAK (fails today) through what just changed: `_Resuming._state_evidence`, which
    takes the set from *before* the change off a state object as agreeing. c3 was paused
    while B finished A's change, so c3's state object still carries epoch 1 {c1,c2,c3};
    B then moved on to {c4,c5}; c1, c2 were wiped and c3's lease deleted. Before the
    change the rerun refused (an epoch-1 set on a state object says nothing to an epoch-2
    engine: no member agreed, exit 5). What happened now: A's rerun of
    `remove-cluster pay c3` counts c3's epoch-1 state object as agreeing and c1, c2 as
    silent, takes the lock, copies c3's old state and commits {c1,c2}; A then holds the
    lock on c1,c2 (token 4) alongside B on c4,c5 (token 8), and reads release=1.2.0
    after B confirmed 2.0.0. New with 39f0315: with coordinator/ops/reconfig.py of 5c5cc4d
    (everything else as in this tree) this test passes: the rerun exits 5."""
    a, b = _interrupted_removal_then_moved_on(dep5, tmp_path, c3_down_while_finishing=True)
    holding = _hold_with_lock_run(b, tmp_path, "release=2.0.0")
    try:
        for i in (1, 2):
            _wipe(a, i)
        _wipe(a, 3, state=False)
        # as above: the tombstones of the first look lapse about 18 s in (the old bug took the lock then)
        rerun = a.cli("deployment", "remove-cluster", DEP, "c3", "--ttl", "8s", "--wait", "30s")
        held_a = acquire(a, "a", "--ttl", "8s", "--wait", "20s")
        read = a.cli("-o", "json", "state", "get", DEP)
        b_alive = holding.poll() is None
    finally:
        _stop(holding)
    assert b_alive, "B's lock run ended early"
    assert held_a.returncode != 0, (
        f"two holders: B (lock run on c4,c5, token {_token_of_b(tmp_path, b)}, wrote release=2.0.0), A on "
        f"{_where(held_a)} token {json_doc(held_a)['fencing_token']}; the rerun exited {rerun.returncode}: "
        f"{rerun.stdout} {rerun.stderr}; A reads {read.stdout}"
    )
    assert rerun.returncode == 5, rerun.stdout + rerun.stderr


# -- 2. the intended case, from two machines at once: every lease deleted after the kill


def _lease_token(env: Env, index: int) -> int:
    from helpers.members import lease_on

    from coordinator.rules.lease import A_TOKEN

    lease = lease_on(env, index)
    assert lease is not None
    return int(lease["metadata"]["annotations"][A_TOKEN])


def _report_token(proc: subprocess.CompletedProcess[str]) -> int | None:
    import re

    found = re.search(r"took the lock \S+ \(token (\d+)\)", proc.stdout)
    return int(found.group(1)) if found else None


def test_two_machines_finishing_one_interrupted_change_after_every_lease_was_deleted(dep5: Env, tmp_path: Path) -> None:
    """HELD. pay on c1,c2,c3, c3 replaced by c4 (the set is noted on the state objects),
    release=1.2.0 written; `remove-cluster pay c4` killed after the joint step (its lock
    took token T); A' is a copy of that machine's config. Every lease is deleted; both
    machines re-run the change at once. At most one run takes the lock at a time, every
    token granted is above T and the tokens of the two runs differ, both records end at
    {c1,c2} epoch 5, the confirmed write survives, and a later lock's token is above all."""
    pay_short(dep5, "c1", "c2", "c3", max_ttl="10s")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4", "--ttl", "10s"))
    killed = dep5.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "5s", env=KILL_AFTER_JOINT)
    assert killed.returncode == -9, killed.stderr
    before = max(_lease_token(dep5, i) for i in (1, 2, 4))
    other = machine(dep5, tmp_path, "a2")
    for i in (1, 2, 3, 4):
        kubectl_on(dep5, i, "delete", "lease", LEASE, "--ignore-not-found")
    args = ("deployment", "remove-cluster", DEP, "c4", "--ttl", "8s", "--wait", "60s")
    runs = [m.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for m in (dep5, other)]
    done = []
    for p in runs:
        out, err = p.communicate(timeout=150)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    assert all(p.returncode in (0, 3, 5) for p in done), [(p.returncode, p.stderr) for p in done]
    assert any(p.returncode == 0 for p in done), [(p.returncode, p.stdout, p.stderr) for p in done]
    tokens = [t for p in done if (t := _report_token(p)) is not None]
    assert all(t > before for t in tokens), (before, tokens)
    assert len(set(tokens)) == len(tokens), tokens
    for m in (dep5, other):
        if _show(m)["change_in_progress"] is not None:  # the run that lost the race: again
            succeeded(m.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "8s", "--wait", "60s"))
        shown = _show(m)
        assert shown["clusters"] == ["c1", "c2"] and shown["change_in_progress"] is None, shown
    for i in (1, 2):
        assert stored_on(dep5, i) is not None and set(stored_on(dep5, i).members) == set(ids(dep5, "c1", "c2"))
    assert json_doc(succeeded(dep5.cli("-o", "json", "state", "get", DEP)))["release"] == "1.2.0"
    later = json_doc(succeeded(acquire(other, "z", "--ttl", "8s", "--wait", "30s")))
    assert later["fencing_token"] > max([before, *tokens]), (later["fencing_token"], before, tokens)


def test_a_rerun_killed_again_after_every_lease_was_deleted_is_finished_by_a_third_run(
    dep5: Env, tmp_path: Path
) -> None:
    """HELD. The intended case, interrupted twice: `remove-cluster pay c4` killed after the
    joint step, every lease deleted, the rerun killed after its joint step as well; a
    third run finishes the change, the confirmed write survives, and a lock taken
    afterwards gets a token above every earlier one (the killed runs' included)."""
    pay_short(dep5, "c1", "c2", "c3", max_ttl="10s")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4", "--ttl", "10s"))
    killed = dep5.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "5s", env=KILL_AFTER_JOINT)
    assert killed.returncode == -9, killed.stderr
    first = max(_lease_token(dep5, i) for i in (1, 2, 4))
    for i in (1, 2, 3, 4):
        kubectl_on(dep5, i, "delete", "lease", LEASE, "--ignore-not-found")
    again = dep5.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "8s", "--wait", "40s", env=KILL_AFTER_JOINT)
    assert again.returncode == -9, again.stderr
    second = max(_lease_token(dep5, i) for i in (1, 2))
    assert second > first, (first, second)
    third = succeeded(dep5.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "8s", "--wait", "40s"))
    token = _report_token(third)
    assert token is None or token > second, (first, second, token, third.stdout)
    shown = _show(dep5)
    assert shown["clusters"] == ["c1", "c2"] and shown["change_in_progress"] is None, shown
    assert json_doc(succeeded(dep5.cli("-o", "json", "state", "get", DEP)))["release"] == "1.2.0"
    later = json_doc(succeeded(acquire(dep5, "z", "--ttl", "8s", "--wait", "30s")))
    assert later["fencing_token"] > max(first, second, token or 0), (later, first, second, token)


def _until_lease_writes_refused(env: Env, index: int, *, refused: bool) -> None:
    """Wait until cluster ``index`` refuses (or no longer refuses) creating the
    deployment's lease with the "lease frozen" policy's message (a create of a lease that
    is there fails without it too)."""
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": LEASE, "namespace": env.namespace}}  # fmt: skip
    until_admission(env, index, ("-f", "-"), refused=refused, message="lease frozen", stdin=json.dumps(lease))


def test_a_rerun_after_every_lease_was_deleted_with_lease_writes_refused_on_a_member(dep5: Env, tmp_path: Path) -> None:
    """HELD. The intended case with a ValidatingAdmissionPolicy on c2 refusing every write
    of the deployment's lease during the rerun (c2 is needed by both groups' majorities,
    {c1,c2,c4} and {c1,c2}): the rerun does not finish (no majority of {c1,c2}) and
    leaves no holder behind; a state write with its lock id is refused; once the policy
    is gone the next run finishes, the confirmed write survives and tokens keep rising."""
    from faults.admission import add_policy, remove_policy

    pay_short(dep5, "c1", "c2", "c3", max_ttl="10s")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4", "--ttl", "10s"))
    killed = dep5.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "5s", env=KILL_AFTER_JOINT)
    assert killed.returncode == -9, killed.stderr
    first = max(_lease_token(dep5, i) for i in (1, 2, 4))
    for i in (1, 2, 3, 4):
        kubectl_on(dep5, i, "delete", "lease", LEASE, "--ignore-not-found")
    name = f"freeze-lease-{dep5.namespace}"
    expr = f"request.namespace != '{dep5.namespace}' || object.metadata.name != '{LEASE}'"
    add_policy(dep5.sandbox.admin(2), name, expr, "lease frozen", operations=("CREATE", "UPDATE"),
               api_group="coordination.k8s.io", resource="leases", exist_ok=False)  # fmt: skip
    try:
        _until_lease_writes_refused(dep5, 2, refused=True)  # a policy takes a moment to be in force
        refused = dep5.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "8s", "--wait", "30s")
        assert refused.returncode != 0, refused.stdout
        from helpers.members import lease_on

        for i in (1, 4):  # no holder left behind where the lease could be written
            lease = lease_on(dep5, i)
            assert lease is None or not (lease.get("spec") or {}).get("holderIdentity"), (i, lease)
        assert _show(dep5)["change_in_progress"] == {"to": ["c1", "c2"]}
    finally:
        remove_policy(dep5.sandbox.admin(2), name)
    _until_lease_writes_refused(dep5, 2, refused=False)
    done = succeeded(dep5.cli("deployment", "remove-cluster", DEP, "c4", "--ttl", "8s", "--wait", "40s"))
    token = _report_token(done)
    assert token is None or token > first, (first, token)
    shown = _show(dep5)
    assert shown["clusters"] == ["c1", "c2"] and shown["change_in_progress"] is None, shown
    assert json_doc(succeeded(dep5.cli("-o", "json", "state", "get", DEP)))["release"] == "1.2.0"
    later = json_doc(succeeded(acquire(dep5, "z", "--ttl", "8s", "--wait", "30s")))
    assert later["fencing_token"] > max(first, token or 0), (later, first, token)
