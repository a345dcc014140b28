"""The lock's life as Kubernetes Events about its Lease (coordinator/engine/lock/kubeevents.py):
`kubectl get events` and `kubectl describe lease` tell who took, released, broke, took
over and lost it, on the members each moment touched; a user whose RBAC does not grant
Events runs every command exactly as before."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import UNHURRIED, Env
from faults.kubectl import kubectl as run_kubectl
from helpers.rbac import RBAC_API, connect, grant, mint_user, stdout_json, stdout_ok, user_env

from coordinator.engine.lock.kubeevents import events_path
from coordinator.ops.rbac import role_name

pytestmark = pytest.mark.integration

LEASE = "coordinator-lock-web"


def _events(env: Env, index: int, lease: str = LEASE) -> list[dict[str, Any]]:
    """The events.k8s.io Events about ``lease`` on cluster ``index``, oldest first."""
    items = anyio.run(env.raw, index, "GET", events_path(env.namespace))["items"]
    about = [e for e in items if (e.get("regarding") or {}).get("name") == lease]
    return sorted(about, key=lambda e: (e.get("eventTime") or "", e["metadata"]["name"]))


def _wait(what: str, check: Callable[[], bool], seen: Callable[[], Any], timeout: float = 60) -> None:
    """Wait for ``check`` to hold (the Events are written after the decision, in the
    background); the deadline is generous, nothing is asserted about how long it took."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never saw {what}; seen: {seen()}"
        time.sleep(0.2)


def _seen(env: Env, index: int, lease: str = LEASE) -> list[tuple[str, str]]:
    return [(e["reason"], e.get("note", "")) for e in _events(env, index, lease)]


def _reasons(env: Env, index: int, lock_id: str) -> list[str]:
    return [e["reason"] for e in _events(env, index) if f"lock id {lock_id};" in e.get("note", "")]


def test_every_moment_of_the_lock_is_an_event_about_the_lease_on_each_member(dep3: Env) -> None:
    env = dep3
    first = stdout_json(
        env.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice", "--reason", "release 1.2", env=UNHURRIED)
    )
    stdout_ok(env.cli("lock", "release", "web", "--holder", "alice", env=UNHURRIED))
    second = stdout_json(
        env.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--reason", "hotfix\x1b[2J", env=UNHURRIED)
    )
    broke = env.cli(
        "lock", "break", "web", "--yes", "--reason", "runner died", env={**UNHURRIED, "COORDINATOR_HOLDER": "oncall"}
    )
    assert broke.returncode == 0, broke.stderr

    async def expiry() -> tuple[Any, Any, Any]:
        async with Env.api(env, timeout=20) as c:
            crashed = await c.acquire("web", ttl=2, holder="crasher")  # never renewed nor released
            taker = await c.acquire("web", ttl=60, holder="taker", wait=30)
            # the crashed holder wakes up: its renewal finds its lease taken
            lost = await c.lock_engine("web").renew(crashed.lock_id, crashed.fencing_token or 0, 2, "crasher")
            return crashed, taker, lost

    crashed, taker, lost = anyio.run(expiry)
    assert lost.lost and not lost.acquired

    # The taker's attempt counts once a majority is taken over: a member it had not taken
    # by then (its lease not yet seen lapsed there) gets no TakenOver, and none of its
    # Acquired. Which members those are is in the taker's result.
    took_over = {
        name
        for name, r in taker.results.items()
        if r.ok and r.value is not None and r.value.action.startswith("took over")
    }
    assert len(took_over) >= 2, taker.results
    # Likewise an acquisition tells Acquired only where it took the lease before it counted
    # (a busy machine may leave one member's answer for later), and a renewal tells Lost
    # where it read the lease.
    took = {
        first["lock_id"]: {c["name"] for c in first["clusters"] if c["outcome"] == "ok"},
        second["lock_id"]: {c["name"] for c in second["clusters"] if c["outcome"] == "ok"},
        crashed.lock_id: {name for name, r in crashed.results.items() if r.ok},
    }
    lost_on = {name for name, r in lost.results.items() if r.value is not None and r.value.view is not None}
    assert all(len(v) >= 2 for v in took.values()) and lost_on, (took, lost.results)
    for i in (1, 2, 3):  # all three members were released and broken; most taken over
        name = f"c{i}"
        over = name in took_over

        def took_here(lock_id: str, name: str = name) -> list[str]:
            return ["Acquired"] if name in took[lock_id] else []

        expected = {
            first["lock_id"]: [*took_here(first["lock_id"]), "Released"],
            second["lock_id"]: [*took_here(second["lock_id"]), "Broken"],
            crashed.lock_id: [
                *took_here(crashed.lock_id),
                *(["Lost"] if name in lost_on else []),
                *(["TakenOver"] if over else []),
            ],
            taker.lock_id: ["Acquired"] if over else [],
        }
        _wait(
            f"every Event on c{i}",
            lambda i=i, expected=expected: all(sorted(_reasons(env, i, k)) == sorted(v) for k, v in expected.items()),
            lambda i=i: _seen(env, i),
        )
        events = _events(env, i)
        for e in events:
            assert e["regarding"]["kind"] == "Lease" and e["regarding"]["namespace"] == env.namespace
            assert e["regarding"].get("uid"), e  # the Lease's own object, for `kubectl describe`
            assert e["reportingController"] == "coordinator.io/coordinator"
        notes = {(e["reason"], e["note"].split("lock id ")[1].split(";")[0]): e["note"] for e in events}
        if name in took[first["lock_id"]]:
            acquired = notes[("Acquired", first["lock_id"])]
            assert "holder alice" in acquired and "reason release 1.2" in acquired
            assert f"fencing token {first['fencing_token']}" in acquired
        # Text another client could have written is escaped.
        if name in took[second["lock_id"]]:
            assert "reason hotfix\\x1b[2J" in notes[("Acquired", second["lock_id"])]
        assert all("\x1b" not in n for n in notes.values())
        broken = notes[("Broken", second["lock_id"])]
        assert "by oncall" in broken and "break reason: runner died" in broken
        if over:
            taken_over = notes[("TakenOver", crashed.lock_id)]
            assert "holder crasher" in taken_over and "by taker" in taken_over and "taken over" in taken_over
        if name in lost_on:
            assert "holder crasher" in notes[("Lost", crashed.lock_id)]
        types = {e["reason"]: e["type"] for e in events}
        assert types.get("Acquired", "Normal") == types["Released"] == "Normal"
        assert types["Broken"] == types.get("Lost", "Warning") == types.get("TakenOver", "Warning") == "Warning"

    # The real kubectl shows them, in `get events` and in `describe lease`, on a member that
    # saw every moment.
    full = next(
        i for i in (1, 2, 3) if f"c{i}" in took_over and f"c{i}" in lost_on and all(f"c{i}" in v for v in took.values())
    )
    got = run_kubectl(
        env.kubeconfig, full, env.namespace, "get", "events", "--field-selector", f"involvedObject.name={LEASE}"
    )
    assert got.returncode == 0, got.stderr
    for reason in ("Acquired", "Released", "Broken", "TakenOver", "Lost"):
        assert reason in got.stdout, got.stdout
    described = run_kubectl(env.kubeconfig, full, env.namespace, "describe", "lease", LEASE)
    assert described.returncode == 0, described.stderr
    events_part = described.stdout.split("Events:", 1)[1]
    assert "Acquired" in events_part and f"lock id {taker.lock_id}" in events_part, described.stdout


def test_a_take_writes_events_only_where_it_took_the_lease(dep3: Env) -> None:
    env = dep3
    # c3's lease held by another lock id that has not lapsed: the take wins c1 and c2 only.
    other = stdout_json(
        env.cli("-o", "json", "lock", "acquire", "web", "--holder", "other", "--ttl", "600", env=UNHURRIED)
    )

    async def release_on_c1_c2() -> None:
        async with Env.api(env, timeout=20) as c:
            engine = c.lock_engine("web")
            for cluster in ("c1", "c2"):
                await engine._release.release_one(cluster, other["lock_id"])

    anyio.run(release_on_c1_c2)
    took = stdout_json(env.cli("-o", "json", "lock", "acquire", "web", "--holder", "mine", env=UNHURRIED))
    for i in (1, 2):
        _wait(
            f"Acquired on c{i}",
            lambda i=i: _reasons(env, i, took["lock_id"]) == ["Acquired"],
            lambda i=i: _seen(env, i),
        )
    # c3 was not touched by the take: nothing about that lock id there (c3's lease still
    # names the other lock id; its own Acquired is there).
    assert _reasons(env, 3, took["lock_id"]) == []
    assert _reasons(env, 3, other["lock_id"]) == ["Acquired"]


def _deny_events(sandbox: Any, index: int, namespace: str, deployment: str) -> None:
    """As cluster admin of ``index``: the deployment's Role without its Events rule."""
    admin = sandbox.admin(index)
    path = f"{RBAC_API}/namespaces/{namespace}/roles/{role_name(deployment, 'configmap')}"
    role = admin.get(path)
    assert role is not None
    kept = [r for r in role["rules"] if r["apiGroups"] != ["events.k8s.io"]]
    assert len(kept) == len(role["rules"]) - 1
    reply = admin.request("PUT", path, {**role, "rules": kept})
    assert reply.status == 200, reply


def test_a_user_whose_rbac_denies_events_runs_every_command_as_before(
    sandbox3: Any, namespace: str, tmp_path: Path
) -> None:
    user, minted = mint_user(sandbox3, tmp_path, "noevents")
    env = user_env(sandbox3, tmp_path, namespace, "noevents")
    grant(sandbox3, env, namespace, user)  # exactly what `rbac print` prints, Events included
    connect(env, minted)
    stdout_ok(env.cli("deployment", "create", "app", "-n", namespace, "--cluster", "u1", "--cluster", "u2",
                      "--cluster", "u3"))  # fmt: skip
    _deny_events(sandbox3, 2, namespace, "app")  # c2 refuses this user's Events (403)
    lease = "coordinator-lock-app"

    # Every command succeeds with the exit codes it has without Events.
    taken = stdout_json(env.cli("-o", "json", "lock", "acquire", "app", "--holder", "u", env=UNHURRIED))
    assert taken["acquired"] is True
    stdout_ok(env.cli("lock", "release", "app", "--holder", "u", env=UNHURRIED))
    stdout_json(env.cli("-o", "json", "lock", "acquire", "app", "--holder", "v", env=UNHURRIED))
    held = env.cli("lock", "acquire", "app", "--holder", "w", env=UNHURRIED)
    assert held.returncode == 3, held.stderr  # held by another: the documented exit code
    stdout_ok(env.cli("lock", "break", "app", "--yes", "--reason", "test", env=UNHURRIED))
    run = env.cli("lock", "run", "app", "--holder", "r", "--", "sh", "-c", "exit 7", env=UNHURRIED)
    assert run.returncode == 7, run.stderr  # the child's own exit code, as always
    assert "Traceback" not in run.stderr and "event" not in run.stderr.lower()

    # The members that grant Events have them; the one that refuses them has none.
    _wait(
        "Events on c1",
        lambda: {"Acquired", "Released", "Broken"} <= {e["reason"] for e in _events(env, 1, lease)},
        lambda: _seen(env, 1, lease),
    )
    assert _events(env, 2, lease) == []
    _wait(
        "Events on c3",
        lambda: {"Acquired", "Released", "Broken"} <= {e["reason"] for e in _events(env, 3, lease)},
        lambda: _seen(env, 3, lease),
    )

    # And where every member refuses them, the same.
    _deny_events(sandbox3, 1, namespace, "app")
    _deny_events(sandbox3, 3, namespace, "app")
    again = env.cli("-o", "json", "lock", "acquire", "app", "--holder", "x", env=UNHURRIED)
    assert json.loads(stdout_ok(again))["acquired"] is True
    stdout_ok(env.cli("lock", "release", "app", "--holder", "x", env=UNHURRIED))
