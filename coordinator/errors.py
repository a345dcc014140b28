"""One exception tree for the whole tool.

Every error a user can meet is a :class:`CoordinatorError`: it carries the process exit
code documented in the README and a one-paragraph message meant for a person. The CLI
turns these into stderr text and exit codes in exactly one place (``cli.main``); any
other exception escaping a command is a bug and exits 1 saying so.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    HELD = 3
    NO_QUORUM = 4
    IDENTITY_MISMATCH = 5
    STATE_CONFLICT = 6
    LOCK_LOST = 7


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
