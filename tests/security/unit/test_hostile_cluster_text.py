"""Round 3 of trying to break least privilege and hostile input (issue 16), on real API
servers where it matters, with what the tests next door leave out.

Every attempt stays here whether the tool held or not: where it holds, the test asserts
the safe behaviour; where it broke, the test asserts the safe behaviour and is marked
``xfail(strict=True)`` with a short repro, so the day it is fixed the mark has to go.

Who attacks:
- a user with exactly what ``rbac print --deployment app`` prints, who plants objects of
  *other* deployments with the ``create`` right (any name);
- someone with write access to the namespace (edits annotations, plants envelopes);
- a proxy in front of one API server (answers anything);
- whoever writes the files and command lines given to the tool.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env, make_env
from helpers.hostile import BUG, FORGED, HOSTILE_ANSWERS, TITLE, Hostile, clean, minted_user, no_crash, request_as

# The fixture `throttled` of test_throttling: a minted user with exactly the printed rights,
# and an admission webhook that can answer 429 (registered under its own name).
from helpers.throttle import throttled  # noqa: F401
from served import served

from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.kube.resources import LABEL_DEPLOYMENT, LABEL_MANAGED_BY, LABEL_VALUE, configmaps_path, lease_path

integration = pytest.mark.integration


# ================================================================== pure: parsers of cluster text
#
# Everything below is text someone who may write a Lease or ConfigMap in the namespace
# (or a proxy) controls. A reader must drop what it cannot read, never raise.


def _lease(ann: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "coordinator-lock-zzz", "annotations": ann}, "spec": {}}


@pytest.mark.parametrize("since", ["1e999", "Infinity", "-Infinity", "NaN", "1e20", "-1"])
def test_a_turn_claim_with_an_infinite_since_is_dropped(since: str) -> None:
    from coordinator.lease import LeaseView

    view = LeaseView.parse(_lease({"coordinator.io/next": f'{{"since":{since},"lock":"x"}}'}))
    assert view.next_claim is None


@pytest.mark.parametrize(
    "annotation", ["coordinator.io/next", "coordinator.io/last-break", "coordinator.io/membership"]
)
def test_deeply_nested_annotations_are_dropped(annotation: str) -> None:
    from coordinator.lease import LeaseView
    from coordinator.membership import in_lease_object

    obj = _lease({annotation: "[" * 5000})
    view = LeaseView.parse(obj)
    assert view.next_claim is None and view.break_note is None
    if annotation == "coordinator.io/membership":
        assert in_lease_object(obj) is None  # unreadable: stores nothing (absent, it would be a legacy lease)


def test_the_fleet_view_is_too_few_listed_below_a_majority_of_the_connected_clusters() -> None:
    from coordinator.fleet import Fleet

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
    from coordinator.lease import LeaseView, effective_ttl

    for ann in ({"coordinator.io/max-ttl": "9" * 400}, {"coordinator.io/max-ttl": "9" * 5000}):
        view = LeaseView.parse(_lease(ann))
        assert effective_ttl(view, 600) == 600
        view = LeaseView.parse(_written_by(manager, ann))
        assert effective_ttl(view, 600) == 600


def test_a_max_ttl_note_is_believed_only_when_a_coordinator_wrote_it() -> None:
    """Found: `kubectl annotate lease ... coordinator.io/max-ttl=100000000` kept a dead
    holder's lock for years (the larger of the record's maximum and the note was waited
    out). Now a note counts only where a coordinator field manager owns it."""
    from coordinator.lease import LeaseView, effective_ttl

    note = {"coordinator.io/max-ttl": "3600"}
    for manager, believed in (("coordinator", True), ("coordinator-line", True), ("kubectl-edit", False)):
        view = LeaseView.parse(_written_by(manager, note))
        assert (view.max_ttl_note == 3600) is believed, manager
        assert effective_ttl(view, 600) == (3600 if believed else 600), manager
    assert LeaseView.parse(_lease(note)).max_ttl_note is None  # managedFields stripped: no evidence


@pytest.mark.parametrize("since", [10**20, -(10**20)])
def test_a_claim_from_the_far_future_prints_as_json(since: int) -> None:
    from coordinator.cli.lock import claim_document
    from coordinator.lease import TurnClaim

    doc = claim_document(TurnClaim(since, "x"))
    json.dumps(doc, default=str)
    assert doc is not None and doc["waiting_since"] is None


@pytest.mark.parametrize("pid", ["²", "٣", "9" * 5000, "-1", " 1"])
def test_a_pid_annotation_of_odd_digits_is_no_pid(pid: str) -> None:
    from coordinator.cli.lockview import pid_field as _pid
    from coordinator.fleet import Fleet, FleetEntry, fleet_document

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
    from coordinator import history

    good = {"lock_id": "aaaa", "event": "acquired", "at": "2026-01-01T00:00:00Z"}
    bad = {"lock_id": "bbbb", "event": "acquired", "at": at}
    assert [e["lock_id"] for e in history.decode(_history_copy([good, bad]))] == ["aaaa"]
    assert [e["lock_id"] for e in history.merge([good, bad])] == ["aaaa"]


def test_history_events_dated_in_the_future_are_dropped_and_cannot_evict_real_ones() -> None:
    from datetime import UTC, datetime, timedelta

    from coordinator import history
    from coordinator.kube.resources import micro_time

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    real = [history.event("acquired", f"real{i}", at=micro_time(now - timedelta(minutes=i))) for i in range(5)]
    skewed = history.event("acquired", "skewed", at=micro_time(now + timedelta(minutes=10)))  # a clock ahead
    forged = [history.event("acquired", f"forged{i}", at="9000-01-01T00:00:00Z") for i in range(100)]
    kept = history.decode(_history_copy([*real, skewed, *forged]), now=now)
    assert sorted(e["lock_id"] for e in kept) == sorted([*(f"real{i}" for i in range(5)), "skewed"])


@pytest.mark.parametrize("manager", ["kubectl-create", "kubectl-edit", ""])
def test_a_history_copy_no_coordinator_wrote_is_not_read(manager: str) -> None:
    from coordinator import history

    events = [{"lock_id": "aaaa", "event": "acquired", "at": "2026-01-01T00:00:00Z"}]
    assert [e["lock_id"] for e in history.decode(_history_copy(events, "coordinator"))] == ["aaaa"]
    assert history.decode(_history_copy(events, manager)) == []
    assert history.decode({"data": {"history.json": json.dumps(events)}}) == []  # managedFields stripped


def test_a_corrupt_replica_reason_is_one_line() -> None:
    """The reason why a replica is corrupt names a key of the planted envelope; it is put
    into error paragraphs whose own lines are kept."""
    from coordinator.register import checksum, decode_replica, genesis_text

    env = json.loads(genesis_text("web"))
    env.update(version=5, token=1, data={}, checksum=checksum({}), member_ids={f"x\n{FORGED}": 1})
    rep = decode_replica("c1", served({"data": {"envelope.json": json.dumps(env)}}), "configmap", deployment="web")
    assert rep.corrupt is not None and "\n" not in rep.corrupt, rep.corrupt


def test_a_backup_with_a_planted_key_cannot_forge_a_line_of_the_restore_error(tmp_path: Path) -> None:
    """`state restore -f` of a file whose envelope names a member `x\\nError: forged line`:
    the refusal (exit 2, before any cluster is asked) says why on one line."""
    from coordinator.register import checksum, genesis_text

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
    from coordinator.errors import UsageError
    from coordinator.state import get_path

    with pytest.raises(UsageError):
        get_path({"a": [1, 2]}, key)
    assert get_path({"a": [1, 2]}, "a.1") == 2


@pytest.mark.parametrize("depth", [100, 150, 300, 3000])
def test_a_deeply_dotted_key_is_refused_like_a_deep_typed_value(depth: int) -> None:
    from coordinator.cli.state import parse_assignment
    from coordinator.errors import UsageError

    key = ".".join(["a"] * depth)
    with pytest.raises(UsageError):
        parse_assignment(f"{key}:=1")  # the typed form is refused (more than 100 levels)
    with pytest.raises(UsageError) as err:
        parse_assignment(f"{key}=1")
    assert len(err.value.message) < 400, err.value.message  # the key is cut short in the message
    assert parse_assignment(".".join(["a"] * 99) + "=1").value == "1"  # 100 levels with the value: taken


def test_a_deep_typed_value_is_refused() -> None:
    from coordinator.cli.state import parse_assignment
    from coordinator.errors import UsageError

    with pytest.raises(UsageError):
        parse_assignment("k:=" + "[" * 150 + "]" * 150)


def test_a_planted_deep_but_valid_envelope_can_still_be_printed() -> None:
    from coordinator.register import checksum, decode_replica, genesis_text

    data = {"k": json.loads("[" * 600 + "]" * 600)}
    env = json.loads(genesis_text("web"))
    env.update(version=5, token=1, data=data, checksum=checksum(data))
    rep = decode_replica("c1", served({"data": {"envelope.json": json.dumps(env)}}), "configmap", deployment="web")
    assert rep.envelope is None and rep.corrupt is not None and "nested more than 100 levels" in rep.corrupt


@pytest.mark.parametrize("depth", [99, 100, 101])
def test_what_input_takes_a_replica_holds_and_prints_and_no_more(depth: int) -> None:
    """The depth limit of `state set`/`state apply` input (100 levels, the data mapping
    being one) is the one a replica is read with: what one writes the other reads."""
    from coordinator.cli.output import dump_document
    from coordinator.cli.state import parse_document
    from coordinator.errors import UsageError
    from coordinator.register import checksum, decode_replica, genesis_text

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
    from coordinator.models import AuditEntry

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


@pytest.mark.parametrize("case", sorted(HOSTILE_ANSWERS))
def test_whatever_a_proxy_answers_is_a_classified_kube_error(tmp_path: Path, case: str) -> None:
    hostile = Hostile(tmp_path)
    hostile.answer = HOSTILE_ANSWERS[case]

    async def ask() -> None:
        client = KubeClient(Endpoint("p", "p", str(hostile.kubeconfig)), timeout=3)
        try:
            await client.request("GET", "/version")
        finally:
            await client.close()

    try:
        try:
            anyio.run(ask)
        except KubeError:
            pass  # classified: safe
    finally:
        hostile.close()


def test_connecting_through_a_proxy_that_answers_deep_json_is_not_a_crash(tmp_path: Path) -> None:
    hostile = Hostile(tmp_path)
    hostile.answer = (200, {"Content-Type": "application/json"}, b"[" * 5000)
    try:
        env = dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "cfg" / "config.yaml"), NO_COLOR="1")
        proc = subprocess.run(
            [sys.executable, "-m", "coordinator", "--timeout", "3s", "cluster", "connect", "p",
             "--context", "p", "--kubeconfig", str(hostile.kubeconfig)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        hostile.close()
    no_crash(proc)


LEAK_SCRIPT = """
import sys, anyio
sys.path[:0] = ["tests"]  # where the helpers package lives
from pathlib import Path
from helpers.hostile import BUG, HOSTILE_ANSWERS, Hostile
from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.fanout import fan_out, ClusterResult
from coordinator.outcome import Outcome
from coordinator.logs import configure_logging
configure_logging(log_format=sys.argv[3], verbosity=int(sys.argv[4]))
h = Hostile(Path(sys.argv[1]))
h.kubeconfig.write_text(h.kubeconfig.read_text().replace("user: {}", "user: {token: SECRET-TOKEN-0123456789}"))
if sys.argv[2] == BUG:
    # A bug inside the request, after the headers (the token) are built: whatever the
    # door lets through is logged by the fan-out with its traceback.
    import coordinator.kube.client as door
    def broken(value):
        raise RuntimeError("a bug")
    door._http_date = broken
else:
    h.answer = HOSTILE_ANSWERS[sys.argv[2]]
async def main():
    c = KubeClient(Endpoint("p", "p", str(h.kubeconfig)), timeout=3)
    async def op(name):
        try:
            await c.request("GET", "/version")
        except KubeError as err:  # what every operation does with a classified failure
            return ClusterResult(name, Outcome.ERROR, detail=err.detail)
        return ClusterResult(name, Outcome.OK)
    r = await fan_out(["p"], op, timeout=5)
    await c.close()
    print("outcome", r["p"].outcome)
anyio.run(main)
"""


@pytest.mark.parametrize("verbosity", [0, 1, 2])
def test_an_unexpected_error_in_a_request_never_prints_the_bearer_token(tmp_path: Path, verbosity: int) -> None:
    """Found: structlog's default exception formatter (rich, show_locals=True) printed the
    locals of the request's frames, the Authorization header among them, at the default
    verbosity. Now: the line alone by default, a plain traceback (no locals) with -v."""
    proc = subprocess.run(
        [sys.executable, "-c", LEAK_SCRIPT, str(tmp_path), BUG, "console", str(verbosity)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
        env=dict(os.environ, NO_COLOR="1", FORCE_COLOR="1"),
    )  # fmt: skip
    assert "outcome error" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "SECRET-TOKEN" not in proc.stderr, [line for line in proc.stderr.splitlines() if "SECRET" in line]
    assert "cluster operation failed unexpectedly" in proc.stderr, proc.stderr
    assert ("Traceback" in proc.stderr) == (verbosity > 0), proc.stderr
    assert "RuntimeError: a bug" in proc.stderr or verbosity == 0, proc.stderr


@pytest.mark.parametrize("case", ["Date with an offset no datetime holds", "success body nested 5000 deep"])
def test_what_the_proxy_sends_is_an_answer_or_a_classified_error_never_a_token(tmp_path: Path, case: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", LEAK_SCRIPT, str(tmp_path), case, "console", "0"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
        env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    assert "SECRET-TOKEN" not in proc.stderr, [line for line in proc.stderr.splitlines() if "SECRET" in line]
    assert "Traceback" not in proc.stderr and "unexpectedly" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("verbosity", [0, 2])
def test_json_log_lines_of_an_unexpected_error_carry_no_token(tmp_path: Path, verbosity: int) -> None:
    """Held: with --log-format json the same failure is one JSON line, without the
    traceback by default, with a plain one (no locals) under "exception" with -v."""
    proc = subprocess.run(
        [sys.executable, "-c", LEAK_SCRIPT, str(tmp_path), BUG, "json", str(verbosity)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
        env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    assert "outcome error" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "SECRET-TOKEN" not in proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.strip()]
    [failed] = [line for line in lines if line["event"] == "cluster operation failed unexpectedly"]
    assert ("RuntimeError: a bug" in failed.get("exception", "")) == (verbosity > 0), failed


# ------------------------------------------------------------------ pure: files and bombs


def test_restore_from_an_endless_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    """`state restore -f /dev/zero` (or a pipe, `<(curl ...)`): the size check trusts
    stat(); the file is read to the end, so memory runs out. Here under a 1 GiB
    address-space limit, so the machine is not hurt."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "config.yaml"), NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "state", "restore", "web", "-f", "/dev/zero"],
        env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit,
    )  # fmt: skip
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-500:]}"


def test_apply_from_an_endless_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "config.yaml"), NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "state", "apply", "web", "-f", "/dev/zero"],
        env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit,
    )  # fmt: skip
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-500:]}"


def test_the_config_folder_is_private_under_umask_000(tmp_path: Path) -> None:
    """The local records (config, lock book with its lock ids) live in a folder the
    config's own comment calls 0700; with umask 000 it is made world-writable, so another
    local user may replace config.yaml (kubeconfig paths, identities)."""
    from coordinator.config import ConfigStore

    path = tmp_path / "fresh" / "coordinator" / "config.yaml"
    old = os.umask(0)
    try:
        with ConfigStore(path).edit():
            pass
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o077 == 0, oct(path.parent.stat().st_mode)
    assert path.parent.parent.stat().st_mode & 0o077 == 0, oct(path.parent.parent.stat().st_mode)
    lock_file = path.with_name("." + path.name + ".lock")
    assert lock_file.stat().st_mode & 0o777 == 0o600, oct(lock_file.stat().st_mode)


# ================================================================== live: the printed Role
#
# A user granted `app` only plants objects of deployments it was not granted.


_PLANTED: list[tuple[Env, int, str]] = []


@pytest.fixture(autouse=True)
def _remove_planted_leases() -> Any:
    """The fleet view lists every namespace: a lease planted by one test would reach the
    fleet views of the next ones."""
    yield
    while _PLANTED:
        env, index, path = _PLANTED.pop()
        try:
            anyio.run(env.raw, index, "DELETE", path)
        except KeyError:
            pass


def _plant_lease(env: Env, minted: Any, index: int, deployment: str, annotations: dict[str, str]) -> None:
    _PLANTED.append((env, index, lease_path(env.namespace, f"coordinator-lock-{deployment}")))
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"coordinator-lock-{deployment}",
            "labels": {LABEL_MANAGED_BY: LABEL_VALUE, LABEL_DEPLOYMENT: deployment},
            "annotations": annotations,
        },
        "spec": {"leaseDurationSeconds": 3600},
    }
    request_as(minted, index, "POST", f"/apis/coordination.k8s.io/v1/namespaces/{env.namespace}/leases", body)


@integration
def test_a_lease_planted_by_another_deployments_user_does_not_blind_the_fleet_view(dep3: Env, tmp_path: Path) -> None:
    minted = minted_user(dep3, tmp_path)
    for i in (1, 2, 3):
        _plant_lease(dep3, minted, i, "zzz", {"coordinator.io/next": '{"since":1e999,"lock":"x","holder":"m"}'})
    proc = dep3.cli("-o", "json", "lock", "status", "--all")
    doc = json.loads(proc.stdout)
    assert all(c["listed"] for c in doc["clusters"]), (proc.returncode, doc["clusters"])
    [web] = [e for e in doc["deployments"] if (e["deployment"], e["namespace"]) == ("web", dep3.namespace)]
    assert web["status"] == "free", web
    no_crash(proc)
    # The planted leases are a deployment of their own whose holder nobody can name (no
    # coordinator wrote their holder field): unknown, and so may be other deployments the
    # session's other tests left on these clusters; web is not among them.
    zzz = [e for e in doc["deployments"] if (e["deployment"], e["namespace"]) == ("zzz", dep3.namespace)]
    assert [e["status"] for e in zzz] == ["unknown"], zzz
    assert proc.returncode == 4 and f"web ({dep3.namespace})" not in proc.stderr, proc.stderr


@integration
def test_a_lease_planted_with_a_deeply_nested_member_set_does_not_crash_the_fleet_view(
    dep3: Env, tmp_path: Path
) -> None:
    minted = minted_user(dep3, tmp_path)
    _plant_lease(dep3, minted, 1, "zzz", {"coordinator.io/membership": "[" * 5000})
    proc = dep3.cli("-o", "json", "lock", "status", "--all")
    no_crash(proc)
    [web] = [
        e
        for e in json.loads(proc.stdout)["deployments"]
        if (e["deployment"], e["namespace"]) == ("web", dep3.namespace)
    ]
    assert web["status"] == "free", web


@integration
def test_a_planted_lease_does_not_end_the_fleet_watch(dep3: Env, tmp_path: Path) -> None:
    minted = minted_user(dep3, tmp_path)
    watch = dep3.popen("lock", "status", "--all", "--watch", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(4)
        _plant_lease(dep3, minted, 1, "zzz", {"coordinator.io/next": '{"since":1e999,"lock":"x"}'})
        time.sleep(4)
        assert watch.poll() is None, watch.communicate()[1][-500:]
    finally:
        if watch.poll() is None:
            watch.terminate()
        _, err = watch.communicate(timeout=30)
    assert "Internal error" not in err, err[-500:]


@integration
def test_the_fleet_rights_alone_serve_the_fleet_watch(dep3: Env, tmp_path: Path) -> None:
    """`rbac print --fleet` adds `list` on Leases, not `watch`; `lock status --all --watch`
    (which watches every Lease of the cluster) with exactly those rights: does it show
    the fleet without errors, and how hard does it poll instead?"""
    from helpers.rbac import connect, grant, mint_user, user_env

    user, minted = mint_user(dep3.sandbox, tmp_path, "fleet")
    env = user_env(dep3.sandbox, tmp_path, dep3.namespace, "fleet")
    grant(dep3.sandbox, env, dep3.namespace, user, deployments=("app",), flags=("--fleet",))
    connect(env, minted)
    members = ["--cluster", "u1", "--cluster", "u2", "--cluster", "u3"]
    assert env.cli("deployment", "create", "app", "-n", dep3.namespace, *members).returncode == 0
    watch = env.popen("-v", "lock", "status", "--all", "--watch", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(8)
    finally:
        watch.terminate()
        out, err = watch.communicate(timeout=30)
    assert "app" in out, out[-500:] + err[-500:]
    refused = [line for line in err.splitlines() if "cannot watch" in line]
    assert not refused, f"{len(refused)} watches refused in 8 s (each followed by a LIST of every Lease): {refused[0]}"


class _RefusedWatches:
    """A cluster set whose clusters list fine and refuse every watch (403), as with a
    binding made by an older `rbac print --fleet` (list only)."""

    timeout = 3.0

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0

    async def check_identity(self, name: str) -> None:
        return None

    def client(self, name: str) -> Any:
        from coordinator.kube.client import ApiResponse

        outer = self

        class Client:
            async def request(self, method: str, path: str, **kw: Any) -> ApiResponse:
                outer.lists += 1
                return ApiResponse(200, {"metadata": {"resourceVersion": "1"}, "items": []}, None)

            async def watch(self, path: str, **kw: Any) -> Any:
                outer.watches += 1
                raise KubeError("forbidden", 'HTTP 403: User "u" cannot watch resource "leases"', status=403)
                yield {}  # an async generator, as the real one

        return Client()


def test_a_refused_fleet_watch_backs_off_instead_of_listing_twice_a_second() -> None:
    """Found: with `list` and no `watch`, `lock status --all --watch` listed every Lease
    of each cluster about twice a second. Now the wait before listing again doubles."""
    from coordinator.fleet import FleetWatch
    from coordinator.models import ClusterRecord, LocalConfig

    rec = ClusterRecord(name="c1", context="c", identity="i", identity_source="kube-system-uid")
    clusters = _RefusedWatches()
    watch = FleetWatch(LocalConfig(clusters={"c1": rec}), clusters)  # type: ignore[arg-type]

    async def follow() -> None:
        with anyio.move_on_after(8):
            await watch._follow("c1")

    anyio.run(follow)
    # 0.5 + 1 + 2 + 4 s of waits fit in 8 s: 4 or 5 LISTs, not 16.
    assert 3 <= clusters.lists <= 5, clusters.lists
    assert watch.fleet().clusters == {"c1": "ok"}  # what the LISTs say is shown meanwhile


def _forged_history(count: int, at: str) -> str:
    return json.dumps(
        [
            {"lock_id": f"forged{i:03d}", "event": "acquired", "at": at, "holder": "mallory", "reason": "forged"}
            for i in range(count)
        ]
    )


def _plant_history(env: Env, minted: Any, events: str, manager: str | None = None) -> None:
    """Plant ``coordinator-history-web`` on every member as the user granted `app`.

    `deployment create` took the name on every member, so the plant is refused by name
    first; then the copy is deleted (as an admin), standing for a member the create did
    not reach or a deployment made by an older version, and planted there."""
    path = f"{configmaps_path(env.namespace)}/coordinator-history-web"
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "coordinator-history-web", "labels": {LABEL_MANAGED_BY: LABEL_VALUE}},
        "data": {"history.json": events},
    }
    query = {"fieldManager": manager} if manager else None
    for i in (1, 2, 3):
        assert history_of(anyio.run(env.raw, i, "GET", path)) == []  # the empty copy of the create
        with pytest.raises(KubeError) as err:
            request_as(minted, i, "POST", configmaps_path(env.namespace), body, query)
        assert err.value.kind == "already-exists", err.value.detail
        anyio.run(env.raw, i, "DELETE", path)
        request_as(minted, i, "POST", configmaps_path(env.namespace), body, query)


def history_of(obj: Any) -> list[dict[str, Any]]:
    from coordinator import history

    return history.decode(obj)


@integration
def test_a_user_granted_another_deployment_cannot_rewrite_this_ones_lock_history(dep3: Env, tmp_path: Path) -> None:
    """Found: a user granted `app` could create coordinator-history-web (no history yet)
    with 100 events dated 9000-01-01, which `lock history` showed and which evicted
    every real tenure (the newest 100 lock ids are kept). Now the create takes the name,
    and where it is free the planted events are dropped as dated in the future."""
    minted = minted_user(dep3, tmp_path)
    _plant_history(dep3, minted, _forged_history(100, "9000-01-01T00:00:00Z"))
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    proc = dep3.cli("-o", "json", "lock", "history", "web")
    no_crash(proc)
    tenures = json.loads(proc.stdout)["tenures"]
    assert [t["holder"] for t in tenures] == ["alice"], [t["holder"] for t in tenures][:5]


@integration
def test_a_planted_history_copy_no_coordinator_wrote_is_not_read(dep3: Env, tmp_path: Path) -> None:
    """The same plant, dated in the past and made under another field manager (kubectl
    create): the copy is not read, and the first event recorded replaces it."""
    from datetime import UTC, datetime, timedelta

    minted = minted_user(dep3, tmp_path)
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    _plant_history(dep3, minted, _forged_history(5, an_hour_ago), manager="kubectl-create")
    shown = dep3.cli("-o", "json", "lock", "history", "web")
    assert shown.returncode == 0 and json.loads(shown.stdout)["tenures"] == [], shown.stdout + shown.stderr
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
    proc = dep3.cli("-o", "json", "lock", "history", "web")
    assert [t["holder"] for t in json.loads(proc.stdout)["tenures"]] == ["alice"], proc.stdout
    path = f"{configmaps_path(dep3.namespace)}/coordinator-history-web"
    for i in (1, 2, 3):
        assert "forged" not in json.dumps(anyio.run(dep3.raw, i, "GET", path)["data"])


@integration
def test_a_planted_history_event_past_the_calendar_does_not_make_the_history_unreadable(
    dep3: Env, tmp_path: Path
) -> None:
    """Found: one event at 9999-12-31T23:59:59-14:00 (a day past what a datetime holds in
    UTC) made every copy unreadable and unwritable. Now that event alone is dropped."""
    minted = minted_user(dep3, tmp_path)
    _plant_history(dep3, minted, _forged_history(1, "9999-12-31T23:59:59-14:00"))
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
    proc = dep3.cli("-o", "json", "lock", "history", "web")
    assert proc.returncode == 0, proc.stderr
    assert [t["holder"] for t in json.loads(proc.stdout)["tenures"]] == ["alice"]


@integration
def test_the_granted_user_cannot_touch_another_deployments_lease_or_state(dep3: Env, tmp_path: Path) -> None:
    """Held: with the Role of `app`, `web`'s lease and state (which exist) can be neither
    read, replaced, patched nor deleted, and re-creating them is refused by name."""
    minted = minted_user(dep3, tmp_path)
    lease = lease_path(dep3.namespace, "coordinator-lock-web")
    state = f"{configmaps_path(dep3.namespace)}/coordinator-state-web"
    before = [anyio.run(dep3.raw, 1, "GET", p) for p in (lease, state)]
    for path in (lease, state):
        for method, body in (("GET", None), ("PUT", before[0]), ("DELETE", None)):
            with pytest.raises(KubeError) as err:
                request_as(minted, 1, method, path, body)
            assert err.value.kind == "forbidden", (method, path, err.value.detail)
    for path, obj in ((lease, before[0]), (state, before[1])):
        fresh = {k: v for k, v in obj.items() if k != "metadata"} | {"metadata": {"name": obj["metadata"]["name"]}}
        with pytest.raises(KubeError) as err:
            request_as(minted, 1, "POST", path.rsplit("/", 1)[0], fresh)
        assert err.value.kind in ("already-exists", "conflict", "forbidden"), err.value.detail
    after = [anyio.run(dep3.raw, 1, "GET", p) for p in (lease, state)]
    assert [a["metadata"]["resourceVersion"] for a in after] == [b["metadata"]["resourceVersion"] for b in before]


# ================================================================== live: a namespace writer


def _patch_lease(env: Env, index: int, body: dict[str, Any], manager: str = "kubectl-edit") -> None:
    async def go() -> None:
        client = env.client(index)
        try:
            await client.request(
                "PATCH",
                lease_path(env.namespace, f"coordinator-lock-{env.deployment}"),
                body=body,
                query={"fieldManager": manager},
                content_type="application/merge-patch+json",
            )
        finally:
            await client.close()

    anyio.run(go)


@integration
def test_a_pid_annotation_of_superscript_digits_keeps_the_json_status(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
    for i in (1, 2, 3):
        _patch_lease(dep3, i, {"metadata": {"annotations": {"coordinator.io/pid": "²"}}})
    proc = dep3.cli("-o", "json", "lock", "status", "web")
    no_crash(proc)
    assert json.loads(proc.stdout)["holder"] == "alice"


@integration
def test_annotation_edits_do_not_keep_a_dead_holders_lock_alive_forever(sandbox3: Any, tmp_path: Path) -> None:
    env = make_env(sandbox3, tmp_path, max_ttl_s=6.0)
    assert env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", "alice").returncode == 0
    for i in (1, 2, 3):  # alice dies; someone with `edit` changes the lease
        _patch_lease(env, i, {"metadata": {"annotations": {"coordinator.io/max-ttl": "100000000"}},
                              "spec": {"leaseDurationSeconds": 4}})  # fmt: skip
    # Without the note, the deployment's maximum TTL (6 s) + margins (2 s + 5 s skew) apply.
    proc = env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", "bob", "--wait", "35s")
    assert proc.returncode == 0, proc.stderr[-600:]


@integration
def test_a_duration_edit_alone_does_not_keep_a_dead_holders_lock_alive(sandbox3: Any, tmp_path: Path) -> None:
    """Held, the control of the test above: the same edit of the duration without the
    max-ttl note, and Bob gets the lock once the deployment's maximum TTL has passed."""
    env = make_env(sandbox3, tmp_path, max_ttl_s=6.0)
    assert env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", "alice").returncode == 0
    for i in (1, 2, 3):
        _patch_lease(env, i, {"spec": {"leaseDurationSeconds": 4}})
    proc = env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", "bob", "--wait", "35s")
    assert proc.returncode == 0, proc.stderr[-600:]


@integration
def test_state_get_of_one_key_prints_it_escaped(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", f"note=hello{TITLE}\u202e").returncode == 0
    proc = dep3.cli("state", "get", "web", "note")
    assert proc.returncode == 0, proc.stderr
    clean(proc.stdout)
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web", "note").stdout) == f"hello{TITLE}\u202e"


@integration
def test_state_get_of_the_whole_document_escapes_keys_and_values(dep3: Env) -> None:
    """Held: without KEY, `state get` prints YAML, which escapes control characters and
    (ASCII only) bidi overrides and zero-width characters, in keys and values."""
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    key, value = f"k{TITLE}\u202e", f"v{TITLE}\u200b\r\n{FORGED}"
    assert dep3.cli("state", "set", "web", f"{key}={value}").returncode == 0
    proc = dep3.cli("state", "get", "web")
    assert proc.returncode == 0, proc.stderr
    clean(proc.stdout)
    assert "\u200b" not in proc.stdout
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web").stdout) == {key: value}


def _edit_envelope(env: Env, index: int, edit: Any) -> None:
    path = f"{configmaps_path(env.namespace)}/coordinator-state-{env.deployment}"
    cm = anyio.run(env.raw, index, "GET", path)
    doc = json.loads(cm["data"]["envelope.json"])
    edit(doc)
    cm["data"]["envelope.json"] = json.dumps(doc)
    anyio.run(env.raw, index, "PUT", path, cm)


@integration
def test_a_key_planted_in_corrupt_envelopes_cannot_forge_a_line_of_the_error(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", "k=v").returncode == 0
    for i in (1, 2, 3):
        _edit_envelope(dep3, i, lambda d: d.update(member_ids={f"x\n{FORGED}": 1}))
    for args in (("state", "set", "web", "k=v2"), ("state", "get", "web"), ("state", "diff", "web")):
        proc = dep3.cli(*args)
        no_crash(proc)
        clean(proc.stdout + proc.stderr)


@integration
def test_a_planted_deeply_nested_envelope_is_not_a_crash_for_readers(dep3: Env) -> None:
    from coordinator.register import checksum

    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", "k=v").returncode == 0
    data = {"k": json.loads("[" * 600 + "]" * 600)}

    def deepen(doc: dict[str, Any]) -> None:
        doc.update(data=data, checksum=checksum(data), version=doc["version"] + 1, write_id="f" * 32)

    for i in (1, 2, 3):
        _edit_envelope(dep3, i, deepen)
    for args in (("state", "get", "web"), ("-o", "json", "state", "get", "web")):
        no_crash(dep3.cli(*args))


@integration
def test_state_set_with_a_deeply_dotted_key_is_a_usage_error(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    proc = dep3.cli("state", "set", "web", ".".join(["a"] * 300) + "=v")
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-300:]}"
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web").stdout) in ({}, None)


@integration
def test_what_a_deeply_dotted_state_set_writes_state_apply_takes_back(dep3: Env, tmp_path: Path) -> None:
    """Found: `state set` of a 150-part key succeeded, and `state apply -f` of what
    `state get -o json` then printed was refused (more than 100 levels). Now the key is
    refused (exit 2), and the deepest key it takes (99 parts, 100 levels with the value)
    is taken back by `state apply`."""
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    refused = dep3.cli("state", "set", "web", ".".join(["a"] * 150) + "=v")
    assert refused.returncode == 2, refused.stderr
    made = dep3.cli("state", "set", "web", ".".join(["a"] * 99) + "=v")
    assert made.returncode == 0, made.stderr
    dump = tmp_path / "state.json"
    dump.write_text(dep3.cli("-o", "json", "state", "get", "web").stdout)
    back = dep3.cli("state", "apply", "web", "-f", str(dump))
    assert back.returncode == 0, back.stderr[-300:]
    assert dep3.cli("state", "get", "web", ".".join(["a"] * 99)).stdout.strip() == "v"


@integration
def test_an_identity_configmap_cannot_forge_a_line_of_the_mismatch_error(dep3: Env, tmp_path: Path) -> None:
    me = Env(sandbox=dep3.sandbox, config=tmp_path / "r" / "config.yaml", namespace=dep3.namespace)
    ns = dep3.sandbox.restricted_namespace
    connected = me.cli("cluster", "connect", "r1", "--context", dep3.sandbox.restricted_contexts[0],
                       "--identity-namespace", ns)  # fmt: skip
    assert connected.returncode == 0, connected.stderr
    path = f"{configmaps_path(ns)}/coordinator-identity"
    original = anyio.run(dep3.raw, 1, "GET", path)
    try:
        forged = json.loads(json.dumps(original))
        forged["data"]["uuid"] = f"bogus\n{FORGED}\x1b[2J"
        anyio.run(dep3.raw, 1, "PUT", path, forged)
        proc = me.cli("cluster", "info", "r1")
        assert proc.returncode == 5, proc.stderr
        clean(proc.stdout + proc.stderr)
    finally:
        current = anyio.run(dep3.raw, 1, "GET", path)
        current["data"] = original["data"]
        anyio.run(dep3.raw, 1, "PUT", path, current)


@integration
def test_state_files_are_private_under_umask_000_and_over_existing_files(dep3: Env, tmp_path: Path) -> None:
    """Held: with umask 000, `state backup -f` into missing folders makes them 0700 and
    the file 0600; over an existing 0644 file the result is 0600 (a new inode); a corrupt
    replica saved into an existing 0755 `--backup-dir` is 0600 (the folder, the user's,
    is left as it is)."""
    umask0 = ["sh", "-c", 'umask 000; exec "$@"', "sh"]
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", "password=hunter2").returncode == 0

    fresh = tmp_path / "new" / "deeper" / "web.json"
    done = dep3.cli("state", "backup", "web", "-f", str(fresh), prefix=umask0)
    assert done.returncode == 0, done.stderr
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert (fresh.parent.stat().st_mode & 0o777, fresh.parent.parent.stat().st_mode & 0o777) == (0o700, 0o700)
    assert str(fresh) in done.stdout

    existing = tmp_path / "open" / "web.json"
    existing.parent.mkdir()
    existing.write_text("old")
    existing.chmod(0o644)
    done = dep3.cli("state", "backup", "web", "-f", str(existing), prefix=umask0)
    assert done.returncode == 0, done.stderr
    assert existing.stat().st_mode & 0o777 == 0o600 and "hunter2" in existing.read_text()

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    _edit_envelope(dep3, 2, lambda d: d.update(checksum="sha256:" + "0" * 64))
    synced = dep3.cli("-o", "json", "state", "sync", "web", "--backup-dir", str(shared), prefix=umask0)
    assert synced.returncode == 0, synced.stderr
    saved = Path(json.loads(synced.stdout)["saved_corrupt"]["c2"])
    assert saved.parent == shared and saved.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in shared.iterdir()] == [saved.name]  # no temporary file left


# ================================================================== live: a proxy in front of one member


class _HostileProxy:
    """A TLS proxy in front of one sandbox API server (dateproxy's), whose answers the
    test turns hostile after the cluster is connected."""

    def __init__(self, upstream: str, pki_dir: Path) -> None:
        from dateproxy import HOP_BY_HOP, DateShiftingProxy

        self.mode = "pass"
        outer = self

        class Proxy(DateShiftingProxy):
            async def _forward(self, request: Any) -> Any:
                from aiohttp import web

                if outer.mode == "pass":
                    return await super()._forward(request)
                if outer.mode == "deep":
                    return web.Response(status=200, body=b"[" * 5000, content_type="application/json")
                assert self._session is not None
                headers = {
                    k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"
                }
                body = await request.read()
                async with self._session.request(
                    request.method, self.upstream + request.rel_url.path_qs, headers=headers, data=body or None
                ) as up:
                    payload = await up.read()
                    out = web.Response(status=up.status, body=payload)
                    out.headers["Content-Type"] = up.headers.get("Content-Type", "application/json")
                    out.headers["Date"] = "Mon, 01 Jan 2020 00:00:00 -99999999999999999999"
                    return out

        self.proxy = Proxy(upstream, pki_dir, 0.0)

    def start(self) -> str:
        return self.proxy.start()

    def stop(self) -> None:
        self.proxy.stop()


@integration
@pytest.mark.parametrize("mode", ["date", "deep"])
def test_a_hostile_proxy_in_front_of_one_member_costs_that_member_only(dep3: Env, tmp_path: Path, mode: str) -> None:
    """Bob reaches c3 through a proxy that, once connected, answers every request with a
    Date header no datetime holds, or with a body nested 5000 deep. The lock and state
    still work on the two other members; no command crashes."""
    from dateproxy import proxy_kubeconfig

    from coordinator.admin import connect_cluster
    from coordinator.config import ConfigStore

    pki = dep3.sandbox.dir / "pki"
    hostile = _HostileProxy(dep3.sandbox.server(3), pki)
    url = hostile.start()
    try:
        kc = proxy_kubeconfig(tmp_path / "proxied.kubeconfig", pki, dep3.sandbox.token, {"proxied-3": url})
        bob = Env(sandbox=dep3.sandbox, config=tmp_path / "bob" / "config.yaml", namespace=dep3.namespace)
        store = ConfigStore(bob.config)

        async def setup() -> None:
            for i in (1, 2):
                await connect_cluster(store, f"c{i}", f"sandbox-{i}", str(dep3.sandbox.kubeconfig))
            await connect_cluster(store, "c3", "proxied-3", str(kc))

        anyio.run(setup)
        imported = bob.cli("deployment", "import", "web", "--cluster", "c1", "-n", dep3.namespace)
        assert imported.returncode == 0, imported.stderr
        hostile.mode = mode
        results = {
            "acquire": bob.cli("-o", "json", "lock", "acquire", "web", "--ttl", "60s", "--holder", "bob"),
            "status": bob.cli("lock", "status", "web"),
            "set": bob.cli("state", "set", "web", "k=v", env={"COORDINATOR_HOLDER": "bob"}),
            "get": bob.cli("state", "get", "web"),
            "info": bob.cli("cluster", "info", "c3"),
            "fleet": bob.cli("lock", "status", "--all"),
        }
    finally:
        hostile.stop()
    codes = {k: p.returncode for k, p in results.items()}
    crashed = sorted(k for k, p in results.items() if p.returncode == 1 or "Internal error" in p.stderr)
    leaked = sorted(k for k, p in results.items() if dep3.sandbox.token in p.stdout + p.stderr)
    assert not crashed and not leaked, f"exit 1: {crashed}; bearer token printed by: {leaked}; exits {codes}"
    assert results["acquire"].returncode == 0, results["acquire"].stderr[-500:]
    assert results["set"].returncode == 0, results["set"].stderr[-500:]


# ================================================================== live: 429


@pytest.fixture
def busy(request: pytest.FixtureRequest) -> Any:
    """test_throttling's `throttled` (imported above so that pytest finds it)."""
    return request.getfixturevalue("throttled")


def _throttle_all(webhook: Any, match: Any, *, retry_after: int | None) -> None:
    """The webhook answers matching requests with 429; without ``retry_after``, with no
    retryAfterSeconds (so the API server sends no Retry-After)."""
    decide = webhook._decide

    def custom(cluster: int, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("name") or ((request.get("object") or {}).get("metadata") or {}).get("name") or ""
        key = (cluster, request["operation"], request["resource"]["resource"], name)
        if match(key):
            status: dict[str, Any] = {"code": 429, "reason": "TooManyRequests", "message": "slow down"}
            if retry_after is not None:
                status["details"] = {"retryAfterSeconds": retry_after}
            with webhook.lock:
                webhook.seen.append(key)
            return {"allowed": False, "status": status}
        return decide(cluster, request)

    webhook._decide = custom


@integration
def test_a_429_without_retry_after_is_throttled_and_the_write_not_written(busy: Any) -> None:
    from helpers.throttle import outcomes_of, retried

    env = busy.env
    assert busy.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert busy.cli("state", "set", "web", "owner=team").returncode == 0
    path = f"{configmaps_path(env.namespace)}/coordinator-state-web"
    before = [env.sandbox.admin(i).get(path)["metadata"]["resourceVersion"] for i in (1, 2, 3)]
    _throttle_all(busy.webhook, lambda k: k[3] == "coordinator-state-web", retry_after=None)
    proc = busy.env.cli("-v", "--timeout", "3s", "-o", "json", "state", "set", "web", "owner=other",
                             env={"COORDINATOR_HOLDER": "busy"})  # fmt: skip
    assert proc.returncode != 0
    assert "Outcome unknown" not in proc.stderr and "Nothing was written" in proc.stderr, proc.stderr
    assert set(outcomes_of(proc).values()) == {"throttled"}, proc.stdout
    assert retried(proc.stderr) == 0, proc.stderr  # no Retry-After: not sent again
    assert [env.sandbox.admin(i).get(path)["metadata"]["resourceVersion"] for i in (1, 2, 3)] == before


@integration
def test_data_throttled_everywhere_after_the_promise_is_reported_as_not_written(busy: Any) -> None:
    """The promise goes through on every member; then every data write is refused with
    429 past the deadline: nothing but the promise landed, so "not written", never
    "outcome unknown"."""
    from helpers.throttle import Rule, outcomes_of

    env = busy.env
    assert busy.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert busy.cli("state", "set", "web", "owner=team").returncode == 0
    for i in (1, 2, 3):
        busy.webhook.rules.append(Rule(lambda k, c=i: k[0] == c and k[3] == "coordinator-state-web", times=1))
        busy.throttle_writes(i, "coordinator-state-web", retry_after=30, times=None)
    proc = busy.cli("--timeout", "3s", "-o", "json", "state", "set", "web", "owner=other")
    assert proc.returncode != 0
    assert "Outcome unknown" not in proc.stderr, proc.stderr
    assert set(outcomes_of(proc).values()) == {"throttled"}, proc.stdout
    assert json.loads(busy.cli("-o", "json", "state", "get", "web").stdout) == {"owner": "team"}
    path = f"{configmaps_path(env.namespace)}/coordinator-state-web"
    assert all('owner":"other' not in env.sandbox.admin(i).get(path)["data"]["envelope.json"] for i in (1, 2, 3))


@integration
def test_a_throttled_probe_never_takes_a_lapsed_lease(busy: Any) -> None:
    """Alice's lease lapses; Bob's take-over needs a probe write on each lease, and the
    probe (every lease write) is refused with 429 past the deadline on two members: Bob
    does not get the lock, the two leases still name Alice's lock id."""
    from helpers.throttle import outcomes_of

    env = busy.env
    took = _json_ok(env.cli("-o", "json", "lock", "acquire", "web", "--ttl", "3s", env={"COORDINATOR_HOLDER": "alice"}))
    time.sleep(12)  # 3 s TTL + 2 s + 5 s skew margin, and some
    for i in (1, 2):
        busy.throttle_writes(i, "coordinator-lock-web", retry_after=30, times=None)
    proc = env.cli("--timeout", "3s", "-o", "json", "lock", "acquire", "web", env={"COORDINATOR_HOLDER": "bob"})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    outcomes = outcomes_of(proc)
    assert outcomes["u1"] == outcomes["u2"] == "throttled", outcomes
    for i in (1, 2):
        lease = env.sandbox.admin(i).get(lease_path(env.namespace, "coordinator-lock-web"))
        assert lease["spec"].get("holderIdentity", "").startswith(took["lock_id"]) or took["lock_id"] in json.dumps(
            lease["spec"]
        ), lease["spec"]


def _json_ok(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# Broke before renewals came three times per validity: lock run --ttl 6s, the first renewal
# got one 429 (Retry-After 1) on 2 of 3 members and the lock was lost (exit 7): 1.9 s were
# left, client._throttled_wait wants Retry-After + 1 s, and keep_renewed then waited TTL/3,
# past the validity less the lead (TTL/3).
@integration
def test_a_renewal_throttled_once_inside_lock_run_does_not_stop_the_child(busy: Any, tmp_path: Path) -> None:
    env = busy.env
    ready = tmp_path / "running"
    run = env.popen(
        "-v", "--timeout", "5s", "lock", "run", "web", "--ttl", "6s", "--",
        "sh", "-c", f"touch {ready}; sleep 9",
        env={"COORDINATOR_HOLDER": "busy"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        while not ready.exists():
            assert time.monotonic() < deadline and run.poll() is None, "lock run did not start its child"
            time.sleep(0.1)
        for i in (1, 2):
            busy.throttle_writes(i, "coordinator-lock-web", retry_after=1, times=1)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err[-800:]
    assert "LOCK LOST" not in err
    assert "throttled; retrying" in err, err[-800:]


@integration
def test_a_renewal_throttled_once_inside_a_longer_lock_run_is_retried(busy: Any, tmp_path: Path) -> None:
    """Held, the control of the test above: with --ttl 15s the first renewal has room for
    Retry-After + margin, is sent again, and the child runs to its end."""
    env = busy.env
    ready = tmp_path / "running"
    run = env.popen(
        "-v", "--timeout", "5s", "lock", "run", "web", "--ttl", "15s", "--",
        "sh", "-c", f"touch {ready}; sleep 8",
        env={"COORDINATOR_HOLDER": "busy"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        while not ready.exists():
            assert time.monotonic() < deadline and run.poll() is None, "lock run did not start its child"
            time.sleep(0.1)
        for i in (1, 2):
            busy.throttle_writes(i, "coordinator-lock-web", retry_after=1, times=1)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err[-800:]
    assert "throttled; retrying" in err, err[-800:]
