"""Print the command reference (docs/reference/commands.md) from the CLI's own help.

    python scripts/cli_reference.py > docs/reference/commands.md

It walks the click command tree of ``coordinator.cli`` and prints every command's
``--help`` as the command prints it, at a fixed width, so the page is the same on every
machine. tests/cli/unit/test_cli_reference.py fails when the committed file is stale.
"""

from __future__ import annotations

from collections.abc import Iterator

import click

from coordinator.cli import cli

# The width --help wraps at on any terminal of 100 columns or more: the CLI's
# max_content_width (100) less click's margin of 2.
WIDTH = 98

HEAD = """# Command reference

Every command's `--help`, as `coordinator` prints it. This page is generated from the
command-line interface itself (`python scripts/cli_reference.py > docs/reference/commands.md`),
and `tests/cli/unit/test_cli_reference.py` fails when it is stale. How the commands fit
together, with an example for each, is in [Using the command line](../cli.md); the exit
codes are in [its table](../cli.md#exit-codes).
"""


def context(command: click.Command, name: str, parent: click.Context | None = None) -> click.Context:
    """The context ``name --help`` runs in: the command's own settings (``-h``, widths),
    no arguments parsed, and the fixed width."""
    return command.make_context(name, [], parent=parent, resilient_parsing=True, terminal_width=WIDTH)


def commands(command: click.Command, ctx: click.Context) -> Iterator[tuple[click.Context, click.Command]]:
    """``command`` and every visible command below it, depth first in the order ``--help``
    lists them, each with the context its own ``--help`` would have."""
    yield ctx, command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from commands(sub, context(sub, name, ctx))


def render() -> str:
    root = context(cli, "coordinator")
    parts = [HEAD]
    for ctx, command in commands(cli, root):
        text = command.get_help(ctx).rstrip()
        parts.append(f"\n## {ctx.command_path}\n\n```text\n{text}\n```\n")
    return "".join(parts)


if __name__ == "__main__":
    print(render(), end="")
