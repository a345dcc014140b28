"""One Kubernetes API server, reached through a kubeconfig and a context.

This module (with its siblings in ``coordinator.kube``) is the only door to the API
server: it encodes the requests, applies the per-request timeout, retries throttled
ones, and turns every failure into a :class:`KubeError` of one classified kind. The
bytes go through a transport (``coordinator.kube.transport``): HTTPS with aiohttp by
default (``coordinator.kube.wire``), so that everything above this class runs the same
on any other. Nothing here logs credentials; error texts carry URLs and status
messages only.

Kubeconfig loading lives in ``coordinator.kube.kubeconfig`` and TLS contexts in
``coordinator.kube.tls``; their names are re-exported here.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any

import anyio

from coordinator import __version__
from coordinator.errors import UsageError
from coordinator.kube.kubeconfig import (  # noqa: F401  (re-exported: the door's names)
    IN_CLUSTER_CONTEXT,
    SERVICE_ACCOUNT_DIR,
    Endpoint,
    _check_connection_settings,
    _check_kubeconfig_file,
    _context_config,
    _kubeconfig_key,
    _load_yaml,
    _merge_documents,
    _merged_cache,
    _merged_kubeconfig,
    header_value,
    load_client_configuration,
    preload,
    service_account_dir,
)
from coordinator.kube.tls import (  # noqa: F401  (re-exported)
    _build_tls_context,
    _tls_cache,
    _tls_key,
    environment_has_proxy_or_netrc,
    tls_context,
)
from coordinator.kube.transport import Request, Transport, TransportError, TransportFactory
from coordinator.kube.wire import AiohttpTransport

__all__ = [
    "ALREADY_EXISTS",
    "CONFLICT",
    "ERROR",
    "FORBIDDEN",
    "IDENTITY_MISMATCH",
    "IN_CLUSTER_CONTEXT",
    "NOT_FOUND",
    "SERVICE_ACCOUNT_DIR",
    "THROTTLED",
    "UNREACHABLE",
    "USER_AGENT",
    "AiohttpTransport",
    "ApiResponse",
    "Endpoint",
    "ErrorKind",
    "KubeClient",
    "KubeError",
    "Transport",
    "TransportFactory",
    "environment_has_proxy_or_netrc",
    "load_client_configuration",
    "preload",
    "request_events",
    "service_account_dir",
    "tls_context",
]

# Sent with every request, so that API audit logs can tell this tool's writes apart.
USER_AGENT = f"coordinator/{__version__}"

# The client library logs some failures itself (an exec credential plugin that cannot
# run, for one) through the root handler; they reach the user once, in our own words.
logging.getLogger("kubernetes_asyncio").addHandler(logging.NullHandler())


class ErrorKind(StrEnum):
    """Kinds of failure, finer than Outcome: "not-found" and "already-exists" are answers
    that the lock and state engines decide on, never reported to users as such. Members
    are strings and compare equal to their values (``ErrorKind.NOT_FOUND == "not-found"``)."""

    UNREACHABLE = "unreachable"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not-found"
    CONFLICT = "conflict"
    ALREADY_EXISTS = "already-exists"
    # 429: API Priority and Fairness (or an admission webhook, or a proxy) refused the
    # request before doing anything; it may say when to come back (Retry-After).
    THROTTLED = "throttled"
    # The cluster answered, but it is not the one recorded (its kube-system UID differs).
    IDENTITY_MISMATCH = "identity-mismatch"
    ERROR = "error"


# The module's names of the kinds, as importers have used them (``kube.NOT_FOUND``).
UNREACHABLE = ErrorKind.UNREACHABLE
FORBIDDEN = ErrorKind.FORBIDDEN
NOT_FOUND = ErrorKind.NOT_FOUND
CONFLICT = ErrorKind.CONFLICT
ALREADY_EXISTS = ErrorKind.ALREADY_EXISTS
THROTTLED = ErrorKind.THROTTLED
IDENTITY_MISMATCH = ErrorKind.IDENTITY_MISMATCH
ERROR = ErrorKind.ERROR

# A throttled request is sent again after the server's Retry-After only when the retry
# would still have this long (or a quarter of the request timeout, if less) before the
# deadline; and at most this many times.
RETRY_MARGIN_S = 1.0
MAX_THROTTLED_RETRIES = 5

# Told "sent" when a request to the API server goes out and "answered" when the server's
# answer (any status) is in: the fan-out sets it for the task of one cluster, so that a
# deadline reached while waiting on something else is not reported as the cluster's silence.
request_events: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "request_events", default=None
)


def _tell(event: str) -> None:
    listener = request_events.get()
    if listener is not None:
        listener(event)


class KubeError(Exception):
    """A request to one cluster failed; ``kind`` says how (an :class:`ErrorKind`; its
    text value is taken too, and an unknown one is a ValueError).

    ``retry_after`` is the server's Retry-After, in seconds, on a throttled request.
    ``named``: on a 404, the object name the server's Status says it did not find (its
    ``details.name``). A 404 without one is about the path, not an object: a resource
    the server does not serve (any more) answers that way."""

    def __init__(
        self,
        kind: ErrorKind | str,
        detail: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        named: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.kind = ErrorKind(kind)
        self.detail = detail
        self.status = status
        self.retry_after = retry_after
        self.named = named


@dataclass
class ApiResponse:
    status: int
    body: dict[str, Any]
    server_time: datetime | None


# Line breaks of every kind (a carriage return too: on a terminal it starts the line over).
_LINE_BREAKS = re.compile(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")


# What a reader of an answer may run into besides ValueError: a number or a date no
# datetime holds (OverflowError), a document nested deeper than the parser's recursion
# limit (RecursionError), a field of an unexpected type. An answer is text from whoever
# sits between us and the API server: none of these may escape the one door.
_UNREADABLE = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError)
MAX_MESSAGE = 1000  # characters of a server's message kept in an error


def _status_message(raw: bytes) -> str:
    """The server's message, on one line: it is quoted inside the tool's own one-line
    details and paragraphs, where a line break would pass for a line of the tool's own
    (other control characters are escaped where text is printed)."""
    text = raw[:200].decode("utf-8", "replace").strip()
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and isinstance(doc.get("message"), str) and doc["message"]:
            text = doc["message"][:MAX_MESSAGE]
    except _UNREADABLE:
        pass
    return _LINE_BREAKS.sub(" ", text).strip()


def _http_date(value: str | None) -> datetime | None:
    """An HTTP date (``Date``, ``Retry-After``) as an aware UTC datetime, or None when it
    is absent or is no date (a zone of 20 digits, a year past 9999). A date without a
    zone (``-0000``) is taken as UTC, as HTTP dates are. Remembered for texts no longer
    than a date (every answer carries one, and a second's answers the same), so that
    what a server sends cannot make the cache large."""
    if not value:
        return None
    return _read_http_date(value) if len(value) <= 40 else _read_http_date.__wrapped__(value)


@lru_cache(maxsize=256)
def _read_http_date(value: str) -> datetime | None:
    try:
        when = parsedate_to_datetime(value)
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except _UNREADABLE:
        return None


def _retry_after(value: str | None, server_time: datetime | None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds, or an HTTP date (read
    against the response's own Date, so that clocks need not agree)."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        when = _http_date(text)
        if when is None or server_time is None or server_time.tzinfo is None:
            return None
        try:
            seconds = (when - server_time).total_seconds()
        except _UNREADABLE:
            return None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):  # NaN, negative, infinite
        return None
    return seconds


def _classify_status(status: int, raw: bytes, body: dict[str, Any], *, retry_after: float | None = None) -> KubeError:
    message = _status_message(raw)
    reason = body.get("reason") if isinstance(body, dict) else None
    if status == 429:
        when = f"; retry after {retry_after:g}s" if retry_after is not None else ""
        return KubeError(THROTTLED, f"throttled (HTTP 429: {message}{when})", status=status, retry_after=retry_after)
    if status in (401, 403):
        return KubeError(FORBIDDEN, f"HTTP {status}: {message}", status=status)
    if status == 404:
        details = body.get("details") if isinstance(body, dict) else None
        named = details.get("name") if isinstance(details, dict) else None
        return KubeError(NOT_FOUND, message, status=status, named=named if isinstance(named, str) else None)
    if status == 409:
        kind = ALREADY_EXISTS if reason == "AlreadyExists" else CONFLICT
        return KubeError(kind, message, status=status)
    if status in (502, 503, 504):
        return KubeError(UNREACHABLE, f"HTTP {status}: {message}", status=status)
    return KubeError(ERROR, f"HTTP {status}: {message}", status=status)


def _log() -> Any:
    from coordinator.logs import get_logger

    return get_logger(__name__)


class KubeClient:
    """A lazily opened client for one cluster, reused for every request of a process.

    It sends one request at a time: over the default transport they take turns on one
    keep-alive connection, as a second connection would cost a TCP and TLS handshake
    (two round trips and milliseconds of CPU) to save one round trip, and every cluster
    of a command would see two or three connections where one does. A long-running
    watch holds a connection of its own.

    ``transport`` carries the requests (:mod:`coordinator.kube.transport`); by default
    HTTPS with the kubeconfig's settings for ``endpoint``."""

    def __init__(self, endpoint: Endpoint, *, timeout: float = 5.0, transport: Transport | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.transport: Transport = AiohttpTransport(endpoint) if transport is None else transport
        self._opened = False
        self._lock = anyio.Lock()
        self._turn = anyio.Lock()  # one request at a time
        self.server: str = ""

    async def open(self) -> None:
        """Get the transport ready now (reads the kubeconfig); requests do this on first use."""
        async with self._lock:
            if not self._opened:
                try:
                    await self.transport.open()
                except UsageError as err:
                    raise KubeError(ERROR, err.message) from err
                self.server = self.transport.server
                self._opened = True

    async def close(self) -> None:
        self._opened = False
        await self.transport.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = None,
        content_type: str = "application/json",
    ) -> ApiResponse:
        """Send one request; return the decoded body, or raise a classified KubeError.

        A throttled request (429) is sent again after the server's Retry-After, as long as
        the retry still fits before the deadline: the enclosing cancel scope's (a command
        gives each cluster one), or else this request's own timeout. The server did
        nothing with a throttled request, so sending it again is safe; one that cannot
        be retried in time is raised as ``throttled``."""
        limit = self.timeout if timeout is None else timeout
        started = anyio.current_time()
        retries = 0
        while True:
            try:
                return await self._send(method, path, query, body, limit, content_type)
            except KubeError as err:
                if err.kind != THROTTLED:
                    raise
                wait = self._throttled_wait(err, started, limit, retries)
                if wait is None:
                    raise
            retries += 1
            _log().info("throttled; retrying after the server's Retry-After", server=self.server, wait_s=wait)
            await anyio.sleep(wait)

    def _throttled_wait(self, err: KubeError, started: float, limit: float, retries: int) -> float | None:
        """How long to wait before sending a throttled request again; None (with the
        reason added to ``err.detail``) when it is not sent again."""
        if err.retry_after is None:
            return None
        if retries >= MAX_THROTTLED_RETRIES:
            err.detail += f"; still throttled after {retries} retries"
            return None
        wait = max(err.retry_after, 0.05)
        deadline = anyio.current_effective_deadline()
        if deadline == float("inf"):
            deadline = started + limit
        left = deadline - anyio.current_time()
        if wait + min(RETRY_MARGIN_S, limit / 4) > left:
            err.detail += f"; not retried: {max(left, 0):.1f}s were left before the deadline"
            return None
        return wait

    async def _send(
        self, method: str, path: str, query: dict[str, Any] | None, body: Any, limit: float, content_type: str
    ) -> ApiResponse:
        await self.open()
        headers = {"Accept": "application/json", "Content-Type": content_type, "User-Agent": USER_AGENT}
        request = Request(method, path, _encoded_query(query), headers, _encoded_body(body))
        async with self._turn:
            return await self._send_now(request, limit)

    async def _send_now(self, request: Request, limit: float) -> ApiResponse:
        _tell("sent")
        try:
            # The transport's own timeout ends the request; this deadline is the backstop
            # for a server that accepted the connection and then stopped answering
            # mid-stream. It is anyio.fail_after(limit + 0.5) written out: the same scope
            # and the same TimeoutError, without two generator context managers per request.
            backstop = anyio.CancelScope(deadline=anyio.current_time() + limit + 0.5)
            with backstop:
                async with self.transport.send(request, timeout=limit) as reply:
                    _tell("answered")
                    raw = await reply.read()
                    status = reply.status
                    date = reply.header("Date")
                    retry_after = reply.header("Retry-After")
            if backstop.cancelled_caught and anyio.current_time() >= backstop.deadline:
                raise TimeoutError
        except TimeoutError as err:
            raise KubeError(UNREACHABLE, f"no answer within {limit:g}s") from err
        except TransportError as err:
            raise KubeError(UNREACHABLE if err.unreachable else ERROR, err.detail) from err
        ok = 200 <= status <= 299
        try:
            doc: Any = json.loads(raw) if raw else {}
        except _UNREADABLE as err:
            if ok:
                # A success we cannot read is no answer: never an empty object, which
                # would read as a missing lease or an empty replica.
                why = "nested too deeply" if isinstance(err, RecursionError) else "not JSON"
                detail = f"{self.server} answered HTTP {status} with a body that cannot be read ({why})"
                raise KubeError(ERROR, detail, status=status) from None
            doc = {}
        if not isinstance(doc, dict):
            doc = {"items": doc}
        server_time = _http_date(date)
        if not ok:
            raise _classify_status(status, raw, doc, retry_after=_retry_after(retry_after, server_time))
        return ApiResponse(status=status, body=doc, server_time=server_time)

    async def watch(
        self, path: str, *, query: dict[str, Any], timeout: float, grace: float = 2.0
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Yield watch events (``{"type", "object"}``) for up to ``timeout`` seconds; the
        connection is given up ``grace`` seconds after the server should have ended it."""
        await self.open()
        params = dict(query)
        params.update({"watch": "true", "timeoutSeconds": max(1, int(timeout))})
        request = Request("GET", path, _encoded_query(params), {"Accept": "application/json", "User-Agent": USER_AGENT})
        try:
            async with self.transport.watch(request, timeout=timeout + grace, connect_timeout=self.timeout) as reply:
                if reply.status != 200:
                    raw = await reply.read()
                    raise _classify_status(
                        reply.status, raw, {}, retry_after=_retry_after(reply.header("Retry-After"), None)
                    )
                while True:
                    line = await reply.readline()
                    if not line:
                        return
                    try:
                        event = json.loads(line)
                    except _UNREADABLE:
                        continue
                    if isinstance(event, dict):
                        yield event
        except TransportError as err:
            raise KubeError(UNREACHABLE if err.unreachable else ERROR, err.detail) from err


def _encoded_query(query: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple((k, _query_value(v)) for k, v in (query or {}).items())


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _encoded_body(body: Any) -> bytes | None:
    """The body as sent: bytes as given, text in UTF-8, anything else as JSON."""
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()
