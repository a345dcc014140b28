"""The replicated state register of a deployment: reading and writing the objects.

One object per member cluster (ConfigMap, or Secret on request) named
``coordinator-state-<deployment>`` holds an envelope ``{schema, version, token,
write_id, checksum, written_by, written_at, members, data, history}`` and the newest
stamp it has promised. The rules — stamps and their order, what a replica takes, which
value a read returns, which replicas are suspect — are pure functions in
:mod:`coordinator.register`; this module does the I/O around them:

* **Write** (needs the lock): read the lease and the replica on every member at once;
  the lock must be held on a majority; draw a stamp above every version held or
  promised; promise it to a majority (compare-and-swap); only then send the data
  (compare-and-swap) and succeed when q replicas confirm. A write that reached some
  replicas but not q is reported as "outcome unknown"; one that cannot have reached any
  as "nothing was written".
* **Read**: a majority answers; the newest trusted stamp wins; replicas behind it are
  repaired (written back) before the value is returned, so the value returned is on a
  majority and no later read can return an older one.
* **Corrupt replicas** (not JSON, wrong checksum, missing fields) and **suspect** ones
  (a token no lease of a majority has seen) never win; ``diff`` names them, ``sync``
  overwrites corrupt ones after saving them to a file, ``sync --from`` adopts or
  overwrites suspect ones under the lock.
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, assert_never

import anyio

from coordinator import cas, quorum
from coordinator.clusters import ClusterSet, failed
from coordinator.errors import IdentityMismatchError, MembershipError, NoQuorumError, StateConflictError, UsageError
from coordinator.fanout import ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.kube.resources import (
    FIELD_MANAGER,
    lease_name,
    lease_path,
    state_name,
    state_paths,
)
from coordinator.lease import history_known
from coordinator.lock import (
    LeaseView,
    _envelope_evidence,
    default_holder,
    first_kube_error,
    set_on_state,
)
from coordinator.logs import get_logger
from coordinator.membership import Check, Membership, Stored, Verdict, says_nothing, stored_in_lease
from coordinator.membership import check as check_membership
from coordinator.models import STATE_SCHEMA, AuditEntry, DeploymentRecord, LockRecord, StateEnvelope
from coordinator.outcome import Outcome
from coordinator.register import (
    DATA_KEY,
    ENVELOPE_LIMIT,
    MAX_DEPTH,
    OBJECT_LIMIT,
    Choice,
    Delivery,
    Kind,
    Replica,
    Stamp,
    build_envelope,
    build_object,
    check_size,
    checksum,
    choose,
    decode_replica,
    encode_envelope,
    judge,
    lease_evidence,
    migrate,
    nested_deeper,
    new_write_id,
    newer_token,
    next_stamp,
    promise_after,
    stamp_of,
    write_outcome,
)

__all__ = [
    "DATA_KEY",
    "ENVELOPE_LIMIT",
    "OBJECT_LIMIT",
    "LockHandle",
    "ReadReport",
    "Replica",
    "StateClient",
    "WriteReport",
    "changed_keys",
    "check_size",
    "checksum",
    "decode_replica",
    "encode_envelope",
    "get_path",
    "load_backup",
    "migrate",
    "set_path",
]

log = get_logger(__name__)


class LockHandle(Protocol):
    """What a write needs of a lock held in this process (``api.HeldLock`` is one)."""

    @property
    def lock_id(self) -> str: ...

    @property
    def valid(self) -> bool: ...


LockArg = LockHandle | str | None


# ------------------------------------------------------------------ dotted keys


def get_path(data: Any, key: str) -> Any:
    cur = data
    for part in key.split("."):
        # a list index is ASCII digits ('²' is a digit to str.isdigit, and no int)
        index = int(part) if part.isascii() and part.isdigit() and len(part) <= 18 else None
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and index is not None and index < len(cur):
            cur = cur[index]
        else:
            raise UsageError(f"Key {key!r} is not in the state (no {part!r} there).")
    return cur


def set_path(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if not all(parts):
        raise UsageError(f"Key {key!r} has an empty part; use names like replicas or app.version.")
    cur: Any = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if nxt is None:
            nxt = cur[part] = {}
        if not isinstance(nxt, dict):
            raise UsageError(f"Cannot set {key!r}: {part!r} holds a {type(nxt).__name__}, not a mapping.")
        cur = nxt
    cur[parts[-1]] = value


def changed_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        path = f"{prefix}{k}"
        a, b = old.get(k, _MISSING), new.get(k, _MISSING)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, path + ".")
        elif a != b:
            keys.append(path)
    return keys


_MISSING = object()


def plain_data_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as JSON exactly as given, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        cur, where = stack.pop()
        at = f" at {where}" if where else ""
        if isinstance(cur, dict):
            for k, v in cur.items():
                if not isinstance(k, str):
                    return f"the key {k!r}{at} is a {type(k).__name__}, not a string"
                stack.append((v, f"{where}.{k}" if where else k))
        elif isinstance(cur, list):
            stack.extend((v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(cur))
        elif isinstance(cur, float):
            if not math.isfinite(cur):
                return f"{cur!r}{at} is not a finite number"
        elif not (cur is None or isinstance(cur, str | int | bool)):
            return f"{cur!r}{at} is a {type(cur).__name__}"
    return None


# ------------------------------------------------------------------ results


@dataclass
class Observed:
    """One cluster's replica and, when asked for, its lease, read together."""

    replica: Replica
    lease: LeaseView | None = None


@dataclass
class WriteReport:
    deployment: str
    version: int
    token: int
    quorum: int
    results: dict[str, ClusterResult[Any]]
    confirmed: list[str]
    write_id: str = ""
    outcome: str = "ok"  # ok | unknown | nothing | refused
    promised: list[str] = field(default_factory=list)
    saved: dict[str, str] = field(default_factory=dict)

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.token, self.version, self.write_id)

    @property
    def lagging(self) -> list[str]:
        return sorted(k for k, r in self.results.items() if not r.ok)


@dataclass
class ReadReport:
    deployment: str
    envelope: StateEnvelope | None
    winner: str | None
    replicas: dict[str, ClusterResult[Observed]]
    repaired: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    suspect: dict[str, str] = field(default_factory=dict)


def _definite(err: KubeError) -> bool:
    """The server said no: the request was not applied (a timeout or a 5xx says nothing)."""
    return err.status is not None and 400 <= err.status < 500 and err.status != 408


def _delivery(result: ClusterResult[Any]) -> Delivery:
    if result.ok:
        return Delivery.CONFIRMED
    if result.outcome is Outcome.CONFLICT or result.extra.get("definite"):
        return Delivery.REFUSED
    return Delivery.UNANSWERED


def _failed(cluster: str, err: KubeError, *, definite: bool | None = None) -> ClusterResult[Any]:
    result: ClusterResult[Any] = failed(cluster, err)
    result.extra["definite"] = _definite(err) if definite is None else definite
    return result


def _per_cluster(results: Mapping[str, ClusterResult[Any]]) -> str:
    return "; ".join(f"{k}: {r.outcome} ({r.detail})" for k, r in sorted(results.items()))


# ------------------------------------------------------------------ the client


class StateClient:
    """The state of one deployment (``Coordinator.state(name)``)."""

    def __init__(
        self,
        clusters: ClusterSet,
        deployment: DeploymentRecord,
        *,
        recorded_lock: Callable[[str], LockRecord | None] | None = None,
    ) -> None:
        self.clusters = clusters
        self.dep = deployment
        self.recorded_lock = recorded_lock
        self.members = list(deployment.clusters)
        self.n = len(self.members)
        self.q = quorum.quorum_size(self.n)
        # The member set this machine's record names, by identity, as the leases store it.
        joint = getattr(deployment, "joint", None)
        self.membership = Membership.of(
            (clusters.record(m).identity for m in self.members),
            getattr(deployment, "epoch", 1),
            [clusters.record(m).identity for m in joint] if joint else None,
        )
        self.name = state_name(deployment.name)
        self.storage = deployment.storage
        self.collection, self.path = state_paths(deployment.namespace, deployment.name, self.storage)

    # -- raw replica I/O

    async def _read_one(self, cluster: str, *, with_lease: bool = True, lease_required: bool = True) -> Observed:
        """Identity check, replica read and lease read in one round trip. A reader that may
        not read the lease (``lease_required`` False) goes without its evidence."""
        client = self.clusters.client(cluster)
        out: dict[str, Any] = {}

        async def read_state() -> None:
            try:
                resp = await client.request("GET", self.path)
                out["obj"] = resp.body
            except KubeError as err:
                if err.kind != kube.NOT_FOUND:
                    raise
                out["obj"] = None

        async def read_lease() -> None:
            try:
                resp = await client.request("GET", lease_path(self.dep.namespace, lease_name(self.dep.name)))
                out["lease"] = LeaseView.parse(resp.body, resp.server_time)
            except KubeError as err:
                if err.kind == kube.FORBIDDEN and not lease_required:
                    return
                if err.kind != kube.NOT_FOUND:
                    raise
                out["lease"] = LeaseView(exists=False)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_state)
                if with_lease:
                    tg.start_soon(read_lease)
                await self.clusters.check_identity(cluster)
        except BaseExceptionGroup as group:
            raise first_kube_error(group) from None
        return Observed(
            decode_replica(cluster, out.get("obj"), self.storage, deployment=self.dep.name), out.get("lease")
        )

    async def _put(self, rep: Replica, body: dict[str, Any]) -> Replica:
        client = self.clusters.client(rep.cluster)
        query = {"fieldManager": FIELD_MANAGER}
        if rep.exists:
            resp = await client.request("PUT", self.path, body=body, query=query)
        else:
            resp = await client.request("POST", self.collection, body=body, query=query)
        return decode_replica(rep.cluster, resp.body, self.storage, deployment=self.dep.name)

    async def _cas(self, rep: Replica, stamp: Stamp, kind: Kind, text: str | None) -> ClusterResult[Replica]:
        """Give ``rep`` the promise (``text`` None) or the envelope ``text`` of ``stamp``,
        if the replica's rule lets it take it; compare-and-swap, re-judged on each retry."""
        cluster = rep.cluster

        def decide(rep: Replica) -> cas.Put[dict[str, Any]] | cas.Keep[ClusterResult[Replica]]:
            fenced = self._fenced(rep)
            if fenced is not None:
                return cas.Keep(ClusterResult(cluster, Outcome.CONFLICT, rep, detail=fenced))
            verdict = judge(rep, stamp, kind)
            if not verdict.accept:
                return cas.Keep(ClusterResult(cluster, Outcome.CONFLICT, rep, detail=verdict.reason))
            if verdict.done:
                return cas.Keep(ClusterResult(cluster, Outcome.OK, rep, detail=f"already holds {stamp.short()}"))
            return cas.Put(
                build_object(
                    rep,
                    name=self.name,
                    deployment=self.dep.name,
                    storage=self.storage,
                    promise=promise_after(rep, stamp, kind),
                    envelope_text=text,
                )
            )

        async def reread() -> Replica:
            return (await self._read_one(cluster, with_lease=False)).replica

        result = await cas.compare_and_swap(reread, decide, self._put, current=rep, reread_last=True)
        match result:
            case cas.Written(value=new):
                verb = "promised" if text is None else "wrote"
                return ClusterResult(cluster, Outcome.OK, new, detail=f"{verb} version {stamp.version}")
            case cas.Decided(value=done):
                return done
            case cas.WriteFailed(error=err):
                return _failed(cluster, err)
            case cas.ReadFailed(error=err):
                return _failed(cluster, err, definite=True)  # the last write was refused (409)
            case cas.Raced(current=last):
                return ClusterResult(
                    cluster, Outcome.CONFLICT, last, detail="lost the compare-and-swap race repeatedly"
                )
        assert_never(result)

    def _fenced(self, rep: Replica) -> str | None:
        """Why the object itself refuses this write, beyond the stamps' order: it notes a
        newer member set (written by coordinator) than this command counts with, so a
        member change began since this command read the members. A member change notes
        its joint set on the state objects of a majority of both sets before it copies the
        state, and every compare-and-swap is judged again on each retry: a write that
        lands after the note is refused, one that landed before is on a majority the
        copy reads."""
        noted = set_on_state(rep.obj) if rep.obj else None
        if noted is not None and noted.epoch > self.membership.epoch:
            return (
                f"refused: the members changed (member set epoch {noted.epoch} is noted here, this command "
                f"counts with epoch {self.membership.epoch})"
            )
        return None

    async def _read_all(
        self, *, early: bool = False, newer_ok: bool = False, writing: bool = False
    ) -> dict[str, ClusterResult[Observed]]:
        """Read every member with its lease (``early``: stop at a majority; ``writing``:
        the lease is needed, to check the lock). A replica written with a newer envelope
        schema stops the command, unless ``newer_ok``."""

        async def one(cluster: str) -> ClusterResult[Observed]:
            try:
                seen = await self._read_one(cluster, lease_required=writing)
            except KubeError as err:
                return _failed(cluster, err)
            return ClusterResult(cluster, Outcome.OK, seen)

        def enough(rs: Any) -> bool:
            return sum(1 for r in rs.values() if r.ok) >= self.q

        results = await fan_out(self.members, one, timeout=self.clusters.timeout, until=enough if early else None)
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            raise IdentityMismatchError(
                "Cluster identity mismatch — no state was read or written: "
                + "; ".join(f"cluster {k!r}: {r.detail}" for k, r in sorted(bad.items()))
                + ". Fix the kubeconfig context, or reconnect the cluster if it was really rebuilt."
            )
        newer = [rep for rep in _replicas(results).values() if rep.newer_schema]
        if newer and not newer_ok:
            raise StateConflictError(
                f"The state of {self.dep.name!r} on {', '.join(r.cluster for r in newer)} was written "
                f"with envelope schema {newer[0].newer_schema}, newer than this coordinator understands "
                f"({STATE_SCHEMA}). Upgrade coordinator; nothing was changed."
            )
        return results

    def _judge(
        self, results: Mapping[str, ClusterResult[Observed]], *, q: int | None = None
    ) -> tuple[Choice, int | None]:
        # Only a lease coordinator wrote is evidence of the tokens granted: one planted or
        # copied (anyone allowed to create Leases can make one) could vouch for any token.
        evidence = lease_evidence(
            (
                r.value.lease.token
                for r in results.values()
                if r.ok and r.value and r.value.lease and history_known(r.value.lease)
            ),
            q or self.q,
        )
        return choose(_replicas(results), evidence), evidence

    def _refuse_other_members(self, results: Mapping[str, ClusterResult[Observed]]) -> None:
        """Stop unless the members read confirm this machine's member set, as a lock
        acquisition checks it: a member storing another set under the same or a newer
        epoch means this machine's record is stale or divergent, and a majority counted
        over it is no majority (exit 5, with the `deployment import` hint); too few
        members confirming it is exit 5 too, or 4 when more answers could still confirm
        it. Where a lease says nothing (deleted, a tombstone, its set removed), the state
        object's own set speaks for the member, as it does for an acquisition."""
        verdict = self._members_verdict(results)
        if verdict.ok:
            return
        names = {self.clusters.record(m).identity: m for m in self.members}
        if verdict.verdict is Verdict.UNOBSERVABLE:
            raise NoQuorumError(verdict.explain(self.dep.name, names))
        raise MembershipError(verdict.explain(self.dep.name, names))

    def _members_verdict(self, results: Mapping[str, ClusterResult[Observed]]) -> Check:
        stored: dict[str, Stored] = {}
        for k, r in results.items():
            if not (r.ok and r.value):
                continue
            found = stored_in_lease(r.value.lease) if r.value.lease is not None else None
            if says_nothing(found, self.membership) and r.value.replica.obj:
                evidence = _envelope_evidence(r.value.replica.obj, secret=self.storage == "secret")
                kept = evidence[1] if evidence is not None else None
                # envelopes keep the set of their last write: an older epoch says nothing
                if isinstance(kept, Membership) and kept.epoch >= self.membership.epoch:
                    found = kept
            stored[k] = found
        return check_membership(self.membership, stored, self.members)

    def _need_quorum(self, results: Mapping[str, ClusterResult[Any]], what: str) -> None:
        seen = [k for k, r in results.items() if r.ok]
        if len(seen) < self.q:
            unseen = [f"{k} ({r.outcome}: {r.detail})" for k, r in sorted(results.items()) if not r.ok]
            unseen += [f"{k} (no answer)" for k in self.members if k not in results]
            raise NoQuorumError(
                f"Cannot {what} the state of {self.dep.name!r}: {len(seen)} of {self.n} clusters "
                f"answered, {self.q} are needed. Unobservable: {', '.join(unseen)}. An unobservable "
                "cluster is never taken as empty; retry when they are reachable."
            )

    def _refuse_unreadable(self, results: Mapping[str, ClusterResult[Observed]], choice: Choice, what: str) -> None:
        """With no trusted replica, the state is empty only if a majority holds none at
        all: corrupt and suspect replicas are never taken as empty, any more than
        unobservable ones are."""
        answered = _replicas(results)
        absent = [k for k, rep in answered.items() if rep.envelope is None and not rep.corrupt]
        absent = [k for k in absent if k not in choice.suspect]
        if not (choice.corrupt or choice.suspect) or len(absent) >= self.q:
            return
        from coordinator.text import printable

        name = self.dep.name
        # The reasons quote what the replicas hold (keys of a planted envelope): one line
        # each, escaped, in a paragraph whose own lines are kept.
        why = [f"{k}: corrupt ({printable(r)})" for k, r in sorted(choice.corrupt.items())]
        why += [f"{k}: suspect ({printable(r)})" for k, r in sorted(choice.suspect.items())]
        raise StateConflictError(
            f"Cannot {what} the state of {name!r}: no trusted replica was found and the ones on "
            f"{', '.join(sorted([*choice.corrupt, *choice.suspect]))} are corrupt or suspect ("
            + "; ".join(why)
            + f"), so it is not known to be empty. Nothing was changed. `coordinator state diff {name}` "
            f"shows every replica; `coordinator state sync {name} --from CLUSTER`, `coordinator state "
            f"restore {name} -f BACKUP` or `coordinator state apply {name} -f FILE` (under the lock) "
            "writes a whole valid state over them, saving the replicas it replaces to files first."
        )

    def _refuse_conflict(self, choice: Choice, what: str) -> None:
        if not choice.conflict:
            return
        name = self.dep.name
        raise StateConflictError(
            f"Cannot {what} the state of {name!r}: {', '.join(choice.conflict)} hold different data under "
            "the same stamp, which no write of coordinator produces (edited by hand?). Nothing was "
            f"changed. `coordinator state diff {name}` shows them; `coordinator state sync {name} --from "
            "CLUSTER` (under the lock) adopts one of them deliberately, as a new version."
        )

    # -- read

    async def read(self, *, repair: bool = True) -> ReadReport:
        """Read a majority; the newest trusted replica wins; stale ones are repaired first."""
        results = await self._read_all(early=True)
        choice, evidence = self._judge(results)
        odd = choice.corrupt or choice.suspect or choice.conflict or evidence is None
        odd = odd or not self._members_verdict(results).ok
        if len(results) < self.n and (odd or len(choice.current) + len(choice.stale) < self.q):
            # Something is off: hear every member (with fresh leases) before deciding.
            results = await self._read_all()
            choice, evidence = self._judge(results)
        self._need_quorum(results, "read")
        self._refuse_other_members(results)
        self._refuse_conflict(choice, "read")
        winner = choice.winner
        report = ReadReport(
            self.dep.name,
            winner.envelope if winner else None,
            winner.cluster if winner else None,
            results,
            corrupt=sorted(choice.corrupt),
            suspect=dict(choice.suspect),
        )
        if winner is None or winner.envelope is None:
            self._refuse_unreadable(results, choice, "read")
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
                lambda c: self._cas(reps[c], stamp, Kind.REPAIR, text),
                timeout=self.clusters.timeout,
            )
            report.repaired = sorted(k for k, r in repaired.items() if r.ok)
            current += len(report.repaired)
            if report.repaired:
                log.info("repaired stale replicas", clusters=report.repaired, stamp=str(stamp))
        if current < self.q:
            # The value is not yet on a majority; returning it could let a later read see
            # an older one. Say so instead of guessing.
            raise NoQuorumError(
                f"The newest state of {self.dep.name!r} (version {env.version}) is on {current} of "
                f"{self.n} clusters and could not be repaired onto a majority of {self.q}; "
                "retry when more clusters are reachable."
            )
        return report

    async def get(self, key: str | None = None) -> Any:
        report = await self.read()
        data = report.envelope.data if report.envelope else {}
        return get_path(data, key) if key else data

    # -- write

    def _resolve_lock(self, lock: LockArg) -> str:
        if isinstance(lock, str) and lock:
            return lock
        if lock is not None and not isinstance(lock, str):
            if not lock.valid:
                raise StateConflictError(
                    f"The lock on {self.dep.name!r} is no longer valid (lost or expired); nothing was written."
                )
            return lock.lock_id
        env = os.environ.get("COORDINATOR_LOCK_ID")
        if env:
            return env
        rec = self.recorded_lock(self.dep.name) if self.recorded_lock else None
        if rec is None:
            raise StateConflictError(
                f"Writing the state of {self.dep.name!r} needs its lock, and no lock is held: take it "
                f"with `coordinator lock acquire {self.dep.name}` (or run under `coordinator lock run`), "
                "or pass --lock-id. Nothing was written."
            )
        return rec.lock_id

    def _holder_token(self, seen: Mapping[str, Observed], lock_id: str) -> int:
        held_on = [
            k
            for k, o in seen.items()
            if o.lease is not None and o.lease.lock_id == lock_id and o.lease.expired() is not True
        ]
        if len(held_on) < self.q:
            raise StateConflictError(
                f"Lock id {lock_id} does not hold deployment {self.dep.name!r} on a majority "
                f"(it holds {len(held_on)} of {self.n}: {', '.join(held_on) or 'none'}); it expired, "
                "was released or was taken over. Nothing was written. Take the lock again."
            )
        return max(seen[k].lease.token for k in held_on)  # type: ignore[union-attr]

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
        if getattr(self.dep, "joint", None):
            raise StateConflictError(
                f"A member change of {self.dep.name!r} (to {', '.join(self.dep.joint or [])}) is in progress: "
                "run the same `coordinator deployment ...-cluster` command again to finish it before writing "
                "the state. Nothing was written."
            )
        lock_id = self._resolve_lock(lock)
        results = await self._read_all(writing=True)
        self._need_quorum(results, "write")
        self._refuse_other_members(results)
        seen = {k: r.value for k, r in results.items() if r.ok and r.value}
        reps = {k: o.replica for k, o in seen.items()}
        token = self._holder_token(seen, lock_id) if _token is None else _token
        choice, evidence = self._judge(results)
        overwrite: set[str] = set()
        current = choice.winner.envelope if choice.winner else None
        base: StateEnvelope | None
        if adopt_from is not None:
            source = reps.get(adopt_from)
            if source is None or source.envelope is None:
                why = "it did not answer" if source is None else (source.corrupt or "it holds no state")
                raise UsageError(
                    f"Cannot adopt the state of {self.dep.name!r} from {adopt_from}: {why}. Nothing was written."
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
                self._refuse_conflict(choice, "change")
            base = current
            if base is None and not replaces:
                self._refuse_unreadable(results, choice, "change")
        newer = newer_token(reps.values(), token, evidence)
        if newer is not None:
            raise StateConflictError(
                f"Refused: the state of {self.dep.name!r} was already written or promised with fencing token "
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
                f"The new state of {self.dep.name!r} is nested more than {MAX_DEPTH} levels deep, which no "
                "reader takes for a state (it would read as corrupt everywhere). Nothing was written."
            )
        problem = plain_data_problem(new)
        if problem:
            raise UsageError(
                f"The new state of {self.dep.name!r} holds a value that cannot be stored as JSON ({problem}): "
                "use string keys, and strings, finite numbers, booleans, null, lists and maps as values. "
                "Nothing was written."
            )
        stamp = next_stamp(reps.values(), token, evidence, new_write_id())
        _env, text = build_envelope(
            base,
            new,
            stamp,
            who=default_holder(),
            host=socket.gethostname(),
            command=command,
            now=datetime.now(UTC),
            members=self.members,
            member_ids={m: self.clusters.record(m).identity for m in self.members},
            namespace=self.dep.namespace,
            storage=self.storage,
            keys=changed_keys(old, new),
            note=note,
            membership=self.membership.document(),
            deployment=self.dep.name,
        )
        check_size(text, self.storage)
        saved = {
            k: str(self._save_replica(rep, backup_dir, choice.suspect.get(k) or rep.corrupt or "replaced"))
            for k, rep in reps.items()
            if rep.corrupt or k in overwrite
        }
        kinds = {k: Kind.OVERWRITE if k in overwrite else Kind.WRITE for k in reps}

        # Promise the stamp to a majority before any data leaves: a later writer then
        # reads it on any majority and draws a higher version.
        promises = await fan_out(
            list(reps),
            lambda c: self._cas(reps[c], stamp, Kind.PROMISE if kinds[c] is Kind.WRITE else Kind.OVERWRITE, None),
            timeout=self.clusters.timeout,
        )
        promised = sorted(k for k, r in promises.items() if r.ok)
        if len(promised) < self.q:
            self._fail_promise(stamp, results, promises, promised, saved)
        latest = dict(reps)
        for k, r in promises.items():
            if r.ok and r.value is not None:
                latest[k] = r.value
        writes = await fan_out(
            list(reps),
            lambda c: self._cas(latest[c], stamp, kinds[c], text),
            timeout=self.clusters.timeout,
        )
        merged: dict[str, ClusterResult[Any]] = {}
        for k in self.members:
            merged[k] = writes.get(k) or results.get(k) or ClusterResult(k, Outcome.UNREACHABLE, detail="no answer")
            if k not in writes and k in results and results[k].ok:
                merged[k] = ClusterResult(k, Outcome.UNREACHABLE, detail="write got no answer")
        confirmed = sorted(k for k, r in writes.items() if r.ok)
        outcome = write_outcome({k: _delivery(writes.get(k) or merged[k]) for k in reps}, self.q)
        report = WriteReport(
            self.dep.name, stamp.version, token, self.q, merged, confirmed, stamp.write_id, outcome, promised, saved
        )
        if outcome == "ok":
            return report
        per = _per_cluster(merged)
        if outcome == "nothing":
            report.outcome = "refused"
            raise StateConflictError(
                f"The write to {self.dep.name!r} was refused by every cluster ({per}). Nothing was written.",
                payload=report,
            )
        raise NoQuorumError(
            f"Outcome unknown: version {stamp.version} reached {len(confirmed)} of {self.n} clusters "
            f"({', '.join(confirmed) or 'none'}), fewer than the {self.q} needed ({per}). It may "
            f"still become visible: a later read repairs the newest replica onto the others; any later "
            f"write is ordered after it. Run `coordinator state diff {self.dep.name}` to see where it landed.",
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
        merged = {k: promises.get(k) or results.get(k) or ClusterResult(k, Outcome.UNREACHABLE) for k in self.members}
        refused = [k for k, r in promises.items() if r.outcome is Outcome.CONFLICT]
        report = WriteReport(
            self.dep.name,
            stamp.version,
            stamp.token,
            self.q,
            dict(merged),
            [],
            stamp.write_id,
            "refused",
            promised,
            saved,
        )
        per = _per_cluster(merged)
        head = (
            f"Nothing was written to {self.dep.name!r}: version {stamp.version} could be reserved on only "
            f"{len(promised)} of {self.n} clusters ({', '.join(promised) or 'none'}), fewer than the {self.q} "
            f"needed, so no data was sent ({per})."
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

    # -- diff / sync / history / backup / restore

    async def diff(self) -> list[dict[str, Any]]:
        """Every member's stamp, checksum and standing against the value a read returns."""
        results = await self._read_all(newer_ok=True)
        choice, _ = self._judge(results)
        top = choice.top
        conflict = set(choice.conflict)
        top_checksum = choice.winner.checksum if choice.winner else None
        rows = []
        for k in self.members:
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
        results = await self._read_all()
        self._need_quorum(results, "sync")
        if sources is None:
            self._refuse_other_members(results)
        judged = results if sources is None else {k: r for k, r in results.items() if k in sources}
        if sources is not None and sum(1 for r in judged.values() if r.ok) < quorum.quorum_size(len(sources)):
            # The value is chosen from the old members: a majority of them must answer, to
            # meet the majority that confirmed the last write.
            raise NoQuorumError(
                f"Cannot copy the state of {self.dep.name!r}: fewer than a majority of {', '.join(sources)} "
                f"answered ({_per_cluster(judged)}). Nothing was copied; retry when they answer."
            )
        choice, _ = self._judge(judged, q=None if sources is None else quorum.quorum_size(len(sources)))
        self._refuse_conflict(choice, "sync")
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
                f"`coordinator state sync {self.dep.name} --from CLUSTER` under the lock."
                if choice.suspect
                else ""
            )
            raise UsageError(f"No valid replica of the state of {self.dep.name!r} exists; nothing to sync.{more}")
        env = winner.envelope
        stamp = stamp_of(env)
        text = encode_envelope(env)
        reps = _replicas(results)
        # A corrupt replica that promised a newer stamp than the winner's may hold the
        # newest confirmed write (edited by hand since): overwriting it with the older
        # winner would roll that write back. A person must look first.
        newer = sorted(k for k in choice.corrupt if (reps[k].promise or stamp) > stamp)
        if newer:
            raise StateConflictError(
                f"Refusing to sync {self.dep.name!r}: the corrupt replica(s) on {', '.join(newer)} promised a "
                f"newer write than the newest readable one (version {env.version} on {winner.cluster}), so "
                "the newest confirmed state may be theirs. Nothing was written. Inspect them (`kubectl get "
                f"configmap {self.name} -o yaml`), then write the right document with `coordinator state "
                f"apply {self.dep.name} -f FILE` under the lock."
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
        saved = {k: str(self._save_replica(reps[k], backup_dir, why)) for k, why in corrupt.items()}
        targets = {k: Kind.REPAIR for k in stale} | {k: Kind.OVERWRITE for k in corrupt}
        fixed = await fan_out(
            list(targets),
            lambda c: self._cas(reps[c], stamp, targets[c], text),
            timeout=self.clusters.timeout,
        )
        repaired = sorted(k for k, r in fixed.items() if r.ok)
        return {
            "version": env.version,
            "token": env.token,
            "write_id": env.write_id,
            "winner": winner.cluster,
            "repaired": repaired,
            "failed": {k: f"{r.outcome}: {r.detail}" for k, r in fixed.items() if not r.ok},
            "unreachable": sorted(k for k in self.members if k not in results or not results[k].ok),
            "saved_corrupt": saved,
            "suspect": dict(choice.suspect),
            "holds_other": holds_other,
            "holding": sorted({*current, *repaired}),
        }

    async def adopt(self, source: str, *, lock: LockArg = None, backup_dir: Path | None = None) -> WriteReport:
        """`state sync --from SOURCE`: write SOURCE's data as a new version everywhere,
        overwriting suspect replicas (saved to files first), under the lock."""
        if source not in self.members:
            raise UsageError(
                f"{source!r} is not a member of deployment {self.dep.name!r} (members: {', '.join(self.members)})."
            )
        return await self.write(
            lambda old: old, lock=lock, command=f"state sync --from {source}", adopt_from=source, backup_dir=backup_dir
        )

    def _save_replica(self, rep: Replica, backup_dir: Path | None, reason: str) -> Path:
        import platformdirs

        from coordinator.files import write_private

        folder = backup_dir or Path(platformdirs.user_state_dir("coordinator")) / "corrupt-replicas"
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        # The replica may hold secret state: 0600 in a 0700 folder (the default one narrowed).
        path = write_private(
            folder / f"{self.dep.name}-{rep.cluster}-{stamp}.json",
            json.dumps({"cluster": rep.cluster, "reason": reason, "object": rep.obj}, indent=2),
            own_folder=backup_dir is None,
        )
        log.warning("saved a replica before overwriting it", cluster=rep.cluster, path=str(path))
        return path

    async def history(self) -> list[AuditEntry]:
        report = await self.read()
        return list(report.envelope.history) if report.envelope else []

    async def backup(self, path: Path) -> StateEnvelope:
        report = await self.read()
        if report.envelope is None:
            raise UsageError(f"The deployment {self.dep.name!r} has no state yet; nothing to back up.")
        from coordinator.config import _atomic_write

        try:
            _atomic_write(path, json.dumps(report.envelope.model_dump(mode="json", by_alias=True), indent=2) + "\n")
        except OSError as err:
            raise UsageError(f"Cannot write the backup file {path}: {err.strerror or err}.") from err
        return report.envelope

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


def _replicas(results: Mapping[str, ClusterResult[Observed]]) -> dict[str, Replica]:
    return {k: r.value.replica for k, r in results.items() if r.ok and r.value}


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
    rep = decode_replica("file", {"data": {DATA_KEY: text}}, "configmap")
    if rep.newer_schema:
        raise StateConflictError(
            f"The backup {path} has envelope schema {rep.newer_schema}, newer than this coordinator "
            f"understands ({STATE_SCHEMA}). Upgrade coordinator."
        )
    if rep.envelope is None:
        raise UsageError(f"The backup file {path} is not a valid state envelope: {rep.corrupt}. Nothing was written.")
    return rep.envelope
