"""Rendering only: tables for people (rich on a terminal, plain text when piped),
JSON or YAML documents for machines. ``NO_COLOR`` is respected.

Everything for people goes out through :func:`table`, :func:`say` and :func:`note` (and
errors through ``cli.main``), which show control characters as escapes: much of what is
printed was written into the clusters by others (see ``coordinator.text``). JSON and
YAML documents are printed exact."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from coordinator.errors import CoordinatorError
from coordinator.text import printable

T = TypeVar("T")


def app_of(ctx: click.Context) -> Any:
    from coordinator.cli import App

    obj = ctx.find_root().obj
    return obj if isinstance(obj, App) else App()


# Set by the entry point when this process is the `coordinator` program itself (not the CLI
# called inside another program): only then may a command change process-wide settings
# such as signal dispositions.
AS_PROGRAM = False


def run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    import anyio

    return anyio.run(fn)


def utc_text(value: datetime, fmt: str | None = None) -> str:
    """``value`` in UTC (ISO 8601, or ``fmt``); a time that UTC cannot hold (a well-formed
    ``9999-12-31T23:59:59-14:00`` is a day past the calendar) as it was written. A time
    without a zone is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):
        return value.isoformat()
    return utc.strftime(fmt) if fmt else utc.isoformat().replace("+00:00", "Z")


def to_jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return utc_text(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return to_jsonable(value.model_dump(mode="json", by_alias=True))
    return value


def dump_document(doc: Any, fmt: str) -> str:
    data = to_jsonable(doc)
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False)).rstrip("\n")
    import json

    return json.dumps(data, indent=2, sort_keys=False)


def emit(ctx: click.Context, doc: Any, text: Callable[[], None]) -> None:
    """Print ``doc`` as JSON/YAML when asked, else call ``text`` to print for people."""
    fmt = app_of(ctx).output
    if fmt in ("json", "yaml"):
        click.echo(dump_document(doc, fmt))
    else:
        text()


def emit_failure(ctx: click.Context, err: CoordinatorError, doc: Any) -> None:
    """With -o json/yaml, a failed command still prints its document on stdout."""
    fmt = app_of(ctx).output
    if fmt in ("json", "yaml"):
        click.echo(dump_document(doc, fmt))


def _color() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    """A table: boxed with rich on a terminal, aligned plain columns when piped.

    Every cell is one line of printable text: a newline or control character in a value
    is shown as an escape, so that no value can add a row or act on the terminal."""
    cells = [["" if c is None else printable(str(c)) for c in row] for row in rows]
    headers = [printable(h) for h in headers]
    title = printable(title) if title is not None else None
    if _color():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        # Text objects, not strings: rich would read '[...]' in a value as markup.
        t = Table(title=Text(title) if title else None, title_justify="left", header_style="bold")
        for h in headers:
            t.add_column(Text(h), overflow="fold")
        for row in cells:
            t.add_row(*(Text(c) for c in row))
        Console().print(t)
        return
    if title:
        click.echo(title)
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    click.echo("  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers)).rstrip())
    for row in cells:
        click.echo("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())


def when(value: datetime | None) -> str:
    """Absolute UTC time and how long ago / from now, e.g. '08:01:02Z (2m10s ago)'."""
    from coordinator.durations import format_duration

    if value is None:
        return "-"
    now = datetime.now(UTC)
    delta = ((value if value.tzinfo else value.replace(tzinfo=UTC)) - now).total_seconds()
    rel = f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(-delta)} ago"
    return f"{utc_text(value, '%Y-%m-%d %H:%M:%SZ')} ({rel})"


def say(text: str) -> None:
    """One line for people on stdout; control characters (newlines too) as escapes."""
    click.echo(printable(text))


def note(text: str) -> None:
    """One line for people on stderr; control characters (newlines too) as escapes."""
    click.echo(printable(text), err=True)


def live_line(text: str) -> None:
    """Replace the current line of a terminal on stderr (a progress line) with ``text``."""
    sys.stderr.write("\r\033[K" + printable(text)[:200])
    sys.stderr.flush()
