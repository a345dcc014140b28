"""TLS contexts for API server connections, one per distinct setting per process, and
whether aiohttp should look at the environment (proxies, netrc) at all."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

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
