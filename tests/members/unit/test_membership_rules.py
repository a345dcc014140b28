"""The member-set rules (coordinator/rules/membership.py): the stored set's text, who wrote it
(per managedFields), and how what the members store is checked against a machine's record.

No cluster: leases are the dicts an API server returns. The same checks run against real
API servers in tests/members/integration/test_membership.py and the adversary rounds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.rules.lease import A_VANISHED, LeaseView
from coordinator.rules.membership import (
    A_MEMBERSHIP,
    UNSTATED,
    Check,
    Membership,
    Stored,
    Verdict,
    annotation_writers,
    behind_stand_in,
    check,
    conflicts_only,
    explain_existing,
    foreign_set,
    in_lease_object,
    is_ours,
    says_nothing,
    stored_in_lease,
)

IDS = {"uid-a": "eu-1", "uid-b": "eu-2", "uid-c": "us-1", "uid-d": "us-2", "uid-e": "ap-1"}
LOCAL = Membership.of(["uid-a", "uid-b", "uid-c"], epoch=2)
MEMBERS = ["eu-1", "eu-2", "us-1"]


def lease_obj(raw: str | None, *managers: str, annotation: str = A_MEMBERSHIP) -> dict[str, Any]:
    """A lease storing ``raw`` in the membership annotation, owned by ``managers``."""
    fields = [
        {
            "manager": m,
            "operation": "Update",
            "time": "2026-12-01T12:00:00Z",
            "fieldsV1": {"f:metadata": {"f:annotations": {"f:" + annotation: {}}}},
        }
        for m in managers
    ]
    fields.append(
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}}}},
        }
    )
    anns = {annotation: raw} if raw is not None else {}
    return {"metadata": {"uid": "u", "annotations": anns, "managedFields": fields}, "spec": {"holderIdentity": "a/b"}}


def by(membership: Membership, *writers: str) -> Membership:
    """``membership`` as read from a lease whose annotation ``writers`` own."""
    stored = in_lease_object(lease_obj(membership.dump(), *writers))
    assert isinstance(stored, Membership)
    return stored


# ------------------------------------------------------------------ the value and its text


def test_of_sorts_and_deduplicates() -> None:
    m = Membership.of(["c", "a", "b", "a"], epoch=3, joint=["d", "a", "d"])
    assert m.members == ("a", "b", "c") and m.joint == ("a", "d") and m.epoch == 3
    assert Membership.of(["b", "a"]) == Membership.of(["a", "b"], 1)
    assert Membership.of(["a"]).joint is None


@pytest.mark.parametrize(("n", "q"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_quorum_is_a_majority_of_the_current_members(n: int, q: int) -> None:
    members = [f"m{i}" for i in range(n)]
    assert Membership.of(members).quorum == q
    assert Membership.of(members, joint=[*members, "x", "y", "z"]).quorum == q  # the new set aside


identities = st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6)


@given(identities, st.integers(1, 10**6), st.none() | identities)
def test_document_and_dump_round_trip(members: list[str], epoch: int, joint: list[str] | None) -> None:
    m = Membership.of(members, epoch, joint)
    assert Membership.parse(m.dump()) == m
    assert Membership.parse(m.document()) == m
    assert json.loads(m.dump()) == m.document()
    assert ("joint" in m.document()) is (joint is not None)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        5,
        "",
        "{",
        "[]",
        "null",
        '"text"',
        "[" * 5000,
        '{"members": ["a"]}',  # no epoch
        '{"epoch": 0, "members": ["a"]}',
        '{"epoch": -1, "members": ["a"]}',
        '{"epoch": "1", "members": ["a"]}',
        '{"epoch": 1.5, "members": ["a"]}',
        '{"epoch": true, "members": ["a"]}',  # a bool is an int to Python, but no epoch
        '{"epoch": 1, "members": []}',
        '{"epoch": 1, "members": "a"}',
        '{"epoch": 1, "members": ["a", ""]}',
        '{"epoch": 1, "members": ["a", 2]}',
        '{"epoch": 1, "members": ["a"], "joint": []}',
        '{"epoch": 1, "members": ["a"], "joint": "b"}',
        '{"epoch": 1, "members": ["a"], "joint": [null]}',
        ["not", "a", "mapping"],
    ],
)
def test_parse_refuses_anything_but_a_member_set(raw: Any) -> None:
    assert Membership.parse(raw) is None


def test_equal_sets_are_equal_whoever_wrote_them() -> None:
    assert by(LOCAL, "kubectl") == by(LOCAL, "coordinator") == LOCAL


# ------------------------------------------------------------------ who wrote it


@pytest.mark.parametrize("manager", ["coordinator", "coordinator-release", "coordinator-line", "coordinator-x"])
def test_is_ours_for_coordinators_field_managers(manager: str) -> None:
    assert is_ours(manager)


@pytest.mark.parametrize("manager", ["", "kubectl", "coordinatorx", "Coordinator", "my-coordinator", "coordinator_x"])
def test_is_ours_not_for_anyone_else(manager: str) -> None:
    assert not is_ours(manager)


def test_annotation_writers_are_the_managers_owning_that_annotation_once_each() -> None:
    obj = lease_obj("x", "coordinator", "kubectl-annotate", "coordinator")
    assert annotation_writers(obj) == ("coordinator", "kubectl-annotate")
    assert annotation_writers(obj, "coordinator.io/other") == ()
    other = lease_obj("x", "kubectl", annotation="coordinator.io/max-ttl")
    assert annotation_writers(other, "coordinator.io/max-ttl") == ("kubectl",)
    assert annotation_writers(other) == ()


def test_annotation_writers_skip_what_is_no_entry() -> None:
    obj: dict[str, Any] = {
        "metadata": {
            "managedFields": [
                "junk",
                None,
                {"manager": "m1", "fieldsV1": None},
                {"manager": "m2", "fieldsV1": {"f:metadata": "junk"}},
                {"manager": "m3", "fieldsV1": {"f:metadata": {"f:annotations": ["f:" + A_MEMBERSHIP]}}},
                {"fieldsV1": {"f:metadata": {"f:annotations": {"f:" + A_MEMBERSHIP: {}}}}},  # no manager named
            ]
        }
    }
    assert annotation_writers(obj) == ("",)
    assert annotation_writers({}) == ()
    assert annotation_writers({"metadata": {"managedFields": None}}) == ()


def test_written_by_us_unowned_and_writer_text() -> None:
    ours = by(LOCAL, "coordinator")
    assert ours.written_by_us and not ours.unowned
    assert ours.writer_text() == "field manager coordinator"
    planted = by(LOCAL, "kubectl-annotate")
    assert not planted.written_by_us and not planted.unowned
    both = by(LOCAL, "kubectl", "coordinator-release")
    assert both.written_by_us and both.writer_text() == "field manager kubectl, coordinator-release"
    stripped = in_lease_object({"metadata": {"annotations": {A_MEMBERSHIP: LOCAL.dump()}}})
    assert isinstance(stripped, Membership)
    assert stripped.unowned and not stripped.written_by_us
    assert stripped.writer_text().startswith("no known writer: the record of who wrote it is gone")
    # parsed from text or from a state envelope: who wrote it is not known, and it is believed
    assert LOCAL.writers is None and LOCAL.written_by_us and not LOCAL.unowned
    # the first server-side apply to a stripped lease gives what it found to this manager:
    # still no writer known, neither ours nor another client's
    applied = by(LOCAL, "before-first-apply")
    assert applied.unowned and not applied.written_by_us
    assert not by(LOCAL, "before-first-apply", "kubectl").unowned
    # the entry the server merges the oldest Update entries into past ten managers names
    # nobody either, however many clients it merged
    merged = by(LOCAL, "ancient-changes")
    assert merged.unowned and not merged.written_by_us
    assert "ancient-changes" not in merged.writer_text().split(":")[0]


def test_writer_text_escapes_a_managers_control_characters() -> None:
    evil = by(LOCAL, "kubectl\x1b[2J\nforged line")
    assert "\x1b" not in evil.writer_text() and "\n" not in evil.writer_text()
    assert "\\x1b" in evil.writer_text()


# ------------------------------------------------------------------ what a lease stores


def test_in_lease_object_legacy_unreadable_and_read() -> None:
    assert in_lease_object(lease_obj(None)) is UNSTATED
    assert in_lease_object({}) is UNSTATED
    assert in_lease_object(lease_obj("{garbage", "coordinator")) is None
    stored = in_lease_object(lease_obj(LOCAL.dump(), "coordinator"))
    assert stored == LOCAL and isinstance(stored, Membership) and stored.writers == ("coordinator",)


def test_stored_in_lease_ignores_missing_leases_and_tombstones() -> None:
    assert stored_in_lease(None) is None
    assert stored_in_lease(LeaseView.parse(None)) is None
    stone = lease_obj(LOCAL.dump(), "coordinator")
    stone["metadata"]["annotations"][A_VANISHED] = "2026-12-01T12:00:00Z"
    stone["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:annotations"]["f:" + A_VANISHED] = {}
    assert stored_in_lease(LeaseView.parse(stone)) is None
    assert stored_in_lease(LeaseView.parse(lease_obj(LOCAL.dump(), "coordinator"))) == LOCAL
    assert stored_in_lease(LeaseView.parse(lease_obj(None))) is UNSTATED


def test_says_nothing() -> None:
    assert says_nothing(None, LOCAL)
    assert says_nothing(UNSTATED, LOCAL)
    assert says_nothing(by(LOCAL, "kubectl"), LOCAL)  # our set, but not our write
    assert says_nothing(in_lease_object({"metadata": {"annotations": {A_MEMBERSHIP: LOCAL.dump()}}}), LOCAL)
    assert not says_nothing(by(LOCAL, "coordinator"), LOCAL)
    assert not says_nothing(LOCAL, LOCAL)
    other = Membership.of(["uid-a", "uid-d"], epoch=2)
    assert not says_nothing(by(other, "kubectl"), LOCAL)  # a different set is no silence
    assert not says_nothing(other, LOCAL)


def test_foreign_set() -> None:
    assert not foreign_set(None, LOCAL) and not foreign_set(UNSTATED, LOCAL)
    assert not foreign_set(LOCAL, LOCAL)
    older = Membership.of(["uid-a", "uid-b"], epoch=1)  # ours before, shares members
    assert not foreign_set(older, LOCAL)
    assert not foreign_set(by(older, "coordinator"), LOCAL)
    stripped = in_lease_object({"metadata": {"annotations": {A_MEMBERSHIP: older.dump()}}})
    assert not foreign_set(stripped, LOCAL)  # writer unknown: an older set of ours still
    assert foreign_set(by(older, "kubectl"), LOCAL)  # written by someone else
    assert foreign_set(Membership.of(["uid-a", "uid-b"], epoch=2), LOCAL)  # our epoch, another set
    assert foreign_set(Membership.of(["uid-a", "uid-b"], epoch=7), LOCAL)  # newer
    assert foreign_set(Membership.of(["uid-x", "uid-y"], epoch=1), LOCAL)  # shares no member


# ------------------------------------------------------------------ the check


def run(
    stored: dict[str, Stored],
    local: Membership = LOCAL,
    members: list[str] = MEMBERS,
    groups: list[list[str]] | None = None,
) -> Check:
    return check(local, stored, members, groups)


def test_a_majority_storing_our_set_is_ok() -> None:
    result = run({"eu-1": LOCAL, "eu-2": by(LOCAL, "coordinator")})
    assert result.verdict is Verdict.OK and result.ok and result.agreeing == ["eu-1", "eu-2"]
    assert result.unseen == ["us-1"]
    assert not conflicts_only(result)


def test_members_that_store_nothing_never_count_toward_the_majority() -> None:
    # eu-2 and us-1 may be members removed since and wiped; eu-1 a leftover that still
    # stores the old set: a stale record must not be confirmed by it.
    result = run({"eu-1": LOCAL, "eu-2": None, "us-1": UNSTATED})
    assert result.silent == ["eu-2", "us-1"] and result.verdict is Verdict.UNCONFIRMED and not result.ok
    assert run({"eu-1": LOCAL, "eu-2": LOCAL, "us-1": None}).ok
    nobody = run({"eu-1": None, "eu-2": UNSTATED, "us-1": by(LOCAL, "kubectl")})
    assert nobody.verdict is Verdict.UNCONFIRMED and not nobody.ok and nobody.agreeing == []


def test_a_set_planted_by_another_client_is_silent_not_agreeing() -> None:
    result = run({"eu-1": by(LOCAL, "kubectl"), "eu-2": by(LOCAL, "kubectl")})
    assert result.agreeing == [] and result.silent == ["eu-1", "eu-2"]
    assert not result.ok


def test_another_set_at_our_epoch_or_newer_is_a_conflict() -> None:
    newer = Membership.of(["uid-a", "uid-b", "uid-d"], epoch=3)
    result = run({"eu-1": LOCAL, "eu-2": LOCAL, "us-1": newer})
    assert result.verdict is Verdict.CONFLICT and result.conflicting == {"us-1": newer}
    assert conflicts_only(result)
    same_epoch = Membership.of(["uid-a", "uid-d"], epoch=2)
    assert run({"eu-1": LOCAL, "eu-2": LOCAL, "us-1": same_epoch}).verdict is Verdict.CONFLICT


def test_an_older_set_is_behind() -> None:
    older = Membership.of(["uid-a", "uid-b"], epoch=1)
    result = run({"eu-1": LOCAL, "eu-2": older, "us-1": older})
    assert result.behind == ["eu-2", "us-1"] and result.verdict is Verdict.UNCONFIRMED
    assert not conflicts_only(result)


def test_too_few_answers_are_unobservable_not_unconfirmed() -> None:
    assert run({"eu-1": LOCAL}).verdict is Verdict.UNOBSERVABLE
    assert run({}).verdict is Verdict.UNOBSERVABLE
    assert run({}).unseen == MEMBERS


def test_answers_of_non_members_are_ignored() -> None:
    result = run({"eu-1": LOCAL, "elsewhere": LOCAL, "also": LOCAL})
    assert result.verdict is Verdict.UNOBSERVABLE and result.agreeing == ["eu-1"]


def test_a_joint_configuration_needs_a_majority_of_each_group() -> None:
    joint = Membership.of(["uid-a", "uid-b", "uid-c"], epoch=2, joint=["uid-c", "uid-d", "uid-e"])
    members = ["eu-1", "eu-2", "us-1", "us-2", "ap-1"]
    groups = [["eu-1", "eu-2", "us-1"], ["us-1", "us-2", "ap-1"]]
    old_only = run({"eu-1": joint, "eu-2": joint, "us-2": None, "ap-1": None}, joint, members, groups)
    assert old_only.verdict is Verdict.UNCONFIRMED  # the new group has no one who stores the set
    both = run({"eu-1": joint, "eu-2": joint, "us-2": joint, "ap-1": joint}, joint, members, groups)
    assert both.ok
    result = run({"eu-1": joint, "eu-2": joint, "us-1": None}, joint, members, groups)
    assert result.verdict is Verdict.UNOBSERVABLE  # the new group has one of three
    answered = run(
        {
            "eu-1": joint,
            "eu-2": joint,
            "us-1": None,
            "us-2": Membership.of(["uid-c"], 1),
            "ap-1": Membership.of(["uid-c"], 1),
        },
        joint,
        members,
        groups,
    )
    assert answered.verdict is Verdict.UNCONFIRMED


verdicts = st.sampled_from(["agree", "silent", "planted", "behind", "unseen", "conflict"])


@given(st.lists(verdicts, min_size=1, max_size=7))
def test_check_never_confirms_without_a_majority_or_past_a_conflict(kinds: list[str]) -> None:
    members = [f"m{i}" for i in range(len(kinds))]
    local = Membership.of([f"uid-{m}" for m in members], epoch=5)
    value: dict[str, Stored] = {
        "agree": local,
        "silent": None,
        "planted": by(local, "kubectl"),
        "behind": Membership.of(["uid-x"], 4),
        "conflict": Membership.of(["uid-x"], 5),
    }
    stored = {m: value[k] for m, k in zip(members, kinds, strict=True) if k != "unseen"}
    result = check(local, stored, members)
    q = len(members) // 2 + 1
    if "conflict" in kinds:
        assert result.verdict is Verdict.CONFLICT
    if result.ok:
        assert len(result.agreeing) >= q
    if kinds.count("agree") >= q and "conflict" not in kinds:
        assert result.ok
    # one more answer that agrees never takes a confirmation away
    if result.ok and "unseen" in kinds:
        more = dict(stored, **{members[kinds.index("unseen")]: local})
        assert check(local, more, members).ok


# ------------------------------------------------------------------ what a person reads


def test_explain_a_conflict_names_where_what_differs_and_how_to_adopt() -> None:
    newer = Membership.of(["uid-a", "uid-b", "uid-d"], epoch=3)
    text = run({"eu-1": newer, "eu-2": newer, "us-1": LOCAL}).explain("web", IDS)
    assert "stored on eu-1, eu-2 differs" in text
    assert "members it has and this machine's record lacks: us-2" in text
    assert "members this machine's record has and it lacks: us-1" in text
    assert "configuration epoch 3 there, 2 here" in text
    assert "coordinator deployment import web --cluster eu-1" in text
    assert "\n" not in text


def test_explain_a_planted_conflict_says_no_coordinator_wrote_it() -> None:
    planted = by(Membership.of(["uid-a", "evil\x1b[2J"], epoch=9), "kubectl")
    text = run({"eu-1": planted, "eu-2": LOCAL}).explain("web", IDS)
    assert "No coordinator wrote that set" in text and "field manager kubectl" in text
    assert "deployment import" not in text
    assert "\x1b" not in text and "identity evil\\x1b[2J" in text


def test_explain_missing_confirmation_lists_who_said_what() -> None:
    older = Membership.of(["uid-a"], epoch=1)
    text = run({"eu-1": LOCAL, "eu-2": None, "us-1": older}, members=[*MEMBERS, "us-2", "ap-1"]).explain("web")
    assert text.startswith("Only 1 of 3 members of deployment 'web' confirm")
    assert "2 are needed" in text
    assert "eu-2 store no member set" in text and "us-1 store an older configuration" in text
    assert "us-2, ap-1 could not be read" in text


def _existing(stored: dict[str, Membership]) -> Check:
    return Check(Verdict.CONFLICT, LOCAL, conflicting=dict(stored))


def test_explain_existing_advises_import_only_for_a_majority_stored_coordinator_set() -> None:
    theirs = by(Membership.of(["uid-a", "uid-b", "uid-d"], epoch=4), "coordinator")
    text = explain_existing(_existing({"eu-2": theirs, "eu-1": theirs}), "web", "apps", IDS)
    assert text.startswith("Deployment 'web' already exists in namespace 'apps' with a different member set")
    assert "epoch 4, members eu-1, eu-2, us-2, found on eu-1, eu-2" in text
    assert "coordinator deployment import web --cluster eu-1" in text


def test_explain_existing_distrusts_a_set_found_on_too_few_of_its_members() -> None:
    theirs = by(Membership.of(["uid-a", "uid-b", "uid-d"], epoch=4), "coordinator")
    text = explain_existing(_existing({"eu-1": theirs}), "web", "apps", IDS)
    assert "Only 1 of its 3 members were found storing it" in text
    assert "--cluster" not in text
    # found on a cluster that is not one of its own members: confirms nothing
    elsewhere = explain_existing(_existing({"us-1": theirs, "eu-1": theirs}), "web", "apps", IDS)
    assert "Only 1 of its 3 members" in elsewhere


def test_explain_existing_warns_off_a_planted_set() -> None:
    planted = by(Membership.of(["uid-a", "uid-b"], epoch=4), "kubectl")
    text = explain_existing(_existing({"eu-1": planted, "eu-2": planted}), "web", "apps", IDS)
    assert "so do not import it" in text and "coordinator-lock-web in namespace 'apps' on eu-1, eu-2" in text
    assert "--cluster" not in text


def test_explain_existing_describes_the_newest_stored_set() -> None:
    old = by(Membership.of(["uid-a"], epoch=2), "coordinator")
    new = by(Membership.of(["uid-b", "uid-c"], epoch=6), "coordinator")
    text = explain_existing(_existing({"eu-1": old, "eu-2": new, "us-1": new}), "web", "apps", IDS)
    assert "epoch 6, members eu-2, us-1, found on eu-2, us-1" in text


# ------------------------------------------------- finishing a change: behind stand-ins

OLD = ["eu-1", "eu-2", "us-1"]
NEW = ["eu-2", "us-1"]
BEFORE = Membership.of(["uid-a", "uid-b", "uid-c"], epoch=5)
JOINT = Membership.of(BEFORE.members, epoch=6, joint=["uid-b", "uid-c"])


def finishing(stored: dict[str, Stored]) -> Check:
    result = check(JOINT, stored, OLD, [OLD, NEW])
    return behind_stand_in(result, stored, OLD, NEW, BEFORE)


def test_a_new_member_that_missed_the_change_before_stands_in_when_the_old_set_confirms() -> None:
    older = by(Membership.of(["uid-a", "uid-b", "uid-c"], epoch=1), "coordinator")
    plain = check(JOINT, {"eu-1": JOINT, "eu-2": older, "us-1": JOINT}, OLD, [OLD, NEW])
    assert plain.verdict is Verdict.UNCONFIRMED and plain.short == [NEW]
    assert finishing({"eu-1": JOINT, "eu-2": older, "us-1": JOINT}).ok


def test_no_stand_in_without_the_old_sets_majority_or_past_a_conflict() -> None:
    older = by(Membership.of(["uid-a", "uid-b", "uid-c"], epoch=1), "coordinator")
    # only us-1 confirms among the old set: the old set does not decide
    assert not finishing({"eu-1": None, "eu-2": older, "us-1": JOINT}).ok
    newer = Membership.of(["uid-d", "uid-e"], epoch=9)
    conflict = finishing({"eu-1": JOINT, "eu-2": older, "us-1": newer})
    assert conflict.verdict is Verdict.CONFLICT


def test_silent_planted_and_unrelated_sets_never_stand_in() -> None:
    for value in (
        None,
        UNSTATED,
        by(Membership.of(["uid-a", "uid-b", "uid-c"], epoch=1), "kubectl"),  # not a coordinator's
        by(Membership.of(["uid-x", "uid-y"], epoch=1), "coordinator"),  # another deployment's
    ):
        result = finishing({"eu-1": JOINT, "eu-2": value, "us-1": JOINT})
        assert not result.ok, value


def test_a_stand_in_with_the_rest_unseen_is_unobservable() -> None:
    older = by(Membership.of(["uid-a", "uid-b", "uid-c"], epoch=1), "coordinator")
    wide_new = ["eu-2", "us-1", "us-2"]
    stored: dict[str, Stored] = {"eu-1": JOINT, "eu-2": older}
    result = behind_stand_in(check(JOINT, stored, [*OLD, "us-2"], [OLD, wide_new]), stored, OLD, wide_new, BEFORE)
    assert result.verdict is Verdict.UNOBSERVABLE


def test_a_stand_in_waiting_on_the_old_sets_unseen_member_is_unobservable_not_refused() -> None:
    # eu-2 (behind) and us-1 (agreeing) answered first; eu-1, whose confirmation of the
    # old set is what lets eu-2 stand in, has not answered yet: more answers may confirm
    older = by(Membership.of(["uid-a", "uid-b", "uid-c"], epoch=1), "coordinator")
    early = finishing({"eu-2": older, "us-1": JOINT})
    assert early.verdict is Verdict.UNOBSERVABLE, early
    assert finishing({"eu-1": JOINT, "eu-2": older, "us-1": JOINT}).ok
    # eu-1 answered and stores nothing: the old set does not decide, and that is known
    assert finishing({"eu-1": None, "eu-2": older, "us-1": JOINT}).verdict is Verdict.UNCONFIRMED


def test_explain_during_a_change_names_the_group_short_of_a_majority() -> None:
    older = Membership.of(["uid-a", "uid-b", "uid-c"], epoch=1)
    text = check(JOINT, {"eu-1": JOINT, "eu-2": older, "us-1": JOINT}, OLD, [OLD, NEW]).explain("pay", IDS)
    assert "Only 1 of the 2 members eu-2, us-1 of deployment 'pay'" in text
    assert "a majority of the old set and of the new set" in text and "eu-2 store an older configuration" in text


def test_a_record_with_a_change_in_progress_is_told_to_finish_it_not_to_import() -> None:
    # The joint step reached eu-1 and us-1; eu-2 still stores the set from before the change.
    older = by(BEFORE, "coordinator")
    text = check(JOINT, {"eu-1": JOINT, "eu-2": older, "us-1": older}, OLD, [OLD, NEW]).explain("pay", IDS)
    assert "member change of 'pay' in progress (to eu-2, us-1)" in text, text
    assert "run that change again" in text and "deployment import" not in text
    plain = check(BEFORE, {"eu-1": None, "eu-2": None, "us-1": BEFORE}, OLD).explain("pay", IDS)
    assert "deployment import pay --cluster NAME" in plain and "in progress" not in plain


def test_a_record_behind_a_step_of_a_change_from_it_is_told_to_run_that_change() -> None:
    # A change of the record's own set (epoch 2) stopped after its joint step noted epoch 3
    # on the state objects: an import reads the leases, which never stored it; running the
    # change here recognises the step and finishes it.
    joint = by(Membership.of(LOCAL.members, epoch=3, joint=["uid-a", "uid-b", "uid-c", "uid-d"]), "coordinator")
    text = run({"eu-1": joint, "eu-2": joint, "us-1": LOCAL}).explain("web", IDS)
    assert "differs from this machine's record" in text
    assert "a member change from this machine's member set to eu-1, eu-2, us-1, us-2" in text, text
    assert "`coordinator deployment add-cluster web us-2`" in text and "deployment import" not in text
    # its commit (epoch 4) names the command as well; a removal and a replacement
    # (the commit: an import adopts it too, once the leases of a majority store it)
    commit = by(Membership.of(["uid-a", "uid-b"], epoch=4), "coordinator")
    text = run({"eu-1": commit}).explain("web", IDS)
    assert "`coordinator deployment remove-cluster web us-1`" in text and "deployment import web" in text, text
    swap = by(Membership.of(LOCAL.members, epoch=3, joint=["uid-a", "uid-b", "uid-e"]), "coordinator")
    assert "`coordinator deployment replace-cluster web us-1 ap-1`" in run({"eu-1": swap}).explain("web", IDS)
    # a cluster not connected here is named by identity, and must be connected first
    text = run({"eu-1": joint}).explain("web", {k: v for k, v in IDS.items() if k != "uid-d"})
    assert "connect identity uid-d first" in text, text
    # not a step from this record: the joint set of another set, a later epoch, or not
    # coordinator's (the planted-set advice): no change to run
    other = by(Membership.of(["uid-a", "uid-b", "uid-d"], epoch=3, joint=["uid-a", "uid-b"]), "coordinator")
    later = by(Membership.of(LOCAL.members, epoch=5, joint=["uid-a", "uid-b"]), "coordinator")
    forged = by(Membership.of(LOCAL.members, epoch=3, joint=["uid-a", "uid-b"]), "kubectl")
    for stored in (other, later, forged):
        text = run({"eu-1": stored}).explain("web", IDS)
        assert "Run that change here" not in text, (stored, text)


def test_a_rerun_finds_its_change_on_state_objects_only_where_coordinator_noted_it() -> None:
    from coordinator.ops.reconfig import step_of_change

    final = Membership.of(["uid-a", "uid-b", "uid-c", "uid-d"], epoch=4)
    joint = Membership.of(LOCAL.members, epoch=3, joint=final.members)
    groups = [MEMBERS, [*MEMBERS, "us-2"]]
    noted = by(joint, "coordinator")
    assert step_of_change(joint, final, groups, {}, {"eu-1": noted}) == joint
    # the commit noted on state objects alone: resumed at the joint step (the commit is
    # noted before its lease writes, so such a note does not prove it was confirmed)
    everywhere = {m: by(final, "coordinator") for m in groups[1]}
    assert step_of_change(joint, final, groups, {}, everywhere) == joint
    assert step_of_change(joint, final, groups, {m: final for m in groups[1]}, {}) == final
    # a note another client wrote, or whose writer is unknown (managedFields stripped),
    # or an older set: no trace of the change
    for stored in (by(joint, "kubectl"), by(joint), by(final, "kubectl-annotate"), by(LOCAL, "coordinator")):
        assert step_of_change(joint, final, groups, {}, {"eu-1": stored, "eu-2": stored}) is None, stored
