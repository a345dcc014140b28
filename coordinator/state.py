"""The replicated state register of a deployment.

One object per member cluster (ConfigMap, or Secret on request) named
``coordinator-state-<deployment>`` holds an envelope ``{schema, version, token,
checksum, written_by, written_at, members, data, history}``. Replicas are ordered by
(fencing token, version).

* **Write** (needs the lock): read the lease and the replica on every member at once;
  the lock must be held on a majority; version = highest seen + 1; compare-and-swap on
  every member; succeed when q replicas confirm. A replica never takes a write whose
  token is lower than its own (fencing), nor an older version. A write that reached
  some replicas but not q is reported as "outcome unknown", never as "not written".
* **Read**: a majority answers; the highest (token, version) wins; replicas behind it
  are repaired (written back) before the value is returned, so the value returned is on
  a majority and no later read can return an older one.
* **Corrupt replicas** (not JSON, wrong checksum, missing fields) never win; ``diff``
  names them and ``sync`` overwrites them only after saving their content to a file.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import ValidationError

from coordinator import quorum
from coordinator.clusters import failed
from coordinator.errors import NoQuorumError, StateConflictError, UsageError
from coordinator.fanout import ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.kube.resources import (
    FIELD_MANAGER,
    configmaps_path,
    owned_metadata,
    secrets_path,
    state_name,
)
from coordinator.lock import LeaseView, default_holder, first_kube_error
from coordinator.logs import get_logger
from coordinator.models import (
    HISTORY_LIMIT,
    STATE_SCHEMA,
    AuditEntry,
    DeploymentRecord,
    StateEnvelope,
)
from coordinator.outcome import Outcome

if TYPE_CHECKING:
    from coordinator.api import Coordinator, HeldLock

log = get_logger(__name__)

DATA_KEY = "envelope.json"
# A ConfigMap or Secret may hold 1 MiB; keep room for metadata and the history.
OBJECT_LIMIT = 1024 * 1024
ENVELOPE_LIMIT = OBJECT_LIMIT - 16 * 1024


def checksum(data: dict[str, Any]) -> str:
    canon = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring an older envelope up to the current schema (schema 0: no ``schema`` field,
    history entries without ``keys``)."""
    doc = dict(raw)
    schema = doc.get("schema", 0)
    if schema == 0:
        doc["schema"] = 1
        doc.setdefault("members", [])
        doc["history"] = [dict(h, keys=h.get("keys", [])) for h in doc.get("history") or []]
    return doc


# ------------------------------------------------------------------ one replica


@dataclass
class Replica:
    """One cluster's copy, as read."""

    cluster: str
    exists: bool
    envelope: StateEnvelope | None = None
    corrupt: str | None = None  # why it cannot be trusted
    newer_schema: int | None = None
    raw: str | None = None
    obj: dict[str, Any] = field(default_factory=dict)
    lease: LeaseView | None = None

    @property
    def order(self) -> tuple[int, int]:
        if self.envelope is None:
            return (0, 0)
        return self.envelope.order()

    @property
    def resource_version(self) -> str | None:
        return (self.obj.get("metadata") or {}).get("resourceVersion")


def decode_replica(cluster: str, obj: dict[str, Any] | None, storage: str) -> Replica:
    if not obj:
        return Replica(cluster, exists=False)
    rep = Replica(cluster, exists=True, obj=obj)
    raw = (obj.get("data") or {}).get(DATA_KEY)
    if raw is None:
        rep.corrupt = f"the object has no {DATA_KEY} key"
        return rep
    if storage == "secret":
        try:
            raw = base64.b64decode(raw).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            rep.corrupt = "the Secret's value is not base64 UTF-8"
            rep.raw = str(raw)
            return rep
    rep.raw = str(raw)
    try:
        doc = json.loads(rep.raw)
    except ValueError as err:
        rep.corrupt = f"not JSON ({err})"
        return rep
    if not isinstance(doc, dict):
        rep.corrupt = "not a JSON object"
        return rep
    schema = doc.get("schema", 0)
    if isinstance(schema, int) and schema > STATE_SCHEMA:
        rep.newer_schema = schema
        return rep
    try:
        env = StateEnvelope.model_validate(migrate(doc))
    except ValidationError as err:
        first = err.errors()[0]
        rep.corrupt = f"invalid envelope: {'.'.join(map(str, first['loc']))}: {first['msg']}"
        return rep
    if checksum(env.data) != env.checksum:
        rep.corrupt = "checksum mismatch (data edited by hand?)"
        return rep
    rep.envelope = env
    return rep


def encode_envelope(env: StateEnvelope) -> str:
    return json.dumps(env.model_dump(mode="json", by_alias=True), sort_keys=False, separators=(",", ":"))


def check_size(text: str, storage: str) -> None:
    size = len(text.encode())
    stored = size * 4 // 3 + 4 if storage == "secret" else size
    if stored > ENVELOPE_LIMIT:
        raise UsageError(
            f"The state document would take {stored:,} bytes in the {storage}, over the limit of "
            f"{ENVELOPE_LIMIT:,} bytes (a Kubernetes object holds at most 1 MiB, envelope and "
            "history included). Nothing was written. Keep large artifacts elsewhere and store "
            "a reference to them."
        )


# ------------------------------------------------------------------ dotted keys


def get_path(data: Any, key: str) -> Any:
    cur = data
    for part in key.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
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


# ------------------------------------------------------------------ results


@dataclass
class WriteReport:
    deployment: str
    version: int
    token: int
    quorum: int
    results: dict[str, ClusterResult[Replica]]
    confirmed: list[str]

    @property
    def lagging(self) -> list[str]:
        return sorted(k for k, r in self.results.items() if not r.ok)


@dataclass
class ReadReport:
    deployment: str
    envelope: StateEnvelope | None
    winner: str | None
    replicas: dict[str, ClusterResult[Replica]]
    repaired: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ the client


class StateClient:
    """The state of one deployment (``Coordinator.state(name)``)."""

    def __init__(self, coordinator: Coordinator, deployment: DeploymentRecord) -> None:
        self.c = coordinator
        self.dep = deployment
        self.members = list(deployment.clusters)
        self.n = len(self.members)
        self.q = quorum.quorum_size(self.n)
        self.name = state_name(deployment.name)
        self.storage = deployment.storage
        base = secrets_path if self.storage == "secret" else configmaps_path
        self.collection = base(deployment.namespace)
        self.path = f"{self.collection}/{self.name}"

    @property
    def clusters(self):  # type: ignore[no-untyped-def]
        return self.c.clusters

    # -- raw replica I/O

    async def _read_replica(self, cluster: str, *, with_lease: bool = False) -> Replica:
        """Identity check, replica read (and the lease, for writers) in one round trip."""
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
            from coordinator.kube.resources import lease_name, lease_path

            try:
                resp = await client.request("GET", lease_path(self.dep.namespace, lease_name(self.dep.name)))
                out["lease"] = LeaseView.parse(resp.body, resp.server_time)
            except KubeError as err:
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
        rep = decode_replica(cluster, out.get("obj"), self.storage)
        rep.lease = out.get("lease")
        return rep

    def _object(self, rep: Replica, env: StateEnvelope) -> dict[str, Any]:
        text = encode_envelope(env)
        value = base64.b64encode(text.encode()).decode() if self.storage == "secret" else text
        if rep.exists:
            obj = copy.deepcopy(rep.obj)
            meta = obj.setdefault("metadata", {})
            labels = dict(meta.get("labels") or {})
            labels.update(owned_metadata(self.name, self.dep.name)["labels"])
            meta["labels"] = labels
        else:
            obj = {
                "apiVersion": "v1",
                "kind": "Secret" if self.storage == "secret" else "ConfigMap",
                "metadata": owned_metadata(self.name, self.dep.name),
            }
        obj["data"] = {DATA_KEY: value}
        if self.storage == "secret":
            obj["type"] = "Opaque"
        return obj

    async def _put(self, rep: Replica, env: StateEnvelope) -> Replica:
        client = self.clusters.client(rep.cluster)
        body = self._object(rep, env)
        query = {"fieldManager": FIELD_MANAGER}
        if rep.exists:
            resp = await client.request("PUT", self.path, body=body, query=query)
        else:
            resp = await client.request("POST", self.collection, body=body, query=query)
        return decode_replica(rep.cluster, resp.body, self.storage)

    async def _cas_write(self, rep: Replica, env: StateEnvelope, *, repair: bool = False) -> ClusterResult[Replica]:
        """Write ``env`` unless the replica already holds a higher token or version."""
        cluster = rep.cluster
        for _ in range(4):
            if rep.newer_schema:
                return ClusterResult(
                    cluster,
                    Outcome.CONFLICT,
                    rep,
                    detail=f"replica has schema {rep.newer_schema}, newer than {STATE_SCHEMA}",
                )
            if rep.envelope is not None:
                if rep.envelope.token > env.token:
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        rep,
                        detail=f"refused: replica has fencing token {rep.envelope.token} > {env.token}",
                    )
                if rep.envelope.order() >= env.order():
                    if repair:
                        return ClusterResult(cluster, Outcome.OK, rep, detail="already current")
                    return ClusterResult(
                        cluster,
                        Outcome.CONFLICT,
                        rep,
                        detail=f"refused: replica has version {rep.envelope.version} >= {env.version}",
                    )
            elif rep.corrupt and repair:
                return ClusterResult(cluster, Outcome.ERROR, rep, detail=f"corrupt ({rep.corrupt}); run `state sync`")
            try:
                new = await self._put(rep, env)
                return ClusterResult(cluster, Outcome.OK, new, detail=f"wrote version {env.version}")
            except KubeError as err:
                if err.kind not in (kube.CONFLICT, kube.ALREADY_EXISTS):
                    return failed(cluster, err)  # type: ignore[return-value]
            try:
                rep = await self._read_replica(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
        return ClusterResult(cluster, Outcome.CONFLICT, rep, detail="lost the compare-and-swap race repeatedly")

    async def _read_all(
        self, *, with_lease: bool = False, early: bool = False, newer_ok: bool = False
    ) -> dict[str, ClusterResult[Replica]]:
        """Read every member (``early``: stop at a majority). A replica written with a newer
        envelope schema stops the command, unless ``newer_ok`` (reports that only look)."""

        async def one(cluster: str) -> ClusterResult[Replica]:
            try:
                rep = await self._read_replica(cluster, with_lease=with_lease)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            return ClusterResult(cluster, Outcome.OK, rep)

        def enough(rs: Any) -> bool:
            return sum(1 for r in rs.values() if r.ok) >= self.q

        results = await fan_out(self.members, one, timeout=self.clusters.timeout, until=enough if early else None)
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            from coordinator.errors import IdentityMismatchError

            raise IdentityMismatchError(
                "Cluster identity mismatch — no state was read or written: "
                + "; ".join(f"cluster {k!r}: {r.detail}" for k, r in sorted(bad.items()))
                + ". Fix the kubeconfig context, or reconnect the cluster if it was really rebuilt."
            )
        newer = [r.value for r in results.values() if r.ok and r.value and r.value.newer_schema]
        if newer and not newer_ok:
            raise StateConflictError(
                f"The state of {self.dep.name!r} on {', '.join(r.cluster for r in newer)} was written "
                f"with envelope schema {newer[0].newer_schema}, newer than this coordinator understands "
                f"({STATE_SCHEMA}). Upgrade coordinator; nothing was changed."
            )
        return results

    def _need_quorum(self, results: dict[str, ClusterResult[Replica]], what: str) -> None:
        seen = [k for k, r in results.items() if r.ok]
        if len(seen) < self.q:
            unseen = [f"{k} ({r.outcome}: {r.detail})" for k, r in sorted(results.items()) if not r.ok]
            unseen += [f"{k} (no answer)" for k in self.members if k not in results]
            raise NoQuorumError(
                f"Cannot {what} the state of {self.dep.name!r}: {len(seen)} of {self.n} clusters "
                f"answered, {self.q} are needed. Unobservable: {', '.join(unseen)}. An unobservable "
                "cluster is never taken as empty; retry when they are reachable."
            )

    def _refuse_unreadable(self, results: dict[str, ClusterResult[Replica]], what: str) -> None:
        """With no valid replica, the state is empty only if a majority holds none at all:
        corrupt replicas are never taken as empty, any more than unobservable ones are."""
        answered = {k: r.value for k, r in results.items() if r.ok and r.value}
        corrupt = {k: rep.corrupt for k, rep in answered.items() if rep.corrupt}
        absent = [k for k, rep in answered.items() if not rep.exists]
        if not corrupt or len(absent) >= self.q:
            return
        name = self.dep.name
        raise StateConflictError(
            f"Cannot {what} the state of {name!r}: no valid replica was found and the ones on "
            f"{', '.join(sorted(corrupt))} are corrupt ("
            + "; ".join(f"{k}: {why}" for k, why in sorted(corrupt.items()))
            + f"), so it is not known to be empty. Nothing was changed. `coordinator state diff {name}` "
            f"shows every replica; `coordinator state restore {name} -f BACKUP` or `coordinator state "
            f"apply {name} -f FILE` (under the lock) writes a whole valid state over them, saving the "
            "corrupt replicas to files first."
        )

    # -- read

    @staticmethod
    def _winner(results: dict[str, ClusterResult[Replica]]) -> Replica | None:
        valid = {k: r.value for k, r in results.items() if r.ok and r.value and r.value.envelope}
        if not valid:
            return None
        best = quorum.newest({k: v.order for k, v in valid.items()})
        return valid[best] if best else None

    async def read(self, *, repair: bool = True) -> ReadReport:
        """Read a majority; the newest replica wins; stale ones are repaired first."""
        results = await self._read_all(early=True)
        if len(results) < self.n and any(r.ok and r.value and r.value.corrupt for r in results.values()):
            # A corrupt replica counts for nothing: hear every member before deciding.
            results = await self._read_all()
        self._need_quorum(results, "read")
        winner = self._winner(results)
        report = ReadReport(
            self.dep.name, winner.envelope if winner else None, winner.cluster if winner else None, results
        )
        report.corrupt = sorted(k for k, r in results.items() if r.ok and r.value and r.value.corrupt)
        if winner is None or winner.envelope is None:
            self._refuse_unreadable(results, "read")
            return report
        if not repair:
            return report
        env = winner.envelope
        stale = [
            r.value
            for r in results.values()
            if r.ok and r.value and not r.value.corrupt and r.value.order < env.order()
        ]
        current = sum(1 for r in results.values() if r.ok and r.value and r.value.order == env.order())
        if stale:
            repaired = await fan_out(
                [s.cluster for s in stale],
                lambda c: self._cas_write(next(s for s in stale if s.cluster == c), env, repair=True),
                timeout=self.clusters.timeout,
            )
            report.repaired = sorted(k for k, r in repaired.items() if r.ok)
            current += len(report.repaired)
            if report.repaired:
                log.info("repaired stale replicas", clusters=report.repaired, version=env.version)
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

    def _resolve_lock(self, lock: HeldLock | str | None) -> str:
        from coordinator.api import HeldLock

        if isinstance(lock, HeldLock):
            if not lock.valid:
                raise StateConflictError(
                    f"The lock on {self.dep.name!r} is no longer valid (lost or expired); nothing was written."
                )
            return lock.lock_id
        if lock:
            return lock
        env = os.environ.get("COORDINATOR_LOCK_ID")
        if env:
            return env
        rec = self.c.recorded_lock(self.dep.name)
        if rec is None:
            raise StateConflictError(
                f"Writing the state of {self.dep.name!r} needs its lock, and no lock is held: take it "
                f"with `coordinator lock acquire {self.dep.name}` (or run under `coordinator lock run`), "
                "or pass --lock-id. Nothing was written."
            )
        return rec.lock_id

    async def write(
        self,
        change: Any,
        *,
        lock: HeldLock | str | None = None,
        command: str = "api",
        note: str | None = None,
        replaces: bool = False,
        _token: int | None = None,
    ) -> WriteReport:
        """Apply ``change(data) -> new data`` as a new version on every member.

        ``replaces``: the change ignores the old data (apply, restore), so it may be
        written over replicas that are all corrupt; a change that builds on the old data
        may not. Corrupt replicas are saved to files before they are overwritten.

        ``_token`` is for tests of fencing only: it skips the lease check and writes with
        the given token, as a holder whose lease was taken over in the meantime would.
        """
        lock_id = self._resolve_lock(lock)
        results = await self._read_all(with_lease=_token is None)
        self._need_quorum(results, "write")
        reps = {k: r.value for k, r in results.items() if r.ok and r.value}
        if _token is None:
            held_on = [
                k
                for k, rep in reps.items()
                if rep.lease and rep.lease.lock_id == lock_id and rep.lease.expired() is not True
            ]
            if len(held_on) < self.q:
                raise StateConflictError(
                    f"Lock id {lock_id} does not hold deployment {self.dep.name!r} on a majority "
                    f"(it holds {len(held_on)} of {self.n}: {', '.join(held_on) or 'none'}); it expired, "
                    "was released or was taken over. Nothing was written. Take the lock again."
                )
            token = max(reps[k].lease.token for k in held_on)  # type: ignore[union-attr]
        else:
            token = _token
        winner = self._winner(results)
        base = winner.envelope if winner else None
        if base is None and not replaces:
            self._refuse_unreadable(results, "change")
        top = max((rep.envelope.token for rep in reps.values() if rep.envelope), default=0)
        if top > token:
            raise StateConflictError(
                f"Refused: the state of {self.dep.name!r} was already written with fencing token {top}, "
                f"higher than this lock's token {token}; a newer holder has taken over. Nothing was written."
            )
        old = copy.deepcopy(base.data) if base else {}
        new = change(copy.deepcopy(old))
        if not isinstance(new, dict):
            raise UsageError("The state document must be a mapping at the top level.")
        try:
            # NaN and infinities would be stored as null, and the checksum would not match.
            json.dumps(new, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise UsageError(
                f"The new state of {self.dep.name!r} holds a value that cannot be stored as JSON ({err}): "
                "use strings, finite numbers, booleans, lists and maps. Nothing was written."
            ) from err
        version = max((rep.envelope.version for rep in reps.values() if rep.envelope), default=0) + 1
        history = list(base.history) if base else []
        history.append(
            AuditEntry(
                at=datetime.now(UTC),
                who=default_holder(),
                host=socket.gethostname(),
                command=command,
                version=version,
                token=token,
                keys=changed_keys(old, new),
                note=note,
            )
        )
        env = StateEnvelope(
            schema=STATE_SCHEMA,
            version=version,
            token=token,
            checksum=checksum(new),
            written_by=default_holder(),
            written_at=datetime.now(UTC),
            members=self.members,
            member_ids={m: self.clusters.record(m).identity for m in self.members},
            namespace=self.dep.namespace,
            storage=self.storage,
            data=new,
            history=history[-HISTORY_LIMIT:],
        )
        text = encode_envelope(env)
        while len(text.encode()) > ENVELOPE_LIMIT and len(env.history) > 1:
            env.history = env.history[len(env.history) // 2 :]
            text = encode_envelope(env)
        check_size(text, self.storage)
        for rep in reps.values():
            if rep.corrupt:
                self._save_corrupt(rep, None)
        writes = await fan_out(list(reps), lambda c: self._cas_write(reps[c], env), timeout=self.clusters.timeout)
        merged: dict[str, ClusterResult[Replica]] = {}
        for k in self.members:
            merged[k] = writes.get(k) or results.get(k) or ClusterResult(k, Outcome.UNREACHABLE, detail="no answer")
            if k not in writes and k in results and results[k].ok:
                merged[k] = ClusterResult(k, Outcome.UNREACHABLE, detail="write got no answer")
        confirmed = sorted(k for k, r in writes.items() if r.ok)
        report = WriteReport(self.dep.name, version, token, self.q, merged, confirmed)
        if len(confirmed) >= self.q:
            return report
        refused = [k for k, r in writes.items() if r.outcome is Outcome.CONFLICT]
        # A write sent without an answer (timeout, lost connection, server error) may have
        # been applied all the same: "nothing was written" only when every one said no.
        unanswered = [
            k for k, r in writes.items() if not r.ok and r.outcome not in (Outcome.CONFLICT, Outcome.FORBIDDEN)
        ]
        per = "; ".join(f"{k}: {r.outcome} ({r.detail})" for k, r in sorted(merged.items()))
        if not confirmed and refused and not unanswered:
            raise StateConflictError(
                f"The write to {self.dep.name!r} was refused ({per}). Another writer with a newer "
                "fencing token or version got there first. Nothing was written.",
                payload=report,
            )
        raise NoQuorumError(
            f"Outcome unknown: version {version} reached {len(confirmed)} of {self.n} clusters "
            f"({', '.join(confirmed) or 'none'}), fewer than the {self.q} needed ({per}). It may "
            f"still become visible: a later read repairs the newest replica onto the others. Run "
            f"`coordinator state diff {self.dep.name}` to see where it landed.",
            payload=report,
        )

    async def set(
        self, values: dict[str, Any], *, lock: HeldLock | str | None = None, command: str = "state set"
    ) -> WriteReport:
        def change(data: dict[str, Any]) -> dict[str, Any]:
            for key, value in values.items():
                set_path(data, key, value)
            return data

        return await self.write(change, lock=lock, command=command)

    async def apply(
        self, document: dict[str, Any], *, lock: HeldLock | str | None = None, command: str = "state apply"
    ) -> WriteReport:
        if not isinstance(document, dict):
            raise UsageError("The state document must be a mapping at the top level.")
        return await self.write(lambda _old: document, lock=lock, command=command, replaces=True)

    # -- diff / sync / history / backup / restore

    async def diff(self) -> list[dict[str, Any]]:
        results = await self._read_all(newer_ok=True)
        winner = self._winner(results)
        top = winner.order if winner else (0, 0)
        rows = []
        for k in self.members:
            r = results.get(k)
            row: dict[str, Any] = {
                "name": k,
                "status": None,
                "version": None,
                "token": None,
                "checksum": None,
                "written_by": None,
                "written_at": None,
                "detail": None,
            }
            if r is None or not r.ok or r.value is None:
                row["status"] = str(r.outcome) if r else "unreachable"
                row["detail"] = r.detail if r else "no answer"
            else:
                rep = r.value
                if rep.corrupt:
                    row["status"], row["detail"] = "corrupt", rep.corrupt
                elif rep.newer_schema:
                    row["status"] = "newer-schema"
                    row["detail"] = (
                        f"written with envelope schema {rep.newer_schema}, newer than this coordinator "
                        f"understands ({STATE_SCHEMA}); upgrade coordinator to read or write it"
                    )
                elif not rep.exists:
                    row["status"] = "absent" if winner else "empty"
                elif rep.envelope is not None:
                    env = rep.envelope
                    row.update(
                        version=env.version,
                        token=env.token,
                        checksum=env.checksum,
                        written_by=env.written_by,
                        written_at=env.written_at,
                    )
                    row["status"] = "current" if rep.order == top else "behind"
            rows.append(row)
        return rows

    async def sync(self, backup_dir: Path | None = None) -> dict[str, Any]:
        """Bring every reachable replica to the winning version; save corrupt ones first."""
        results = await self._read_all()
        self._need_quorum(results, "sync")
        winner = self._winner(results)
        if winner is None or winner.envelope is None:
            raise UsageError(f"No valid replica of the state of {self.dep.name!r} exists; nothing to sync.")
        env = winner.envelope
        saved: dict[str, str] = {}
        for k, r in results.items():
            if r.ok and r.value and r.value.corrupt:
                saved[k] = str(self._save_corrupt(r.value, backup_dir))
        targets = {k: r.value for k, r in results.items() if r.ok and r.value and r.value.order < env.order()}

        async def fix(c: str) -> ClusterResult[Replica]:
            rep = targets[c]
            assert rep is not None
            if rep.corrupt:
                rep = Replica(c, exists=True, obj=rep.obj)  # saved above; overwrite
            return await self._cas_write(rep, env, repair=True)

        fixed = await fan_out(list(targets), fix, timeout=self.clusters.timeout)
        return {
            "version": env.version,
            "token": env.token,
            "winner": winner.cluster,
            "repaired": sorted(k for k, r in fixed.items() if r.ok),
            "failed": {k: f"{r.outcome}: {r.detail}" for k, r in fixed.items() if not r.ok},
            "unreachable": sorted(k for k in self.members if k not in results or not results[k].ok),
            "saved_corrupt": saved,
        }

    def _save_corrupt(self, rep: Replica, backup_dir: Path | None) -> Path:
        import platformdirs

        folder = backup_dir or Path(platformdirs.user_state_dir("coordinator")) / "corrupt-replicas"
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        path = folder / f"{self.dep.name}-{rep.cluster}-{stamp}.json"
        path.write_text(json.dumps({"cluster": rep.cluster, "reason": rep.corrupt, "object": rep.obj}, indent=2))
        log.warning("saved corrupt replica before overwriting it", cluster=rep.cluster, path=str(path))
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

    async def restore(self, path: Path, *, lock: HeldLock | str | None = None) -> WriteReport:
        env = load_backup(path)
        return await self.write(
            lambda _old: copy.deepcopy(env.data),
            lock=lock,
            command="state restore",
            replaces=True,
            note=f"restored from {path.name} (version {env.version}, token {env.token}, "
            f"written by {env.written_by} at {env.written_at.isoformat()})",
        )


def load_backup(path: Path) -> StateEnvelope:
    try:
        text = path.read_text(encoding="utf-8")
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
