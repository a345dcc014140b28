"""`coordinator cluster restored NAME`: a member whose etcd was restored from a backup.

A restore brings the member's objects back as they were: the same uids, older holders and
older fencing tokens, with nothing in them that says so. Where the lock held only a bare
majority that included this member, the writes it lost were the evidence that the lock
was held (and of the token it was granted with), and the other members of that majority
may not be read by the next contender: a second holder could enter with a token already
given out. So the operator says the member was restored, and every coordinator lease on it
becomes a tombstone: held by an unknown holder for one maximum TTL, with no token history
(coordinator/rules/lease.py). Every lock that was live when the member was restored has ended
before such a lease can be taken, and the next token is proven by the other members.

The member's state objects come back with the member-set note of the backup's day too, and
with its leases tombstoned (silent) that note would speak for the member: a machine whose
record predates a member change made since would find it agreeing. So the note is removed
from every coordinator state object on the member; a state object without one stays
silent (coordinator/engine/lock/floor.py), and the member speaks by its leases again once
they are taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from coordinator import clock
from coordinator.engine import cas
from coordinator.engine.clusters import ClusterSet
from coordinator.kube import client as kube
from coordinator.kube.client import KubeClient, KubeError
from coordinator.rules.evidence import with_records
from coordinator.rules.lease import A_NEXT, A_UID, A_VANISHED, HOLDER_ANNOTATIONS
from coordinator.rules.membership import A_MEMBERSHIP
from coordinator.rules.resources import FIELD_MANAGER, micro_time, state_paths

ALL_LEASES = "/apis/coordination.k8s.io/v1/leases"
LEASE_PREFIX = "coordinator-lock-"


# The state object's kind by the deployment's storage (resources.state_paths).
STATE_KINDS = (("ConfigMap", "configmap"), ("Secret", "secret"))


@dataclass
class Tombstoned:
    """What became of one lease (or state object) of the restored member."""

    namespace: str
    deployment: str
    outcome: str  # ok, or why not
    detail: str
    object: str = "lease"


def tombstone_body(obj: dict[str, Any], now: str) -> dict[str, Any]:
    """``obj`` as a tombstone: no holder (the field kept, empty, as coordinator's), marked
    vanished now, its token kept as a lower bound only (a tombstone keeps no history)."""
    body = {k: v for k, v in obj.items() if k != "status"}
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in (*HOLDER_ANNOTATIONS, A_NEXT)}
    ann[A_VANISHED] = now
    if meta.get("uid"):
        ann[A_UID] = str(meta["uid"])
    meta["annotations"] = ann
    spec = {k: v for k, v in (body.get("spec") or {}).items() if k not in ("acquireTime", "renewTime")}
    spec["holderIdentity"] = ""
    body["metadata"], body["spec"] = meta, spec
    return body


async def _tombstone(client: KubeClient, item: dict[str, Any]) -> Tombstoned | None:
    meta = item.get("metadata") or {}
    lease = str(meta.get("name", ""))
    if not lease.startswith(LEASE_PREFIX):
        return None
    namespace = str(meta.get("namespace", ""))
    deployment = lease[len(LEASE_PREFIX) :]
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
    now = micro_time(clock.wall_now())

    async def read() -> dict[str, Any]:
        body: dict[str, Any] = (await client.request("GET", path)).body
        return body

    def decide(obj: dict[str, Any]) -> cas.Put[dict[str, Any]] | cas.Keep[None]:
        return cas.Put(tombstone_body(obj, now))

    async def write(obj: dict[str, Any], body: dict[str, Any]) -> None:
        body = with_records(body, obj, clock.token_hex(6))
        await client.request("PUT", path, body=body, query={"fieldManager": FIELD_MANAGER})

    result = await cas.compare_and_swap(read, decide, write, current=item)
    match result:
        case cas.Written() | cas.Decided():
            return Tombstoned(namespace, deployment, "ok", "tombstoned: blocks for one maximum TTL")
        case cas.ReadFailed(error=err) | cas.WriteFailed(error=err):
            if err.kind == kube.NOT_FOUND:
                return Tombstoned(namespace, deployment, "ok", "deleted meanwhile: a missing lease blocks too")
            return Tombstoned(namespace, deployment, str(err.kind), err.detail)
        case cas.Raced():
            return Tombstoned(namespace, deployment, "conflict", "lost the compare-and-swap race repeatedly")
    assert_never(result)


def silenced_state_body(obj: dict[str, Any]) -> dict[str, Any] | None:
    """``obj`` (a state object) without its member-set note; None when it has none."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if A_MEMBERSHIP not in annotations:
        return None
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in annotations.items() if k != A_MEMBERSHIP}
    return {**obj, "metadata": meta}


async def _silence(client: KubeClient, namespace: str, deployment: str, path: str, item: dict[str, Any]) -> Tombstoned:
    """Remove the member-set note from one state object (see the module doc), ``item`` as
    just read at ``path``."""

    async def read() -> dict[str, Any]:
        body: dict[str, Any] = (await client.request("GET", path)).body
        return body

    def decide(obj: dict[str, Any]) -> cas.Put[dict[str, Any]] | cas.Keep[None]:
        body = silenced_state_body(obj)
        return cas.Keep(None) if body is None else cas.Put(body)

    async def write(obj: dict[str, Any], body: dict[str, Any]) -> None:
        body = with_records(body, obj, clock.token_hex(6))
        await client.request("PUT", path, body=body, query={"fieldManager": FIELD_MANAGER})

    result = await cas.compare_and_swap(read, decide, write, current=item)
    match result:
        case cas.Written() | cas.Decided():
            return Tombstoned(namespace, deployment, "ok", "member-set note removed", object="state")
        case cas.ReadFailed(error=err) | cas.WriteFailed(error=err):
            if err.kind == kube.NOT_FOUND:
                return Tombstoned(namespace, deployment, "ok", "deleted meanwhile", object="state")
            return Tombstoned(namespace, deployment, str(err.kind), err.detail, object="state")
        case cas.Raced():
            return Tombstoned(namespace, deployment, "conflict", "lost the compare-and-swap race repeatedly",
                              object="state")  # fmt: skip
    assert_never(result)


async def tombstone_member(
    clusters: ClusterSet, name: str, known: Sequence[tuple[str, str]] = ()
) -> tuple[list[Tombstoned], KubeError | None]:
    """Make every coordinator lease on cluster ``name`` a tombstone, and remove the
    member-set note of every coordinator state object there. Returns what became of
    each, and the error that kept the leases from being listed (None if they were).

    Objects are found by name, not by coordinator's label, which anyone who may edit
    them can remove: every Lease of the cluster is listed and those named
    ``coordinator-lock-*`` are tombstoned; the state objects are looked up by name in
    each (namespace, deployment) those leases name and in ``known`` (the deployments
    this machine records with ``name`` as a member: their lease may be gone)."""
    client = clusters.client(name)
    try:
        await clusters.check_identity(name)
        listed = (await client.request("GET", ALL_LEASES)).body
    except KubeError as err:
        return [], err
    done: list[Tombstoned] = []
    pairs = dict.fromkeys(known)
    for item in listed.get("items") or []:
        if isinstance(item, dict) and (one := await _tombstone(client, item)) is not None:
            done.append(one)
            pairs[(one.namespace, one.deployment)] = None
    for namespace, deployment in pairs:
        for kind, storage in STATE_KINDS:
            _, path = state_paths(namespace, deployment, storage)
            try:
                item = (await client.request("GET", path)).body
            except KubeError as err:
                if err.kind != kube.NOT_FOUND:
                    done.append(Tombstoned(namespace, deployment, str(err.kind), f"{kind}: {err.detail}",
                                           object="state"))  # fmt: skip
                continue
            done.append(await _silence(client, namespace, deployment, path, item))
    return done, None
