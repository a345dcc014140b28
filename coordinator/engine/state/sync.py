"""Comparing the replicas (diff), bringing them to the value a read returns (sync), and a
member change's copy of the state onto the new members (carry)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from coordinator import clock
from coordinator.config.models import STATE_SCHEMA
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.register import (
    NO_STAMP,
    Choice,
    Kind,
    Replica,
    Stamp,
    build_envelope,
    check_size,
    choose,
    encode_envelope,
    genesis_text,
    new_write_id,
    newer_token,
    next_stamp,
    sealed_text,
    stamp_of,
)
from coordinator.engine.state.replicas import Replicas, nothing_anywhere
from coordinator.engine.state.results import _per_cluster, _replicas
from coordinator.errors import NoQuorumError, StateConflictError, UsageError
from coordinator.rules import quorum


class Sync:
    """Diff, sync and a member change's copy."""

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

    async def sync(self, backup_dir: Path | None = None) -> dict[str, Any]:
        """Bring every reachable replica to the value a read returns (saving corrupt ones
        first). Suspect replicas are left alone and listed: `state sync --from` decides."""
        results = await self.replicas.read_all()
        self.replicas.need_quorum(results, "sync")
        self.replicas.refuse_other_members(results)
        choice, _ = self.replicas.judge(results)
        self.replicas.refuse_conflict(choice, "sync")
        winner = choice.winner
        if winner is None or winner.envelope is None:
            raise _no_valid_replica(self.replicas.dep.name, choice, "sync")
        self.replicas.need_decoded(results, "sync")
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
        saved = {k: str(self.replicas.save_replica(reps[k], backup_dir, why)) for k, why in choice.corrupt.items()}
        # A corrupt replica takes the value as a write, judged again on every
        # compare-and-swap retry: should a newer write land on it meanwhile, it refuses the
        # older value.
        targets = {k: Kind.REPAIR for k in choice.stale} | {k: Kind.WRITE for k in choice.corrupt}
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
        }

    def _sealed(self, rep: Replica, stamp: Stamp) -> str | None:
        """The envelope ``rep`` holds with the promise of ``stamp`` kept inside it (a
        new object: the empty state's). None where it holds no envelope of ours to keep
        it in (corrupt, or written with a newer schema): the annotation alone."""
        if rep.corrupt or rep.newer_schema:
            return None
        if not rep.exists or rep.raw is None:
            return sealed_text(genesis_text(self.replicas.dep.name), stamp)
        return sealed_text(rep.raw, stamp)

    async def carry(
        self, token: int, sources: list[str], joint: Mapping[str, Any], *, who: str, note: str
    ) -> dict[str, Any]:
        """A member change's copy of the state, under its lock (token ``token``): the value
        the members before the change (``sources``) hold, written again on every member as
        a new version under the change's own token.

        A new stamp, not the old one copied: a write of an older lock that is still on
        its way (paused, held up on the network) is then refused by every replica the
        copy wrote, by the envelope's stamp itself, which nobody can remove without
        making the replica corrupt. (The change's member-set note and token floor refuse
        it too, but they are annotations anyone who may annotate the object can remove.)

        The stamp is promised first, on every member that answered, and the value chosen
        from the old members' replicas as they were when they took the promise: an older
        write confirmed before the promise is on a majority of the old set, which the
        promised majority meets; one that comes after is refused by the promise. The
        value is written only where the replica still holds the stamp it held then.

        The promise is kept inside the envelope too (Replica.sealed): the annotation is
        anyone's to remove who may annotate the object, and a write that lands between
        the promise and the data would be outranked by the copy's higher token.

        ``joint`` (the change's joint configuration) is kept in the envelope: on a run of
        the same change again, a joining member that holds this change's earlier copy is
        written over. One that holds a newer state, or the same stamp with other data,
        stops the change (``holds_other``: not this deployment's state as its members know
        it, left alone); an older one is written over, as a stale replica.
        ``holding`` lists the members that hold the new version afterwards."""
        name = self.replicas.dep.name
        results = await self.replicas.read_all()
        self.replicas.need_quorum(results, "copy")
        q = quorum.quorum_size(len(sources))
        judged = {k: r for k, r in results.items() if k in sources}
        if sum(1 for r in judged.values() if r.ok) < q:
            # The value is chosen from the old members: a majority of them must answer, to
            # meet the majority that confirmed the last write.
            raise NoQuorumError(
                f"Cannot copy the state of {name!r}: fewer than a majority of {', '.join(sources)} "
                f"answered ({_per_cluster(judged)}). Nothing was copied; retry when they answer."
            )
        choice, evidence = self.replicas.judge(judged, q=q)
        self.replicas.refuse_conflict(choice, "copy")
        reps = _replicas(results)
        joining = {k: rep for k, rep in reps.items() if k not in sources}
        winner = choice.winner
        if winner is None and (choice.suspect or choice.corrupt):
            raise _no_valid_replica(name, choice, "copy")
        # A majority of the old members must answer with a replica that decodes (or the
        # empty state `deployment create` seeded): a missing or corrupt one may stand
        # where the newest confirmed write was, also when nothing else was seen.
        self.replicas.need_decoded(judged, "copy", q)
        none_written = nothing_anywhere(judged)
        # Nothing written yet is copied too, as the empty state: its version then fences
        # the first write of an older lock as any other.
        top = winner.stamp if winner is not None else NO_STAMP
        ours = [k for k, rep in joining.items() if _carried(rep, joint)]
        holds_other = sorted(
            k
            for k, rep in joining.items()
            if k not in ours
            and not rep.corrupt
            and (
                rep.newer_schema
                or rep.stamp > top
                or (rep.envelope is not None and rep.stamp == top and winner is not None
                    and rep.checksum != winner.checksum)
            )
        )  # fmt: skip
        if holds_other:
            return {"empty": winner is None, "holds_other": holds_other, "holding": []}
        newer = corrupt_promised_newer(reps, choice.corrupt, top)
        if newer:
            raise StateConflictError(
                f"Cannot copy the state of {name!r}: the corrupt replica(s) on {', '.join(newer)} carry a newer "
                f"stamp than the newest readable one ({top.short()}), so the newest confirmed state may be theirs. "
                "Nothing was copied. Inspect them, then write the right document with `coordinator state apply "
                f"{name} -f FILE` under the lock."
            )
        trusted = {k: rep for k, rep in reps.items() if k not in choice.suspect}
        higher = newer_token(trusted.values(), token, evidence)
        if higher is not None:
            raise StateConflictError(
                f"Cannot copy the state of {name!r}: it was written or promised with fencing token {higher}, "
                f"higher than the change's token {token}; a newer holder has taken the lock. Nothing was copied."
            )
        stamp = next_stamp(trusted.values(), token, evidence, new_write_id())
        # A joining member's object is not this deployment's state yet (or is this
        # change's earlier copy): it is overwritten whatever it holds. A member's corrupt
        # replica takes the value as a write, judged again on every retry.
        kinds = {
            k: Kind.OVERWRITE if k in joining and (rep.corrupt or k in ours) else Kind.WRITE
            for k, rep in trusted.items()
        }
        corrupt = {k: rep.corrupt for k, rep in trusted.items() if rep.corrupt}
        saved = {k: str(self.replicas.save_replica(reps[k], None, why)) for k, why in corrupt.items()}
        promises = await fan_out(
            list(kinds),
            lambda c: self.replicas.cas(
                reps[c],
                stamp,
                Kind.PROMISE if kinds[c] is Kind.WRITE else Kind.OVERWRITE,
                lambda rep: self._sealed(rep, stamp) if kinds[c] is Kind.WRITE else None,
                holder=True,
            ),
            timeout=self.replicas.clusters.timeout,
            silent=self.replicas.clusters.silent,
        )
        latest = {k: r.value for k, r in promises.items() if r.ok and r.value is not None}
        chosen = choose({k: rep for k, rep in latest.items() if k in sources}, evidence)
        decoded = [k for k, rep in latest.items() if k in sources and (rep.answers or none_written)]
        if len(decoded) < q or chosen.conflict or (winner is not None and chosen.winner is None):
            raise NoQuorumError(
                f"Cannot copy the state of {name!r}: version {stamp.version} could be reserved on "
                f"{', '.join(sorted(latest)) or 'none'} with a replica that decodes on only "
                f"{', '.join(sorted(decoded)) or 'none'}, fewer than a majority of {', '.join(sources)} "
                f"({_per_cluster(promises)}). No data was sent; retry when they answer."
            )
        # The newest value seen: what the promised majority held, or newer, what the first
        # read saw (a read may have returned it already).
        seen = [rep for rep in (chosen.winner, winner) if rep is not None and rep.envelope is not None]
        best = max(seen, key=lambda rep: rep.stamp) if seen else None
        base = best.envelope if best is not None else None
        what = (
            f"version {base.version} (stamp {best.stamp.short()}) written again"
            if base is not None and best is not None
            else "the empty state (nothing written yet) written"
        )
        _env, text = build_envelope(
            base,
            copy.deepcopy(base.data) if base is not None else {},
            stamp,
            who=who,
            host=clock.host(),
            command="member change",
            now=clock.wall_now(),
            members=self.replicas.members,
            member_ids={m: self.replicas.clusters.record(m).identity for m in self.replicas.members},
            namespace=self.replicas.dep.namespace,
            storage=self.replicas.storage,
            keys=[],
            note=f"{note}: {what}",
            membership=dict(joint),
            deployment=name,
        )
        check_size(text, self.replicas.storage)
        writes: dict[str, ClusterResult[Replica]] = await fan_out(
            list(latest),
            lambda c: self.replicas.cas(latest[c], stamp, kinds[c], text, holder=True, unchanged=latest[c].stamp),
            timeout=self.replicas.clusters.timeout,
            silent=self.replicas.clusters.silent,
        )
        holding = sorted(k for k, r in writes.items() if r.ok)
        return {
            "version": stamp.version,
            "token": token,
            "write_id": stamp.write_id,
            "empty": base is None,
            "copied": base.version if base is not None else 0,
            "winner": best.cluster if best is not None else None,
            "failed": {k: f"{r.outcome}: {r.detail}" for k, r in {**promises, **writes}.items() if not r.ok},
            "unreachable": self.replicas.unheard(results),
            "saved_corrupt": saved,
            "suspect": dict(choice.suspect),
            "holds_other": [],
            "holding": holding,
        }


def _no_valid_replica(name: str, choice: Choice, what: str) -> UsageError:
    more = (
        f" Suspect replicas ({', '.join(sorted(choice.suspect))}) are not trusted: adopt one with "
        f"`coordinator state sync {name} --from CLUSTER` under the lock."
        if choice.suspect
        else ""
    )
    return UsageError(f"No valid replica of the state of {name!r} exists; nothing to {what}.{more}")


def _carried(rep: Replica, joint: Mapping[str, Any]) -> bool:
    """Whether ``rep`` holds a copy this member change (its joint configuration
    ``joint``) made on an earlier run."""
    env = rep.envelope
    return env is not None and getattr(env, "membership", None) == dict(joint)


def corrupt_promised_newer(reps: Mapping[str, Replica], corrupt: Iterable[str], stamp: Stamp) -> list[str]:
    """The corrupt replicas that name a newer stamp than ``stamp`` (the newest readable
    one's) in their promise or envelope, whoever owns them (``Replica.bound``): they may
    hold the newest confirmed write, which a sync must not roll back."""
    return sorted(k for k in corrupt if reps[k].bound > stamp)
