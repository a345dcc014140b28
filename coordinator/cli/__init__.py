"""The ``coordinator`` command line: parse, call the API, print, exit.

Command groups are imported lazily (only the group a command needs is imported), so
``coordinator lock status`` does not pay for the sandbox or state code.
"""

from __future__ import annotations

import errno
import functools
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from coordinator import __version__
from coordinator.errors import CoordinatorError, ExitCode
from coordinator.text import printable

# name -> "module:attribute" of a click command or group
_COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("coordinator.cli.clusters", "cluster"),
    "deployment": ("coordinator.cli.deployments", "deployment"),
    "drift": ("coordinator.cli.drift", "drift"),
    "lock": ("coordinator.cli.lock", "lock"),
    "state": ("coordinator.cli.state", "state"),
    "sandbox": ("coordinator.cli.sandbox", "sandbox"),
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


class StdoutClosed(Exception):
    """Whoever read our output stopped reading (e.g. ``| head -1``): a normal ending."""


def _is_closed_stdout(err: BaseException) -> bool:
    if isinstance(err, BaseExceptionGroup):
        return any(_is_closed_stdout(e) for e in err.exceptions)
    return isinstance(err, OSError) and err.errno == errno.EPIPE


class _Suggesting:
    """Mixed into a group's class: an unknown command gets "Did you mean ...?" from the
    group's own names (click suggests only from the commands it has loaded, and the
    top-level groups are loaded only when used)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        group: click.Group = self  # type: ignore[assignment]
        name = click.utils.make_str(args[0]) if args else ""
        if name and not name.startswith("-") and not ctx.resilient_parsing and group.get_command(ctx, name) is None:
            from coordinator.errors import did_you_mean

            raise click.UsageError(f"No such command {name!r}.{did_you_mean(name, group.list_commands(ctx))}", ctx)
        resolved: tuple[str | None, click.Command | None, list[str]] = super().resolve_command(ctx, args)  # type: ignore[misc]
        return resolved


class LazyGroup(_Suggesting, click.Group):
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
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module = importlib.import_module(target[0])
        command: click.Command = getattr(module, target[1])
        if not getattr(command, _ADOPTED, False):
            from coordinator.cli.completion import attach

            attach(cmd_name, command)  # deployment and cluster names complete
        adopt_global_options(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Summaries are listed without importing every group.
        rows = [(name, _SUMMARIES.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@dataclass
class App:
    """What the root options decide, handed to every command through click's context."""

    config_path: str | None = None
    output: str = "table"
    log_format: str = "console"
    verbosity: int = 0
    timeout: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ global options
#
# kubectl users put `-o json` or `--timeout 10s` after the subcommand. The root options
# are therefore also added to every command of the tree (when its group is loaded), and
# what is given there is merged into the App the root built: a value given after the
# subcommand wins over one given before it. A command that already has an option of
# the same spelling keeps its own (e.g. `sandbox up --timeout`, the wait for the
# clusters). A command that passes unknown options on to a child (`lock run ... -- CMD`)
# takes the global options only before its name: after it, `-o` or `-v` belong to the
# child's command line.


@dataclass(frozen=True)
class _Global:
    flags: tuple[str, ...]
    dest: str  # the keyword the leaf callback receives (removed before calling it)
    kwargs: dict[str, Any]


_GLOBALS: tuple[_Global, ...] = (
    _Global(
        ("-o", "--output"),
        "global_output",
        {"type": click.Choice(["table", "json", "yaml"]), "help": "Output format [default: table]."},
    ),
    _Global(
        ("--timeout",),
        "global_timeout",
        {
            "type": str,
            "metavar": "DURATION",
            "help": "Per-cluster request timeout, e.g. 5s [env COORDINATOR_TIMEOUT; default 5s].",
        },
    ),
    _Global(
        ("--config",),
        "global_config",
        {"type": click.Path(dir_okay=False), "help": "Local config file [env COORDINATOR_CONFIG]."},
    ),
    _Global(("-v", "--verbose"), "global_verbosity", {"count": True, "help": "More logging (-v, -vv)."}),
    _Global(
        ("--log-format",),
        "global_log_format",
        {"type": click.Choice(["console", "json"]), "help": "Format of log lines on stderr [default: console]."},
    ),
)
_GLOBALS_HEADING = "Global options (before or after the command)"
_ADOPTED = "_coordinator_globals"


class GlobalOption(click.Option):
    """A root option repeated on a subcommand; listed under its own heading in --help."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        return None  # not among the command's own options; see _GlobalsHelp

    def global_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        return super().get_help_record(ctx)


def _global_option(g: _Global) -> GlobalOption:
    return GlobalOption([*g.flags, g.dest], **g.kwargs)


class _GlobalsHelp:
    """Mixed into a command's class: its --help ends with the global options."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)  # type: ignore[misc]
        params = [p for p in getattr(self, "params", []) if isinstance(p, GlobalOption)]
        before_only = not params
        if before_only:
            params = [_global_option(g) for g in _GLOBALS]
        rows = [r for p in params if (r := p.global_help_record(ctx)) is not None]
        heading = (
            f"Global options (only before `{ctx.info_name}`: after it, options are the command's own)"
            if before_only
            else _GLOBALS_HEADING
        )
        with formatter.section(heading):
            formatter.write_dl(rows)


_HELP_CLASSES: dict[type, type] = {}


def _with_globals_help(command: click.Command) -> None:
    cls = type(command)
    if cls not in _HELP_CLASSES:
        mixins = (_GlobalsHelp, _Suggesting) if issubclass(cls, click.Group) else (_GlobalsHelp,)
        _HELP_CLASSES[cls] = type(cls.__name__, (*mixins, cls), {})
    command.__class__ = _HELP_CLASSES[cls]


def _merge_globals(values: dict[str, Any]) -> None:
    """What was given after a subcommand, onto the App the root options built."""
    ctx = click.get_current_context()
    app = ctx.find_root().obj
    if not isinstance(app, App):
        return
    if values.get("global_output") is not None:
        app.output = values["global_output"]
    if values.get("global_config") is not None:
        app.config_path = values["global_config"]
    if values.get("global_timeout") is not None:
        from coordinator.durations import TIMEOUT_MIN, parse_duration

        least, why = TIMEOUT_MIN
        app.timeout = parse_duration(values["global_timeout"], what="--timeout", at_least=least, why=why)
    logging_changed = False
    if values.get("global_verbosity"):
        app.verbosity += values["global_verbosity"]
        logging_changed = True
    if values.get("global_log_format") is not None:
        app.log_format = values["global_log_format"]
        logging_changed = True
    if logging_changed:
        from coordinator.logs import configure_logging

        configure_logging(log_format=app.log_format, verbosity=app.verbosity)


def _wrap_callback(callback: Callable[..., Any] | None, dests: list[str]) -> Callable[..., Any]:
    @functools.wraps(callback or (lambda: None))
    def merged(*args: Any, **kwargs: Any) -> Any:
        _merge_globals({d: kwargs.pop(d, None) for d in dests})
        return callback(*args, **kwargs) if callback is not None else None

    return merged


def adopt_global_options(command: click.Command) -> None:
    """Give ``command`` and every command below it the global options (once)."""
    if getattr(command, _ADOPTED, False):
        return
    setattr(command, _ADOPTED, True)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            adopt_global_options(sub)
    _with_globals_help(command)
    if command.context_settings.get("ignore_unknown_options"):
        return  # its trailing words are a child's command line (see above)
    taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    names = {p.name for p in command.params}
    added = [_global_option(g) for g in _GLOBALS if not (set(g.flags) & taken) and g.dest not in names]
    if not added:
        return
    command.params.extend(added)
    command.callback = _wrap_callback(command.callback, [p.name for p in added if p.name])


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
    type=click.Choice(["table", "json", "yaml"]),
    default="table",
    show_default=True,
    help="Output format.",
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
    from coordinator.durations import TIMEOUT_MIN, parse_duration
    from coordinator.logs import configure_logging

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
