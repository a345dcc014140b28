"""kubectl's -o name, -o wide and -o jsonpath=... on the commands that print objects,
against the sandbox: `lock status`, `cluster list`, `deployment list`.

One deployment serves the whole module (the commands only read, after one acquisition):
each test checks what it prints, whole where nothing in it moves with the clock."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from coord_fixtures import Env, make_env

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def held(sandbox3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, dict[str, Any]]]:
    """Deployment `web` on c1..c3, its lock held by alice; with what `lock acquire` said."""
    env = make_env(sandbox3, tmp_path_factory.mktemp("formats"))
    took = ok(env, "lock", "acquire", "web", "--holder", "alice", "--reason", "formats", "--ttl", "10m", "-o", "json")
    yield env, json.loads(took.stdout)


def ok(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    proc = env.cli(*args)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def out(env: Env, *args: str) -> str:
    return ok(env, *args).stdout


def test_name(held: tuple[Env, dict[str, Any]]) -> None:
    env, _ = held
    assert out(env, "lock", "status", "web", "-o", "name") == "lock/web\n"
    assert out(env, "cluster", "list", "-o", "name") == "cluster/c1\ncluster/c2\ncluster/c3\n"
    assert out(env, "deployment", "list", "-o", "name") == "deployment/web\n"


def test_jsonpath(held: tuple[Env, dict[str, Any]]) -> None:
    env, took = held
    status = "-o", "jsonpath={.holder} {.lock_id} {.fencing_token} {.status}"
    assert out(env, "lock", "status", "web", *status) == f"alice {took['lock_id']} {took['fencing_token']} held"
    per_cluster = '-o=jsonpath={range .clusters[*]}{.name}={.holder}{"\\n"}{end}'
    assert out(env, "lock", "status", "web", per_cluster) == "c1=alice\nc2=alice\nc3=alice\n"
    assert out(env, "cluster", "list", "-o", "jsonpath={.[*].name}") == "c1 c2 c3"
    deployments = '-o=jsonpath={range [*]}{.name} {.namespace} {.quorum}{"\\n"}{end}'
    assert out(env, "deployment", "list", deployments) == f"web {env.namespace} 2\n"


def test_wide(held: tuple[Env, dict[str, Any]]) -> None:
    env, took = held
    lines = out(env, "lock", "status", "web", "-o", "wide").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("CLUSTER"))
    assert lines[header].split() == [
        *("CLUSTER", "STATUS", "HOLDER", "LOCK", "ID", "TOKEN", "RENEWED"),
        *("EXPIRES", "TTL", "SINCE", "DETAIL"),
    ]
    rows = [line.split()[:5] for line in lines[header + 1 :]]
    token = str(took["fencing_token"])
    assert rows == [[c, "held", "alice", took["lock_id"], token] for c in ("c1", "c2", "c3")]

    clusters = json.loads(out(env, "cluster", "list", "-o", "json"))
    wide = out(env, "cluster", "list", "-o", "wide").splitlines()
    assert wide[0].split() == ["NAME", "CONTEXT", "SERVER", "IDENTITY", "IDENTITY", "FROM", "KUBECONFIG", "CONNECTED"]
    for line, c in zip(wide[1:], clusters, strict=True):
        assert line.split()[:6] == [
            c["name"],
            c["context"],
            c["server"],
            c["identity"],
            c["identity_source"],
            env.kubeconfig,
        ]

    assert out(env, "deployment", "list", "-o", "wide").splitlines() == [
        f"NAME  {'NAMESPACE':{len(env.namespace)}}  QUORUM  STORAGE    CLUSTERS",
        f"web   {env.namespace}  2/3     configmap  c1,c2,c3",
    ]


def test_name_is_refused_where_nothing_is_named(held: tuple[Env, dict[str, Any]]) -> None:
    env, _ = held
    proc = env.cli("state", "get", "web", "-o", "name")
    assert proc.returncode == 2, proc.stderr
    assert "prints no objects to name" in proc.stderr
