"""Reading the state: a majority answers, the newest trusted replica wins, stale ones are
repaired first; the audit history and backups are reads too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coordinator.config.models import AuditEntry, StateEnvelope
from coordinator.engine.fanout import fan_out
from coordinator.engine.register import Kind, encode_envelope, stamp_of
from coordinator.engine.state.data import get_path
from coordinator.engine.state.replicas import Replicas
from coordinator.engine.state.results import ReadReport, _replicas
from coordinator.errors import NoQuorumError, UsageError
from coordinator.logs import get_logger

log = get_logger("coordinator.engine.state")  # one logger for the whole register


class Reads:
    """Quorum reads with repair."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas

    async def read(self, *, repair: bool = True) -> ReadReport:
        """Read a majority; the newest trusted replica wins; stale ones are repaired first."""
        results = await self.replicas.read_all(early=True)
        choice, evidence = self.replicas.judge(results)
        odd = choice.corrupt or choice.suspect or choice.conflict or evidence is None
        odd = odd or not self.replicas.members_verdict(results).ok
        # A missing object is no answer (``_need_decoded``): hear the others before deciding.
        odd = odd or any(rep.blank for rep in _replicas(results).values())
        if len(results) < self.replicas.n and (odd or len(choice.current) + len(choice.stale) < self.replicas.q):
            # Something is off: hear every member (with fresh leases) before deciding.
            results = await self.replicas.read_all()
            choice, evidence = self.replicas.judge(results)
        self.replicas.need_quorum(results, "read")
        self.replicas.refuse_other_members(results)
        self.replicas.refuse_conflict(choice, "read")
        winner = choice.winner
        report = ReadReport(
            self.replicas.dep.name,
            winner.envelope if winner else None,
            winner.cluster if winner else None,
            results,
            corrupt=sorted(choice.corrupt),
            suspect=dict(choice.suspect),
        )
        if winner is None or winner.envelope is None:
            self.replicas.refuse_unreadable(results, choice, "read")
        if any(rep.blank for rep in _replicas(results).values()):
            # A missing object is no answer: the newest confirmed state may be where it was
            # deleted (corrupt replicas are refused below, where repair cannot reach a majority).
            self.replicas.need_decoded(results, "read", read=True)
        if winner is None or winner.envelope is None:
            return report
        if not repair:
            return report
        env = winner.envelope
        stamp = stamp_of(env)
        current = len(choice.current)
        if choice.stale:
            reps = _replicas(results)
            text = encode_envelope(env)
            repaired = await fan_out(
                choice.stale,
                lambda c: self.replicas.cas(reps[c], stamp, Kind.REPAIR, text),
                timeout=self.replicas.clusters.timeout,
                silent=self.replicas.clusters.silent,
            )
            report.repaired = sorted(k for k, r in repaired.items() if r.ok)
            current += len(report.repaired)
            if report.repaired:
                log.info("repaired stale replicas", clusters=report.repaired, stamp=str(stamp))
        if current < self.replicas.q:
            # The value is not yet on a majority; returning it could let a later read see
            # an older one. Say so instead of guessing.
            raise NoQuorumError(
                f"The newest state of {self.replicas.dep.name!r} (version {env.version}) is on {current} of "
                f"{self.replicas.n} clusters and could not be repaired onto a majority of {self.replicas.q}; "
                "retry when more clusters are reachable."
            )
        return report

    async def get(self, key: str | None = None) -> Any:
        report = await self.read()
        data = report.envelope.data if report.envelope else {}
        return get_path(data, key) if key else data

    async def history(self) -> list[AuditEntry]:
        report = await self.read()
        return list(report.envelope.history) if report.envelope else []

    async def backup(self, path: Path) -> StateEnvelope:
        report = await self.read()
        if report.envelope is None:
            raise UsageError(f"The deployment {self.replicas.dep.name!r} has no state yet; nothing to back up.")
        from coordinator.config.store import _atomic_write

        try:
            _atomic_write(path, json.dumps(report.envelope.model_dump(mode="json", by_alias=True), indent=2) + "\n")
        except OSError as err:
            raise UsageError(f"Cannot write the backup file {path}: {err.strerror or err}.") from err
        return report.envelope
