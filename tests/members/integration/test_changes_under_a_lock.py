"""Member changes made under a lock another process holds (`lock run`, the Python API's
lock block, another runner's lock id): the release afterwards never puts the old member
set back, so a machine whose record predates the change is refused.

Found in the third adversary round (docs/regressions.md). Everything runs on the real
5-cluster sandbox; "machines" are separate local configs (helpers.members)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from coord_fixtures import COMMIT_EVERYWHERE, COMMIT_TIMEOUT_S, Env
from helpers.members import (
    DEP,
    PY,
    acquire,
    json_doc,
    lease_on,
    machine,
    pay,
    record,
    stored_on,
    succeeded,
)

from coordinator.rules.lease import lock_id_of

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
    from coordinator.ops.reconfig import change_members

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


# Broke before the fix (outside attack on member changes, 2026-12-07): a change run with a
# lock id renewed the holder's leases, and wrote the joint and committed sets on them, with
# its own --ttl (default 60 s), not the holder's. `lock run pay3 --ttl 5m -- sh -c
# 'coordinator deployment add-cluster pay3 c4; sleep 90'`: the leases said 60 s while lock
# run counted five minutes and renewed every 100 s; a waiter took the lock (token 2) with
# the child still running: 22 s with two holders.


def test_a_change_under_a_lock_id_never_shortens_the_holders_leases(dep5: Env) -> None:
    """The holder counts its validity from its own TTL: every lease the change renews or
    rewrites keeps at least that TTL, whatever --ttl the change was given."""
    pay(dep5, "c1", "c2", "c3")
    lock = json_doc(succeeded(acquire(dep5, "ci", "--ttl", "120s")))
    succeeded(
        dep5.cli("deployment", "add-cluster", DEP, "c4", "--lock-id", lock["lock_id"], "--ttl", "5s",
                 env=COMMIT_EVERYWHERE)
    )  # fmt: skip
    durations = {}
    for i in (1, 2, 3, 4):
        lease = lease_on(dep5, i)
        assert lease is not None, i
        if lock_id_of(lease["spec"].get("holderIdentity")) == lock["lock_id"]:
            durations[i] = lease["spec"].get("leaseDurationSeconds")
    assert len(durations) >= 3, durations  # the old set's majority and the new set's carry the lock
    assert all(d is not None and d >= 120 for d in durations.values()), durations


# -- 2. the state copy to the new member


# Broke before the fix: reconfig.py:change_members ignores what StateClient.sync could not repair:
# release=1.3.0 confirmed on {c1,c3} (c2 paused), an admission policy refuses state data writes on
# c2 and c4, `replace-cluster pay c3 c4` still commits {c1,c2,c4}; with c1 down, `state get`
# returns 1.2.0


# Broke before the fix: a user granted only deployment `other` on c4 (rbac print) creates Lease
# coordinator-lock-pay (no member set, fencing-token 1000000) and ConfigMap coordinator-state-pay
# (an envelope of token 1000000) on c4; `deployment add-cluster pay c4` takes the lease for a
# legacy one, counts its token as lease evidence, and its state sync copies the planted data over
# pay's state on c1,c2,c3


# -- 3. the check, against edits of the stored set and deleted leases

# Broke before the fix: membership.py:in_lease_object takes a lease without the membership
# annotation for a UNSTATED one, which check() counts as agreeing (and a set equal to the local
# record counts whoever wrote it): after {c1,c2,c3} -> {c1,c4,c5} by two replaces, `kubectl
# annotate lease coordinator-lock-pay coordinator.io/membership-` on c2 and c3 (or re-annotating
# the old set), c1 down, lets the old record hold {c2,c3} while the new one holds {c4,c5}


# Broke before the fix: state.py:StateClient._refuse_other_members looks at leases only: after
# `replace-cluster pay c3 c4` and release=2.0 confirmed on {c1,c4}, deleting the leases on c2 and
# c3 and c1 being down lets a machine with the old record {c1,c2,c3} read release=1.2.0 (c2's
# state object stores the committed set; reads look at leases only)


# -- 4. interrupted changes, imports during them, and races between machines


# Broke before the fix: reconfig.py:change_members renews its lock with the engine of the old
# configuration (keep_renewed(engine, ...)), and each renewal writes the old member set (epoch 1)
# over the joint one on c1,c2,c3; `add-cluster pay c4 --ttl 3s` killed 2.5 s into the state copy
# leaves the joint set on c4 only, and a machine with the old record takes the lock (exit 0, not
# 5)
