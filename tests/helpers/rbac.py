"""Users with exactly the rights `coordinator rbac print` prints, minted on the sandbox, and their commands."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import yaml
from coord_fixtures import Env

# The RBAC API group's path.
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


# The resource name of each kind `rbac print` prints.
PLURALS = {
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
}


def stdout_json(proc: subprocess.CompletedProcess[str]) -> Any:
    """Assert a command exited 0; the JSON document it printed."""
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def stdout_ok(proc: subprocess.CompletedProcess[str]) -> str:
    """Assert a command exited 0 without a traceback; what it printed on stdout."""
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def _collection(obj: dict[str, Any]) -> str:
    plural = PLURALS[obj["kind"]]
    ns = obj["metadata"].get("namespace")
    return f"{RBAC_API}/namespaces/{ns}/{plural}" if ns else f"{RBAC_API}/{plural}"


def grant(
    sandbox: Any,
    env: Env,
    namespace: str,
    user: str,
    *,
    storage: str = "configmap",
    clusters: tuple[int, ...] = (1, 2, 3),
    deployments: tuple[str, ...] = ("app",),
    flags: tuple[str, ...] = (),
    again: bool = False,
) -> list[dict[str, Any]]:
    """Apply, as cluster admin, exactly what `coordinator rbac print` prints for ``user``."""
    named = [arg for d in deployments for arg in ("--deployment", d)]
    printed = stdout_ok(
        env.cli("rbac", "print", "--namespace", namespace, *named, "--user", user, "--storage", storage, *flags)
    )
    objects = [o for o in yaml.safe_load_all(printed) if o]
    assert {o["kind"] for o in objects} == set(PLURALS), objects
    for i in clusters:
        admin = sandbox.admin(i)
        for obj in objects:
            # Like `kubectl apply`: the Role and ClusterRole are shared by every subject
            # granted in the namespace; each subject's bindings are its own.
            admin.create(_collection(obj), obj, exist_ok=again or not obj["kind"].endswith("Binding"))
    return objects


def mint_user(sandbox: Any, tmp_path: Path, label: str) -> tuple[str, Any]:
    """A new user (a unique name under ``label``) and a kubeconfig minted for it, with no rights."""
    user = f"{label}-{secrets.token_hex(3)}@example.com"
    return user, sandbox.mint_kubeconfig(user, path=tmp_path / f"{label}.kubeconfig")


def user_env(sandbox: Any, tmp_path: Path, namespace: str, label: str) -> Env:
    """An Env for ``label``'s own config (nothing connected yet) in ``namespace``."""
    return Env(sandbox=sandbox, config=tmp_path / label / "config.yaml", namespace=namespace)


def connect(env: Env, minted: Any) -> None:
    """Connect clusters u1, u2, … of the minted kubeconfig into ``env``'s config."""
    for i, context in enumerate(minted.contexts, start=1):
        doc = stdout_json(
            env.cli("-o", "json", "cluster", "connect", f"u{i}", "--context", context, "--kubeconfig", str(minted.path))
        )
        # The ClusterRole lets it read kube-system (by name), so the identity is its UID.
        assert doc["identity_source"] == "kube-system-uid", doc


def as_user(env: Env, tmp_path: Path, label: str, minted: Any) -> Env:
    """The same connected clusters and deployment, reached as another user."""
    other = user_env(env.sandbox, tmp_path, env.namespace, label)
    other.config.parent.mkdir(parents=True)
    doc = yaml.safe_load(env.config.read_text())
    for i, context in enumerate(minted.contexts, start=1):
        doc["clusters"][f"u{i}"].update(context=context, kubeconfig=str(minted.path))
    other.config.write_text(yaml.safe_dump(doc))
    return other
