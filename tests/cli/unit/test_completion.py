"""Shell completion of deployment and cluster names (coordinator/cli/completion.py): the
callbacks read the local config, and click's own completion reaches them through the
lazily loaded groups."""

from __future__ import annotations

import importlib
from pathlib import Path

import click
import pytest
from click.shell_completion import get_completion_class

from coordinator.cli import _COMMANDS, cli, main
from coordinator.cli.completion import COMPLETE_VAR, PROG, complete_clusters, complete_deployments
from coordinator.config.records import ClusterRecord, DeploymentRecord
from coordinator.config.store import ConfigStore


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "config.yaml"
    with ConfigStore(path).edit() as cfg:
        for name in ("eu-1", "eu-2", "us-1"):
            cfg.clusters[name] = ClusterRecord(
                name=name, context=f"ctx-{name}", identity=f"id-{name}", identity_source="kube-system-uid"
            )
        for name in ("payments", "payroll", "orders"):
            cfg.deployments[name] = DeploymentRecord(name=name, namespace=name, clusters=["eu-1", "eu-2", "us-1"])
    return str(path)


def _complete(args: list[str], incomplete: str) -> list[str]:
    cls = get_completion_class("bash")
    assert cls is not None
    return [item.value for item in cls(cli, {}, PROG, COMPLETE_VAR).get_completions(args, incomplete)]


def test_the_callbacks_offer_the_names_of_the_config(config: str) -> None:
    ctx = click.Context(cli, info_name=PROG)
    ctx.params["config_path"] = config
    param = click.Argument(["deployment"])
    assert [i.value for i in complete_deployments(ctx, param, "pay")] == ["payments", "payroll"]
    assert [i.value for i in complete_clusters(ctx, param, "eu")] == ["eu-1", "eu-2"]
    ctx.params["config_path"] = str(Path(config).with_name("missing.yaml"))
    assert complete_deployments(ctx, param, "") == []  # no config: nothing, and no error


@pytest.mark.parametrize(
    ("args", "incomplete", "offered"),
    [
        (["lock", "status"], "pay", ["payments", "payroll"]),
        (["lock", "acquire"], "o", ["orders"]),
        (["state", "get"], "", ["orders", "payments", "payroll"]),
        (["deployment", "show"], "or", ["orders"]),
        (["cluster", "info"], "us", ["us-1"]),
        (["deployment", "create", "x", "--cluster"], "eu", ["eu-1", "eu-2"]),
        (["deployment", "replace-cluster", "payments", "eu-1"], "u", ["us-1"]),
        (["rbac", "print", "--deployment"], "payr", ["payroll"]),
        (["state", "sync", "payments", "--from"], "eu-2", ["eu-2"]),
    ],
)
def test_names_complete_where_a_command_takes_one(
    config: str, args: list[str], incomplete: str, offered: list[str]
) -> None:
    assert _complete(["--config", config, *args], incomplete) == offered


def test_the_config_given_after_the_command_or_in_the_environment_counts(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _complete(["lock", "status", "--config", config], "pay") == ["payments", "payroll"]
    monkeypatch.setenv("COORDINATOR_CONFIG", config)
    assert _complete(["lock", "status"], "ord") == ["orders"]


def test_commands_complete_at_the_top_level_without_loading_anything_wrong() -> None:
    assert _complete([], "lo") == ["lock"]
    assert _complete([], "co") == ["completion"]


def test_every_deployment_argument_of_lock_and_state_completes(config: str) -> None:
    for group in ("lock", "state"):
        module, attr = _COMMANDS[group]
        command = getattr(importlib.import_module(module), attr)
        for name in command.commands:
            assert _complete(["--config", config, group, name], "pay") == ["payments", "payroll"], (group, name)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_completion_command_prints_the_shells_hook(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["completion", shell])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"{COMPLETE_VAR}={shell}_complete" in out and "coordinator" in out, out
