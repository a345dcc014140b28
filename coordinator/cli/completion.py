"""Shell completion: `coordinator completion bash|zsh|fish` prints the script that hooks
click's completion into the shell, and the names of this machine's deployments and
clusters complete where a command takes one (read from the local config, no cluster
asked).

    eval "$(coordinator completion bash)"      # in ~/.bashrc
    eval "$(coordinator completion zsh)"       # in ~/.zshrc
    coordinator completion fish > ~/.config/fish/completions/coordinator.fish
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import click
from click.shell_completion import CompletionItem

from coordinator.cli.base import Command

PROG = "coordinator"
COMPLETE_VAR = "_COORDINATOR_COMPLETE"

# (group, command, parameter) -> what it names; "*" is every command of the group.
DEPLOYMENT_PARAMS = {
    ("lock", "*", "deployment"),
    ("state", "*", "deployment"),
    ("deployment", "show", "name"),
    ("deployment", "delete", "name"),
    ("deployment", "add-cluster", "name"),
    ("deployment", "remove-cluster", "name"),
    ("deployment", "replace-cluster", "name"),
    ("cluster", "info", "deployments"),
    ("rbac", "print", "deployments"),
}
CLUSTER_PARAMS = {
    ("cluster", "info", "name"),
    ("cluster", "disconnect", "name"),
    ("cluster", "restored", "name"),
    ("deployment", "create", "members"),
    ("deployment", "import", "source"),
    ("deployment", "add-cluster", "cluster"),
    ("deployment", "remove-cluster", "cluster"),
    ("deployment", "replace-cluster", "old"),
    ("deployment", "replace-cluster", "new"),
    ("state", "sync", "source"),
}


def _config_path(ctx: click.Context) -> str | None:
    """``--config`` as typed so far (after the command, or before it), else None: the
    config store falls back to COORDINATOR_CONFIG and the default path."""
    node: click.Context | None = ctx
    while node is not None:
        for key in ("global_config", "config_path"):
            value = node.params.get(key)
            if value:
                return str(value)
        node = node.parent
    return None


def _names(ctx: click.Context, which: str) -> list[str]:
    from coordinator.config.store import ConfigStore
    from coordinator.errors import CoordinatorError

    try:
        config = ConfigStore(_config_path(ctx)).load()
    except (CoordinatorError, OSError):  # no completion beats a traceback at the prompt
        return []
    return sorted(config.deployments if which == "deployments" else config.clusters)


def complete_deployments(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The deployments of the local config whose names start with ``incomplete``."""
    return [CompletionItem(n) for n in _names(ctx, "deployments") if n.startswith(incomplete)]


def complete_clusters(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The connected clusters of the local config whose names start with ``incomplete``."""
    return [CompletionItem(n) for n in _names(ctx, "clusters") if n.startswith(incomplete)]


def _bound(
    callback: Callable[..., list[CompletionItem]], param: click.Parameter, ctx: click.Context, incomplete: str
) -> list[CompletionItem]:
    return callback(ctx, param, incomplete)


def attach(group_name: str, command: click.Command) -> None:
    """Give the parameters of ``command`` (a top-level group) that name a deployment or a
    cluster their completion."""
    subcommands = command.commands if isinstance(command, click.Group) else {}
    for name, sub in subcommands.items():
        for param in sub.params:
            found: Callable[..., list[CompletionItem]] | None = None
            for table, callback in ((DEPLOYMENT_PARAMS, complete_deployments), (CLUSTER_PARAMS, complete_clusters)):
                if {(group_name, name, param.name), (group_name, "*", param.name)} & table:
                    found = callback
            if found is not None:
                # What click calls to complete a value (the shell_complete= of a decorator).
                param.shell_complete = functools.partial(_bound, found, param)  # type: ignore[method-assign]


@click.command("completion", cls=Command)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell's completion script (commands, options, deployment and cluster names).

    \b
    Examples:
      eval "$(coordinator completion bash)"     # ~/.bashrc
      eval "$(coordinator completion zsh)"      # ~/.zshrc
      coordinator completion fish > ~/.config/fish/completions/coordinator.fish
    """
    from click.shell_completion import get_completion_class

    from coordinator.cli import cli

    cls = get_completion_class(shell)
    assert cls is not None  # the choices are click's own shells
    click.echo(cls(cli, {}, PROG, COMPLETE_VAR).source())
