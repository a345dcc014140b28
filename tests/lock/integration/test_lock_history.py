"""`lock history`: who held the lock, from when to when, how it ended; kept on every
member beside the state, merged when read, bounded, and never in the lock's way."""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from faults.admission import add_policy, remove_policy
from faults.kubectl import kubectl as run_kubectl
from served import served

from coordinator.cli.history import select
from coordinator.engine import history
from coordinator.engine.history import (
    ACQUIRED,
    BROKEN,
    EXPIRED,
    LOST,
    RELEASED,
    HistoryStore,
    event,
    merge,
    take_events,
    tenures,
)
from coordinator.kube.client import KubeError
from coordinator.rules.lease import LeaseView
from coordinator.rules.resources import configmaps_path, history_name, micro_time

# --- pure: merging copies, bounds, endings -------------------------------------------------


def _at(seconds: float) -> str:
    return micro_time(datetime(2026, 12, 1, 2, 0, tzinfo=UTC) + timedelta(seconds=seconds))


def _tenure(lock_id: str, start: float, end: str, end_at: float, holder: str = "h") -> list[dict[str, Any]]:
    return [
        event(ACQUIRED, lock_id, at=_at(start), token=int(start), holder=holder),
        event(end, lock_id, at=_at(end_at), holder=holder, by=holder),
    ]


def test_merge_keeps_each_lock_id_and_event_once_whatever_the_copies_and_their_order() -> None:
    a = _tenure("aaaa", 0, RELEASED, 10)
    b = _tenure("bbbb", 20, RELEASED, 30)
    c = _tenure("cccc", 40, BROKEN, 50)
    # one member missed b (it was down), another missed c, one has everything twice
    copies = [a + b, a + c, a + b + c + a + b + c]
    merged = merge(*copies)
    assert [(e["lock_id"], e["event"]) for e in merged] == [
        ("aaaa", ACQUIRED),
        ("aaaa", RELEASED),
        ("bbbb", ACQUIRED),
        ("bbbb", RELEASED),
        ("cccc", ACQUIRED),
        ("cccc", BROKEN),
    ]
    for _ in range(20):
        shuffled = [random.sample(copy, len(copy)) for copy in random.sample(copies, len(copies))]
        assert merge(*shuffled) == merged
    assert merge(merged) == merged  # merging again changes nothing


def test_merge_of_two_records_of_one_event_keeps_the_earlier() -> None:
    seen_by_1 = event(EXPIRED, "aaaa", at=_at(12), by="taker", note="on c1")
    seen_by_2 = event(EXPIRED, "aaaa", at=_at(11), by="taker", note="on c2")
    assert merge([seen_by_1], [seen_by_2]) == merge([seen_by_2], [seen_by_1]) == [seen_by_2]


def test_merge_is_bounded_to_the_newest_lock_ids() -> None:
    events = [e for i in range(130) for e in _tenure(f"id{i:04d}", i * 10, RELEASED, i * 10 + 5)]
    merged = merge(events)
    kept = {e["lock_id"] for e in merged}
    assert len(kept) == history.LIMIT
    assert kept == {f"id{i:04d}" for i in range(30, 130)}
    assert len(merge(events, limit=3)) == 6


def test_malformed_entries_are_dropped_and_text_is_cut_short() -> None:
    good = event(ACQUIRED, "aaaa", at=_at(0), holder="x" * 1000, token=3)
    junk: list[Any] = [
        "not an event",
        {"lock_id": "bbbb", "event": "exploded", "at": _at(1)},
        {"lock_id": "", "event": ACQUIRED, "at": _at(1)},
        {"lock_id": "cccc", "event": ACQUIRED, "at": "yesterday"},
        {"lock_id": "dddd", "event": ACQUIRED, "at": _at(1), "token": "7", "holder": 5},
    ]
    merged = merge([good, *junk])
    assert [e["lock_id"] for e in merged] == ["aaaa", "dddd"]
    assert len(merged[0]["holder"]) == history.MAX_TEXT
    assert "token" not in merged[1] and "holder" not in merged[1]
    ours = {"managedFields": [{"manager": "coordinator", "fieldsV1": {"f:data": {f"f:{history.DATA_KEY}": {}}}}]}
    obj = {"metadata": ours, "data": {history.DATA_KEY: json.dumps([good, *junk])}}
    assert [e["lock_id"] for e in history.decode(obj)] == ["aaaa", "dddd"]
    assert history.decode({"metadata": ours, "data": {history.DATA_KEY: "{not json"}}) == []


def test_tenures_say_how_each_ended_preferring_what_the_holder_or_an_admin_did() -> None:
    events = [
        *_tenure("aaaa", 0, RELEASED, 10, holder="alice"),
        # the taker saw bob's lease lapsed; bob's renewal then found it lost
        event(ACQUIRED, "bbbb", at=_at(20), holder="bob", token=5),
        event(EXPIRED, "bbbb", at=_at(40), holder="bob", by="carol"),
        event(LOST, "bbbb", at=_at(41), holder="bob", by="bob"),
        event(ACQUIRED, "cccc", at=_at(40), holder="carol", token=6),
        # still held: no end recorded
    ]
    found = tenures(merge(events))
    assert [(t.lock_id, t.holder, t.ended, t.by) for t in found] == [
        ("aaaa", "alice", RELEASED, "alice"),
        ("bbbb", "bob", EXPIRED, "carol"),
        ("cccc", "carol", None, ""),
    ]
    bob = found[1]
    assert bob.since == datetime.fromisoformat(_at(20)) and bob.until == datetime.fromisoformat(_at(40))
    assert bob.token == 5 and [e["event"] for e in bob.to_json()["events"]] == [ACQUIRED, EXPIRED, LOST]
    # an end whose acquisition was not recorded still names the holder seen on the lease
    [orphan] = tenures([event(BROKEN, "dddd", at=_at(5), holder="dave", by="oncall")])
    assert (orphan.holder, orphan.since, orphan.ended, orphan.by) == ("dave", None, BROKEN, "oncall")


def test_select_by_since_and_limit() -> None:
    found = tenures(merge(*[_tenure(f"id{i}", i * 100, RELEASED, i * 100 + 50) for i in range(5)]))
    since = datetime.fromisoformat(_at(260))
    assert [t.lock_id for t in select(found, since=since, limit=None)] == ["id3", "id4"]
    assert [t.lock_id for t in select(found, since=None, limit=2)] == ["id3", "id4"]
    assert select(found, since=None, limit=0) == []


def test_a_take_over_records_the_lapsed_holder_as_expired_seen_by_the_taker() -> None:
    lapsed_lease = {
        "metadata": {"annotations": {"coordinator.io/holder": "crasher", "coordinator.io/fencing-token": "7"}},
        "spec": {"holderIdentity": "crasher/ffff0000ffff0000", "leaseDurationSeconds": 2},
    }
    view = LeaseView.parse(served(lapsed_lease))
    assert view.lock_id == "ffff0000ffff0000"
    events = take_events(
        "aaaa", holder="taker", host="h", pid="1", reason="r", token=8, lapsed={"c2": view, "c1": view}
    )
    assert [(e["lock_id"], e["event"]) for e in events] == [("aaaa", ACQUIRED), ("ffff0000ffff0000", EXPIRED)]
    expired = events[1]
    assert expired["by"] == "taker" and expired["holder"] == "crasher" and expired["token"] == 7
    assert "c1, c2" in expired["note"] and expired["at"] == events[0]["at"]


# --- on the sandbox --------------------------------------------------------------------------


def _json(proc: Any) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _copy(env: Any, index: int) -> list[dict[str, Any]]:
    """The events kept on cluster ``index`` (none when it has no copy)."""
    try:
        obj = anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/{history_name(env.deployment)}")
    except KubeError as err:
        assert err.kind == "not-found"
        return []
    return history.decode(obj)


def _history(env: Any, *args: str) -> dict[str, Any]:
    found: dict[str, Any] = _json(env.cli("-o", "json", "lock", "history", env.deployment, *args))
    return found


@pytest.mark.integration
def test_acquire_release_and_break_are_recorded_on_every_member(dep3: Any) -> None:
    env = dep3
    first = _json(env.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice", "--reason", "release 1.2"))
    _json(env.cli("-o", "json", "lock", "release", "web", "--holder", "alice"))
    # text from the clusters: a terminal control sequence in the reason is printed escaped
    second = _json(env.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--reason", "hotfix\x1b[2J"))
    broke = env.cli("lock", "break", "web", "--yes", "--reason", "runner died", env={"COORDINATOR_HOLDER": "oncall"})
    assert broke.returncode == 0, broke.stderr

    doc = _history(env)
    assert [c["read"] for c in doc["clusters"]] == [True, True, True]
    rows = [(t["lock_id"], t["holder"], t["ended"], t["by"]) for t in doc["tenures"]]
    assert rows == [
        (first["lock_id"], "alice", "released", "alice"),
        (second["lock_id"], "bob", "broken", "oncall"),
    ]
    alice, bob = doc["tenures"]
    assert alice["reason"] == "release 1.2" and alice["fencing_token"] == first["fencing_token"]
    assert alice["since"] <= alice["until"] <= bob["since"] <= bob["until"]
    assert alice["host"] and alice["pid"]
    assert "runner died" in bob["note"]
    for i in (1, 2, 3):  # every member keeps the whole record
        assert {(e["lock_id"], e["event"]) for e in _copy(env, i)} == {
            (first["lock_id"], ACQUIRED),
            (first["lock_id"], RELEASED),
            (second["lock_id"], ACQUIRED),
            (second["lock_id"], BROKEN),
        }

    text = env.cli("lock", "history", "web")
    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if "bob" in x)
    assert second["lock_id"] in line and "broken by oncall" in line and "hotfix\\x1b[2J" in line
    assert "\x1b" not in text.stdout
    assert [t["holder"] for t in _history(env, "--limit", "1")["tenures"]] == ["bob"]


@pytest.mark.integration
def test_expiry_is_recorded_by_the_taker_and_the_loser_records_its_loss(dep3: Any) -> None:
    env = dep3

    async def scenario() -> tuple[Any, Any, Any]:
        async with env.api() as c:
            crashed = await c.acquire("web", ttl=2, holder="crasher")  # never renewed nor released
            taker = await c.acquire("web", ttl=30, holder="taker", wait=30)
            # the crashed holder wakes up: its renewal finds the lease taken
            lost = await c.lock_engine("web").renew(crashed.lock_id, crashed.fencing_token or 0, 2, "crasher")
            return crashed, taker, lost

    crashed, taker, lost = anyio.run(scenario)
    assert lost.lost and not lost.acquired
    doc = _history(env)
    by_id = {t["lock_id"]: t for t in doc["tenures"]}
    gone = by_id[crashed.lock_id]
    assert (gone["holder"], gone["ended"], gone["by"]) == ("crasher", "expired", "taker")
    assert [e["event"] for e in gone["events"]] == [ACQUIRED, EXPIRED, LOST]
    expired = gone["events"][1]
    # dated when the taker saw it, which is when the taker's tenure starts
    assert expired["at"] == by_id[taker.lock_id]["since"]
    assert "taken over" in expired["note"]
    assert by_id[taker.lock_id]["ended"] is None and by_id[taker.lock_id]["holder"] == "taker"


@pytest.mark.integration
def test_a_member_down_while_recording_loses_nothing(dep3: Any) -> None:
    env = dep3
    env.sandbox.pause(3)
    try:
        taken = env.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice")
        lock_id = _json(taken)["lock_id"]
        assert "lock history not recorded on every member" in taken.stderr  # a warning,
        released = env.cli("lock", "release", "web", "--holder", "alice")
        assert released.returncode == 0, released.stderr  # never an error
    finally:
        env.sandbox.resume(3)
    assert {e["event"] for e in _copy(env, 1) if e["lock_id"] == lock_id} == {ACQUIRED, RELEASED}
    assert _copy(env, 3) == []  # it was down: its copy never heard of it

    # The member is back; another is down now: the record is still whole.
    env.sandbox.pause(1)
    try:
        doc = env.cli("-o", "json", "lock", "history", "web")
        assert doc.returncode == 0, doc.stderr
        found = json.loads(doc.stdout)
    finally:
        env.sandbox.resume(1)
    assert [c["read"] for c in found["clusters"]] == [False, True, True]
    assert [(t["lock_id"], t["ended"]) for t in found["tenures"]] == [(lock_id, "released")]
    assert "Could not read the history on c1" in doc.stderr

    # Two down: fewer than a majority read, said so by the exit status (after printing).
    env.sandbox.pause(1)
    env.sandbox.pause(2)
    try:
        short = env.cli("-o", "json", "lock", "history", "web")
    finally:
        env.sandbox.resume(1)
        env.sandbox.resume(2)
    assert short.returncode == 4, short.stderr
    assert json.loads(short.stdout)["tenures"] == []


@pytest.mark.integration
def test_an_acquire_does_not_wait_for_history_on_members_that_gave_no_answer_to_the_take(dep5: Any) -> None:
    """c4 and c5 paused, c3 refusing writes of the history (an admission policy): the lock
    is taken on c1-c3 and its token floor recorded there, but only c1 and c2 can record
    the history, fewer than a majority. The history waited for the paused members to
    make one, up to the per-cluster timeout (30 s here); they gave no answer to the take,
    so it now ends once every other member answered, with a warning. The acquisition is
    recorded where it could be, and `lock history` shows it."""
    env = dep5
    ns = env.namespace
    policy = f"refuse-history-{ns}"
    expression = f"request.namespace != '{ns}' || object.metadata.name != '{history_name(env.deployment)}'"
    admin = env.sandbox.admin(3)
    add_policy(admin, policy, expression, "the lock history is frozen here", exist_ok=False)
    try:
        deadline = time.monotonic() + 30
        # a new policy takes effect asynchronously: wait until a dry run is refused
        while run_kubectl(env.kubeconfig, 3, ns, "annotate", "--overwrite", "--dry-run=server", "configmap",
                          history_name(env.deployment), "probe=1").returncode == 0:  # fmt: skip
            assert time.monotonic() < deadline, "the policy never took effect"
            time.sleep(0.5)
        env.sandbox.pause(4)
        env.sandbox.pause(5)
        try:
            started = time.monotonic()
            taken = env.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice",
                            env={"COORDINATOR_TIMEOUT": "30s"})  # fmt: skip
            elapsed = time.monotonic() - started
        finally:
            env.sandbox.resume(4)
            env.sandbox.resume(5)
    finally:
        remove_policy(admin, policy)
    lock_id = _json(taken)["lock_id"]
    assert elapsed < 20, f"lock acquire took {elapsed:.1f}s: it waited for the paused members"
    assert "lock history not recorded on a majority: on 2 of 5 members" in taken.stderr, taken.stderr
    assert "not waited for" in taken.stderr
    for i in (1, 2):
        assert {e["event"] for e in _copy(env, i) if e["lock_id"] == lock_id} == {ACQUIRED}
    for i in (3, 4, 5):
        assert all(e["lock_id"] != lock_id for e in _copy(env, i))
    (tenure,) = [t for t in _history(env)["tenures"] if t["lock_id"] == lock_id]
    assert (tenure["holder"], tenure["ended"]) == ("alice", None)


@pytest.mark.integration
def test_history_is_bounded_on_the_clusters(dep3: Any) -> None:
    env = dep3
    old = [e for i in range(history.LIMIT) for e in _tenure(f"old{i:04d}", i, RELEASED, i + 0.5)]

    async def seed() -> None:
        async with env.api() as c:
            store = HistoryStore(c.clusters, "web", env.namespace, env.clusters)
            results = await store.append(old, timeout=5)
            assert all(r.ok for r in results.values()), results

    anyio.run(seed)
    assert len({e["lock_id"] for e in _copy(env, 2)}) == history.LIMIT
    taken = _json(env.cli("-o", "json", "lock", "acquire", "web", "--holder", "newest"))
    _json(env.cli("-o", "json", "lock", "release", "web", "--holder", "newest"))
    for i in (1, 2, 3):
        kept = [e["lock_id"] for e in _copy(env, i)]
        ids = list(dict.fromkeys(kept))
        assert len(ids) == history.LIMIT and ids[-1] == taken["lock_id"] and "old0000" not in ids
        raw = anyio.run(env.raw, i, "GET", f"{configmaps_path(env.namespace)}/{history_name('web')}")
        assert len(raw["data"][history.DATA_KEY]) < 64 * 1024  # far below the object size limit
    assert len(_history(env)["tenures"]) == history.LIMIT


@pytest.mark.integration
def test_a_history_that_cannot_be_written_is_a_warning_and_the_lock_works(dep3: Any) -> None:
    env = dep3
    path = f"{configmaps_path(env.namespace)}/{history_name('web')}"
    # An immutable ConfigMap under the history's name on every member, which a finalizer
    # keeps when deleted: no update lands, and the delete that replaces such a copy
    # leaves it where it is (nothing here removes the finalizer but the test).
    for i in (1, 2, 3):
        anyio.run(env.raw, i, "DELETE", path)  # the create's
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": history_name("web"), "finalizers": ["coordinator.test/keep"]},
            "data": {history.DATA_KEY: "[]"},
            "immutable": True,
        }
        anyio.run(env.raw, i, "POST", configmaps_path(env.namespace), body)
    try:
        taken = env.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice")
        assert taken.returncode == 0 and _json(taken)["acquired"] is True
        assert "lock history not recorded" in taken.stderr
        released = env.cli("lock", "release", "web", "--holder", "alice")
        assert released.returncode == 0, released.stderr
        assert _history(env)["tenures"] == []
    finally:
        for i in (1, 2, 3):  # let the kept copies go
            kept = anyio.run(env.raw, i, "GET", path)
            kept["metadata"]["finalizers"] = []
            anyio.run(env.raw, i, "PUT", path, kept)
