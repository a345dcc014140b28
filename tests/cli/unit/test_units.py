"""Parsing and local-file behaviour that needs no cluster."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from served import served

from coordinator.config.models import ClusterRecord
from coordinator.config.store import ConfigStore
from coordinator.engine.state import (
    ENVELOPE_LIMIT,
    changed_keys,
    check_size,
    checksum,
    decode_replica,
    get_path,
    set_path,
)
from coordinator.errors import ConfigError, UsageError
from coordinator.rules.durations import format_duration, parse_duration
from coordinator.rules.lease import A_NEXT, HANDOFF_GRACE_S, LeaseView, TurnClaim


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("3m", 180), ("1h", 3600), ("1m30s", 90), ("45", 45), ("0", 0), ("2.5s", 2.5), ("250ms", 0.25)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "3x", "-5", "5s3", "m", "1h-2m", "nan", "inf"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(text, what="--ttl")


def test_format_duration() -> None:
    assert format_duration(130.4) == "2m10s"
    assert format_duration(3.25) == "3.2s"
    assert format_duration(7322) == "2h02m02s"


def _record(name: str, identity: str) -> ClusterRecord:
    return ClusterRecord(name=name, context=f"ctx-{name}", identity=identity, identity_source="kube-system-uid")


def test_config_round_trip_and_atomic_file(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "cfg.yaml")
    with store.edit() as cfg:
        cfg.clusters["a"] = _record("a", "uid-a")
    assert store.load().clusters["a"].identity == "uid-a"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("clusters: [unclosed", "not valid YAML at line"),
        ("- a\n- b\n", "mapping at the top level"),
        ("clusters:\n  a:\n    name: a\n", "clusters.a.context"),
        ("version: 99\n", "version"),
        ("clusters: {}\nbogus: 1\n", "bogus"),
    ],
)
def test_bad_config_is_reported_and_never_overwritten(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(content)
    store = ConfigStore(path)
    with pytest.raises(ConfigError) as err:
        with store.edit() as cfg:
            cfg.clusters["x"] = _record("x", "uid-x")
    assert needle in err.value.message
    assert str(path) in err.value.message
    assert path.read_text() == content


def test_concurrent_edits_lose_nothing(tmp_path: Path) -> None:
    store_path = tmp_path / "cfg.yaml"

    def add(i: int) -> None:
        with ConfigStore(store_path).edit() as cfg:
            cfg.clusters[f"c{i}"] = _record(f"c{i}", f"uid-{i}")

    threads = [threading.Thread(target=add, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ConfigStore(store_path).load().clusters) == sorted(f"c{i}" for i in range(12))


def test_dotted_keys() -> None:
    data: dict[str, object] = {}
    set_path(data, "app.version", "1.2")
    set_path(data, "replicas", 3)
    assert get_path(data, "app.version") == "1.2"
    assert get_path(data, "app") == {"version": "1.2"}
    with pytest.raises(UsageError):
        get_path(data, "app.missing")
    with pytest.raises(UsageError):
        set_path(data, "replicas.x", 1)
    with pytest.raises(UsageError):
        set_path(data, "a..b", 1)
    assert changed_keys({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4}) == ["a.c", "d"]


def _envelope_text(payload: dict[str, object], **over: object) -> str:
    data = payload
    doc = {
        "schema": 2,
        "version": 3,
        "token": 2,
        "write_id": "w1",
        "checksum": checksum(data),
        "written_by": "me",
        "written_at": "2026-11-30T08:00:00Z",
        "members": ["a"],
        "data": data,
        "history": [],
    }
    doc.update(over)
    return json.dumps(doc)


def test_decode_replica_classifies_garbage() -> None:
    good = decode_replica("a", served({"data": {"envelope.json": _envelope_text({"x": 1})}}), "configmap")
    assert good.envelope is not None and good.envelope.order() == (2, 3)
    assert decode_replica("a", served({"data": {"envelope.json": "{not json"}}), "configmap").corrupt
    assert "checksum" in (
        decode_replica(
            "a", served({"data": {"envelope.json": _envelope_text({"x": 1}, data={"x": 2})}}), "configmap"
        ).corrupt
        or ""
    )
    assert decode_replica("a", served({"data": {"envelope.json": '{"version": 1}'}}), "configmap").corrupt
    assert decode_replica("a", served({"data": {}}), "configmap").corrupt
    newer = decode_replica("a", served({"data": {"envelope.json": _envelope_text({}, schema=7)}}), "configmap")
    assert newer.newer_schema == 7 and newer.envelope is None
    assert not decode_replica("a", None, "configmap").exists


def test_size_limit() -> None:
    check_size("x" * 1000, "configmap")
    with pytest.raises(UsageError) as err:
        check_size("x" * (ENVELOPE_LIMIT + 1), "configmap")
    assert f"{ENVELOPE_LIMIT:,}" in err.value.message
    with pytest.raises(UsageError):
        check_size("x" * (ENVELOPE_LIMIT - 10), "secret")  # base64 grows it by a third


# ------------------------------------------------------------------ next-turn claims


def _lease_view(*, holder: str | None, claim: str | None, written_s_ago: float, ttl: int = 10) -> LeaseView:
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    written = now - timedelta(seconds=written_s_ago)
    ann = {A_NEXT: claim} if claim is not None else {}
    spec: dict[str, object] = {"leaseDurationSeconds": ttl, "holderIdentity": holder or ""}
    entries: list[dict[str, object]] = [
        {
            # a free lease was last written by its holder's release
            "manager": "coordinator" if holder else "coordinator-release",
            "time": written.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "fieldsV1": {"f:spec": {"f:leaseDurationSeconds": {}, "f:holderIdentity": {}}},
        }
    ]
    if claim is not None:  # a waiter's claim, under the line's own field manager
        owned = {"f:metadata": {"f:annotations": {"f:" + A_NEXT: {}}}}
        entries.append({"manager": "coordinator-line", "fieldsV1": owned})
    obj = {"metadata": {"annotations": ann, "resourceVersion": "7", "managedFields": entries}, "spec": spec}
    return LeaseView.parse(obj, now)


def test_turn_claims_order_by_wait_start_then_lock_id() -> None:
    a, b, c = TurnClaim(100, "bbbb"), TurnClaim(100, "aaaa"), TurnClaim(99, "zzzz", "x")
    assert sorted([a, b, c]) == [c, b, a]
    assert TurnClaim.parse(c.dump()) == c and TurnClaim.parse(c.dump()).holder == "x"  # type: ignore[union-attr]
    for junk in ("", "{", "[]", '{"since": "soon", "lock": "a"}', '{"lock": "a"}', None, 5):
        assert TurnClaim.parse(junk) is None


def test_claim_binds_while_live_and_for_the_grace_after_release() -> None:
    claim = TurnClaim(1, "waiter", "w").dump()
    held = _lease_view(holder="other", claim=claim, written_s_ago=1)
    assert held.live_for_other("me") and held.claim_fresh()
    just_freed = _lease_view(holder=None, claim=claim, written_s_ago=1)
    assert just_freed.reserved_for_other("me") and not just_freed.reserved_for_other("waiter")
    long_freed = _lease_view(holder=None, claim=claim, written_s_ago=HANDOFF_GRACE_S + 1)
    assert not long_freed.reserved_for_other("me")
    # expired lease: the claimant's priority lasts the grace past the expiry
    expired = _lease_view(holder="gone", claim=claim, written_s_ago=13, ttl=10)
    assert expired.expired() and expired.reserved_for_other("me")
    long_expired = _lease_view(holder="gone", claim=claim, written_s_ago=30, ttl=10)
    assert not long_expired.reserved_for_other("me")
    # the holder's own claim is spent: it reserves nothing
    own = _lease_view(holder="waiter", claim=claim, written_s_ago=30, ttl=10)
    assert own.live_claim is None and not own.reserved_for_other("me")
    # a malformed claim is ignored
    assert not _lease_view(holder=None, claim="nonsense", written_s_ago=0).reserved_for_other("me")


def test_a_claim_binds_only_later_waiters() -> None:
    claim = TurnClaim(100, "claimant", "c")
    freed = _lease_view(holder=None, claim=claim.dump(), written_s_ago=0)
    assert freed.reserved_for_other("newcomer")  # has not waited at all
    assert freed.reserved_for_other("later", TurnClaim(101, "later"))
    assert not freed.reserved_for_other("earlier", TurnClaim(99, "earlier"))
    assert freed.reserved_for_other("tie", TurnClaim(100, "zzz")) and not freed.reserved_for_other(
        "tie", TurnClaim(100, "aaa")
    )


def test_a_failed_attempt_giving_back_a_lease_does_not_extend_the_reservation() -> None:
    from datetime import timedelta

    claim = TurnClaim(100, "claimant", "c")
    freed = _lease_view(holder=None, claim=claim.dump(), written_s_ago=HANDOFF_GRACE_S + 1)
    assert not freed.reserved_for_other("newcomer")
    # the claimant took it and gave it back (a write of the coordinator manager) just now
    assert freed.server_now is not None
    freed.obj["metadata"]["managedFields"].append(
        {"manager": "coordinator", "time": (freed.server_now - timedelta(seconds=0.5)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    )
    again = LeaseView.parse(freed.obj, freed.server_now)
    assert not again.reserved_for_other("newcomer")


def test_the_installed_package_holds_no_test_tools() -> None:
    """The fault harness lives under tests/faults: the wheel (every package setuptools
    finds under the configured include) holds only what a user runs."""
    import importlib.util

    import setuptools

    root = Path(__file__).resolve().parents[3]
    found = setuptools.find_packages(where=str(root), include=["coordinator*"])
    assert "coordinator" in found and "coordinator.kube" in found
    assert not [p for p in found if "test" in p or "fault" in p], found
    assert importlib.util.find_spec("coordinator.testing") is None
    assert importlib.util.find_spec("faults.run") is not None  # the harness, from tests/
