"""The fleet view and watch against leases a user granted another deployment plants: never blinded, never crashed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from helpers.hostile import minted_user, no_crash, request_as

from coordinator.rules.resources import LABEL_DEPLOYMENT, LABEL_MANAGED_BY, LABEL_VALUE, lease_path

integration = pytest.mark.integration


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
