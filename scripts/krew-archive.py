"""Build the kubectl plugin's krew archive and print its path and sha256.

    .venv/bin/python scripts/krew-archive.py DIR    # writes DIR/kubectl-coordinator.tar.gz

The archive holds deploy/krew/kubectl-coordinator (the launcher) and LICENSE, with fixed
owners, modes and times and no gzip timestamp, so the same files always give the same
bytes: deploy/krew/coordinator.yaml names its sha256, and
tests/project/unit/test_krew_manifest.py fails when the two part.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = {
    "kubectl-coordinator": (ROOT / "deploy" / "krew" / "kubectl-coordinator", 0o755),
    "LICENSE": (ROOT / "LICENSE", 0o644),
}
NAME = "kubectl-coordinator.tar.gz"


def archive_bytes() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (path, mode) in sorted(FILES.items()):
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    # Stored, not deflated: the bytes of a compressed stream depend on the zlib build
    # (zlib-ng's differ), those of stored blocks do not; the archive is a few kilobytes.
    return gzip.compress(raw.getvalue(), compresslevel=0, mtime=0)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0]) / NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    data = archive_bytes()
    out.write_bytes(data)
    print(out)
    print(hashlib.sha256(data).hexdigest())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
