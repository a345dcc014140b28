"""One Kubernetes API server, reached through a kubeconfig and a context.

This module (with its siblings in ``coordinator.kube``) is the only door to the API
server: it builds the client, applies the per-request timeout, and turns every failure
into a :class:`KubeError` of one classified kind. Nothing here logs credentials; error
texts carry URLs and status messages only.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator
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
ERROR = "error"


class KubeError(Exception):
    """A request to one cluster failed; ``kind`` is one of the constants above."""

    def __init__(self, kind: str, detail: str, *, status: int | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status


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
# command usually comes from the same kubeconfig, and parsing it (pure-Python YAML) costs
# tens of milliseconds per cluster otherwise. A changed or replaced file is parsed again.
_merged_cache: dict[tuple[tuple[str, int, int, int], ...], Any] = {}


def _kubeconfig_key(existing: list[str]) -> tuple[tuple[str, int, int, int], ...]:
    return tuple(
        (p, st.st_ino, st.st_mtime_ns, st.st_size) for p in existing for st in [Path(p).expanduser().stat()]
    )


def _merged_kubeconfig(existing: list[str], key: tuple[tuple[str, int, int, int], ...]) -> Any:
    """``KubeConfigMerger(paths).config`` for these files, parsed once per process; each
    caller gets its own copy (the loader may change it, e.g. refreshed tokens)."""
    from kubernetes_asyncio.config.kube_config import KubeConfigMerger

    found = _merged_cache.get(key)
    if found is None:
        found = KubeConfigMerger(os.pathsep.join(existing)).config
        if len(_merged_cache) >= 32:  # kubeconfigs rewritten over and over: keep it small
            _merged_cache.clear()
        _merged_cache[key] = found
    return copy.deepcopy(found)


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
    if key not in _merged_cache:  # files already parsed and merged passed these checks
        for path in existing:
            _check_kubeconfig_file(Path(path).expanduser())
    try:
        merged = _merged_kubeconfig(existing, key)
        contexts = [c["name"] for c in (merged.value.get("contexts") or [])] if merged else []
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
        loader = KubeConfigLoader(config_dict=merged, active_context=endpoint.context, config_base_path=None)
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
        tls = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else None
        if cfg.cert_file:
            (tls or ssl.create_default_context()).load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
    except (ssl.SSLError, OSError, ValueError) as err:
        raise UsageError(
            f"{where}: its certificate authority, client certificate or client key is not valid PEM "
            f"({err}). Check certificate-authority(-data) of its cluster and client-certificate(-data) "
            "and client-key(-data) of its user."
        ) from err


def _check_kubeconfig_file(path: Path) -> None:
    """Say in words what is wrong with a kubeconfig file that is not a YAML mapping
    (the client library would fail on it with a bare TypeError or a multi-line trace)."""
    import yaml

    hint = "Check that it is a valid kubeconfig YAML file, or leave it out of --kubeconfig/KUBECONFIG."
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
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


def _status_message(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and doc.get("message"):
            return str(doc["message"])
    except ValueError:
        pass
    return raw[:200].decode("utf-8", "replace").strip()


def _classify_status(status: int, raw: bytes, body: dict[str, Any]) -> KubeError:
    message = _status_message(raw)
    reason = body.get("reason") if isinstance(body, dict) else None
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
                from kubernetes_asyncio.client import ApiClient

                try:
                    cfg = await load_client_configuration(self.endpoint)
                except UsageError as err:
                    raise KubeError(ERROR, err.message) from err
                self.server = str(cfg.host)
                self._api = ApiClient(configuration=cfg)
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
        """Send one request; return the decoded body, or raise a classified KubeError."""
        import aiohttp

        api = await self._client()
        limit = self.timeout if timeout is None else timeout
        headers = {"Accept": "application/json", "Content-Type": content_type}
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
                try:
                    raw = await resp.read()
                    status = resp.status
                    date = resp.headers.get("Date")
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
        if not 200 <= status <= 299:
            raise _classify_status(status, raw, doc)
        server_time = None
        if date:
            try:
                server_time = parsedate_to_datetime(date)
            except (TypeError, ValueError):
                server_time = None
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
                raise _classify_status(resp.status, raw, {})
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
