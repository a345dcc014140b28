"""The Python API as a user's program meets it: a wheel whose type hints mypy reads
(py.typed), and results whose repr() is a line to read, not an API object dump."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import anyio
import pytest
from coord_fixtures import COMMIT_TIMEOUT_S, Env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_the_built_wheel_has_py_typed(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = tmp_path.glob("coordinator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "coordinator/py.typed" in names, names
    assert not [n for n in names if n.startswith(("tests/", "scripts/"))], names


def test_results_have_short_reprs(dep3: Env) -> None:
    shown: dict[str, str] = {}

    async def go() -> None:
        # every member's answer is part of the repr checked: a loaded machine's slow
        # first answer must not leave a member out
        async with dep3.api(timeout=COMMIT_TIMEOUT_S) as c:
            async with c.lock("web", ttl=60, holder="alice", reason="r" * 200) as held:
                shown["held"] = repr(held)
                shown["acquired"] = repr(held.result)
                shown["written"] = repr(await c.state("web").set({"big": "x" * 5000}, lock=held))
                shown["status"] = repr(await c.status("web"))

    anyio.run(go)
    for what, text in shown.items():
        assert len(text) < 400, (what, len(text), text[:1000])
    assert shown["acquired"].startswith("AcquireResult(deployment='web', acquired=True, lock_id=")
    assert "clusters={'c1': 'ok', 'c2': 'ok', 'c3': 'ok'}" in shown["acquired"], shown["acquired"]
    assert shown["written"].startswith("WriteReport(deployment='web', outcome='ok', stamp='1/1/")
    assert "verdict='held', holder='alice'" in shown["status"], shown["status"]
