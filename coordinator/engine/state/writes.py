"""Writing the state under the lock: the lock checked on a majority of leases, a stamp
promised to a majority, then the data sent, both by compare-and-swap (fencing)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coordinator import clock
from coordinator.config.models import STATE_SCHEMA, StateEnvelope
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.results import default_holder
from coordinator.engine.register import (
    DATA_KEY,
    MAX_DEPTH,
    OBJECT_LIMIT,
    Kind,
    Stamp,
    build_envelope,
    check_size,
    decode_replica,
    nested_deeper,
    new_write_id,
    newer_token,
    next_stamp,
    write_outcome,
)
from coordinator.engine.state.data import changed_keys, plain_data_problem, set_path
from coordinator.engine.state.replicas import Replicas
from coordinator.engine.state.results import LockArg, Observed, WriteReport, _delivery, _per_cluster, _replicas
from coordinator.errors import NoQuorumError, StateConflictError, UsageError
from coordinator.rules.outcome import Outcome


class Writes:
    """Fenced writes."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas

    def _resolve_lock(self, lock: LockArg) -> str:
        if isinstance(lock, str) and lock:
            return lock
        if lock is not None and not isinstance(lock, str):
            if not lock.valid:
                raise StateConflictError(
                    f"The lock on {self.replicas.dep.name!r} is no longer valid (lost or expired); nothing was written."
                )
            return lock.lock_id
        env = os.environ.get("COORDINATOR_LOCK_ID")
        if env:
            return env
        rec = self.replicas.recorded_lock(self.replicas.dep.name) if self.replicas.recorded_lock else None
        if rec is None:
            raise StateConflictError(
                f"Writing the state of {self.replicas.dep.name!r} needs its lock, and no lock is held: take it "
                f"with `coordinator lock acquire {self.replicas.dep.name}` (or run under `coordinator lock run`), "
                "or pass --lock-id. Nothing was written."
            )
        return rec.lock_id

    def _holder_token(self, seen: Mapping[str, Observed], lock_id: str, unheard: list[str]) -> int:
        held_on = [
            k
            for k, o in seen.items()
            if o.lease is not None and o.lease.lock_id == lock_id and o.lease.expired() is not True
        ]
        if len(held_on) < self.replicas.q and len(held_on) + len(unheard) >= self.replicas.q:
            # A member that did not answer may hold the lock: this is not knowing, not
            # "not held" (the holder's lock may well be intact, and retrying is right).
            raise NoQuorumError(
                f"Cannot confirm that lock id {lock_id} holds deployment {self.replicas.dep.name!r} on a "
                f"majority: it holds {len(held_on)} of {self.replicas.n} ({', '.join(held_on) or 'none'}) among "
                f"the clusters that answered, and {', '.join(unheard)} did not answer (it may hold there too). "
                "Nothing was written. Retry when they are reachable."
            )
        if len(held_on) < self.replicas.q:
            raise StateConflictError(
                f"Lock id {lock_id} does not hold deployment {self.replicas.dep.name!r} on a majority "
                f"(it holds {len(held_on)} of {self.replicas.n}: {', '.join(held_on) or 'none'}); it expired, "
                "was released or was taken over. Nothing was written. Take the lock again."
            )
        # The holder's token as coordinator wrote it: one another client annotated is
        # neither its token nor a bound (it could make the write look stale, or outrank
        # every later holder's).
        from coordinator.rules.evidence import Writer

        tokens = [o.lease.token for k in held_on if (o := seen[k]).lease and o.lease.token_writer is not Writer.OTHER]
        if not tokens:
            raise StateConflictError(
                f"Lock id {lock_id} holds deployment {self.replicas.dep.name!r}, but no lease it holds shows the "
                "fencing token coordinator wrote (another client rewrote it). Nothing was written. Take the lock again."
            )
        return max(tokens)

    async def write(
        self,
        change: Callable[[dict[str, Any]], Any],
        *,
        lock: LockArg = None,
        command: str = "api",
        note: str | None = None,
        replaces: bool = False,
        adopt_from: str | None = None,
        backup_dir: Path | None = None,
        _token: int | None = None,
    ) -> WriteReport:
        """Apply ``change(data) -> new data`` as a new version on every member.

        ``change`` runs only once the lock is known to be held, so that it may do the
        expensive part (parse a file). ``replaces``: the change ignores the old data
        (apply, restore), so it may be written over replicas that are all corrupt or
        suspect; a change that builds on the old data may not. ``adopt_from``: the new
        data is that cluster's replica, suspect or not, and suspect replicas are
        overwritten (``state sync --from``). Replicas that are overwritten although
        corrupt or suspect are saved to files first.

        ``_token`` is for tests of fencing only: it skips the lease check and writes with
        the given token, as a holder whose lease was taken over in the meantime would.
        """
        if self.replicas.dep.joint:
            raise StateConflictError(
                f"A member change of {self.replicas.dep.name!r} (to {', '.join(self.replicas.dep.joint or [])}) is "
                "in progress: run the same `coordinator deployment ...-cluster` command again to finish it before "
                "writing the state. Nothing was written."
            )
        lock_id = self._resolve_lock(lock)
        results = await self.replicas.read_all(writing=True)
        self.replicas.need_quorum(results, "write")
        self.replicas.refuse_other_members(results)
        seen = {k: r.value for k, r in results.items() if r.ok and r.value}
        reps = {k: o.replica for k, o in seen.items()}
        token = self._holder_token(seen, lock_id, self.replicas.unheard(results)) if _token is None else _token
        choice, evidence = self.replicas.judge(results)
        overwrite: set[str] = set()
        current = choice.winner.envelope if choice.winner else None
        base: StateEnvelope | None
        if adopt_from is not None:
            source = reps.get(adopt_from)
            if source is None or source.envelope is None:
                why = "it did not answer" if source is None else (source.corrupt or "it holds no state")
                raise UsageError(
                    f"Cannot adopt the state of {self.replicas.dep.name!r} from {adopt_from}: {why}. "
                    "Nothing was written."
                )
            overwrite = set(choice.suspect) | set(choice.conflict)
            was = choice.suspect.get(adopt_from)
            note = (
                f"adopted the data of {adopt_from} (stamp {source.stamp.short()}"
                + (f"; it was suspect: {was}" if was else "")
                + ")"
                + (f"; overwrote {', '.join(sorted(overwrite))}" if overwrite else "")
            )
            source_data = source.envelope.data
            base = current or source.envelope

            def change(_old: dict[str, Any]) -> Any:
                return copy.deepcopy(source_data)

        else:
            if not replaces:
                self.replicas.refuse_conflict(choice, "change")
            base = current
            if base is None and not replaces:
                self.replicas.refuse_unreadable(results, choice, "change")
            if not replaces or len(_replicas(results)) < self.replicas.n:
                # A whole state written over the rest still takes its stamp from what it
                # reads: unless every member answered, a majority must be replicas that
                # answer, or it may be ordered below a write a silent member holds.
                self.replicas.need_decoded(results, "change")
        newer = newer_token(reps.values(), token, evidence)
        if newer is not None:
            raise StateConflictError(
                f"Refused: the state of {self.replicas.dep.name!r} was already written or promised with fencing token "
                f"{newer}, higher than this lock's token {token}; a newer holder has taken over. Nothing was written."
            )
        old = copy.deepcopy(current.data) if current else {}
        new = change(copy.deepcopy(old))
        if not isinstance(new, dict):
            raise UsageError("The state document must be a mapping at the top level. Nothing was written.")
        if nested_deeper(new, MAX_DEPTH):
            # Every reader takes a replica nested deeper for corrupt (register.decode_replica):
            # written, it would replace the last readable version on every member.
            raise UsageError(
                f"The new state of {self.replicas.dep.name!r} is nested more than {MAX_DEPTH} levels deep, which no "
                "reader takes for a state (it would read as corrupt everywhere). Nothing was written."
            )
        problem = plain_data_problem(new)
        if problem:
            raise UsageError(
                f"The new state of {self.replicas.dep.name!r} holds a value that cannot be stored as JSON ({problem}): "
                "use string keys, and strings, finite numbers, booleans, null, lists and maps as values. "
                "Nothing was written."
            )
        stamp = next_stamp(reps.values(), token, evidence, new_write_id())
        _env, text = build_envelope(
            base,
            new,
            stamp,
            who=default_holder(),
            host=clock.host(),
            command=command,
            now=clock.wall_now(),
            members=self.replicas.members,
            member_ids={m: self.replicas.clusters.record(m).identity for m in self.replicas.members},
            namespace=self.replicas.dep.namespace,
            storage=self.replicas.storage,
            keys=changed_keys(old, new),
            note=note,
            membership=self.replicas.membership.document(),
            deployment=self.replicas.dep.name,
        )
        check_size(text, self.replicas.storage)
        saved = {
            k: str(self.replicas.save_replica(rep, backup_dir, choice.suspect.get(k) or rep.corrupt or "replaced"))
            for k, rep in reps.items()
            if rep.corrupt or k in overwrite
        }
        kinds = {k: Kind.OVERWRITE if k in overwrite else Kind.WRITE for k in reps}

        # Promise the stamp to a majority before any data leaves: a later writer then
        # reads it on any majority and draws a higher version.
        promises = await fan_out(
            list(reps),
            lambda c: self.replicas.cas(
                reps[c], stamp, Kind.PROMISE if kinds[c] is Kind.WRITE else Kind.OVERWRITE, None, holder=True
            ),
            timeout=self.replicas.clusters.timeout,
        )
        promised = sorted(k for k, r in promises.items() if r.ok)
        if len(promised) < self.replicas.q:
            self._fail_promise(stamp, results, promises, promised, saved)
        latest = dict(reps)
        for k, r in promises.items():
            if r.ok and r.value is not None:
                latest[k] = r.value
        writes = await fan_out(
            list(reps),
            lambda c: self.replicas.cas(latest[c], stamp, kinds[c], text, holder=True),
            timeout=self.replicas.clusters.timeout,
        )
        merged: dict[str, ClusterResult[Any]] = {}
        for k in self.replicas.members:
            merged[k] = writes.get(k) or results.get(k) or ClusterResult(k, Outcome.UNREACHABLE, detail="no answer")
            if k not in writes and k in results and results[k].ok:
                merged[k] = ClusterResult(k, Outcome.UNREACHABLE, detail="write got no answer")
        confirmed = sorted(k for k, r in writes.items() if r.ok)
        outcome = write_outcome({k: _delivery(writes.get(k) or merged[k]) for k in reps}, self.replicas.q)
        report = WriteReport(
            self.replicas.dep.name,
            stamp.version,
            token,
            self.replicas.q,
            merged,
            confirmed,
            stamp.write_id,
            outcome,
            promised,
            saved,
        )
        if outcome == "ok":
            return report
        per = _per_cluster(merged)
        if outcome == "nothing":
            report.outcome = "refused"
            raise StateConflictError(
                f"The write to {self.replicas.dep.name!r} was refused by every cluster ({per}). Nothing was written.",
                payload=report,
            )
        raise NoQuorumError(
            f"Outcome unknown: version {stamp.version} reached {len(confirmed)} of {self.replicas.n} clusters "
            f"({', '.join(confirmed) or 'none'}), fewer than the {self.replicas.q} needed ({per}). It may "
            f"still become visible: a later read repairs the newest replica onto the others; any later "
            f"write is ordered after it. Run `coordinator state diff {self.replicas.dep.name}` to see where it landed.",
            payload=report,
        )

    def _fail_promise(
        self,
        stamp: Stamp,
        results: Mapping[str, ClusterResult[Any]],
        promises: Mapping[str, ClusterResult[Any]],
        promised: list[str],
        saved: dict[str, str],
    ) -> None:
        merged = {
            k: promises.get(k) or results.get(k) or ClusterResult(k, Outcome.UNREACHABLE) for k in self.replicas.members
        }
        refused = [k for k, r in promises.items() if r.outcome is Outcome.CONFLICT]
        report = WriteReport(
            self.replicas.dep.name,
            stamp.version,
            stamp.token,
            self.replicas.q,
            dict(merged),
            [],
            stamp.write_id,
            "refused",
            promised,
            saved,
        )
        per = _per_cluster(merged)
        head = (
            f"Nothing was written to {self.replicas.dep.name!r}: version {stamp.version} could be reserved on only "
            f"{len(promised)} of {self.replicas.n} clusters ({', '.join(promised) or 'none'}), fewer than the "
            f"{self.replicas.q} needed, so no data was sent ({per})."
        )
        if refused:
            raise StateConflictError(
                head + " A newer write or holder got there first; read the state and try again.", payload=report
            )
        report.outcome = "nothing"
        raise NoQuorumError(head + " Retry when the clusters accept writes again.", payload=report)

    async def set(self, values: dict[str, Any], *, lock: LockArg = None, command: str = "state set") -> WriteReport:
        def change(data: dict[str, Any]) -> dict[str, Any]:
            for key, value in values.items():
                set_path(data, key, value)
            return data

        return await self.write(change, lock=lock, command=command)

    async def apply(
        self,
        document: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        *,
        lock: LockArg = None,
        command: str = "state apply",
    ) -> WriteReport:
        """Replace the data with ``document``; a callable is called (to parse a file, say)
        only once the lock is known to be held."""

        def change(_old: dict[str, Any]) -> dict[str, Any]:
            doc = document() if callable(document) else document
            if not isinstance(doc, Mapping):
                raise UsageError("The state document must be a mapping at the top level. Nothing was written.")
            return copy.deepcopy(dict(doc))

        return await self.write(change, lock=lock, command=command, replaces=True)

    async def adopt(self, source: str, *, lock: LockArg = None, backup_dir: Path | None = None) -> WriteReport:
        """`state sync --from SOURCE`: write SOURCE's data as a new version everywhere,
        overwriting suspect replicas (saved to files first), under the lock."""
        if source not in self.replicas.members:
            raise UsageError(
                f"{source!r} is not a member of deployment {self.replicas.dep.name!r} "
                f"(members: {', '.join(self.replicas.members)})."
            )
        return await self.write(
            lambda old: old, lock=lock, command=f"state sync --from {source}", adopt_from=source, backup_dir=backup_dir
        )

    async def restore(self, path: Path, *, lock: LockArg = None, envelope: StateEnvelope | None = None) -> WriteReport:
        """Write the backup at ``path`` (or ``envelope``, already read from it: a pipe or a
        process substitution can be read once only) as a new version."""
        env = envelope if envelope is not None else load_backup(path)
        return await self.write(
            lambda _old: copy.deepcopy(env.data),
            lock=lock,
            command="state restore",
            replaces=True,
            note=f"restored from {path.name} (version {env.version}, token {env.token}, "
            f"written by {env.written_by} at {env.written_at.isoformat()})",
        )


def load_backup(path: Path) -> StateEnvelope:
    limit = 4 * OBJECT_LIMIT
    try:
        # At most one byte more than any backup can be: the size stat() gives is 0 for
        # /dev/zero and a pipe, which would be read to the end of memory.
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
        if len(raw) > limit:
            raise UsageError(f"The backup file {path} is larger than any state could be; it is not a backup.")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"Cannot read the backup file {path}: {err}.") from err
    rep = decode_replica("file", {"data": {DATA_KEY: text}}, "configmap", from_file=True)
    if rep.newer_schema:
        raise StateConflictError(
            f"The backup {path} has envelope schema {rep.newer_schema}, newer than this coordinator "
            f"understands ({STATE_SCHEMA}). Upgrade coordinator."
        )
    if rep.envelope is None:
        raise UsageError(f"The backup file {path} is not a valid state envelope: {rep.corrupt}. Nothing was written.")
    return rep.envelope
