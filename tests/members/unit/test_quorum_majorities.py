"""Majorities of a member set and of a joint configuration (coordinator/rules/quorum.py's
``Majorities``).

The rule that makes joint consensus safe: whatever two decisions it allows, each had a
majority of every group, so two decisions always share a member of each group.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.rules.outcome import Outcome
from coordinator.rules.quorum import Majorities

# ------------------------------------------------------------------ Majorities


def test_a_configuration_needs_groups_that_are_not_empty() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        Majorities([])
    with pytest.raises(ValueError, match="non-empty"):
        Majorities([["a"], []])


def test_members_once_each_in_order_and_joint_for_two_groups() -> None:
    single = Majorities([["a", "b", "a", "c"]])
    assert single.groups == [["a", "b", "c"]] and single.members == ["a", "b", "c"]
    assert not single.joint and single.quorum == 2
    joint = Majorities([["a", "b", "c"], ["c", "d", "e", "f", "g"]])
    assert joint.joint and joint.members == ["a", "b", "c", "d", "e", "f", "g"]
    assert joint.quorum == 2  # for display: the current (first) group's


def test_reached_and_impossible_of_one_group() -> None:
    m = Majorities([["a", "b", "c"]])
    assert m.reached(["a", "b"]) and m.reached(["a", "b", "c"]) and not m.reached(["a"])
    assert not m.reached(["a", "x", "y"])  # answers of non-members do not count
    assert not m.impossible(["a"]) and m.impossible(["a", "b"])
    assert not m.impossible(["x", "y", "z"])


def test_a_joint_decision_needs_a_majority_of_each_group() -> None:
    m = Majorities([["a", "b", "c"], ["c", "d", "e"]])
    assert not m.reached(["a", "b"])  # the old set alone
    assert not m.reached(["d", "e"])  # the new set alone
    assert m.reached(["a", "c", "d"]) and m.reached(["a", "b", "d", "e"])
    assert m.impossible(["d", "e"])  # the new group can no longer decide
    assert not m.impossible(["a", "d"])


def test_reached_by_and_impossible_by_read_outcomes() -> None:
    m = Majorities([["a", "b", "c"], ["c", "d", "e"]])
    results = {"a": Outcome.OK, "c": Outcome.OK, "d": Outcome.OK, "b": Outcome.CONFLICT}
    assert m.reached_by(results) and not m.impossible_by(results)
    # an answer that is not OK counts against, whatever kind of no it is
    for no in (Outcome.CONFLICT, Outcome.UNREACHABLE, Outcome.HELD_BY_OTHER, Outcome.FORBIDDEN, Outcome.ERROR):
        results = {"a": Outcome.OK, "b": Outcome.OK, "d": no, "e": no}
        assert not m.reached_by(results) and m.impossible_by(results), no
    assert not m.reached_by({}) and not m.impossible_by({})


outcome_values = st.sampled_from(list(Outcome))


@given(st.integers(1, 6), st.integers(0, 6), st.integers(1, 6), st.data())
def test_reached_and_impossible_never_both_and_two_decisions_meet(
    old: int, shared: int, new: int, data: st.DataObject
) -> None:
    first = [f"o{i}" for i in range(old)]
    second = first[: min(shared, old)] + [f"n{i}" for i in range(new)]
    m = Majorities([first, second])
    results = {c: data.draw(outcome_values) for c in m.members if data.draw(st.booleans())}
    assert not (m.reached_by(results) and m.impossible_by(results))
    # Two sets that both reach the joint quorum share a member of each group.
    one = {c for c in m.members if data.draw(st.booleans())}
    two = {c for c in m.members if data.draw(st.booleans())}
    if m.reached(one) and m.reached(two):
        for g in m.groups:
            assert one & two & set(g)


def test_one_group_is_reached_by_a_majority_and_impossible_past_a_minority_of_noes() -> None:
    members = ["a", "b", "c", "d", "e"]
    m = Majorities([members])
    for combo in itertools.product([Outcome.OK, Outcome.UNREACHABLE], repeat=len(members)):
        results = dict(zip(members, combo, strict=True))
        oks = sum(1 for o in combo if o is Outcome.OK)
        assert m.reached_by(results) is (oks >= 3)
        assert m.impossible_by(results) is (len(members) - oks > 2)


def test_holder_holds_a_majority_of_every_group() -> None:
    m = Majorities([["a", "b", "c"], ["c", "d", "e"]])
    assert m.holder({"a": "L1", "b": "L1", "c": "L1", "d": "L1"}) == "L1"
    assert m.holder({"a": "L1", "b": "L1", "d": "L2", "e": "L2"}) is None  # each has one group only
    assert m.holder({"a": None, "b": None, "c": None}) is None
    assert m.holder({}) is None
    assert Majorities([["a", "b", "c"]]).holder({"a": "L2", "b": "L1", "c": "L1"}) == "L1"


def test_expiry_is_the_soonest_groups_qth_longest_remaining_time() -> None:
    single = Majorities([["a", "b", "c"]])
    assert single.expiry({"a": 30.0, "b": 10.0, "c": 20.0}) == 20.0
    assert single.expiry({"a": 30.0}) is None  # too few leases to speak for a majority
    joint = Majorities([["a", "b", "c"], ["c", "d", "e"]])
    assert joint.expiry({"a": 30.0, "b": 25.0, "c": 20.0, "d": 5.0, "e": 4.0}) == 5.0
    assert joint.expiry({"a": 30.0, "b": 25.0, "c": 20.0, "d": 5.0}) == 5.0
    assert joint.expiry({"a": 30.0, "b": 25.0, "c": 20.0}) is None


def test_describe_names_each_groups_quorum() -> None:
    assert Majorities([["a", "b", "c"]]).describe() == "2 of 3 (a, b, c)"
    assert Majorities([["a", "b"], ["b", "c", "d", "e"]]).describe() == "2 of 2 (a, b) and 3 of 4 (b, c, d, e)"


# ------------------------------------------------------------------ who may hold it

# What a member's lease says to `lock status`: held by lock A or B, free, or not observed
# ("?": unreachable, forbidden, an error; or a lease that blocks for an unknown holder).
SPLITS = ("A", "B", "free", "?")


def _holder_of(majorities: Majorities, leases: dict[str, str]) -> str | None:
    return majorities.holder({c: h for c, h in leases.items() if h not in ("free", "?")})


def _completions(leases: dict[str, str]) -> list[dict[str, str]]:
    """Every world the members not observed could hide: each of them held by A, B, a lock
    nobody saw (X), or free."""
    hidden = [c for c, h in leases.items() if h == "?"]
    worlds = []
    for values in itertools.product(("A", "B", "X", "free"), repeat=len(hidden)):
        worlds.append(leases | dict(zip(hidden, values, strict=True)))
    return worlds


@pytest.mark.parametrize(
    "groups", [[["a", "b", "c"]], [["a", "b", "c", "d", "e"]], [["a", "b", "c"], ["c", "d", "e"]]], ids=str
)
def test_possible_holders_agree_with_every_world_the_unobserved_members_could_hide(groups: list[list[str]]) -> None:
    # The oracle knows nothing of the rule: it completes the members not observed in every
    # way and asks who holds a majority in each world. The lock is decided (held by L, or
    # by nobody) only when every world agrees; otherwise `lock status` must say unknown
    # and name exactly the seen lock ids some world lets hold it.
    m = Majorities(groups)
    for split in itertools.product(SPLITS, repeat=len(m.members)):
        leases = dict(zip(m.members, split, strict=True))
        live = {c: h for c, h in leases.items() if h in ("A", "B")}
        winner = m.holder(live)
        possible = m.possible_holders(live, [c for c, h in leases.items() if h == "?"])
        outcomes = {_holder_of(m, world) for world in _completions(leases)}
        if winner is not None:
            assert outcomes == {winner}, leases
            continue
        decided = len(outcomes) == 1
        assert bool(possible) is not decided, leases
        seen = set(live.values())
        assert set(possible.lock_ids) == outcomes & seen, leases
        # a lock id seen nowhere that some world lets hold it
        assert possible.unseen == bool(outcomes - seen - {None}), leases


def test_the_on_call_case_is_unknown_naming_alice() -> None:
    # Alice holds eu-1 and eu-2; eu-2 stops answering, eu-3 is free: never "free".
    m = Majorities([["eu-1", "eu-2", "eu-3"]])
    possible = m.possible_holders({"eu-1": "alice"}, ["eu-2"])
    assert possible and possible.lock_ids == ["alice"] and not possible.unseen
    # With eu-2 seen free, nobody can hold it.
    assert not m.possible_holders({"eu-1": "alice"}, [])
