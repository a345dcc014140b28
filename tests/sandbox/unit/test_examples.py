"""The in-cluster Job example (examples/in-cluster-job.yaml) says what the tool does: its
RBAC is what `coordinator rbac print` prints for its ServiceAccount, it connects its own
cluster with the pod's credentials and every other member through the mounted Secret,
and `lock run` gets the pod's SIGTERM with time to stop and release."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from coordinator.ops import rbac
from coordinator.rules.durations import parse_duration

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "in-cluster-job.yaml"


def _docs() -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(EXAMPLE.read_text()):
        by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def _script(job: dict[str, Any]) -> list[list[str]]:
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["sh", "-euc"], container["command"]
    lines = [line.strip() for line in container["command"][2].splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def test_the_rbac_is_what_rbac_print_prints_for_the_jobs_service_account() -> None:
    docs = _docs()
    [account] = docs["ServiceAccount"]
    [job] = docs["Job"]
    namespace, name = account["metadata"]["namespace"], account["metadata"]["name"]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == name
    assert job["metadata"]["namespace"] == namespace
    expected = rbac.manifests(namespace, rbac.parse_service_account(f"{namespace}:{name}"), ["payments"])
    shown = [d for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding") for d in docs[kind]]
    assert sorted(shown, key=repr) == sorted(expected, key=repr)


def test_the_job_connects_itself_in_cluster_and_the_others_through_the_secret() -> None:
    docs = _docs()
    [secret] = docs["Secret"]
    [job] = docs["Job"]
    pod = job["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]]
    [mount] = [m for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == volume["name"]]
    [key] = secret["stringData"]
    path = f"{mount['mountPath']}/{key}"
    kubeconfig = yaml.safe_load(secret["stringData"][key])
    others = sorted(c["name"] for c in kubeconfig["contexts"])

    commands = _script(job)
    connects = {c[3]: c[4:] for c in commands if c[:3] == ["coordinator", "cluster", "connect"]}
    assert connects.pop("eu-1") == ["--in-cluster"], connects
    assert sorted(connects) == others
    for name, args in connects.items():
        assert args == ["--context", name, "--kubeconfig", path], (name, args)
    assert ["coordinator", "deployment", "import", "payments", "--cluster", "eu-1", "-n", "payments"] in commands


def test_lock_run_gets_the_pods_sigterm_and_time_to_release() -> None:
    [job] = _docs()["Job"]
    [run] = [c for c in _script(job) if c[:4] == ["exec", "coordinator", "lock", "run"]]
    assert parse_duration(run[run.index("--ttl") + 1]) <= 60, run
    grace = parse_duration(run[run.index("--grace") + 1]) if "--grace" in run else 10.0
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace + 5, grace
