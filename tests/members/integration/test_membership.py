"""The member set lives in the clusters: machines whose records differ are refused.

On real API servers (the 5-cluster sandbox). Two machines are two config files with the
same clusters connected; one of them keeps a record that disagrees with what the
members store, as a laptop that missed a change (or made one alone) would.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from helpers.members import (
    second_machine,
)

from coordinator.config.store import ConfigStore
from coordinator.rules.membership import (
    A_MEMBERSHIP,
    UNSTATED,
    Membership,
    Verdict,
    check,
    explain_existing,
    foreign_set,
    in_lease_object,
)
from coordinator.rules.resources import lease_path

pytestmark = pytest.mark.integration


def _acquire(env: Env, deployment: str, holder: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return env.cli("-o", "json", "--timeout", "2s", "lock", "acquire", deployment, "--holder", holder, *extra)


def test_a_record_with_fewer_members_is_refused(dep5: Env, tmp_path: Path) -> None:
    made = dep5.cli(
        "deployment", "create", "pay", "-n", dep5.namespace, "--cluster", "c1", "--cluster", "c2", "--cluster", "c3"
    )
    assert made.returncode == 0, made.stderr
    lone = second_machine(dep5, tmp_path, "pay", ["c1"])
    refused = _acquire(lone, "pay", "x")
    assert refused.returncode == 5, refused.stderr
    assert "deployment import pay" in refused.stderr and "c1" in refused.stderr
    ok = _acquire(dep5, "pay", "y")
    assert ok.returncode == 0, ok.stderr
    # and creating it anew on that machine with the smaller set is refused as well
    again = lone.cli("deployment", "delete", "pay")
    assert again.returncode == 0, again.stderr
    create = lone.cli("deployment", "create", "pay", "-n", dep5.namespace, "--cluster", "c1")
    assert create.returncode == 6, create.stderr
    assert "already exists" in create.stderr and "deployment import pay" in create.stderr


def test_disjoint_majorities_cannot_both_hold(dep5: Env, tmp_path: Path) -> None:
    """{c1,c2,c3} stored; a machine that replaced c2,c3 by c4,c5 on its own is refused,
    whether or not it can reach the member they share."""
    made = dep5.cli(
        "deployment", "create", "pay", "-n", dep5.namespace, "--cluster", "c1", "--cluster", "c2", "--cluster", "c3"
    )
    assert made.returncode == 0, made.stderr
    first = _acquire(dep5, "pay", "y", "--ttl", "60s")
    assert first.returncode == 0, first.stderr
    rogue = second_machine(dep5, tmp_path, "pay", ["c1", "c4", "c5"])
    seen = _acquire(rogue, "pay", "x")
    assert seen.returncode == 5, seen.stderr
    dep5.sandbox.pause(1)
    unseen = _acquire(rogue, "pay", "x")
    assert unseen.returncode == 5, unseen.stderr  # c4 and c5 store nothing: not confirmed
    assert "confirm" in unseen.stderr
    for i in (4, 5):
        with pytest.raises(Exception):  # noqa: B017 - nothing was written there
            anyio.run(dep5.raw, i, "GET", lease_path(dep5.namespace, "coordinator-lock-pay"))


def test_every_lease_stores_the_member_set_by_identity(dep5: Env) -> None:
    lease: dict[str, Any] = anyio.run(dep5.raw, 2, "GET", lease_path(dep5.namespace, "coordinator-lock-web"))
    stored = Membership.parse(lease["metadata"]["annotations"][A_MEMBERSHIP])
    assert stored is not None and stored.epoch == 1 and len(stored.members) == 5
    cfg = ConfigStore(dep5.config).load()
    assert set(stored.members) == {cfg.clusters[f"c{i}"].identity for i in range(1, 6)}
    st = dep5.cli("-o", "json", "lock", "status", "web")
    assert st.returncode == 0 and json.loads(st.stdout)["quorum"] == 3


# -- the pure rule, case by case


def test_check_rules() -> None:
    local = Membership.of(["a", "b", "c"])
    members = ["A", "B", "C"]
    assert check(local, {"A": local, "B": local}, members).verdict is Verdict.OK
    # a lease that states no set, or a deleted one, stores nothing and confirms nothing:
    # C, unseen, could still confirm
    assert check(local, {"A": local, "B": UNSTATED}, members).verdict is Verdict.UNOBSERVABLE
    assert check(local, {"A": local}, members).verdict is Verdict.UNOBSERVABLE
    assert check(local, {"A": local, "B": None, "C": None}, members).verdict is Verdict.UNCONFIRMED
    assert check(local, {"A": None, "B": None}, members).verdict is Verdict.UNCONFIRMED
    assert check(local, {"A": None, "B": None, "C": None}, members).verdict is Verdict.UNCONFIRMED
    assert check(local, {}, members).verdict is Verdict.UNOBSERVABLE
    other = Membership.of(["a", "d", "e"])
    assert check(local, {"A": other, "B": local, "C": local}, members).verdict is Verdict.CONFLICT
    newer = Membership.of(["a", "b", "c", "d"], epoch=2)
    result = check(local, {"A": newer, "B": local, "C": local}, members)
    assert result.verdict is Verdict.CONFLICT and "epoch 2" in result.explain("pay")
    older = Membership.of(["a", "b"], epoch=1)
    later_local = Membership.of(["a", "b", "c"], epoch=2)
    assert check(later_local, {"A": older, "B": later_local, "C": later_local}, members).verdict is Verdict.OK
    assert Membership.parse("nonsense") is None and Membership.parse('{"epoch": 0, "members": ["a"]}') is None
    assert Membership.parse(local.dump()) == local


def _lease_with(stored: Membership, *owners: str) -> dict[str, Any]:
    """A lease object as the API server returns it: the annotation owned by ``owners``."""
    owning: dict[str, Any] = {"f:metadata": {"f:annotations": {".": {}, "f:" + A_MEMBERSHIP: {}}}}
    entries = [{"manager": m, "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": owning} for m in owners]
    entries.append({"manager": "coordinator", "operation": "Update", "fieldsV1": {"f:spec": {"f:holderIdentity": {}}}})
    return {"metadata": {"annotations": {A_MEMBERSHIP: stored.dump()}, "managedFields": entries}}


def test_a_stored_set_counts_only_when_coordinator_wrote_it() -> None:
    value = Membership.of(["a"], epoch=5)
    planted = in_lease_object(_lease_with(value, "kubectl-annotate"))
    assert isinstance(planted, Membership) and planted == value  # who wrote it is not part of the value
    assert not planted.written_by_us and "kubectl-annotate" in planted.writer_text()
    stripped = in_lease_object(_lease_with(value))  # no entry owns the annotation
    assert isinstance(stripped, Membership) and not stripped.written_by_us
    for manager in ("coordinator", "coordinator-release"):
        ours = in_lease_object(_lease_with(value, manager))
        assert isinstance(ours, Membership) and ours.written_by_us, manager
    assert Membership.parse(value.dump()).written_by_us  # type: ignore[union-attr]  # not read from a lease

    # `deployment create` finding a set no coordinator wrote: no import advice
    local = Membership.of(["a", "b", "c"])
    found = check(local, {"A": planted, "B": None, "C": None}, ["A", "B", "C"])
    assert found.verdict is Verdict.CONFLICT
    text = explain_existing(found, "ledger", "ns", {"a": "A", "b": "B", "c": "C"})
    assert "planted" in text and "kubectl-annotate" in text and "deployment import" not in text
    # written by coordinator and stored by a majority of its own members: import is the advice
    theirs = in_lease_object(_lease_with(Membership.of(["a"], epoch=5), "coordinator"))
    found = check(local, {"A": theirs, "B": None, "C": None}, ["A", "B", "C"])
    assert "deployment import ledger --cluster A" in explain_existing(found, "ledger", "ns", {"a": "A"})


def test_a_new_member_storing_another_set_is_not_taken_over() -> None:
    joint = Membership.of(["a", "b", "c"], epoch=2, joint=["a", "b", "c", "d"])
    by_us = "coordinator"
    other_deployment = in_lease_object(_lease_with(Membership.of(["d", "e"], epoch=1), by_us))
    assert foreign_set(other_deployment, joint)
    newer = in_lease_object(_lease_with(Membership.of(["a", "d"], epoch=4), by_us))
    assert foreign_set(newer, joint)
    planted = in_lease_object(_lease_with(Membership.of(["a", "b"], epoch=1), "planter"))
    assert foreign_set(planted, joint)
    # an older set of this deployment (d was a member before) may be replaced
    ours_before = in_lease_object(_lease_with(Membership.of(["a", "b"], epoch=1), by_us))
    assert not foreign_set(ours_before, joint)
    # the same with its managedFields stripped: its writer is unknown, it still may be
    # (a planted set names its planter; a stripped newer or disjoint set is still foreign)
    stripped = in_lease_object(_lease_with(Membership.of(["a", "b"], epoch=1)))
    assert isinstance(stripped, Membership) and stripped.unowned and not foreign_set(stripped, joint)
    assert foreign_set(in_lease_object(_lease_with(Membership.of(["a", "d"], epoch=4))), joint)
    assert foreign_set(in_lease_object(_lease_with(Membership.of(["x", "y"], epoch=1))), joint)
    assert not foreign_set(joint, joint) and not foreign_set(None, joint) and not foreign_set(UNSTATED, joint)


def test_state_commands_check_the_member_set_too(dep5: Env, tmp_path: Path) -> None:
    made = dep5.cli(
        "deployment", "create", "pay", "-n", dep5.namespace, "--cluster", "c1", "--cluster", "c2", "--cluster", "c3"
    )
    assert made.returncode == 0, made.stderr
    lock = json.loads(_acquire(dep5, "pay", "y", "--ttl", "60s").stdout)
    wrote = dep5.cli("state", "set", "pay", "release=1.2.0", "--lock-id", lock["lock_id"])
    assert wrote.returncode == 0, wrote.stderr
    lone = second_machine(dep5, tmp_path, "pay", ["c1"])
    read = lone.cli("state", "get", "pay")
    assert read.returncode == 5, read.stderr
    forged = lone.cli("state", "set", "pay", "release=0.0.1", "--lock-id", lock["lock_id"])
    assert forged.returncode == 5, forged.stderr
    assert dep5.cli("state", "get", "pay", "release").stdout.strip() == "1.2.0"


def test_a_state_object_speaks_for_the_member_set_only_through_an_annotation_coordinator_wrote() -> None:
    """The envelope keeps the set of its last write, which a removed member keeps for ever;
    the annotation, the set of the last acquisition or member change. Only an annotation
    a coordinator wrote counts, and the envelope's set never does (with the annotation
    removed it spoke for the old set: round 6 of the adversary tests)."""
    from coordinator.engine.lock.floor import envelope_evidence
    from coordinator.engine.register import genesis_text

    old = Membership.of(["a", "b", "c"], epoch=1)
    new = Membership.of(["a", "b", "d"], epoch=3)

    def state(owner: str | None, noted: Membership | None = new) -> dict[str, Any]:
        obj = _lease_with(noted, owner) if owner and noted else {"metadata": {"annotations": {}}}
        if noted is not None and not owner:
            obj = _lease_with(noted)  # an annotation no field manager owns
        obj["data"] = {"envelope.json": genesis_text("pay", old.document())}
        return obj

    assert envelope_evidence(state("coordinator"), secret=False) == (0, new)
    for planted in (state("kubectl-annotate"), state(None), state(None, None)):
        assert envelope_evidence(planted, secret=False) == (0, None)
    # an annotation older than the envelope is still what the object says (an acquisition
    # counts it only at its own epoch or newer)
    older = state("coordinator", Membership.of(["a"], epoch=1))
    older["data"] = {"envelope.json": genesis_text("pay", new.document())}
    assert envelope_evidence(older, secret=False) == (0, Membership.of(["a"], epoch=1))
