"""A change whose joint step reached a majority of the old set but not of the new one,
because a member of the new set was down and stores a configuration older than the one in
force when the change started (it was down for that one's commit too). Found by the
20-minute fault-suite soak: every rerun then stopped with exit 5, since the new set's
majority needed the very member that only the finishing run repairs.

On the real sandbox API servers (5-cluster sandbox); c2 is paused with SIGSTOP."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from coord_fixtures import Env
from faults.kubectl import kubectl
from helpers.members import (
    DEP,
    LEASE,
    STATE,
    dead_holders_lease_on,
    ids,
    json_doc,
    kubectl_on,
    patched_cli,
    pay_short,
    stored_on,
    succeeded,
)

from coordinator.rules.membership import A_MEMBERSHIP

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _change(env: Env, *args: str, timeout: str = "3") -> subprocess.CompletedProcess[str]:
    # a short timeout while c2 is paused, so that each run gives up on it quickly
    return env.cli("--timeout", timeout, "deployment", *args, "--ttl", "10s")


_C1_ANSWERS_LAST = """
import anyio
from coordinator.engine.lock.core import EngineCore
original = EngineCore.checked_read
async def checked_read(self, cluster, *a, **kw):
    if cluster == "c1" and self.finishing is not None:
        await anyio.sleep(1.5)  # c2 (behind) and c3 (agreeing) answer the acquisition first
    return await original(self, cluster, *a, **kw)
EngineCore.checked_read = checked_read
"""


def test_a_change_whose_new_set_missed_the_joint_step_is_finished_once_the_behind_member_is_back(
    dep5: Env, tmp_path: Path
) -> None:
    """The finishing run hears c1 last: c2 (behind) and c3 (agreeing) answer its
    acquisition 1.5 s before c1 does. c1 confirming the old set is what lets c2 stand in
    for the new set, so until c1 answers the members are not observed, not refused: the
    run waits for c1 and finishes. (It exited 5, "c2 store an older configuration; c1
    could not be read", when the member check was decided on the first majority.)"""
    env = dep5
    pay_short(env, "c1", "c2", "c3", max_ttl="10s")
    env.sandbox.pause(2)
    try:
        # c2 misses two changes: it keeps epoch 1 while {c1,c2,c3} reaches epoch 5
        succeeded(_change(env, "add-cluster", DEP, "c4"))
        succeeded(_change(env, "remove-cluster", DEP, "c4"))
        stored = stored_on(env, 1)
        assert stored is not None and stored.epoch == 5 and list(stored.members) == ids(env, "c1", "c2", "c3")
        # Removing c1 needs c2 for the new set {c2,c3}: the joint set lands on c1 and c3 only.
        stopped = _change(env, "remove-cluster", DEP, "c1")
        assert stopped.returncode == 4, stopped.stderr
    finally:
        env.sandbox.resume(2)
    behind = stored_on(env, 2)
    assert behind is not None and behind.epoch == 1, behind
    joint = stored_on(env, 3)
    assert joint is not None and joint.epoch == 6 and joint.joint is not None, joint

    # every member answers now: a busy machine must not turn a slow answer into "could not be read"
    finished = patched_cli(
        env, tmp_path, _C1_ANSWERS_LAST, "--timeout", "20", "deployment", "remove-cluster", DEP, "c1", "--ttl", "10s"
    )
    assert finished.returncode == 0, finished.stderr
    for index in (2, 3):
        now = stored_on(env, index)
        assert now is not None and now.epoch == 7 and list(now.members) == ids(env, "c2", "c3"), (index, now)
    shown = json_doc(succeeded(env.cli("-o", "json", "deployment", "show", DEP)))
    assert shown["epoch"] == 7 and shown.get("change_in_progress") is None, shown
    # the state written before any of it is what the new set reads, c2 included
    assert succeeded(env.cli("state", "get", DEP, "release")).stdout.strip() == "1.2.0"
    succeeded(env.cli("lock", "acquire", DEP, "--holder", "after", "--ttl", "10s"))


def test_a_change_waits_within_its_wait_for_a_dead_holders_lease_on_a_member_of_the_new_set(dep5: Env) -> None:
    """Found by the fault suite: `lock run` SIGKILLed, then `remove-cluster` at once. The
    change's take reached a majority of the old set while the killed holder's lease was
    still live on c1, a member the new set {c1,c2} needs; the joint step then stopped with
    exit 4 ("held-by-other (no longer ours)") although that lease lapses by itself. Within
    its --wait the change now waits for it, then takes it and finishes."""
    env = dep5
    pay_short(env, "c1", "c2", "c3", max_ttl="10s")
    dead_holders_lease_on(env, 1)  # c1 keeps the dead holder's live lease
    _c3_removed(env, env.cli("deployment", "remove-cluster", DEP, "c3", "--ttl", "10s", "--wait", "60s"))


def _c3_removed(env: Env, changed: subprocess.CompletedProcess[str]) -> None:
    """The removal of c3 finished: c1 and c2 store the new set, the state is kept."""
    assert changed.returncode == 0, changed.stderr
    for index in (1, 2):
        now = stored_on(env, index)
        assert now is not None and list(now.members) == ids(env, "c1", "c2") and now.joint is None, (index, now)
    assert succeeded(env.cli("state", "get", DEP, "release")).stdout.strip() == "1.2.0"


_HINT_SAYS_LAPSED = """
import coordinator.rules.lease as lease
def remaining_hint(view, *, max_ttl_s, max_server_skew_s=0.0):
    return -30.0  # every Date hint says the lease lapsed long ago: only server stamps can tell
lease.remaining_hint = remaining_hint
"""


def test_the_wait_before_the_joint_step_judges_a_dead_holders_lease_by_server_stamps(dep5: Env, tmp_path: Path) -> None:
    """As above, with every Date hint saying the dead holder's lease lapsed long ago, as
    an API server whose clock runs ahead says it (seen on HA members with one API server
    3 s ahead: "c2: held-by-other ... expires in 0.0s"). The wait before the joint step
    judged lapse by the hint, passed at once, and the joint step, which takes a lease only
    on a server stamp, stopped half-written with exit 4. The wait now judges by the
    joint step's own rule, waits for the lease to lapse, and the change finishes."""
    env = dep5
    pay_short(env, "c1", "c2", "c3", max_ttl="10s")
    dead_holders_lease_on(env, 1)  # c1 keeps the dead holder's live lease
    changed = patched_cli(
        env, tmp_path, _HINT_SAYS_LAPSED, "deployment", "remove-cluster", DEP, "c3", "--ttl", "10s", "--wait", "60s"
    )
    _c3_removed(env, changed)


def test_a_planted_commit_with_its_managed_fields_stripped_does_not_confirm_a_finishing_run(dep5: Env) -> None:
    """Found by an outside attack. `pay` over c1, c2, c3; c4 added; c5 added while c3 was
    down (c3 keeps epoch 3); removing c1 with c3 and c5 down stops at the joint step
    (epoch 6 on c1, c2, c4). Then another client deletes c3's lease and state object and
    creates on c3 a copy of c2's lease carrying the change's commit (epoch 7), its
    managedFields stripped; on c4 it removes the set annotation and deletes the state
    object. A stripped set is this change's step only on a lease coordinator made (one that
    names its own uid, docs/design.md): the copy names c2's, so it confirms nothing and the
    finishing run refuses (exit 5), as it does with c3 simply wiped. It counted the plant
    and committed the new set (exit 0)."""
    env = dep5
    pay_short(env, "c1", "c2", "c3", max_ttl="10s")
    succeeded(_change(env, "add-cluster", DEP, "c4"))
    env.sandbox.pause(3)
    try:
        succeeded(_change(env, "add-cluster", DEP, "c5"))
    finally:
        env.sandbox.resume(3)
    env.sandbox.pause(3)
    env.sandbox.pause(5)
    try:
        assert _change(env, "remove-cluster", DEP, "c1").returncode == 4
    finally:
        env.sandbox.resume(3)
        env.sandbox.resume(5)
    joint = stored_on(env, 2)
    assert joint is not None and joint.joint is not None, joint
    succeeded(kubectl_on(env, 3, "delete", "lease", LEASE))
    succeeded(kubectl_on(env, 3, "delete", "configmap", STATE))
    copy = json.loads(succeeded(kubectl_on(env, 2, "get", "lease", LEASE, "-o", "json")).stdout)
    meta = copy["metadata"]
    for key in ("uid", "resourceVersion", "managedFields", "creationTimestamp"):
        meta.pop(key, None)
    commit = {"epoch": joint.epoch + 1, "members": sorted(joint.joint)}
    meta["annotations"][A_MEMBERSHIP] = json.dumps(commit, separators=(",", ":"))
    copy["spec"] = {"holderIdentity": "", "leaseDurationSeconds": 60}
    succeeded(kubectl(env.kubeconfig, 3, env.namespace, "create", "-f", "-", stdin=json.dumps(copy)))
    strip = '{"metadata":{"managedFields":[{}]}}'
    succeeded(kubectl_on(env, 3, "patch", "lease", LEASE, "--type=merge", "-p", strip))
    succeeded(kubectl_on(env, 4, "annotate", "lease", LEASE, f"{A_MEMBERSHIP}-"))
    succeeded(kubectl_on(env, 4, "delete", "configmap", STATE))
    finishing = _change(env, "remove-cluster", DEP, "c1", timeout="10")
    assert finishing.returncode == 5, (finishing.returncode, finishing.stdout, finishing.stderr)
    shown = json_doc(succeeded(env.cli("-o", "json", "deployment", "show", DEP)))
    assert shown.get("change_in_progress") is not None, shown
