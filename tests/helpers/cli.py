"""The command line run in a subprocess, outside any sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_cli(tmp_path: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``python -m coordinator ARGS`` with its config under ``tmp_path`` (not checked)."""
    env = dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "cfg" / "config.yaml"), NO_COLOR="1")
    env.update(kw.pop("env", {}))
    return subprocess.run(
        [sys.executable, "-m", "coordinator", *args], env=env, capture_output=True, text=True, timeout=60, **kw
    )
