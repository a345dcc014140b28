"""Comparing the replicas (diff) and bringing them to the value a read returns (sync), also
onto the new members of a member change."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from coordinator.config.models import STATE_SCHEMA
from coordinator.engine.fanout import fan_out
from coordinator.engine.register import NO_STAMP, Kind, Replica, Stamp, encode_envelope, stamp_of
from coordinator.engine.state.replicas import Replicas
from coordinator.engine.state.results import _per_cluster, _replicas
from coordinator.errors import NoQuorumError, StateConflictError, UsageError
from coordinator.rules import quorum


class Sync:
    """Diff and sync."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas

    async def diff(self) -> list[dict[str, Any]]:
        """Every member's stamp, checksum and standing against the value a read returns."""
        results = await self.replicas.read_all(newer_ok=True)
        choice, _ = self.replicas.judge(results)
        top = choice.top
        conflict = set(choice.conflict)
        top_checksum = choice.winner.checksum if choice.winner else None
        rows = []
        for k in self.replicas.members:
            r = results.get(k)
            row: dict[str, Any] = {
                "name": k,
                "status": None,
                "version": None,
                "token": None,
                "write_id": None,
                "checksum": None,
                "promised": None,
                "written_by": None,
                "written_at": None,
                "detail": None,
            }
            if r is None or not r.ok or r.value is None:
                row["status"] = str(r.outcome) if r else "unreachable"
                row["detail"] = r.detail if r else "no answer"
                rows.append(row)
                continue
            rep = r.value.replica
            if rep.promise is not None and rep.promise > rep.stamp:
                row["promised"] = str(rep.promise)
            if rep.envelope is not None:
                env = rep.envelope
                row.update(
                    version=env.version,
                    token=env.token,
                    write_id=env.write_id,
                    checksum=env.checksum,
                    written_by=env.written_by,
                    written_at=env.written_at,
                )
            if k in choice.suspect:
                row["status"], row["detail"] = "suspect", choice.suspect[k]
            elif rep.corrupt:
                row["status"], row["detail"] = "corrupt", rep.corrupt
                if rep.claimed > NO_STAMP:
                    row["detail"] += f"; it names stamp {rep.claimed.short()}, which no older write replaces"
            elif rep.newer_schema:
                row["status"] = "newer-schema"
                row["detail"] = (
                    f"written with envelope schema {rep.newer_schema}, newer than this coordinator "
                    f"understands ({STATE_SCHEMA}); upgrade coordinator to read or write it"
                )
            elif k in conflict:
                row["status"] = "conflict"
                row["detail"] = f"the same stamp as {', '.join(sorted(conflict - {k}))} with other data"
            elif rep.envelope is None:
                row["status"] = "absent" if (choice.winner or conflict) else "empty"
            elif rep.stamp == top:
                row["status"] = "current"
            else:
                row["status"] = "behind"
                same = rep.checksum == top_checksum
                row["detail"] = (
                    f"stamp {rep.stamp.short()} is older than {top.short()}; "
                    + ("same data" if same else "different data")
                    + "; a read or `state sync` repairs it"
                )
            rows.append(row)
        return rows

    async def sync(
        self, backup_dir: Path | None = None, *, empty_ok: bool = False, sources: list[str] | None = None
    ) -> dict[str, Any]:
        """Bring every reachable replica to the value a read returns (saving corrupt ones
        first). Suspect replicas are left alone and listed: `state sync --from` decides.
        With ``empty_ok``, a state nobody has written yet (no replica holds anything,
        none is corrupt or suspect) is nothing to copy rather than an error.

        ``sources`` (a member change: the members before it) are the only replicas, and
        leases, the value is chosen from; the other members are only written to. One of
        those that already holds something newer or different than that value is listed
        under ``holds_other`` and left alone (it is not this deployment's state as its
        members know it). ``holding`` lists the members that hold the value afterwards."""
        results = await self.replicas.read_all()
        self.replicas.need_quorum(results, "sync")
        if sources is None:
            self.replicas.refuse_other_members(results)
        judged = results if sources is None else {k: r for k, r in results.items() if k in sources}
        if sources is not None and sum(1 for r in judged.values() if r.ok) < quorum.quorum_size(len(sources)):
            # The value is chosen from the old members: a majority of them must answer, to
            # meet the majority that confirmed the last write.
            raise NoQuorumError(
                f"Cannot copy the state of {self.replicas.dep.name!r}: fewer than a majority of {', '.join(sources)} "
                f"answered ({_per_cluster(judged)}). Nothing was copied; retry when they answer."
            )
        q = None if sources is None else quorum.quorum_size(len(sources))
        choice, _ = self.replicas.judge(judged, q=q)
        self.replicas.refuse_conflict(choice, "sync")
        winner = choice.winner
        joining = {k: rep for k, rep in _replicas(results).items() if k not in judged}
        if winner is None:
            # Nothing written yet: a joining member must hold nothing written either.
            other = sorted(k for k, rep in joining.items() if rep.envelope is not None and rep.stamp.version > 0)
            if empty_ok and not other and not choice.suspect and not choice.corrupt:
                return {"repaired": [], "empty": True, "holds_other": [], "holding": []}
            if other:
                return {"repaired": [], "empty": True, "holds_other": other, "holding": []}
        if winner is None or winner.envelope is None:
            more = (
                f" Suspect replicas ({', '.join(sorted(choice.suspect))}) are not trusted: adopt one with "
                f"`coordinator state sync {self.replicas.dep.name} --from CLUSTER` under the lock."
                if choice.suspect
                else ""
            )
            raise UsageError(
                f"No valid replica of the state of {self.replicas.dep.name!r} exists; nothing to sync.{more}"
            )
        self.replicas.need_decoded(judged, "sync", q)
        env = winner.envelope
        stamp = stamp_of(env)
        text = encode_envelope(env)
        reps = _replicas(results)
        # A corrupt replica that names a newer stamp than the winner's (in its promise or its
        # envelope, whoever owns them) may hold the newest confirmed write: overwriting it
        # with the older winner would roll that write back. A person must look first.
        newer = corrupt_promised_newer(reps, choice.corrupt, stamp)
        if newer:
            raise StateConflictError(
                f"Refusing to sync {self.replicas.dep.name!r}: the corrupt replica(s) on {', '.join(newer)} carry a "
                f"newer stamp than the newest readable one (version {env.version} on {winner.cluster}), so "
                "the newest confirmed state may be theirs. Nothing was written. Inspect them (`kubectl get "
                f"configmap {self.replicas.name} -o yaml`), then write the right document with `coordinator state "
                f"apply {self.replicas.dep.name} -f FILE` under the lock."
            )
        corrupt = dict(choice.corrupt)
        stale = list(choice.stale)
        current = list(choice.current)
        holds_other: list[str] = []
        for k, rep in sorted(joining.items()):
            if rep.corrupt:
                corrupt[k] = rep.corrupt
            elif rep.newer_schema:
                holds_other.append(k)
            elif rep.stamp == stamp and rep.checksum == winner.checksum:
                current.append(k)
            elif rep.stamp < stamp and (rep.promise or stamp) <= stamp:
                stale.append(k)
            else:
                holds_other.append(k)
        saved = {k: str(self.replicas.save_replica(reps[k], backup_dir, why)) for k, why in corrupt.items()}
        # A member's corrupt replica takes the value as a write, judged again on every
        # compare-and-swap retry: should a newer write land on it meanwhile, it refuses the
        # older value. A joining member's object is not this deployment's state yet: it is
        # overwritten whatever it names.
        targets = (
            {k: Kind.REPAIR for k in stale}
            | {k: Kind.OVERWRITE for k in corrupt}
            | {k: Kind.WRITE for k in choice.corrupt}
        )
        fixed = await fan_out(
            list(targets),
            lambda c: self.replicas.cas(reps[c], stamp, targets[c], text),
            timeout=self.replicas.clusters.timeout,
            silent=self.replicas.clusters.silent,
        )
        repaired = sorted(k for k, r in fixed.items() if r.ok)
        return {
            "version": env.version,
            "token": env.token,
            "write_id": env.write_id,
            "winner": winner.cluster,
            "repaired": repaired,
            "failed": {k: f"{r.outcome}: {r.detail}" for k, r in fixed.items() if not r.ok},
            "unreachable": self.replicas.unheard(results),
            "saved_corrupt": saved,
            "suspect": dict(choice.suspect),
            "holds_other": holds_other,
            "holding": sorted({*current, *repaired}),
        }


def corrupt_promised_newer(reps: Mapping[str, Replica], corrupt: Iterable[str], stamp: Stamp) -> list[str]:
    """The corrupt replicas that name a newer stamp than ``stamp`` (the newest readable
    one's) in their promise or envelope, whoever owns them (``Replica.bound``): they may
    hold the newest confirmed write, which a sync must not roll back."""
    return sorted(k for k in corrupt if reps[k].bound > stamp)
