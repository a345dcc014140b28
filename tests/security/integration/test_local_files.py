"""Backups and state files on the local disk: private under umask 000, never written through a planted symlink."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coord_fixtures import Env
from helpers.members import succeeded
from helpers.web import edit_envelope

integration = pytest.mark.integration

pytestmark = pytest.mark.integration


def test_a_backup_written_over_a_planted_symlink_does_not_write_through_it(dep3: Env, tmp_path: Path) -> None:
    """Someone who can write the folder the user backs up into plants the backup's name as a
    symlink to a file of the user's: the backup replaces the link, readable by the user
    alone, and the file it pointed at is untouched."""
    lock = json.loads(
        succeeded(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "w", "--ttl", "60s")).stdout
    )
    succeeded(dep3.cli("state", "set", "web", "secret=s3cr3t", "--lock-id", lock["lock_id"]))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    victim.chmod(0o644)
    shared = tmp_path / "shared"
    shared.mkdir()
    link = shared / "web-state.json"
    link.symlink_to(victim)
    succeeded(dep3.cli("state", "backup", "web", "-f", str(link)))
    assert victim.read_text() == "keep me\n"
    assert not link.is_symlink()
    assert (link.stat().st_mode & 0o777) == 0o600
    assert json.loads(link.read_text())["data"]["secret"] == "s3cr3t"


@integration
def test_state_files_are_private_under_umask_000_and_over_existing_files(dep3: Env, tmp_path: Path) -> None:
    """Held: with umask 000, `state backup -f` into missing folders makes them 0700 and
    the file 0600; over an existing 0644 file the result is 0600 (a new inode); a corrupt
    replica saved into an existing 0755 `--backup-dir` is 0600 (the folder, the user's,
    is left as it is)."""
    umask0 = ["sh", "-c", 'umask 000; exec "$@"', "sh"]
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", "password=hunter2").returncode == 0

    fresh = tmp_path / "new" / "deeper" / "web.json"
    done = dep3.cli("state", "backup", "web", "-f", str(fresh), prefix=umask0)
    assert done.returncode == 0, done.stderr
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert (fresh.parent.stat().st_mode & 0o777, fresh.parent.parent.stat().st_mode & 0o777) == (0o700, 0o700)
    assert str(fresh) in done.stdout

    existing = tmp_path / "open" / "web.json"
    existing.parent.mkdir()
    existing.write_text("old")
    existing.chmod(0o644)
    done = dep3.cli("state", "backup", "web", "-f", str(existing), prefix=umask0)
    assert done.returncode == 0, done.stderr
    assert existing.stat().st_mode & 0o777 == 0o600 and "hunter2" in existing.read_text()

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    edit_envelope(dep3, 2, lambda d: d.update(checksum="sha256:" + "0" * 64))
    synced = dep3.cli("-o", "json", "state", "sync", "web", "--backup-dir", str(shared), prefix=umask0)
    assert synced.returncode == 0, synced.stderr
    saved = Path(json.loads(synced.stdout)["saved_corrupt"]["c2"])
    assert saved.parent == shared and saved.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in shared.iterdir()] == [saved.name]  # no temporary file left


@integration
def test_a_backup_over_a_symlink_replaces_the_link_not_its_target(dep3: Env, tmp_path: Path) -> None:
    """Held: `state backup -f LINK` where LINK points at another file (a planted link, or
    ~/.bashrc): the link is replaced by a file of the user's alone, its target untouched;
    under umask 000 as well."""
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", "password=hunter2").returncode == 0
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    target.chmod(0o644)
    link = tmp_path / "out" / "web.json"
    link.parent.mkdir()
    link.symlink_to(target)
    umask0 = ["sh", "-c", 'umask 000; exec "$@"', "sh"]
    done = dep3.cli("state", "backup", "web", "-f", str(link), prefix=umask0)
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "keep me" and target.stat().st_mode & 0o777 == 0o644
    assert not link.is_symlink() and link.stat().st_mode & 0o777 == 0o600 and "hunter2" in link.read_text()
