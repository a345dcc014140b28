"""Local files under umask 000 stay private, and endless input files are refused without being read."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

integration = pytest.mark.integration


def test_restore_from_an_endless_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    """`state restore -f /dev/zero` (or a pipe, `<(curl ...)`): the size check trusts
    stat(); the file is read to the end, so memory runs out. Here under a 1 GiB
    address-space limit, so the machine is not hurt."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "config.yaml"), NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "state", "restore", "web", "-f", "/dev/zero"],
        env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit,
    )  # fmt: skip
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-500:]}"


def test_apply_from_an_endless_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, COORDINATOR_CONFIG=str(tmp_path / "config.yaml"), NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "state", "apply", "web", "-f", "/dev/zero"],
        env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit,
    )  # fmt: skip
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-500:]}"


def test_the_config_folder_is_private_under_umask_000(tmp_path: Path) -> None:
    """The local records (config, lock book with its lock ids) live in a folder the
    config's own comment calls 0700; with umask 000 it is made world-writable, so another
    local user may replace config.yaml (kubeconfig paths, identities)."""
    from coordinator.config.store import ConfigStore

    path = tmp_path / "fresh" / "coordinator" / "config.yaml"
    old = os.umask(0)
    try:
        with ConfigStore(path).edit():
            pass
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o077 == 0, oct(path.parent.stat().st_mode)
    assert path.parent.parent.stat().st_mode & 0o077 == 0, oct(path.parent.parent.stat().st_mode)
    lock_file = path.with_name("." + path.name + ".lock")
    assert lock_file.stat().st_mode & 0o777 == 0o600, oct(lock_file.stat().st_mode)


# Broke before: under umask 000 the sandbox's parent folders were made 0777 (mkdir parents=True).
def test_the_sandbox_folders_are_private_under_umask_000(tmp_path: Path) -> None:
    from coordinator_sandbox.records import Layout, locked

    root = tmp_path / "a" / "b" / "sb"
    old = os.umask(0)
    try:
        with locked(Layout.of(root), create=True):
            pass
    finally:
        os.umask(old)
    for folder in (root, root.parent, root.parent.parent):
        assert folder.stat().st_mode & 0o077 == 0, (folder, oct(folder.stat().st_mode))
    lock = Layout.of(root).lock
    assert lock.stat().st_mode & 0o077 == 0, oct(lock.stat().st_mode)
