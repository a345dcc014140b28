"""One exception tree for the whole tool.

Every error a user can meet is a :class:`CoordinatorError`: it carries the process exit
code documented in the README and a one-paragraph message meant for a person. The CLI
turns these into stderr text and exit codes in exactly one place (``cli.main``); any
other exception escaping a command is a bug and exits 1 saying so.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    HELD = 3
    NO_QUORUM = 4
    IDENTITY_MISMATCH = 5
    STATE_CONFLICT = 6
    LOCK_LOST = 7
    DRIFT = 8


class CoordinatorError(Exception):
    """Base of every error meant for the user; ``str(err)`` is the paragraph to print."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, payload: object | None = None) -> None:
        super().__init__(message)
        self.message = message
        # A machine-readable document to print on stdout with ``-o json`` (e.g. the
        # per-cluster outcomes of a failed acquisition), when there is one.
        self.payload = payload


class UsageError(CoordinatorError):
    """Bad flag, malformed file, unknown cluster or deployment, invalid name."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """The local configuration file cannot be read, parsed or validated."""


class LockHeldError(CoordinatorError):
    """The lock is held by someone else (and ``--wait`` ran out, if given)."""

    exit_code = ExitCode.HELD


class NoQuorumError(CoordinatorError):
    """Too many member clusters could not be observed to decide anything."""

    exit_code = ExitCode.NO_QUORUM


class IdentityMismatchError(CoordinatorError):
    """A kubeconfig context now leads to a different cluster than it was connected as."""

    exit_code = ExitCode.IDENTITY_MISMATCH


class MembershipError(CoordinatorError):
    """The member set the clusters store differs from this machine's record, or too few
    members confirm it."""

    exit_code = ExitCode.IDENTITY_MISMATCH


class StateConflictError(CoordinatorError):
    """Stale fencing token, lost race, newer schema, or the lock is not held."""

    exit_code = ExitCode.STATE_CONFLICT


class LockLostError(CoordinatorError):
    """The lock was lost while ``lock run`` was running its child."""

    exit_code = ExitCode.LOCK_LOST


class DriftError(CoordinatorError):
    """A watched resource differs from the deployment's record of it, or is gone (`coordinator drift`)."""

    exit_code = ExitCode.DRIFT


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` Did you mean 'payments'?`` for the names of ``choices`` closest to ``name``
    (a leading space, ready to append to a sentence), or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(name, sorted(set(choices)), n=3, cutoff=0.6)
    if not close:
        return ""
    if len(close) == 1:
        return f" Did you mean {close[0]!r}?"
    return " Did you mean " + ", ".join(repr(c) for c in close[:-1]) + f" or {close[-1]!r}?"


def missing_config(path: Path | None, what: str) -> UsageError | None:
    """The error for ``what`` (e.g. "Unknown deployment 'payments'") when the config file
    at ``path`` does not exist: then nothing is known here, and the path is the likely
    mistake (``--config``, ``COORDINATOR_CONFIG``), not the name."""
    if path is None or path.exists():
        return None
    return UsageError(
        f"{what}: the config file {path} does not exist, so no cluster or deployment is known here. "
        "Check --config and COORDINATOR_CONFIG; `coordinator cluster connect` creates the file."
    )


def unknown_deployment(name: str, known: Iterable[str], config_path: Path | None = None) -> UsageError:
    """A deployment this machine's config does not name: the config file missing, a name
    close to a known one, or one to create or import."""
    what = f"Unknown deployment {name!r}"
    if (missing := missing_config(config_path, what)) is not None:
        return missing
    names = sorted(known)
    listed = f"known here: {', '.join(names)}" if names else "none is known here"
    if hint := did_you_mean(name, names):
        return UsageError(f"{what}.{hint} ({listed}.)")
    return UsageError(
        f"{what} ({listed}). Create it with `coordinator deployment create {name} --namespace NS --cluster A "
        f"--cluster B ...`, or rebuild it from the clusters with `coordinator deployment import {name} --cluster A`."
    )


def unknown_cluster(name: str, known: Iterable[str], config_path: Path | None = None) -> UsageError:
    """A cluster name this machine has not connected: the config file missing, a name
    close to a connected one, or one to connect."""
    what = f"Unknown cluster {name!r}"
    if (missing := missing_config(config_path, what)) is not None:
        return missing
    names = sorted(known)
    listed = f"connected clusters: {', '.join(names) or 'none'}"
    if hint := did_you_mean(name, names):
        return UsageError(f"{what}.{hint} ({listed}.)")
    return UsageError(f"{what} ({listed}). Connect it with `coordinator cluster connect {name} --context CONTEXT`.")
