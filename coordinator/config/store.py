"""The local config file: where it lives, how it is read, and how it is changed safely.

Changes go through :meth:`ConfigStore.edit`, which holds an inter-process file lock for
the whole read-modify-write, so two CLI processes running at once never lose each
other's changes; the new file is written to a temporary name and renamed over the old
one, so a crash never leaves half a file. A file that does not parse or validate is
reported (file, line or field) and never overwritten.

Reading does without pydantic when the plain read of ``coordinator.config.records`` vouches for
every value (the files this module writes); anything else, and every write, is validated
by the pydantic models of ``coordinator.config.models``, which word the errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from coordinator.config.records import LocalConfig, from_document
from coordinator.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from coordinator.config.models import LockBook


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "coordinator" / "config.yaml"


def resolve_config_path(path: str | os.PathLike[str] | None) -> Path:
    if path:
        return Path(path).expanduser()
    env = os.environ.get("COORDINATOR_CONFIG")
    return Path(env).expanduser() if env else default_config_path()


def _describe_validation(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        parts.append(f"{where}: {e['msg']}")
    more = f" (and {err.error_count() - 5} more)" if err.error_count() > 5 else ""
    return "; ".join(parts) + more


def _read_document(path: Path, *, what: str) -> dict[str, Any] | None:
    """The mapping the file holds (None if there is no file), or a ConfigError."""
    if not path.exists():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"Cannot read the {what} {path}: {err}.") from err
    try:
        # libyaml when PyYAML has it (every command reads this file at start-up); errors
        # still come from the pure-Python parser, worded as they always were
        from coordinator.kube.kubeconfig import _load_yaml

        raw: Any = _load_yaml(text) if text.strip() else {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"The {what} {path} is not valid YAML{line}: {getattr(err, 'problem', err)}. "
            "Fix or move the file; coordinator did not change it."
        ) from err
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"The {what} {path} must hold a mapping at the top level, not "
            f"{type(raw).__name__}. Fix or move the file; coordinator did not change it."
        )
    return raw


def _validate(path: Path, raw: dict[str, Any], model: type[BaseModel], *, what: str) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(
            f"The {what} {path} is not valid: {_describe_validation(err)}. "
            "Fix or move the file; coordinator did not change it."
        ) from err


def _load_config(path: Path) -> LocalConfig:
    raw = _read_document(path, what="config file")
    if raw is None:
        return LocalConfig()
    plain = from_document(raw)
    if plain is not None:
        return plain
    from coordinator.config.models import ConfigModel, config_of

    return config_of(_validate(path, raw, ConfigModel, what="config file"))


def _atomic_write(path: Path, text: str) -> None:
    from coordinator.config.files import private_folder

    private_folder(path.parent)  # the files hold state (backups) or local records: 0600 in 0700
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _dump(model: BaseModel | LocalConfig) -> str:
    """The file's text; a config is validated first (pydantic.ValidationError if it is not valid)."""
    if isinstance(model, LocalConfig):
        from coordinator.config.models import schema_of

        model = schema_of(model)
    data = json.loads(model.model_dump_json(by_alias=True))
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


class ConfigStore:
    """Reads and edits the local config file (and the lock book beside it)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = resolve_config_path(path)
        self.lock_book_path = self.path.with_name(self.path.stem + ".locks.yaml")
        self._lock_path = self.path.with_name("." + self.path.name + ".lock")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        from coordinator.config.files import FILE_MODE, private_folder

        try:
            # The folders it makes are 0700 whatever the umask (the config names
            # kubeconfigs and identities, the lock book holds lock ids); a folder that
            # exists already is the user's, and left as it is.
            private_folder(self.path.parent)
        except OSError as err:
            raise ConfigError(f"Cannot create the config directory {self.path.parent}: {err}.") from err
        from filelock import FileLock, Timeout  # only commands that write the config pay for it

        lock = FileLock(str(self._lock_path), timeout=30, mode=FILE_MODE)
        try:
            with lock:
                yield
        except Timeout as err:
            raise UsageError(
                f"Another coordinator process has held the config lock {self._lock_path} for "
                "30 s. If no other coordinator is running, delete that file and retry."
            ) from err

    def load(self) -> LocalConfig:
        return _load_config(self.path)

    @contextlib.contextmanager
    def edit(self) -> Iterator[LocalConfig]:
        """Yield the config under the file lock; save it atomically if the block succeeds."""
        with self._locked():
            cfg = self.load()
            before = _dump(cfg)
            yield cfg
            after = _dump(cfg)
            if after != before or not self.path.exists():
                _atomic_write(self.path, after)

    def check_writable(self) -> None:
        """Raise OSError unless the lock record can be written where it lives."""
        fd, tmp = tempfile.mkstemp(prefix=f".{self.lock_book_path.name}.", suffix=".probe", dir=self.path.parent)
        os.close(fd)
        os.unlink(tmp)

    def load_locks(self) -> LockBook:
        from coordinator.config.models import LockBook

        raw = _read_document(self.lock_book_path, what="lock record file")
        if raw is None:
            return LockBook()
        book: LockBook = _validate(self.lock_book_path, raw, LockBook, what="lock record file")
        return book

    @contextlib.contextmanager
    def edit_locks(self) -> Iterator[LockBook]:
        with self._locked():
            book = self.load_locks()
            before = _dump(book)
            yield book
            after = _dump(book)
            if after != before:
                _atomic_write(self.lock_book_path, after)
