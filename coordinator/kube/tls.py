"""TLS contexts for API server connections, one per distinct setting per process, and
whether aiohttp should look at the environment (proxies, netrc) at all.

Certificates and keys a kubeconfig embeds (``certificate-authority-data``,
``client-certificate-data``, ``client-key-data``) or an exec plugin gives are held in
memory (:class:`TlsMaterial`), never in a file that outlives the building of a context:
the client library would write them to files in the temporary directory that it removes
only at interpreter exit, so every command killed by SIGKILL (a cancelled CI job, the OOM
killer) left the user's private key behind."""

from __future__ import annotations

import contextlib
import hashlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True, repr=False)
class TlsMaterial:
    """PEM bytes held in memory in place of a ``Configuration``'s ``ssl_ca_cert``,
    ``cert_file`` and ``key_file`` paths (``None``: the path, if any, is used). Its repr
    says nothing of the bytes: a private key must not reach a log."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    def __repr__(self) -> str:
        held = [name for name in ("ca", "cert", "key") if getattr(self, name) is not None]
        return f"TlsMaterial(in memory: {', '.join(held) or 'nothing'})"


# The attribute of a kubernetes_asyncio ``Configuration`` that carries its TlsMaterial
# (``kubeconfig.load_client_configuration`` sets it; a Configuration without it uses its
# paths only, as the library does).
MATERIAL_ATTRIBUTE = "coordinator_tls_material"
_NO_MATERIAL = TlsMaterial()


def tls_material(cfg: Any) -> TlsMaterial:
    found = getattr(cfg, MATERIAL_ATTRIBUTE, None)
    return found if isinstance(found, TlsMaterial) else _NO_MATERIAL


def _memory_file(data: bytes) -> int | None:
    """A descriptor of an anonymous in-memory file (Linux's memfd) holding ``data`` and
    readable by path through /proc/self/fd; ``None`` where there is none to be had."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd: int = create("coordinator-tls", getattr(os, "MFD_CLOEXEC", 0))
    except OSError:  # a seccomp filter, an old kernel
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if os.path.exists(f"/proc/self/fd/{fd}"):  # no /proc in this mount namespace: no path to it
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


@contextlib.contextmanager
def transient_pem_path(data: bytes) -> Iterator[str]:
    """A path OpenSSL can read ``data`` from, valid inside the block only.

    Python's ssl module reads a client certificate and key from a path only
    (``load_cert_chain``). On Linux the path is an anonymous memory file's (memfd, opened
    through /proc/self/fd): it has no name in any directory, so there is nothing to leave
    behind, whatever kills the process and when. Elsewhere it is a file (0600) of its own
    in a fresh private directory (0700) under the temporary directory, removed in
    ``finally`` as soon as the block ends: only a kill within those microseconds could
    leave it."""
    fd = _memory_file(data)
    if fd is not None:
        try:
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="coordinator-tls-")
    path = os.path.join(directory, "material.pem")
    try:
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.rmdir(directory)


@contextlib.contextmanager
def _readable(data: bytes | None, path: str | None) -> Iterator[str | None]:
    """``path``, or a transient path to ``data`` when it is held in memory."""
    if data is None:
        yield path
    else:
        with transient_pem_path(data) as transient:
            yield transient


def _tls_key(cfg: Any) -> _TlsKey | None:
    """Everything a context is built from; files by path and identity, so that a
    replaced or rewritten file is read again. ``None`` if a file cannot be examined (then
    building the context says why)."""

    def identity(path: str | None) -> tuple[str, int, int, int, int] | None:
        if not path:
            return None
        st = os.stat(path)
        return (str(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def source(data: bytes | None, path: str | None) -> Any:
        # material held in memory by its digest: the key itself is never a cache key
        return ("in memory", hashlib.sha256(data).digest()) if data is not None else identity(path)

    material = tls_material(cfg)
    has_ca = material.ca is not None or bool(cfg.ssl_ca_cert)
    has_cert = material.cert is not None or bool(cfg.cert_file)
    try:
        return (
            source(material.ca, cfg.ssl_ca_cert),
            # without a CA of its own, the context trusts the system's: where they are
            None if has_ca else (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")),
            source(material.cert, cfg.cert_file),
            source(material.key, cfg.key_file) if has_cert else None,
            bool(cfg.verify_ssl),
            bool(cfg.disable_strict_ssl_verification),
        )
    except (OSError, TypeError, ValueError):
        return None


def _build_tls_context(cfg: Any) -> ssl.SSLContext:
    """The context kubernetes_asyncio's REST client builds for ``cfg``, step by step; the
    material held in memory is read from transient paths that are gone once it is loaded
    (OpenSSL keeps what it read, so rebuilding a context later reads the memory again).

    The CA is read through a path too, not ``cadata``: OpenSSL then parses it exactly as
    the file the library wrote (``cadata`` refuses, with a TypeError, a bundle whose
    comments are not ASCII, which a file may carry)."""
    material = tls_material(cfg)
    with _readable(material.ca, cfg.ssl_ca_cert) as cafile:
        context = ssl.create_default_context(cafile=cafile)
    if material.cert is not None or cfg.cert_file:
        with (
            _readable(material.cert, cfg.cert_file) as certfile,
            _readable(material.key, cfg.key_file) as keyfile,
        ):
            assert certfile is not None  # a certificate in memory or a file: see the test above
            context.load_cert_chain(certfile, keyfile=keyfile)
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
