"""The real kubectl, the other client the tests and the fault suite act as."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def kubectl(
    kubeconfig: str | Path, index: int, namespace: str, *args: str, stdin: str | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``kubectl ARGS`` on sandbox cluster ``index`` (context ``sandbox-INDEX``) in
    ``namespace``, straight to its API server; the output is captured as text."""
    exe = shutil.which("kubectl")
    assert exe is not None, "kubectl is missing"
    return subprocess.run(
        [exe, "--kubeconfig", str(kubeconfig), "--context", f"sandbox-{index}", "-n", namespace, *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
