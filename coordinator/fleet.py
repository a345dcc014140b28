"""The fleet view: every deployment's lock, over every connected cluster, at once.

On-call asks "what is locked, anywhere?". The answer costs one LIST of leases per
connected cluster, across namespaces and by label, whatever the number of deployments
(plus the identity check every command makes, once per cluster). Each lease is read with
the same rules as ``lock status`` (:class:`coordinator.lease.LeaseView`); a deployment
counts as held when one lock id holds live leases on a majority of its members.

The members of a deployment are those of the local record when this machine knows it;
otherwise the member set the leases store (``coordinator.io/membership``, by cluster
identity), mapped onto the connected clusters by identity. A member that could not be
listed, or is not connected here, is named as unseen; it is never taken as free.

Read-only, and a view: decisions (take, release, break) stay with ``lock.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from coordinator import quorum
from coordinator.clusters import ClusterSet, outcome_of
from coordinator.fanout import ClusterResult, fan_out
from coordinator.kube.client import KubeError
from coordinator.lease import LeaseView, TurnClaim
from coordinator.membership import A_MEMBERSHIP, Membership
from coordinator.models import LocalConfig
from coordinator.outcome import Outcome

LEASE_PREFIX = "coordinator-lock-"
ALL_LEASES = "/apis/coordination.k8s.io/v1/leases"
SELECTOR = "coordinator.io/managed-by=coordinator"


@dataclass
class FleetCluster:
    """One member's lease of one deployment, as listed."""

    name: str
    status: str  # held, free, expired, missing, unseen
    holder: str | None = None
    lock_id: str | None = None
    detail: str = ""


@dataclass
class FleetEntry:
    deployment: str
    namespace: str
    imported: bool
    members: list[str]  # connected cluster names; "identity:ID" for members not connected here
    quorum: int
    status: str  # held, partly-held (live leases, no majority), free, unknown (too few seen)
    holder: str | None = None
    lock_id: str | None = None
    reason: str | None = None
    host: str | None = None
    pid: str | None = None
    since: datetime | None = None
    expires_in_s: float | None = None
    next_in_line: TurnClaim | None = None
    unseen: list[str] = field(default_factory=list)
    clusters: list[FleetCluster] = field(default_factory=list)
    import_hint: str | None = None


@dataclass
class Fleet:
    deployments: list[FleetEntry]
    clusters: dict[str, str]  # connected cluster -> "ok" or why it could not be listed

    @property
    def unseen_clusters(self) -> list[str]:
        return sorted(c for c, why in self.clusters.items() if why != "ok")


async def list_leases(clusters: ClusterSet, names: list[str]) -> dict[str, ClusterResult[list[LeaseView]]]:
    """One LIST per cluster, across namespaces: coordinator's lock leases, parsed."""

    async def one(name: str) -> ClusterResult[list[LeaseView]]:
        try:
            await clusters.check_identity(name)
            resp = await clusters.client(name).request("GET", ALL_LEASES, query={"labelSelector": SELECTOR})
        except KubeError as err:
            return ClusterResult(name, outcome_of(err), detail=err.detail)
        items = resp.body.get("items") or []
        views = [
            LeaseView.parse(obj, resp.server_time)
            for obj in items
            if isinstance(obj, dict) and str((obj.get("metadata") or {}).get("name", "")).startswith(LEASE_PREFIX)
        ]
        return ClusterResult(name, Outcome.OK, views)

    return await fan_out(names, one, timeout=clusters.timeout)


def _key(view: LeaseView) -> tuple[str, str]:
    meta = view.obj.get("metadata") or {}
    return str(meta.get("name", ""))[len(LEASE_PREFIX) :], str(meta.get("namespace", ""))


def _cluster_row(name: str, view: LeaseView | None, max_ttl_s: float) -> tuple[FleetCluster, str | None, float | None]:
    """The row, the live lock id (if held), and its remaining seconds (if known)."""
    if view is None:
        return FleetCluster(name, "missing", detail="no lease of this deployment was listed here"), None, None
    if view.vanished and not view.held:
        return FleetCluster(name, "held", detail="the lease was deleted: held by an unknown holder"), None, None
    if not view.held:
        return FleetCluster(name, "free"), None, None
    who = view.info.get("holder") or None
    if view.expired(max_ttl_s):
        return FleetCluster(name, "expired", who, view.lock_id), None, None
    return FleetCluster(name, "held", who, view.lock_id), view.lock_id, view.remaining_s()


def build_fleet(config: LocalConfig, listed: dict[str, ClusterResult[list[LeaseView]]]) -> Fleet:
    """Pure: the fleet from what each cluster listed (no I/O; unit-testable)."""
    by_identity = {rec.identity: name for name, rec in config.clusters.items()}
    seen: dict[str, str] = {}
    found: dict[tuple[str, str], dict[str, LeaseView]] = {}
    for cluster in config.clusters:
        r = listed.get(cluster)
        if r is None or not r.ok or r.value is None:
            seen[cluster] = f"{r.outcome}: {r.detail}" if r is not None else "not listed"
            continue
        seen[cluster] = "ok"
        for view in r.value:
            found.setdefault(_key(view), {})[cluster] = view

    keys: dict[tuple[str, str], bool] = {}  # (deployment, namespace) -> known locally
    for dep in config.deployments.values():
        keys[(dep.name, dep.namespace)] = True
    for key in sorted(found):
        keys.setdefault(key, False)

    entries = []
    for (name, namespace), imported in keys.items():
        leases = found.get((name, namespace), {})
        record = config.deployments.get(name) if imported else None
        if record is not None:
            groups = [list(record.clusters), *([record.joint] if record.joint else [])]
            max_ttl_s = record.max_ttl_s
        else:
            groups = _stored_groups(leases, by_identity) or [sorted(leases)]
            max_ttl_s = 600.0
        majorities = quorum.Majorities(groups)
        entries.append(_entry(name, namespace, imported, majorities, leases, seen, max_ttl_s))
    entries.sort(key=lambda e: (e.deployment, e.namespace))
    return Fleet(entries, seen)


def _stored_groups(leases: dict[str, LeaseView], by_identity: dict[str, str]) -> list[list[str]] | None:
    """The member set the leases store (the most common one), as cluster names."""
    stored = Counter(
        m
        for v in leases.values()
        if (m := Membership.parse((v.obj.get("metadata") or {}).get("annotations", {}).get(A_MEMBERSHIP)))
    )
    if not stored:
        return None
    best = max(stored.items(), key=lambda kv: (kv[1], kv[0].epoch))[0]

    def names(ids: tuple[str, ...]) -> list[str]:
        return sorted(by_identity.get(i, f"identity:{i}") for i in ids)

    return [names(best.members), *([names(best.joint)] if best.joint else [])]


def _entry(
    name: str,
    namespace: str,
    imported: bool,
    majorities: quorum.Majorities,
    leases: dict[str, LeaseView],
    seen: dict[str, str],
    max_ttl_s: float,
) -> FleetEntry:
    rows: list[FleetCluster] = []
    live: dict[str, str | None] = {}
    remaining: dict[str, float] = {}
    claims: list[TurnClaim] = []
    unseen: list[str] = []
    observed: list[str] = []  # members listed with a lease of this deployment
    for member in majorities.members:
        if seen.get(member) != "ok":
            why = seen.get(member) or "not connected on this machine"
            rows.append(FleetCluster(member, "unseen", detail=why))
            unseen.append(member)
            continue
        view = leases.get(member)
        if view is not None:
            observed.append(member)
        row, lock_id, rem = _cluster_row(member, view, max_ttl_s)
        rows.append(row)
        live[member] = lock_id
        if rem is not None:
            remaining[member] = rem
        if view is not None and view.live_claim is not None and view.claim_fresh():
            claims.append(view.live_claim)
    winner = majorities.holder(live)
    entry = FleetEntry(
        deployment=name,
        namespace=namespace,
        imported=imported,
        members=list(majorities.members),
        quorum=majorities.quorum,
        status=_verdict(winner, majorities, observed, rows),
        unseen=unseen,
        clusters=rows,
        next_in_line=min(claims, key=lambda c: (-claims.count(c), c)) if claims else None,
    )
    if winner:
        view = next(leases[c] for c, lid in live.items() if lid == winner)
        entry.lock_id = winner
        entry.holder = view.info.get("holder") or None
        entry.reason = view.info.get("reason") or None
        entry.host = view.info.get("host") or None
        entry.pid = view.info.get("pid") or None
        entry.since = view.acquired_at
        mine = {c: remaining[c] for c, lid in live.items() if lid == winner and c in remaining}
        expiry = majorities.expiry(mine)
        entry.expires_in_s = round(expiry, 1) if expiry is not None else None
    if not imported:
        source = next((c for c in majorities.members if c in leases), None) or next(iter(leases), "CLUSTER")
        entry.import_hint = f"coordinator deployment import {name} --cluster {source} -n {namespace}"
    return entry


def _verdict(winner: str | None, majorities: quorum.Majorities, observed: list[str], rows: list[FleetCluster]) -> str:
    if winner:
        return "held"
    if not majorities.reached(observed):
        return "unknown"  # like `lock status`: nobody is assumed to hold it or not
    return "partly-held" if any(r.status == "held" for r in rows) else "free"


async def survey(config: LocalConfig, clusters: ClusterSet) -> Fleet:
    """List every connected cluster once and build the fleet view."""
    listed = await list_leases(clusters, list(config.clusters))
    return build_fleet(config, listed)


def fleet_document(fleet: Fleet, to_claim: Callable[[Any], Any]) -> dict[str, Any]:
    return {
        "clusters": [
            {"name": c, "listed": why == "ok", "error": None if why == "ok" else why}
            for c, why in sorted(fleet.clusters.items())
        ],
        "unseen_clusters": fleet.unseen_clusters,
        "deployments": [
            {
                "deployment": e.deployment,
                "namespace": e.namespace,
                "imported": e.imported,
                "import_command": e.import_hint,
                "status": e.status,
                "holder": e.holder,
                "lock_id": e.lock_id,
                "reason": e.reason,
                "host": e.host,
                "pid": int(e.pid) if e.pid and e.pid.isdigit() else None,
                "since": e.since,
                "expires_in_s": e.expires_in_s,
                "next_in_line": to_claim(e.next_in_line),
                "quorum": e.quorum,
                "members": e.members,
                "unseen": e.unseen,
                "clusters": [
                    {
                        "name": r.name,
                        "status": r.status,
                        "holder": r.holder,
                        "lock_id": r.lock_id,
                        "detail": r.detail or None,
                    }
                    for r in e.clusters
                ],
            }
            for e in fleet.deployments
        ],
    }
