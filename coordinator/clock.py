"""Where coordinator reads the time, draws its random choices and learns which process it
is: one clock, one source of chance and one process, each taken from a context variable.

The engines never call ``time``, ``datetime.now``, ``secrets`` or ``random`` themselves:
they call :func:`wall_now` (an aware UTC datetime: stamps written into objects),
:func:`monotonic` (deadlines and elapsed times), :func:`boot` (CLOCK_BOOTTIME: a
holder's validity, which must keep counting while the machine sleeps), and
:func:`token_hex` / :func:`fraction` (lock ids, write ids, probe nonces, back-off jitter);
and they name the process they run in with :func:`host`, :func:`pid`, :func:`user`,
:func:`environ` and :func:`argv` (what leases, the lock history and the state envelope
record of a holder: its host, its pid, its command, the default holder name). By default these are the system's clocks,
``secrets``/``random`` and this process. A caller that runs the engines in a world of its
own (the test suite's simulator, on a virtual clock, every choice drawn from one seed,
each contender a process of its own) sets them for a block with :func:`using`; a task
started inside the block inherits them, as context variables are copied into new tasks.
"""

from __future__ import annotations

import getpass
import os
import random
import secrets
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime


class Clock:
    """The system's clocks."""

    def wall(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def boot(self) -> float:
        """Seconds on CLOCK_BOOTTIME: like the monotonic clock, but it keeps counting
        while the machine sleeps, so a suspended holder wakes up knowing its lease ran out."""
        try:
            return time.clock_gettime(time.CLOCK_BOOTTIME)
        except (AttributeError, OSError):  # not Linux
            return time.monotonic()


class Chance:
    """The system's randomness: ``secrets`` for names that must not repeat across
    processes, ``random`` for jitter."""

    def token_hex(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)

    def fraction(self) -> float:
        """A float in [0, 1)."""
        return random.random()


class Process:
    """This process, as the engines name a holder: the host's name, the pid, the user, the
    environment (``COORDINATOR_HOLDER``, the CI job's variables) and the command line."""

    def host(self) -> str:
        return socket.gethostname()

    def pid(self) -> int:
        return os.getpid()

    def user(self) -> str:
        try:
            return getpass.getuser()
        except (KeyError, OSError):
            return "unknown"

    def environ(self) -> Mapping[str, str]:
        return os.environ

    def argv(self) -> list[str]:
        return sys.argv


SYSTEM_CLOCK = Clock()
SYSTEM_CHANCE = Chance()
SYSTEM_PROCESS = Process()
# None: the system's.
_CLOCK: ContextVar[Clock | None] = ContextVar("coordinator_clock", default=None)
_CHANCE: ContextVar[Chance | None] = ContextVar("coordinator_chance", default=None)
_PROCESS: ContextVar[Process | None] = ContextVar("coordinator_process", default=None)


def current_clock() -> Clock:
    return _CLOCK.get() or SYSTEM_CLOCK


def current_chance() -> Chance:
    return _CHANCE.get() or SYSTEM_CHANCE


def current_process() -> Process:
    return _PROCESS.get() or SYSTEM_PROCESS


def wall_now() -> datetime:
    return current_clock().wall()


def monotonic() -> float:
    return current_clock().monotonic()


def boot() -> float:
    return current_clock().boot()


def token_hex(nbytes: int) -> str:
    return current_chance().token_hex(nbytes)


def fraction() -> float:
    return current_chance().fraction()


def host() -> str:
    return current_process().host()


def pid() -> int:
    return current_process().pid()


def user() -> str:
    return current_process().user()


def environ() -> Mapping[str, str]:
    return current_process().environ()


def argv() -> list[str]:
    return current_process().argv()


@contextmanager
def using(clock: Clock | None = None, chance: Chance | None = None, process: Process | None = None) -> Iterator[None]:
    """Read the time from ``clock``, draw chance from ``chance`` and be ``process`` (where
    given) inside the block, and in every task started inside it."""
    clock_token = _CLOCK.set(clock) if clock is not None else None
    chance_token = _CHANCE.set(chance) if chance is not None else None
    process_token = _PROCESS.set(process) if process is not None else None
    try:
        yield
    finally:
        if process_token is not None:
            _PROCESS.reset(process_token)
        if chance_token is not None:
            _CHANCE.reset(chance_token)
        if clock_token is not None:
            _CLOCK.reset(clock_token)
