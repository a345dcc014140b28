"""Run ``python -m coordinator`` for the tests without paying its imports each time.

A fresh command spends about a second of CPU importing kubernetes-asyncio, anyio, click
and pydantic before it does anything; the suite starts thousands of them on two cores,
so most of its CPU went to imports. This module is both ends of a small preloader (the
way Android's zygote or Rails' spring start programs):

* the server (``python tests/cliserver.py SOCKET``) imports every coordinator module once
  and then, for each request on a Unix socket, forks. The child takes the caller's stdin,
  stdout and stderr (passed over the socket), its working directory, its environment and
  its argv, puts the signal dispositions back to those of a fresh interpreter, and runs
  ``coordinator/__main__.py`` as ``python -m coordinator`` would, exiting the normal way
  (atexit handlers, flushes, the exit code of ``sys.exit``).
* the client, :func:`run`, is a drop-in for ``subprocess.run([sys.executable, "-m",
  "coordinator", *args], capture_output=True, text=True, ...)``: the same
  ``CompletedProcess``, negative return codes for signals, ``TimeoutExpired`` after
  killing the command.

The command is still a process of its own against the real API servers, with its own
pid, file descriptors, environment and exit status; what it skips is the import. Commands
that need a fresh interpreter (a ``faketime`` prefix, changed ``PYTHON*``/``LD_*``/locale
variables) and every ``Popen`` the tests signal are started the ordinary way, and so is
everything when ``COORDINATOR_TEST_PRELOAD=0``.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Variables a starting interpreter (or the dynamic loader) reads before any code runs:
# a command asking for different ones gets an interpreter of its own.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "LC_", "FAKETIME", "DONT_FAKE")
_STARTUP_NAMES = ("LANG", "LANGUAGE")
_HEADER = struct.Struct("!I")


# ---------------------------------------------------------------------------- server


def _preload() -> None:
    import importlib
    import pkgutil

    import coordinator

    for info in pkgutil.walk_packages(coordinator.__path__, "coordinator."):
        if info.name != "coordinator.__main__":
            importlib.import_module(info.name)
    # What commands import lazily from outside the package.
    for name in ("kubernetes_asyncio.client", "kubernetes_asyncio.config", "anyio._backends._asyncio", "yaml"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < _HEADER.size:
        raise ConnectionError("short request")
    (size,) = _HEADER.unpack_from(data)
    body = bytearray(data[_HEADER.size :])
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("request cut short")
        body += chunk
    return json.loads(body), list(fds)


def _become_command(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take the caller's stdio, place, environment and signals."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # A fresh interpreter: SIGINT raises KeyboardInterrupt, SIGPIPE is ignored, the rest
    # are the kernel's defaults and nothing is blocked.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
                signal.SIGALRM):  # fmt: skip
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    sys.argv = ["coordinator", *request["args"]]


def serve(path: str) -> dict[str, Any] | None:
    """Answer requests until the test process goes (our stdin ends); returns a request
    only in a forked child, None in the server when it is time to stop."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    sel.register(0, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _events in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    # Nothing of the server stays open in the command (closed through
                    # their objects, so no stale descriptor is closed later by them).
                    signal.set_wakeup_fd(-1)
                    sel.close()
                    for sock in (listener, conn, *waiting.values()):
                        sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _become_command(request, fds)
                    return request
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(f"{pid}\n".encode())
                except OSError:
                    pass
                waiting[pid] = conn
            elif key.fileobj == 0:
                if not os.read(0, 512):  # the test process is gone
                    listener.close()
                    return None
            else:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            while waiting:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                ended = waiting.pop(pid, None)
                if ended is not None:
                    try:
                        ended.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                    except OSError:
                        pass
                    ended.close()


def _main() -> None:
    _preload()
    import gc

    gc.freeze()  # the preloaded heap is never collected again, in the server nor in a command
    if serve(sys.argv[1]) is None:
        return
    # Only the forked command gets here: run it as `python -m coordinator` would, and end
    # as an interpreter does (exit code, atexit handlers, flushed output), but without
    # tearing down the thousands of preloaded objects one by one.
    import runpy

    code = 0
    try:
        runpy.run_module("coordinator", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except KeyboardInterrupt:
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # killed by SIGINT, as Python reports it
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    if not _finish() and code == 0:
        code = 120
    os._exit(code)


def _finish() -> bool:
    """What an ending interpreter does before its teardown: wait for the threads that are
    not daemons, run the atexit handlers, flush stdout and stderr (False if that failed)."""
    import atexit

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    return _flush()


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _flush() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            ok = False
    return ok


# ---------------------------------------------------------------------------- client


class _Server:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.path = ""
        self.startup: dict[str, str] = {}  # what the server's interpreter started with

    def address(self) -> str | None:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                return self.path
            self._forget_path()  # of a server that died
            folder = tempfile.mkdtemp(prefix="coordinator-cli-")
            self.path = os.path.join(folder, "s")
            self.startup = _startup(os.environ)
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), self.path],
                stdin=subprocess.PIPE,  # its end tells the server that this process is gone
                stdout=subprocess.PIPE,
                stderr=None,
            )
            assert self.proc.stdout is not None
            if self.proc.stdout.readline().strip() != b"ready":
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                return None
            return self.path

    def _forget_path(self) -> None:
        if self.path:
            import shutil

            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)
            self.path = ""

    def stop(self) -> None:
        with self.lock:
            self._forget_path()
            if self.proc is not None and self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None


_server = _Server()


def _startup(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES}


def _server_for(env: dict[str, str]) -> str | None:
    """The preloaded server's address if a command with this environment may start from
    it: the server's interpreter started with the same startup variables (compared with
    what it started with, not with this process's environment, which may have changed
    since), and no faketime that fixes an absolute start: a forked child would carry on
    the server's faked clock instead of starting at that time again (an offset such as
    ``+7m`` is inherited by a fork as by a fresh process)."""
    if os.environ.get("COORDINATOR_TEST_PRELOAD", "1") == "0" or env.get("FAKETIME", "+")[:1] not in "+-":
        return None
    path = _server.address()
    return path if path is not None and _startup(env) == _server.startup else None


def run(
    args: list[str], env: dict[str, str], *, timeout: float | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, coordinator, *args], capture_output=True, text=True)``."""
    cmd = [sys.executable, "-m", "coordinator", *args]
    path = _server_for(env)
    if path is None:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, input=input)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if input is not None else (0, -1)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        body = json.dumps({"args": list(args), "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(body)) + body], [in_r, out_w, err_w])
    except OSError:
        conn.close()
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
        if input is not None:
            os.close(in_r)
    return _collect(cmd, conn, out_r, err_r, in_w, input, timeout)


def _collect(
    cmd: list[str], conn: socket.socket, out_r: int, err_r: int, in_w: int, input: str | None, timeout: float | None
) -> subprocess.CompletedProcess[str]:
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    replies = bytearray()
    pid: int | None = None
    code: int | None = None
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ)
    sel.register(err_r, selectors.EVENT_READ)
    sel.register(conn, selectors.EVENT_READ)
    pending = input.encode() if input is not None else b""
    if input is not None:
        os.set_blocking(in_w, False)
        sel.register(in_w, selectors.EVENT_WRITE)
    try:
        while len(sel.get_map()) > 0:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                raise subprocess.TimeoutExpired(cmd, timeout or 0, b"".join(chunks[out_r]), b"".join(chunks[err_r]))
            for key, _events in sel.select(left):
                if key.fileobj is conn:
                    data = conn.recv(64)
                    if not data:
                        sel.unregister(conn)
                        continue
                    replies += data
                    while b"\n" in replies:
                        line, _, rest = bytes(replies).partition(b"\n")
                        replies = bytearray(rest)
                        if pid is None:
                            pid = int(line)
                        else:
                            code = int(line)
                elif key.fileobj == in_w:
                    try:
                        sent = os.write(in_w, pending[:65536])
                    except BrokenPipeError:
                        sent = len(pending)
                    pending = pending[sent:]
                    if not pending:
                        sel.unregister(in_w)
                        os.close(in_w)
                        in_w = -1
                else:
                    fd = key.fd
                    data = os.read(fd, 65536)
                    if data:
                        chunks[fd].append(data)
                    else:
                        sel.unregister(fd)
    finally:
        sel.close()
        conn.close()
        os.close(out_r)
        os.close(err_r)
        if in_w >= 0:
            os.close(in_w)
    if code is None:
        raise RuntimeError(f"the preloaded command server lost {cmd} (pid {pid})")
    return subprocess.CompletedProcess(cmd, code, _text(chunks[out_r]), _text(chunks[err_r]))


def _text(parts: list[bytes]) -> str:
    # What text=True gives: the locale's encoding, universal newlines.
    import io

    return io.TextIOWrapper(io.BytesIO(b"".join(parts))).read()


def stop() -> None:
    _server.stop()


if __name__ == "__main__":
    _main()
