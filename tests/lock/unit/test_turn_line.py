"""The line of waiters on one lease (coordinator/rules/turnline.py): what the annotation lists,
which claims are alive, whose turn it is, and the line each write leaves.

No cluster: every time is an argument (the lease's managedFields stamps and the Date)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coordinator.rules.lease import A_NEXT, FIELD_MANAGER, LINE_MANAGER, RELEASE_MANAGER, LeaseView
from coordinator.rules.turnline import (
    BACK_REFRESH_S,
    CLAIM_REFRESH_S,
    CLAIM_STALE_S,
    FRONT,
    HANDOFF_GRACE_S,
    HOLDER_CHARS,
    LINE_CAP,
    LOCK_ID_CHARS,
    STALE_SLACK_S,
    TurnClaim,
    dump_line,
    parse_line,
)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
S0 = int(T0.timestamp())


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def claim(lock_id: str, since: int, seen: int | None = None) -> TurnClaim:
    return TurnClaim(since, lock_id, lock_id.upper(), seen)


def lease(
    line: tuple[TurnClaim, ...] | str | None,
    *,
    holder: str | None = "h/holder",
    date: datetime | None = T0,
    own_at: datetime = T0 - timedelta(seconds=5),
    released_at: datetime | None = None,
    ttl: int = 30,
) -> LeaseView:
    own = {"f:spec": {"f:leaseDurationSeconds": {}, "f:holderIdentity": {}}}
    fields: list[dict[str, Any]] = [{"manager": FIELD_MANAGER, "time": _stamp(own_at), "fieldsV1": own}]
    if line is not None:  # the line, written under its own field manager
        fields.append({"manager": LINE_MANAGER, "fieldsV1": {"f:metadata": {"f:annotations": {"f:" + A_NEXT: {}}}}})
    if released_at is not None:
        fields.append({"manager": RELEASE_MANAGER, "time": _stamp(released_at)})
    ann: dict[str, str] = {}
    if isinstance(line, str):
        ann[A_NEXT] = line
    elif line:
        ann[A_NEXT] = dump_line(line)
    spec: dict[str, Any] = {"leaseDurationSeconds": ttl, "holderIdentity": holder or ""}
    obj = {"metadata": {"annotations": ann, "resourceVersion": "7", "managedFields": fields}, "spec": spec}
    return LeaseView.parse(obj, date)


# ------------------------------------------------------------------ the annotation


def test_a_line_reads_back_in_order_and_its_head_is_a_claim_of_its_own() -> None:
    line = (claim("a", S0 - 30, S0 - 2), claim("b", S0 - 20, S0 - 1), claim("c", S0 - 10))
    raw = dump_line(line)
    assert parse_line(raw) == line
    assert [c.seen for c in parse_line(raw)] == [S0 - 2, S0 - 1, None]
    head = json.loads(raw)
    assert (head["lock"], head["holder"], head["since"]) == ("a", "A", S0 - 30)  # as one claim reads
    assert TurnClaim.parse(raw) == line[0]


def test_a_line_is_sorted_deduplicated_and_capped() -> None:
    entries = [claim(f"w{i:02}", S0 - i) for i in range(LINE_CAP + 8)]
    doc = {**entries[5].document(), "after": [e.document() for e in entries] + [entries[3].document()]}
    line = parse_line(json.dumps(doc))
    assert len(line) == LINE_CAP
    assert line == tuple(sorted(entries)[:LINE_CAP])


@pytest.mark.parametrize(
    "raw",
    [None, 5, "", "{", "[]", '"x"', "null", '{"lock": "a"}', '{"since": "soon", "lock": "a"}', "[" * 5000],
)
def test_an_unreadable_line_lists_nobody(raw: Any) -> None:
    assert parse_line(raw) == ()


def test_an_entry_stays_small_whatever_its_waiter_brings() -> None:
    long_holder = TurnClaim(S0, "w", "h" * 10_000, S0)
    assert len(long_holder.dump()) < HOLDER_CHARS + 100
    assert parse_line(dump_line((long_holder,))) == (long_holder,)
    long_id = TurnClaim(S0, "x" * (LOCK_ID_CHARS + 1), "h", S0)
    assert parse_line(dump_line((long_id,))) == ()
    assert parse_line(json.dumps({"lock": "", "since": S0})) == ()
    assert lease(()).line_joined(long_id) is None  # such a waiter takes no place


def test_malformed_entries_are_ignored_and_the_others_kept() -> None:
    good = claim("good", S0 - 5, S0 - 1)
    junk: list[Any] = [
        "text",
        None,
        {"lock": "x"},
        {"lock": "nan", "since": 1, "seen": float("inf")},
        {"lock": "late", "since": 1, "seen": 10**20},
        {"lock": "neg", "since": 1, "seen": -1},
        {"lock": "never", "since": 1, "seen": 1, "every": 3600},
        {"lock": "zero", "since": 1, "seen": 1, "every": 0},
        {"lock": "word", "since": 1, "seen": "soon"},
    ]
    raw = json.dumps({"lock": "top", "since": "never", "after": [*junk, good.document()]})
    assert parse_line(raw) == (good,)
    assert parse_line(json.dumps({**good.document(), "after": "not a list"})) == (good,)


# ------------------------------------------------------------------ alive or dead


def test_a_claim_is_alive_while_refreshed_within_the_bound_either_way() -> None:
    assert claim("w", S0 - 100, S0 - int(CLAIM_STALE_S)).alive(S0)
    assert not claim("w", S0 - 100, S0 - int(CLAIM_STALE_S) - 1).alive(S0)
    assert not claim("w", S0 - 100, S0 + int(CLAIM_STALE_S) + 1).alive(S0)  # a stamp from the future
    assert claim("w", S0 - 1).alive(S0)  # its since is its first refresh
    assert claim("w", S0 - 1000).alive(S0)  # no stamp at all: the lease's times bound it


# ------------------------------------------------------------------ whose turn


def test_while_the_lease_is_live_the_first_live_claim_is_next() -> None:
    dead, w1, w2 = claim("dead", S0 - 40, S0 - 30), claim("w1", S0 - 20, S0 - 2), claim("w2", S0 - 10, S0 - 1)
    view = lease((dead, w1, w2))
    assert view.next_claim == dead  # listed first, whatever it is
    assert view.live_claim == w1 and view.claim_fresh()
    assert view.binding_claim("w2", w2) == w1 and view.binding_claim("w1", w1) is None
    assert lease((dead,)).live_claim is None  # nobody alive: nobody is next
    # the holder's own claim is spent by holding
    assert lease((w1, w2), holder="h/w1").live_claim == w2


def test_after_a_release_each_live_waiter_gets_a_turn_in_order() -> None:
    """Claimed by d (killed just before the release: not stale yet), then w1, w2; dd died
    long before and gets no turn."""
    dd, d = claim("dd", S0 - 90, S0 - 60), claim("d", S0 - 50, S0 - 3)
    w1, w2 = claim("w1", S0 - 40, S0 - 2), claim("w2", S0 - 30, S0 - 1)
    line = (dd, d, w1, w2)

    def at(seconds: float) -> LeaseView:
        return lease(line, holder=None, released_at=T0, date=T0 + timedelta(seconds=seconds))

    g = HANDOFF_GRACE_S
    assert at(0).live_claim == d and at(0).reserved_left_s() == pytest.approx(g)
    assert at(g).live_claim == d and at(g).claim_fresh()  # to the last instant of the turn
    assert at(g + 1).live_claim == w1 and at(g + 1).reserved_left_s() == pytest.approx(g - 1)
    assert at(g + 1).binding_claim("w2", w2) == w1
    assert at(g + 1).binding_claim("d", d) is None  # a waiter passed over is not bound by later ones
    assert at(2 * g + 1).live_claim == w2
    over = at(3 * g + 1)
    assert over.live_claim == w2 and not over.claim_fresh() and over.binding_claim("new") is None
    # a lease that lapsed: the turns count from its expiry
    lapsed = lease(line, date=T0 + timedelta(seconds=60), own_at=T0 - timedelta(seconds=10), ttl=10)
    rem = lapsed.remaining_s()
    assert rem is not None and rem < 0
    assert lapsed.live_claim is not None


def test_without_a_date_or_a_release_stamp_no_turn_binds() -> None:
    line = (claim("w1", S0 - 40, S0 - 2),)
    assert not lease(line, date=None).claim_fresh()
    assert not lease(line, holder=None).claim_fresh()  # freed by a give-back only
    # a release event (no Date) still shows who is ahead
    ahead = lease(line, holder=None, released_at=T0, date=None).claim_ahead("w2", claim("w2", S0))
    assert ahead is not None and ahead.lock_id == "w1"


# ------------------------------------------------------------------ the line a write leaves


def test_a_waiter_joins_in_its_place_and_refreshes_only_when_its_stamp_aged() -> None:
    dead, w1, w3 = claim("dead", S0 - 40, S0 - 30), claim("w1", S0 - 20, S0 - 1), claim("w3", S0 - 5, S0 - 1)
    view = lease((dead, w1, w3))
    w2 = TurnClaim(S0 - 10, "w2", "W2")
    joined = view.line_joined(w2)
    assert joined == (w1, w2, w3)  # the dead claim is dropped on the way
    # its stamp: the newest the server put on the lease (our own write, 5 s ago)
    assert [c.seen for c in joined] == [S0 - 1, S0 - 5, S0 - 1]
    # refreshed CLAIM_REFRESH_S ago or more: due, with the newest stamp on the lease
    assert lease(joined).line_joined(w2) is None  # ... but there is none newer
    soon = T0 - timedelta(seconds=5 - CLAIM_REFRESH_S + 1)
    assert lease(joined, own_at=soon, date=soon).line_joined(w2) is None  # refreshed less than that ago
    due = lease(joined, own_at=T0 - timedelta(seconds=1))
    refreshed = due.line_joined(w2)
    assert refreshed is not None and [c.seen for c in refreshed] == [S0 - 1, S0 - 1, S0 - 1]
    fresh = lease((w1, TurnClaim(S0 - 10, "w2", "W2", S0 - 1), w3))
    assert fresh.line_joined(w2) is None  # refreshed a second ago: nothing to write
    # without a Date (a watch event): listed is enough, unlisted joins
    assert lease(joined, date=None).line_joined(w2) is None
    assert lease((w1,), date=None).line_joined(w2) == (w1, w2)


def test_a_refresh_never_goes_back_and_never_runs_ahead_of_the_date() -> None:
    mine = TurnClaim(S0 - 10, "w", "W")
    stale = lease((TurnClaim(S0 - 10, "w", "W", S0 - 4, CLAIM_REFRESH_S),), own_at=T0 - timedelta(seconds=8))
    assert stale.line_joined(mine) is None  # an older server stamp is no refresh
    ahead = lease((TurnClaim(S0 - 10, "w", "W", S0 - 4),), own_at=T0 + timedelta(seconds=30))
    joined = ahead.line_joined(mine)
    assert joined is not None and joined[0].seen == S0


def test_waiters_behind_the_first_few_refresh_seldom_and_are_judged_by_their_interval() -> None:
    front = tuple(claim(f"f{i}", S0 - 100 + i, S0 - 1) for i in range(FRONT))
    back = TurnClaim(S0 - 50, "back", "B")
    joined = lease(front).line_joined(back)
    assert joined is not None and joined[-1].every == BACK_REFRESH_S
    listed = TurnClaim(S0 - 50, "back", "B", S0 - int(BACK_REFRESH_S) + 1, BACK_REFRESH_S)
    assert lease((*front, listed)).line_joined(back) is None  # not due yet
    # alive for twice its interval and the slack, by its own interval
    assert listed.alive(S0 + 2 * BACK_REFRESH_S + STALE_SLACK_S - BACK_REFRESH_S)
    assert not listed.alive(listed.refreshed + 2 * BACK_REFRESH_S + STALE_SLACK_S + 1)
    # promoted to the front (the first waiter left): still alive, and due for a refresh at
    # the front's interval
    promoted = lease((*front[1:], listed))
    assert promoted.live_claim == front[1]
    again = promoted.line_joined(back)
    assert again is not None and again[-1].every == CLAIM_REFRESH_S


def test_a_full_line_of_earlier_waiters_takes_nobody_later() -> None:
    full = tuple(claim(f"w{i:02}", S0 - 100 + i, S0 - 1) for i in range(LINE_CAP))
    view = lease(full)
    assert view.line_joined(TurnClaim(S0, "late", "L")) is None
    early = view.line_joined(TurnClaim(S0 - 200, "early", "E"))
    assert early is not None and len(early) == LINE_CAP and early[0].lock_id == "early"
    assert full[-1] not in early


def test_a_take_drops_the_turns_that_passed_and_keeps_the_rest() -> None:
    d, w1, w2 = claim("d", S0 - 50, S0 - 3), claim("w1", S0 - 40, S0 - 2), claim("w2", S0 - 30, S0 - 1)
    during_w1 = lease((d, w1, w2), holder=None, released_at=T0, date=T0 + timedelta(seconds=HANDOFF_GRACE_S + 1))
    assert during_w1.line_after_take() == (w1, w2)
    all_over = lease((d, w1, w2), holder=None, released_at=T0, date=T0 + timedelta(seconds=10 * HANDOFF_GRACE_S))
    assert all_over.line_after_take() == ()
    # a live lease's own holder (renewing) drops only its own claim and the dead
    dead = claim("dead", S0 - 60, S0 - 30)
    assert lease((dead, w1, w2), holder="h/w1").line_after_take() == (w2,)
    # no time to judge by: only the previous holder's own claim goes
    assert lease((w1, w2), holder="h/w1", date=None).line_after_take() == (w2,)


def test_a_release_drops_only_the_holders_own_claim() -> None:
    from coordinator.engine.lock.bodies import lease_body

    w1, w2 = claim("w1", S0 - 40, S0 - 2), claim("w2", S0 - 30, S0 - 1)
    view = lease((w1, w2), holder="h/w1")
    body = lease_body(view, name="coordinator-lock-web", deployment="web", common={}, lock_id=None, token=3, ttl_s=30)
    assert parse_line(body["metadata"]["annotations"][A_NEXT]) == (w2,)
    kept = lease_body(
        lease((w2,), holder="h/w1"),
        name="coordinator-lock-web",
        deployment="web",
        common={},
        lock_id=None,
        token=3,
        ttl_s=30,
    )
    assert kept["metadata"]["annotations"][A_NEXT] == dump_line((w2,))


def test_a_race_lost_to_the_line_alone_is_told_from_any_other() -> None:
    from copy import deepcopy

    from coordinator.engine.lock.core import only_the_line_moved

    before = lease((claim("w1", S0 - 40, S0 - 2),))

    def changed(edit: Any) -> LeaseView:
        obj = deepcopy(before.obj)
        edit(obj)
        return LeaseView.parse(obj, T0)

    def line_moved(obj: dict[str, Any]) -> None:
        obj["metadata"]["annotations"][A_NEXT] = dump_line((claim("w1", S0 - 40, S0), claim("w2", S0 - 1, S0)))
        obj["metadata"]["resourceVersion"] = "8"
        obj["metadata"]["managedFields"].append({"manager": "coordinator-line", "time": _stamp(T0)})

    assert only_the_line_moved(before, changed(line_moved))
    assert only_the_line_moved(before, changed(lambda o: o["metadata"]["annotations"].pop(A_NEXT)))
    assert not only_the_line_moved(before, changed(lambda o: o["spec"].update(renewTime="2026-12-01T12:00:01Z")))
    assert not only_the_line_moved(before, changed(lambda o: o["spec"].pop("holderIdentity")))
    assert not only_the_line_moved(before, changed(lambda o: o["metadata"]["annotations"].update(x="y")))
    assert not only_the_line_moved(before, LeaseView.parse(None))
