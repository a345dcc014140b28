"""Deployments on the 3-cluster sandbox (`web`, as `dep3` makes it): objects, machines, kubectl as another client."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from coord_fixtures import Env
from faults.kubectl import kubectl as run_kubectl

from coordinator.kube.client import KubeError
from coordinator.rules.lease import lock_id_of
from coordinator.rules.resources import configmaps_path, lease_path

T = TypeVar("T")

# The lease of deployment `web` on every member.
LEASE = "coordinator-lock-web"


def kubectl(env: Env, index: int, *args: str) -> str:
    """A real other client: kubectl on cluster ``index``, in the deployment's namespace."""
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is missing: scripts/setup.sh installs Debian's kubernetes-client")
    proc = run_kubectl(env.kubeconfig, index, env.namespace, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def lease(env: Env, index: int) -> dict[str, Any] | None:
    """`web`'s lease on cluster ``index``, or None where there is none."""
    try:
        return anyio.run(env.raw, index, "GET", lease_path(env.namespace, LEASE))
    except KubeError as err:
        assert err.kind == "not-found"
        return None


def holder_on(env: Env, index: int) -> str | None:
    """The lock id holding `web`'s lease on cluster ``index``, or None."""
    obj = lease(env, index)
    return None if obj is None else lock_id_of(obj["spec"].get("holderIdentity"))


def acquire(
    env: Env, holder: str, *args: str, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`lock acquire web` as ``holder``, JSON output (``environ``: more environment)."""
    return env.cli("-o", "json", "lock", "acquire", "web", "--holder", holder, *args, env=environ)


def on_each(call: Callable[[int], T], members: tuple[int, ...] = (1, 2, 3)) -> list[T]:
    """``call(i)`` on every member at once, its results in member order: for edits of one
    member each that nothing else runs beside, so their order says nothing (a call that
    raises fails the test)."""
    with ThreadPoolExecutor(max_workers=len(members)) as pool:
        return list(pool.map(call, members))


def doc(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON document a command printed on stdout (which must not be empty)."""
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


# The state object of deployment `web` on every member.
STATE = "coordinator-state-web"


# The annotation on state objects that holds the token floor.
FLOOR = "coordinator.io/token-floor"


def other_machine(env: Env, tmp_path: Path, label: str) -> Env:
    """A second machine: a copy of this machine's config, with its own lock records."""
    """A second machine: a copy of this machine's config, with its own lock records."""
    import shutil

    other = tmp_path / label / "config.yaml"
    other.parent.mkdir(parents=True)
    shutil.copy(env.config, other)
    return Env(sandbox=env.sandbox, config=other, namespace=env.namespace, deployment=env.deployment,
               clusters=list(env.clusters))  # fmt: skip


def edit_envelope(env: Env, index: int, edit: Any) -> None:
    """Change the state envelope of ``env``'s deployment on cluster ``index`` in place with ``edit`` (a raw PUT)."""
    path = f"{configmaps_path(env.namespace)}/coordinator-state-{env.deployment}"
    cm = anyio.run(env.raw, index, "GET", path)
    doc = json.loads(cm["data"]["envelope.json"])
    edit(doc)
    cm["data"]["envelope.json"] = json.dumps(doc)
    anyio.run(env.raw, index, "PUT", path, cm)
