"""One compare-and-swap loop for every object coordinator rewrites in place.

Read the object, decide what it should become (or that nothing is to be written),
write it with the ``resourceVersion`` it was read with, and when the write loses the
race (409 Conflict, or 409 AlreadyExists for a create) read it again and decide again;
at most ``attempts`` writes. A write is never retried blindly: every retry is decided
on what the server holds now. The loop does no I/O of its own: the caller hands in how
to read and how to write, so timeouts, deadlines and what an error means stay theirs.

The result is typed: the write landed (:class:`Written`), the decision needed no write
(:class:`Decided`), a read or a write failed for another reason (:class:`ReadFailed`,
:class:`WriteFailed`: the caller judges whether a failed write may have been applied),
or every attempt lost the race (:class:`Raced`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from coordinator.kube import client as kube
from coordinator.kube.client import KubeError

__all__ = [
    "ATTEMPTS",
    "Decided",
    "Keep",
    "Put",
    "Raced",
    "ReadFailed",
    "WriteFailed",
    "Written",
    "compare_and_swap",
    "lost_race",
]

ATTEMPTS = 4  # writes per call: enough for a few concurrent writers, bounded for a stuck one

Obj = TypeVar("Obj")  # the object as read
B = TypeVar("B")  # what a decision asks to write
W = TypeVar("W")  # what a landed write returns
D = TypeVar("D")  # what a decision that writes nothing returns


@dataclass(frozen=True)
class Put(Generic[B]):
    """A decision: write ``body`` over the object as read."""

    body: B


@dataclass(frozen=True)
class Keep(Generic[D]):
    """A decision: write nothing; the call returns ``value``."""

    value: D


@dataclass(frozen=True)
class Written(Generic[Obj, W]):
    """The write landed: ``value`` is what it returned, ``before`` the object it replaced."""

    value: W
    before: Obj


@dataclass(frozen=True)
class Decided(Generic[D]):
    """The object as read needed no write (or must not be written): the decision's value."""

    value: D


@dataclass(frozen=True)
class ReadFailed:
    """A read failed (a not-found the reader does not turn into a value is one)."""

    error: KubeError


@dataclass(frozen=True)
class WriteFailed(Generic[Obj]):
    """A write failed for another reason than a lost race; ``current`` is what it was
    written against. Whether it was applied is for the caller to judge from the error."""

    error: KubeError
    current: Obj


@dataclass(frozen=True)
class Raced(Generic[Obj]):
    """Every attempt lost the race; ``current`` is the object as last read."""

    current: Obj


async def lost_race(current: object, err: KubeError) -> bool:
    """The default retry rule: a 409 (another writer changed or created the object)."""
    return err.kind in (kube.CONFLICT, kube.ALREADY_EXISTS)


class _Unread:
    pass


UNREAD = _Unread()


async def compare_and_swap(
    read: Callable[[], Awaitable[Obj]],
    decide: Callable[[Obj], Put[B] | Keep[D]],
    write: Callable[[Obj, B], Awaitable[W]],
    *,
    current: Obj | _Unread = UNREAD,
    attempts: int = ATTEMPTS,
    reread_last: bool = False,
    retry: Callable[[Obj, KubeError], Awaitable[bool]] = lost_race,
    harmless: Callable[[Obj, Obj], bool] | None = None,
    harmless_extra: int = 0,
) -> Written[Obj, W] | Decided[D] | ReadFailed | WriteFailed[Obj] | Raced[Obj]:
    """Decide on the object and write the decision, re-reading after each lost race.

    ``current``: the object already read (else ``read`` is called first). ``write``
    gets the object as read and the body; it must send the object's resourceVersion
    (or create, for an object read as absent), so that a concurrent change makes it
    fail. ``retry`` says whether a failed write is worth another round (by default a
    409; it may also repair what made the write fail, and may raise). After the last
    lost race the object is read once more only when ``reread_last`` is set, so that
    :class:`Raced` carries what the server holds now. A race lost to a change that
    ``harmless(before, after)`` accepts (another writer's change of something the
    caller does not own, made often) does not use up an attempt, ``harmless_extra``
    times at most.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    obj: Obj | _Unread = current
    lost = 0
    spare = harmless_extra if harmless is not None else 0
    while True:
        if isinstance(obj, _Unread):
            try:
                obj = await read()
            except KubeError as err:
                return ReadFailed(err)
        decision = decide(obj)
        if isinstance(decision, Keep):
            return Decided(decision.value)
        try:
            return Written(await write(obj, decision.body), obj)
        except KubeError as err:
            if not await retry(obj, err):
                return WriteFailed(err, obj)
        lost += 1
        before: Obj = obj
        if lost >= attempts and not spare and not reread_last:
            return Raced(before)
        try:
            obj = await read()
        except KubeError as err:
            return ReadFailed(err)
        if harmless is not None and spare and harmless(before, obj):
            spare -= 1
            lost -= 1
        if lost >= attempts:
            return Raced(obj)
