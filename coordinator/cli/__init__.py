"""The ``coordinator`` command line: parse, call the API, print, exit.

Command groups are imported lazily (only the group a command needs is imported), so
``coordinator lock status`` does not pay for the state code. Other distributions add
command groups through the ``coordinator.commands`` entry point: the sandbox
(``coordinator sandbox``) is one, installed from the repository's ``sandbox/`` folder.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from typing import Any

import click

from coordinator import __version__
from coordinator.cli.base import App, OutputFormat, Suggesting
from coordinator.errors import CoordinatorError, ExitCode
from coordinator.text import printable

# name -> "module:attribute" of a click command or group
_COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("coordinator.cli.clusters", "cluster"),
    "deployment": ("coordinator.cli.deployments", "deployment"),
    "drift": ("coordinator.cli.drift", "drift"),
    "lock": ("coordinator.cli.lock", "lock"),
    "state": ("coordinator.cli.state", "state"),
    "rbac": ("coordinator.cli.rbac", "rbac"),
    "completion": ("coordinator.cli.completion", "completion"),
}

_SUMMARIES = {
    "cluster": "Connect clusters and inspect them (identity, reachability, permissions).",
    "deployment": "Define which clusters a deployment spans, and in which namespace.",
    "drift": "Compare what each member runs with what the deployment's state recorded.",
    "lock": "Take, hold, inspect and release the majority-wins lock of a deployment.",
    "state": "Read and write the deployment's quorum-replicated state.",
    "sandbox": "Run local Kubernetes control planes (etcd + kube-apiserver) for demos and tests.",
    "rbac": "Print the minimal RBAC rules the tool needs.",
    "completion": "Print the shell completion script (bash, zsh, fish).",
}


# Set on a top-level group once its parameters that name deployments or clusters complete.
_COMPLETING = "_coordinator_completing"

# Command groups other distributions add (name -> "module:attribute").
PLUGINS = "coordinator.commands"

# Groups known by name whose distribution is not installed: what to install.
_INSTALL = {
    "sandbox": (
        "the coordinator-sandbox distribution (local control planes, kept out of coordinator "
        "itself); in a checkout of coordinator: `pip install ./sandbox`"
    ),
}


def _plugins() -> dict[str, Any]:
    """The installed ``coordinator.commands`` entry points, by name."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=PLUGINS) if ep.name not in _COMMANDS}


def _plugin(name: str) -> click.Command | None:
    """The command group ``name`` from an installed distribution; a clear error where it is
    known but not installed or cannot be imported; None for a name nobody provides."""
    from coordinator.errors import UsageError

    found = _plugins().get(name)
    if found is None:
        if name in _INSTALL:
            raise UsageError(f"`coordinator {name}` is not installed here. It comes with {_INSTALL[name]}.")
        return None
    try:
        command = found.load()
    except ImportError as err:
        install = f" It comes with {_INSTALL[name]}." if name in _INSTALL else ""
        raise UsageError(f"`coordinator {name}` cannot be loaded ({err}).{install}") from err
    if not isinstance(command, click.Command):
        raise UsageError(f"The entry point {found.value!r} for `coordinator {name}` is not a click command.")
    return command


class StdoutClosed(Exception):
    """Whoever read our output stopped reading (e.g. ``| head -1``): a normal ending."""


def _is_closed_stdout(err: BaseException) -> bool:
    if isinstance(err, BaseExceptionGroup):
        return any(_is_closed_stdout(e) for e in err.exceptions)
    return isinstance(err, OSError) and err.errno == errno.EPIPE


class LazyGroup(Suggesting, click.Group):
    # A closed stdout is caught here, before click's own handler turns it into exit 1:
    # in parsing (the root's --help) and in running the command.
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except OSError as err:
            if _is_closed_stdout(err):
                raise StdoutClosed() from None
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (OSError, BaseExceptionGroup) as err:
            if _is_closed_stdout(err):
                raise StdoutClosed() from None
            raise

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_COMMANDS, *_plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            found = _plugin(cmd_name)
            if found is None:
                return None
            command = found
        else:
            command = getattr(importlib.import_module(target[0]), target[1])
        if not getattr(command, _COMPLETING, False):
            from coordinator.cli.completion import attach

            attach(cmd_name, command)  # deployment and cluster names complete
            setattr(command, _COMPLETING, True)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Summaries are listed without importing every group.
        rows = [(name, _SUMMARIES.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Example: coordinator lock acquire payments --ttl 3m --reason 'release 1.2'",
)
@click.option(
    "--config",
    "config_path",
    envvar="COORDINATOR_CONFIG",
    type=click.Path(dir_okay=False),
    help="Local config file [env COORDINATOR_CONFIG; default $XDG_CONFIG_HOME/coordinator/config.yaml].",
)
@click.option(
    "-o",
    "--output",
    type=OutputFormat(),
    default="table",
    show_default=True,
    help="Output format: table, wide, json, yaml, name or jsonpath=TEMPLATE, as kubectl's (see docs/cli.md).",
)
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    default="console",
    show_default=True,
    help="Format of log lines on stderr.",
)
@click.option("-v", "--verbose", "verbosity", count=True, help="More logging (-v, -vv).")
@click.option(
    "--timeout",
    type=str,
    default=None,
    envvar="COORDINATOR_TIMEOUT",
    help="Per-cluster request timeout, e.g. 5s [env COORDINATOR_TIMEOUT; default 5s].",
)
@click.version_option(__version__, "--version", prog_name="coordinator")
@click.pass_context
def cli(
    ctx: click.Context,
    config_path: str | None,
    output: str,
    log_format: str,
    verbosity: int,
    timeout: str | None,
) -> None:
    """Coordinate work on a deployment that spans several Kubernetes clusters.

    Shell completion: eval "$(coordinator completion bash)" (or zsh; fish: see
    `coordinator completion --help`).
    """
    from coordinator.logs import configure_logging
    from coordinator.rules.durations import TIMEOUT_MIN, parse_duration

    app = App(
        config_path=config_path,
        output=output,
        log_format=log_format,
        verbosity=verbosity,
    )
    if timeout is not None:
        least, why = TIMEOUT_MIN
        app.timeout = parse_duration(timeout, what="--timeout", at_least=least, why=why)
    configure_logging(log_format=log_format, verbosity=verbosity)
    ctx.obj = app


def _verbosity_from_argv(argv: list[str]) -> int:
    count = 0
    for arg in argv:
        if arg == "--":
            break
        if arg == "--verbose":
            count += 1
        elif arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) == {"v"}:
            count += len(arg) - 1
    return count


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """A group holding one user-facing error (possibly nested) is that error."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    wanted = [e for e in leaves if isinstance(e, CoordinatorError | KeyboardInterrupt)]
    return wanted[0] if wanted else group


_NO_ARGS_IS_HELP: tuple[type[Exception], ...] = tuple(
    t for t in [getattr(click.exceptions, "NoArgsIsHelpError", None)] if isinstance(t, type)
)


def _usage_paragraph(err: click.UsageError) -> str:
    """What was wrong with the command line, then how the command is used."""
    text = " ".join(err.format_message().split())
    if not text.endswith((".", "?", "!")):
        text += "."
    if err.ctx is not None:
        usage = " ".join(err.ctx.get_usage().split())
        text += f" {usage} (see `{err.ctx.command_path} --help`)."
    return text


def _print_traceback() -> None:
    """The traceback of the exception being handled, on stderr, with what the clusters
    said in it (exception texts) escaped like every other message."""
    import traceback

    click.echo(printable(traceback.format_exc(), keep_newlines=True), err=True, nl=False)


def main(argv: list[str] | None = None, *, prog_name: str = "coordinator", as_program: bool | None = None) -> None:
    """Entry point: runs the CLI and maps every outcome to a documented exit code.

    ``prog_name`` is the name usage lines give (`kubectl coordinator` for the plugin);
    ``as_program`` says the process is the command itself (default: when ``argv`` is None)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None if as_program is None else as_program:
        from coordinator.cli import output

        output.AS_PROGRAM = True
    verbose = _verbosity_from_argv(args) > 0
    from coordinator.cli.output import ReaderGuard

    # A reader that stops early (`| head -1`) no longer decides the exit status: the
    # command runs to its end with its output going nowhere (see ReaderGuard).
    stdout = sys.stdout
    guard = stdout if isinstance(stdout, ReaderGuard) else ReaderGuard(stdout)
    sys.stdout = guard
    try:
        _run(args, verbose, prog_name)
    finally:
        # Flushed through the guard, whichever way the command ended: a reader gone by
        # now must not turn the interpreter's last flush into an error of its own.
        try:
            guard.flush()
        except (OSError, ValueError):
            pass
        sys.stdout = stdout


def _run(args: list[str], verbose: bool, prog_name: str = "coordinator") -> None:
    """Run the CLI and exit with its documented code."""
    try:
        try:
            # Without standalone mode click returns ctx.exit()'s code instead of exiting.
            code = cli.main(args=args, prog_name=prog_name, standalone_mode=False)
        except BaseExceptionGroup as group:
            raise _single(group) from None
    except CoordinatorError as err:
        if verbose:
            _print_traceback()
        # The paragraph carries what the clusters said: escaped, but its own lines kept.
        _error(printable(err.message, keep_newlines=True))
        sys.exit(int(err.exit_code))
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.UsageError as err:
        if isinstance(err, _NO_ARGS_IS_HELP):  # a bare group: its help is the answer
            err.show()
        else:
            # One paragraph like every other error (click's own: usage, blank line, error).
            _error(printable(_usage_paragraph(err)))
        sys.exit(int(ExitCode.USAGE))
    except click.ClickException as err:
        err.show()
        sys.exit(int(ExitCode.USAGE) if err.exit_code == 2 else err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except (StdoutClosed, BrokenPipeError):
        _end_quietly()
    except Exception as err:  # a bug: say so, keep the traceback behind -v
        if verbose:
            _print_traceback()
        click.echo(
            f"Internal error (this is a bug in coordinator {__version__}; please report it "
            f"with the output of the same command run with -v): {type(err).__name__}: {printable(str(err))}",
            err=True,
        )
        sys.exit(int(ExitCode.INTERNAL))
    try:
        sys.stdout.flush()
    except OSError as err:
        if not _is_closed_stdout(err):
            raise
        _end_quietly()
    sys.exit(code if isinstance(code, int) else 0)


def _error(text: str) -> None:
    """``Error: TEXT`` on stderr, wrapped at word boundaries to a terminal's width."""
    from coordinator.cli.output import paragraph, terminal_width

    click.echo(paragraph(f"Error: {text}", terminal_width(sys.stderr)), err=True)


def _end_quietly() -> None:
    """stdout was closed by its reader: exit 0, without the interpreter's complaint
    about flushing it at exit (stdout now leads to /dev/null)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        os._exit(0)
    sys.exit(0)
