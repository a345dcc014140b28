"""The lock history against whoever may write its ConfigMap: planted, replanted, escaped,
deeply nested and misdated events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from helpers.hostile import minted_user, no_crash, request_as

from coordinator.kube.client import KubeError
from coordinator.rules.resources import (
    LABEL_MANAGED_BY,
    LABEL_VALUE,
    configmaps_path,
)

integration = pytest.mark.integration

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _put_history(env: Env, index: int, text: str) -> None:
    path = f"/api/v1/namespaces/{env.namespace}/configmaps/coordinator-history-web"
    try:
        current: dict[str, Any] | None = anyio.run(env.raw, index, "GET", path)
    except KubeError as err:
        assert err.kind == "not-found"
        current = None
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"history.json": text},
                            "metadata": {"name": "coordinator-history-web"}}  # fmt: skip
    if current is None:
        anyio.run(env.raw, index, "POST", f"/api/v1/namespaces/{env.namespace}/configmaps", body)
    else:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        anyio.run(env.raw, index, "PUT", path, body)


def _history_problems(env: Env) -> list[str]:
    problems = []
    for args in (("lock", "acquire", "web", "--holder", "bob", "--ttl", "20s"),
                 ("lock", "history", "web"), ("-o", "json", "lock", "history", "web"),
                 ("lock", "release", "web", "--holder", "bob")):  # fmt: skip
        proc = env.cli(*args)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            problems.append(f"{args}: exit {proc.returncode}")
        if "Traceback" in proc.stderr or "recursion depth" in out:
            problems.append(f"{args}: a traceback / recursion error on stderr")
        if "\x1b" in out or "\x07" in out:
            problems.append(f"{args}: a raw escape reached the terminal")
        if args[0] != "-o" and ("\r" in out or "\nforged line" in out):
            problems.append(f"{args}: a carriage return or forged line reached the terminal")
    return problems


def test_history_events_carrying_escapes_and_odd_values_are_printed_escaped(dep3: Env) -> None:
    """Whoever may write the history ConfigMap puts events whose text fields and lock id
    carry terminal escapes, a token of 31 digits, a time in year 9999 and one that is no
    time: acquire, release and `lock history` work and print no raw escape."""
    assert dep3.cli("lock", "acquire", "web", "--holder", "alice", "--ttl", "20s").returncode == 0
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    evil = "\x1b]0;pwned\x07\r\x1b[2Kforged line\n"
    events = [
        {
            "lock_id": "L\x1b[31mred",
            "event": "acquired",
            "at": "2026-12-01T00:00:00.000000Z",
            "token": 7,
            "holder": evil,
            "host": evil,
            "reason": evil,
            "note": evil,
        },
        {"lock_id": "L\x1b[31mred", "event": "released", "at": "2026-12-01T00:00:01.000000Z", "by": evil},
        {"lock_id": "x" * 64, "event": "acquired", "at": "9999-12-31T23:59:59.999999Z", "token": 10**30},
        {"lock_id": "y", "event": "acquired", "at": "not a time"},
    ]
    for i in (1, 2, 3):
        _put_history(dep3, i, json.dumps(events))
    problems = _history_problems(dep3)
    assert not problems, "\n".join(problems)
    shown = dep3.cli("-o", "json", "lock", "history", "web")
    assert "pwned" in shown.stdout  # the hostile events were read (and escaped), not skipped


def test_deeply_nested_history_json_is_ignored_quietly(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--holder", "alice", "--ttl", "20s").returncode == 0
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    _put_history(dep3, 1, "[" * 100_000 + "]" * 100_000)
    problems = _history_problems(dep3)
    assert not problems, "\n".join(problems)


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
    from coordinator.engine import history

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


# Broke before: a planted `immutable: true` copy refused every later event (HTTP 422), for good.
@integration
def test_a_planted_immutable_history_copy_is_replaced_by_the_next_event(dep3: Env, tmp_path: Path) -> None:
    minted = minted_user(dep3, tmp_path)
    path = f"{configmaps_path(dep3.namespace)}/coordinator-history-web"
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "coordinator-history-web"},
        "immutable": True,
        "data": {"history.json": "[]"},
    }
    for i in (1, 2, 3):
        anyio.run(dep3.raw, i, "DELETE", path)  # as made by an older version: no copy yet
        request_as(minted, i, "POST", configmaps_path(dep3.namespace), body)
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    proc = dep3.cli("-o", "json", "lock", "history", "web")
    assert proc.returncode == 0, proc.stderr
    assert [t["holder"] for t in json.loads(proc.stdout)["tenures"]] == ["alice"], proc.stderr[-500:]


@integration
def test_a_user_granted_another_deployment_cannot_replant_an_existing_history(dep3: Env, tmp_path: Path) -> None:
    """Held: where the create took the name, neither a POST (even naming the `coordinator`
    field manager, or carrying managedFields of its own) nor any write by name gets in."""
    minted = minted_user(dep3, tmp_path)
    path = f"{configmaps_path(dep3.namespace)}/coordinator-history-web"
    forged = [{"lock_id": "f" * 16, "event": "acquired", "at": "2026-01-01T00:00:00Z", "holder": "mallory"}]
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "coordinator-history-web",
            "managedFields": [
                {
                    "manager": "coordinator",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:data": {".": {}, "f:history.json": {}}},
                }
            ],
        },
        "data": {"history.json": json.dumps(forged)},
    }
    for i in (1, 2, 3):
        with pytest.raises(KubeError) as err:
            request_as(minted, i, "POST", configmaps_path(dep3.namespace), body, {"fieldManager": "coordinator"})
        assert err.value.kind == "already-exists", err.value.detail
        for method in ("PUT", "DELETE"):
            with pytest.raises(KubeError) as err:
                request_as(minted, i, method, path, body if method == "PUT" else None)
            assert err.value.kind == "forbidden", err.value.detail
