"""The RBAC of `coordinator rbac print`, applied on real API servers, is exactly enough.

A freshly minted sandbox user starts with no rights at all (beyond what every
authenticated user gets). The admin applies what `rbac print --namespace NS --user U`
prints, object by object, and every command then works as that user. A user without
those rights sees forbidden clusters, which are never counted as free.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from coord_fixtures import Env

from coordinator.kube.client import KubeError
from coordinator.kube.resources import lease_path

pytestmark = pytest.mark.integration

RBAC_API = "/apis/rbac.authorization.k8s.io/v1"
PLURALS = {"Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
           "ClusterRoleBinding": "clusterrolebindings"}


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def _unobserved_status(env: Env) -> Any:
    """`lock status -o json` where fewer than a majority can be observed: the document is
    printed all the same, and the exit status is 4 (nothing can be said about the lock)."""
    proc = env.cli("-o", "json", "lock", "status", "app")
    assert proc.returncode == 4, f"exit {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def _collection(obj: dict[str, Any]) -> str:
    plural = PLURALS[obj["kind"]]
    ns = obj["metadata"].get("namespace")
    return f"{RBAC_API}/namespaces/{ns}/{plural}" if ns else f"{RBAC_API}/{plural}"


def _grant(sandbox: Any, env: Env, namespace: str, user: str, *, storage: str = "configmap",
           clusters: tuple[int, ...] = (1, 2, 3)) -> list[dict[str, Any]]:
    """Apply, as cluster admin, exactly what `coordinator rbac print` prints for ``user``."""
    printed = _ok(env.cli("rbac", "print", "--namespace", namespace, "--user", user, "--storage", storage))
    objects = [o for o in yaml.safe_load_all(printed) if o]
    assert {o["kind"] for o in objects} == set(PLURALS), objects
    for i in clusters:
        admin = sandbox.admin(i)
        for obj in objects:
            # Like `kubectl apply`: the Role and ClusterRole are shared by every subject
            # granted in the namespace; each subject's bindings are its own.
            admin.create(_collection(obj), obj, exist_ok=not obj["kind"].endswith("Binding"))
    return objects


def _user(sandbox: Any, tmp_path: Path, label: str) -> tuple[str, Any]:
    user = f"{label}-{secrets.token_hex(3)}@example.com"
    return user, sandbox.mint_kubeconfig(user, path=tmp_path / f"{label}.kubeconfig")


def _env(sandbox: Any, tmp_path: Path, namespace: str, label: str) -> Env:
    return Env(sandbox=sandbox, config=tmp_path / label / "config.yaml", namespace=namespace)


def _connect(env: Env, minted: Any) -> None:
    for i, context in enumerate(minted.contexts, start=1):
        doc = _json(env.cli("-o", "json", "cluster", "connect", f"u{i}", "--context", context,
                            "--kubeconfig", str(minted.path)))
        # The ClusterRole lets it read kube-system (by name), so the identity is its UID.
        assert doc["identity_source"] == "kube-system-uid", doc


@pytest.mark.parametrize("storage", ["configmap", "secret"])
def test_every_command_works_with_exactly_the_printed_rights(
    sandbox3: Any, namespace: str, tmp_path: Path, storage: str
) -> None:
    user, minted = _user(sandbox3, tmp_path, "rbac")
    env = _env(sandbox3, tmp_path, namespace, "granted")

    # Before the grant the user can do nothing: connecting is refused in words (exit 2).
    refused = env.cli("cluster", "connect", "u1", "--context", minted.contexts[0], "--kubeconfig", str(minted.path))
    assert refused.returncode == 2, refused.stderr
    assert "rbac print" in refused.stderr

    _grant(sandbox3, env, namespace, user, storage=storage)
    _connect(env, minted)
    info = _json(env.cli("-o", "json", "cluster", "info", "u1", "--namespace", namespace, "--storage", storage))
    assert info["identity_ok"] is True and info["reachable"] is True
    assert all(info["permissions"]["leases"].values()), info
    assert info["storage"] == [storage] and info["missing_permissions"] == [], info
    if storage == "secret":
        # the rights of the storage in use are checked, not those of the other one
        assert all(info["permissions"]["secrets"].values()), info
        assert set(info["permissions"]["configmaps"]) == {"get", "create"}, info
    else:
        assert "secrets" not in info["permissions"], info

    members = ["--cluster", "u1", "--cluster", "u2", "--cluster", "u3"]
    created = _json(env.cli("-o", "json", "deployment", "create", "app", "-n", namespace, *members,
                            "--storage", storage))
    assert {c["outcome"] for c in created["namespace_on_clusters"]} == {"ok"}, created
    # with the deployment recorded, its storage is the one checked by default
    inferred = _json(env.cli("-o", "json", "cluster", "info", "u2"))
    assert inferred["namespace"] == namespace and inferred["storage"] == [storage], inferred
    assert inferred["missing_permissions"] == [], inferred

    taken = _json(env.cli("-o", "json", "lock", "acquire", "app", "--ttl", "90s", "--reason", "rbac test"))
    assert {c["outcome"] for c in taken["clusters"]} == {"ok"}, taken
    status = _json(env.cli("-o", "json", "lock", "status", "app"))
    assert status["held_by_majority"] and {c["status"] for c in status["clusters"]} == {"held"}, status
    _ok(env.cli("lock", "renew", "app"))

    _ok(env.cli("state", "set", "app", "replicas=3", "version=1.2.0"))
    assert _json(env.cli("-o", "json", "state", "get", "app")) == {"replicas": 3, "version": "1.2.0"}
    document = tmp_path / "state.yaml"
    document.write_text("replicas: 5\nversion: 1.3.0\n")
    _ok(env.cli("state", "apply", "app", "-f", str(document)))
    diff = _json(env.cli("-o", "json", "state", "diff", "app"))
    assert {r["status"] for r in diff} == {"current"}, diff
    _ok(env.cli("state", "sync", "app"))
    assert len(_json(env.cli("-o", "json", "state", "history", "app"))) == 2
    backup = tmp_path / "backup.json"
    _ok(env.cli("state", "backup", "app", "-f", str(backup)))
    _ok(env.cli("state", "set", "app", "replicas=9"))
    _ok(env.cli("state", "restore", "app", "-f", str(backup)))
    assert _json(env.cli("-o", "json", "state", "get", "app")) == {"replicas": 5, "version": "1.3.0"}
    _ok(env.cli("lock", "release", "app"))

    # Waiting watches the leases; break clears them; run holds them around a child.
    _ok(env.cli("lock", "acquire", "app", "--ttl", "60s", "--wait", "5s", "--holder", "someone"))
    _ok(env.cli("lock", "break", "app", "--yes", "--reason", "rbac test"))
    _ok(env.cli("lock", "run", "app", "--", "true"))
    final = _json(env.cli("-o", "json", "lock", "status", "app"))
    assert not final["held_by_majority"] and {c["status"] for c in final["clusters"]} == {"free"}, final


def _leases_absent(env: Env, deployment: str, clusters: tuple[int, ...]) -> bool:
    for i in clusters:
        try:
            anyio.run(env.raw, i, "GET", lease_path(env.namespace, f"coordinator-lock-{deployment}"))
        except KubeError as err:
            assert err.kind == "not-found", err
            continue
        return False
    return True


def _as(env: Env, tmp_path: Path, label: str, minted: Any) -> Env:
    """The same connected clusters and deployment, reached as another user."""
    other = _env(env.sandbox, tmp_path, env.namespace, label)
    other.config.parent.mkdir(parents=True)
    doc = yaml.safe_load(env.config.read_text())
    for i, context in enumerate(minted.contexts, start=1):
        doc["clusters"][f"u{i}"].update(context=context, kubeconfig=str(minted.path))
    other.config.write_text(yaml.safe_dump(doc))
    return other


def test_without_the_rights_clusters_are_forbidden_and_never_free(
    sandbox3: Any, namespace: str, tmp_path: Path
) -> None:
    owner, owner_kc = _user(sandbox3, tmp_path, "owner")
    granted = _env(sandbox3, tmp_path, namespace, "owner")
    _grant(sandbox3, granted, namespace, owner)
    _connect(granted, owner_kc)
    _ok(granted.cli("deployment", "create", "app", "-n", namespace, "--cluster", "u1", "--cluster", "u2",
                    "--cluster", "u3"))

    # Nobody: no rights anywhere. Partial: the printed rights on cluster 1 only.
    nobody = _as(granted, tmp_path, "nobody", _user(sandbox3, tmp_path, "nobody")[1])
    partial_user, partial_kc = _user(sandbox3, tmp_path, "partial")
    _grant(sandbox3, granted, namespace, partial_user, clusters=(1,))
    partial = _as(granted, tmp_path, "partial", partial_kc)

    st = _unobserved_status(nobody)
    assert {c["status"] for c in st["clusters"]} == {"forbidden"}, st
    assert not st["held_by_majority"] and st["holder"] is None
    st = _unobserved_status(partial)
    assert [c["status"] for c in st["clusters"]] == ["free", "forbidden", "forbidden"], st

    for who in (nobody, partial):
        attempt = who.cli("-o", "json", "lock", "acquire", "app", "--holder", "intruder")
        assert attempt.returncode == 4, attempt.stdout + attempt.stderr
        assert "never counted as free" in attempt.stderr and "Traceback" not in attempt.stderr
        outcomes = {c["name"]: c["outcome"] for c in json.loads(attempt.stdout)["clusters"]}
        assert outcomes["u2"] == outcomes["u3"] == "forbidden", outcomes
    assert _leases_absent(granted, "app", (1, 2, 3))  # nothing was taken, not even where it could be

    # Held by the owner: the partial user sees one held lease and two forbidden ones.
    _ok(granted.cli("lock", "acquire", "app", "--ttl", "60s", "--holder", "owner"))
    st = _unobserved_status(partial)
    assert [c["status"] for c in st["clusters"]] == ["held", "forbidden", "forbidden"], st
    assert not st["held_by_majority"]
    attempt = partial.cli("lock", "acquire", "app", "--holder", "intruder")
    assert attempt.returncode == 4, attempt.stderr
    for who in (nobody, partial):
        for command in (("state", "get", "app"), ("state", "set", "app", "k=v", "--lock-id", "0123456789abcdef")):
            proc = who.cli(*command)
            assert proc.returncode == 4, (command, proc.stderr)
            assert "Traceback" not in proc.stderr
    st = _json(granted.cli("-o", "json", "lock", "status", "app"))
    assert st["holder"] == "owner" and st["held_by_majority"], st
