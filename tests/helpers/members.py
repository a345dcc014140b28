"""Deployment `pay`, whose members change on the 5-cluster sandbox: making it, machines, what members store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from coord_fixtures import UNHURRIED, Env, make_env
from faults.admission import add_policy, remove_policy
from faults.kubectl import kubectl

from coordinator.config.models import DeploymentRecord
from coordinator.config.store import ConfigStore
from coordinator.kube.client import KubeError
from coordinator.ops.admin import connect_cluster
from coordinator.rules.membership import (
    A_MEMBERSHIP,
    Membership,
)
from coordinator.rules.resources import configmaps_path, lease_path

# The deployment these helpers make and change.
DEP = "pay"


# The name of its lease on every member.
LEASE = f"coordinator-lock-{DEP}"


# The name of its state object on every member.
STATE = f"coordinator-state-{DEP}"


# How to start the CLI in a subprocess.
PY = [sys.executable, "-m", "coordinator"]


def succeeded(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """Assert a command exited 0; the command."""
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}{proc.stdout}"
    return proc


def json_doc(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON document a command printed on stdout (which must not be empty)."""
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def machine(env: Env, tmp_path: Path, label: str) -> Env:
    """Another machine: a copy of this machine's config as it is now (its own lock book)."""
    other = tmp_path / label / "config.yaml"
    other.parent.mkdir(parents=True)
    shutil.copy(env.config, other)
    return Env(sandbox=env.sandbox, config=other, namespace=env.namespace, deployment=DEP,
               clusters=list(env.clusters))  # fmt: skip


def lease_on(env: Env, index: int) -> dict[str, Any] | None:
    """`pay`'s lease on cluster ``index``, or None where there is none."""
    try:
        return anyio.run(env.raw, index, "GET", lease_path(env.namespace, LEASE))
    except KubeError as err:
        assert err.kind == "not-found"
        return None


def stored_on(env: Env, index: int) -> Membership | None:
    """The member set `pay`'s lease on cluster ``index`` stores, or None."""
    lease = lease_on(env, index)
    raw = None if lease is None else (lease["metadata"].get("annotations") or {}).get(A_MEMBERSHIP)
    return None if raw is None else Membership.parse(raw)


def ids(env: Env, *names: str) -> list[str]:
    """The identities of the named clusters in this machine's config, sorted."""
    cfg = ConfigStore(env.config).load()
    return sorted(cfg.clusters[n].identity for n in names)


def record(env: Env) -> Any:
    """This machine's record of `pay`."""
    return ConfigStore(env.config).load().deployments[DEP]


def pay(env: Env, *members: str, max_ttl: str | None = None, environ: dict[str, str] | None = None) -> None:
    """Deployment `pay` on ``members``, with release=1.2.0 written on all of them
    (``environ``: more environment for every command; by default the suite's unhurried
    request timeout, since nothing is paused yet and every member must take each step)."""
    environ = UNHURRIED if environ is None else environ
    args = [a for m in members for a in ("--cluster", m)]
    if max_ttl:
        args += ["--max-ttl", max_ttl]
    succeeded(env.cli("deployment", "create", DEP, "-n", env.namespace, *args, env=environ))
    ttl = max_ttl or "30s"
    took = env.cli("-o", "json", "lock", "acquire", DEP, "--holder", "w", "--ttl", ttl, env=environ)
    lock = json_doc(succeeded(took))
    succeeded(env.cli("state", "set", DEP, "release=1.2.0", "--lock-id", lock["lock_id"], env=environ))
    succeeded(env.cli("lock", "release", DEP, "--holder", "w", env=environ))


def acquire(env: Env, holder: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`lock acquire pay` as ``holder`` with a 3 s timeout, JSON output."""
    return env.cli("-o", "json", "--timeout", "3s", "lock", "acquire", DEP, "--holder", holder, *extra)


def kubectl_on(env: Env, index: int, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl on cluster ``index`` in the deployment's namespace (the process, not checked)."""
    return kubectl(env.kubeconfig, index, env.namespace, *args)


def write_partially(env: Env, value: str, paused: int) -> None:
    """Write release=VALUE under a fresh lock while cluster ``paused`` is paused: the write
    is confirmed on the two other members only."""
    lock = json_doc(succeeded(acquire(env, "p", "--ttl", "30s")))
    env.sandbox.pause(paused)
    try:
        succeeded(env.cli("--timeout", "2s", "state", "set", DEP, f"release={value}", "--lock-id", lock["lock_id"]))
    finally:
        env.sandbox.resume(paused)
    succeeded(env.cli("lock", "release", DEP, "--holder", "p"))


def replica(env: Env, index: int) -> dict[str, Any] | None:
    """The envelope of `pay`'s state ConfigMap on cluster ``index``, or None where there is none."""
    try:
        obj = anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/{STATE}")
    except KubeError as err:
        assert err.kind == "not-found"
        return None
    return dict(json.loads(obj["data"]["envelope.json"]))


# A state object the freeze policy covers, created (dry run only) to see whether it is in force.
_STATE_PROBE = ("configmap", "vap-probe", "--from-literal=a=b")


def refuse_state_data(env: Env, indices: tuple[int, ...]) -> list[tuple[int, str]]:
    """A ValidatingAdmissionPolicy on each of ``indices`` that refuses creating the state
    object and changing its data (annotation-only updates pass: promises, token floors)."""
    ns = env.namespace
    name = f"freeze-state-{ns}"
    expr = (f"request.namespace != '{ns}' || !(object.metadata.name in ['{STATE}', 'vap-probe']) || "
            "(oldObject != null && object.data == oldObject.data)")  # fmt: skip
    made = []
    for i in indices:
        add_policy(env.sandbox.admin(i), name, expr, "state data frozen", exist_ok=False)
        made.append((i, name))
    for i in indices:
        until_admission(env, i, _STATE_PROBE, refused=True)
    return made


def drop_policies(env: Env, made: list[tuple[int, str]]) -> None:
    """Remove the policies refuse_state_data made and wait until each member admits writes again."""
    for i, name in made:
        remove_policy(env.sandbox.admin(i), name)
    for i, _ in made:
        until_admission(env, i, _STATE_PROBE, refused=False)


def until_admission(
    env: Env, index: int, create: tuple[str, ...], *, refused: bool, message: str | None = None,
    stdin: str | None = None,
) -> None:  # fmt: skip
    """Wait until cluster ``index``'s API server refuses (``refused``) or admits a
    server-side dry run of ``kubectl create CREATE`` (with ``stdin``), which goes through
    admission and writes nothing: an admission policy is in force, or gone, a moment after
    it was made or deleted. With ``message``, only a refusal that says it counts."""
    deadline = time.monotonic() + 30
    while True:
        probe = kubectl(env.kubeconfig, index, env.namespace, "create", *create, "--dry-run=server", stdin=stdin)
        if (probe.returncode != 0 and (message is None or message in probe.stderr)) == refused:
            return
        assert time.monotonic() < deadline, f"the policy never {'took effect' if refused else 'went away'}"
        time.sleep(0.5)


def holders(a: subprocess.CompletedProcess[str], b: subprocess.CompletedProcess[str]) -> str:
    """A failure message naming both holders of two commands that both took the lock."""

    def where(p: subprocess.CompletedProcess[str]) -> list[str]:
        return [c["name"] for c in json_doc(p)["clusters"] if c["outcome"] == "ok"]

    ta, tb = json_doc(a)["fencing_token"], json_doc(b)["fencing_token"]
    return f"two holders: A on {where(a)} token {ta}, B on {where(b)} token {tb}"


def pay_short(env: Env, *members: str, max_ttl: str = "8s") -> None:
    """`pay` for a deployment whose maximum TTL is short (tombstones lapse quickly)."""
    pay(env, *members, max_ttl=max_ttl)


def stored_set(env: Env, index: int, deployment: str = "pay") -> Membership:
    """The member set ``deployment``'s lease on cluster ``index`` stores (it must store one)."""
    lease: dict[str, Any] = anyio.run(
        env.raw, index, "GET", lease_path(env.namespace, f"coordinator-lock-{deployment}")
    )
    found = Membership.parse(lease["metadata"]["annotations"][A_MEMBERSHIP])
    assert found is not None
    return found


def identities(env: Env, *names: str) -> set[str]:
    """The identities of the named clusters in this machine's config."""
    cfg = ConfigStore(env.config).load()
    return {cfg.clusters[n].identity for n in names}


def replica_data(env: Env, index: int, deployment: str = "pay") -> dict[str, Any]:
    """The data of ``deployment``'s state ConfigMap on cluster ``index``."""
    obj = anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/coordinator-state-{deployment}")
    return dict(json.loads(obj["data"]["envelope.json"])["data"])


def second_machine(env: Env, tmp_path: Path, deployment: str, members: list[str]) -> Env:
    """Another machine: the same clusters connected, and a record of ``deployment`` with
    ``members`` written straight into its config (as an older or divergent record)."""
    other = make_env(env.sandbox, tmp_path / "other", deployment="scratch")
    with ConfigStore(other.config).edit() as cfg:
        cfg.deployments[deployment] = DeploymentRecord(name=deployment, namespace=env.namespace, clusters=members)
    other.namespace = env.namespace
    other.deployment = deployment
    return other


def connected_machine(env: Env, tmp_path: Path) -> Env:
    """Another machine with the same clusters connected and no deployment recorded."""
    cfg = tmp_path / "config.yaml"
    store = ConfigStore(cfg)

    async def go() -> None:
        for i in range(1, env.sandbox.n + 1):
            await connect_cluster(store, f"c{i}", f"sandbox-{i}", str(env.sandbox.kubeconfig))

    anyio.run(go)
    return Env(sandbox=env.sandbox, config=cfg, namespace=env.namespace, deployment=env.deployment,
               clusters=[f"c{i}" for i in range(1, env.sandbox.n + 1)])  # fmt: skip


# The environment of a command that SIGKILLs itself right after a member change stored
# its joint set (tests/helpers/kill_after_joint/sitecustomize.py says where exactly).
KILL_AFTER_JOINT = {
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parent / "kill_after_joint"), os.environ.get("PYTHONPATH")) if p
    )
}

# What a patched CLI script runs after its patch: the command line, as `coordinator` would.
_CLI_MAIN = 'import sys\nsys.argv = ["coordinator", *sys.argv[1:]]\nfrom coordinator.cli import main\nmain()\n'


def patched_cli(
    env: Env, tmp_path: Path, patch: str, *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """The CLI with ``patch`` (Python source, run first in the same process: an adversary
    or a delay inside the command) applied, with ``args``."""
    script = tmp_path / "patched_cli.py"
    script.write_text(f"{patch}\n{_CLI_MAIN}")
    return subprocess.run([sys.executable, str(script), *args], env=env.environ(PYTHONPATH=str(Path.cwd())),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def dead_holders_lease_on(env: Env, index: int) -> None:
    """A holder took `pay`'s lock and died; its release reached every member but cluster
    ``index``, which keeps the dead holder's live lease until it lapses."""
    succeeded(env.cli("lock", "acquire", DEP, "--holder", "dead", "--ttl", "10s"))
    env.sandbox.pause(index)
    try:
        env.cli("--timeout", "2", "lock", "release", DEP, "--holder", "dead")
    finally:
        env.sandbox.resume(index)
