"""`coordinator drift DEPLOYMENT` is `coordinator drift check DEPLOYMENT`; the subcommands
and help stay reachable (coordinator/cli/drift.py)."""

from __future__ import annotations

import click
import pytest

from coordinator.cli import cli


def resolved(*words: str) -> tuple[str, list[str]]:
    """The drift subcommand ``coordinator drift WORDS`` runs, and what it is given."""
    root = cli.make_context("coordinator", ["drift", *words])
    group = cli.get_command(root, "drift")
    assert isinstance(group, click.Group)
    ctx = group.make_context("drift", list(words), parent=root)
    name, command, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
    assert name is not None and command is not None
    sub = command.make_context(name, list(rest), parent=ctx)
    return name, [str(v) for v in sub.params.values() if isinstance(v, str)]


@pytest.mark.parametrize(
    ("words", "name"),
    [
        (("payments",), "check"),
        (("check", "payments"), "check"),
        (("payments", "-o", "json"), "check"),
        (("record", "payments", "deployment/api"), "record"),
    ],
)
def test_a_deployment_alone_is_checked_and_subcommands_stay_themselves(words: tuple[str, ...], name: str) -> None:
    found, given = resolved(*words)
    assert found == name
    assert "payments" in given


def test_drift_alone_and_drift_help_show_the_group() -> None:
    group = cli.get_command(cli.make_context("coordinator", ["drift"]), "drift")
    assert isinstance(group, click.Group)
    for words in ([], ["--help"]):
        with pytest.raises((click.exceptions.Exit, click.exceptions.NoArgsIsHelpError)):
            group.make_context("drift", list(words))
