"""One Kubernetes API server, reached through a kubeconfig and a context.

This module (with its siblings in ``coordinator.kube``) is the only door to the API
server: it builds the client, applies the per-request timeout, and turns every failure
into a :class:`KubeError` of one classified kind. Nothing here logs credentials; error
texts carry URLs and status messages only.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import json
import logging
import os
import re
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from coordinator.errors import UsageError

# The client library logs some failures itself (an exec credential plugin that cannot
# run, for one) through the root handler; they reach the user once, in our own words.
logging.getLogger("kubernetes_asyncio").addHandler(logging.NullHandler())

# Kinds of failure, finer than Outcome: "not-found" and "already-exists" are answers
# that the lock and state engines decide on, never reported to users as such.
UNREACHABLE = "unreachable"
FORBIDDEN = "forbidden"
NOT_FOUND = "not-found"
CONFLICT = "conflict"
ALREADY_EXISTS = "already-exists"
# 429: API Priority and Fairness (or an admission webhook, or a proxy) refused the request
# before doing anything; it may say when to come back (Retry-After).
THROTTLED = "throttled"
ERROR = "error"

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
    """A request to one cluster failed; ``kind`` is one of the constants above.

    ``retry_after`` is the server's Retry-After, in seconds, on a throttled request."""

    def __init__(self, kind: str, detail: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status
        self.retry_after = retry_after


@dataclass(frozen=True)
class Endpoint:
    """How to reach one cluster: a context in a kubeconfig (``None`` = kubectl's default)."""

    name: str
    context: str
    kubeconfig: str | None = None

    def kubeconfig_paths(self) -> str:
        if self.kubeconfig:
            return self.kubeconfig
        return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


@dataclass
class ApiResponse:
    status: int
    body: dict[str, Any]
    server_time: datetime | None


def preload() -> None:
    """Import the Kubernetes client library now (it takes seconds on a slow machine).

    Call it before any per-cluster deadline starts: otherwise the first cluster's
    deadline pays for the import and a healthy cluster is reported unreachable.
    """
    import kubernetes_asyncio.client
    import kubernetes_asyncio.config.kube_config  # noqa: F401


# Parsed and merged kubeconfig files, keyed by the files' identity: every cluster of a
# command usually comes from the same kubeconfig, and parsing it costs tens of
# milliseconds (pure-Python YAML) per cluster otherwise. A changed or replaced file is
# parsed again.
_merged_cache: dict[tuple[tuple[str, int, int, int], ...], Any] = {}


def _kubeconfig_key(existing: list[str]) -> tuple[tuple[str, int, int, int], ...]:
    return tuple((p, st.st_ino, st.st_mtime_ns, st.st_size) for p in existing for st in [Path(p).expanduser().stat()])


def _merged_kubeconfig(existing: list[str], key: tuple[tuple[str, int, int, int], ...], docs: list[Any]) -> Any:
    """``KubeConfigMerger(paths).config`` for these files, parsed once per process. The
    result is shared: callers copy what they hand to a loader (see ``_context_config``).
    ``docs`` are the files' documents when they are not cached yet."""
    from kubernetes_asyncio.config.kube_config import KubeConfigMerger

    found = _merged_cache.get(key)
    if found is None:
        if all(isinstance(doc, dict) for doc in docs):
            with contextlib.suppress(Exception):  # the library's own merge says what is wrong
                found = _merge_documents(existing, docs)
        if found is None:
            found = KubeConfigMerger(os.pathsep.join(existing)).config
        if len(_merged_cache) >= 32:  # kubeconfigs rewritten over and over: keep it small
            _merged_cache.clear()
        _merged_cache[key] = found
    return found


def _context_config(merged: Any, context: str) -> Any:
    """A copy, for one loader, of what ``context`` uses in the merged kubeconfig: the
    context entry, the cluster and user entries it names, the top-level scalars.

    The loader may change what it is given (refreshed tokens of auth providers), so the
    shared merge is never handed out; copying only these entries instead of the whole
    merge keeps the cost per cluster flat in the size of the kubeconfig. The loader finds
    the same entries, under the same node names and file paths (relative certificate
    paths resolve alike), and says the same things about them. Anything irregular gets a
    copy of the whole merge, so that the loader's own error is unchanged."""
    from kubernetes_asyncio.config.kube_config import ConfigNode

    try:
        root = merged.value
        lists = {item: root[item] for item in ("clusters", "contexts", "users")}
        if not all(isinstance(v, list) for v in lists.values()):
            raise TypeError("not lists")

        def named(item: str, name: Any) -> list[Any]:
            found = []
            for entry in lists[item]:
                value = entry.value if isinstance(entry, ConfigNode) else entry
                if not isinstance(value, dict) or "name" not in value:
                    raise TypeError("entry without a name")
                if value["name"] == name:
                    found.append(entry)
            return found

        ctx = named("contexts", context)
        if len(ctx) != 1:
            raise LookupError(context)
        entry = ctx[0].value if isinstance(ctx[0], ConfigNode) else ctx[0]
        body = entry.get("context")
        if not isinstance(body, dict):
            raise TypeError("context without a body")
        subset = {k: v for k, v in root.items() if k not in lists}
        subset["contexts"] = ctx
        subset["clusters"] = named("clusters", body["cluster"]) if "cluster" in body else []
        subset["users"] = named("users", body["user"]) if body.get("user") else []
        return copy.deepcopy(ConfigNode(merged.name, subset, merged.path))
    except Exception:
        return copy.deepcopy(merged)


def _merge_documents(existing: list[str], docs: list[dict[str, Any]]) -> Any:
    """What ``KubeConfigMerger(paths).config`` gives, from documents already parsed: the
    same rules (the first file naming a cluster, context or user wins; the last
    current-context wins) and the same ``ConfigNode`` objects."""
    from kubernetes_asyncio.config.kube_config import ConfigNode

    merged: Any = None
    for raw_path, config in zip(existing, docs, strict=True):
        path = os.path.expanduser(raw_path)
        if merged is None:
            base = copy.deepcopy(config)
            for item in ("clusters", "contexts", "users"):
                base[item] = []
            merged = ConfigNode(path, base, path)
        for item in ("clusters", "contexts", "users"):
            for new_item in config.get(item, []) or []:
                if not any(exists["name"] == new_item["name"] for exists in merged.value[item]):
                    merged.value[item].append(ConfigNode(f"{path}/{new_item}", new_item, path))
        if "current-context" in config:
            merged.value["current-context"] = config["current-context"]
    return merged


async def load_client_configuration(endpoint: Endpoint) -> Any:
    """Build a kubernetes_asyncio ``Configuration``; bad kubeconfigs become UsageError."""
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.config_exception import ConfigException
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader

    paths = endpoint.kubeconfig_paths()
    existing = [p for p in paths.split(os.pathsep) if p and Path(p).expanduser().is_file()]
    if not existing:
        raise UsageError(
            f"No kubeconfig file found at {paths}. Pass --kubeconfig PATH or set KUBECONFIG to a file that exists."
        )
    key = _kubeconfig_key(existing)
    docs: list[Any] = []
    if key not in _merged_cache:  # files already parsed and merged passed these checks
        docs = [_check_kubeconfig_file(Path(path).expanduser()) for path in existing]
    try:
        merged = _merged_kubeconfig(existing, key, docs)
        contexts = [c["name"] for c in (merged.value.get("contexts") or [])] if merged else []
        given = _context_config(merged, endpoint.context) if endpoint.context in contexts else None
    except Exception as err:
        raise UsageError(
            f"The kubeconfig {paths} cannot be read: {type(err).__name__}: {err}. "
            "Check that it is a valid kubeconfig YAML file."
        ) from err
    if endpoint.context not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise UsageError(
            f"The kubeconfig {paths} has no context named {endpoint.context!r} "
            f"(contexts found: {known}). Pass one of those with --context."
        )
    cfg = Configuration()
    try:
        loader = KubeConfigLoader(config_dict=given, active_context=endpoint.context, config_base_path=None)
        await loader.load_and_set(cfg)
    except (ConfigException, KeyError, TypeError, ValueError, AttributeError, OSError) as err:
        raise UsageError(
            f"The context {endpoint.context!r} in {paths} cannot be used: {err}. Check its cluster and user entries."
        ) from err
    _check_connection_settings(cfg, endpoint.context, paths)
    return cfg


def _check_connection_settings(cfg: Any, context: str, paths: str) -> None:
    """Reject now what the HTTP client would only trip over later (as an internal error,
    or as a misleading "unreachable"): a server that is not a URL, TLS material that is
    not PEM."""
    where = f"The context {context!r} in {paths} cannot be used"
    server = urlsplit(str(cfg.host or ""))
    try:
        port_ok = server.port is None or server.port > 0
    except ValueError:
        port_ok = False
    if server.scheme not in ("http", "https") or not server.hostname or not port_ok:
        raise UsageError(
            f"{where}: its server {cfg.host!r} is not an http(s) URL with a host name. Check the "
            "server entry of its cluster."
        )
    try:
        tls_context(cfg)  # the one the client will use: built (and so checked) once
    except (ssl.SSLError, OSError, ValueError) as err:
        raise UsageError(
            f"{where}: its certificate authority, client certificate or client key is not valid PEM "
            f"({err}). Check certificate-authority(-data) of its cluster and client-certificate(-data) "
            "and client-key(-data) of its user."
        ) from err


# TLS contexts by the settings they are built from. Building one loads the CA bundle and
# the client key (milliseconds each); the clusters of a command, and the commands of a
# long-lived process, mostly share one CA and one client certificate. A context is
# never changed after it is built, so clients may share it; what differs per cluster
# but is not in the context (server address, tls-server-name, proxy) goes with each
# connection, and hostname checks are made against that connection's server name.
_TlsKey = tuple[Any, ...]
_tls_cache: dict[_TlsKey, ssl.SSLContext] = {}


def _tls_key(cfg: Any) -> _TlsKey | None:
    """Everything a context is built from; files by path and identity, so that a
    replaced or rewritten file is read again. ``None`` if a file cannot be examined (then
    building the context says why)."""

    def identity(path: str | None) -> tuple[str, int, int, int, int] | None:
        if not path:
            return None
        st = os.stat(path)
        return (str(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    try:
        return (
            identity(cfg.ssl_ca_cert),
            # without a CA of its own, the context trusts the system's: where they are
            None if cfg.ssl_ca_cert else (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")),
            identity(cfg.cert_file),
            identity(cfg.key_file) if cfg.cert_file else None,
            bool(cfg.verify_ssl),
            bool(cfg.disable_strict_ssl_verification),
        )
    except (OSError, TypeError, ValueError):
        return None


def _build_tls_context(cfg: Any) -> ssl.SSLContext:
    """The context kubernetes_asyncio's REST client builds for ``cfg``, step by step."""
    context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
    if not cfg.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cfg.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


def tls_context(cfg: Any) -> ssl.SSLContext:
    """The TLS context for a client ``Configuration``, one per process and settings."""
    key = _tls_key(cfg)
    found = _tls_cache.get(key) if key is not None else None
    if found is None:
        found = _build_tls_context(cfg)
        if key is not None:
            if len(_tls_cache) >= 32:  # certificates rotated over and over: keep it small
                _tls_cache.clear()
            _tls_cache[key] = found
    return found


def environment_has_proxy_or_netrc() -> bool:
    """Would aiohttp's ``trust_env`` find anything to use here?

    The library's client trusts the environment: for every request aiohttp then looks up
    a netrc entry and a proxy, each in a worker thread (two thread hops per request, a
    few milliseconds of CPU each on a busy machine). When there is no proxy variable
    that aiohttp honours and no netrc file, both lookups find nothing, so turning them
    off changes nothing but the cost. With either present, the environment is trusted
    exactly as before."""
    import urllib.request

    if any(scheme in ("http", "https", "ws", "wss") for scheme in urllib.request.getproxies()):
        return True
    netrc = os.environ.get("NETRC")
    if netrc is not None:
        return True
    try:
        return (Path.home() / ".netrc").exists()
    except (RuntimeError, OSError):
        return True


@functools.cache
def _api_client_class() -> Any:
    """``ApiClient`` whose REST client takes a prebuilt TLS context.

    The library's ``RESTClientObject`` builds a new context in its constructor, from the
    files, for every client. These two constructors do what the library's do, with the
    shared context instead (tests/test_kube_client.py holds them to the library's)."""
    import aiohttp
    from kubernetes_asyncio.client import ApiClient, rest

    class SharedTlsRestClient(rest.RESTClientObject):
        def __init__(self, configuration: Any, ssl_context: ssl.SSLContext) -> None:
            self.server_hostname = configuration.tls_server_name
            self.proxy = configuration.proxy
            self.proxy_headers = configuration.proxy_headers
            self.pool_manager = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=configuration.connection_pool_maxsize, ssl=ssl_context),
                trust_env=environment_has_proxy_or_netrc(),
                read_bufsize=2**21,
            )

    class SharedTlsApiClient(ApiClient):
        def __init__(self, configuration: Any, ssl_context: ssl.SSLContext) -> None:
            self.configuration = configuration
            self.pool_threads = 1
            self.rest_client = SharedTlsRestClient(configuration, ssl_context)
            self.default_headers = {}
            self.cookie = None  # type: ignore[assignment]
            self.user_agent = _LIBRARY_USER_AGENT
            self.client_side_validation = configuration.client_side_validation

    return SharedTlsApiClient


# What kubernetes_asyncio's ApiClient sends as User-Agent (checked by the tests).
_LIBRARY_USER_AGENT = "OpenAPI-Generator/33.3.0+snapshot/python"


def new_api_client(cfg: Any) -> Any:
    """A kubernetes_asyncio ``ApiClient`` for ``cfg``, on the process's shared TLS context.
    Call it in a running event loop (it opens an aiohttp session)."""
    return _api_client_class()(cfg, tls_context(cfg))


def _check_kubeconfig_file(path: Path) -> Any:
    """The document in a kubeconfig file; say in words what is wrong with one that is not a
    YAML mapping (the client library would fail on it with a bare TypeError or a
    multi-line trace)."""
    import yaml

    hint = "Check that it is a valid kubeconfig YAML file, or leave it out of --kubeconfig/KUBECONFIG."
    try:
        doc = _load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"The kubeconfig {path} cannot be read: {err}. {hint}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UsageError(
            f"The kubeconfig {path} is not valid YAML{where}: {getattr(err, 'problem', None) or err}. {hint}"
        ) from err
    if doc is not None and not isinstance(doc, dict):
        raise UsageError(
            f"The kubeconfig {path} holds a {type(doc).__name__} at the top level, not a kubeconfig "
            f"mapping (apiVersion, clusters, contexts, users). {hint}"
        )
    return doc


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load``, with libyaml's parser when PyYAML has it (ten times faster on a
    kubeconfig); a document it rejects is parsed again by the pure-Python parser, so that
    errors read exactly as they always did."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        with contextlib.suppress(Exception):
            return yaml.load(text, Loader=fast)  # the C twin of SafeLoader: same constructor
    return yaml.safe_load(text)


# Line breaks of every kind (a carriage return too: on a terminal it starts the line over).
_LINE_BREAKS = re.compile(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")


def _status_message(raw: bytes) -> str:
    """The server's message, on one line: it is quoted inside the tool's own one-line
    details and paragraphs, where a line break would pass for a line of the tool's own
    (other control characters are escaped where text is printed)."""
    text = raw[:200].decode("utf-8", "replace").strip()
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and doc.get("message"):
            text = str(doc["message"])
    except ValueError:
        pass
    return _LINE_BREAKS.sub(" ", text).strip()


def _retry_after(value: str | None, server_time: datetime | None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds, or an HTTP date (read
    against the response's own Date, so that clocks need not agree)."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if server_time is None or when.tzinfo is None or server_time.tzinfo is None:
            return None
        seconds = (when - server_time).total_seconds()
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
        return KubeError(NOT_FOUND, message, status=status)
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
    """A lazily opened client for one cluster, reused for every request of a process."""

    def __init__(self, endpoint: Endpoint, *, timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._api: Any = None
        self._lock = anyio.Lock()
        self.server: str = ""

    async def _client(self) -> Any:
        async with self._lock:
            if self._api is None:
                try:
                    cfg = await load_client_configuration(self.endpoint)
                except UsageError as err:
                    raise KubeError(ERROR, err.message) from err
                self.server = str(cfg.host)
                self._api = new_api_client(cfg)
            return self._api

    async def open(self) -> None:
        """Build the client now (reads the kubeconfig); requests do this on first use."""
        await self._client()

    async def close(self) -> None:
        if self._api is not None:
            api, self._api = self._api, None
            await api.close()

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
        import aiohttp

        api = await self._client()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _tell("sent")
        try:
            # aiohttp's own timeout ends the request; fail_after is the backstop for a
            # server that accepted the connection and then stopped answering mid-stream.
            with anyio.fail_after(limit + 0.5):
                resp = await api.call_api(
                    path,
                    method,
                    query_params=list((query or {}).items()),
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _request_timeout=limit,
                )
                _tell("answered")
                try:
                    raw = await resp.read()
                    status = resp.status
                    date = resp.headers.get("Date")
                    retry_after = resp.headers.get("Retry-After")
                finally:
                    resp.release()
        except TimeoutError as err:
            raise KubeError(UNREACHABLE, f"no answer within {limit:g}s") from err
        except aiohttp.ClientConnectorCertificateError as err:
            raise KubeError(ERROR, f"TLS certificate rejected: {err.certificate_error}") from err
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as err:
            raise KubeError(UNREACHABLE, f"cannot connect to {self.server}: {err}") from err
        except aiohttp.ClientError as err:
            raise KubeError(UNREACHABLE, f"connection to {self.server} failed: {err}") from err
        except ssl.SSLError as err:
            raise KubeError(ERROR, f"TLS error talking to {self.server}: {err}") from err
        except KubeError:
            raise
        except OSError as err:
            raise KubeError(UNREACHABLE, f"cannot reach {self.server}: {err}") from err
        try:
            doc: Any = json.loads(raw) if raw else {}
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {"items": doc}
        server_time = None
        if date:
            try:
                server_time = parsedate_to_datetime(date)
            except (TypeError, ValueError):
                server_time = None
        if not 200 <= status <= 299:
            raise _classify_status(status, raw, doc, retry_after=_retry_after(retry_after, server_time))
        return ApiResponse(status=status, body=doc, server_time=server_time)

    async def watch(self, path: str, *, query: dict[str, Any], timeout: float) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events (``{"type", "object"}``) for up to ``timeout`` seconds."""
        import aiohttp

        api = await self._client()
        params = dict(query)
        params.update({"watch": "true", "timeoutSeconds": max(1, int(timeout))})
        try:
            resp = await api.call_api(
                path,
                "GET",
                query_params=list(params.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=timeout + 2, sock_connect=self.timeout),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise KubeError(UNREACHABLE, f"watch on {self.server} failed: {err}") from err
        try:
            if resp.status != 200:
                raw = await resp.read()
                raise _classify_status(
                    resp.status, raw, {}, retry_after=_retry_after(resp.headers.get("Retry-After"), None)
                )
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, OSError, TimeoutError) as err:
                    raise KubeError(UNREACHABLE, f"watch on {self.server} broke: {err}") from err
                if not line:
                    return
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield event
        finally:
            resp.release()
