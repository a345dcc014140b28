"""The fault schedule never wipes the member set's last records from a majority
(tests/faults/schedule.py, Faults._delete and _records_lost): the objects a deletion
would leave are read from each member first. Harness logic, so the members here are
stand-ins that answer GETs from a dict; the deletions themselves run on real API
servers in the quick fault run."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from faults.contenders import DEPLOYMENT
from faults.schedule import Faults

from coordinator.rules.lease import A_VANISHED
from coordinator.rules.membership import A_MEMBERSHIP, Membership
from coordinator.rules.resources import configmaps_path, lease_name, lease_path, state_name

NS = "torture-x"
SET = Membership(2, ("id1", "id2", "id3")).dump()
OLD_SET = Membership(1, ("id1", "id2", "id4")).dump()  # before a member change
OURS = [{"manager": "coordinator", "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{A_MEMBERSHIP}": {}}}}}]


def lease(*, vanished: bool = False, stored: str = SET) -> dict[str, Any]:
    ann = {A_VANISHED: "x"} if vanished else {A_MEMBERSHIP: stored}
    return {"metadata": {"annotations": ann, "managedFields": [] if vanished else OURS}}


def state() -> dict[str, Any]:
    return {"metadata": {"annotations": {A_MEMBERSHIP: SET}, "managedFields": OURS}}


class Member:
    def __init__(self, objects: dict[str, dict[str, Any] | None], deleted: list[tuple[int, str]], index: int):
        self.objects, self.deleted, self.index = objects, deleted, index

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def delete(self, path: str) -> None:
        self.deleted.append((self.index, path))


LEASE = lease_path(NS, lease_name(DEPLOYMENT))
STATE = f"{configmaps_path(NS)}/{state_name(DEPLOYMENT)}"


@pytest.fixture(autouse=True)
def local_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local config the changes are made with: c1..c3, epoch 2."""
    from coordinator.config.store import ConfigStore

    record = SimpleNamespace(clusters=["c1", "c2", "c3"], joint=None, epoch=2)
    config = SimpleNamespace(
        deployments={DEPLOYMENT: record}, clusters={f"c{i}": SimpleNamespace(identity=f"id{i}") for i in (1, 2, 3)}
    )
    monkeypatch.setattr(ConfigStore, "load", lambda self: config)


def faults(clusters: dict[int, dict[str, dict[str, Any] | None]]) -> tuple[Faults, list[tuple[int, str]], list[str]]:
    deleted: list[tuple[int, str]] = []
    said: list[str] = []
    f = Faults.__new__(Faults)
    sandbox = SimpleNamespace(admin=lambda i, timeout=5.0: Member(clusters[i], deleted, i))
    f.rig = SimpleNamespace(members=sorted(clusters), namespace=NS, sandbox=sandbox, config="unused")
    f.workers = SimpleNamespace(recorder=SimpleNamespace(holders_inside=lambda: [], trees_running=lambda: []))
    f.rng = random.Random(7)
    f.say = said.append
    f.count = Counter()
    f._held = lambda within: False  # type: ignore[method-assign]
    return f, deleted, said


def test_after_every_lease_was_deleted_a_state_object_is_deleted_on_one_member_only_while_two_keep_theirs() -> None:
    tomb = {LEASE: lease(vanished=True), STATE: state()}
    f, deleted, said = faults({1: dict(tomb), 2: dict(tomb), 3: dict(tomb)})
    f._delete("delete-state-one", room=1.0)
    assert len(deleted) == 1 and deleted[0][1] == STATE
    gone = deleted[0][0]
    f.rig.sandbox.admin(gone, 1).objects[STATE] = None  # what the deletion did
    # Two members left with their state objects: deleting one more would leave one record
    # of three, and the member without one has nothing to delete.
    f._delete("delete-state-one", room=1.0)
    assert len(deleted) == 1, deleted
    assert f.count["delete-state-one"] == 1
    assert any("skipped" in line for line in said), said
    # The leases (tombstones already) may go again: the two state objects keep the set.
    f._delete("delete-lease-all", room=1.0)
    assert len(deleted) == 4 and f.count["delete-lease-all"] == 1


def test_a_deletion_moves_to_a_member_where_a_majority_keeps_a_record() -> None:
    # c1 has lost its state object and holds a tombstone: deleting c2's namespace would
    # leave only c3; deleting c1's does not take anything that speaks.
    clusters = {
        1: {LEASE: lease(vanished=True), STATE: None},
        2: {LEASE: lease(vanished=True), STATE: state()},
        3: {LEASE: lease(vanished=True), STATE: state()},
    }
    f, _, _ = faults(clusters)
    assert f._records_lost(f._held_now(), "recreate-namespace", [2]) is not None
    assert f._records_lost(f._held_now(), "recreate-namespace", [1]) is None
    assert f._records_lost(f._held_now(), "delete-lease-all", [1, 2, 3]) is None  # the state objects keep the set
    assert f._records_lost(f._held_now(), "delete-state-one", [3]) is not None


def test_a_lease_whose_set_no_coordinator_wrote_is_no_record() -> None:
    stripped = lease()
    stripped["metadata"]["managedFields"] = []
    clusters = {i: {LEASE: dict(stripped), STATE: state()} for i in (1, 2, 3)}
    f, _, _ = faults(clusters)
    assert f._records_lost(f._held_now(), "delete-state-one", [1]) is None  # two state objects left
    clusters[2][STATE] = None
    assert f._records_lost(f._held_now(), "delete-state-one", [1]) is not None


def test_a_lease_storing_an_older_set_confirms_nothing_and_hides_its_state_object() -> None:
    # c3's lease still stores the set before the last change (nobody took it since): the
    # product counts c3 as behind, whatever its state object says, so only c1 and c2
    # confirm and neither may lose its records.
    clusters = {
        1: {LEASE: lease(), STATE: state()},
        2: {LEASE: lease(), STATE: state()},
        3: {LEASE: lease(stored=OLD_SET), STATE: state()},
    }
    f, _, _ = faults(clusters)
    assert f._records_lost(f._held_now(), "recreate-namespace", [1]) is not None
    assert f._records_lost(f._held_now(), "delete-lease-one", [1]) is None  # c1's state object speaks then
    assert f._records_lost(f._held_now(), "recreate-namespace", [3]) is None


def test_two_members_have_no_minority_and_the_episode_is_skipped_not_crashed() -> None:
    from faults.schedule import NoMinority

    f, _, _ = faults({1: {}, 2: {}})
    with pytest.raises(NoMinority):
        f._minority()
    f.rig.members = [1, 2, 3]
    assert len(f._minority()) == 1
