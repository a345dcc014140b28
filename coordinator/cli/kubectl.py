"""`kubectl coordinator ...`: the CLI as a kubectl plugin (the `kubectl-coordinator` executable).

kubectl runs a plugin with the words after its name and parses none of them, so kubectl's
own flags arrive here. What they mean for a tool that works on every member cluster of a
deployment at once:

- ``--kubeconfig PATH``: every member connected through a kubeconfig is reached through
  PATH for this command instead of the kubeconfig it was connected through (a member
  connected with ``--in-cluster`` keeps the pod's credentials).
- ``--context MEMBER=CONTEXT`` (repeatable): that member is reached through CONTEXT for
  this command. A bare ``--context CONTEXT`` names one cluster where the command needs
  all of them, and is refused.
- ``-n/--namespace NS``: with a deployment, a check that the deployment lives in NS (its
  namespace is recorded when it is created or imported); refused where nothing is
  namespaced.

Where the command has an option of that spelling itself (``cluster connect --context
--kubeconfig``, ``lock status -n`` of the fleet, ``deployment create -n``), the command's
own option is meant. Every member is still proven to be the recorded cluster before its
answer counts, so a context that leads elsewhere fails the command (exit 5); nothing given
here is saved. The flags go anywhere before ``--`` (``lock run``: only before ``--``,
which it needs then; after it, everything is the command's own).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from coordinator.engine.clusters import ReachThrough

PROG = "kubectl coordinator"

# Root options that take a value, so that the word after them is not taken for a
# command name (the spellings of coordinator.cli's root and global options).
_ROOT_VALUED = frozenset({"-o", "--output", "--config", "--timeout", "--log-format"})
_FLAGS = {"--context": "context", "--kubeconfig": "kubeconfig", "-n": "namespace", "--namespace": "namespace"}


@dataclass
class KubectlFlags:
    """kubectl's flags as given (each spelling the command does not own itself)."""

    contexts: list[str] = field(default_factory=list)
    kubeconfig: str | None = None
    namespace: str | None = None
    config: str | None = None  # --config, for reading the deployment's namespace


def _split_flag(arg: str) -> tuple[str, str | None] | None:
    """(spelling, value given in the same word or None) when ``arg`` is one of kubectl's flags."""
    for spelling in _FLAGS:
        if arg == spelling:
            return spelling, None
        if spelling.startswith("--") and arg.startswith(spelling + "="):
            return spelling, arg[len(spelling) + 1 :]
    if arg.startswith("-n") and not arg.startswith("--") and len(arg) > 2:
        return "-n", arg[2:].removeprefix("=")  # -nNS and -n=NS, as kubectl takes them
    return None


def _strip(
    args: Sequence[str],
    owned: frozenset[str] = frozenset(),
    valued: frozenset[str] = frozenset(),
    lenient: bool = False,
) -> tuple[list[str], KubectlFlags]:
    """``args`` without kubectl's flags (up to ``--``), and what they said. A spelling in
    ``owned`` is the command's own: it is kept, moved after the command's name (`kubectl
    coordinator -n NS lock status` as kubectl users put it). ``valued`` are the options
    whose next word is their value, never taken for a flag; ``lenient`` drops a flag
    missing its value instead of refusing it."""
    from coordinator.errors import UsageError

    kept: list[str] = []
    moved: list[str] = []
    flags = KubectlFlags()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(args):
            flags.config = args[i + 1]
        elif arg.startswith("--config="):
            flags.config = arg.split("=", 1)[1]
        if arg in valued and arg not in _FLAGS:
            kept.extend(args[i : i + 2])
            i += 2
            continue
        found = _split_flag(arg)
        if found is None:
            kept.append(arg)
            i += 1
            continue
        spelling, value = found
        taken = [arg] if value is not None else list(args[i : i + 2])
        if value is None:
            if i + 1 >= len(args) or args[i + 1] == "--":
                if lenient:  # only finding the command: the second pass says what is missing
                    i += 1
                    continue
                raise UsageError(f"{spelling} needs a value (kubectl coordinator ... {spelling} VALUE).")
            value = args[i + 1]
        i += len(taken)
        if spelling in owned or (spelling == "--namespace" and "-n" in owned):
            moved.extend([spelling, value])  # click reads `-n=NS` as "=NS": given apart
            continue
        what = _FLAGS[spelling]
        if what == "context":
            flags.contexts.append(value)
        elif what == "kubeconfig":
            flags.kubeconfig = value
        else:
            flags.namespace = value
    return [*kept, *moved, *args[i:]], flags


def _leaf(args: Sequence[str]) -> tuple[list[str], click.Command | None, list[str]]:
    """The command path named by ``args`` (e.g. ["lock", "status"]), its command, and the
    words after its name."""
    from coordinator.cli import cli

    ctx = click.Context(cli, info_name=PROG)
    command: click.Command = cli
    path: list[str] = []
    i = 0
    while i < len(args) and isinstance(command, click.Group):
        arg = args[i]
        if arg in _ROOT_VALUED:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        sub = command.get_command(ctx, arg)
        if sub is None:
            return path, None, list(args[i:])
        command, path = sub, [*path, arg]
        i += 1
    return path, (None if isinstance(command, click.Group) else command), list(args[i:])


def _valued(command: click.Command) -> frozenset[str]:
    """The spellings of the options of ``command`` (and the global ones) that take a value."""
    from coordinator.cli.base import GLOBALS

    valued = set(_ROOT_VALUED) | {f for g in GLOBALS if not g.kwargs.get("count") for f in g.flags}
    for p in command.params:
        if isinstance(p, click.Option) and not p.is_flag and not p.count:
            valued.update(p.opts)
            valued.update(p.secondary_opts)
    return frozenset(valued)


def _first_argument(command: click.Command, rest: Sequence[str]) -> str | None:
    """The first positional word of ``rest`` for ``command`` (skipping its options and their values)."""
    valued = _valued(command)
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--":
            return rest[i + 1] if i + 1 < len(rest) else None
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in valued else 1
            continue
        return arg
    return None


def _deployment_of(path: Sequence[str], command: click.Command, rest: Sequence[str]) -> str | None:
    """The deployment a command acts on, when its first argument names one."""
    first = next((p for p in command.params if isinstance(p, click.Argument)), None)
    if first is None:
        return None
    names_a_deployment = first.name == "deployment" or (path[:1] == ["deployment"] and first.name == "name")
    return _first_argument(command, rest) if names_a_deployment else None


def check_namespace(deployment: str, namespace: str, config_path: str | None) -> None:
    """``-n NS`` with a deployment: refused (exit 2) unless the deployment's recorded
    namespace is NS. A deployment this machine does not know is left to the command,
    which says so with its own suggestions."""
    from coordinator.config.store import ConfigStore
    from coordinator.errors import CoordinatorError, UsageError

    try:
        record = ConfigStore(config_path).load().deployments.get(deployment)
    except (CoordinatorError, OSError):
        return
    if record is not None and record.namespace != namespace:
        raise UsageError(
            f"Deployment {deployment!r} is in namespace {record.namespace!r}, not {namespace!r} "
            f"(-n checks the namespace the deployment was created or imported with). Leave -n out, "
            f"or give -n {record.namespace}."
        )


def translate(args: Sequence[str]) -> tuple[list[str], ReachThrough | None]:
    """kubectl's command line for the plugin: coordinator's own arguments, and how the
    members are to be reached (a ReachThrough, or None: as recorded). Raises UsageError
    for a flag that makes no sense where it is given."""
    from coordinator.errors import UsageError, unknown_cluster

    # Which command is meant, read with every flag of kubectl's taken out; then taken out
    # again, less those the command has itself.
    path, command, _ = _leaf(_strip(args, lenient=True)[0])
    if command is None:
        return list(args), None  # help, --version, or a mistyped command: the CLI says which
    if command.context_settings.get("ignore_unknown_options") and "--" not in args:
        return list(args), None  # `lock run` without `--`: every word after it is the command's
    owned = frozenset(o for p in command.params for o in (*p.opts, *p.secondary_opts) if o in _FLAGS)
    kept, flags = _strip(args, owned, _valued(command))
    shown = " ".join(path)
    if flags.namespace is not None:
        deployment = _deployment_of(path, command, _leaf(kept)[2])
        if deployment is None:
            raise UsageError(
                f"-n/--namespace does not apply to `{shown}`: it names no deployment, and clusters "
                "are not namespaced. Leave -n out."
            )
        check_namespace(deployment, flags.namespace, flags.config)
    if not flags.contexts and flags.kubeconfig is None:
        return kept, None
    contexts: dict[str, str] = {}
    for given in flags.contexts:
        member, sep, context = given.partition("=")
        if not sep or not member or not context:
            raise UsageError(
                f"--context {given!r} names one kubeconfig context, but `{shown}` works on every member "
                "cluster at once, each through the context it was connected with. To reach a member "
                "through another context for this command, give --context MEMBER=CONTEXT (once per "
                "member); to connect a cluster, `kubectl coordinator cluster connect NAME --context CONTEXT`."
            )
        contexts[member] = context
    if flags.kubeconfig is not None and not os.path.isfile(os.path.expanduser(flags.kubeconfig)):
        raise UsageError(f"--kubeconfig {flags.kubeconfig!r}: no such file.")
    if contexts:
        from coordinator.config.store import ConfigStore

        store = ConfigStore(flags.config)
        known = store.load().clusters
        for member in contexts:
            if member not in known:
                raise unknown_cluster(member, known, store.path)
    from coordinator.engine.clusters import ReachThrough

    kubeconfig = None if flags.kubeconfig is None else os.path.abspath(os.path.expanduser(flags.kubeconfig))
    return kept, ReachThrough(kubeconfig=kubeconfig, contexts=contexts)


def main() -> None:
    """Entry point of the `kubectl-coordinator` executable."""
    from coordinator.cli import _error
    from coordinator.cli import main as cli_main
    from coordinator.engine.clusters import reaching_through
    from coordinator.errors import CoordinatorError
    from coordinator.text import printable

    try:
        args, reach = translate(sys.argv[1:])
    except CoordinatorError as err:
        _error(printable(err.message, keep_newlines=True))
        sys.exit(int(err.exit_code))
    if reach is not None:
        with reaching_through(reach):
            cli_main(args, prog_name=PROG, as_program=True)
    else:
        cli_main(args, prog_name=PROG, as_program=True)
