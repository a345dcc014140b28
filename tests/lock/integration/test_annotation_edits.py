"""Another client edits a lease's annotations (pid, duration, max-ttl note, token): a dead
holder's lock lapses, a live one holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env, make_env
from helpers.hostile import no_crash

from coordinator.rules.resources import (
    lease_path,
)

integration = pytest.mark.integration


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


# Broke before: a max-ttl note of 100000000 under the coordinator manager was believed: bob would wait ~3 years.
@integration
def test_a_max_ttl_note_under_the_coordinator_field_manager_does_not_keep_a_dead_holders_lock(
    sandbox3: Any, tmp_path: Path
) -> None:
    env = make_env(sandbox3, tmp_path, max_ttl_s=6.0)
    assert env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", "alice").returncode == 0
    for i in (1, 2, 3):
        _patch_lease(env, i, {"metadata": {"annotations": {"coordinator.io/max-ttl": "100000000"}}}, "coordinator")
        _patch_lease(env, i, {"spec": {"leaseDurationSeconds": 4}}, "kubectl-edit")
    proc = env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", "bob", "--wait", "35s")
    assert proc.returncode == 0, proc.stderr[-600:]


@integration
@pytest.mark.xfail(
    strict=True,
    reason="open, an assumption (docs/assumptions.md): alice holds (TTL 60s); `kubectl patch "
    '--field-manager=coordinator lease coordinator-lock-web -p \'{"spec":{"leaseDurationSeconds":1}}\'` '
    "on every member: a write under the coordinator field manager is taken as coordinator's, so the "
    "duration is believed and bob takes the live lock in ~9s. No field of the lease ties a duration to "
    "the holder's own write; closing it needs the holder to note its TTL in the same write "
    "(EngineCore.lease_body in lock/core.py), and contenders to believe a duration only where that note agrees",
)
def test_a_duration_edit_under_the_coordinator_field_manager_does_not_expire_a_live_lock(
    sandbox3: Any, tmp_path: Path
) -> None:
    env = make_env(sandbox3, tmp_path)
    assert env.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
    for i in (1, 2, 3):
        _patch_lease(env, i, {"spec": {"leaseDurationSeconds": 1}}, "coordinator")
    proc = env.cli("lock", "acquire", "web", "--ttl", "5s", "--holder", "bob", "--wait", "20s")
    assert proc.returncode == 3, f"exit {proc.returncode}: bob took alice's live lock: {proc.stdout[:300]}"


def _bob(env: Env, tmp_path: Path) -> Env:
    """Another machine: its own config, the same clusters, nothing imported yet."""
    bob = Env(sandbox=env.sandbox, config=tmp_path / "bob" / "config.yaml", namespace=env.namespace)
    for i in (1, 2, 3):
        assert bob.cli("cluster", "connect", f"c{i}", "--context", f"sandbox-{i}").returncode == 0
    return bob


# Broke before: import took one lease's max-ttl note (1s, planted as coordinator's); bob took a live lock.
@integration
def test_an_imported_max_ttl_is_not_lowered_by_a_planted_note(sandbox3: Any, tmp_path: Path) -> None:
    env = make_env(sandbox3, tmp_path, max_ttl_s=120.0)
    assert env.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
    for i in (1, 2, 3):
        _patch_lease(env, i, {"metadata": {"annotations": {"coordinator.io/max-ttl": "1"}}}, "coordinator")
    bob = _bob(env, tmp_path)
    imported = bob.cli("deployment", "import", "web", "--cluster", "c1", "-n", env.namespace)
    assert imported.returncode == 0, imported.stderr
    for i in (1, 2, 3):
        _patch_lease(env, i, {"spec": {"leaseDurationSeconds": 59}}, "kubectl-edit")
    proc = bob.cli("lock", "acquire", "web", "--ttl", "1s", "--holder", "bob", "--wait", "15s")
    assert proc.returncode == 3, f"exit {proc.returncode}: bob took alice's live lock: {proc.stdout[:300]}"
