"""The tests' preloaded command server answers exactly like a fresh ``python -m coordinator``:
same exit code, stdout and stderr, the caller's environment, working directory and stdin,
signals as a fresh interpreter has them, and a timeout that kills the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cliserver
import pytest

from coordinator.cli.documents import DOCUMENT_BYTES


def _fresh(args: list[str], env: dict[str, str], input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator", *args], env=env, capture_output=True, text=True,
                          input=input, timeout=60)  # fmt: skip


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env.update({"COORDINATOR_CONFIG": str(tmp_path / "config.yaml"), "NO_COLOR": "1", **extra})
    return env


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["lock", "acquire"],  # usage error: exit 2 with one paragraph
        ["nonsense"],
        ["deployment", "list", "-o", "json"],  # reads the config the environment names
        ["lock", "status", "nowhere"],  # a deployment the config does not have
        ["--timeout", "-1s", "cluster", "list"],
    ],
)
def test_a_preloaded_command_answers_as_a_fresh_interpreter_does(args: list[str], tmp_path: Path) -> None:
    env = _env(tmp_path)
    fresh = _fresh(args, env)
    preloaded = cliserver.run(args, env, timeout=60)
    assert cliserver._server.proc is not None, "the command did not go through the server"
    assert (preloaded.returncode, preloaded.stdout, preloaded.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_stdin_larger_than_a_pipe_reaches_the_command(tmp_path: Path) -> None:
    env = _env(tmp_path)
    too_big = "k: " + "x" * DOCUMENT_BYTES + "\n"
    fresh = _fresh(["state", "apply", "web", "-f", "-"], env, input=too_big)
    preloaded = cliserver.run(["state", "apply", "web", "-f", "-"], env, input=too_big, timeout=60)
    assert fresh.returncode != 0 and "larger than" in fresh.stderr
    assert (preloaded.returncode, preloaded.stderr) == (fresh.returncode, fresh.stderr)


def test_the_environment_and_directory_are_the_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An XDG_CONFIG_HOME relative to the working directory only resolves in the caller's.
    monkeypatch.chdir(tmp_path)
    env = _env(tmp_path)
    del env["COORDINATOR_CONFIG"]
    env["XDG_CONFIG_HOME"] = "cfg"
    (tmp_path / "cfg" / "coordinator").mkdir(parents=True)
    (tmp_path / "cfg" / "coordinator" / "config.yaml").write_text("this: [is not a config\n")
    fresh = _fresh(["deployment", "list"], env)
    preloaded = cliserver.run(["deployment", "list"], env, timeout=60)
    assert fresh.returncode != 0 and "config" in fresh.stderr.lower()
    assert (preloaded.returncode, preloaded.stdout, preloaded.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose only context is a server that takes connections and never
    answers (listening, never accepting): a command waits on it until its own timeout."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: x, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}]\n"
        "users: [{name: x, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: x, user: x}}]\n"
    )
    try:
        yield _env(tmp_path, KUBECONFIG=str(kubeconfig))
    finally:
        listener.close()


_HANGS = ["--timeout", "60s", "cluster", "connect", "x", "--context", "x"]


def test_a_command_that_overruns_its_timeout_is_killed(silent: dict[str, str]) -> None:
    env = silent
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        cliserver.run(_HANGS, env, timeout=1.5)
    assert time.monotonic() - started < 30


def _commands_of(server_pid: int) -> list[int]:
    text = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text()
    return [int(x) for x in text.split()]


def test_signals_are_those_of_a_fresh_interpreter(tmp_path: Path, silent: dict[str, str]) -> None:
    """A server started while SIGINT was ignored still gives its commands what a fresh
    interpreter started from a terminal has: SIGINT interrupts (exit 130), nothing blocked."""
    cliserver.stop()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cliserver.run(["--version"], _env(tmp_path), timeout=60)  # the server starts here
    finally:
        signal.signal(signal.SIGINT, previous)
    server = cliserver._server.proc
    assert server is not None
    result: list[subprocess.CompletedProcess[str]] = []
    import threading

    worker = threading.Thread(target=lambda: result.append(cliserver.run(_HANGS, silent, timeout=60)))
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while not _commands_of(server.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (pid,) = _commands_of(server.pid)
        time.sleep(1.0)  # past its imports' end: the command is waiting on the connection
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert int(status["SigBlk"], 16) == 0
        assert not int(status["SigIgn"], 16) & (1 << (signal.SIGINT - 1))
        os.kill(pid, signal.SIGINT)
    finally:
        worker.join(timeout=60)
        cliserver.stop()
    (proc,) = result
    fresh = subprocess.Popen([sys.executable, "-m", "coordinator", *_HANGS], env=silent, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(2.5)  # its imports take about a second
    fresh.send_signal(signal.SIGINT)
    out, err = fresh.communicate(timeout=60)
    assert fresh.returncode == 130
    assert (proc.returncode, proc.stdout, proc.stderr) == (fresh.returncode, out, err)


def test_the_startup_variables_are_compared_with_the_servers_not_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variable an interpreter reads at its start, changed in this process after the
    server started, still gets a fresh interpreter; the server's own still go to it."""
    cliserver.run(["--version"], _env(tmp_path), timeout=60)  # the server starts here
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    before = _env(tmp_path)
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    fresh: list[object] = []
    real = subprocess.run

    def spy(*args: object, **kwargs: object) -> object:
        fresh.append(args[0])
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", spy)
    assert cliserver.run(["--version"], _env(tmp_path), timeout=60).returncode == 0
    assert len(fresh) == 1, "started from a server whose interpreter began without PYTHONWARNINGS"
    assert cliserver.run(["--version"], before, timeout=60).returncode == 0
    assert len(fresh) == 1, "the server's own startup variables should have gone to the server"


def test_a_faketime_with_an_absolute_start_gets_a_fresh_interpreter() -> None:
    # A fork would carry on the server's faked clock instead of starting at that time.
    assert cliserver._server_for({**os.environ, "FAKETIME": "@2030-01-01 00:00:00"}) is None
    assert cliserver._server_for({**os.environ, "FAKETIME": "2030-01-01 00:00:00"}) is None
