"""The compare-and-swap loop (coordinator/engine/cas.py) against an in-memory object store."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from coordinator.engine import cas
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError


class Store:
    """One object with a resourceVersion; ``races`` concurrent writes land before ours."""

    def __init__(self, value: int = 0, *, races: int = 0) -> None:
        self.value = value
        self.version = 1
        self.races = races
        self.reads = 0
        self.writes = 0
        self.read_error: KubeError | None = None
        self.write_error: KubeError | None = None

    async def read(self) -> tuple[int, int]:
        self.reads += 1
        if self.read_error is not None:
            raise self.read_error
        return self.value, self.version

    async def write(self, seen: tuple[int, int], body: int) -> int:
        self.writes += 1
        if self.write_error is not None:
            raise self.write_error
        if self.races:
            self.races -= 1
            self.value, self.version = self.value + 100, self.version + 1  # someone else's write
        if seen[1] != self.version:
            raise KubeError(kube.CONFLICT, "the object has been modified", status=409)
        self.value, self.version = body, self.version + 1
        return self.version


def increment(seen: tuple[int, int]) -> cas.Put[int] | cas.Keep[str]:
    return cas.Put(seen[0] + 1)


def run(store: Store, **kw: Any) -> Any:
    async def go() -> Any:
        return await cas.compare_and_swap(store.read, kw.pop("decide", increment), store.write, **kw)

    return anyio.run(go)


def test_a_write_that_lands_returns_its_value_and_what_it_replaced() -> None:
    store = Store(5)
    result = run(store)
    assert result == cas.Written(value=2, before=(5, 1))
    assert store.value == 6 and store.reads == 1 and store.writes == 1


def test_a_decision_to_write_nothing_writes_nothing() -> None:
    store = Store(5)
    result = run(store, decide=lambda seen: cas.Keep("as it is"))
    assert result == cas.Decided("as it is")
    assert store.writes == 0


def test_a_lost_race_is_decided_again_on_what_the_server_holds_now() -> None:
    store = Store(5, races=2)
    result = run(store)
    assert isinstance(result, cas.Written)
    # Each retry re-read the object: the increment applies to the other writers' value.
    assert store.value == 5 + 200 + 1
    assert store.reads == 3 and store.writes == 3


def test_every_attempt_lost_gives_raced_without_a_blind_write() -> None:
    store = Store(5, races=10)
    result = run(store, attempts=3)
    assert isinstance(result, cas.Raced)
    assert store.writes == 3 and store.reads == 3
    assert result.current == (205, 3)  # what the last losing write was decided on


def test_reread_last_reports_what_the_server_holds_after_the_last_race() -> None:
    store = Store(5, races=10)
    result = run(store, attempts=3, reread_last=True)
    assert result == cas.Raced((305, 4))
    assert store.writes == 3 and store.reads == 4


def test_an_object_already_read_is_not_read_again_first() -> None:
    store = Store(5)
    result = run(store, current=(5, 1))
    assert isinstance(result, cas.Written) and store.reads == 0


def test_a_failed_write_that_is_no_race_is_not_retried() -> None:
    store = Store(5)
    store.write_error = KubeError(kube.UNREACHABLE, "timed out")
    result = run(store)
    assert isinstance(result, cas.WriteFailed)
    assert result.error is store.write_error and result.current == (5, 1)
    assert store.writes == 1


def test_a_failed_read_is_reported_as_a_read_failure() -> None:
    store = Store(5)
    store.read_error = KubeError(kube.FORBIDDEN, "no")
    result = run(store)
    assert isinstance(result, cas.ReadFailed) and result.error is store.read_error
    assert store.writes == 0


def test_a_failed_reread_after_a_race_is_a_read_failure() -> None:
    store = Store(5, races=1)

    async def read() -> tuple[int, int]:
        if store.reads:
            raise KubeError(kube.UNREACHABLE, "gone")
        return await store.read()

    async def go() -> Any:
        return await cas.compare_and_swap(read, increment, store.write)

    result = anyio.run(go)
    assert isinstance(result, cas.ReadFailed)


def test_a_retry_rule_may_repair_and_go_round_again() -> None:
    store = Store(5)
    store.write_error = KubeError(kube.ERROR, "field is immutable", status=422)
    repaired: list[tuple[int, int]] = []

    async def retry(seen: tuple[int, int], err: KubeError) -> bool:
        if err.status == 422:
            repaired.append(seen)
            store.write_error = None
            return True
        return False

    async def go() -> Any:
        return await cas.compare_and_swap(store.read, increment, store.write, retry=retry)

    result = anyio.run(go)
    assert isinstance(result, cas.Written) and repaired == [(5, 1)]
    assert store.reads == 2 and store.value == 6


def test_already_exists_counts_as_a_lost_race() -> None:
    assert anyio.run(cas.lost_race, None, KubeError(kube.ALREADY_EXISTS, "exists", status=409))
    assert anyio.run(cas.lost_race, None, KubeError(kube.CONFLICT, "modified", status=409))
    assert not anyio.run(cas.lost_race, None, KubeError(kube.FORBIDDEN, "no", status=403))


def test_attempts_must_allow_one_write() -> None:
    with pytest.raises(ValueError):
        run(Store(), attempts=0)


class Churn(Store):
    """A store whose concurrent writes may touch only what the caller does not care
    about (the version moves, the value stays): ``harmless`` such races, then ``races``."""

    def __init__(self, *, harmless: int, races: int = 0) -> None:
        super().__init__(0, races=races)
        self.harmless = harmless

    async def write(self, seen: tuple[int, int], body: int) -> int:
        if self.harmless:
            self.harmless -= 1
            self.writes += 1
            self.version += 1  # another writer's change of something else
            raise KubeError(kube.CONFLICT, "the object has been modified", status=409)
        return await super().write(seen, body)


def same_value(before: tuple[int, int], after: tuple[int, int]) -> bool:
    return before[0] == after[0]


def test_races_lost_to_harmless_changes_do_not_use_up_the_attempts() -> None:
    store = Churn(harmless=6)
    result = run(store, attempts=2, harmless=same_value, harmless_extra=8)
    assert isinstance(result, cas.Written) and store.value == 1 and store.writes == 7


def test_harmless_races_are_spared_only_so_often() -> None:
    store = Churn(harmless=20)
    result = run(store, attempts=2, harmless=same_value, harmless_extra=3)
    assert isinstance(result, cas.Raced) and store.writes == 5 and store.value == 0


def test_a_race_that_changed_what_the_caller_decides_on_still_counts() -> None:
    store = Churn(harmless=0, races=3)
    result = run(store, attempts=2, harmless=same_value, harmless_extra=8)
    assert isinstance(result, cas.Raced) and store.writes == 2
    assert result.current == (200, 3)  # the object as last read
