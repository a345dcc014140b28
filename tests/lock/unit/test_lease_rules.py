"""The pure lease rules (coordinator/rules/lease.py), case by case, with made-up server stamps.

No cluster here: every time is an argument. The same rules are exercised against real
API servers in tests/lock/integration/test_lock_hardening.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from coordinator.rules.lease import (
    A_LAST_BREAK,
    A_TOKEN,
    A_UID,
    A_VANISHED,
    LINE_MANAGER,
    PROBE_MANAGER,
    LeaseView,
    RenewVerdict,
    Standing,
    effective_ttl,
    history_known,
    lapse_margin,
    lapsed_by_observation,
    lapsed_by_stamps,
    next_token,
    observe,
    renew_verdict,
    standing,
    token_taken,
)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
MAX_TTL = 600.0


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def lease(
    *,
    holder: str | None = "other",
    ttl: int = 30,
    own_at: datetime | None = T0,
    own_ttl: bool = True,
    others: dict[str, datetime] | None = None,
    annotations: dict[str, str] | None = None,
    date: datetime | None = None,
    token: int = 3,
    uid: str = "uid-1",
    uid_note: str | None = "uid-1",
    created: datetime = T0 - timedelta(days=3),
) -> LeaseView:
    fields: list[dict[str, Any]] = []
    if own_at is not None:
        owned: dict[str, Any] = {"f:holderIdentity": {}, "f:renewTime": {}}
        if own_ttl:
            owned["f:leaseDurationSeconds"] = {}
        # coordinator writes the token and the uid note with every take and renewal
        notes = {"f:" + A_TOKEN: {}, **({"f:" + A_UID: {}} if uid_note is not None else {})}
        fields.append(
            {
                "manager": "coordinator",
                "operation": "Update",
                "time": _stamp(own_at),
                "fieldsV1": {"f:spec": owned, "f:metadata": {"f:annotations": notes}},
            }
        )
    if annotations:  # written by coordinator, as the engine does (see _annotated for others')
        fields.append(
            {
                "manager": "coordinator",
                "operation": "Update",
                "time": _stamp(own_at or T0),
                "fieldsV1": {"f:metadata": {"f:annotations": {"f:" + k: {} for k in annotations}}},
            }
        )
    for manager, when in (others or {}).items():
        fields.append(
            {
                "manager": manager,
                "operation": "Update",
                "time": _stamp(when),
                "fieldsV1": {"f:metadata": {"f:labels": {}}},
            }
        )
    spec: dict[str, Any] = {"leaseDurationSeconds": ttl, "renewTime": "2026-12-01T12:00:00.000000Z"}
    spec["holderIdentity"] = holder or ""  # a release leaves it empty, owned
    obj = {
        "metadata": {
            "name": "coordinator-lock-web",
            "resourceVersion": "10",
            "uid": uid,
            "creationTimestamp": _stamp(created),
            "annotations": {
                A_TOKEN: str(token),
                **({A_UID: uid_note} if uid_note is not None else {}),
                **(annotations or {}),
            },
            "managedFields": fields,
        },
        "spec": spec,
    }
    return LeaseView.parse(obj, date)


def stand(view: LeaseView, **kw: Any) -> Standing:
    kw.setdefault("max_ttl_s", MAX_TTL)
    kw.setdefault("max_server_skew_s", 5.0)
    return standing(view, "me", **kw)


# -- evidence is our own field manager's, and only a server stamp after the read proves a lapse


def test_a_held_lease_is_taken_only_with_a_later_server_stamp_past_ttl_and_margin() -> None:
    view = lease(date=T0 + timedelta(seconds=300))  # the Date says long expired
    assert stand(view) is Standing.PROBE  # ... which only earns a probe, not a take
    margin = lapse_margin(30, 5.0)
    assert stand(view, stamp=T0 + timedelta(seconds=30 + margin - 0.5)) is Standing.HELD
    assert stand(view, stamp=T0 + timedelta(seconds=30 + margin + 0.5)) is Standing.LAPSED


def test_a_date_from_a_clock_ahead_never_takes_a_live_lease() -> None:
    # A TLS-terminating proxy 90 s ahead stamps the Date; the probe's stamp comes from
    # the API server and shows the lease 3 s old.
    view = lease(date=T0 + timedelta(seconds=93))
    assert stand(view) is Standing.PROBE
    assert stand(view, stamp=T0 + timedelta(seconds=3)) is Standing.HELD


def test_an_untrusted_date_always_asks_for_a_probe() -> None:
    view = lease(date=T0 + timedelta(seconds=1))
    assert stand(view) is Standing.HELD
    assert stand(view, date_trusted=False) is Standing.PROBE


def test_server_skew_is_part_of_the_margin() -> None:
    view = lease()
    at = T0 + timedelta(seconds=30 + lapse_margin(30, 0.0) + 1)
    assert lapsed_by_stamps(view, at, max_ttl_s=MAX_TTL, max_server_skew_s=0.0)
    assert not lapsed_by_stamps(view, at, max_ttl_s=MAX_TTL, max_server_skew_s=5.0)


def test_edits_by_other_managers_neither_renew_nor_expire() -> None:
    # A labeler writes every few seconds: its times are newer, ours stays the evidence.
    busy = lease(others={"labeler": T0 + timedelta(seconds=100), LINE_MANAGER: T0 + timedelta(seconds=99)})
    assert busy.own_write == T0
    assert stand(busy, stamp=T0 + timedelta(seconds=60)) is Standing.LAPSED
    # ... and a young lease stays held whatever they wrote
    assert stand(busy, stamp=T0 + timedelta(seconds=5)) is Standing.HELD


def test_stripped_managed_fields_give_no_evidence_never_the_creation_time() -> None:
    stripped = lease(own_at=None, date=T0 + timedelta(days=1))
    assert stripped.own_write is None
    # Neither a very late Date nor a probe stamp can prove a lapse without our entry. (Its
    # uid note has no known writer either, so it may be a copy: a probe asks the server's
    # time to tell whether it is young; an old one then waits for local observation.)
    assert stand(stripped) is Standing.PROBE
    assert stand(stripped, stamp=T0 + timedelta(days=1)) is Standing.HELD
    assert stand(stripped, stamp=T0 + timedelta(days=1), observed_lapse=True) is Standing.LAPSED


def test_local_observation_needs_our_fields_unchanged_for_a_whole_ttl() -> None:
    view = lease(own_at=None, ttl=30)
    seen = observe(None, view, now=100.0)
    wait = 30 + lapse_margin(30, 5.0)
    assert not lapsed_by_observation(seen, view, 100.0 + wait - 1, max_ttl_s=MAX_TTL, max_server_skew_s=5.0)
    # a foreign annotation changes the resourceVersion, not our fields: the sighting stands
    relabeled = lease(own_at=None, ttl=30, annotations={"team": "x"})
    assert observe(seen, relabeled, now=150.0) is seen
    # the ttl was not set by us (no entry): the deployment's maximum applies
    assert not lapsed_by_observation(seen, view, 100.0 + wait + 1, max_ttl_s=MAX_TTL, max_server_skew_s=5.0)
    own_ttl_wait = MAX_TTL + lapse_margin(MAX_TTL, 5.0)
    assert lapsed_by_observation(seen, view, 100.0 + own_ttl_wait + 1, max_ttl_s=MAX_TTL, max_server_skew_s=5.0)


def test_observation_watches_only_fields_the_lock_rules_read() -> None:
    view = lease(own_at=None, ttl=30)
    seen = observe(None, view, now=100.0)
    wait = MAX_TTL + lapse_margin(MAX_TTL, 5.0)
    # another client changes the duration (not believed without our entry) and annotations:
    # the sighting stands, and the lease lapses a maximum TTL after it was first seen
    edited = lease(own_at=None, ttl=4, annotations={"team.example.com/seen": "7"})
    assert edited.fingerprint == view.fingerprint
    assert observe(seen, edited, now=150.0) is seen
    assert lapsed_by_observation(seen, edited, 100.0 + wait + 1, max_ttl_s=MAX_TTL, max_server_skew_s=5.0)
    # a take or renewal (holder, token, renewal time) starts a new sighting
    for moved in (lease(own_at=None, holder="next"), lease(own_at=None, token=4)):
        assert observe(seen, moved, now=150.0) is not seen
    # a renewal (our renewTime moved) restarts it
    renewed = LeaseView.parse({**view.obj, "spec": {**view.obj["spec"], "renewTime": "2026-12-01T12:00:09Z"}})
    again = observe(seen, renewed, now=160.0)
    assert again is not seen and again.since == 160.0


def test_a_duration_written_by_someone_else_is_not_believed() -> None:
    shortened = lease(ttl=1, own_ttl=False)
    assert effective_ttl(shortened, MAX_TTL) == MAX_TTL
    assert stand(shortened, stamp=T0 + timedelta(seconds=60)) is Standing.HELD
    assert effective_ttl(lease(ttl=30), MAX_TTL) == 30


# -- missing leases and tombstones


def test_a_missing_lease_is_never_free() -> None:
    assert stand(LeaseView.parse(None)) is Standing.MISSING


def test_a_tombstone_blocks_for_the_maximum_ttl() -> None:
    stone = lease(holder=None, annotations={A_VANISHED: "2026-12-01T12:00:00Z"}, token=0)
    assert stone.blocking and not stone.held
    assert stand(stone, stamp=T0 + timedelta(seconds=100)) is Standing.HELD
    late = T0 + timedelta(seconds=MAX_TTL + lapse_margin(MAX_TTL, 5.0) + 1)
    assert stand(stone, stamp=late) is Standing.LAPSED
    # a tombstone recorded with a longer maximum by another coordinator keeps it
    longer = lease(holder=None, annotations={A_VANISHED: "x", "coordinator.io/max-ttl": "3600"}, token=0)
    assert stand(longer, stamp=late) is Standing.HELD
    # one that no coordinator wrote is no evidence: nobody (stripped from the entry)...
    note = {"f:metadata": {"f:annotations": {"f:coordinator.io/max-ttl": {}}}}
    managed = longer.obj["metadata"]["managedFields"]
    managed[-1]["fieldsV1"]["f:metadata"]["f:annotations"].pop("f:coordinator.io/max-ttl")
    assert stand(LeaseView.parse(longer.obj), stamp=late) is Standing.LAPSED
    # ...or someone else (kubectl annotate)
    managed.append({"manager": "kubectl-annotate", "operation": "Update", "fieldsV1": note})
    assert stand(LeaseView.parse(longer.obj), stamp=late) is Standing.LAPSED


def test_tokens_go_above_the_leases_and_the_state_objects_floors() -> None:
    intact = [lease(token=5), lease(token=4), lease(token=2)]
    assert next_token(intact, [0, 3], proven=True) == 6
    assert next_token(intact, [9, 3], proven=True) == 10  # a floor above every lease
    assert next_token(intact, [], proven=True) == 6
    assert next_token(intact, [3, 3], proven=False) is None
    # every lease deleted: only the state can tell
    gone = [LeaseView.parse(None)] * 3
    assert next_token(gone, [3, 3], proven=True) == 4


def test_history_is_a_coordinator_token_on_this_very_object() -> None:
    assert history_known(lease(token=3))
    stone = lease(holder=None, annotations={A_VANISHED: "x"}, token=1)
    assert not history_known(stone) and not history_known(LeaseView.parse(None))


def _annotated(view: LeaseView, key: str, value: str, manager: str = "kubectl-annotate") -> LeaseView:
    """``view`` after another client wrote annotation ``key`` (it takes the field over)."""
    obj = view.obj
    obj["metadata"]["annotations"][key] = value
    for entry in obj["metadata"]["managedFields"]:
        ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations", {}).pop("f:" + key, None)
    owned = {"f:metadata": {"f:annotations": {"f:" + key: {}}}}
    obj["metadata"]["managedFields"].append(
        {"manager": manager, "operation": "Update", "time": _stamp(T0), "fieldsV1": owned}
    )
    return LeaseView.parse(obj)


def test_a_token_another_client_wrote_is_neither_history_nor_a_bound() -> None:
    # `kubectl annotate --overwrite ... fencing-token=0` after tokens 1..3 were granted
    lowered = _annotated(lease(token=3), A_TOKEN, "0")
    assert lowered.token == 0 and not history_known(lowered)
    assert not token_taken(_annotated(lease(token=3), A_TOKEN, "99"), "me", 4)  # no racing attempt's
    # one such lease of three: the two others are a majority with history
    views = [lowered, lease(token=3), lease(token=2)]
    assert next_token(views, [], proven=True) == 4
    # on every member: the leases say nothing, the state objects' floors still say 3
    assert next_token([lowered] * 3, [3, 3], proven=True) == 4


def test_an_unreadable_token_is_not_history() -> None:
    bad = lease(token=0)
    bad.obj["metadata"]["annotations"][A_TOKEN] = "lots"
    view = LeaseView.parse(bad.obj)
    assert view.token_malformed and not history_known(view)


# -- renewal


def test_a_renewal_renews_only_its_own_lease_and_a_break_or_another_id_is_loss() -> None:
    assert renew_verdict(lease(holder="me"), "me") is RenewVerdict.RENEW
    assert renew_verdict(lease(holder="other"), "me") is RenewVerdict.TAKEN
    broken = lease(holder=None, annotations={A_LAST_BREAK: '{"by": "ops", "previous_lock_id": "me"}'})
    assert renew_verdict(broken, "me") is RenewVerdict.BROKEN
    other_break = lease(holder=None, annotations={A_LAST_BREAK: '{"by": "ops", "previous_lock_id": "zz"}'})
    assert renew_verdict(other_break, "me") is RenewVerdict.GONE
    assert renew_verdict(LeaseView.parse(None), "me") is RenewVerdict.GONE


def test_probe_and_line_managers_are_not_our_writes() -> None:
    view = lease(others={PROBE_MANAGER: T0 + timedelta(seconds=50), LINE_MANAGER: T0 + timedelta(seconds=40)})
    assert view.own_write == T0


# -- a lease recreated from a copy (a backup restored, a manifest re-applied)


def test_a_recreated_copy_blocks_for_a_max_ttl_after_its_creation_and_has_no_history() -> None:
    # the copy of a free lease, recreated on the server a few seconds ago
    copy = lease(holder=None, uid="uid-2", uid_note="uid-1", created=T0, date=T0 + timedelta(seconds=3))
    assert not copy.verified
    assert stand(copy) is Standing.HELD  # young by the Date hint: wait
    assert stand(copy, stamp=T0 + timedelta(seconds=30)) is Standing.HELD
    late = T0 + timedelta(seconds=MAX_TTL + lapse_margin(MAX_TTL, 5.0) + 1)
    assert stand(copy, stamp=late) is Standing.FREE
    # its token is not history
    assert not history_known(copy)


def test_an_old_unverified_lease_needs_a_probe_then_counts_as_free() -> None:
    legacy = lease(holder=None, uid_note=None, date=T0)  # created three days ago, no uid note
    assert stand(legacy) is Standing.PROBE  # the hint says old; only a stamp may prove it
    assert stand(legacy, stamp=T0) is Standing.FREE


def test_holder_identity_names_the_holder_and_keeps_the_lock_id_unambiguous() -> None:
    from coordinator.rules.lease import holder_identity, lock_id_of

    assert holder_identity("alice@laptop", "3f2a") == "alice@laptop/3f2a"
    assert lock_id_of(holder_identity("org/repo#12 job", "3f2a")) == "3f2a"
    assert lock_id_of(holder_identity("evil\x1b]0;x\x07\nname", "3f2a")) == "3f2a"
    assert "\x1b" not in holder_identity("evil\x1b]0;x\x07\nname", "3f2a")
    assert lock_id_of("3f2a") == "3f2a"  # written before holder names, or by other tools
    assert lock_id_of("") is None and lock_id_of(None) is None
    view = lease(holder="bob@ci/77aa")
    assert view.lock_id == "77aa"
