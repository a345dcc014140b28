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
    ]
    if _format == "json":
        processors.append(structlog.processors.JSONRenderer())  # JSON escapes control characters itself
    else:
        # Console lines carry what the clusters said (details, holders): escaped, one line each.
        processors += [_printable_values, structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def _printable_values(logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    from coordinator.text import printable

    return {k: printable(v) if isinstance(v, str) else v for k, v in event.items()}


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
