"""What per-cluster answers add up to (coordinator.ops.verdicts): no cluster needed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from coordinator.errors import ExitCode, LockHeldError, NoQuorumError
from coordinator.ops.verdicts import (
    break_verdict,
    fleet_problem,
    history_verdict,
    replicas_verdict,
    status_verdict,
    waiting,
)
from coordinator.rules.outcome import Outcome


@dataclass
class Row:
    name: str
    status: str


@dataclass
class Answer:
    outcome: Outcome
    detail: str = ""
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


@dataclass
class View:
    holder: str = ""
    remaining: float | None = None
    vanished: bool = False
    info: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.holder:
            self.info["holder"] = self.holder

    def remaining_s(self) -> float | None:
        return self.remaining


@dataclass
class Attempt:
    view: View | None


# ------------------------------------------------------------------ lock status


@dataclass
class Possible:
    lock_id: str
    holder: str | None
    clusters: list[str]


@dataclass
class Status:
    clusters: list[Row]
    verdict: str = "free"
    possible: list[Possible] = field(default_factory=list)
    possible_unseen: bool = False
    deployment: str = "pay"
    quorum: int = 2
    unnamed: list[str] = field(default_factory=list)


def test_status_that_is_decided_has_no_problem() -> None:
    v = status_verdict(Status([Row("a", "held"), Row("b", "free"), Row("c", "unreachable")], "partly-held"))
    assert v.decided
    assert v.problem() is None
    assert v.observed == ["a", "b"]
    assert v.unobserved == [("c", "unreachable")]
    assert v.not_seen == ["c"]


def test_status_unknown_is_exit_4_naming_who_may_hold_it() -> None:
    rows = [Row("a", "held"), Row("b", "unreachable"), Row("c", "free")]
    v = status_verdict(Status(rows, "unknown", [Possible("1f2e", "alice", ["a"])]))
    assert not v.decided
    err = v.problem()
    assert isinstance(err, NoQuorumError) and err.exit_code == ExitCode.NO_QUORUM
    assert err.message.startswith("Who holds the lock of 'pay' is unknown: 2 of 3 clusters could be observed")
    assert "(not observed: b (unreachable))" in err.message
    assert "may be held by alice (lock 1f2e, held on a)" in err.message


def test_status_unknown_with_too_few_observed_names_a_holder_not_seen() -> None:
    rows = [Row("a", "expired"), Row("b", "forbidden"), Row("c", "identity-mismatch")]
    v = status_verdict(Status(rows, "unknown", possible_unseen=True))
    err = v.problem()
    assert isinstance(err, NoQuorumError)
    assert "(not observed: b (forbidden), c (identity-mismatch))" in err.message
    assert "a holder nobody can name (on b, c)" in err.message


def test_status_unknown_where_every_lease_was_read_says_which_hold_for_nobody_named() -> None:
    # Every member read, but the leases block for a holder nobody can name: the reason is
    # those leases, not members that "could not be observed" (there are none).
    rows = [Row("a", "held"), Row("b", "held"), Row("c", "held")]
    v = status_verdict(Status(rows, "unknown", possible_unseen=True, unnamed=["a", "b", "c"]))
    err = v.problem()
    assert isinstance(err, NoQuorumError)
    assert "3 of 3 clusters could be observed (not observed: none); on a, b, c the lease counts as held" in err.message
    assert "a holder nobody can name (on a, b, c)" in err.message
    assert v.why_undecided() == "the leases on a, b, c count as held by a holder nobody can name"


def test_status_counts_only_held_free_and_expired_as_observed() -> None:
    # A status no rule knows (a newer engine's) is not an observation, and not named as
    # unobservable for people either.
    v = status_verdict(Status([Row("a", "held"), Row("b", "throttled"), Row("c", "error")], "unknown"))
    assert not v.decided
    assert v.unobserved == [("b", "throttled"), ("c", "error")]
    assert v.not_seen == ["c"]


# ------------------------------------------------------------------ lock break


@pytest.mark.parametrize(
    ("outcomes", "done"),
    [
        ([Outcome.OK, Outcome.OK, Outcome.UNREACHABLE], True),
        ([Outcome.OK, Outcome.FORBIDDEN, Outcome.UNREACHABLE], False),
        ([Outcome.OK, Outcome.OK, Outcome.ERROR, Outcome.ERROR], False),  # 2 of 4: q is 3
        ([Outcome.OK, Outcome.OK, Outcome.OK, Outcome.ERROR], True),
        ([Outcome.OK], True),
    ],
)
def test_break_needs_a_majority_cleared(outcomes: list[Outcome], done: bool) -> None:
    v = break_verdict("pay", {f"c{i}": Answer(o) for i, o in enumerate(outcomes)})
    assert v.done is done
    assert (v.problem() is None) is done


def test_break_on_a_minority_is_exit_4() -> None:
    err = break_verdict("pay", {"a": Answer(Outcome.OK), "b": Answer(Outcome.UNREACHABLE)}).problem()
    assert isinstance(err, NoQuorumError)
    assert err.message.startswith("The lock of 'pay' was cleared on only 1 of 2 clusters;")


@dataclass
class Action:
    action: str


def test_break_by_lock_id_that_cleared_a_leftover_still_reports_the_other_lock_with_exit_3() -> None:
    """--lock-id A: A's lease on c1 is cleared, B holds c2 and c3 and is left alone."""
    answers = {
        "c1": Answer(Outcome.OK, "cleared holder A", Action("broken")),
        "c2": Answer(Outcome.HELD_BY_OTHER, "held by bob (lock B)", Action("other")),
        "c3": Answer(Outcome.HELD_BY_OTHER, "held by bob (lock B)", Action("other")),
    }
    v = break_verdict("pay", answers, "A")
    assert v.broken == ["c1"]
    err = v.problem()
    assert isinstance(err, LockHeldError) and err.exit_code is ExitCode.HELD
    assert err.message.startswith(
        "Lock A was cleared on c1, and another lock was left alone (c2, c3: held by bob (lock B))."
    ), err.message
    # Without --lock-id nobody is "another lock": a lease the break could not clear is
    # counted against its majority, as always.
    assert isinstance(break_verdict("pay", answers).problem(), NoQuorumError)


# ------------------------------------------------------------------ lock history


def test_history_names_unread_and_unanswered_members() -> None:
    results = {"b": Answer(Outcome.OK), "a": Answer(Outcome.FORBIDDEN, "no get on configmaps")}
    v = history_verdict("pay", ["a", "b", "c"], results)
    assert v.members == ["a", "b", "c"]
    assert v.unread == {"a": "forbidden: no get on configmaps", "c": "not waited for"}
    assert v.read == 1
    err = v.problem()
    assert isinstance(err, NoQuorumError)
    assert "read on only 1 of 3 members" in err.message


def test_history_read_on_a_majority_is_complete() -> None:
    results = {"a": Answer(Outcome.OK), "b": Answer(Outcome.OK), "c": Answer(Outcome.UNREACHABLE, "timeout")}
    v = history_verdict("pay", ["a", "b", "c"], results)
    assert v.complete and v.problem() is None
    assert v.unread == {"c": "unreachable: timeout"}


def test_history_counts_a_cluster_that_answered_beyond_the_record() -> None:
    # A member that answered but is no longer in this machine's record still counts among
    # the members read (the record may be behind a member change).
    v = history_verdict("pay", ["a"], {"a": Answer(Outcome.ERROR, "x"), "z": Answer(Outcome.OK)})
    assert v.members == ["a", "z"]
    assert v.read == 1 and not v.complete


# ------------------------------------------------------------------ a waiting acquire


def test_waiting_names_holders_and_the_soonest_expiry() -> None:
    results = {
        "a": Answer(Outcome.HELD_BY_OTHER, value=Attempt(View("ci-7", 30.0))),
        "b": Answer(Outcome.HELD_BY_OTHER, value=Attempt(View("ci-7", 12.5))),
        "c": Answer(Outcome.HELD_BY_OTHER, value=Attempt(View("", None, vanished=True))),
        "d": Answer(Outcome.UNREACHABLE),
    }
    w = waiting(results, View.remaining_s)
    assert w.holders == ["an unknown holder (deleted lease)", "ci-7"]
    assert w.expires_in_s == 12.5
    assert w.other_outcomes == ["unreachable"]


def test_waiting_escapes_holder_names_and_names_the_unnamed() -> None:
    results = {
        "a": Answer(Outcome.HELD_BY_OTHER, value=Attempt(View("evil\x1b]0;title\x07"))),
        "b": Answer(Outcome.HELD_BY_OTHER, value=Attempt(View(""))),
    }
    w = waiting(results, View.remaining_s)
    assert "an unnamed holder" in w.holders
    assert all("\x1b" not in h and "\x07" not in h for h in w.holders)
    assert w.expires_in_s is None


@dataclass
class Claim:
    holder: str


@dataclass
class FreeReserved:
    """A free lease handed to the longest waiter (a refusal of a newcomer)."""

    live_claim: Claim
    held: bool = False
    vanished: bool = False
    info: dict[str, str] = field(default_factory=dict)


def test_waiting_names_whose_turn_it_is_not_an_unnamed_holder() -> None:
    results = {
        "a": Answer(Outcome.HELD_BY_OTHER, value=Attempt(FreeReserved(Claim("p2")))),  # type: ignore[arg-type]
        "b": Answer(Outcome.HELD_BY_OTHER, value=Attempt(View("p3", 9.0))),
    }
    w = waiting(results, lambda v: None)
    assert w.holders == ["p2 (next in line)", "p3"]


def test_waiting_with_no_refusal_lists_the_other_outcomes() -> None:
    w = waiting({"a": Answer(Outcome.CONFLICT), "b": Answer(Outcome.FORBIDDEN), "c": Answer(Outcome.CONFLICT)})
    assert w.holders == [] and w.expires_in_s is None
    assert w.other_outcomes == ["conflict", "forbidden"]
    assert waiting({}).other_outcomes == []


# ------------------------------------------------------------------ state diff


def replica(name: str, status: str, token: int = 1, version: int = 1, write_id: str = "w", checksum: str = "s") -> Any:
    return {
        "name": name,
        "status": status,
        "token": token,
        "version": version,
        "write_id": write_id,
        "checksum": checksum,
    }


def test_replicas_are_equal_only_under_one_stamp_and_one_checksum() -> None:
    assert replicas_verdict([replica("a", "current"), replica("b", "current")]).equal
    # Same status everywhere, but other data under the same stamp (edited by hand).
    assert not replicas_verdict([replica("a", "current"), replica("b", "current", checksum="t")]).equal
    assert not replicas_verdict([replica("a", "current"), replica("b", "current", version=2)]).equal
    assert not replicas_verdict([replica("a", "current"), replica("b", "behind")]).equal


def test_replicas_all_empty() -> None:
    v = replicas_verdict([replica("a", "empty", 0, 0, "", ""), replica("b", "empty", 0, 0, "", "")])
    assert v.empty and not v.equal


def test_replicas_behind_and_absent_are_repairable_in_row_order() -> None:
    rows = [replica("a", "absent"), replica("b", "current"), replica("c", "behind", version=0)]
    v = replicas_verdict(rows)
    assert v.behind == ["c", "a"]
    assert not v.behind_data_differs  # the same data under an older stamp
    rows[2] = replica("c", "behind", version=0, checksum="old")
    assert replicas_verdict(rows).behind_data_differs


def test_replicas_not_read_are_named() -> None:
    v = replicas_verdict([replica("a", "current"), replica("b", "unreachable"), replica("c", "suspect")])
    assert v.unread == ["b"]
    assert v.by_status == {"current": ["a"], "unreachable": ["b"], "suspect": ["c"]}
    assert not v.equal and not v.empty


# ------------------------------------------------------------------ the fleet


def test_fleet_listed_on_too_few_clusters_is_exit_4_naming_them() -> None:
    from coordinator.ops.fleet import Fleet

    err = fleet_problem(Fleet([], {"a": "ok", "b": "unreachable: timeout", "c": "forbidden"}))
    assert isinstance(err, NoQuorumError)
    assert err.message.startswith(
        "Only 1 of 3 connected clusters could be listed (b (unreachable: timeout), c (forbidden));"
    )
    assert fleet_problem(Fleet([], {"a": "ok", "b": "ok", "c": "forbidden"})) is None
    assert fleet_problem(Fleet([], {})) is None  # nothing connected: nothing to miss
