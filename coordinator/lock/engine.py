"""The lock engine of one deployment: its parts put together."""

from __future__ import annotations

from coordinator.lock.acquire import Acquire
from coordinator.lock.renew import Renew
from coordinator.lock.status import Status


class LockEngine(Acquire, Renew, Status):
    """The lock of one deployment over its member clusters.

    Its parts, one module each: core (the members, one lease's reads, writes and
    compare-and-swap), members (the stored member set), release (release, break), floor
    (the token floor on the state objects), turns (claims and watches of waiters),
    acquire, renew, status.
    """
