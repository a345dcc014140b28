"""The toxiproxy controller really injects the faults it names, and cleans up.

Needs the toxiproxy-server binary (scripts/build-toxiproxy.sh); the integration
tests are skipped without it. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import re
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults import toxiproxy as toxiproxy_module
from faults.toxiproxy import (
    TOXIPROXY_VERSION,
    Proxy,
    ToxiproxyError,
    ToxiproxyNotFoundError,
    ToxiproxyServer,
    find_toxiproxy_binary,
)

REPO = Path(__file__).resolve().parents[3]


def _binary_or_none() -> Path | None:
    try:
        return find_toxiproxy_binary()
    except ToxiproxyNotFoundError:
        return None


needs_toxiproxy = pytest.mark.skipif(
    _binary_or_none() is None,
    reason="toxiproxy-server is not built: run scripts/build-toxiproxy.sh",
)


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass  # the proxy reset or cut the connection: that is the point


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield str(host), int(port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def toxiproxy() -> Iterator[ToxiproxyServer]:
    server = ToxiproxyServer.start()
    try:
        yield server
    finally:
        server.stop()
    _assert_gone(server.pid)


@pytest.fixture
def proxy(toxiproxy: ToxiproxyServer, echo: tuple[str, int]) -> Proxy:
    return toxiproxy.create_proxy("echo", upstream=echo)


def _assert_gone(pid: int) -> None:
    # Reaped, not a zombie: the pid no longer exists at all (or was reused by an
    # unrelated process, which would not be our toxiproxy-server).
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return
    assert b"toxiproxy-server" not in cmdline, f"toxiproxy-server {pid} is still there"


def _connect(proxy: Proxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=timeout)


def _round_trip(sock: socket.socket, payload: bytes = b"ping") -> bytes:
    sock.sendall(payload)
    received = b""
    while len(received) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def _timed_round_trip(proxy: Proxy, payload: bytes = b"ping") -> tuple[bytes, float]:
    with _connect(proxy) as sock:
        start = time.monotonic()
        answer = _round_trip(sock, payload)
        return answer, time.monotonic() - start


# ------------------------------------------------------------------ no binary needed


def test_pinned_version_matches_the_wrapper_module() -> None:
    go_mod = (REPO / "scripts/controlplane/toxiproxy/go.mod").read_text()
    match = re.search(r"^\s*github\.com/Shopify/toxiproxy/v2 (v\S+)", go_mod, re.MULTILINE)
    assert match is not None
    assert match.group(1) == TOXIPROXY_VERSION


def test_missing_binary_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("COORDINATOR_TOXIPROXY", raising=False)
    monkeypatch.setenv("COORDINATOR_CACHE", str(tmp_path))
    with pytest.raises(ToxiproxyNotFoundError, match=re.escape("run scripts/build-toxiproxy.sh")):
        ToxiproxyServer.start()


def test_bad_binary_override_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COORDINATOR_TOXIPROXY", str(tmp_path / "nope"))
    with pytest.raises(ToxiproxyNotFoundError, match="COORDINATOR_TOXIPROXY points at"):
        ToxiproxyServer.start()


BUILD_SCRIPT = REPO / "scripts" / "build-toxiproxy.sh"


def test_build_script_returns_at_once_when_the_binary_is_cached(tmp_path: Path) -> None:
    cached = tmp_path / "bin" / f"toxiproxy-{TOXIPROXY_VERSION}" / "toxiproxy-server"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    cached.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COORDINATOR_CACHE": str(tmp_path)}
    done = subprocess.run([str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(cached)
    assert "already built" in done.stderr


def test_build_script_fails_clearly_without_go(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "COORDINATOR_CACHE": str(tmp_path),
        "GO": str(tmp_path / "no-go-here"),
    }
    done = subprocess.run([str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert "the Go toolchain is missing" in done.stderr
    assert not (tmp_path / "bin" / f"toxiproxy-{TOXIPROXY_VERSION}" / "toxiproxy-server").exists()


# ---------------------------------------------------------------------- integration


@pytest.mark.integration
@needs_toxiproxy
def test_server_starts_answers_and_stops_without_leaving_a_process() -> None:
    with ToxiproxyServer.start() as server:
        assert server.running
        assert server.version() == TOXIPROXY_VERSION
        log = server.log_path
        assert log.exists()
    assert not server.running
    _assert_gone(server.pid)
    assert not log.exists()  # the temporary log went with it
    server.stop()  # twice is harmless


@pytest.mark.integration
@needs_toxiproxy
def test_start_survives_losing_the_port_race(monkeypatch: pytest.MonkeyPatch) -> None:
    real_free_port = toxiproxy_module.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        handed_out: list[int] = []

        def first_a_busy_port(host: str = "127.0.0.1") -> int:
            handed_out.append(busy if not handed_out else real_free_port(host))
            return handed_out[-1]

        monkeypatch.setattr(toxiproxy_module, "free_port", first_a_busy_port)
        with ToxiproxyServer.start() as server:
            assert handed_out[0] == busy
            assert server.port == handed_out[-1] != busy
            assert server.version() == TOXIPROXY_VERSION


@pytest.mark.integration
@needs_toxiproxy
def test_proxy_forwards_to_its_upstream(proxy: Proxy, echo: tuple[str, int]) -> None:
    assert proxy.host == "127.0.0.1"
    assert proxy.port not in (0, echo[1])
    assert proxy.upstream == f"{echo[0]}:{echo[1]}"
    answer, _ = _timed_round_trip(proxy)
    assert answer == b"ping"


@pytest.mark.integration
@needs_toxiproxy
def test_latency_delays_each_answer_by_at_least_the_configured_time(proxy: Proxy) -> None:
    _, baseline = _timed_round_trip(proxy)
    assert baseline < 0.2
    name = proxy.add_latency(300, jitter_ms=0)
    answer, elapsed = _timed_round_trip(proxy)
    assert answer == b"ping"
    assert elapsed >= 0.3
    proxy.remove_toxic(name)
    assert proxy.toxics() == []
    _, after = _timed_round_trip(proxy)
    assert after < 0.2


@pytest.mark.integration
@needs_toxiproxy
def test_timeout_toxic_is_a_black_hole_until_the_client_gives_up(proxy: Proxy) -> None:
    proxy.add_timeout(0)
    with _connect(proxy, timeout=1.0) as sock:  # the connection itself is accepted
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            _round_trip(sock)
        assert time.monotonic() - start >= 0.9
    proxy.clear_toxics()
    assert _timed_round_trip(proxy)[0] == b"ping"


@pytest.mark.integration
@needs_toxiproxy
def test_reset_peer_resets_the_connection(proxy: Proxy) -> None:
    proxy.add_reset_peer(0, stream="upstream")
    with _connect(proxy, timeout=5.0) as sock:
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            sock.sendall(b"ping")
            if not sock.recv(16):
                raise ConnectionResetError("closed")


@pytest.mark.integration
@needs_toxiproxy
def test_bandwidth_caps_throughput(proxy: Proxy) -> None:
    proxy.add_bandwidth(32)  # KB/s, so 48 KB take about 1.5 s
    payload = os.urandom(48 * 1024)
    answer, elapsed = _timed_round_trip(proxy, payload)
    assert answer == payload
    assert elapsed >= 1.0


@pytest.mark.integration
@needs_toxiproxy
def test_disable_cuts_the_link_and_enable_restores_it(proxy: Proxy) -> None:
    with _connect(proxy) as open_connection:
        assert _round_trip(open_connection) == b"ping"
        proxy.disable()
        assert proxy.enabled is False
        # The open connection is closed under us...
        try:
            cut = _round_trip(open_connection) != b"ping"
        except OSError:
            cut = True
        assert cut
    # ...and new ones are refused.
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy).close()

    proxy.enable()
    assert proxy.enabled is True
    answer, _ = _timed_round_trip(proxy)
    assert answer == b"ping"


@pytest.mark.integration
@needs_toxiproxy
def test_api_errors_are_reported_in_words(toxiproxy: ToxiproxyServer, proxy: Proxy) -> None:
    with pytest.raises(ToxiproxyError, match="HTTP 404: toxic not found"):
        proxy.remove_toxic("nope")
    with pytest.raises(ToxiproxyError, match="HTTP 409"):
        toxiproxy.create_proxy("echo", upstream=proxy.upstream)
    assert [p.name for p in toxiproxy.proxies()] == ["echo"]


@pytest.mark.integration
@needs_toxiproxy
def test_reset_removes_toxics_and_reenables(toxiproxy: ToxiproxyServer, proxy: Proxy) -> None:
    proxy.add_latency(1000)
    proxy.disable()
    toxiproxy.reset()
    assert toxiproxy.proxy("echo").enabled is True
    assert proxy.toxics() == []
    answer, elapsed = _timed_round_trip(proxy)
    assert answer == b"ping" and elapsed < 0.5
