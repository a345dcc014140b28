"""What a user holding exactly the printed rights can and cannot reach: other deployments' objects, other namespaces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from helpers.hostile import minted_user, request_as

from coordinator.kube.client import KubeError
from coordinator.rules.resources import (
    configmaps_path,
    lease_path,
    leases_path,
)

integration = pytest.mark.integration


@integration
def test_the_granted_user_cannot_touch_another_deployments_lease_or_state(dep3: Env, tmp_path: Path) -> None:
    """Held: with the Role of `app`, `web`'s lease and state (which exist) can be neither
    read, replaced, patched nor deleted, and re-creating them is refused by name."""
    minted = minted_user(dep3, tmp_path)
    lease = lease_path(dep3.namespace, "coordinator-lock-web")
    state = f"{configmaps_path(dep3.namespace)}/coordinator-state-web"
    before = [anyio.run(dep3.raw, 1, "GET", p) for p in (lease, state)]
    for path in (lease, state):
        for method, body in (("GET", None), ("PUT", before[0]), ("DELETE", None)):
            with pytest.raises(KubeError) as err:
                request_as(minted, 1, method, path, body)
            assert err.value.kind == "forbidden", (method, path, err.value.detail)
    for path, obj in ((lease, before[0]), (state, before[1])):
        fresh = {k: v for k, v in obj.items() if k != "metadata"} | {"metadata": {"name": obj["metadata"]["name"]}}
        with pytest.raises(KubeError) as err:
            request_as(minted, 1, "POST", path.rsplit("/", 1)[0], fresh)
        assert err.value.kind in ("already-exists", "conflict", "forbidden"), err.value.detail
    after = [anyio.run(dep3.raw, 1, "GET", p) for p in (lease, state)]
    assert [a["metadata"]["resourceVersion"] for a in after] == [b["metadata"]["resourceVersion"] for b in before]


@integration
def test_exactly_the_printed_rights_serve_a_new_member_its_history_and_a_backup_dir(
    sandbox3: Any, namespace: str, tmp_path: Path
) -> None:
    """Held: with exactly `rbac print --deployment app --fleet`, `deployment
    replace-cluster` and `add-cluster` onto members without a copy of the lock history
    (created there too), `lock
    history` of every member, `state sync --backup-dir` saving a replica a namespace writer
    garbled, and `state diff` all work."""
    from helpers.rbac import connect, grant, mint_user, user_env

    user, minted = mint_user(sandbox3, tmp_path, "rights")
    env = user_env(sandbox3, tmp_path, namespace, "rights")
    grant(sandbox3, env, namespace, user, flags=("--fleet",))
    connect(env, minted)

    def ok(*args: str) -> str:
        proc = env.cli(*args)
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}: {proc.stderr[-600:]}"
        return proc.stdout

    ok("deployment", "create", "app", "-n", namespace, "--cluster", "u1", "--cluster", "u2")
    ok("lock", "acquire", "app", "--ttl", "60s")
    ok("state", "set", "app", "k=v")
    ok("lock", "release", "app")
    history_path = f"{configmaps_path(namespace)}/coordinator-history-app"
    ok("deployment", "replace-cluster", "app", "u2", "u3")
    assert sandbox3.admin(3).get(history_path) is not None  # made on the new member
    sandbox3.admin(2).delete(history_path)  # u2 as a member that never had it
    ok("deployment", "add-cluster", "app", "u2")
    assert sandbox3.admin(2).get(history_path) is not None
    held = json.loads(ok("-o", "json", "lock", "history", "app"))
    assert [c["read"] for c in held["clusters"]] == [True, True, True], held["clusters"]
    state_path = f"{configmaps_path(namespace)}/coordinator-state-app"
    cm = sandbox3.admin(2).get(state_path)
    cm["data"]["envelope.json"] = "garbage"
    sandbox3.admin(2).request("PUT", state_path, cm)
    ok("lock", "acquire", "app", "--ttl", "60s")
    backups = tmp_path / "backups"
    synced = json.loads(ok("-o", "json", "state", "sync", "app", "--backup-dir", str(backups)))
    saved = Path(synced["saved_corrupt"]["u2"])
    assert saved.parent == backups and saved.stat().st_mode & 0o777 == 0o600
    assert {r["status"] for r in json.loads(ok("-o", "json", "state", "diff", "app"))} == {"current"}


@integration
def test_the_fleet_rights_change_nothing_anywhere(sandbox3: Any, namespace: str, tmp_path: Path) -> None:
    """Held: the fleet ClusterRole (list and watch on every Lease) lets the user read
    Leases of other namespaces, and neither get by name, create, update, patch nor delete
    one there, nor create one outside its own namespace."""
    from helpers.rbac import grant, mint_user, user_env

    user, minted = mint_user(sandbox3, tmp_path, "fleet")
    env = user_env(sandbox3, tmp_path, namespace, "fleet")
    grant(sandbox3, env, namespace, user, flags=("--fleet",), clusters=(1,))
    other = "kube-node-lease"
    victim = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "fleet-victim"}, "spec": {}}
    sandbox3.admin(1).create(leases_path(other), victim, exist_ok=True)
    target = lease_path(other, "fleet-victim")
    before = sandbox3.admin(1).get(target)

    def attempt(method: str, path: str, body: Any = None, query: Any = None) -> str:
        try:
            request_as(minted, 1, method, path, body, query)
        except KubeError as err:
            return err.kind
        return "ALLOWED"

    listed = request_as(minted, 1, "GET", leases_path(other))
    assert "fleet-victim" in [o["metadata"]["name"] for o in listed["items"]]
    found = {
        "get": attempt("GET", target),
        "update": attempt("PUT", target, before),
        "patch": attempt("PATCH", target, {"metadata": {"labels": {"x": "y"}}}),
        "delete": attempt("DELETE", target),
        "deletecollection": attempt("DELETE", leases_path(other)),
        "create elsewhere": attempt("POST", leases_path(other), {**victim, "metadata": {"name": "planted"}}),
        "create in kube-system": attempt("POST", leases_path("kube-system"), {**victim, "metadata": {"name": "p"}}),
    }
    assert set(found.values()) == {"forbidden"}, found
    assert sandbox3.admin(1).get(target)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
