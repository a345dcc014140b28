"""History writes of a long-lived Coordinator wait a little (coordinator/engine/lock/core.py
EngineCore.remember): what waited together is written together, and the owner's close
sends them at once. The store is a stand-in that records what it is asked to write;
what a real write does is tested against real API servers in tests/lock/integration/test_lock_history.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from coordinator.engine.lock.core import HISTORY_DEFER_S, DeferredHistory, EngineCore

pytestmark = pytest.mark.anyio


class Store:
    def __init__(self) -> None:
        self.calls: list[tuple[float, list[str]]] = []

    async def record(self, events: list[dict[str, Any]], *, timeout: float) -> None:
        self.calls.append((anyio.current_time(), [e["event"] for e in events]))


def engine(tg: Any, deferred: DeferredHistory | None, store: Store) -> EngineCore:
    e = EngineCore.__new__(EngineCore)
    e.background, e.deferred = tg, deferred
    e._history = store  # type: ignore[assignment]
    e.clusters = SimpleNamespace(timeout=5.0)  # type: ignore[assignment]
    return e


async def test_events_that_waited_together_are_written_in_one_call_after_the_delay() -> None:
    store, deferred = Store(), DeferredHistory()
    async with anyio.create_task_group() as tg:
        e = engine(tg, deferred, store)
        t0 = anyio.current_time()
        await e.remember([{"event": "acquired"}])
        await e.remember([{"event": "released"}])
        assert store.calls == []  # nothing yet: the lock's own requests go first
    assert [c[1] for c in store.calls] == [["acquired", "released"]]
    assert store.calls[0][0] - t0 >= HISTORY_DEFER_S * 0.9


async def test_the_owners_close_sends_them_at_once() -> None:
    store, deferred = Store(), DeferredHistory()
    async with anyio.create_task_group() as tg:
        e = engine(tg, deferred, store)
        t0 = anyio.current_time()
        await e.remember([{"event": "acquired"}])
        deferred.closing.set()
    assert [c[1] for c in store.calls] == [["acquired"]]
    assert store.calls[0][0] - t0 < HISTORY_DEFER_S


async def test_without_an_owner_that_closes_the_write_goes_at_once() -> None:
    store = Store()
    async with anyio.create_task_group() as tg:
        e = engine(tg, None, store)
        await e.remember([{"event": "acquired"}])
        await e.remember([{"event": "released"}])
    assert sorted(c[1][0] for c in store.calls) == ["acquired", "released"]  # two writes
    e = engine(None, None, store)
    await e.remember([{"event": "broken"}])  # no task group: recorded here
    assert store.calls[-1][1] == ["broken"]


async def test_engines_of_one_owner_share_the_wait_and_the_write() -> None:
    # A Coordinator makes an engine per call: acquisitions and releases in a row must
    # not each start a write of their own at close, racing for the same copy (events
    # were lost that way when each engine kept its own queue).
    store, deferred = Store(), DeferredHistory()
    async with anyio.create_task_group() as tg:
        for kind in ("acquired", "released", "acquired", "released", "acquired"):
            await engine(tg, deferred, store).remember([{"event": kind}])
        deferred.closing.set()
    assert [c[1] for c in store.calls] == [["acquired", "released", "acquired", "released", "acquired"]]
