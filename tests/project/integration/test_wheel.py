"""The wheel as users get it, on real API servers.

scripts/check-wheel.sh builds the sdist and the wheel, checks that the wheel holds no test
tools, and installs it into a fresh virtualenv with the requirements its metadata names
(from the package index, at constraints/dev.txt's versions: about 10 s, so the test installs
them rather than borrowing the suite's). The test then runs that virtualenv's `coordinator`
command, from outside the checkout, for a whole lock and state round trip on the sandbox,
and reads what it wrote with the checkout's own code.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from coord_fixtures import Env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The virtualenv scripts/check-wheel.sh installed the wheel into (built once per module)."""
    work = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check-wheel.sh"), str(work)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return work / "venv"


def test_the_installed_wheel_takes_the_lock_writes_and_reads_state_and_releases(
    wheel_venv: Path, dep3: Env, tmp_path: Path
) -> None:
    environ = dep3.environ()
    environ.pop("PYTHONPATH", None)

    def wheel(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(wheel_venv / "bin" / "coordinator"), *args],
            env=environ,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    origin = subprocess.run(
        [str(wheel_venv / "bin" / "python"), "-c", "import coordinator; print(coordinator.__file__)"],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(origin.stdout.strip()).is_relative_to(wheel_venv), origin
    assert not Path(os.path.realpath(origin.stdout.strip())).is_relative_to(ROOT), origin

    took = wheel("-o", "json", "lock", "acquire", "web", "--holder", "wheel", "--ttl", "60s")
    assert took.returncode == 0, took.stderr
    lock_id = json.loads(took.stdout)["lock_id"]

    wrote = wheel("state", "set", "web", "release=from-the-wheel", "--lock-id", lock_id)
    assert wrote.returncode == 0, wrote.stderr
    got = wheel("state", "get", "web", "release")
    assert (got.returncode, got.stdout.strip()) == (0, "from-the-wheel"), got.stderr
    # What the installed package wrote is what the checkout's code reads.
    assert dep3.cli("state", "get", "web", "release").stdout.strip() == "from-the-wheel"

    released = wheel("lock", "release", "web", "--holder", "wheel")
    assert released.returncode == 0, released.stderr
    status = json.loads(dep3.cli("-o", "json", "lock", "status", "web").stdout)
    assert status["status"] == "free", status
