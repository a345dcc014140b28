"""Files that can hold state data: readable by the user alone.

A saved replica or a backup holds the deployment's state, and with Secret storage that
state is secret: it is written with mode 0600 from its first byte (never a moment of
0644 under the umask), atomically, and the folders it creates on the way are 0700.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

FILE_MODE = 0o600
FOLDER_MODE = 0o700


def private_folder(folder: Path, *, own: bool = False) -> Path:
    """Create ``folder`` and its missing parents with mode 0700; return it.

    With ``own`` (a folder of the tool's, not one the user named), an existing folder of
    the user's that others may enter is narrowed to 0700 as well: earlier versions made
    such folders 0755."""
    missing = []
    current = folder
    while not current.exists() and current.parent != current:
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=FOLDER_MODE)
            os.chmod(path, FOLDER_MODE)  # mkdir's mode is filtered by the umask
    if own:
        st = folder.stat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(folder, FOLDER_MODE)
    return folder


def write_private(path: Path, data: bytes | str, *, own_folder: bool = False) -> Path:
    """Write ``data`` to ``path`` with mode 0600, atomically; missing folders are made 0700
    (and the folder itself narrowed to 0700 when it is the tool's own, ``own_folder``).

    Returns the absolute path, to tell the user where it went."""
    path = path.expanduser()
    private_folder(path.parent, own=own_folder)
    payload = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path.absolute()
