"""Adding, removing and replacing members through a joint configuration, on real API
servers (the 5-cluster sandbox): the stored member set moves epoch by epoch, the state
follows the members, an interrupted change finishes when run again, and a machine whose
record predates the change is refused until it imports the stored set."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import COMMIT_EVERYWHERE, UNHURRIED, Env
from helpers.members import (
    KILL_AFTER_JOINT,
    identities,
    pay,
    replica_data,
    second_machine,
    stored_set,
    succeeded,
)
from helpers.web import acquire

from coordinator.config.store import ConfigStore
from coordinator.rules.membership import A_MEMBERSHIP, Membership
from coordinator.rules.resources import configmaps_path, lease_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_add_then_remove_a_member(dep5: Env, tmp_path: Path) -> None:
    pay(dep5, "c1", "c2", "c3")
    stale = second_machine(dep5, tmp_path, "pay", ["c1", "c2", "c3"])
    assert succeeded(_acquire(stale)).returncode == 0  # the same record: fine before the change
    succeeded(stale.cli("lock", "release", "pay", "--holder", "x"))

    added = succeeded(dep5.cli("deployment", "add-cluster", "pay", "c4", env=COMMIT_EVERYWHERE))
    assert "epoch 3" in added.stdout
    for i in (1, 2, 3, 4):
        stored = stored_set(dep5, i)
        assert stored.epoch == 3 and set(stored.members) == identities(dep5, "c1", "c2", "c3", "c4")
        assert stored.joint is None
    assert replica_data(dep5, 4)["release"] == "1.2.0"  # the state was copied before c4 counted
    # c4's lock history exists (empty) from the change on, as `deployment create` makes it:
    # nobody may plant one there under the deployment's name.
    history = anyio.run(dep5.raw, 4, "GET", f"/api/v1/namespaces/{dep5.namespace}/configmaps/coordinator-history-pay")
    assert history["metadata"]["name"] == "coordinator-history-pay"
    show = json.loads(succeeded(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["epoch"] == 3 and show["clusters"] == ["c1", "c2", "c3", "c4"] and show["change_in_progress"] is None
    stored = show["stored_member_sets"]
    assert all(stored[f"c{i}"] == "epoch 3: c1, c2, c3, c4 (as recorded here)" for i in (1, 2, 3, 4)), stored

    refused = _acquire(stale)
    assert refused.returncode == 5, refused.stderr
    assert "deployment import pay" in refused.stderr
    succeeded(stale.cli("deployment", "delete", "pay"))
    succeeded(stale.cli("deployment", "import", "pay", "--cluster", "c2", "-n", dep5.namespace))
    succeeded(_acquire(stale))
    succeeded(stale.cli("lock", "release", "pay", "--holder", "x"))

    succeeded(dep5.cli("deployment", "remove-cluster", "pay", "c1"))
    for i in (1, 2, 3, 4):  # the commit is written on the removed member too
        stored = stored_set(dep5, i)
        assert stored.epoch == 5 and set(stored.members) == identities(dep5, "c2", "c3", "c4")
    # the state is still there for the remaining members, with c1 paused
    dep5.sandbox.pause(1)
    assert succeeded(dep5.cli("--timeout", "2s", "state", "get", "pay", "release")).stdout.strip() == "1.2.0"


def test_an_interrupted_change_is_finished_by_running_it_again(dep5: Env) -> None:
    pay(dep5, "c1", "c2", "c3")
    killed = dep5.cli("deployment", "add-cluster", "pay", "c4", "--ttl", "5s", env=KILL_AFTER_JOINT)
    assert killed.returncode == -9, killed.stderr
    show = json.loads(succeeded(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["change_in_progress"] == {"to": ["c1", "c2", "c3", "c4"]} and show["epoch"] == 2
    assert stored_set(dep5, 4).joint is not None  # the joint configuration is what the members store
    again = succeeded(dep5.cli("deployment", "add-cluster", "pay", "c4", "--wait", "30s"))
    assert "Finishing the change" in again.stdout
    for i in (1, 2, 3, 4):
        assert stored_set(dep5, i).epoch == 3
    assert replica_data(dep5, 4)["release"] == "1.2.0"


def test_an_interrupted_change_whose_leases_were_then_deleted_is_finished_by_running_it_again(
    dep5: Env,
) -> None:
    """A change killed after the joint configuration was stored, then every lease deleted:
    no member stores the joint set any more (tombstones say nothing, the state objects
    still carry the set from before the change). Running the change again must finish it:
    the members store the set before the change, which a change in progress accepts. (Once
    it found no trace of the change on the leases, the run checked the members against the
    joint set alone and refused for good, exit 5: a soak wedged on it.)"""
    succeeded(dep5.cli("deployment", "create", "pay", "-n", dep5.namespace, "--max-ttl", "15s",
                 *[a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]))  # fmt: skip
    succeeded(dep5.cli("deployment", "replace-cluster", "pay", "c3", "c4"))  # the set is noted on the state objects
    killed = dep5.cli("deployment", "remove-cluster", "pay", "c4", "--ttl", "5s", env=KILL_AFTER_JOINT)
    assert killed.returncode == -9, killed.stderr
    show = json.loads(succeeded(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["change_in_progress"] == {"to": ["c1", "c2"]}, show
    for i in (1, 2, 4):
        anyio.run(dep5.raw, i, "DELETE", lease_path(dep5.namespace, "coordinator-lock-pay"))
    again = dep5.cli("deployment", "remove-cluster", "pay", "c4", "--ttl", "10s", "--wait", "60s")
    assert again.returncode == 0, again.stderr + again.stdout
    show = json.loads(succeeded(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["clusters"] == ["c1", "c2"] and show["change_in_progress"] is None, show
    for i in (1, 2):
        assert set(stored_set(dep5, i).members) == identities(dep5, "c1", "c2")
    succeeded(dep5.cli("lock", "acquire", "pay", "--holder", "z", "--ttl", "10s", "--wait", "30s"))


def test_replace_a_rebuilt_member(dep5: Env) -> None:
    """c3 was rebuilt: it came back as a new cluster (new identity), connected as c5."""
    pay(dep5, "c1", "c2", "c3")
    succeeded(dep5.cli("deployment", "replace-cluster", "pay", "c3", "c5"))
    for i in (1, 2, 5):
        stored = stored_set(dep5, i)
        assert stored.epoch == 3 and set(stored.members) == identities(dep5, "c1", "c2", "c5")
    assert replica_data(dep5, 5)["release"] == "1.2.0"
    dep5.sandbox.pause(3)
    lock = json.loads(
        succeeded(dep5.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "pay", "--holder", "z")).stdout
    )
    assert {c["name"] for c in lock["clusters"]} == {"c1", "c2", "c5"}


def _acquire(env: Env) -> subprocess.CompletedProcess[str]:
    return env.cli("-o", "json", "--timeout", "3s", "lock", "acquire", "pay", "--holder", "x", "--ttl", "30s")


def test_members_change_while_contenders_hold_wait_and_write(dep5: Env) -> None:
    """Add c4 and then remove c1 while two contenders take turns with `--wait`, write the
    state inside their turns, and a reader reads it without the lock. The fault suite's
    checkers judge what they saw: no two turns overlap, tokens rise, and the reads and
    writes form a linearizable register."""
    from faults.checkers import check_linearizable_register, check_mutual_exclusion

    pay(dep5, "c1", "c2", "c3")
    succeeded(dep5.cli("state", "set", "pay", "k=w0", "--lock-id", _hold(dep5, "setup")))
    succeeded(dep5.cli("lock", "release", "pay", "--holder", "setup"))
    sections: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    problems: list[str] = []
    done = threading.Event()
    guard = threading.Lock()

    def contender(name: str) -> None:
        n = 0
        while not done.is_set():
            taken = dep5.cli("-o", "json", "lock", "acquire", "pay", "--holder", name, "--ttl", "60s", "--wait", "90s")
            if taken.returncode != 0:
                if taken.returncode not in (3, 4):
                    problems.append(f"{name}: acquire exit {taken.returncode}: {taken.stderr}")
                continue
            doc = json.loads(taken.stdout)
            enter = time.monotonic()
            for _ in range(2):
                n += 1
                value = f"{name}-{n}"
                invoke = time.monotonic()
                wrote = dep5.cli("state", "set", "pay", f"k={value}", "--lock-id", doc["lock_id"])
                status = "ok" if wrote.returncode == 0 else "unknown"
                with guard:
                    ops.append({"process": name, "kind": "write", "value": value, "invoke": invoke,
                                "complete": time.monotonic(), "status": status})  # fmt: skip
            leave = time.monotonic()
            with guard:
                sections.append({"process": name, "token": doc["fencing_token"], "enter": enter, "exit": leave})
            released = dep5.cli("lock", "release", "pay", "--holder", name, "--lock-id", doc["lock_id"])
            if released.returncode != 0:
                problems.append(f"{name}: release exit {released.returncode}: {released.stderr}")

    def reader() -> None:
        while not done.is_set():
            invoke = time.monotonic()
            got = dep5.cli("-o", "json", "state", "get", "pay", "k")
            if got.returncode == 0:
                with guard:
                    ops.append({"process": "reader", "kind": "read", "value": json.loads(got.stdout),
                                "invoke": invoke, "complete": time.monotonic()})  # fmt: skip

    threads = [threading.Thread(target=contender, args=(f"h{i}",)) for i in (1, 2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    try:
        time.sleep(5)
        # The changes take the lock themselves, so they wait their turn like the contenders.
        succeeded(dep5.cli("deployment", "add-cluster", "pay", "c4", "--wait", "120s"))
        time.sleep(5)
        succeeded(dep5.cli("deployment", "remove-cluster", "pay", "c1", "--wait", "120s"))
        time.sleep(5)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=300)
    assert not problems, problems
    assert len(sections) >= 4 and len({s["process"] for s in sections}) == 2, sections
    assert sum(1 for o in ops if o["kind"] == "read") >= 5 and sum(1 for o in ops if o["kind"] == "write") >= 8
    check_mutual_exclusion(sections).assert_ok()
    for i in (2, 3, 4):
        assert stored_set(dep5, i).epoch == 5 and set(stored_set(dep5, i).members) == identities(dep5, "c2", "c3", "c4")
    dep5.sandbox.pause(1)  # the removed member is not needed any more: the last read is without it
    invoke = time.monotonic()
    final = succeeded(dep5.cli("--timeout", "2s", "-o", "json", "state", "get", "pay", "k"))
    ops.append({"process": "reader", "kind": "read", "value": json.loads(final.stdout), "invoke": invoke,
                "complete": time.monotonic()})  # fmt: skip
    check_linearizable_register(ops, initial="w0", timeout=60).assert_ok()


def _hold(env: Env, holder: str) -> str:
    taken = succeeded(env.cli("-o", "json", "lock", "acquire", "pay", "--holder", holder, "--ttl", "30s"))
    return str(json.loads(taken.stdout)["lock_id"])


def test_remove_a_dead_member_with_force_dead(dep5: Env, tmp_path: Path) -> None:
    """c4 is gone for good (paused): --force-dead removes it with the lock taken on a
    majority of the remaining members under the configuration in force, says what that
    gives up, and the rest decide alone. A member that answers is not removed that way."""
    pay(dep5, "c1", "c2", "c3", "c4")
    stale = second_machine(dep5, tmp_path, "pay", ["c1", "c2", "c3", "c4"])
    dep5.sandbox.pause(4)
    alive = dep5.cli("--timeout", "2s", "deployment", "remove-cluster", "pay", "c3", "--force-dead")
    assert alive.returncode == 2 and "not dead" in alive.stderr, alive.stderr
    assert all(stored_set(dep5, i).epoch == 1 for i in (1, 2, 3))

    removed = succeeded(dep5.cli("--timeout", "2s", "deployment", "remove-cluster", "pay", "c4", "--force-dead"))
    assert "gives up" in removed.stdout, removed.stdout
    for i in (1, 2, 3):
        stored = stored_set(dep5, i)
        assert stored.epoch == 3 and set(stored.members) == identities(dep5, "c1", "c2", "c3")
    shown = json.loads(succeeded(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert shown["clusters"] == ["c1", "c2", "c3"] and shown["epoch"] == 3

    # From here the members are c1, c2 and c3, all up: no short timeout is needed to pass
    # the paused c4, and a loaded machine's slow answers must not look unreachable.
    lock = json.loads(
        succeeded(dep5.cli("-o", "json", "lock", "acquire", "pay", "--holder", "n", env=UNHURRIED)).stdout
    )
    assert {c["name"] for c in lock["clusters"]} == {"c1", "c2", "c3"}
    assert lock["fencing_token"] > 1
    succeeded(dep5.cli("state", "set", "pay", "release=2.0", "--lock-id", lock["lock_id"], env=UNHURRIED))
    succeeded(dep5.cli("lock", "release", "pay", "--holder", "n", env=UNHURRIED))

    # a machine whose record still names c4 is refused, and imports the remaining set
    refused = stale.cli("--timeout", "2s", "lock", "acquire", "pay", "--holder", "x")
    assert refused.returncode == 5 and "deployment import pay" in refused.stderr, refused.stderr
    succeeded(stale.cli("deployment", "delete", "pay"))
    succeeded(stale.cli("--timeout", "2s", "deployment", "import", "pay", "--cluster", "c1", "-n", dep5.namespace))
    assert ConfigStore(stale.config).load().deployments["pay"].clusters == ["c1", "c2", "c3"]
    assert succeeded(stale.cli("state", "get", "pay", "release", env=UNHURRIED)).stdout.strip() == "2.0"


def test_a_member_change_before_any_state_write_and_the_token_floor_follows(dep5: Env) -> None:
    """A deployment changed before anyone wrote its state: the change writes the empty
    state under its token (no error), and the new member's state object carries the
    token floor, so the new set remembers the tokens granted before the change even if
    every lease were deleted."""
    args = [a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]
    succeeded(dep5.cli("deployment", "create", "pay", "-n", dep5.namespace, *args))
    taken = json.loads(
        succeeded(dep5.cli("-o", "json", "lock", "acquire", "pay", "--holder", "w", "--ttl", "30s")).stdout
    )
    succeeded(dep5.cli("lock", "release", "pay", "--holder", "w"))
    replaced = succeeded(dep5.cli("deployment", "replace-cluster", "pay", "c3", "c4"))
    assert "the empty state (none written yet) written as version 1" in replaced.stdout, replaced.stdout
    path = f"{configmaps_path(dep5.namespace)}/coordinator-state-pay"
    floor = anyio.run(dep5.raw, 4, "GET", path)["metadata"]["annotations"]["coordinator.io/token-floor"]
    assert int(floor) > taken["fencing_token"]
    after = json.loads(
        succeeded(dep5.cli("-o", "json", "lock", "acquire", "pay", "--holder", "z", "--ttl", "30s")).stdout
    )
    assert after["fencing_token"] > int(floor) and {c["name"] for c in after["clusters"]} == {"c1", "c2", "c4"}


def test_every_lease_deleted_after_a_change_does_not_wedge_the_deployment(dep5: Env) -> None:
    """After a member change, the state objects of the new set carry that set too. With
    every lease deleted (and tombstones written by whoever found them missing), the new
    set is still confirmed by the state objects, so the lock can be taken again; were the
    set only on the leases, the deployment would refuse every command (exit 5) for good."""
    succeeded(dep5.cli("deployment", "create", "pay", "-n", dep5.namespace, "--max-ttl", "15s",
                 *[a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]))  # fmt: skip
    succeeded(dep5.cli("deployment", "replace-cluster", "pay", "c3", "c4"))
    for i in (1, 2, 4):
        anyio.run(dep5.raw, i, "DELETE", lease_path(dep5.namespace, "coordinator-lock-pay"))
    # The first attempt finds the leases missing and leaves tombstones: held by an
    # unknown holder until a maximum TTL has passed (exit 3), not "nothing stores the
    # member set" (exit 5), which nothing would ever end.
    first = dep5.cli("lock", "acquire", "pay", "--holder", "z")  # the TTL: the deployment's 15 s
    assert first.returncode == 3, first.stderr
    assert "deleted" in first.stderr and "member set" not in first.stderr
    succeeded(dep5.cli("lock", "acquire", "pay", "--holder", "z", "--ttl", "10s", "--wait", "40s"))
    succeeded(dep5.cli("lock", "release", "pay", "--holder", "z"))
    for i in (1, 2, 4):
        stored = stored_set(dep5, i)
        assert set(stored.members) == identities(dep5, "c1", "c2", "c4")


def _strip(env: Env, index: int, deployment: str = "pay") -> None:
    """Another client strips the managedFields of the deployment's lease on member ``index``."""
    from faults.kubectl import kubectl

    done = kubectl(env.kubeconfig, index, env.namespace, "patch", "lease", f"coordinator-lock-{deployment}",
                   "--type=merge", "-p", '{"metadata":{"managedFields":[{}]}}')  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_removed_member_whose_managed_fields_were_stripped_can_be_added_again(dep5: Env) -> None:
    """Found by the fault suite: c3 leaves the deployment, someone strips its lease's
    managedFields (`kubectl patch ... managedFields: [{}]`), and adding it back was
    refused as "not this deployment's": with its owner gone, the old set it stores looked
    planted. Its writer is unknown, not someone else: the lease still names its own uid,
    and the set it stores is an older one of this deployment."""

    pay(dep5, "c1", "c2", "c3")
    succeeded(dep5.cli("deployment", "remove-cluster", "pay", "c3"))
    _strip(dep5, 3)
    succeeded(dep5.cli("deployment", "add-cluster", "pay", "c3"))
    assert stored_set(dep5, 3).epoch == 5 and set(stored_set(dep5, 3).members) == identities(dep5, "c1", "c2", "c3")


@pytest.mark.parametrize("step", ["remove-cluster", "add-cluster"])
def test_an_interrupted_change_whose_managed_fields_were_stripped_is_finished(dep5: Env, step: str) -> None:
    """Found by the fault suite (a 5-minute run): a change stopped after the joint
    configuration was stored and the commit written on two members, then another client
    stripped the managedFields of the members' leases. The sets they store have no owner
    any more, neither coordinator nor anyone else; running the change again took the
    stripped commit for another configuration and refused for good (exit 5, "owned by no
    field manager"), and an added member's stripped joint set for a planted lease."""
    from faults.kubectl import kubectl

    first = ("c1", "c2", "c3", "c4") if step == "remove-cluster" else ("c1", "c2", "c3")
    member = "c4"
    # A short maximum TTL: the killed run's leases, stripped, carry no stamp of ours, so
    # they lapse only once watched unchanged for that long.
    succeeded(dep5.cli("deployment", "create", "pay", "-n", dep5.namespace, "--max-ttl", "10s",
                 *[a for m in first for a in ("--cluster", m)]))  # fmt: skip
    killed = dep5.cli("deployment", step, "pay", member, "--ttl", "5s", env=KILL_AFTER_JOINT)
    assert killed.returncode == -9, killed.stderr
    after = ("c1", "c2", "c3") if step == "remove-cluster" else ("c1", "c2", "c3", "c4")
    final = Membership.of(identities(dep5, *after), 3)
    for i in (1, 2, 3, 4):
        assert stored_set(dep5, i).joint is not None
        if i in (3, 4):  # as if the run had been killed while writing the commit
            noted = kubectl(dep5.kubeconfig, i, dep5.namespace, "annotate", "--overwrite", "lease",
                            "coordinator-lock-pay", f"{A_MEMBERSHIP}={final.dump()}",
                            "--field-manager=coordinator")  # fmt: skip
            assert noted.returncode == 0, noted.stderr
        _strip(dep5, i)
    again = dep5.cli("deployment", step, "pay", member, "--ttl", "8s", "--wait", "60s")
    assert again.returncode == 0, again.stderr + again.stdout
    show = json.loads(succeeded(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["clusters"] == list(after) and show["change_in_progress"] is None, show
    # Committed on majorities of both sets. (A member whose stripped lease the killed run
    # still held lapses only by observation, so the change may go on without it; the
    # next take of that lease writes the set there.)
    assert show["epoch"] == 3, show
    committed = [i for i in (1, 2, 3, 4) if stored_set(dep5, i) == final]
    assert len(committed) >= 3, (committed, again.stdout)
    succeeded(dep5.cli("lock", "acquire", "pay", "--holder", "z", "--ttl", "10s", "--wait", "30s"))


@pytest.mark.parametrize("planted", ["joint", "commit"])
def test_a_lease_planted_on_a_new_member_and_stripped_is_refused(dep5: Env, planted: str) -> None:
    """Found by a red-team pass on the fix above: another client creates the deployment's
    lease on the cluster about to be added, storing exactly the change's joint set (or
    its commit) and a huge token, and strips its managedFields. Its set names no writer,
    so only the lease's own uid tells it from one a stopped change made: it does not
    name its uid, so the change must refuse it (exit 5) and take no token from it."""
    from faults.kubectl import kubectl

    succeeded(dep5.cli("deployment", "create", "pay", "-n", dep5.namespace, "--max-ttl", "10s",
                 *[a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]))  # fmt: skip
    before = stored_set(dep5, 1)
    joined = identities(dep5, "c1", "c2", "c3", "c4")
    value = Membership.of(before.members, 2, joined) if planted == "joint" else Membership.of(joined, 3)
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "coordinator-lock-pay", "annotations": {
                 A_MEMBERSHIP: value.dump(), "coordinator.io/fencing-token": "999"}},
             "spec": {"holderIdentity": "evil", "leaseDurationSeconds": 3600}}  # fmt: skip
    made = kubectl(dep5.kubeconfig, 4, dep5.namespace, "apply", "--field-manager=evil", "-f", "-",
                   stdin=json.dumps(lease))  # fmt: skip
    assert made.returncode == 0, made.stderr
    _strip(dep5, 4)
    refused = dep5.cli("deployment", "add-cluster", "pay", "c4", "--ttl", "8s", "--wait", "20s")
    assert refused.returncode == 5, refused.stderr + refused.stdout
    assert "Cannot add c4" in refused.stderr and "Nothing was changed" in refused.stderr, refused.stderr
    show = json.loads(succeeded(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["clusters"] == ["c1", "c2", "c3"] and show["epoch"] == 1, show
    taken = json.loads(
        succeeded(dep5.cli("-o", "json", "lock", "acquire", "pay", "--holder", "z", "--ttl", "10s")).stdout
    )
    assert taken["fencing_token"] < 999, taken


def test_a_member_whose_set_a_server_side_apply_took_over_does_not_stop_a_change(dep5: Env) -> None:
    """Found by the 60-minute soak: a member's lease had its managedFields stripped, then
    another client's server-side apply handed every field to the server's
    `before-first-apply` manager, and another lock held it when a change came. The change
    wrote its joint set on the other members and then stopped (exit 5, "stores another
    member set") over a lease that is this deployment's by the record itself, leaving the
    members ahead of the record and every contender stuck. A current member is judged as
    an acquisition judges it; only a seeded cluster can be another deployment's."""
    from faults.kubectl import kubectl

    pay(dep5, "c1", "c2", "c3")
    lock_id = json.loads(
        succeeded(dep5.cli("-o", "json", "lock", "acquire", "pay", "--holder", "ops", "--ttl", "60s")).stdout
    )["lock_id"]
    _strip(dep5, 3)
    manifest = json.dumps(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "coordinator-lock-pay", "labels": {"example.com/applied": "yes"}},
            "spec": {"holderIdentity": "someone/0123456789abcdef"},
        }
    )
    done = kubectl(dep5.kubeconfig, 3, dep5.namespace, "apply", "--server-side", "--force-conflicts",
                   "--field-manager=other", "-f", "-", stdin=manifest)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lease = anyio.run(dep5.raw, 3, "GET", lease_path(dep5.namespace, "coordinator-lock-pay"))
    managers = {e.get("manager") for e in lease["metadata"].get("managedFields") or []}
    assert "before-first-apply" in managers, managers
    before = stored_set(dep5, 3)
    succeeded(dep5.cli("lock", "release", "pay", "--lock-id", lock_id))  # c3 is another lock's now
    succeeded(dep5.cli("deployment", "add-cluster", "pay", "c4"))
    for index in (1, 2, 4):
        stored = stored_set(dep5, index)
        assert stored.epoch > before.epoch and set(stored.members) == identities(dep5, "c1", "c2", "c3", "c4")
    cfg = ConfigStore(dep5.config).load()
    assert sorted(cfg.deployments["pay"].clusters) == ["c1", "c2", "c3", "c4"]


def test_a_member_change_works_before_the_first_state_write(dep3: Env) -> None:
    """`deployment create` now seeds empty state objects; a member change made before
    anyone wrote the state must still go through (and leave no joint set behind)."""
    removed = dep3.cli("deployment", "remove-cluster", "web", "c3")
    shown = dep3.cli("-o", "json", "deployment", "show", "web")
    locked = acquire(dep3, "alice")
    assert removed.returncode == 0, removed.stderr
    assert "the empty state (none written yet) written as version 1" in removed.stdout, removed.stdout
    assert json.loads(shown.stdout)["change_in_progress"] is None, shown.stdout
    assert json.loads(shown.stdout)["clusters"] == ["c1", "c2"], shown.stdout
    assert locked.returncode == 0, locked.stderr
