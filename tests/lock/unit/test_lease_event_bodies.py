"""The lock's moments as Kubernetes Events about its Lease (coordinator/engine/lock/kubeevents.py):
the note and the body built from the history's events, which member gets which Event,
and that a writer that fails or hangs never reaches the command. What a real API server
accepts is tested in tests/lock/integration/test_lease_events.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from coordinator.engine import history
from coordinator.engine.lock.core import DeferredHistory, EngineCore
from coordinator.engine.lock.kubeevents import (
    MAX_NOTE_BYTES,
    REASONS,
    LeaseEvents,
    Touched,
    cut_bytes,
    event_body,
    events_path,
    note,
    plan,
)
from coordinator.kube.client import FORBIDDEN, KubeError
from coordinator.rules.lease import LeaseView

pytestmark = pytest.mark.anyio


def view(lock_id: str | None, uid: str = "uid-1") -> LeaseView:
    return LeaseView(exists=True, lock_id=lock_id, uid=uid)


def test_the_note_names_holder_lock_id_token_and_reason() -> None:
    (e,) = history.take_events("abc123", holder="alice@ci", host="h", pid="1", reason="deploy 1.2", token=7, lapsed={})
    assert note(e) == "holder alice@ci; lock id abc123; fencing token 7; reason deploy 1.2"


def test_the_note_says_who_acted_and_what_they_saw() -> None:
    (e,) = history.break_events(by="bob", reason="stuck", cleared={"c1": view("abc123")})
    text = note(e)
    assert "lock id abc123" in text and "by bob" in text
    assert "break reason: stuck; cleared on c1" in text


def test_the_note_escapes_text_another_client_wrote() -> None:
    (e,) = history.lost_events("abc123", holder="evil\x1b]0;owned\x07\nforged line", token=3, why="taken")
    text = note(e)
    assert "\x1b" not in text and "\n" not in text and "\x07" not in text
    assert "evil\\x1b]0;owned\\x07\\nforged line" in text


def test_the_note_fits_an_events_1kb_limit_without_splitting_a_character() -> None:
    # Each field is cut to 256 characters by the history; four of them, two bytes each, are
    # still past 1 kB.
    e = history.event(history.BROKEN, "abc123", token=3, holder="é" * 300, reason="é" * 300, by="b", note="é" * 300)
    assert len(" ".join(str(v) for v in e.values()).encode()) > MAX_NOTE_BYTES
    text = note(e)
    assert len(text.encode()) <= MAX_NOTE_BYTES
    assert text.endswith("...")
    assert cut_bytes("é" * 10, 6) == "é..."  # never half of a two-byte character


@pytest.mark.parametrize(
    ("kind", "reason", "kind_of_event"),
    [
        (history.ACQUIRED, "Acquired", "Normal"),
        (history.RELEASED, "Released", "Normal"),
        (history.BROKEN, "Broken", "Warning"),
        (history.EXPIRED, "TakenOver", "Warning"),
        (history.LOST, "Lost", "Warning"),
    ],
)
def test_the_body_is_an_event_about_the_lease(kind: str, reason: str, kind_of_event: str) -> None:
    e = history.event(kind, "abc123", token=4, holder="alice")
    body = event_body(e, namespace="payments", lease="coordinator-lock-web", uid="u-1", instance="host-1")
    assert body["apiVersion"] == "events.k8s.io/v1" and body["kind"] == "Event"
    assert body["metadata"]["namespace"] == "payments"
    assert body["metadata"]["name"].startswith("coordinator-lock-web.")
    assert (
        body["metadata"]["name"]
        != event_body(e, namespace="payments", lease="coordinator-lock-web", uid=None)["metadata"]["name"]
    )
    assert body["reason"] == reason and body["type"] == kind_of_event and body["action"]
    assert body["regarding"] == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "namespace": "payments",
        "name": "coordinator-lock-web",
        "uid": "u-1",
    }
    assert body["reportingController"] == "coordinator.io/coordinator"
    assert body["reportingInstance"] == "host-1"
    assert body["eventTime"].endswith("Z")
    assert body["note"] == note(e)


def test_every_history_event_has_its_reason() -> None:
    assert set(REASONS) == set(history.EVENTS)


def test_a_lease_whose_uid_is_not_known_is_named_without_one() -> None:
    e = history.event(history.RELEASED, "abc123")
    assert "uid" not in event_body(e, namespace="ns", lease="l", uid=None)["regarding"]


def test_each_member_gets_the_events_about_what_it_held() -> None:
    # A take over a lapsed lease on c1 and a free one on c2: both say Acquired, only c1
    # says TakenOver (c3 was not taken, so it gets nothing).
    lapsed = view("old999", uid="u-c1")
    events = history.take_events("new123", holder="a", host="h", pid="1", reason="", token=9, lapsed={"c1": lapsed})
    touched = {
        "c1": Touched(lapsed, view("new123", uid="u-c1")),
        "c2": Touched(view(None, uid="u-c2"), view("new123", uid="u-c2")),
    }
    got = [(c, b["reason"], b["regarding"]["uid"]) for c, b in plan(events, touched, namespace="ns", lease="l")]
    assert got == [("c1", "Acquired", "u-c1"), ("c2", "Acquired", "u-c2"), ("c1", "TakenOver", "u-c1")]


def test_a_loss_is_told_on_every_member_the_renewal_read() -> None:
    events = history.lost_events("mine", holder="a", token=2, why="held by other on c1")
    touched = {"c1": Touched(after=view("other")), "c2": Touched(after=view("mine"))}
    assert [(c, b["reason"]) for c, b in plan(events, touched, namespace="ns", lease="l")] == [
        ("c1", "Lost"),
        ("c2", "Lost"),
    ]


class Client:
    def __init__(self, fail: BaseException | None = None, hang: bool = False) -> None:
        self.fail, self.hang = fail, hang
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, *, body: dict[str, Any], timeout: float) -> None:
        self.sent.append((method, path, body))
        if self.hang:
            await anyio.sleep_forever()
        if self.fail is not None:
            raise self.fail


def clusters(**clients: Client) -> Any:
    return SimpleNamespace(client=lambda name: clients[name], timeout=5.0)


async def test_events_are_posted_to_the_namespace_of_the_lease() -> None:
    c1 = Client()
    events = history.release_events("abc", {"c1": view("abc")})
    await LeaseEvents().post(
        clusters(c1=c1), events, {"c1": Touched(view("abc"), view(None))}, namespace="ns", lease="l", timeout=5
    )
    ((method, path, body),) = c1.sent
    assert (method, path, body["reason"]) == ("POST", events_path("ns"), "Released")


async def test_a_refused_or_hanging_event_never_reaches_the_caller() -> None:
    denied = Client(fail=KubeError(FORBIDDEN, "HTTP 403: events.events.k8s.io is forbidden", status=403))
    broken = Client(fail=OSError("connection reset"))
    hanging = Client(hang=True)
    surprising = Client(fail=RuntimeError("not a KubeError"))
    events = history.lost_events("abc", holder="a", token=1, why="gone")
    touched = {name: Touched(after=view("x")) for name in ("c1", "c2", "c3", "c4")}
    # Returns (nothing raised) although c3 never answers: each request is bounded.
    await LeaseEvents(timeout_s=0.05).post(
        clusters(c1=denied, c2=broken, c3=hanging, c4=surprising), events, touched, namespace="ns", lease="l", timeout=5
    )
    assert all(len(c.sent) == 1 for c in (denied, broken, hanging, surprising))


class Store:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def record(self, events: list[dict[str, Any]], *, timeout: float) -> None:
        self.log.append("history")


class Writer(LeaseEvents):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def post(self, clusters: Any, events: list[dict[str, Any]], touched: Any, **kw: Any) -> None:
        self.log.append("events:" + ",".join(sorted(touched)))


def engine(tg: Any, deferred: DeferredHistory | None, log: list[str], writer: LeaseEvents | None) -> EngineCore:
    e = EngineCore.__new__(EngineCore)
    e.background, e.deferred, e.lease_events = tg, deferred, writer
    e._history = Store(log)  # type: ignore[assignment]
    e.clusters = SimpleNamespace(timeout=5.0)  # type: ignore[assignment]
    e.config = SimpleNamespace(deployment=SimpleNamespace(namespace="ns"))  # type: ignore[assignment]
    e.name = "coordinator-lock-web"
    return e


async def test_events_go_in_the_background_after_the_history() -> None:
    log: list[str] = []
    deferred = DeferredHistory()
    async with anyio.create_task_group() as tg:
        e = engine(tg, deferred, log, Writer(log))
        await e.remember([{"event": "acquired"}], {"c1": Touched(), "c2": Touched()})
        assert log == []  # the caller did not wait for either
        deferred.closing.set()
    assert log == ["history", "events:c1,c2"]


async def test_without_a_writer_or_a_task_group_no_event_is_written() -> None:
    log: list[str] = []
    async with anyio.create_task_group() as tg:
        await engine(tg, DeferredHistory(), log, None).remember([{"event": "acquired"}], {"c1": Touched()})
    assert log == ["history"]
    # No task group: the history is written here, the Events are not (never inline).
    await engine(None, None, log, Writer(log)).remember([{"event": "released"}], {"c1": Touched()})
    assert log == ["history", "history"]
