"""Rendering only: tables for people (rich on a terminal, plain text when piped),
JSON or YAML documents for machines. ``NO_COLOR`` is respected."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import click

from coordinator.errors import CoordinatorError

T = TypeVar("T")


def app_of(ctx: click.Context) -> Any:
    from coordinator.cli import App

    obj = ctx.find_root().obj
    return obj if isinstance(obj, App) else App()


def run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return anyio.run(fn)


def to_jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
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
    """A table: boxed with rich on a terminal, aligned plain columns when piped."""
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    if _color():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, title_justify="left", header_style="bold")
        for h in headers:
            t.add_column(h, overflow="fold")
        for row in cells:
            t.add_row(*row)
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
    delta = (value - now).total_seconds()
    rel = f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(-delta)} ago"
    return f"{value.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%SZ')} ({rel})"


def say(text: str) -> None:
    click.echo(text)


def note(text: str) -> None:
    click.echo(text, err=True)
