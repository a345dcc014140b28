"""Text from the clusters that someone who may write a Lease or ConfigMap in the namespace
(or a proxy) controls, read without a server: turn claims, nested annotations, max-ttl
notes, pids, history events, corrupt replicas, identities, key paths and Retry-After. A
reader drops what it cannot read and never raises; errors carry no forged line.

Found in the third security adversary round (docs/regressions.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.hostile import FORGED, TITLE, clean
from served import served

from coordinator.kube.client import KubeError

integration = pytest.mark.integration


# ================================================================== pure: parsers of cluster text
#
# Everything below is text someone who may write a Lease or ConfigMap in the namespace
# (or a proxy) controls. A reader must drop what it cannot read, never raise.


def _lease(ann: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "coordinator-lock-zzz", "annotations": ann}, "spec": {}}


@pytest.mark.parametrize("since", ["1e999", "Infinity", "-Infinity", "NaN", "1e20", "-1"])
def test_a_turn_claim_with_an_infinite_since_is_dropped(since: str) -> None:
    from coordinator.rules.lease import LeaseView

    view = LeaseView.parse(_lease({"coordinator.io/next": f'{{"since":{since},"lock":"x"}}'}))
    assert view.next_claim is None


@pytest.mark.parametrize(
    "annotation", ["coordinator.io/next", "coordinator.io/last-break", "coordinator.io/membership"]
)
def test_deeply_nested_annotations_are_dropped(annotation: str) -> None:
    from coordinator.rules.lease import LeaseView
    from coordinator.rules.membership import in_lease_object

    obj = _lease({annotation: "[" * 5000})
    view = LeaseView.parse(obj)
    assert view.next_claim is None and view.break_note is None
    if annotation == "coordinator.io/membership":
        assert in_lease_object(obj) is None  # unreadable: stores nothing (absent, it would be a legacy lease)


def test_the_fleet_view_is_too_few_listed_below_a_majority_of_the_connected_clusters() -> None:
    from coordinator.ops.fleet import Fleet

    assert not Fleet([], {}).too_few_listed
    assert not Fleet([], {"a": "ok", "b": "ok", "c": "unreachable: x"}).too_few_listed
    assert Fleet([], {"a": "ok", "b": "unreachable: x", "c": "forbidden: y"}).too_few_listed
    assert Fleet([], {"a": "ok", "b": "ok", "c": "x", "d": "y"}).too_few_listed


def test_a_fleet_view_of_unreachable_clusters_prints_and_exits_4(tmp_path: Path) -> None:
    """Found: with no cluster listed (a planted lease made every LIST fail), the fleet view
    exited 0. Now, as `lock status DEP`: the view is printed, and fewer than a majority of
    the connected clusters listed is exit 4."""
    import socket

    import yaml

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]  # bound, never listening: connections are refused
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: p, cluster: {{server: "http://127.0.0.1:{port}"}}}}]\n'
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: p, context: {cluster: p, user: u}}]\ncurrent-context: p\n"
    )
    record = {"context": "p", "kubeconfig": str(kubeconfig), "identity_source": "kube-system-uid"}
    config = tmp_path / "config.yaml"
    clusters = {f"c{i}": {"name": f"c{i}", "identity": f"id-{i}", **record} for i in (1, 2, 3)}
    config.write_text(yaml.safe_dump({"version": 1, "clusters": clusters}))
    env = dict(os.environ, COORDINATOR_CONFIG=str(config), NO_COLOR="1")
    try:
        for fmt in ("json", "table"):
            proc = subprocess.run(
                [sys.executable, "-m", "coordinator", "--timeout", "2s", "-o", fmt, "lock", "status", "--all"],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert proc.returncode == 4, proc.stderr
            assert "Only 0 of 3 connected clusters could be listed" in proc.stderr, proc.stderr
            if fmt == "json":
                assert [c["listed"] for c in json.loads(proc.stdout)["clusters"]] == [False, False, False]
            else:
                assert "Could not list: c1" in proc.stdout, proc.stdout
    finally:
        closed.close()


def _written_by(manager: str, ann: dict[str, str]) -> dict[str, Any]:
    """A lease whose annotations ``manager`` owns (as managedFields records it)."""
    obj = _lease(ann)
    owned = {f"f:{k}": {} for k in ann}
    obj["metadata"]["managedFields"] = [
        {"manager": manager, "operation": "Update", "fieldsV1": {"f:metadata": {"f:annotations": owned}}}
    ]
    return obj


@pytest.mark.parametrize("manager", ["coordinator", "kubectl-edit"])
def test_a_max_ttl_note_too_big_for_a_float_is_not_a_crash(manager: str) -> None:
    from coordinator.rules.lease import LeaseView, effective_ttl

    for ann in ({"coordinator.io/max-ttl": "9" * 400}, {"coordinator.io/max-ttl": "9" * 5000}):
        view = LeaseView.parse(_lease(ann))
        assert effective_ttl(view, 600) == 600
        view = LeaseView.parse(_written_by(manager, ann))
        assert effective_ttl(view, 600) == 600


def test_a_max_ttl_note_is_believed_only_when_a_coordinator_wrote_it() -> None:
    """Found: `kubectl annotate lease ... coordinator.io/max-ttl=100000000` kept a dead
    holder's lock for years (the larger of the record's maximum and the note was waited
    out). Now a note counts only where a coordinator field manager owns it."""
    from coordinator.rules.lease import LeaseView, effective_ttl

    note = {"coordinator.io/max-ttl": "3600"}
    for manager, believed in (("coordinator", True), ("coordinator-line", True), ("kubectl-edit", False)):
        view = LeaseView.parse(_written_by(manager, note))
        assert (view.max_ttl_note == 3600) is believed, manager
        assert effective_ttl(view, 600) == (3600 if believed else 600), manager
    assert LeaseView.parse(_lease(note)).max_ttl_note is None  # managedFields stripped: no evidence


@pytest.mark.parametrize("since", [10**20, -(10**20)])
def test_a_claim_from_the_far_future_prints_as_json(since: int) -> None:
    from coordinator.cli.lock import claim_document
    from coordinator.rules.lease import TurnClaim

    doc = claim_document(TurnClaim(since, "x"))
    json.dumps(doc, default=str)
    assert doc is not None and doc["waiting_since"] is None


@pytest.mark.parametrize("pid", ["²", "٣", "9" * 5000, "-1", " 1"])
def test_a_pid_annotation_of_odd_digits_is_no_pid(pid: str) -> None:
    from coordinator.cli.lockview import pid_field as _pid
    from coordinator.ops.fleet import Fleet, FleetEntry, fleet_document

    assert _pid({"pid": pid}) is None
    entry = FleetEntry("web", "ns", True, ["c1"], 1, "held", pid=pid)
    assert fleet_document(Fleet([entry], {"c1": "ok"}), lambda c: c)["deployments"][0]["pid"] is None
    assert _pid({"pid": "4242"}) == 4242


def _history_copy(events: list[dict[str, Any]], manager: str = "coordinator") -> dict[str, Any]:
    fields = {"f:data": {".": {}, "f:history.json": {}}}
    return {
        "metadata": {"managedFields": [{"manager": manager, "operation": "Update", "fieldsV1": fields}]},
        "data": {"history.json": json.dumps(events)},
    }


@pytest.mark.parametrize("at", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"])
def test_a_history_event_dated_past_the_calendar_is_dropped_not_the_whole_copy(at: str) -> None:
    from coordinator.engine import history

    good = {"lock_id": "aaaa", "event": "acquired", "at": "2026-01-01T00:00:00Z"}
    bad = {"lock_id": "bbbb", "event": "acquired", "at": at}
    assert [e["lock_id"] for e in history.decode(_history_copy([good, bad]))] == ["aaaa"]
    assert [e["lock_id"] for e in history.merge([good, bad])] == ["aaaa"]


def test_history_events_dated_in_the_future_are_dropped_and_cannot_evict_real_ones() -> None:
    from datetime import UTC, datetime, timedelta

    from coordinator.engine import history
    from coordinator.rules.resources import micro_time

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    real = [history.event("acquired", f"real{i}", at=micro_time(now - timedelta(minutes=i))) for i in range(5)]
    skewed = history.event("acquired", "skewed", at=micro_time(now + timedelta(minutes=10)))  # a clock ahead
    forged = [history.event("acquired", f"forged{i}", at="9000-01-01T00:00:00Z") for i in range(100)]
    kept = history.decode(_history_copy([*real, skewed, *forged]), now=now)
    assert sorted(e["lock_id"] for e in kept) == sorted([*(f"real{i}" for i in range(5)), "skewed"])


@pytest.mark.parametrize("manager", ["kubectl-create", "kubectl-edit", ""])
def test_a_history_copy_no_coordinator_wrote_is_not_read(manager: str) -> None:
    from coordinator.engine import history

    events = [{"lock_id": "aaaa", "event": "acquired", "at": "2026-01-01T00:00:00Z"}]
    assert [e["lock_id"] for e in history.decode(_history_copy(events, "coordinator"))] == ["aaaa"]
    assert history.decode(_history_copy(events, manager)) == []
    assert history.decode({"data": {"history.json": json.dumps(events)}}) == []  # managedFields stripped


def test_a_corrupt_replica_reason_is_one_line() -> None:
    """The reason why a replica is corrupt names a key of the planted envelope; it is put
    into error paragraphs whose own lines are kept."""
    from coordinator.engine.register import checksum, decode_replica, genesis_text

    env = json.loads(genesis_text("web"))
    env.update(version=5, token=1, data={}, checksum=checksum({}), member_ids={f"x\n{FORGED}": 1})
    rep = decode_replica("c1", served({"data": {"envelope.json": json.dumps(env)}}), "configmap", deployment="web")
    assert rep.corrupt is not None and "\n" not in rep.corrupt, rep.corrupt


def test_a_backup_with_a_planted_key_cannot_forge_a_line_of_the_restore_error(tmp_path: Path) -> None:
    """`state restore -f` of a file whose envelope names a member `x\\nError: forged line`:
    the refusal (exit 2, before any cluster is asked) says why on one line."""
    from coordinator.engine.register import checksum, genesis_text

    env = json.loads(genesis_text("web"))
    env.update(version=5, token=1, data={}, checksum=checksum({}), member_ids={f"x\n{FORGED}{TITLE}": 1})
    backup = tmp_path / "backup.json"
    backup.write_text(json.dumps(env))
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "state", "restore", "web", "-f", str(backup)],
        env=dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "config.yaml"), NO_COLOR="1"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "not a valid state envelope" in proc.stderr
    clean(proc.stdout + proc.stderr)


@pytest.mark.parametrize("uuid", [f"bogus\n{FORGED}", f"x{TITLE}", " padded", "u" * 101])
def test_an_identity_configmap_holding_no_identity_is_refused_at_connect(uuid: str) -> None:
    from coordinator.kube.identity import _checked

    with pytest.raises(KubeError) as err:
        _checked(uuid, "ns")
    assert "no identity" in err.value.detail and "\n" not in err.value.detail
    assert _checked("0f0e2b8c-1f6d-4c43-9d7e-6f3e1b9b2a10", "ns")


@pytest.mark.parametrize("key", ["a.²", "a.٣", "a." + "9" * 5000, "a.-1"])
def test_a_key_path_with_odd_digits_is_a_usage_error(key: str) -> None:
    from coordinator.engine.state import get_path
    from coordinator.errors import UsageError

    with pytest.raises(UsageError):
        get_path({"a": [1, 2]}, key)
    assert get_path({"a": [1, 2]}, "a.1") == 2


@pytest.mark.parametrize("depth", [100, 150, 300, 3000])
def test_a_deeply_dotted_key_is_refused_like_a_deep_typed_value(depth: int) -> None:
    from coordinator.cli.documents import parse_assignment
    from coordinator.errors import UsageError

    key = ".".join(["a"] * depth)
    with pytest.raises(UsageError):
        parse_assignment(f"{key}:=1")  # the typed form is refused (more than 100 levels)
    with pytest.raises(UsageError) as err:
        parse_assignment(f"{key}=1")
    assert len(err.value.message) < 400, err.value.message  # the key is cut short in the message
    assert parse_assignment(".".join(["a"] * 99) + "=1").value == "1"  # 100 levels with the value: taken


def test_a_deep_typed_value_is_refused() -> None:
    from coordinator.cli.documents import parse_assignment
    from coordinator.errors import UsageError

    with pytest.raises(UsageError):
        parse_assignment("k:=" + "[" * 150 + "]" * 150)


def test_a_planted_deep_but_valid_envelope_can_still_be_printed() -> None:
    from coordinator.engine.register import checksum, decode_replica, genesis_text

    data = {"k": json.loads("[" * 600 + "]" * 600)}
    env = json.loads(genesis_text("web"))
    env.update(version=5, token=1, data=data, checksum=checksum(data))
    rep = decode_replica("c1", served({"data": {"envelope.json": json.dumps(env)}}), "configmap", deployment="web")
    assert rep.envelope is None and rep.corrupt is not None and "nested more than 100 levels" in rep.corrupt


@pytest.mark.parametrize("depth", [99, 100, 101])
def test_what_input_takes_a_replica_holds_and_prints_and_no_more(depth: int) -> None:
    """The depth limit of `state set`/`state apply` input (100 levels, the data mapping
    being one) is the one a replica is read with: what one writes the other reads."""
    from coordinator.cli.documents import parse_document
    from coordinator.cli.output import dump_document
    from coordinator.engine.register import checksum, decode_replica, genesis_text
    from coordinator.errors import UsageError

    value: Any = 1
    for _ in range(depth - 2):
        value = [value]
    data = {"k": value}  # `depth` levels: the mapping, depth - 2 lists, the number
    env = json.loads(genesis_text("web"))
    env.update(version=5, token=1, data=data, checksum=checksum(data))
    rep = decode_replica("c1", served({"data": {"envelope.json": json.dumps(env)}}), "configmap", deployment="web")
    if depth <= 100:
        assert parse_document(json.dumps(data), "f") == data
        assert rep.envelope is not None and rep.envelope.data == data, rep.corrupt
        dump_document(rep.envelope.data, "json")
        dump_document(rep.envelope.data, "yaml")
    else:
        with pytest.raises(UsageError):
            parse_document(json.dumps(data), "f")
        assert rep.envelope is None and rep.corrupt is not None


@pytest.mark.parametrize("at", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "2026-01-01T00:00:00"])
def test_a_planted_audit_time_at_the_end_of_the_calendar_prints(at: str) -> None:
    """`state history` prints each entry's `at` with when(); a well-formed envelope planted
    by a namespace writer may date an entry 9999-12-31T23:59:59-14:00 (pydantic takes it)."""
    from datetime import datetime

    from coordinator.cli.output import dump_document, when
    from coordinator.config.models import AuditEntry

    entry = AuditEntry.model_validate({"at": at, "who": "w", "host": "h", "command": "c", "version": 1, "token": 1})
    assert isinstance(entry.at, datetime)
    when(entry.at)
    dump_document({"at": entry.at}, "json")


# ------------------------------------------------------------------ pure: what a proxy may send


def test_retry_after_as_an_http_date_and_huge_values() -> None:
    from email.utils import formatdate, parsedate_to_datetime

    from coordinator.kube.client import _retry_after

    now = parsedate_to_datetime(formatdate(1_800_000_000, usegmt=True))
    assert _retry_after(formatdate(1_800_000_003, usegmt=True), now) == 3.0
    assert _retry_after(formatdate(1_799_999_990, usegmt=True), now) is None  # in the past
    assert _retry_after("1e308", now) == 1e308  # then not retried: longer than any deadline
    assert _retry_after("1e400", now) is None


def test_a_retry_after_date_with_a_huge_offset_is_ignored() -> None:
    from email.utils import parsedate_to_datetime

    from coordinator.kube.client import _retry_after

    now = parsedate_to_datetime("Mon, 01 Jan 2020 00:00:00 GMT")
    assert _retry_after("Mon, 01 Jan 2020 00:00:00 -99999999999999999999", now) is None


# ------------------------------------------------------------------ pure: files and bombs


# ================================================================== live: the printed Role
#
# A user granted `app` only plants objects of deployments it was not granted.


# ================================================================== live: a namespace writer


# ================================================================== live: a proxy in front of one member


# ================================================================== live: 429
