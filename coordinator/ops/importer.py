"""``deployment import``: rebuild a local deployment record from what a member stores.

A member set read from one cluster is evidence only when coordinator wrote it (a
coordinator field manager owns the annotation in the lease's managedFields) and when a
majority of the set's own members store the same set: anyone allowed to write or create
a lease in the namespace can put any set on one cluster, and importing it would let them
choose the members a majority is counted over."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from coordinator.config.records import MAX_DEPLOYMENT_NAME, DeploymentRecord
from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet, failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.state import decode_replica
from coordinator.errors import MembershipError, NoQuorumError, UsageError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.ops.admin import valid_name
from coordinator.rules.lease import DEFAULT_MAX_TTL_S, LeaseView
from coordinator.rules.membership import A_MEMBERSHIP, UNSTATED, Membership, Stored, in_lease_object
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import LABEL_DEPLOYMENT, lease_name, lease_path, state_name
from coordinator.text import printable

log = get_logger(__name__)


async def _list(cs: ClusterSet, cluster: str, path: str, selector: str, name: str) -> list[dict[str, Any]]:
    # Selecting by name as well lets RBAC authorize the list by resource name: the Role
    # `rbac print` emits grants it on the deployment's own objects only.
    query = {"labelSelector": selector, "fieldSelector": f"metadata.name={name}"}
    resp = await cs.client(cluster).request("GET", path, query=query)
    return list(resp.body.get("items") or [])


async def import_deployment(
    store: ConfigStore, name: str, source: str, namespace: str | None, *, timeout: float = 5.0
) -> tuple[DeploymentRecord, str]:
    valid_name(name, "deployment name", MAX_DEPLOYMENT_NAME)
    if namespace is not None:
        valid_name(namespace, "namespace")
    cfg = store.load()
    if name in cfg.deployments:
        raise UsageError(f"Deployment {name!r} already exists locally; delete it first to re-import.")
    cs = ClusterSet(cfg, timeout=timeout, config_path=store.path)
    try:
        return await _import(store, cfg, cs, name, source, namespace)
    finally:
        await cs.aclose()


async def _import(
    store: ConfigStore, cfg: Any, cs: ClusterSet, name: str, source: str, namespace: str | None
) -> tuple[DeploymentRecord, str]:
    selector = f"{LABEL_DEPLOYMENT}={name}"
    cs.record(source)
    try:
        await cs.check_identity(source)
        found: list[tuple[str, dict[str, Any]]] = []
        for kind, base in (("configmap", "configmaps"), ("secret", "secrets")):
            path = f"/api/v1/namespaces/{namespace}/{base}" if namespace else f"/api/v1/{base}"
            try:
                found += [
                    (kind, o)
                    for o in await _list(cs, source, path, selector, state_name(name))
                    if (o.get("metadata") or {}).get("name") == state_name(name)
                ]
            except KubeError as err:
                if err.kind != kube.FORBIDDEN:
                    raise
        path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
            if namespace
            else "/apis/coordination.k8s.io/v1/leases"
        )
        leases: list[dict[str, Any]] = []
        try:
            leases = [
                o
                for o in await _list(cs, source, path, selector, lease_name(name))
                if (o.get("metadata") or {}).get("name") == lease_name(name)
            ]
        except KubeError as err:
            if err.kind != kube.FORBIDDEN:
                raise
    except KubeError as err:
        if err.kind == kube.IDENTITY_MISMATCH:
            from coordinator.errors import IdentityMismatchError

            raise IdentityMismatchError(f"Cluster {source!r}: {err.detail}") from err
        raise NoQuorumError(f"Cannot read deployment {name!r} from {source!r}: {err.kind}: {err.detail}.") from err
    # Deployment names are unique per namespace only: never pick one of several at random.
    namespaces = sorted({str(o["metadata"]["namespace"]) for o in [*(obj for _, obj in found), *leases]})
    if len(namespaces) > 1:
        raise UsageError(
            f"Deployment {name!r} is stored on {source!r} in {len(namespaces)} namespaces "
            f"({', '.join(namespaces)}). Pass --namespace NS to say which one to import."
        )
    # The member set a lease stores (by identity, with its epoch) is the newest word on
    # membership: state envelopes name the members of their last write only.
    for lease in leases:
        stored = in_lease_object(lease)
        if not isinstance(stored, Membership):
            continue
        ns = str(lease["metadata"]["namespace"])
        if not stored.written_by_us:
            raise MembershipError(
                f"The member set of deployment {name!r} on {source!r} (namespace {ns!r}, epoch {stored.epoch}) was "
                f"not written by coordinator: the annotation {A_MEMBERSHIP} there is owned by "
                f"{stored.writer_text()}. It may have been planted or edited by hand, so it is no evidence of the "
                "deployment's members. Nothing was imported. Import from another member of the deployment, or "
                "find out who wrote it."
            )
        members = _map_identities(cfg, stored.members)
        joint = _map_identities(cfg, stored.joint) if stored.joint is not None else None
        # One cluster's word is not enough: anyone who may write that lease could have
        # set it. A majority of the set's own members (of both sets, during a change)
        # must store it, as every change that coordinator commits leaves it.
        views = await _confirm_elsewhere(cs, cfg, name, ns, stored, members, joint)
        kind_found = next((k for k, o in found if str(o["metadata"]["namespace"]) == ns), "configmap")
        storage_kind: Literal["configmap", "secret"] = "secret" if kind_found == "secret" else "configmap"
        record = DeploymentRecord(
            name=name, namespace=ns, clusters=members, storage=storage_kind, epoch=stored.epoch, joint=joint
        )
        max_ttl, why = imported_max_ttl({m: views.get(m) for m in dict.fromkeys([*members, *(joint or [])])})
        if why:
            log.warning(why, deployment=name, max_ttl_s=max_ttl)
        record.max_ttl_s = max_ttl
        return _save(store, record), f"lock lease (member set epoch {stored.epoch})"
    for kind, obj in found:
        rep = decode_replica(source, obj, kind, deployment=name)
        if rep.envelope is None:
            continue
        # where the object was found: an envelope copied from another namespace names that one
        ns = str(obj["metadata"]["namespace"])
        members = _map_members(cfg, list(rep.envelope.members), rep.envelope.member_ids)
        storage: Literal["configmap", "secret"] = "secret" if kind == "secret" else "configmap"
        record = DeploymentRecord(name=name, namespace=ns, clusters=members, storage=storage)
        return _save(store, record), f"state replica (version {rep.envelope.version})"
    for lease in leases:
        ann = (lease.get("metadata") or {}).get("annotations") or {}
        names = [m for m in str(ann.get("coordinator.io/members", "")).split(",") if m]
        if names:
            members = _map_members(cfg, names, {})
            ns = str(lease["metadata"]["namespace"])
            return _save(store, DeploymentRecord(name=name, namespace=ns, clusters=members)), "lock lease"
    where = f"namespace {namespace!r}" if namespace else "any namespace"
    raise UsageError(
        f"No state or lock of deployment {name!r} was found on {source!r} in {where}. Check the "
        "name, or pass --namespace if the cluster does not let you list across namespaces."
    )


async def _confirm_elsewhere(
    cs: ClusterSet,
    cfg: Any,
    name: str,
    ns: str,
    stored: Membership,
    members: list[str],
    joint: list[str] | None,
) -> dict[str, LeaseView]:
    """Read the deployment's lease on every cluster connected here and refuse unless a
    majority of ``stored``'s members (and of its new set, during a change) store exactly
    ``stored``, written by coordinator, and no other set written by coordinator that
    shares members with it is stored by a majority of its own members. Returns the
    leases read (by cluster; a missing one is not there)."""
    path = lease_path(ns, lease_name(name))
    views: dict[str, LeaseView] = {}

    async def one(cluster: str) -> ClusterResult[Stored]:
        try:
            await cs.check_identity(cluster)
            resp = await cs.client(cluster).request("GET", path)
        except KubeError as err:
            if err.kind == kube.NOT_FOUND:
                return ClusterResult(cluster, Outcome.OK, None)
            return failed(cluster, err)  # type: ignore[return-value]
        views[cluster] = LeaseView.parse(resp.body)
        return ClusterResult(cluster, Outcome.OK, in_lease_object(resp.body))

    results = await fan_out(list(cfg.clusters), one, timeout=cs.timeout)
    found = {k: r.value for k, r in results.items() if r.ok}
    by_identity = {c.identity: c.name for c in cfg.clusters.values()}

    def confirmed(value: Membership) -> bool:
        groups = [value.members, *([value.joint] if value.joint is not None else [])]
        for group in groups:
            named = [by_identity.get(i) for i in group]
            agree = [n for n in named if n is not None and _ours_and_equal(found.get(n), value)]
            if len(agree) < len(group) // 2 + 1:
                return False
        return True

    rivals = {
        v
        for v in found.values()
        if isinstance(v, Membership)
        and v != stored
        and v.written_by_us
        and set(v.members).intersection(stored.members)
        and confirmed(v)
    }
    if confirmed(stored) and not rivals:
        return views

    def said(cluster: str) -> str:
        r = results.get(cluster)
        if r is None or not r.ok:
            return f"not read ({r.outcome if r else 'no answer'})"
        v = r.value
        if v is None:
            return "no lease or no member set"
        if v is UNSTATED or not isinstance(v, Membership):
            return "a lease that states no member set"
        names = ", ".join(by_identity.get(i, f"identity {printable(i)}") for i in v.members)
        change = (
            "; changing to " + ", ".join(by_identity.get(i, f"identity {printable(i)}") for i in v.joint)
            if v.joint
            else ""
        )
        who = "" if v.written_by_us else f" (not written by coordinator: {v.writer_text()})"
        return f"epoch {v.epoch}: {names}{change}{who}"

    listing = "; ".join(f"{k}: {said(k)}" for k in cfg.clusters)
    wanted = ", ".join(dict.fromkeys([*members, *(joint or [])]))
    why = (
        "another member set that shares members with it is stored by a majority of its own members"
        if rivals and confirmed(stored)
        else f"fewer than a majority of its members ({wanted}) store it"
    )
    raise MembershipError(
        f"Deployment {name!r} in namespace {ns!r}: the member set found on the lease (epoch {stored.epoch}) is "
        f"not confirmed: {why}. What each cluster connected here stores: {listing}. Nothing was imported: a set "
        "that one cluster alone stores may have been planted there. Import from a member where a majority of "
        "the members store the same set, or retry when the members that could not be read answer."
    )


def imported_max_ttl(members: Mapping[str, LeaseView | None]) -> tuple[float, str | None]:
    """The maximum TTL to record for a deployment whose members' leases read as
    ``members`` (None: not read, or no lease), and a warning when they do not agree.

    A note counts only where a coordinator field manager wrote it (no longer than a day,
    see ``lease.MAX_MAX_TTL_S``), but anyone may name that manager, so no one lease's
    note is taken: the largest note of the members read, and never less than the
    default maximum unless every member stores the same note and no lease's own duration
    is longer than it (coordinator never takes a lease for longer than the maximum). A
    lowered maximum is what makes a contender wait out less; a raised one only costs
    waiting."""
    notes = {m: (v.max_ttl_note if v is not None and v.exists else None) for m, v in members.items()}
    known = [n for n in notes.values() if n is not None]
    if not known:
        return DEFAULT_MAX_TTL_S, None
    largest = float(max(known))
    agree = len(set(notes.values())) == 1 and all(
        v is not None and (v.ttl_s is None or not v.ttl_owned or v.ttl_s <= largest) for v in members.values()
    )
    chosen = largest if agree else max(largest, DEFAULT_MAX_TTL_S)
    if agree:
        return chosen, None
    said = ", ".join(f"{m}: {f'{n}s' if n is not None else 'none'}" for m, n in notes.items())
    longer = [m for m, v in members.items() if v is not None and v.ttl_owned and (v.ttl_s or 0) > largest]
    why = (
        f"the members' leases store different maximum TTLs ({said})"
        if len(set(notes.values())) > 1
        else f"leases on {', '.join(longer)} are held for longer than the maximum TTL they store ({said})"
    )
    return chosen, f"{why}; recorded {chosen:g}s, the largest, and never below the default {DEFAULT_MAX_TTL_S:g}s"


def _ours_and_equal(found: Stored, value: Membership) -> bool:
    return isinstance(found, Membership) and found == value and found.written_by_us


def _map_identities(cfg: Any, identities: tuple[str, ...]) -> list[str]:
    """Local names of the clusters with these identities; refuses when one is not connected."""
    by_identity = {c.identity: c.name for c in cfg.clusters.values()}
    missing = [i for i in identities if i not in by_identity]
    if missing:
        raise UsageError(
            f"The deployment's members include {len(missing)} cluster(s) not connected here (identities "
            f"{', '.join(printable(str(i)) for i in missing)}). Connect them with `coordinator cluster "
            "connect NAME --context CTX`, then import again."
        )
    # in the order the clusters were connected here, which is how people list them
    order = {name: i for i, name in enumerate(cfg.clusters)}
    return sorted((by_identity[i] for i in identities), key=lambda n: order.get(n, len(order)))


def _map_members(cfg: Any, names: list[str], ids: dict[str, str]) -> list[str]:
    by_identity = {c.identity: c.name for c in cfg.clusters.values()}
    out, missing = [], []
    for n in names:
        ident = ids.get(n)
        if ident and ident in by_identity:
            out.append(by_identity[ident])
        elif not ident and n in cfg.clusters:
            out.append(n)
        else:
            # Names and identities are the leases' text: escaped where they enter the message.
            missing.append(f"{printable(str(n))} (identity {printable(str(ident))})" if ident else printable(str(n)))
    if missing:
        raise UsageError(
            f"The deployment's members include clusters not connected here: {', '.join(missing)}. "
            "Connect them with `coordinator cluster connect`, then import again."
        )
    return out


def _save(store: ConfigStore, rec: DeploymentRecord) -> DeploymentRecord:
    with store.edit() as cfg:
        if rec.name in cfg.deployments:
            raise UsageError(f"Deployment {rec.name!r} was created meanwhile; nothing changed.")
        cfg.deployments[rec.name] = rec
    return rec
