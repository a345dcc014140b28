"""How the kubectl plugin reads kubectl's flags before the CLI runs (coordinator/cli/kubectl.py);
tests/cli/integration/test_kubectl_plugin.py runs it through kubectl on a sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.cli.kubectl import translate
from coordinator.errors import UsageError


@pytest.fixture(autouse=True)
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COORDINATOR_CONFIG", str(tmp_path / "absent.yaml"))


def test_a_commands_own_option_is_kept_and_moved_after_its_name() -> None:
    assert translate(["-n", "ns", "lock", "status"]) == (["lock", "status", "-n", "ns"], None)
    assert translate(["-nns", "lock", "status"]) == (["lock", "status", "-n", "ns"], None)
    args, reach = translate(["cluster", "connect", "a", "--context=ctx", "--kubeconfig", "k"])
    assert args == ["cluster", "connect", "a", "--context", "ctx", "--kubeconfig", "k"] and reach is None


def test_an_options_value_is_not_taken_for_a_flag() -> None:
    assert translate(["lock", "acquire", "d", "--reason", "-nightly"]) == (
        ["lock", "acquire", "d", "--reason", "-nightly"],
        None,
    )


def test_lock_run_reads_flags_only_before_the_double_dash() -> None:
    args, _ = translate(["lock", "run", "d", "-n", "ns", "--", "helm", "-n", "ns", "--context", "x"])
    assert args == ["lock", "run", "d", "--", "helm", "-n", "ns", "--context", "x"]
    # Without `--`, every word after the deployment may be the command's: left alone.
    assert translate(["lock", "run", "d", "./deploy", "-n", "3"])[0] == ["lock", "run", "d", "./deploy", "-n", "3"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["lock", "status", "d", "--context", "ctx"], "give --context MEMBER=CONTEXT"),
        (["cluster", "list", "-n", "ns"], "does not apply to `cluster list`"),
        (["lock", "status", "d", "--kubeconfig", "/nonexistent/k"], "no such file"),
        (["lock", "status", "d", "--context"], "--context needs a value"),
    ],
)
def test_a_flag_that_makes_no_sense_there_is_refused(args: list[str], said: str) -> None:
    with pytest.raises(UsageError) as err:
        translate(args)
    assert said in err.value.message


def test_kubeconfig_and_contexts_say_how_members_are_reached(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "k"
    kubeconfig.write_text("{}")
    args, reach = translate(["lock", "status", "d", "--kubeconfig", str(kubeconfig)])
    assert args == ["lock", "status", "d"]
    assert reach is not None and reach.kubeconfig == str(kubeconfig) and dict(reach.contexts) == {}
