"""structlog to stderr: console lines for people, JSON lines for machines.

structlog (and the rich it imports for tracebacks) costs a few hundred milliseconds to
import, and most commands log nothing at the default level. So loggers are cheap
stand-ins: a call below the configured level returns at once, and structlog is imported
and configured on the first line that is actually written. What is written, and where,
is exactly what structlog configured by :func:`configure_logging` writes.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

# What configure_logging() asked for (or the quiet default); given to structlog when it
# is loaded, unless someone configured structlog themselves after that call.
_format = "console"
_level = logging.WARNING

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


def configure_logging(*, log_format: str = "console", verbosity: int = 0) -> None:
    global _format, _level
    _format = log_format
    _level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    if "structlog" in sys.modules:
        _apply()
    # else: applied by _structlog_logger() when the first line is written


def _apply() -> None:
    import structlog

    processors: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _exception_text,
    ]
    if _format == "json":
        processors.append(structlog.processors.JSONRenderer())  # JSON escapes control characters itself
    else:
        # Console lines carry what the clusters said (details, holders): escaped, one line each.
        # Never structlog's default exception formatter: rich's, which prints every
        # frame's local variables, request headers (the bearer token) included.
        processors += [
            _printable_values,
            structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def _printable_values(logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    from coordinator.text import printable

    # "exception" is the traceback made by _exception_text: escaped there, its lines kept.
    return {k: printable(v) if isinstance(v, str) and k != "exception" else v for k, v in event.items()}


def _exception_text(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``exc_info`` (``log.exception``) as a plain traceback under "exception", with -v
    only: no frame's local variables ever, and each exception's own text on one line,
    escaped (it may quote what a cluster said). At the default verbosity the line alone
    is written; the command's own message says what failed."""
    exc_info = event.pop("exc_info", None)
    if not exc_info or _level > logging.INFO:
        return event
    if isinstance(exc_info, BaseException):
        exc: BaseException | None = exc_info
    elif isinstance(exc_info, tuple):
        exc = exc_info[1]
    else:
        exc = sys.exc_info()[1]
    if exc is not None:
        event["exception"] = plain_traceback_text(exc)
    return event


def plain_traceback_text(exc: BaseException) -> str:
    """The traceback of ``exc`` and of the exceptions it was raised from: frames (file,
    line, source) and each exception's type and text, without local variables."""
    import traceback

    from coordinator.text import printable

    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    parts: list[str] = []
    for i, e in enumerate(reversed(chain)):
        if i:
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if e.__cause__ is not None
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_tb(e.__traceback__))
        parts.append(f"{type(e).__qualname__}: {printable(str(e))}\n")
    return printable("".join(parts), keep_newlines=True).rstrip("\n")


def _structlog_logger(name: str) -> Any:
    import structlog

    if not structlog.is_configured():
        # Our settings: those of configure_logging(), or, used as a library with structlog
        # unconfigured, quiet below warnings with stdout kept clean (structlog's own
        # default prints everything to stdout). Configured by someone else after
        # configure_logging() was called: theirs win, as they always did.
        _apply()
    return structlog.get_logger(name)


class Logger:
    """A named logger; the methods take an event text and key-value pairs, as structlog's."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _log(self, method: str, event: str, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        # Until structlog is loaded nobody else can have configured it: our level decides.
        if "structlog" not in sys.modules and _LEVELS[method] < _level:
            return None
        try:
            return getattr(_structlog_logger(self.name), method)(event, *args, **kw)
        except (OSError, ValueError):
            # A closed or broken log stream (a pipe gone, a test's captured stream closed)
            # must never end what the line was about: a lock decision, a release.
            return None

    def debug(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._log("debug", event, args, kw)

    def info(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._log("info", event, args, kw)

    def warning(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._log("warning", event, args, kw)

    warn = warning

    def error(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._log("error", event, args, kw)

    def exception(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._log("exception", event, args, kw)

    def critical(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._log("critical", event, args, kw)


def get_logger(name: str) -> Logger:
    if "structlog" in sys.modules:
        _structlog_logger(name)  # configured now, as it always was when asked for a logger
    return Logger(name)
