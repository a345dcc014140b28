"""Drive a local toxiproxy server to inject network faults in tests.

toxiproxy is a TCP proxy whose behaviour is changed at run time over an HTTP API:
put a proxy between the tool and a control plane, then add *toxics* (latency, a
black hole, connection resets, a bandwidth cap) or disable the proxy to cut the
link. This module starts the server on a free loopback port, talks to its API
with the standard library only, and stops it again, leaving no process behind::

    with ToxiproxyServer.start() as toxiproxy:
        proxy = toxiproxy.create_proxy("apiserver-a", upstream=("127.0.0.1", 6443))
        proxy.add_latency(500, jitter_ms=50)
        ...                                   # talk to proxy.host:proxy.port
        proxy.disable()                       # cut the link
        proxy.enable()

The binary is ``$COORDINATOR_TOXIPROXY`` if set, else the one that
``scripts/build-toxiproxy.sh`` builds into the cache. The API is synchronous; each
call is a quick request to a loopback server.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, cast

__all__ = [
    "TOXIPROXY_VERSION",
    "Proxy",
    "Stream",
    "Toxic",
    "ToxiproxyError",
    "ToxiproxyNotFoundError",
    "ToxiproxyServer",
    "default_binary_path",
    "find_toxiproxy_binary",
    "free_port",
]

TOXIPROXY_VERSION = "v2.12.0"
"""The version pinned by scripts/controlplane/toxiproxy/go.mod."""

Stream = Literal["upstream", "downstream"]
"""Direction a toxic acts on: ``upstream`` is client -> server, ``downstream``
is server -> client (toxiproxy's default)."""

_LOOPBACK = "127.0.0.1"


class ToxiproxyError(RuntimeError):
    """The toxiproxy server could not be started or refused a request."""


class ToxiproxyNotFoundError(ToxiproxyError):
    """No toxiproxy-server binary where we looked."""


def default_binary_path() -> Path:
    """Where scripts/build-toxiproxy.sh puts the binary."""
    cache = os.environ.get("COORDINATOR_CACHE") or str(Path.home() / ".cache" / "coordinator")
    return Path(cache) / "bin" / f"toxiproxy-{TOXIPROXY_VERSION}" / "toxiproxy-server"


def find_toxiproxy_binary() -> Path:
    """The toxiproxy-server to run: ``$COORDINATOR_TOXIPROXY`` or the cached build."""
    configured = os.environ.get("COORDINATOR_TOXIPROXY")
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ToxiproxyNotFoundError(
                f"COORDINATOR_TOXIPROXY points at {path}, which is not an executable file; "
                "fix the variable or unset it to use the cached build"
            )
        return path
    path = default_binary_path()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ToxiproxyNotFoundError(
            f"toxiproxy-server {TOXIPROXY_VERSION} is not built (looked for {path}); "
            "run scripts/build-toxiproxy.sh, or set COORDINATOR_TOXIPROXY to a "
            "toxiproxy-server binary"
        )
    return path


def free_port(host: str = _LOOPBACK) -> int:
    """A TCP port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return cast(int, sock.getsockname()[1])


@dataclass(frozen=True)
class Toxic:
    """A toxic as the server reports it."""

    name: str
    type: str
    stream: Stream
    toxicity: float
    attributes: Mapping[str, Any]

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Toxic:
        return cls(
            name=str(data["name"]),
            type=str(data["type"]),
            stream=cast(Stream, data.get("stream", "downstream")),
            toxicity=float(data.get("toxicity", 1.0)),
            attributes=dict(data.get("attributes") or {}),
        )


class Proxy:
    """One proxy: listens on ``host:port`` and forwards to ``upstream``.

    Obtain it from :meth:`ToxiproxyServer.create_proxy`. Every ``add_*`` method
    returns the toxic's name, which :meth:`remove_toxic` takes.
    """

    def __init__(self, server: ToxiproxyServer, name: str, listen: str, upstream: str) -> None:
        self._server = server
        self.name = name
        self.upstream = upstream
        self._listen = listen

    def __repr__(self) -> str:
        return f"Proxy({self.name!r}, listen={self._listen!r}, upstream={self.upstream!r})"

    @property
    def listen(self) -> str:
        """``host:port`` the proxy accepts connections on."""
        return self._listen

    @property
    def host(self) -> str:
        return self._listen.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self._listen.rsplit(":", 1)[1])

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def _path(self, *parts: str) -> str:
        return "/".join(["/proxies", *(urllib.parse.quote(p, safe="") for p in (self.name, *parts))])

    # -- the link as a whole

    @property
    def enabled(self) -> bool:
        data = self._server.request("GET", self._path())
        return bool(data["enabled"])

    def disable(self) -> None:
        """Cut the link: close every open connection and refuse new ones."""
        self._update(enabled=False)

    def enable(self) -> None:
        """Accept connections again (on the same address)."""
        self._update(enabled=True)

    def _update(self, **fields: Any) -> None:
        data = self._server.request("PATCH", self._path(), fields)
        self._listen = str(data.get("listen", self._listen))

    def delete(self) -> None:
        self._server.request("DELETE", self._path())

    # -- toxics

    def add_toxic(
        self,
        type: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
    ) -> str:
        """Add any toxiproxy toxic; ``toxicity`` is the share of connections it hits."""
        toxic_name = name or f"{type}_{stream}"
        body = {
            "name": toxic_name,
            "type": type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": dict(attributes or {}),
        }
        data = self._server.request("POST", self._path("toxics"), body)
        return str(data["name"])

    def add_latency(
        self,
        ms: int,
        jitter_ms: int = 0,
        *,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
    ) -> str:
        """Delay data by ``ms`` ± ``jitter_ms`` milliseconds."""
        return self.add_toxic(
            "latency",
            {"latency": ms, "jitter": jitter_ms},
            stream=stream,
            toxicity=toxicity,
            name=name,
        )

    def add_timeout(
        self,
        timeout_ms: int = 0,
        *,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
    ) -> str:
        """Stop all data from getting through.

        With ``timeout_ms=0`` (the default) this is a black hole: connections are
        accepted but nothing ever comes back and they are never closed, until the
        toxic is removed (data sent meanwhile is dropped). Otherwise the
        connection is closed after ``timeout_ms``. On ``downstream`` the server
        still receives requests but its answers are lost (outcome unknown to the
        client); on ``upstream`` requests never reach the server.
        """
        return self.add_toxic("timeout", {"timeout": timeout_ms}, stream=stream, toxicity=toxicity, name=name)

    def add_reset_peer(
        self,
        timeout_ms: int = 0,
        *,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
    ) -> str:
        """Reset connections (TCP RST) at once, or after ``timeout_ms``."""
        return self.add_toxic("reset_peer", {"timeout": timeout_ms}, stream=stream, toxicity=toxicity, name=name)

    def add_bandwidth(
        self,
        rate_kb_per_s: int,
        *,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
    ) -> str:
        """Cap throughput at ``rate_kb_per_s`` kilobytes per second."""
        return self.add_toxic("bandwidth", {"rate": rate_kb_per_s}, stream=stream, toxicity=toxicity, name=name)

    def toxics(self) -> list[Toxic]:
        data = self._server.request("GET", self._path("toxics"))
        return [Toxic.from_api(t) for t in cast(list[Mapping[str, Any]], data)]

    def remove_toxic(self, name: str, *, patience: float = 120.0) -> None:
        """Remove a toxic, waiting for toxiproxy if it is slow to let go of it.

        Removing a toxic flushes what it holds to the receiving side; while that side
        reads nothing (a client stopped with SIGSTOP, its socket buffer full) the call
        blocks. The 60-minute soak once saw a DELETE of a latency toxic outlast the
        10-second call timeout that way. So a call that times out is followed by a
        look at the proxy's toxics, and repeated, until the toxic is gone or
        ``patience`` runs out."""
        deadline = time.monotonic() + patience
        timed_out = False
        while True:
            try:
                self._server.request("DELETE", self._path("toxics", name))
                return
            except ToxiproxyError as err:
                if timed_out and "HTTP 404" in str(err):
                    return  # the timed-out call removed it after all
                if "unreachable" not in str(err) or time.monotonic() > deadline:
                    raise
                timed_out = True
            with contextlib.suppress(ToxiproxyError):
                if all(t.name != name for t in self.toxics()):
                    return
            time.sleep(1.0)

    def clear_toxics(self) -> None:
        for toxic in self.toxics():
            self.remove_toxic(toxic.name)


class ToxiproxyServer:
    """A toxiproxy-server process we started and own.

    Use :meth:`start` (a context manager too); :meth:`stop` terminates the process
    and waits for it. An ``atexit`` hook kills it if the test process exits
    without stopping it.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        host: str,
        port: int,
        log_path: Path,
        owned_log_dir: Path | None,
    ) -> None:
        self._process = process
        self.host = host
        self.port = port
        self.log_path = log_path
        self._owned_log_dir = owned_log_dir
        atexit.register(self._kill_at_exit)

    @classmethod
    def start(
        cls,
        binary: str | os.PathLike[str] | None = None,
        *,
        host: str = _LOOPBACK,
        startup_timeout: float = 15.0,
        log_path: str | os.PathLike[str] | None = None,
        log_level: str = "info",
    ) -> ToxiproxyServer:
        """Start toxiproxy-server on a free port of ``host`` and wait until it answers.

        Its output goes to ``log_path`` (kept), or to a temporary file removed by
        :meth:`stop`. Raises ToxiproxyNotFoundError when there is no binary and
        ToxiproxyError when the server does not come up.
        """
        exe = Path(binary) if binary is not None else find_toxiproxy_binary()
        if not exe.is_file():
            raise ToxiproxyNotFoundError(f"toxiproxy-server binary {exe} does not exist")
        last_error = "no attempt made"
        # The free port can be taken between our probe and the server's bind; the
        # server then keeps running without its API, so we notice and try again.
        for _ in range(3):
            owned_dir: Path | None = None
            if log_path is None:
                owned_dir = Path(tempfile.mkdtemp(prefix="toxiproxy-"))
                path = owned_dir / "toxiproxy.log"
            else:
                path = Path(log_path)
            port = free_port(host)
            env = {**os.environ, "LOG_LEVEL": log_level}
            with path.open("ab") as log:
                process = subprocess.Popen(
                    [str(exe), "-host", host, "-port", str(port)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # a Ctrl-C in the terminal is ours to handle
                )
            server = cls(process, host, port, path, owned_dir)
            try:
                server._wait_ready(startup_timeout)
            except ToxiproxyError as exc:
                last_error = str(exc)
                server.stop()
                continue
            return server
        raise ToxiproxyError(f"toxiproxy-server did not start: {last_error}")

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise ToxiproxyError(f"it exited with status {code} at once; its log:\n{self.log_tail()}")
            if "Server finished with error" in self.log_text():
                raise ToxiproxyError(f"its API could not listen; its log:\n{self.log_tail()}")
            try:
                self.version(timeout=0.5)
            except ToxiproxyError:
                pass
            else:
                # Our own process must be the one answering: the bind error, if
                # any, is logged right after the failed listen.
                time.sleep(0.05)
                if "Server finished with error" not in self.log_text():
                    return
            if time.monotonic() > deadline:
                raise ToxiproxyError(
                    f"its API on {self.url} did not answer within {timeout:g}s; its log:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- lifecycle

    def stop(self, grace: float = 5.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``grace`` seconds) and
        reap it. Safe to call twice."""
        process = self._process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        atexit.unregister(self._kill_at_exit)
        if self._owned_log_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                self.log_path.unlink()
            with contextlib.suppress(OSError):
                self._owned_log_dir.rmdir()
            self._owned_log_dir = None

    def _kill_at_exit(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- API

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """One call to the HTTP API; returns the decoded JSON answer (or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            with contextlib.suppress(ValueError, AttributeError):
                detail = str(json.loads(detail)["error"])
            raise ToxiproxyError(f"toxiproxy refused {method} {path}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ToxiproxyError(f"toxiproxy at {self.url} is unreachable: {reason}") from exc
        if not raw:
            return None
        return json.loads(raw)

    def version(self, timeout: float = 5.0) -> str:
        """The server's version, e.g. ``v2.12.0``."""
        data = self.request("GET", "/version", timeout=timeout)
        if isinstance(data, Mapping):
            return str(data.get("version", ""))
        return str(data)

    def create_proxy(
        self,
        name: str,
        upstream: str | tuple[str, int],
        *,
        listen_port: int = 0,
        listen_host: str | None = None,
    ) -> Proxy:
        """Create a proxy to ``upstream`` (``"host:port"`` or ``(host, port)``).

        It listens on ``listen_host`` (the server's host by default) and
        ``listen_port``; 0 lets the kernel pick a free one, read it from
        :attr:`Proxy.port`.
        """
        if isinstance(upstream, tuple):
            upstream = f"{upstream[0]}:{upstream[1]}"
        listen = f"{listen_host or self.host}:{listen_port}"
        data = self.request(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )
        return Proxy(self, name, str(data["listen"]), str(data["upstream"]))

    def proxy(self, name: str) -> Proxy:
        """An existing proxy by name."""
        data = self.request("GET", f"/proxies/{urllib.parse.quote(name, safe='')}")
        return Proxy(self, name, str(data["listen"]), str(data["upstream"]))

    def proxies(self) -> list[Proxy]:
        data = cast(Mapping[str, Mapping[str, Any]], self.request("GET", "/proxies"))
        return [Proxy(self, name, str(p["listen"]), str(p["upstream"])) for name, p in data.items()]

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self.request("POST", "/reset")
