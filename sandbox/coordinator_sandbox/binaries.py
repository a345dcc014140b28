"""Where the control-plane binaries live, and a clear error when they are not there."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from coordinator.errors import UsageError

# Keep in step with scripts/build-controlplane.sh and scripts/controlplane/*/go.mod.
KUBE_VERSION = "v1.34.4"
ETCD_VERSION = "3.6.16"

BUILD_SCRIPT = "scripts/build-controlplane.sh"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the two programs one sandbox cluster runs."""

    etcd: Path
    kube_apiserver: Path


def default_bin_dir() -> Path:
    """``${COORDINATOR_CACHE:-~/.cache/coordinator}/bin/<kube version>``, as the build script uses."""
    cache = os.environ.get("COORDINATOR_CACHE") or str(Path.home() / ".cache" / "coordinator")
    return Path(cache) / "bin" / KUBE_VERSION


def find_binaries(bin_dir: Path | str | None = None) -> Binaries:
    """Locate etcd and kube-apiserver.

    Looks in ``bin_dir`` when given, else in ``$COORDINATOR_BIN_DIR``, else in
    :func:`default_bin_dir`. Raises :class:`UsageError` naming the build script when
    either program is missing or not executable.
    """
    if bin_dir is not None:
        where, source = Path(bin_dir), "the given directory"
    elif os.environ.get("COORDINATOR_BIN_DIR"):
        where, source = Path(os.environ["COORDINATOR_BIN_DIR"]), "$COORDINATOR_BIN_DIR"
    else:
        where, source = default_bin_dir(), "the default build directory"
    where = where.expanduser().absolute()
    found = Binaries(etcd=where / "etcd", kube_apiserver=where / "kube-apiserver")
    missing = [p.name for p in (found.etcd, found.kube_apiserver) if not _is_executable(p)]
    if missing:
        raise UsageError(
            f"The sandbox needs etcd and kube-apiserver {KUBE_VERSION}, but "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing from "
            f"{where} ({source}). Build them with `{BUILD_SCRIPT}` (it takes a few minutes "
            "the first time and needs Go), or point COORDINATOR_BIN_DIR at a directory "
            "that holds both."
        )
    return found


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
