"""Rendering only: text for people, JSON or YAML documents for machines.

Text for people reads as kubectl's: tables are plain aligned columns, on a terminal as in
a pipe. On a terminal a table line longer than the terminal is cut at its width (ending
in "…": `-o json`, or a pipe, has every cell whole) rather than folded, and prose is
wrapped at word boundaries to the width; in a pipe every line is written whole, one line
per row or paragraph, for grep and awk. The width is the terminal's own, or ``COLUMNS``.

Everything for people goes out through :func:`table`, :func:`say` and :func:`note` (and
errors through ``cli.main``, with :func:`paragraph`), which show control characters as
escapes: much of what is printed was written into the clusters by others (see
``coordinator.text``). JSON and YAML documents are printed exact."""

from __future__ import annotations

import errno
import os
import sys
import unicodedata
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from coordinator.errors import CoordinatorError
from coordinator.text import printable

T = TypeVar("T")


def app_of(ctx: click.Context) -> Any:
    from coordinator.cli.base import App

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


def render_document(doc: Any, fmt: str) -> str:
    """``doc`` as ``fmt`` (json, yaml or jsonpath=TEMPLATE) prints it."""
    if fmt.startswith("jsonpath="):
        from coordinator.cli.jsonpath import parse

        return parse(fmt.partition("=")[2]).render(to_jsonable(doc))
    return dump_document(doc, fmt)


def emit(
    ctx: click.Context,
    doc: Any,
    text: Callable[[], None],
    *,
    names: Callable[[], Sequence[str]] | None = None,
    wide: Callable[[], None] | None = None,
) -> None:
    """Print ``doc`` as JSON/YAML or through a jsonpath template when asked; with -o name
    the objects' ``names`` (KIND/NAME); else call ``text`` (``wide`` for -o wide, when the
    command has more to show) to print for people."""
    from coordinator.cli.base import is_document

    fmt = app_of(ctx).output
    if is_document(fmt):
        # A template's text is the user's own: printed as it renders, without a newline
        # added, as kubectl does.
        rendered = render_document(doc, fmt)
        click.echo(rendered, nl=not fmt.startswith("jsonpath="))
    elif fmt == "name":
        if names is None:
            from coordinator.cli.base import check_format

            check_format(ctx, None)  # raises: the command was not marked
        else:
            for name in names():
                click.echo(printable(name))
    elif fmt == "wide" and wide is not None:
        wide()
    else:
        text()


def emit_failure(ctx: click.Context, err: CoordinatorError, doc: Any) -> None:
    """With -o json/yaml, a failed command still prints its document on stdout."""
    from coordinator.cli.base import is_document

    fmt = app_of(ctx).output
    if is_document(fmt):
        click.echo(render_document(doc, fmt), nl=not fmt.startswith("jsonpath="))


class ReaderGuard:
    """``sys.stdout`` while the program runs. When whoever reads it goes away (``| head
    -1``), what is written next goes to /dev/null and the command runs on to its end: its
    exit status is then its own (a failure still fails under ``set -o pipefail``), not
    the moment the reader left. A ``--watch`` asks :func:`reader_gone` and ends."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError as err:
            self._closed(err)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            self._closed(err)
            self._stream.flush()  # what was left in the buffer goes to /dev/null now

    def _closed(self, err: OSError) -> None:
        if err.errno != errno.EPIPE:
            raise err
        self.gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def reader_gone() -> bool:
    """Has the reader of stdout gone away (see :class:`ReaderGuard`)? Also asked of the
    pipe itself, without writing: a watch that prints only when something changes would
    otherwise run on for nobody until its next change."""
    if getattr(sys.stdout, "gone", False):
        return True
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # error events only: a pipe with no reader
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # not a file, or no poll here
        return False


def terminal_width(stream: Any) -> int | None:
    """The columns of the terminal ``stream`` writes to (``COLUMNS`` if set), or None when
    it is not a terminal."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError, OSError):  # closed, or not a file
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def cells(text: str) -> int:
    """How many terminal columns ``text`` (printable, one line) takes: wide East Asian
    characters two, combining marks none."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, the cut marked by a last "…"."""
    if cells(text) <= width:
        return text
    out, used = [], 0
    for ch in text:
        w = cells(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def _pad(text: str, width: int) -> str:
    return text + " " * (width - cells(text))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    """Aligned plain columns under upper-case headers, as kubectl prints them; on a
    terminal each line is cut at the terminal's width, never folded.

    Every cell is one line of printable text: a newline or control character in a value
    is shown as an escape, so that no value can add a row or act on the terminal."""
    cells_ = [["" if c is None else printable(str(c)) for c in row] for row in rows]
    headers = [printable(h) for h in headers]
    width = terminal_width(sys.stdout)
    if title:
        say(title)
    widths = [cells(h) for h in headers]
    for row in cells_:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], cells(c))
    lines = ["  ".join(_pad(h.upper(), widths[i]) for i, h in enumerate(headers)).rstrip()]
    lines += ["  ".join(_pad(c, widths[i]) for i, c in enumerate(row)).rstrip() for row in cells_]
    for line in lines:
        click.echo(clip(line, width) if width else line)


def paragraph(text: str, width: int | None) -> str:
    """``text`` (already printable; its own line breaks kept) wrapped at word boundaries to
    ``width`` columns, or as it is without a width. A continued line of an indented line
    (a cluster's line in an error) is indented two columns more; a word longer than the
    width stays whole."""
    if not width:
        return text
    import textwrap

    out = []
    for line in text.split("\n"):
        indent = line[: len(line) - len(line.lstrip(" "))]
        if cells(line) <= width or not line.strip():
            out.append(line)
            continue
        out.extend(
            textwrap.wrap(
                line,
                width=max(width, len(indent) + 20),
                subsequent_indent=indent + "  " if indent else "",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)


def when(value: datetime | None) -> str:
    """Absolute UTC time and how long ago / from now, e.g. '08:01:02Z (2m10s ago)'."""
    from coordinator.rules.durations import format_duration

    if value is None:
        return "-"
    now = datetime.now(UTC)
    delta = ((value if value.tzinfo else value.replace(tzinfo=UTC)) - now).total_seconds()
    rel = f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(-delta)} ago"
    return f"{utc_text(value, '%Y-%m-%d %H:%M:%SZ')} ({rel})"


def say(text: str) -> None:
    """One paragraph for people on stdout (wrapped to a terminal's width); control
    characters (newlines too) as escapes."""
    click.echo(paragraph(printable(text), terminal_width(sys.stdout)))


def note(text: str) -> None:
    """One paragraph for people on stderr (wrapped to a terminal's width); control
    characters (newlines too) as escapes."""
    click.echo(paragraph(printable(text), terminal_width(sys.stderr)), err=True)


def live_line(text: str) -> None:
    """Replace the current line of a terminal on stderr (a progress line) with ``text``,
    cut to one column less than the terminal's width: a line that reached the last
    column would wrap, and the next rewrite would leave the first row behind."""
    width = terminal_width(sys.stderr) or 80
    sys.stderr.write("\r\033[K" + clip(printable(text), max(width - 1, 10)))
    sys.stderr.flush()
