"""The command line run in a subprocess: outside any sandbox, and its output read as it comes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any


def run_cli(tmp_path: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``python -m coordinator ARGS`` with its config under ``tmp_path`` (not checked)."""
    env = dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "cfg" / "config.yaml"), NO_COLOR="1")
    env.update(kw.pop("env", {}))
    return subprocess.run(
        [sys.executable, "-m", "coordinator", *args], env=env, capture_output=True, text=True, timeout=60, **kw
    )


class StreamReader:
    """Reads a running command's stream (its stdout or stderr pipe) line by line in a
    thread, so that a test can act once the command has said ``marker`` (a fixed pause is
    shorter than a busy machine's start-up) and still have every line afterwards."""

    def __init__(self, stream: IO[str] | None, marker: str) -> None:
        assert stream is not None, "the stream must be a pipe"
        self._stream = stream
        self._marker = marker
        self._lines: list[str] = []
        self._seen = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self._lines.append(line)
            if self._marker in line:
                self._seen.set()

    def wait_marker(self, timeout: float) -> bool:
        """Whether the marker came within ``timeout`` seconds."""
        return self._seen.wait(timeout)

    def text(self, join: float = 0) -> str:
        """The lines read so far; with ``join``, first wait that long for the stream's end."""
        if join:
            self._thread.join(join)
        return "".join(self._lines)
