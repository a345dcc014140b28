"""Adding, removing and replacing members through a joint configuration, on real API
servers (the 5-cluster sandbox): the stored member set moves epoch by epoch, the state
follows the members, an interrupted change finishes when run again, and a machine whose
record predates the change is refused until it imports the stored set."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from test_membership import _second_machine

from coordinator.config import ConfigStore
from coordinator.kube.resources import configmaps_path, lease_path
from coordinator.membership import A_MEMBERSHIP, Membership

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _stored(env: Env, index: int, deployment: str = "pay") -> Membership:
    lease: dict[str, Any] = anyio.run(
        env.raw, index, "GET", lease_path(env.namespace, f"coordinator-lock-{deployment}")
    )
    found = Membership.parse(lease["metadata"]["annotations"][A_MEMBERSHIP])
    assert found is not None
    return found


def _identities(env: Env, *names: str) -> set[str]:
    cfg = ConfigStore(env.config).load()
    return {cfg.clusters[n].identity for n in names}


def _replica_data(env: Env, index: int, deployment: str = "pay") -> dict[str, Any]:
    obj = anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/coordinator-state-{deployment}")
    return dict(json.loads(obj["data"]["envelope.json"])["data"])


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def _pay(env: Env, *members: str) -> None:
    args = [a for m in members for a in ("--cluster", m)]
    _ok(env.cli("deployment", "create", "pay", "-n", env.namespace, *args))
    lock = json.loads(_ok(env.cli("-o", "json", "lock", "acquire", "pay", "--holder", "w", "--ttl", "30s")).stdout)
    _ok(env.cli("state", "set", "pay", "release=1.2.0", "--lock-id", lock["lock_id"]))
    _ok(env.cli("lock", "release", "pay", "--holder", "w"))


def test_add_then_remove_a_member(dep5: Env, tmp_path: Path) -> None:
    _pay(dep5, "c1", "c2", "c3")
    stale = _second_machine(dep5, tmp_path, "pay", ["c1", "c2", "c3"])
    assert _ok(_acquire(stale)).returncode == 0  # the same record: fine before the change
    _ok(stale.cli("lock", "release", "pay", "--holder", "x"))

    added = _ok(dep5.cli("deployment", "add-cluster", "pay", "c4"))
    assert "epoch 3" in added.stdout
    for i in (1, 2, 3, 4):
        stored = _stored(dep5, i)
        assert stored.epoch == 3 and set(stored.members) == _identities(dep5, "c1", "c2", "c3", "c4")
        assert stored.joint is None
    assert _replica_data(dep5, 4)["release"] == "1.2.0"  # the state was copied before c4 counted
    show = json.loads(_ok(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["epoch"] == 3 and show["clusters"] == ["c1", "c2", "c3", "c4"] and show["change_in_progress"] is None
    stored = show["stored_member_sets"]
    assert all(stored[f"c{i}"] == "epoch 3: c1, c2, c3, c4 (as recorded here)" for i in (1, 2, 3, 4)), stored

    refused = _acquire(stale)
    assert refused.returncode == 5, refused.stderr
    assert "deployment import pay" in refused.stderr
    _ok(stale.cli("deployment", "delete", "pay"))
    _ok(stale.cli("deployment", "import", "pay", "--cluster", "c2", "-n", dep5.namespace))
    _ok(_acquire(stale))
    _ok(stale.cli("lock", "release", "pay", "--holder", "x"))

    _ok(dep5.cli("deployment", "remove-cluster", "pay", "c1"))
    for i in (1, 2, 3, 4):  # the commit is written on the removed member too
        stored = _stored(dep5, i)
        assert stored.epoch == 5 and set(stored.members) == _identities(dep5, "c2", "c3", "c4")
    # the state is still there for the remaining members, with c1 paused
    dep5.sandbox.pause(1)
    assert _ok(dep5.cli("--timeout", "2s", "state", "get", "pay", "release")).stdout.strip() == "1.2.0"


def test_an_interrupted_change_is_finished_by_running_it_again(dep5: Env) -> None:
    _pay(dep5, "c1", "c2", "c3")
    killed = dep5.cli(
        "deployment", "add-cluster", "pay", "c4", "--ttl", "5s", env={"COORDINATOR_TEST_KILL_AFTER": "joint"}
    )
    assert killed.returncode == -9, killed.stderr
    show = json.loads(_ok(dep5.cli("-o", "json", "deployment", "show", "pay")).stdout)
    assert show["change_in_progress"] == {"to": ["c1", "c2", "c3", "c4"]} and show["epoch"] == 2
    assert _stored(dep5, 4).joint is not None  # the joint configuration is what the members store
    again = _ok(dep5.cli("deployment", "add-cluster", "pay", "c4", "--wait", "30s"))
    assert "Finishing the change" in again.stdout
    for i in (1, 2, 3, 4):
        assert _stored(dep5, i).epoch == 3
    assert _replica_data(dep5, 4)["release"] == "1.2.0"


def test_replace_a_rebuilt_member(dep5: Env) -> None:
    """c3 was rebuilt: it came back as a new cluster (new identity), connected as c5."""
    _pay(dep5, "c1", "c2", "c3")
    _ok(dep5.cli("deployment", "replace-cluster", "pay", "c3", "c5"))
    for i in (1, 2, 5):
        stored = _stored(dep5, i)
        assert stored.epoch == 3 and set(stored.members) == _identities(dep5, "c1", "c2", "c5")
    assert _replica_data(dep5, 5)["release"] == "1.2.0"
    dep5.sandbox.pause(3)
    lock = json.loads(_ok(dep5.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "pay", "--holder", "z")).stdout)
    assert {c["name"] for c in lock["clusters"]} == {"c1", "c2", "c5"}


def _acquire(env: Env) -> subprocess.CompletedProcess[str]:
    return env.cli("-o", "json", "--timeout", "3s", "lock", "acquire", "pay", "--holder", "x", "--ttl", "30s")
