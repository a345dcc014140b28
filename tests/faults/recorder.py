"""The histories: contenders' events collected into lock sections and register
operations, and the report of a run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faults.clock import machine_clock

if TYPE_CHECKING:
    from faults.checkers import CheckResult, HistoryStats


# ------------------------------------------------------------------------ histories


@dataclass
class _Section:
    process: str
    mode: str
    token: int
    enter: float
    valid_until: float
    exit: float | None = None
    how: str = ""  # left | clipped (stayed past validity) | killed | vanished | tree | broken


class Recorder:
    """Collects the contenders' events into lock sections and register operations.

    Thread-safe: one reader thread per contender feeds it.
    """

    def __init__(self, event_log: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._log = event_log.open("a") if event_log is not None else None
        self.sections: list[_Section] = []
        self.inside: dict[str, _Section] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.in_flight: dict[str, set[str]] = {}
        self.problems: list[str] = []
        self.stats: Counter[str] = Counter()
        self.modes: dict[str, str] = {}
        self.lruns: dict[str, dict[str, Any]] = {}  # instance -> the `lock run` it is in
        self.breaks: list[tuple[float, float]] = []  # successful `lock break`s: (invoked, completed)
        self.last_enter: float | None = None  # when the latest section began (machine clock)

    def handle(self, instance: str, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        with self._lock:
            if self._log is not None:
                self._log.write(json.dumps({"instance": instance, "at": machine_clock(), **event}) + "\n")
                self._log.flush()
            try:
                self._handle(instance, kind, event)
            except (KeyError, TypeError, ValueError) as err:
                self.problems.append(f"{instance}: malformed event {event!r}: {err}")

    def _handle(self, instance: str, kind: Any, event: dict[str, Any]) -> None:
        if kind == "start":
            self.modes[instance] = str(event.get("mode"))
        elif kind == "enter":
            self.inside[instance] = _Section(
                instance,
                self.modes.get(instance, "?"),
                int(event["token"]),
                float(event["t"]),
                float(event["valid_until"]),
            )
            self.last_enter = machine_clock()
        elif kind == "valid":
            renewed = self.inside.get(instance)
            if renewed is not None:
                renewed.valid_until = max(renewed.valid_until, float(event["valid_until"]))
        elif kind == "exit":
            left = self.inside.pop(instance, None)
            if left is not None:
                left.exit = max(left.enter, float(event["t"]))
                left.how = "clipped" if event.get("overstay") else "left"
                self.sections.append(left)
        elif kind == "invoke":
            op_id = str(event["op"])
            self.ops[op_id] = {
                "process": instance,
                "kind": str(event["kind"]),
                "value": event.get("value"),
                "invoke": float(event["t"]),
                "complete": None,
                "status": "unknown",
            }
            self.in_flight.setdefault(instance, set()).add(op_id)
        elif kind == "complete":
            op_id = str(event["op"])
            op = self.ops[op_id]
            op["status"] = str(event["status"])
            op["complete"] = float(event["t"])
            if op["kind"] == "read":
                op["value"] = event.get("value")
            self.in_flight.get(instance, set()).discard(op_id)
            self.stats[f"{self.modes.get(instance, '?')} {op['kind']} {op['status']}"] += 1
        elif kind == "tree":
            t_in, t_out = float(event["enter"]), float(event["exit"])
            tree = _Section(instance, "run", int(event["token"]), t_in, t_out, max(t_in, t_out), "tree")
            self.sections.append(tree)
            self.stats[f"run tree of {int(event['processes'])} processes"] += 1
        elif kind == "lrun":
            self.lruns[instance] = {
                "pid": int(event["pid"]),
                "marks": str(event["marks"]),
                "ticks": int(event["ticks"]),
            }
        elif kind == "lrun_end":
            self.lruns.pop(instance, None)
        elif kind == "problem":
            self.problems.append(f"{instance}: {event.get('what')}: {event.get('detail')}")
        elif kind == "stat":
            self.stats[str(event["name"])] += 1

    def gone(self, instance: str, when: float, how: str) -> None:
        """The contender died (``how``: killed | vanished): close what it had open."""
        with self._lock:
            section = self.inside.pop(instance, None)
            if section is not None:
                section.exit = max(section.enter, min(when, section.valid_until))
                section.how = how
                self.sections.append(section)
            for op_id in self.in_flight.pop(instance, set()):
                op = self.ops[op_id]
                op["status"], op["complete"] = "unknown", None
                self.stats[f"{self.modes.get(instance, '?')} {op['kind']} unknown ({how})"] += 1

    def add_op(self, op: dict[str, Any]) -> None:
        with self._lock:
            self.ops[f"{op['process']}:{len(self.ops)}"] = op

    def holders_inside(self) -> list[str]:
        with self._lock:
            return list(self.inside)

    def entered_within(self, seconds: float, since: float) -> bool:
        """Whether someone is inside now, or a section began less than ``seconds`` ago and
        not before ``since``: the lock is being handed on, not blocked (by a tombstone, a
        dead holder's lease)."""
        with self._lock:
            if self.inside:
                return True
            last = self.last_enter
            return last is not None and last >= since and machine_clock() - last < seconds

    def trees_running(self) -> dict[str, dict[str, Any]]:
        """``lock run``s whose tree has started (it wrote a mark): the lock is held."""
        with self._lock:
            runs = dict(self.lruns)
        started = {}
        for instance, run in runs.items():
            with contextlib.suppress(OSError):
                if " start " in Path(run["marks"]).read_text():
                    started[instance] = run
        return started

    def add_break(self, invoked: float, completed: float) -> None:
        with self._lock:
            self.breaks.append((invoked, completed))

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None


# ---------------------------------------------------------------------------- report


@dataclass
class Report:
    """What happened, and the verdict."""

    sections: list[dict[str, Any]]
    operations: list[dict[str, Any]]
    faults: Counter[str]
    checks: list[CheckResult]
    problems: list[str]
    stats: Counter[str]
    seconds: float = 0.0
    seed: int = 0
    clusters: int = 0
    workdir: Path | None = None
    kinds: Sequence[str] = ()
    min_each: int = 0
    breaks: int = 0
    workload_seconds: float = 0.0
    ha: str = ""  # HA clusters: what their front proxies counted
    members: str = ""  # the member set at the end, when it changed
    # For explaining a violation: the progress notes (machine clock, text), when the run
    # began (machine clock), wall clock minus machine clock, the sandbox's audit logs.
    notes: Sequence[tuple[float, str]] = ()
    started: float = 0.0
    wall_offset: float = 0.0
    audit_logs: Path | None = None

    @property
    def kinds_short(self) -> list[str]:
        """Fault kinds injected fewer times than asked for."""
        return [k for k in self.kinds if self.faults[k] < self.min_each]

    def history(self) -> HistoryStats:
        from faults.checkers import history_stats

        return history_stats(self.operations)

    @property
    def violations(self) -> list[str]:
        found = [v.message for c in self.checks for v in c.violations]
        return found + self.problems

    @property
    def undecided(self) -> list[str]:
        return [f"{c.check}: {c.undecided}" for c in self.checks if c.undecided]

    @property
    def passed(self) -> bool:
        return not self.violations and not self.undecided and not self.kinds_short

    def summary_line(self) -> str:
        kinds = list(self.kinds) or sorted(self.faults)
        per_kind = ", ".join(f"{k} {self.faults[k]}" for k in kinds)
        return (
            f"{len(self.sections)} lock sections, {len(self.operations)} state ops, "
            f"{sum(self.faults.values())} faults injected ({per_kind}), {len(self.violations)} violations"
        )

    def render(self) -> str:
        how = Counter(str(s["how"]) for s in self.sections)
        modes = Counter(str(s["mode"]) for s in self.sections)
        ops = Counter(f"{o['kind']} {o['status']}" for o in self.operations)
        lines = [
            f"seed {self.seed}, {self.clusters} clusters, {self.seconds:.0f}s of workload",
            "lock sections: "
            + ", ".join(f"{k} {v}" for k, v in sorted(modes.items()))
            + "; ended by "
            + ", ".join(f"{k} {v}" for k, v in sorted(how.items())),
            "state ops: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())),
            "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())),
            "contender outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())),
            self.history().summary(),
        ]
        if self.workload_seconds > 0:
            per_minute = len(self.sections) / (self.workload_seconds / 60.0)
            enters = sorted(float(s["enter"]) for s in self.sections)
            gap = max((b - a for a, b in itertools.pairwise(enters)), default=0.0)
            lines.append(
                f"throughput: {per_minute:.1f} lock sections per minute over {self.workload_seconds:.0f}s "
                f"(about {per_minute * 60:.0f} an hour); {self.breaks} broken by an operator; "
                f"longest time between two sections {gap:.0f}s"
            )
        if self.ha:
            lines.append(self.ha)
        if self.members:
            lines.append(self.members)
        if self.kinds_short:
            lines.append(f"INCOMPLETE: injected fewer than {self.min_each} times: {', '.join(self.kinds_short)}")
        for check in self.checks:
            extra = f" ({check.states_explored} states, {check.segments} segments)" if check.segments else ""
            lines.append(check.summary() + extra)
        if self.problems:
            lines.append(f"problems: {len(self.problems)}")
            lines += [f"  - {p}" for p in self.problems[:50]]
        lines += self.explain()
        for text in self.undecided:
            lines.append(f"UNDECIDED: {text}")
        if self.workdir is not None:
            lines.append(f"artifacts kept in {self.workdir}")
        return "\n".join(lines)

    def explain(self, most: int = 2, before: float = 12.0, after: float = 1.0, limit: int = 150) -> list[str]:
        """What happened around the first violations that say where they are: the
        faults, the sections' entries and exits, and every write of a Lease or a state
        object the API servers logged, in one time line (seconds since the run began)."""
        from faults.audit import read_writes

        windows = [v.window for c in self.checks for v in c.violations if v.window is not None][:most]
        if not windows:
            return []
        writes = read_writes(self.audit_logs) if self.audit_logs is not None and self.audit_logs.is_dir() else []
        out: list[str] = []
        for w0, w1 in windows:
            start, end = w0 - before, w1 + after
            rows: list[tuple[float, str]] = []
            rows += [(t, text) for t, text in self.notes if start <= t <= end and text.startswith("fault")]
            for s in self.sections:
                for what, t in (("enters", s["enter"]), ("leaves", s["exit"])):
                    if t is not None and start <= float(t) <= end:
                        how = f" ({s['how']})" if what == "leaves" else ""
                        rows.append((float(t), f"{s['process']} {what} its section, token {s['token']}{how}"))
            rows += [(x.at - self.wall_offset, x.describe()) for x in writes if start <= x.at - self.wall_offset <= end]
            rows.sort(key=lambda r: r[0])
            source = "" if writes else " (no audit log)"
            out.append(f"around {w0 - self.started:.2f}s-{w1 - self.started:.2f}s{source}:")
            out += [f"  [{t - self.started:8.2f}s] {text}" for t, text in rows[:limit]]
            if len(rows) > limit:
                out.append(f"  ... {len(rows) - limit} more")
        return out
