"""Errors a new user meets, and what they say: did-you-mean for names and commands, a
missing config file named, zero durations refused, a lock asked for twice by its holder,
and the kubeconfig a cluster was connected through remembered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from coord_fixtures import Env

pytestmark = pytest.mark.integration


def _paragraph(proc: Any) -> str:
    """The one-paragraph error of a refused command (exit 2)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return str(lines[0])


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["lock", "status", "wbe"], "Unknown deployment 'wbe'. Did you mean 'web'?"),
        (["state", "get", "we"], "Unknown deployment 'we'. Did you mean 'web'?"),
        (["cluster", "info", "c11"], "Unknown cluster 'c11'. Did you mean 'c1'?"),
        (["lokc", "status", "web"], "No such command 'lokc'. Did you mean 'lock'?"),
        (["lock", "stauts", "web"], "No such command 'stauts'. Did you mean 'status'?"),
    ],
)
def test_a_mistyped_name_or_command_gets_did_you_mean(dep3: Env, args: list[str], said: str) -> None:
    error = _paragraph(dep3.cli(*args))
    assert said in error, error
    assert "deployment create" not in error and "cluster connect" not in error, error  # not "create the typo"


def test_a_name_far_from_every_known_one_is_told_how_to_make_it(dep3: Env) -> None:
    error = _paragraph(dep3.cli("lock", "status", "payments"))
    assert "Did you mean" not in error and "coordinator deployment create payments" in error, error


def test_a_config_file_that_does_not_exist_is_named(dep3: Env, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "config.yaml"
    for args in (["lock", "status", "web"], ["lock", "status"], ["cluster", "info", "c1"]):
        error = _paragraph(dep3.cli("--config", str(missing), *args))
        assert f"the config file {missing} does not exist" in error, error
        assert "Create it with" not in error, error
    assert not missing.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--timeout", "0", "lock", "status", "web"],
        ["lock", "status", "web", "--timeout", "0s"],
        ["lock", "status", "web", "--watch", "--interval", "0s"],
        ["lock", "status", "--all", "--watch", "--interval", "0"],
        ["lock", "acquire", "web", "--ttl", "0"],
        ["lock", "renew", "web", "--ttl", "0s"],
        ["lock", "run", "web", "--ttl", "0", "--", "true"],
        ["deployment", "add-cluster", "web", "c3", "--ttl", "0"],
    ],
)
def test_a_zero_duration_where_none_makes_sense_is_refused(dep3: Env, args: list[str]) -> None:
    error = _paragraph(dep3.cli(*args, timeout=60))
    option = next(a for a in args if a.startswith("--") and a not in ("--watch", "--all", "--"))
    assert error.startswith(f"Error: {option}: ") and "is too short; it must be at least" in error, error


def test_a_second_acquire_by_the_holder_says_it_holds_the_lock_and_how_to_use_it(dep3: Env) -> None:
    took = dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice", "--ttl", "60s")
    assert took.returncode == 0, took.stderr
    lock_id = json.loads(took.stdout)["lock_id"]
    again = dep3.cli("lock", "acquire", "web", "--holder", "alice")
    assert again.returncode == 3, again.stderr
    said = " ".join(again.stderr.split())
    assert f"alice already holds this lock (lock {lock_id}, on c1, c2, c3)" in said, said
    assert f"`coordinator lock run web --lock-id {lock_id} -- CMD`" in said, said
    assert f"`coordinator lock release web --lock-id {lock_id}`" in said, said
    assert "ask the holder to release it" not in said, said
    # Someone else is still told to wait or ask.
    bob = " ".join(dep3.cli("lock", "acquire", "web", "--holder", "bob").stderr.split())
    assert "ask the holder to release it" in bob and "already holds" not in bob, bob


def test_the_kubeconfig_a_cluster_was_connected_through_is_remembered(dep3: Env, tmp_path: Path) -> None:
    config = str(tmp_path / "other" / "config.yaml")
    connected = dep3.cli("--config", config, "cluster", "connect", "k1", "--context", "sandbox-1")
    assert connected.returncode == 0, connected.stderr
    [record] = json.loads(dep3.cli("--config", config, "-o", "json", "cluster", "list").stdout)
    assert record["kubeconfig"] == str(Path(dep3.kubeconfig).resolve()), record
    # A new shell: no KUBECONFIG, and no ~/.kube/config to fall back on.
    home = tmp_path / "home"
    home.mkdir()
    bare = {"KUBECONFIG": "", "HOME": str(home)}
    info = dep3.cli("--config", config, "-o", "json", "cluster", "info", "k1", env=bare)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["reachable"] is True
