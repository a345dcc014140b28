"""History writers whose clocks disagree with the server's: no newer event is erased, none is pushed out."""

from __future__ import annotations

import copy
import json
import time
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest

from coordinator.kube.client import ApiResponse, KubeError

integration = pytest.mark.integration


class _HistoryClusters:
    """Just enough of a ClusterSet for a HistoryStore: one ConfigMap per cluster, whose
    managedFields name the field manager of the last write (as an API server does)."""

    timeout = 5.0

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.silent: set[str] = set()

    async def check_identity(self, name: str) -> None:
        return None

    def client(self, cluster: str) -> Any:
        outer = self

        class Client:
            async def request(self, method: str, path: str, body: Any = None, query: Any = None, **kw: Any) -> Any:
                if method == "POST":
                    path = f"{path}/{body['metadata']['name']}"
                key = (cluster, path)
                if method == "GET":
                    if key not in outer.objects:
                        raise KubeError("not-found", "HTTP 404", status=404)
                    return ApiResponse(200, copy.deepcopy(outer.objects[key]), None)
                obj = copy.deepcopy(body)
                manager = (query or {}).get("fieldManager", "")
                obj["metadata"]["managedFields"] = [
                    {"manager": manager, "operation": "Update", "fieldsV1": {"f:data": {".": {}, "f:history.json": {}}}}
                ]
                obj["metadata"]["resourceVersion"] = str(time.monotonic_ns())
                outer.objects[key] = obj
                return ApiResponse(200, copy.deepcopy(obj), None)

        return Client()


# Broke before: a writer 20 min behind dropped every event 'in the future' of its clock, and wrote the rest back.
def test_a_writer_whose_clock_is_behind_does_not_erase_newer_history(monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.engine import history

    clusters = _HistoryClusters()
    book = history.HistoryStore(clusters, "web", "ns", ["c1", "c2", "c3"])  # type: ignore[arg-type]
    real = [history.event("acquired", "a" * 16, holder="alice"), history.event("released", "a" * 16, holder="alice")]
    anyio.run(lambda: book.append(real, timeout=5))

    class Behind(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) - timedelta(minutes=20)

    monkeypatch.setattr(history, "datetime", Behind)
    anyio.run(lambda: book.append([history.event("acquired", "b" * 16, holder="bob")], timeout=5))
    monkeypatch.undo()
    events, _ = anyio.run(lambda: book.read(timeout=5))
    assert {e["lock_id"] for e in events} == {"a" * 16, "b" * 16}, events


def test_events_a_writer_keeps_for_being_ahead_push_no_real_one_out() -> None:
    """What a write keeps although it is dated ahead of the server (planted in the year
    9000 under the coordinator manager, or a writer's clock ahead) is kept beside the
    bounded list, not in it: the real events and the new one all stay readable."""
    from coordinator.engine import history
    from coordinator.rules.resources import micro_time

    now = datetime(2026, 12, 1, 12, 0).astimezone()
    real = [history.event("acquired", f"real{i}", at=micro_time(now - timedelta(minutes=i))) for i in range(5)]
    forged = [history.event("acquired", f"forged{i}", at="9000-01-01T00:00:00Z") for i in range(300)]
    new = history.event("acquired", "new", at=micro_time(now))
    stored = history.merge_for_write([*real, *forged], [new], now=now)
    read = {e["lock_id"] for e in history.decode(_stored_copy(stored), now=now)}
    assert read == {*(f"real{i}" for i in range(5)), "new"}, read
    assert len([e for e in stored if e["lock_id"].startswith("forged")]) == history.LIMIT


def _stored_copy(events: list[dict[str, Any]]) -> dict[str, Any]:
    fields = {"f:data": {".": {}, "f:history.json": {}}}
    return {
        "metadata": {"managedFields": [{"manager": "coordinator", "operation": "Update", "fieldsV1": fields}]},
        "data": {"history.json": json.dumps(events)},
    }
