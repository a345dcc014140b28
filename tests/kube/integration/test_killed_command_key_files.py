"""A command killed with SIGKILL leaves no certificate or key of the kubeconfig on disk.

The sandbox kubeconfig embeds its credentials (``certificate-authority-data``,
``client-certificate-data``, ``client-key-data``), which the client library would write to
files in the temporary directory and remove only at interpreter exit. A `lock acquire
--wait` blocked behind another holder (its connections to every member made, so every TLS
context built) is SIGKILLed in a temporary directory of its own (TMPDIR), which must then
hold none of those files.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from coord_fixtures import Env
from helpers.cli import StreamReader

pytestmark = pytest.mark.integration


def _embedded_material(kubeconfig: str) -> dict[str, bytes]:
    """The certificates and keys the kubeconfig embeds, decoded, by what they are."""
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    found: dict[str, bytes] = {}
    for user in doc["users"]:
        for field in ("client-certificate-data", "client-key-data"):
            if user["user"].get(field):
                found[f"{user['name']} {field}"] = base64.b64decode(user["user"][field])
    for cluster in doc["clusters"]:
        if cluster["cluster"].get("certificate-authority-data"):
            found[f"{cluster['name']} CA"] = base64.b64decode(cluster["cluster"]["certificate-authority-data"])
    return found


def test_sigkilled_waiter_leaves_no_key_file(dep3: Env, tmp_path: Path) -> None:
    material = _embedded_material(dep3.kubeconfig)
    # The contexts the clusters were connected with embed their key: the case at issue.
    assert any(what.endswith("client-key-data") for what in material), "the sandbox kubeconfig embeds no key"
    key_lines = {
        f"{what} line {n}": line
        for what, pem in material.items()
        if what.endswith("client-key-data")
        for n, line in enumerate(pem.splitlines())
        if line and not line.startswith(b"-----")
    }
    tmpdir = tmp_path / "waiter-tmp"
    tmpdir.mkdir(mode=0o700)

    held = dep3.cli("lock", "acquire", "web", "--holder", "alice", "--ttl", "120s")
    assert held.returncode == 0, held.stderr
    waiter = dep3.popen(
        "lock", "acquire", "web", "--holder", "bob", "--ttl", "60s", "--wait", "150s",
        env={"TMPDIR": str(tmpdir)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        reader = StreamReader(waiter.stderr, "waiting for web")
        assert reader.wait_marker(60), f"the waiter did not begin waiting: {reader.text()!r}"
        time.sleep(1)  # well into its wait: its first read of every member long done
    finally:
        if waiter.poll() is None:
            os.killpg(waiter.pid, signal.SIGKILL)
        waiter.wait()
    assert waiter.returncode == -signal.SIGKILL

    left = []
    for path in sorted(tmpdir.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            holds = [what for what, secret in (material | key_lines).items() if secret in data]
            left.append(f"{path.relative_to(tmpdir)}: {', '.join(holds) or 'none of the kubeconfig material'}")
    assert left == [], f"the killed command left in its TMPDIR: {left}"
    # Nothing else either: no directory of its own (the exec plugin's, the fallback's).
    assert list(tmpdir.iterdir()) == []

    released = dep3.cli("lock", "release", "web", "--holder", "alice")
    assert released.returncode == 0, released.stderr
