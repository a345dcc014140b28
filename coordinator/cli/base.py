"""What every command of the CLI shares: the App the root options build, and the global
options that every subcommand also takes after its name.

Every group and command below the root is a :class:`Group` or a :class:`Command`: a group
makes its subcommands of these classes (click's ``command_class`` and ``group_class``),
and a command module's own top-level group or command names the class once
(``@click.group(cls=Group)``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

_F = TypeVar("_F")


@dataclass
class App:
    """What the root options decide, handed to every command through click's context."""

    config_path: str | None = None
    output: str = "table"
    log_format: str = "console"
    verbosity: int = 0
    timeout: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ -o FORMAT
#
# Beside table, json and yaml, kubectl's three: `name` (KIND/NAME, one line per object;
# the kinds are `cluster`, `deployment` and `lock`), `wide` (the table with more columns
# where a command has more to show, else the table) and `jsonpath=TEMPLATE` (read over
# the document `-o json` prints). `-o name` is taken only by the commands that print
# objects (see :func:`prints_names`); every other command refuses it before it starts.

FORMATS = ("table", "wide", "json", "yaml", "name", "jsonpath=TEMPLATE")


class OutputFormat(click.ParamType):  # type: ignore[type-arg]
    """``-o``'s value: one of :data:`FORMATS`; a jsonpath template is parsed here, so that
    one that does not parse is a usage error before anything runs."""

    name = "format"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "FORMAT"  # the values are in the help: all of them would fill the line

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        return [CompletionItem(f) for f in (*FORMATS[:-1], "jsonpath=") if f.startswith(incomplete)]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        # kubectl's own docs write `-o=jsonpath=...`: for a short option click keeps the
        # "=" as the value's first character.
        if text.startswith("="):
            text = text[1:]
        if text in FORMATS[:-1]:
            return text
        kind, eq, template = text.partition("=")
        if kind == "jsonpath" and eq:
            from coordinator.cli.jsonpath import TemplateError, parse

            if not template:
                self.fail("jsonpath= needs a template, e.g. -o jsonpath='{.holder}'.", param, ctx)
            try:
                parse(template)
            except TemplateError as err:
                self.fail(
                    f"cannot read the jsonpath template {template!r}: {err}. Write it as kubectl does, e.g. "
                    "-o jsonpath='{.holder}' or -o jsonpath='{range .clusters[*]}{.name}{\"\\n\"}{end}'.",
                    param,
                    ctx,
                )
            return text
        self.fail(f"{text!r} is not one of {', '.join(FORMATS)}.", param, ctx)


def is_document(fmt: str) -> bool:
    """Does ``fmt`` print the command's document (json, yaml, jsonpath) rather than text?"""
    return fmt in ("json", "yaml") or fmt.startswith("jsonpath=")


# The attribute a command's callback carries when it prints objects (takes -o name).
_PRINTS_NAMES = "_coordinator_prints_names"


def prints_names(fn: _F) -> _F:
    """Mark a command's callback (the decorator next to ``def``) as one that prints
    objects, and so takes ``-o name``: its :func:`emit` is given their names."""
    setattr(fn, _PRINTS_NAMES, True)
    return fn


def check_format(ctx: click.Context, callback: Any) -> None:
    """Refuse ``-o name`` for a command that prints no objects, before it runs."""
    app = ctx.find_root().obj
    if isinstance(app, App) and app.output == "name" and not getattr(callback, _PRINTS_NAMES, False):
        raise click.UsageError(
            f"`{ctx.command_path}` prints no objects to name: -o name is for the commands that list or show "
            "clusters, deployments and locks. Use -o json, or -o jsonpath=TEMPLATE to pick fields.",
            ctx,
        )


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


GLOBALS: tuple[_Global, ...] = (
    _Global(
        ("-o", "--output"),
        "global_output",
        {
            "type": OutputFormat(),
            "help": "table, wide, json, yaml, name or jsonpath=TEMPLATE (see docs/cli.md) [default: table].",
        },
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


class GlobalOption(click.Option):
    """A root option repeated on a subcommand; listed under its own heading in --help."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        return None  # not among the command's own options; see _format_globals

    def global_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        return super().get_help_record(ctx)


def _global_option(g: _Global) -> GlobalOption:
    return GlobalOption([*g.flags, g.dest], **g.kwargs)


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
        from coordinator.rules.durations import TIMEOUT_MIN, parse_duration

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


def _checked(callback: Callable[..., Any] | None) -> Callable[..., Any]:
    """``callback``, after checking that the command takes the -o format asked for."""

    @functools.wraps(callback or (lambda: None))
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_format(click.get_current_context(), callback)
        return callback(*args, **kwargs) if callback is not None else None

    return checked


def _add_globals(command: click.Command) -> None:
    """Give ``command`` the global options it does not spell itself, and merge what they
    say into the App before its callback runs."""
    if command.context_settings.get("ignore_unknown_options"):
        return  # its trailing words are a child's command line (see above)
    taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    names = {p.name for p in command.params}
    added = [_global_option(g) for g in GLOBALS if not (set(g.flags) & taken) and g.dest not in names]
    if not added:
        return
    command.params.extend(added)
    command.callback = _wrap_callback(command.callback, [p.name for p in added if p.name])


def _format_globals(command: click.Command, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """The end of a command's --help: the global options, under their own heading."""
    params = [p for p in command.params if isinstance(p, GlobalOption)]
    before_only = not params
    if before_only:
        params = [_global_option(g) for g in GLOBALS]
    rows = [r for p in params if (r := p.global_help_record(ctx)) is not None]
    heading = (
        f"Global options (only before `{ctx.info_name}`: after it, options are the command's own)"
        if before_only
        else _GLOBALS_HEADING
    )
    with formatter.section(heading):
        formatter.write_dl(rows)


class Command(click.Command):
    """A command below the root: it takes the global options after its name too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Checked once the options after the command are merged (the wrapper _add_globals
        # puts around this one), before the command does anything.
        self.callback = _checked(self.callback)
        _add_globals(self)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)
        _format_globals(self, ctx, formatter)


class Suggesting:
    """A group whose unknown command gets "Did you mean ...?" from the
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


class Group(Suggesting, click.Group):
    """A group below the root: it takes the global options after its name too, and its
    subcommands are :class:`Command` and :class:`Group`."""

    command_class = Command
    group_class = type  # subgroups of the same class as this one

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_globals(self)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)
        _format_globals(self, ctx, formatter)
