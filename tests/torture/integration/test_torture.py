"""Safety under faults: the quick torture run, and what earlier runs found."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from faults.kinds import FAULT_KINDS
from faults.toxiproxy import ToxiproxyNotFoundError, find_toxiproxy_binary

from coordinator.errors import LockHeldError, StateConflictError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
SUMMARY = re.compile(r"(\d+) lock sections, (\d+) state ops, (\d+) faults injected \(([^()]*)\), (\d+) violations")


def _toxiproxy_built() -> bool:
    try:
        find_toxiproxy_binary()
    except ToxiproxyNotFoundError:
        return False
    return True


def _run_torture(*args: str, limit: float) -> tuple[int, str, str]:
    """Run scripts/torture.py; on time-out it gets SIGTERM, so it still stops what it started."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "torture.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the torture run took more than {limit:g}s; its progress:\n{err[-4000:]}")
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.skipif(not _toxiproxy_built(), reason="toxiproxy-server is not built: run scripts/build-toxiproxy.sh")
def test_quick_torture_run_finds_no_violation(tmp_path: Path) -> None:
    code, out, err = _run_torture("--quick", "--seed", "20261130", "--dir", str(tmp_path / "run"), limit=900)
    lines = out.strip().splitlines()
    assert lines, f"no output; progress:\n{err[-4000:]}"
    found = SUMMARY.fullmatch(lines[-1])
    assert found, f"last line is not the summary: {lines[-1]!r}\n{out}\n{err[-4000:]}"
    sections, ops, faults, violations = (int(found.group(i)) for i in (1, 2, 3, 5))
    per_kind = {k: int(n) for k, n in (item.rsplit(" ", 1) for item in found.group(4).split(", "))}
    assert violations == 0, out
    assert code == 0, out + err[-4000:]
    # Every kind of fault, once at least: a kind that never ran proves nothing.
    assert sorted(per_kind) == sorted(FAULT_KINDS), out
    assert all(n >= 1 for n in per_kind.values()), out
    assert sum(per_kind.values()) == faults, out
    # A run that did next to nothing proves nothing.
    assert sections >= 8, out
    assert ops >= 15, out
    assert "mutual exclusion: ok" in out and "linearizability: ok" in out and "no lost writes: ok" in out
    # Process trees were judged, and reads overlapped writes.
    assert re.search(r"run tree of [3-9] processes \d+", out), out
    overlapped = re.search(r"(\d+) reads overlapped a write", out)
    assert overlapped and int(overlapped.group(1)) >= 1, out
    print(out)  # the report, for -rA


HA_KINDS = ("pause-minority", "kill-apiserver", "cut-minority", "lose-responses", "sigstop-holder", "delete-lease-one")


@pytest.mark.slow
@pytest.mark.skipif(not _toxiproxy_built(), reason="toxiproxy-server is not built: run scripts/build-toxiproxy.sh")
def test_quick_run_on_ha_clusters_with_a_skew_inside_the_bound_finds_no_violation(tmp_path: Path) -> None:
    """Two kube-apiservers per cluster on one etcd, behind a front proxy that spreads the
    requests; one of them answers 2 s ahead, inside the default --max-server-skew of 5 s.
    (A skew far outside the bound is caught: tests/test_sandbox_ha.py.)"""
    code, out, err = _run_torture(
        "--quick", "--seed", "20261201", "--apiservers", "2", "--date-offset", "2",
        "--kinds", ",".join(HA_KINDS), "--dir", str(tmp_path / "run"), limit=900,
    )  # fmt: skip
    lines = out.strip().splitlines()
    assert lines, f"no output; progress:\n{err[-4000:]}"
    found = SUMMARY.fullmatch(lines[-1])
    assert found, f"last line is not the summary: {lines[-1]!r}\n{out}\n{err[-4000:]}"
    sections, violations = int(found.group(1)), int(found.group(5))
    per_kind = {k: int(n) for k, n in (item.rsplit(" ", 1) for item in found.group(4).split(", "))}
    assert violations == 0, out
    assert code == 0, out + err[-4000:]
    assert sorted(per_kind) == sorted(HA_KINDS) and all(n >= 1 for n in per_kind.values()), out
    assert sections >= 5, out
    # Both kube-apiservers of every cluster served the contenders, and the skewed one's
    # answers were shifted: the run was on HA clusters, with the offset in force.
    ha = re.search(r"HA: 2 kube-apiservers per cluster, one \+2s off; requests served (.*); (\d+) time stamps", out)
    assert ha, out
    served = [[int(n) for n in item.split()[1].split("/")] for item in ha.group(1).split(", ")]
    assert len(served) == 3 and all(len(s) == 2 and min(s) > 0 for s in served), out
    assert int(ha.group(2)) > 0, out
    print(out)  # the report, for -rA


def test_unknown_fault_kind_is_refused_before_anything_starts() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "torture.py"), "--kinds", "pause-minority,no-such-fault"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no-such-fault" in proc.stderr and "starting" not in proc.stderr


# What the torture run found in the Python API: the documented errors arrived wrapped in
# an ExceptionGroup, so `except LockHeldError` did not catch them.


def test_lock_with_wait_that_runs_out_raises_lock_held(dep3: Any) -> None:
    held = dep3.cli("lock", "acquire", "web", "--holder", "first", "--ttl", "60s")
    assert held.returncode == 0, held.stderr

    async def scenario() -> None:
        async with dep3.api() as c:
            with pytest.raises(LockHeldError):
                async with c.lock("web", ttl=30, wait=1.5, holder="second"):
                    pytest.fail("the lock is held by someone else")

    anyio.run(scenario)


def test_error_inside_the_lock_block_comes_out_as_itself_and_releases(dep3: Any) -> None:
    async def scenario() -> None:
        async with dep3.api() as c:
            with pytest.raises(StateConflictError, match="raised in the block"):
                async with c.lock("web", ttl=30, holder="raiser"):
                    raise StateConflictError("raised in the block")
            st = await c.status("web")
            assert not st.held_by_majority and st.holder is None

    anyio.run(scenario)
