"""What one parsed Lease says (coordinator/rules/lease.py's LeaseView and its small helpers).

The take-over rule (``standing``) has its own cases in tests/lock/unit/test_lease_rules.py, and the real
engines run it under faults in the simulator (tests/sim/test_simulator.py); here are the
views and hints that feed it and the display: the
pid, the break note, the Date-based hints, the reservation of the next turn, and whether
a lease carries its cluster's token history. No cluster: every time is an argument.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.rules.lease import (
    A_LAST_BREAK,
    A_NEXT,
    A_TOKEN,
    A_UID,
    A_VANISHED,
    DEFAULT_MAX_TTL_S,
    HANDOFF_GRACE_S,
    LINE_MANAGER,
    RELEASE_MANAGER,
    LeaseView,
    TurnClaim,
    boot_clock,
    drift_allowance,
    effective_ttl,
    history_known,
    lapse_margin,
    manager_time,
    pid_of,
    remaining_hint,
    remaining_validity,
    token_taken,
)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def view(
    *,
    holder: str | None = "alice@laptop/other",
    ttl: int = 30,
    own_at: datetime | None = T0,
    released_at: datetime | None = None,
    date: datetime | None = None,
    annotations: dict[str, str] | None = None,
    token: str | None = "3",
    uid: str = "uid-1",
    uid_note: str | None = "uid-1",
) -> LeaseView:
    """A lease as the API server returns it: our field manager last wrote it at ``own_at``
    (owning the duration), a holder's release at ``released_at``; ``date`` the response's
    Date header."""
    fields: list[dict[str, Any]] = []
    if own_at is not None:
        notes = {"f:" + A_TOKEN: {}, "f:" + A_UID: {}}  # written with every take and renewal
        fields.append(
            {
                "manager": "coordinator",
                "operation": "Update",
                "time": _stamp(own_at),
                "fieldsV1": {
                    "f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {}},
                    "f:metadata": {"f:annotations": notes},
                },
            }
        )
    if released_at is not None:
        fields.append(
            {
                "manager": RELEASE_MANAGER,
                "operation": "Update",
                "time": _stamp(released_at),
                "fieldsV1": {"f:metadata": {"f:annotations": {}}},
            }
        )
    if annotations:  # written by coordinator (claims by the line's own manager), as the engine does
        line = {k for k in annotations if k == A_NEXT}
        mine = {k for k in annotations if k not in line}
        for manager, keys in (("coordinator", mine), (LINE_MANAGER, line)):
            if keys:
                fields.append(
                    {
                        "manager": manager,
                        "operation": "Update",
                        "fieldsV1": {"f:metadata": {"f:annotations": {"f:" + k: {} for k in keys}}},
                    }
                )
    ann: dict[str, str] = dict(annotations or {})
    if token is not None:
        ann[A_TOKEN] = token
    if uid_note is not None:
        ann[A_UID] = uid_note
    spec: dict[str, Any] = {"leaseDurationSeconds": ttl, "holderIdentity": holder or ""}
    obj = {
        "metadata": {
            "name": "coordinator-lock-web",
            "uid": uid,
            "resourceVersion": "7",
            "creationTimestamp": _stamp(T0 - timedelta(days=1)),
            "annotations": ann,
            "managedFields": fields,
        },
        "spec": spec,
    }
    return LeaseView.parse(obj, date)


# ------------------------------------------------------------------ small helpers


@pytest.mark.parametrize(
    ("raw", "pid"),
    [("4242", 4242), ("0", 0), ("007", 7), ("9" * 18, int("9" * 18))],
)
def test_pid_of_reads_ascii_digits(raw: str, pid: int) -> None:
    assert pid_of(raw) == pid


@pytest.mark.parametrize(
    "raw",
    [
        None,
        4242,
        42.0,
        "",
        " 42",
        "42 ",
        "-1",
        "+1",
        "4_2",
        "0x10",
        "1e3",
        "²",  # a digit to str.isdigit, no number to int
        "٣",  # an Arabic-Indic three: int() reads it, but it is no ASCII pid
        "9" * 19,  # longer than any pid
    ],
)
def test_pid_of_refuses_what_is_no_pid(raw: Any) -> None:
    assert pid_of(raw) is None


@given(st.text(max_size=25))
def test_pid_of_never_raises_and_returns_only_what_the_text_spells(raw: str) -> None:
    pid = pid_of(raw)
    assert pid is None or (str(pid) == raw.lstrip("0") or (pid == 0 and set(raw) == {"0"}))


def test_boot_clock_counts_forward() -> None:
    first = boot_clock()
    second = boot_clock()
    assert isinstance(first, float) and second >= first


def test_drift_and_validity_leave_the_holder_less_than_its_ttl() -> None:
    assert drift_allowance(0) == pytest.approx(0.05)
    assert drift_allowance(100) == pytest.approx(1.05)
    assert remaining_validity(100, 10) == pytest.approx(100 - 10 - 1.05)
    assert remaining_validity(10, 10) < 0  # the whole TTL gone: no time left to act


def test_manager_time_is_the_newest_stamp_of_that_manager_only() -> None:
    obj = {
        "metadata": {
            "managedFields": [
                {"manager": "coordinator", "time": "2026-12-01T12:00:00Z"},
                {"manager": "coordinator", "time": "2026-12-01T12:00:09Z"},
                {"manager": "kubectl", "time": "2026-12-01T13:00:00Z"},
                {"manager": "coordinator", "time": "not a time"},
                {"manager": "coordinator", "time": 5},
                "not an entry",
            ]
        }
    }
    assert manager_time(obj, "coordinator") == T0 + timedelta(seconds=9)
    assert manager_time(obj, "kubectl") == T0 + timedelta(hours=1)
    assert manager_time(obj, "coordinator-release") is None
    assert manager_time({}, "coordinator") is None
    assert manager_time({"metadata": {"managedFields": None}}, "coordinator") is None


# ------------------------------------------------------------------ the break note


def test_broken_for_names_only_the_lock_id_the_break_cleared() -> None:
    note = json.dumps({"previous_lock_id": "a1b2", "by": "bob"})
    broken = view(holder=None, annotations={A_LAST_BREAK: note})
    assert broken.broken_for("a1b2")
    assert not broken.broken_for("ffff")
    assert not broken.broken_for("")


@pytest.mark.parametrize(
    "note",
    ["", "{", '["a1b2"]', '"a1b2"', "{}", json.dumps({"previous": "a1b2"}), "[" * 5000],
)
def test_an_unreadable_or_empty_break_note_breaks_nobody(note: str) -> None:
    lease = view(holder=None, annotations={A_LAST_BREAK: note})
    assert not lease.broken_for("a1b2")


def test_no_break_note_breaks_nobody() -> None:
    assert view(holder=None).break_note is None
    assert not view(holder=None).broken_for("a1b2")
    assert not LeaseView.parse(None).broken_for("a1b2")


# ------------------------------------------------------------------ hints by the Date header


def test_remaining_hint_counts_ttl_and_margin_from_our_last_write_by_the_date() -> None:
    lease = view(ttl=30, date=T0 + timedelta(seconds=10))
    margin = lapse_margin(30, 0.0)
    assert remaining_hint(lease, max_ttl_s=600) == pytest.approx(30 + margin - 10)
    assert lease.remaining_hint(600) == pytest.approx(30 + margin - 10)
    # a larger server skew widens the margin, and so the hint
    assert lease.remaining_hint(600, skew_s=5.0) == pytest.approx(30 + lapse_margin(30, 5.0) - 10)
    assert remaining_hint(lease, max_ttl_s=600, max_server_skew_s=5.0) == lease.remaining_hint(600, skew_s=5.0)


def test_remaining_hint_goes_negative_once_past_ttl_and_margin() -> None:
    margin = lapse_margin(30, 0.0)
    lease = view(ttl=30, date=T0 + timedelta(seconds=30 + margin + 4))
    hint = lease.remaining_hint()
    assert hint is not None and hint == pytest.approx(-4)
    assert lease.expired() is True


def test_remaining_hint_needs_our_stamp_and_a_date() -> None:
    assert view(date=None).remaining_hint() is None
    assert view(own_at=None, date=T0).remaining_hint() is None
    assert LeaseView.parse(None, T0).remaining_hint() is None


def test_remaining_hint_waits_out_the_maximum_ttl_for_a_tombstone() -> None:
    stone = view(holder=None, annotations={A_VANISHED: "2026-12-01T12:00:00Z"}, date=T0 + timedelta(seconds=1))
    assert effective_ttl(stone, 600) == 600
    assert stone.remaining_hint(600) == pytest.approx(600 + lapse_margin(600, 0.0) - 1)


def test_remaining_s_is_for_held_leases_only() -> None:
    held = view(date=T0 + timedelta(seconds=5))
    assert held.remaining_s() == pytest.approx(held.remaining_hint(DEFAULT_MAX_TTL_S) or 0.0)
    assert held.remaining_s() == pytest.approx(30 + lapse_margin(30, 0.0) - 5)
    assert view(holder=None, date=T0 + timedelta(seconds=5)).remaining_s() is None
    stone = view(holder=None, annotations={A_VANISHED: "x"}, date=T0 + timedelta(seconds=5))
    assert stone.blocking and stone.remaining_s() is None
    assert view(date=None).remaining_s() is None


def test_expired_is_true_for_a_free_lease_and_none_without_evidence() -> None:
    assert view(holder=None).expired() is True
    assert LeaseView.parse(None).expired() is True
    assert view(date=None).expired() is None
    assert view(date=T0 + timedelta(seconds=1)).expired() is False


# ------------------------------------------------------------------ the next turn's reservation


def _claim(lock_id: str = "waiter", since: int = 100) -> dict[str, str]:
    return {A_NEXT: TurnClaim(since, lock_id, "w").dump()}


def test_reserved_left_s_of_a_held_lease_is_its_remaining_time_plus_the_grace() -> None:
    held = view(annotations=_claim(), date=T0 + timedelta(seconds=5))
    rem = held.remaining_s()
    assert rem is not None
    assert held.reserved_left_s() == pytest.approx(rem + HANDOFF_GRACE_S)
    assert view(annotations=_claim(), date=None).reserved_left_s() is None


def test_reserved_left_s_of_a_freed_lease_counts_the_grace_from_the_release_stamp() -> None:
    freed = view(holder=None, released_at=T0, annotations=_claim(), date=T0 + timedelta(seconds=1))
    assert freed.reserved_left_s() == pytest.approx(HANDOFF_GRACE_S - 1)
    late = view(holder=None, released_at=T0, annotations=_claim(), date=T0 + timedelta(seconds=10))
    assert late.reserved_left_s() == pytest.approx(HANDOFF_GRACE_S - 10)
    # no release stamp (only our own write), or no Date: nothing to count from
    assert view(holder=None, annotations=_claim(), date=T0).reserved_left_s() is None
    assert view(holder=None, released_at=T0, annotations=_claim(), date=None).reserved_left_s() is None


def test_a_freed_lease_is_reserved_to_the_last_instant_of_the_grace() -> None:
    at_edge = view(holder=None, released_at=T0, annotations=_claim(), date=T0 + timedelta(seconds=HANDOFF_GRACE_S))
    assert at_edge.reserved_left_s() == 0 and at_edge.claim_fresh()
    past = view(holder=None, released_at=T0, annotations=_claim(), date=T0 + timedelta(seconds=HANDOFF_GRACE_S + 1))
    assert not past.claim_fresh()


def test_binding_claim_is_the_longer_waiters_claim_while_fresh() -> None:
    live = view(annotations=_claim("waiter", 100), date=T0 + timedelta(seconds=1))
    claim = live.binding_claim("newcomer")
    assert claim is not None and claim.lock_id == "waiter" and claim.since == 100
    assert live.binding_claim("later", TurnClaim(101, "later")) == claim
    assert live.binding_claim("tied-later", TurnClaim(100, "zzz")) == claim  # ties go by lock id
    assert live.binding_claim("earlier", TurnClaim(99, "earlier")) is None
    assert live.binding_claim("tied-earlier", TurnClaim(100, "aaa")) is None
    assert live.binding_claim("waiter") is None  # one's own claim never binds oneself


def test_claim_ahead_of_a_freed_lease_is_known_without_a_date() -> None:
    """What a lease watch sees on a release: no server time, the earlier waiter's claim."""
    freed = view(holder=None, released_at=T0, annotations=_claim("waiter", 100), date=None)
    assert freed.binding_claim("later", TurnClaim(101, "later")) is None  # freshness unknown
    ahead = freed.claim_ahead("later", TurnClaim(101, "later"))
    assert ahead is not None and ahead.lock_id == "waiter"
    assert freed.claim_ahead("waiter", TurnClaim(100, "waiter")) is None  # our own
    assert freed.claim_ahead("earlier", TurnClaim(99, "earlier")) is None
    assert view(holder=None, released_at=T0, date=None).claim_ahead("me") is None  # no claim


def test_binding_claim_is_none_without_a_live_fresh_claim() -> None:
    # no claim, a malformed one, the holder's own (spent by holding), a stale one
    assert view(date=T0).binding_claim("me") is None
    assert view(annotations={A_NEXT: "{not json"}, date=T0).binding_claim("me") is None
    own = view(holder="alice/waiter", annotations=_claim("waiter"), date=T0)
    assert own.live_claim is None and own.binding_claim("me") is None
    margin = lapse_margin(30, 0.0)
    stale = view(annotations=_claim(), date=T0 + timedelta(seconds=30 + margin + HANDOFF_GRACE_S + 1))
    assert stale.live_claim is not None and stale.binding_claim("me") is None
    # no Date: freshness cannot be judged, so the claim does not bind
    assert view(annotations=_claim(), date=None).binding_claim("me") is None


def test_live_for_other_is_a_live_lease_someone_else_blocks() -> None:
    live = view(date=T0 + timedelta(seconds=1))
    assert live.live_for_other("me") and not live.live_for_other("other")
    assert not view(holder=None, date=T0).live_for_other("me")
    assert view(date=None).live_for_other("me")  # no evidence of a lapse: still live
    margin = lapse_margin(30, 0.0)
    assert not view(date=T0 + timedelta(seconds=30 + margin + 1)).live_for_other("me")


# ------------------------------------------------------------------ token history


def test_history_known_for_a_verified_lease_with_a_readable_token() -> None:
    assert history_known(view())
    assert history_known(view(holder=None))


def test_no_token_is_no_history() -> None:
    # coordinator writes a token (0 at first) on every lease it makes: one without it had
    # it removed, and what it held is unknown
    assert not history_known(view(token=None))


@pytest.mark.parametrize(
    "lease",
    [
        LeaseView.parse(None),  # missing
        view(annotations={A_VANISHED: "2026-12-01T12:00:00Z"}),  # a tombstone
        view(token="seven"),
        view(token="-2"),
        view(uid_note=None),  # not written by coordinator as this object
        view(uid_note="uid-of-the-original"),  # a copy of another object
    ],
    ids=["missing", "tombstone", "token-not-a-number", "token-negative", "no-uid-note", "copied"],
)
def test_history_unknown(lease: LeaseView) -> None:
    assert not history_known(lease)


def test_a_malformed_token_reads_as_zero_and_is_flagged() -> None:
    for raw in ("seven", "-2", "1e3", "9" * 5000):
        lease = view(token=raw)
        assert lease.token == 0 and lease.token_malformed, raw
    ok = view(token="12")
    assert ok.token == 12 and not ok.token_malformed


def test_token_taken_by_another_lock_id_at_or_above_the_token() -> None:
    lease = view(holder="alice/other", token="5")
    assert token_taken(lease, "me", 5) and token_taken(lease, "me", 4)
    assert not token_taken(lease, "me", 6)
    assert not token_taken(lease, "other", 5)  # our own lease keeps its token
    assert not token_taken(LeaseView.parse(None), "me", 1)


# ------------------------------------------------------------------ identity of the object


def test_verified_blocking_and_fingerprint() -> None:
    lease = view()
    assert lease.verified and lease.held and lease.blocking
    assert not view(uid_note="other").verified
    assert not LeaseView.parse(None).verified
    stone = view(holder=None, annotations={A_VANISHED: "x"})
    assert stone.blocking and not stone.held
    # the fingerprint ignores what other clients change, and sees our fields change
    relabelled = view()
    relabelled.obj["metadata"]["labels"] = {"team": "x"}
    assert relabelled.fingerprint == lease.fingerprint
    assert view(token="4").fingerprint != lease.fingerprint
    assert view(holder="alice/next").fingerprint != lease.fingerprint
    assert view(uid="uid-2", uid_note="uid-2").fingerprint != lease.fingerprint


def test_a_second_tombstone_with_the_same_floor_is_a_new_sighting() -> None:
    """A lease deleted twice, each time recorded as a tombstone carrying the same token
    floor: local observation of the second must not continue a sighting of the first (it
    would be judged lapsed at once while the holder it stands for may still hold the lock).
    The object's uid and the tombstone's own mark tell them apart, even stripped of every
    managedFields entry (no write stamps left to compare)."""
    first = view(holder=None, token="1", annotations={A_VANISHED: "2026-12-01T12:00:00Z"})
    second = {A_VANISHED: "2026-12-01T12:01:10Z"}
    again = view(holder=None, token="1", annotations=second, uid="uid-2", uid_note="uid-2")
    assert first.blocking and again.blocking and not again.held
    assert again.fingerprint != first.fingerprint
    # either difference alone is a new sighting
    same_uid = view(holder=None, token="1", annotations={A_VANISHED: "2026-12-01T12:01:10Z"})
    same_mark = view(holder=None, token="1", annotations={A_VANISHED: "2026-12-01T12:00:00Z"}, uid="uid-2",
                     uid_note="uid-2")  # fmt: skip
    assert same_uid.fingerprint != first.fingerprint and same_mark.fingerprint != first.fingerprint
    stripped = [view(holder=None, token="1", own_at=None, annotations=v.obj["metadata"]["annotations"], uid=v.uid,
                     uid_note=v.uid) for v in (first, again)]  # fmt: skip
    assert stripped[0].own_write is None and stripped[0].fingerprint != stripped[1].fingerprint


def test_effective_ttl_method_is_the_rule_of_the_lease_it_is_called_on() -> None:
    own = view(ttl=30)
    assert own.effective_ttl(600) == effective_ttl(own, 600) == 30
    stone = view(holder=None, annotations={A_VANISHED: "x"})
    assert stone.effective_ttl(600) == 600
    # a duration our field manager did not set is not believed: the maximum TTL applies
    foreign = view(ttl=30)
    foreign.obj["metadata"]["managedFields"][0]["fieldsV1"] = {"f:spec": {"f:holderIdentity": {}}}
    reparsed = LeaseView.parse(foreign.obj)
    assert not reparsed.ttl_owned and reparsed.effective_ttl(600) == 600


def test_a_lease_shown_expired_is_past_every_margin_a_takeover_may_need() -> None:
    from coordinator.rules.lease import shown_expired

    # A 10 s lease written at T0 by a server 5 s behind the one whose Date answers: the
    # Date says T0 + 20.5 s at a true 15.5 s. A takeover with --max-server-skew 5s needs
    # TTL + 1 % + 2 s + 5 s by a probe stamp, which may come from the slow server: 22.1 s
    # of its time, a true 27.1 s at worst. Shown expired only past three skews by the Date.
    at = view(ttl=10, date=T0 + timedelta(seconds=20.5))
    assert at.expired(60) is True  # by the Date with no skew margin (what status used)
    assert shown_expired(at, 60, 5.0) is False
    assert shown_expired(view(ttl=10, date=T0 + timedelta(seconds=27.0)), 60, 5.0) is False
    assert shown_expired(view(ttl=10, date=T0 + timedelta(seconds=27.2)), 60, 5.0) is True
