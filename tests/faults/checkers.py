"""Checkers that judge histories recorded by the fault-injection suite.

Everything here is pure logic: a test records what its clients did (with readings
of one machine-wide monotonic clock, e.g. ``time.monotonic()`` in one process, or
``CLOCK_MONOTONIC`` read by every process on the same machine) and hands the
records to a checker, which returns a :class:`CheckResult`.

Three checks:

:func:`check_mutual_exclusion`
    Lock histories. No two critical sections may overlap in time, and fencing
    tokens must strictly rise in entry order.

:func:`check_linearizable_register`
    A single read/write register (the replicated state document seen as one
    value). The history must be linearizable: there is one total order of the
    operations, consistent with real time, in which every read returns the value
    of the latest write before it. The search is the Wing & Gong backtracking
    search with the memoisation and "lifting" of Lowe / Porcupine, split at points
    of quiescence and bounded by a state budget.

:func:`check_no_lost_writes`
    A cheap, always-decidable diagnosis: no acknowledged write silently
    disappeared from the final value.

Times are plain numbers; two readings that are equal are treated as concurrent
(the clock could not tell them apart), which is the permissive choice.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

__all__ = [
    "FINAL_FROM_HISTORY",
    "CheckResult",
    "CriticalSection",
    "HistoryStats",
    "Operation",
    "Violation",
    "apply_breaks",
    "check_linearizable_register",
    "check_mutual_exclusion",
    "check_no_lost_writes",
    "history_stats",
    "section_from_marks",
]

OpKind = Literal["write", "read"]
OpStatus = Literal["ok", "fail", "unknown"]

_INFINITY = float("inf")


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Violation:
    """One thing a history did wrong.

    ``kind`` is a short stable tag that tests can assert on; ``message`` is the
    human-readable sentence.
    """

    kind: str
    message: str
    # Where in the history (machine-clock readings) to look when explaining it, if known.
    window: tuple[float, float] | None = None

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class CheckResult:
    """The verdict of one checker.

    ``ok`` is true only when the checker decided that the history is correct.
    ``undecided`` says why a checker gave up (its search budget ran out); such a
    result is neither a pass nor a proven violation.
    """

    check: str
    violations: tuple[Violation, ...] = ()
    undecided: str | None = None
    states_explored: int = 0
    segments: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations and self.undecided is None

    @property
    def decided(self) -> bool:
        return self.undecided is None

    @property
    def messages(self) -> list[str]:
        return [v.message for v in self.violations]

    @property
    def kinds(self) -> list[str]:
        return [v.kind for v in self.violations]

    def summary(self) -> str:
        if self.ok:
            return f"{self.check}: ok"
        if not self.violations:
            return f"{self.check}: undecided: {self.undecided}"
        lines = [f"{self.check}: {len(self.violations)} violation(s)"]
        lines += [f"  - {v.message}" for v in self.violations]
        if self.undecided is not None:
            lines.append(f"  undecided: {self.undecided}")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        """Raise AssertionError with the summary unless the history passed."""
        if not self.ok:
            raise AssertionError(self.summary())


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "?"
    if t == _INFINITY:
        return "∞"
    return f"{t:g}"


# --------------------------------------------------------------------- mutual exclusion


@dataclass(frozen=True)
class CriticalSection:
    """One stay of one process inside the lock's critical section.

    ``enter`` is a clock reading taken once the process believed it held the lock;
    ``exit`` one taken before it released it. ``exit`` is None when the process
    never came out (it was killed, or the run ended while it was inside).
    ``last_alive`` is, for such a process, the last reading at which it could still
    have renewed its lease (typically when the harness killed it); it is only
    used together with the ``ttl`` of :func:`check_mutual_exclusion`.
    """

    process: str
    token: int
    enter: float
    exit: float | None = None
    last_alive: float | None = None
    # Entered while an operator's break was under way (see apply_breaks): its lock may
    # have been broken before it entered, so when it entered says nothing of when its
    # token was given out, and it is left out of the rising-token order.
    unordered: bool = False

    def describe(self) -> str:
        return f"{self.process} (token {self.token}, [{_fmt_time(self.enter)}, {_fmt_time(self.exit)}])"


def _to_section(record: CriticalSection | Mapping[str, Any]) -> CriticalSection:
    if isinstance(record, CriticalSection):
        section = record
    else:
        try:
            section = CriticalSection(
                process=str(record["process"]),
                token=int(record["token"]),
                enter=float(record["enter"]),
                exit=None if record.get("exit") is None else float(record["exit"]),
                last_alive=(None if record.get("last_alive") is None else float(record["last_alive"])),
                unordered=bool(record.get("unordered", False)),
            )
        except KeyError as exc:
            raise ValueError(f"critical-section record {record!r} lacks {exc.args[0]!r}") from exc
    if section.exit is not None and section.exit < section.enter:
        raise ValueError(f"critical section {section.describe()} exits before it enters")
    if section.last_alive is not None and section.last_alive < section.enter:
        raise ValueError(f"critical section {section.describe()} was last alive before it entered")
    return section


def check_mutual_exclusion(
    sections: Iterable[CriticalSection | Mapping[str, Any]],
    *,
    ttl: float | None = None,
) -> CheckResult:
    """Check that critical sections never overlap and fencing tokens strictly rise.

    Each record is a :class:`CriticalSection` or a mapping with the keys
    ``process``, ``token``, ``enter``, ``exit`` (and optionally ``last_alive``).

    Sections are half-open intervals ``[enter, exit)``: one that starts at the very
    reading another one ended at does not overlap it.

    A section whose ``exit`` is None (its process died inside it) is taken to last:

    - without ``ttl``: until the end of the history, so it overlaps every section
      entered after it (the conservative choice);
    - with ``ttl``: until its lease provably expired, ``(last_alive or enter) +
      ttl``. ``ttl`` should include the lock's clock-drift allowance. When
      ``last_alive`` is missing, ``enter`` is used, which is only right for a
      holder that never renews its lease; record ``last_alive`` for one that does.

    Fencing tokens: ordering the sections by ``enter``, each token must be strictly
    greater than every token that entered before it; an equal token is reported
    as a reused token. Sections marked ``unordered`` (entered during an operator's
    break) are left out of the order but not of the reuse check.
    """
    items = sorted((_to_section(r) for r in sections), key=lambda s: (s.enter, s.token))
    violations: list[Violation] = []
    if not items:
        return CheckResult(check="mutual exclusion")

    def ends_at(s: CriticalSection) -> float:
        if s.exit is not None:
            return s.exit
        if ttl is not None:
            start = s.last_alive if s.last_alive is not None else s.enter
            return start + ttl
        return _INFINITY  # still inside when the history ended

    def describe_end(s: CriticalSection) -> str:
        if s.exit is not None:
            return ""
        if ttl is not None:
            return f"; it never exited, so its lease ran until {_fmt_time(ends_at(s))}"
        return "; it never exited, so it is taken to hold the lock until the end"

    # Sweep in entry order: every later section that enters before this one ends
    # overlaps it.
    for i, a in enumerate(items):
        a_end = ends_at(a)
        for j in range(i + 1, len(items)):
            b = items[j]
            if b.enter >= a_end:
                break
            violations.append(
                Violation(
                    kind="overlap",
                    message=(
                        f"critical sections overlap: {b.describe()} entered at "
                        f"{_fmt_time(b.enter)} while {a.describe()} was still inside"
                        f"{describe_end(a)}"
                    ),
                    window=(a.enter, b.enter),
                )
            )

    ordered = [s for s in items if not s.unordered]
    for s in items:
        if s.unordered and any(o.token == s.token and o is not s for o in items):
            violations.append(
                Violation(
                    kind="token-reused",
                    message=f"fencing token {s.token} was reused: {s.describe()} has the token of another section",
                )
            )
    if not ordered:
        return CheckResult(check="mutual exclusion", violations=tuple(violations))
    highest = ordered[0]
    for s in ordered[1:]:
        if s.token == highest.token:
            violations.append(
                Violation(
                    kind="token-reused",
                    message=(
                        f"fencing token {s.token} was reused: {s.describe()} entered after "
                        f"{highest.describe()} with the same token"
                    ),
                )
            )
        elif s.token < highest.token:
            violations.append(
                Violation(
                    kind="token-not-rising",
                    message=(
                        f"fencing token went down: {s.describe()} entered after {highest.describe()} with a lower token"
                    ),
                )
            )
        else:
            highest = s
    return CheckResult(check="mutual exclusion", violations=tuple(violations))


# ------------------------------------------------------------------ register histories


@dataclass(frozen=True)
class Operation:
    """One client operation on the register.

    ``value`` is what a write wrote, or what a read returned. ``status``:

    - ``ok``: it completed at ``complete`` (a reading after ``invoke``);
    - ``fail``: it definitely did not take effect (dropped from the history);
    - ``unknown``: it may or may not have taken effect, at any time after
      ``invoke`` (a timeout, a lost connection). ``complete`` is ignored.

    Values are compared with ``==``; dicts, lists and sets are compared by content.
    """

    process: str
    kind: OpKind
    value: Any
    invoke: float
    complete: float | None = None
    status: OpStatus = "ok"

    def describe(self) -> str:
        verb = "write" if self.kind == "write" else "read"
        end = "?" if self.status == "unknown" else _fmt_time(self.complete)
        note = "" if self.status == "ok" else f", {self.status}"
        return f"{verb} {self.value!r} by {self.process} [{_fmt_time(self.invoke)}, {end}{note}]"


def _to_operation(record: Operation | Mapping[str, Any]) -> Operation:
    if isinstance(record, Operation):
        op = record
    else:
        try:
            complete = record.get("complete")
            op = Operation(
                process=str(record["process"]),
                kind=record["kind"],
                value=record.get("value"),
                invoke=float(record["invoke"]),
                complete=None if complete is None else float(complete),
                status=record.get("status", "ok"),
            )
        except KeyError as exc:
            raise ValueError(f"operation record {record!r} lacks {exc.args[0]!r}") from exc
    if op.kind not in ("write", "read"):
        raise ValueError(f"operation {op!r}: kind must be 'write' or 'read'")
    if op.status not in ("ok", "fail", "unknown"):
        raise ValueError(f"operation {op!r}: status must be 'ok', 'fail' or 'unknown'")
    if op.status == "ok":
        if op.complete is None:
            raise ValueError(f"operation {op.describe()} is ok but has no completion time")
        if op.complete < op.invoke:
            raise ValueError(f"operation {op.describe()} completes before it is invoked")
    return op


def _freeze(value: Any) -> Hashable:
    """A hashable stand-in for a value, equal for equal contents."""
    if isinstance(value, Mapping):
        return ("__map__", frozenset((_freeze(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("__seq__", tuple(_freeze(v) for v in value))
    if isinstance(value, set | frozenset):
        return ("__set__", frozenset(_freeze(v) for v in value))
    return cast(Hashable, value)


@dataclass(eq=False)
class _Op:
    """An operation prepared for the search."""

    source: Operation
    is_write: bool
    value: Hashable
    start: float
    end: float  # the latest time it may be linearized at
    optional: bool  # may be left out altogether (an unknown write)
    bit: int = 0


@dataclass(eq=False)
class _Entry:
    op: _Op
    is_call: bool
    time: float
    prev: _Entry | None = None
    next: _Entry | None = None
    match: _Entry | None = None  # the call's return entry, and the other way round


def _impossible_reads(ops: list[Operation], initial: Hashable) -> list[Violation]:
    """Reads that no ordering can explain, named precisely."""
    written: dict[Hashable, list[Operation]] = {}
    for op in ops:
        if op.kind == "write":
            written.setdefault(_freeze(op.value), []).append(op)
    found: list[Violation] = []
    for op in ops:
        if op.kind != "read" or op.status != "ok":
            continue
        value = _freeze(op.value)
        if value == initial:
            continue
        writers = written.get(value, [])
        live = [w for w in writers if w.status != "fail"]
        assert op.complete is not None
        if not writers:
            found.append(
                Violation(
                    kind="read-of-unwritten-value",
                    message=(
                        f"{op.describe()} returned a value that no write ever wrote and that is not the initial value"
                    ),
                )
            )
        elif not live:
            found.append(
                Violation(
                    kind="read-of-failed-write",
                    message=(
                        f"{op.describe()} returned a value written only by a write that "
                        f"failed ({writers[0].describe()}), i.e. that was not applied"
                    ),
                )
            )
        elif all(w.invoke > op.complete for w in live):
            found.append(
                Violation(
                    kind="read-from-the-future",
                    message=(
                        f"{op.describe()} returned a value first written only after the "
                        f"read had completed ({live[0].describe()})"
                    ),
                )
            )
    return found


def _prepare(ops: list[Operation]) -> list[_Op]:
    """Drop what cannot matter and give every operation its linearization window.

    - failed operations never happened;
    - a read that failed or whose outcome is unknown returned nothing to check;
    - an unknown write is optional. Linearizing it after the last read that
      returned its value is never needed (nothing would observe it, and leaving it
      out is allowed), so its window ends there; with no such read it is dropped.
      This keeps every window finite, so the history still splits at quiescence.
    """
    read_ends: dict[Hashable, list[float]] = {}
    for op in ops:
        if op.kind == "read" and op.status == "ok":
            assert op.complete is not None
            read_ends.setdefault(_freeze(op.value), []).append(op.complete)
    prepared: list[_Op] = []
    for op in ops:
        if op.status == "fail" or (op.kind == "read" and op.status != "ok"):
            continue
        value = _freeze(op.value)
        if op.status == "unknown":
            ends = [t for t in read_ends.get(value, []) if t >= op.invoke]
            if not ends:
                continue
            prepared.append(_Op(op, True, value, op.invoke, max(ends), optional=True))
        else:
            assert op.complete is not None
            prepared.append(_Op(op, op.kind == "write", value, op.invoke, op.complete, False))
    return prepared


def _segments(ops: list[_Op]) -> list[list[_Op]]:
    """Split at points of quiescence: where every earlier window has closed before
    the next operation starts. Segments can then be searched one after another."""
    ordered = sorted(ops, key=lambda o: (o.start, o.end))
    segments: list[list[_Op]] = []
    current: list[_Op] = []
    horizon = -_INFINITY
    for op in ordered:
        if current and horizon < op.start:
            segments.append(current)
            current = []
        current.append(op)
        horizon = max(horizon, op.end)
    if current:
        segments.append(current)
    return segments


def _max_concurrency(ops: list[_Op]) -> int:
    events = sorted([(o.start, 0) for o in ops] + [(o.end, 1) for o in ops])
    live = best = 0
    for _, kind in events:
        live += 1 if kind == 0 else -1
        best = max(best, live)
    return best


class _BudgetExceeded(Exception):
    pass


@dataclass
class _SearchStats:
    states: int = 0
    max_states: int = 0
    deadline: float | None = None
    best_depth: int = -1
    best_value: Hashable = None
    best_remaining: list[_Op] = field(default_factory=list)


def _lift(entry: _Entry) -> None:
    """Take an operation's call and return entries out of the list."""
    ret = entry.match
    assert entry.prev is not None and ret is not None and ret.prev is not None
    entry.prev.next = entry.next
    if entry.next is not None:
        entry.next.prev = entry.prev
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(entry: _Entry) -> None:
    """Put them back (in reverse order of _lift)."""
    ret = entry.match
    assert entry.prev is not None and ret is not None and ret.prev is not None
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    entry.prev.next = entry
    if entry.next is not None:
        entry.next.prev = entry


class _SegmentSearch:
    """Depth-first search over "which operation takes effect next" in one segment.

    A configuration is (set of operations already linearized, register value); the
    future only depends on it, so each one is explored at most once (Lowe's
    memoisation). Linearized operations are lifted out of a time-ordered list of
    call and return entries, so candidates are always the calls that come before
    the first remaining return (Porcupine's formulation of Wing & Gong).
    """

    def __init__(self, ops: list[_Op], stats: _SearchStats) -> None:
        self.ops = ops
        self.stats = stats
        for index, op in enumerate(ops):
            op.bit = 1 << index
        entries: list[_Entry] = []
        for op in ops:
            call = _Entry(op, True, op.start)
            ret = _Entry(op, False, op.end)
            call.match, ret.match = ret, call
            entries += [call, ret]
        # Equal readings: calls before returns, so such operations count as concurrent.
        entries.sort(key=lambda e: (e.time, 0 if e.is_call else 1))
        self.head = _Entry(ops[0], True, -_INFINITY)  # sentinel; its op is never used
        prev = self.head
        for e in entries:
            prev.next, e.prev = e, prev
            prev = e
        self.all_bits = (1 << len(ops)) - 1
        self.seen: set[tuple[int, Hashable]] = set()
        self.mask = 0
        self.value: Hashable = None
        # (entry moved on, value before the move, True if the move applied the op
        # rather than leaving an optional op out)
        self.stack: list[tuple[_Entry, Hashable, bool]] = []

    def visit(self, mask: int, value: Hashable) -> bool:
        """Record a new configuration; False if it was explored already."""
        key = (mask, value)
        if key in self.seen:
            return False
        self.seen.add(key)
        stats = self.stats
        stats.states += 1
        if stats.states > stats.max_states:
            raise _BudgetExceeded(f"more than {stats.max_states} states")
        if stats.deadline is not None and stats.states % 1024 == 0:
            if time.monotonic() > stats.deadline:
                raise _BudgetExceeded(f"the time budget ({stats.states} states)")
        depth = mask.bit_count()
        if depth > stats.best_depth:
            stats.best_depth = depth
            stats.best_value = value
            stats.best_remaining = [o for o in self.ops if not mask & o.bit]
        return True

    def move(self, entry: _Entry, new_value: Hashable, applied: bool) -> None:
        self.stack.append((entry, self.value, applied))
        self.mask |= entry.op.bit
        self.value = new_value
        call = entry if entry.is_call else entry.match
        assert call is not None
        _lift(call)

    def backtrack(self) -> _Entry | None:
        """Undo moves until one has an untried alternative; None when exhausted."""
        while self.stack:
            moved, before, applied = self.stack.pop()
            self.value = before
            self.mask &= ~moved.op.bit
            call = moved if moved.is_call else moved.match
            assert call is not None
            _unlift(call)
            if applied:
                return moved.next  # try the next candidate after this call
            # Leaving an op out was the last choice at its deadline: keep undoing.
        return None

    def run(self, start_values: list[Hashable], *, collect_all: bool) -> set[Hashable]:
        """The values the segment can end with, from any of the start values.

        When ``collect_all`` is false, stop at the first complete linearization.
        """
        ends: set[Hashable] = set()
        for start in start_values:
            if not self.visit(0, start):
                continue
            self.mask, self.value = 0, start
            entry: _Entry | None = self.head.next
            while True:
                if self.mask == self.all_bits:
                    ends.add(self.value)
                    if not collect_all:
                        return ends
                    entry = self.backtrack()
                elif entry is None:
                    entry = self.backtrack()
                elif entry.is_call:
                    op = entry.op
                    new_value = op.value if op.is_write else self.value
                    legal = op.is_write or op.value == self.value
                    if legal and self.visit(self.mask | op.bit, new_value):
                        self.move(entry, new_value, applied=True)
                        entry = self.head.next
                    else:
                        entry = entry.next
                elif entry.op.optional and self.visit(self.mask | entry.op.bit, self.value):
                    # The deadline of an op not yet linearized: it must have taken
                    # effect by now, unless it is optional and is left out.
                    self.move(entry, self.value, applied=False)
                    entry = self.head.next
                else:
                    entry = self.backtrack()
                if entry is None and not self.stack and self.mask != self.all_bits:
                    break
        return ends


def _describe_values(values: Iterable[Hashable]) -> str:
    return ", ".join(sorted(repr(v) for v in values))


def check_linearizable_register(
    history: Iterable[Operation | Mapping[str, Any]],
    *,
    initial: Any = None,
    max_states: int = 500_000,
    timeout: float | None = None,
) -> CheckResult:
    """Check that a history of reads and writes on one register is linearizable.

    Each record is an :class:`Operation` or a mapping with the keys ``process``,
    ``kind`` (``write``/``read``), ``value``, ``invoke``, ``complete`` and
    ``status`` (``ok``/``fail``/``unknown``, default ``ok``). ``initial`` is the
    register's value before the history.

    Failed operations are dropped. An unknown write may take effect at any time
    after its invoke, or never (its completion is +infinity and it may be left
    out). Reads that failed or timed out carry no information and are dropped.

    The history is split at points of quiescence (no operation in flight) and the
    segments are searched in order, carrying the set of values the register may
    hold across each split. The search stops with an *undecided* result, rather
    than running on, once it has explored ``max_states`` configurations in total
    or ``timeout`` seconds have passed.
    """
    ops = [_to_operation(r) for r in history]
    frozen_initial = _freeze(initial)

    impossible = _impossible_reads(ops, frozen_initial)
    if impossible:
        return CheckResult(check="linearizability", violations=tuple(impossible))

    segments = _segments(_prepare(ops))
    stats = _SearchStats(
        max_states=max_states,
        deadline=None if timeout is None else time.monotonic() + timeout,
    )
    possible: set[Hashable] = {frozen_initial}
    for number, segment in enumerate(segments, start=1):
        stats.best_depth = -1
        first = min(o.start for o in segment)
        last = max(o.end for o in segment)
        where = (
            f"segment {number} of {len(segments)} ([{_fmt_time(first)}, {_fmt_time(last)}], {len(segment)} operations)"
        )
        starts = sorted(possible, key=repr)
        try:
            possible = _SegmentSearch(segment, stats).run(starts, collect_all=number < len(segments))
        except _BudgetExceeded as exc:
            return CheckResult(
                check="linearizability",
                undecided=(
                    f"the search gave up in {where} after exploring {exc} "
                    f"(up to {_max_concurrency(segment)} operations in flight at once); "
                    "raise max_states/timeout or check a shorter history"
                ),
                states_explored=stats.states,
                segments=len(segments),
            )
        if not possible:
            stuck = sorted(stats.best_remaining, key=lambda o: (o.end, o.start))
            shown = "; ".join(o.source.describe() for o in stuck[:5])
            more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
            message = (
                f"history is not linearizable in {where}: starting from "
                f"{_describe_values(starts)}"
                f", at most {max(stats.best_depth, 0)} operations could be put in a "
                f"valid order (register then holding {stats.best_value!r}); none of these "
                f"could take effect next: {shown}{more}"
            )
            return CheckResult(
                check="linearizability",
                violations=(Violation(kind="not-linearizable", message=message),),
                states_explored=stats.states,
                segments=len(segments),
            )
    return CheckResult(check="linearizability", states_explored=stats.states, segments=len(segments))


# ------------------------------------------------------------------------ lost writes


class _FinalFromHistory:
    def __repr__(self) -> str:
        return "FINAL_FROM_HISTORY"


FINAL_FROM_HISTORY: Any = _FinalFromHistory()
"""Default of ``final_value``: take it from the history's last read."""


def check_no_lost_writes(
    history: Iterable[Operation | Mapping[str, Any]],
    *,
    final_value: Any = FINAL_FROM_HISTORY,
    initial: Any = None,
) -> CheckResult:
    """Check that no acknowledged write silently vanished.

    ``final_value`` is the register's value once everything settled. By default it
    is the value of the history's last successful read, which must have been
    invoked after every acknowledged write completed (else ValueError).

    The final value names the last write that took effect: a write (that did not
    fail) of that value, or none when it is the initial value. So an acknowledged
    write ``w`` of another value is *lost* unless some write of the final value could
    have taken effect after ``w`` did: one whose outcome is ``unknown`` (it may land
    at any time after it was invoked), or an acknowledged one that had not completed
    before ``w`` was invoked. Writes of other values excuse nothing, whatever their
    outcome: none of them is the last one. (An earlier version let any unknown write
    anywhere excuse every lost write; a final read returning a value acknowledged
    before a later acknowledged write then passed.) Values are meant to be unique;
    with repeated values every write of the final value is a candidate.

    Also, the final value must be the initial value or the value of a write that did
    not fail.

    This is weaker than linearizability (which, given the final read in the
    history, implies it) but it never needs a search, so it still speaks when
    :func:`check_linearizable_register` is undecided.
    """
    ops = [_to_operation(r) for r in history]
    writes = [op for op in ops if op.kind == "write"]
    acked = [w for w in writes if w.status == "ok"]

    if final_value is FINAL_FROM_HISTORY:
        reads = [op for op in ops if op.kind == "read" and op.status == "ok"]
        if not reads:
            raise ValueError("no successful read in the history to take the final value from")
        final_read = max(reads, key=lambda r: (r.invoke, r.complete or 0.0))
        late = [w for w in acked if w.complete is not None and w.complete >= final_read.invoke]
        if late:
            raise ValueError(
                f"the last read ({final_read.describe()}) does not follow every acknowledged "
                f"write (e.g. {late[0].describe()}); pass final_value explicitly"
            )
        final = _freeze(final_read.value)
        shown_final = final_read.value
    else:
        final = _freeze(final_value)
        shown_final = final_value

    violations: list[Violation] = []
    last_writers = [w for w in writes if w.status != "fail" and _freeze(w.value) == final]
    if final != _freeze(initial) and not last_writers:
        violations.append(
            Violation(
                kind="final-value-unwritten",
                message=(
                    f"the final value {shown_final!r} is neither the initial value nor the "
                    "value of any write that did not fail"
                ),
            )
        )

    for w in acked:
        if _freeze(w.value) == final:
            continue
        if not any(f.status == "unknown" or (f.complete or 0.0) >= w.invoke for f in last_writers):
            if last_writers:
                why = "every write of that value was acknowledged before it was invoked"
            else:
                why = "no write of that value could have overwritten it"
            violations.append(
                Violation(
                    kind="lost-write",
                    message=f"acknowledged {w.describe()} was lost: the final value is {shown_final!r} and {why}",
                )
            )
    return CheckResult(check="no lost writes", violations=tuple(violations))


# ---------------------------------------------------------------- history measures


@dataclass(frozen=True)
class HistoryStats:
    """How hard a register history was to judge."""

    max_in_flight: int
    reads_overlapping_writes: int
    unknown_writes: int
    unknown_writes_observed: int

    def summary(self) -> str:
        return (
            f"history: at most {self.max_in_flight} ops in flight, {self.reads_overlapping_writes} reads "
            f"overlapped a write, {self.unknown_writes_observed} of {self.unknown_writes} unknown writes later read"
        )


def history_stats(history: Iterable[Operation | Mapping[str, Any]]) -> HistoryStats:
    """Measure a register history: the most operations in flight at once, successful
    reads whose interval overlapped some write's, and writes of unknown outcome whose
    value some successful read returned."""
    ops = [_to_operation(r) for r in history]

    def end(op: Operation) -> float:
        if op.complete is None:
            return _INFINITY
        return op.complete

    # In flight: from invoke to completion, for every operation that was seen to end
    # (also failed ones: they were sent). One whose client died is left out here, or
    # every SIGKILL of a long run would add one for ever.
    points: list[tuple[float, int]] = []
    for op in ops:
        if op.complete is not None:
            points.append((op.invoke, 1))
            points.append((op.complete, -1))
    # At equal readings ends come first: equal readings are not counted as overlapping.
    points.sort(key=lambda p: (p[0], p[1]))
    most = level = 0
    for _, step in points:
        level += step
        most = max(most, level)

    writes = [op for op in ops if op.kind == "write" and op.status != "fail"]
    reads = [op for op in ops if op.kind == "read" and op.status == "ok"]
    overlapping = sum(1 for r in reads if any(w.invoke < end(r) and r.invoke < end(w) for w in writes))
    seen = {_freeze(r.value) for r in reads}
    unknown = [w for w in writes if w.status == "unknown"]
    observed = sum(1 for w in unknown if _freeze(w.value) in seen)
    return HistoryStats(most, overlapping, len(unknown), observed)


# ----------------------------------------------------------- breaks and process trees


def apply_breaks(
    sections: Iterable[Mapping[str, Any]],
    breaks: Iterable[tuple[float, float]],
) -> list[dict[str, Any]]:
    """Cut lock sections at operator breaks, for :func:`check_mutual_exclusion`.

    ``lock break`` is an operator taking the lock away from a live holder: from the
    break on, the holder no longer holds it, even before it notices, and a new holder
    may enter. Each break is ``(invoked, completed)`` of a ``lock break`` that
    succeeded; it took effect somewhere in between. Every section that entered before
    the break completed and was still inside when it was invoked ends, for the check,
    at ``max(enter, invoked)`` (``how`` becomes ``broken``). Overlaps before the break
    was invoked are still overlaps, and sections that entered after it completed are
    untouched; only the window of the break itself is given up. Fencing must still
    refuse the broken holder's later writes: that is judged on the register.

    A section may carry ``held_from``: when a majority of the leases first carried its
    lock, as the servers held them (the simulator knows it). A section that entered after
    a break completed, whose lock was so held before the break completed, counts as
    entered at ``held_from``: its acquisition and the break were concurrent, the take may
    be ordered before the break, and the break then ended it. From ``held_from`` to the
    break it is judged like any section (another holder inside then is an overlap). An
    acquisition that never held a majority at one instant has no ``held_from`` and no
    such excuse.
    """
    spans = sorted((float(a), float(b)) for a, b in breaks)
    out: list[dict[str, Any]] = []
    for record in sections:
        s = dict(record)
        enter = float(s["enter"])
        held_from = float(s.get("held_from", enter))
        if held_from < enter and any(held_from < completed <= enter for _, completed in spans):
            enter = held_from
            s["enter"] = held_from
        exit_ = _INFINITY if s.get("exit") is None else float(s["exit"])
        for invoked, completed in spans:
            if enter < completed and exit_ > invoked:
                cut = max(enter, invoked)
                if cut < exit_:
                    exit_ = cut
                    s["exit"] = cut
                    s["how"] = "broken"
                if enter >= invoked:
                    s["unordered"] = True
        out.append(s)
    return out


@dataclass(frozen=True)
class TreeSection:
    """A critical section that was a process tree: when its first process started and
    when its last one was last seen alive, from the marks the processes wrote."""

    token: int | None
    enter: float
    exit: float
    processes: int


def section_from_marks(lines: Iterable[str], resolution: float = 0.01) -> TreeSection | None:
    """Read a process tree's marks: lines ``PID WHAT READING`` (``WHAT``: ``token``
    with the fencing token as its reading, or ``start``/``tick``/``end`` with a reading
    of the machine clock). The section runs from the first reading to the last one plus
    ``resolution`` (a reading truncated to centiseconds, as ``/proc/uptime`` gives it,
    may be up to that much early). A tree that wrote no reading returns None; lines
    that do not parse are skipped (a process killed mid-write leaves a partial one)."""
    token: int | None = None
    first = last = None
    pids: set[str] = set()
    for line in lines:
        parts = line.split()
        if len(parts) != 3:
            continue
        pid, what, reading = parts
        try:
            if what == "token":
                token = int(reading)
                continue
            t = float(reading)
        except ValueError:
            continue
        if what not in ("start", "tick", "end"):
            continue
        pids.add(pid)
        first = t if first is None else min(first, t)
        last = t if last is None else max(last, t)
    if first is None or last is None:
        return None
    return TreeSection(token, first, last + resolution, len(pids))
