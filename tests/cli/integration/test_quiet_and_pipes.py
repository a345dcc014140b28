"""A healthy run logs no warning, and a command cut off by a reader that stops early
(`| head -1`, `| true`) keeps its own exit status: a failure still fails under `set -o
pipefail`, a success is still 0, and a watch ends when its reader goes."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import anyio
import pytest
from coord_fixtures import Env

from coordinator.kube.client import KubeClient
from coordinator.logs import configure_logging

pytestmark = pytest.mark.integration


def _pipeline(env: Env, command: str, limit: float = 60) -> subprocess.CompletedProcess[str]:
    coordinator = f"{sys.executable} -m coordinator"
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command.replace("coordinator", coordinator, 1)],
        env=env.environ(),
        capture_output=True,
        text=True,
        timeout=limit,
    )


def test_a_failing_command_cut_off_by_its_reader_keeps_its_exit_status(dep3: Env) -> None:
    dep3.sandbox.pause(2)
    dep3.sandbox.pause(3)
    # Nobody reads: every line it prints meets a closed pipe, and the verdict (exit 4,
    # who holds the lock is unknown) comes after the table.
    cut = _pipeline(dep3, "coordinator --timeout 1s lock status web | true")
    assert cut.returncode == 4, (cut.returncode, cut.stderr)
    assert "Error: Who holds the lock of 'web' is unknown" in cut.stderr, cut.stderr
    assert "Exception ignored" not in cut.stderr and "BrokenPipe" not in cut.stderr, cut.stderr


def test_a_successful_command_cut_off_by_its_reader_still_ends_0(dep3: Env) -> None:
    cut = _pipeline(dep3, "coordinator lock status web | true")
    assert (cut.returncode, cut.stderr) == (0, ""), cut.stderr
    first = _pipeline(dep3, "coordinator lock status web | head -1")
    assert (first.returncode, first.stdout) == (0, "web is not held by a majority of 2.\n"), first


@pytest.mark.parametrize("target", [["web"], ["--all"]])
def test_a_watch_ends_when_its_reader_goes_even_with_nothing_new_to_print(dep3: Env, target: list[str]) -> None:
    took = time.monotonic()
    cut = _pipeline(dep3, f"coordinator -o json lock status {' '.join(target)} --watch --interval 0.3s | head -c 10")
    assert cut.returncode == 0 and cut.stdout.startswith("{"), (cut.returncode, cut.stdout, cut.stderr)
    assert cut.stderr == "", cut.stderr
    assert time.monotonic() - took < 50  # ended by itself (the pipeline's limit is 60 s)


def test_a_healthy_acquire_and_release_log_no_warning(
    dep3: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A member slower than the others to take the lock history (healthy, answering in 2 s)
    is left to finish on its own once a majority has it: nothing a reader misses (the
    copies are merged), so no warning; -v says so."""
    original = KubeClient.request

    async def slow_history_on_c3(self: KubeClient, method: str, path: str, **kw: Any) -> Any:
        if self.endpoint.name == "c3" and "coordinator-history-" in path:
            await anyio.sleep(2)
        return await original(self, method, path, **kw)

    monkeypatch.setattr(KubeClient, "request", slow_history_on_c3)

    async def go() -> None:
        async with dep3.api(timeout=10) as c:
            got = await c.acquire("web", ttl=60, holder="alice")
            assert got.acquired, got.results
            await c.release("web", got.lock_id, "alice")

    for verbosity in (0, 1):
        configure_logging(verbosity=verbosity)  # logging to the captured stderr
        try:
            anyio.run(go)
        finally:
            configure_logging()
        err = capsys.readouterr().err
        assert "warning" not in err, err
        if verbosity:
            assert "lock history not recorded on every member; the others keep it" in err, err
