"""The kubectl plugin's krew manifest (deploy/krew/coordinator.yaml), checked by krew's own
validator (sigs.k8s.io/krew/cmd/validate-krew-manifest, built from the Go module proxy by
scripts/build-krewvalidate.sh), and held to the archive scripts/krew-archive.py builds."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "deploy" / "krew" / "coordinator.yaml"
LAUNCHER = ROOT / "deploy" / "krew" / "kubectl-coordinator"
BUILD = ROOT / "scripts" / "build-krewvalidate.sh"


@pytest.fixture(scope="module")
def validator() -> Path:
    """The validator: $COORDINATOR_KREWVALIDATE (scripts/setup.sh sets it), else built (and
    cached under ~/.cache/coordinator) by scripts/build-krewvalidate.sh. Skipped, saying
    why, only when it cannot be built here (no Go, no module proxy)."""
    given = os.environ.get("COORDINATOR_KREWVALIDATE")
    if given:
        return Path(given)
    built = subprocess.run(["bash", str(BUILD)], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    if built.returncode != 0:
        pytest.skip(f"krew's validator could not be built (scripts/build-krewvalidate.sh):\n{built.stderr[-2000:]}")
    return Path(built.stdout.splitlines()[-1])


def _validate(validator: Path, manifest: Path) -> subprocess.CompletedProcess[str]:
    # -skip-install: the check of the manifest itself; installing would download the
    # release archive, which this machine does not have.
    return subprocess.run(
        [str(validator), "-manifest", str(manifest), "-skip-install"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_manifest_passes_krews_own_validator(validator: Path) -> None:
    done = _validate(validator, MANIFEST)
    assert done.returncode == 0, done.stderr
    assert "structural validation OK" in done.stderr


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("  name: coordinator\n", "  name: coordinater\n"),  # not the file's name
        ("  version: v0.1.0\n", "  version: 0.1.0\n"),  # not a v-prefixed semver
        ("      sha256: 8", "      sha256: "),  # not a sha256
        ("operator: In", "operator: Is"),  # not a selector
    ],
    ids=["name", "version", "sha256", "selector"],
)
def test_the_validator_refuses_a_broken_copy(validator: Path, tmp_path: Path, old: str, new: str) -> None:
    """The validator does check: the same manifest with one mistake fails it."""
    text = MANIFEST.read_text()
    assert old in text
    broken = tmp_path / "coordinator.yaml"
    broken.write_text(text.replace(old, new))
    assert _validate(validator, broken).returncode != 0


def test_the_manifest_names_the_archive_the_script_builds(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "krew-archive.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    path, digest = done.stdout.split()
    data = Path(path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest
    spec = yaml.safe_load(MANIFEST.read_text())["spec"]
    (platform,) = spec["platforms"]
    assert platform["sha256"] == digest, "deploy/krew/coordinator.yaml: sha256 of scripts/krew-archive.py's archive"
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {f["from"] for f in platform["files"]}
    assert members[platform["bin"]].mode == 0o755
    # One version everywhere: the package's, the manifest's, the launcher's and the URI's.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert spec["version"] == f"v{version}"
    assert re.search(rf"^version={re.escape(version)}$", LAUNCHER.read_text(), re.M)
    assert f"/v{version}/" in platform["uri"]
