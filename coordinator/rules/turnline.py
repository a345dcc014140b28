"""The line of waiters on one cluster's lease: claims, their order, whose turn it is.

Pure rules, like :mod:`coordinator.rules.lease` (which reads the line off a lease and answers
with them): no I/O, no clock; the server times come with the lease as read.

A waiting contender lists a claim in the lease's ``coordinator.io/next`` annotation: when
it began waiting (the median of the servers' ``Date`` at its first read), its lock id,
and ``seen``, a server stamp it refreshes while it waits, every ``every`` seconds: 3 s
while it is among the first FRONT live waiters, 15 s behind them, so that a long line
costs the lease a few writes a second at most (each one a compare-and-swap the holder's
own writes may have to repeat). A refresh writes the newest time the server stamped on
the lease (its managedFields), which is at or after the waiter's own previous refresh: a
live waiter's stamp therefore trails the server's clock by about one interval and one
round of its wait loop, never by a client's clock. A claim not refreshed within twice
its interval and STALE_SLACK_S (15 s for the first waiters) is dead: its waiter is gone,
and it loses its place. The waiters are listed in line order, the next one at the top of
the annotation, those after it under ``after`` (at most LINE_CAP of them).

While the lease is live, the turn is the first listed waiter still alive. From the moment
it is freed (the release stamp) or lapses, the waiters alive then get turns one after the
other, each for HANDOFF_GRACE_S: a waiter that died in line costs a handoff one grace at
most, and the waiters behind it keep their order. Claims only ever delay a take, so they
cannot weaken mutual exclusion.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from coordinator.rules.resources import parse_time

if TYPE_CHECKING:
    from coordinator.rules.lease import LeaseView

# How long a freed (or lapsed) lease stays reserved for the contender that has waited
# longest, by the server's clock, before anyone else may take it; each waiter after it
# gets a turn as long once the one before it has let its own pass.
HANDOFF_GRACE_S = 2.0
# A waiter refreshes its claim when the stamp it carries is this old (by the Date hint):
# the first FRONT live waiters often, since one of them goes next, the others seldom.
FRONT = 4
CLAIM_REFRESH_S = 3.0
BACK_REFRESH_S = 15.0
# A claim is dead once its stamp is older than twice its interval and this: the stamp a
# refresh writes may be one interval and one round of the wait loop old already (a round
# is at most 3 s and a request), and one-second stamps cost two more.
STALE_SLACK_S = 9.0
CLAIM_STALE_S = 2 * CLAIM_REFRESH_S + STALE_SLACK_S  # 15 s for the first waiters
# The longest interval a claim may name (anyone may write the annotation).
MAX_EVERY_S = 60.0
# The most waiters a lease lists (the earliest ones), and what one entry may hold: the
# annotation stays small (a few KiB) next to the 256 KiB all of a lease's annotations
# share, whatever holder names and lock ids waiters bring.
LINE_CAP = 32
HOLDER_CHARS = 120
LOCK_ID_CHARS = 128
# The last second a datetime holds (9999-12-31T23:59:59Z): a claim dated later is no date.
LAST_EPOCH_S = 253_402_300_799
# What reading a claim written by anyone may raise (see coordinator.rules.lease.UNREADABLE).
_UNREADABLE = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError)


@dataclass(frozen=True, order=True)
class TurnClaim:
    """A waiting contender's claim on a turn of one cluster's lease.

    Waiters order themselves by when they began waiting, as that cluster's server saw
    it (the ``Date`` of their first read), ties broken by lock id; the oldest claim
    wins. ``seen`` is the server stamp the waiter refreshes while it waits, every
    ``every`` seconds (None: the claim carries none, and only the lease's own times
    bound it).
    """

    since: int
    lock_id: str
    holder: str = field(default="", compare=False)
    seen: int | None = field(default=None, compare=False)
    every: float | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, raw: Any) -> TurnClaim | None:
        if not isinstance(raw, str):
            return None
        try:
            doc = json.loads(raw)
        except _UNREADABLE:
            return None
        return cls.from_document(doc)

    @classmethod
    def from_document(cls, doc: Any) -> TurnClaim | None:
        """One claim as the annotation stores it; None when malformed (ignored, and
        overwritten by the next claim)."""
        if not isinstance(doc, dict):
            return None
        try:
            since, seen, every = doc["since"], doc.get("seen"), doc.get("every")
            if any(isinstance(t, float) and not math.isfinite(t) for t in (since, seen, every)):
                return None
            claim = cls(
                int(since),
                str(doc["lock"]),
                str(doc.get("holder") or ""),
                None if seen is None else int(seen),
                None if every is None else float(every),
            )
        except _UNREADABLE:
            return None
        if claim.every is not None and not 0 < claim.every <= MAX_EVERY_S:
            return None
        if not 0 < len(claim.lock_id) <= LOCK_ID_CHARS:
            return None
        stamps = [claim.since] if claim.seen is None else [claim.since, claim.seen]
        return claim if all(0 <= t <= LAST_EPOCH_S for t in stamps) else None

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"lock": self.lock_id, "holder": self.holder[:HOLDER_CHARS], "since": self.since}
        if self.seen is not None:
            doc["seen"] = self.seen
        if self.every is not None:
            doc["every"] = self.every
        return doc

    def dump(self) -> str:
        return json.dumps(self.document(), separators=(",", ":"))

    @property
    def refreshed(self) -> int:
        return self.since if self.seen is None else max(self.since, self.seen)

    def alive(self, now: float) -> bool:
        """Refreshed within twice its interval and STALE_SLACK_S of ``now`` (a server
        time), either way: a stamp far in the future is no refresh either. A claim
        without a stamp counts as alive: the lease's own times bound it (it binds while
        the lease is live, and for one turn after; the take that follows drops it)."""
        every = CLAIM_REFRESH_S if self.every is None else self.every
        return self.seen is None or abs(now - self.refreshed) <= 2 * every + STALE_SLACK_S


Line = tuple[TurnClaim, ...]


def same_line(a: Line, b: Line) -> bool:
    """The same waiters with the same stamps (claims compare by place in line only)."""
    return a == b and all((x.seen, x.every) == (y.seen, y.every) for x, y in zip(a, b, strict=True))


def parse_line(raw: Any) -> Line:
    """The waiters a ``coordinator.io/next`` annotation lists, in line order. Malformed
    entries are ignored; a lock id is listed once, and at most LINE_CAP waiters."""
    if not isinstance(raw, str):
        return ()
    try:
        doc = json.loads(raw)
    except _UNREADABLE:
        return ()
    if not isinstance(doc, dict):
        return ()
    after = doc.get("after")
    entries = [doc, *(after if isinstance(after, list) else [])]
    line: list[TurnClaim] = []
    for claim in sorted(c for e in entries if (c := TurnClaim.from_document(e)) is not None):
        if all(c.lock_id != claim.lock_id for c in line):
            line.append(claim)
    return tuple(line[:LINE_CAP])


def dump_line(line: Line) -> str:
    first, *after = line
    doc = first.document()
    if after:
        doc["after"] = [c.document() for c in after]
    return json.dumps(doc, separators=(",", ":"))


def latest_write(obj: dict[str, Any]) -> datetime | None:
    """The newest time the server stamped on any field manager's entry: a server time at
    or after the last write of the object."""
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    stamps = [t for e in entries if isinstance(e, dict) and (t := parse_time(e.get("time"))) is not None]
    return max(stamps) if stamps else None


def turns(view: LeaseView) -> tuple[list[TurnClaim], int, float | None]:
    """The waiters of ``view`` in the order they get turns, the index of the one whose
    turn it is (or was last), and the seconds its turn still binds (negative: over; None:
    unknown), by the Date hint. The holder's own claim is spent by holding."""
    waiting = [c for c in view.line if c.lock_id != view.lock_id]
    now = view.server_now.timestamp() if view.server_now is not None else None
    if not waiting or now is None:
        return waiting, 0, None
    if view.held:
        rem = view.remaining_s()
        if rem is None:
            return waiting, 0, None
        if rem > 0:
            return [c for c in waiting if c.alive(now)], 0, rem + HANDOFF_GRACE_S
        start = now + rem
    elif view.released is not None:
        start = view.released.timestamp()
    else:
        return waiting, 0, None
    alive = [c for c in waiting if c.alive(start)]
    k = min(len(alive) - 1, max(0, math.ceil((now - start) / HANDOFF_GRACE_S) - 1))
    return alive, k, start + (k + 1) * HANDOFF_GRACE_S - now


def joined(view: LeaseView, mine: TurnClaim) -> Line | None:
    """The line of ``view`` with ``mine`` listed in its place and refreshed, as the waiter
    writes it on a lease held by another; dead claims and the holder's own are dropped.
    None when there is nothing to write: ``mine`` is listed and its stamp is younger than
    its interval (or, without a Date, is listed at all) or the lease carries no newer
    stamp, or the line is full of waiters who began earlier."""
    if not 0 < len(mine.lock_id) <= LOCK_ID_CHARS:
        return None  # a lock id no line lists: this waiter does without a place
    now = view.server_now.timestamp() if view.server_now is not None else None
    others = [c for c in view.line if c.lock_id not in (mine.lock_id, view.lock_id) and (now is None or c.alive(now))]
    every = CLAIM_REFRESH_S if sum(1 for c in others if c < mine) < FRONT else BACK_REFRESH_S
    listed = next((c for c in view.line if c.lock_id == mine.lock_id), None)
    if listed is not None and (now is None or now - listed.refreshed < every):
        return None
    latest = latest_write(view.obj)
    stamps = [mine.since, listed.seen if listed else None, int(latest.timestamp()) if latest else None]
    seen = max(t for t in stamps if t is not None)
    if now is not None:
        seen = min(seen, int(now))  # a stamp ahead of the server's own Date is no refresh
    fresh = TurnClaim(mine.since, mine.lock_id, mine.holder, seen, every)
    line = tuple(sorted([*others, fresh])[:LINE_CAP])
    if fresh not in line or same_line(line, view.line):
        return None  # no room, or no newer stamp to refresh with
    return line


def after_take(view: LeaseView) -> Line:
    """The line a take of ``view`` leaves: without the previous holder's own claim
    (spent), the claims whose turn has passed and those that were dead when the turns
    began. The claim whose turn it is (the taker's, normally) and those after it stay,
    so that a take that does not win the lock leaves the turn as it was."""
    order, k, left = turns(view)
    if left is None:
        return tuple(c for c in view.line if c.lock_id != view.lock_id)
    bound = left > 0 if view.held else left >= 0
    return tuple(order[k:] if bound else order[k + 1 :])
