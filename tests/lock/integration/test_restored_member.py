"""A member whose etcd was restored from a backup (disaster recovery).

The restore brings back the member's Lease and state object as they were, same uids,
older holder and token. When the live lock held a bare majority that included that
member, the next contender may read only the restored member and the one that missed
the take: nothing it reads says the lock is held or which token was granted. The test
plays the restore with the real API server: the backup's objects, managedFields
included, written back over the live ones.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import anyio
from coord_fixtures import Env, make_env
from faults.kubectl import kubectl

from coordinator.rules.resources import configmaps_path, lease_path

LEASE = "coordinator-lock-web"


def _paths(env: Env) -> tuple[str, str]:
    return lease_path(env.namespace, LEASE), f"{configmaps_path(env.namespace)}/coordinator-state-web"


def _backup(env: Env, index: int) -> list[dict[str, Any]]:
    return [anyio.run(env.raw, index, "GET", path) for path in _paths(env)]


def _restore(env: Env, index: int, backup: list[dict[str, Any]]) -> None:
    """Put the backup's objects back on member ``index`` as an etcd restore would: the same
    uid, spec, annotations and managedFields (the resourceVersion is the server's own)."""
    for path, old in zip(_paths(env), backup, strict=True):
        live = anyio.run(env.raw, index, "GET", path)
        body = copy.deepcopy(old)
        body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        anyio.run(env.raw, index, "PUT", path, body)


def _acquire(env: Env, holder: str, *args: str) -> Any:
    return env.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "web", "--holder", holder, *args)


def test_cluster_restored_keeps_a_bare_majority_lock_and_its_token(sandbox3: Any, tmp_path: Path) -> None:
    env = make_env(sandbox3, tmp_path, max_ttl_s=20)
    first = _acquire(env, "first", "--ttl", "5s")
    assert first.returncode == 0, first.stderr
    assert env.cli("lock", "release", "web", "--holder", "first").returncode == 0
    backup = _backup(env, 1)  # c1's lease and state object, token 1

    env.sandbox.pause(3)
    try:
        alice = _acquire(env, "alice", "--ttl", "20s")  # c1 and c2, token 2
    finally:
        env.sandbox.resume(3)
    assert alice.returncode == 0, alice.stderr
    assert json.loads(alice.stdout)["fencing_token"] == 2

    _restore(env, 1, backup)
    marked = env.cli("-o", "json", "cluster", "restored", "c1", "--yes")
    assert marked.returncode == 0, marked.stderr
    leases = json.loads(marked.stdout)["leases"]
    assert [(r["namespace"], r["deployment"], r["outcome"]) for r in leases if r["namespace"] == env.namespace] == [
        (env.namespace, "web", "ok")
    ]

    env.sandbox.pause(2)  # alice's other member: bob reads only c1 (restored) and c3
    try:
        bob = _acquire(env, "bob", "--ttl", "10s")
        assert bob.returncode in (3, 4), bob.stdout
        st = env.cli("-o", "json", "--timeout", "2s", "lock", "status", "web")
        assert st.returncode == 4 and json.loads(st.stdout)["status"] == "unknown", st.stdout
    finally:
        env.sandbox.resume(2)
    # With every member back, after the tombstone's maximum TTL, the next token is new.
    assert env.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    bob = _acquire(env, "bob", "--ttl", "10s", "--wait", "60s")
    assert bob.returncode == 0, bob.stderr
    assert json.loads(bob.stdout)["fencing_token"] > 2


def test_cluster_restored_needs_yes_without_a_terminal_and_a_known_cluster(dep3: Env) -> None:
    unknown = dep3.cli("cluster", "restored", "nope", "--yes")
    assert unknown.returncode == 2 and "Unknown cluster 'nope'" in unknown.stderr
    asked = dep3.cli("cluster", "restored", "c1", input="")
    assert asked.returncode == 2 and "use --yes" in asked.stderr
    # Nothing was changed: the lease is still free and takeable.
    assert dep3.cli("lock", "acquire", "web", "--holder", "x", "--ttl", "5s").returncode == 0


# Broke before the fix (outside attack on the member-set order, finding F2): `cluster
# restored` tombstoned the leases and left the state objects' member-set note of the
# backup's day, which then spoke for the member in place of its silent lease.


def test_cluster_restored_removes_the_member_set_note_of_the_state_objects(sandbox3: Any, tmp_path: Path) -> None:
    env = make_env(sandbox3, tmp_path)
    _, state = _paths(env)
    before = anyio.run(env.raw, 1, "GET", state)["metadata"]["annotations"]
    assert "coordinator.io/membership" in before, before
    done = env.cli("-o", "json", "cluster", "restored", "c1", "--yes")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["state_objects"]
    assert {
        "namespace": env.namespace,
        "deployment": "web",
        "outcome": "ok",
        "detail": "member-set note removed",
    } in rows
    after = anyio.run(env.raw, 1, "GET", state)["metadata"]["annotations"]
    assert "coordinator.io/membership" not in after, after
    assert "coordinator.io/membership" in anyio.run(env.raw, 2, "GET", state)["metadata"]["annotations"]


# Broke before the fix (second attack on the member-set order, findings G3 and G3b):
# `cluster restored` found the objects by coordinator's label, which anyone who may edit
# them can remove: an unlabelled lease kept its old holder and token, an unlabelled state
# object its old member-set note.


def test_cluster_restored_finds_objects_whose_label_was_removed(sandbox3: Any, tmp_path: Path) -> None:
    env = make_env(sandbox3, tmp_path)
    lease, state = _paths(env)
    for kind, name in (("lease", LEASE), ("configmap", "coordinator-state-web")):
        done = kubectl(env.kubeconfig, 1, env.namespace, "label", kind, name, "coordinator.io/managed-by-")
        assert done.returncode == 0, done.stderr
    assert "coordinator.io/managed-by" not in (anyio.run(env.raw, 1, "GET", lease)["metadata"].get("labels") or {})
    done = env.cli("-o", "json", "cluster", "restored", "c1", "--yes")
    assert done.returncode == 0, done.stderr
    assert "coordinator.io/vanished" in anyio.run(env.raw, 1, "GET", lease)["metadata"]["annotations"]
    assert "coordinator.io/membership" not in anyio.run(env.raw, 1, "GET", state)["metadata"]["annotations"]
