"""The fleet view: every deployment's lock, over every connected cluster, at once.

On-call asks "what is locked, anywhere?". The answer costs one LIST of leases per
connected cluster, across namespaces and by label, whatever the number of deployments
(plus the identity check every command makes, once per cluster). Each lease is read with
the same rules as ``lock status`` (:class:`coordinator.rules.lease.LeaseView`); a deployment
counts as held when one lock id holds live leases on a majority of its members.

The members of a deployment are those of the local record when this machine knows it;
otherwise the member set the leases store (``coordinator.io/membership``, by cluster
identity), mapped onto the connected clusters by identity. A member that could not be
listed, or is not connected here, is named as unseen; it is never taken as free.

With ``--watch`` (:class:`FleetWatch`): one LIST per cluster, then one watch per cluster
from the LIST's ``resourceVersion``, with the same label selector across namespaces. Each
watch request asks the server to end it after ``--timeout`` (a whole second at least),
and a watch still open ``--timeout`` after that is a server that stopped answering: a
paused API server keeps the connection and sends nothing, which no event would ever
tell. Its cluster is shown unseen at once (within twice ``--timeout`` of its last answer,
as the one-shot view says after one), and listed again. A watch that the server ends on
time is opened again from the last ``resourceVersion`` seen (bookmarks included), without
listing; a watch answered
``410 Gone`` (the version was compacted away) or broken (connection lost, an error) is
followed by a new LIST, after a wait that doubles (up to 10 s) while watches keep failing
at once: one refused (no ``watch`` right) leaves a LIST of every Lease of the cluster
every 10 s, not twice a second. Between events, expiry hints move on with the clock: each lease
is judged against the server's time estimated from the LIST's ``Date`` header.

Read-only, and a view: decisions (take, release, break) stay with the engine (:mod:`coordinator.engine.lock`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import anyio

from coordinator import clock
from coordinator.config.records import LocalConfig
from coordinator.engine.clusters import ClusterSet, outcome_of
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.reports import COPY_WHY, holder_field_why
from coordinator.engine.lock.results import lease_expiry_s, renewed_ago
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules import quorum
from coordinator.rules.lease import (
    DEFAULT_MAX_SERVER_SKEW_S,
    UNREADABLE,
    LeaseView,
    Standing,
    TurnClaim,
    copy_standing,
    pid_of,
    shown_expired,
)
from coordinator.rules.membership import A_MEMBERSHIP, Membership
from coordinator.rules.outcome import Outcome

LEASE_PREFIX = "coordinator-lock-"
ALL_LEASES = "/apis/coordination.k8s.io/v1/leases"
SELECTOR = "coordinator.io/managed-by=coordinator"
RETRY_S = (0.5, 10.0)  # backoff before listing again after an error: first, most

log = get_logger(__name__)


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
    status: str  # held, partly-held (live leases, no majority possible), free, unknown (may be held)
    holder: str | None = None
    lock_id: str | None = None
    reason: str | None = None
    host: str | None = None
    pid: str | None = None
    command: str | None = None
    since: datetime | None = None
    renewed_ago_s: float | None = None  # the latest take or renewal of the holder's leases
    expires_in_s: float | None = None
    next_in_line: TurnClaim | None = None
    unseen: list[str] = field(default_factory=list)
    clusters: list[FleetCluster] = field(default_factory=list)
    import_hint: str | None = None
    # with "unknown": the holders (or lock ids) seen that may hold a majority, and whether
    # one not seen may
    possible: list[str] = field(default_factory=list)
    possible_unseen: bool = False


@dataclass
class Fleet:
    deployments: list[FleetEntry]
    clusters: dict[str, str]  # connected cluster -> "ok" or why it could not be listed

    @property
    def unseen_clusters(self) -> list[str]:
        return sorted(c for c, why in self.clusters.items() if why != "ok")

    @property
    def unknown(self) -> list[str]:
        """The deployments whose holder the clusters listed do not decide."""
        return list(dict.fromkeys(f"{e.deployment} ({e.namespace})" for e in self.deployments if e.status == "unknown"))

    @property
    def too_few_listed(self) -> bool:
        """Fewer than a majority of the connected clusters could be listed: what the
        view says is not known to hold for most of them (the command exits 4)."""
        n = len(self.clusters)
        return n > 0 and n - len(self.unseen_clusters) < n // 2 + 1


def _is_lock_lease(obj: Any) -> bool:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return isinstance(meta, dict) and str(meta.get("name", "")).startswith(LEASE_PREFIX)


def _views(cluster: str, objects: Any, server_now: datetime | None) -> list[LeaseView]:
    """The lock leases among ``objects``, parsed. Anyone who may create a Lease in some
    namespace can make one with any labels and annotations: a lease that cannot be read
    is left out (one lease, never the cluster's whole list)."""
    views = []
    for obj in objects if isinstance(objects, list) else []:
        if not _is_lock_lease(obj):
            continue
        try:
            views.append(LeaseView.parse(obj, server_now))
        except (*UNREADABLE, AttributeError) as err:
            name = str(obj["metadata"].get("name", ""))[:100]
            log.info("fleet: a lease that cannot be read is left out", cluster=cluster, lease=name, error=repr(err))
    return views


async def list_leases(clusters: ClusterSet, names: list[str]) -> dict[str, ClusterResult[list[LeaseView]]]:
    """One LIST per cluster, across namespaces: coordinator's lock leases, parsed."""

    async def one(name: str) -> ClusterResult[list[LeaseView]]:
        try:
            await clusters.check_identity(name)
            resp = await clusters.client(name).request("GET", ALL_LEASES, query={"labelSelector": SELECTOR})
        except KubeError as err:
            return ClusterResult(name, outcome_of(err), detail=err.detail)
        return ClusterResult(name, Outcome.OK, _views(name, resp.body.get("items"), resp.server_time))

    return await fan_out(names, one, timeout=clusters.timeout, silent=clusters.silent)


def _key(view: LeaseView) -> tuple[str, str]:
    meta = view.obj.get("metadata") or {}
    return str(meta.get("name", ""))[len(LEASE_PREFIX) :], str(meta.get("namespace", ""))


def _cluster_row(
    name: str, view: LeaseView | None, max_ttl_s: float, skew: float
) -> tuple[FleetCluster, str | None, float | None]:
    """The row, the live lock id (if held), and its remaining seconds (if known)."""
    if view is None:
        return FleetCluster(name, "missing", detail="no lease of this deployment was listed here"), None, None
    # The young-copy rule of acquisitions and `lock status` (lease.copy_standing), by the hint;
    # expiry, as there, past every margin a takeover may need (see lease.shown_expired).
    copy = copy_standing(view, None, max_ttl_s=max_ttl_s, max_server_skew_s=skew) is Standing.HELD
    if view.unknown_holder:
        why = "the lease was deleted" if view.vanished else holder_field_why(view)
        if shown_expired(view, max_ttl_s, skew) and not copy:
            return FleetCluster(name, "expired", detail=why), None, None
        return FleetCluster(name, "held", detail=f"{why}: held by an unknown holder"), None, None
    if copy and not (view.held and not shown_expired(view, max_ttl_s, skew)):
        return FleetCluster(name, "held", detail=f"{COPY_WHY}: held by an unknown holder"), None, None
    if not view.held:
        return FleetCluster(name, "free"), None, None
    who = view.info.get("holder") or None
    if shown_expired(view, max_ttl_s, skew):
        return FleetCluster(name, "expired", who, view.lock_id), None, None
    return FleetCluster(name, "held", who, view.lock_id), view.lock_id, lease_expiry_s(view, max_ttl_s)


def build_fleet(
    config: LocalConfig,
    listed: dict[str, ClusterResult[list[LeaseView]]],
    max_server_skew_s: float = DEFAULT_MAX_SERVER_SKEW_S,
) -> Fleet:
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
        entries.append(_entry(name, namespace, imported, majorities, leases, seen, max_ttl_s, max_server_skew_s))
    entries.sort(key=lambda e: (e.deployment, e.namespace))
    return Fleet(entries, seen)


def _stored_groups(leases: dict[str, LeaseView], by_identity: dict[str, str]) -> list[list[str]] | None:
    """The member set the leases store (the most common one), as cluster names."""
    stored = Counter(
        m
        for v in leases.values()
        if (m := Membership.parse(((v.obj.get("metadata") or {}).get("annotations") or {}).get(A_MEMBERSHIP)))
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
    skew: float,
) -> FleetEntry:
    rows: list[FleetCluster] = []
    live: dict[str, str | None] = {}
    remaining: dict[str, float] = {}
    claims: list[TurnClaim] = []
    unseen: list[str] = []
    for member in majorities.members:
        if seen.get(member) != "ok":
            why = seen.get(member) or "not connected on this machine"
            rows.append(FleetCluster(member, "unseen", detail=why))
            unseen.append(member)
            continue
        view = leases.get(member)
        row, lock_id, rem = _cluster_row(member, view, max_ttl_s, skew)
        rows.append(row)
        live[member] = lock_id
        if rem is not None:
            remaining[member] = rem
        if view is not None and view.live_claim is not None and view.claim_fresh():
            claims.append(view.live_claim)
    winner = majorities.holder(live)
    status, possible = _verdict(winner, majorities, live, rows)
    entry = FleetEntry(
        deployment=name,
        namespace=namespace,
        imported=imported,
        members=list(majorities.members),
        quorum=majorities.quorum,
        status=status,
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
        entry.command = view.info.get("command") or None
        entry.since = view.acquired_at
        entry.renewed_ago_s = min(
            (a for c, lid in live.items() if lid == winner and (a := renewed_ago(leases[c])) is not None),
            default=None,
        )
        mine = {c: remaining[c] for c, lid in live.items() if lid == winner and c in remaining}
        expiry = majorities.expiry(mine)
        entry.expires_in_s = round(expiry, 1) if expiry is not None else None
    if possible is not None:
        for lock_id in possible.lock_ids:
            named = next((r.holder for r in rows if r.lock_id == lock_id and r.holder), None)
            entry.possible.append(named or lock_id)
        entry.possible_unseen = possible.unseen
    if not imported:
        source = next((c for c in majorities.members if c in leases), None) or next(iter(leases), "CLUSTER")
        entry.import_hint = f"coordinator deployment import {name} --cluster {source} -n {namespace}"
    return entry


def _verdict(
    winner: str | None, majorities: quorum.Majorities, live: dict[str, str | None], rows: list[FleetCluster]
) -> tuple[str, quorum.PossibleHolders | None]:
    """As `lock status` judges one deployment: "unknown" when someone may hold a majority
    with the members not seen (unlisted, no lease listed, or a lease deleted)."""
    if winner:
        return "held", None
    undecided = [r.name for r in rows if r.status in ("unseen", "missing") or (r.status == "held" and not r.lock_id)]
    possible = majorities.possible_holders(live, undecided)
    if possible:
        return "unknown", possible
    return ("partly-held" if any(r.status == "held" for r in rows) else "free"), None


async def survey(
    config: LocalConfig, clusters: ClusterSet, max_server_skew_s: float = DEFAULT_MAX_SERVER_SKEW_S
) -> Fleet:
    """List every connected cluster once and build the fleet view."""
    listed = await list_leases(clusters, list(config.clusters))
    return build_fleet(config, listed, max_server_skew_s)


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
                "pid": pid_of(e.pid),
                "command": e.command,
                "since": e.since,
                "renewed_ago_s": e.renewed_ago_s,
                "expires_in_s": e.expires_in_s,
                "next_in_line": to_claim(e.next_in_line),
                "quorum": e.quorum,
                "members": e.members,
                "unseen": e.unseen,
                "possible_holders": e.possible + (["(a holder not seen)"] if e.possible_unseen else []),
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


# ------------------------------------------------------------------ --watch


def rewatch_wait(backoff: float, ran_s: float) -> float:
    """How long to wait before listing again after a watch broke that had run ``ran_s``
    seconds, ``backoff`` being the wait doubled since the last watch that was refused.

    A watch that ran at least as long as the longest wait was broken once (a server
    restarted, a connection cut), not refused: the LIST that follows comes after the
    first wait, so the changes it missed show then and not after up to RETRY_S[1]."""
    return RETRY_S[0] if ran_s >= RETRY_S[1] else backoff


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def _object_key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _resource_version(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


@dataclass
class _Mirror:
    """What one cluster's LIST and watch events say now."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    outcome: Outcome | None = None  # of the last LIST or watch; None before the first answer
    detail: str = ""
    offset: timedelta | None = None  # server time minus local time, from the LIST's Date header


class FleetWatch:
    """The fleet kept current by one watch per connected cluster (see the module's doc).

    ``run()`` follows every cluster until cancelled; ``changed`` is set (and replaced)
    whenever anything a cluster says changes; ``ready`` once every cluster has answered
    its first LIST or failed it. ``fleet()`` builds the view from what is mirrored, with
    no request."""

    def __init__(
        self,
        config: LocalConfig,
        clusters: ClusterSet,
        *,
        watch_s: float | None = None,
        max_server_skew_s: float = DEFAULT_MAX_SERVER_SKEW_S,
    ) -> None:
        self.config = config
        self.clusters = clusters
        self.max_server_skew_s = max_server_skew_s
        # How long the server is asked to keep one watch open (whole seconds, as the API
        # takes them): the end of each watch is the sign of life of a quiet server.
        self.watch_s = float(watch_s if watch_s is not None else max(1, math.ceil(clusters.timeout)))
        self.names = list(config.clusters)
        self.mirrors = {name: _Mirror() for name in self.names}
        self.ready = anyio.Event()
        self.changed = anyio.Event()

    def _tell(self) -> None:
        if all(m.outcome is not None for m in self.mirrors.values()):
            self.ready.set()
        self.changed.set()
        self.changed = anyio.Event()

    def fleet(self) -> Fleet:
        now = clock.wall_now()
        listed: dict[str, ClusterResult[list[LeaseView]]] = {}
        for name, m in self.mirrors.items():
            if m.outcome is not Outcome.OK:
                listed[name] = ClusterResult(name, m.outcome or Outcome.UNREACHABLE, detail=m.detail or "no answer yet")
                continue
            server_now = now + m.offset if m.offset is not None else None
            listed[name] = ClusterResult(name, Outcome.OK, _views(name, list(m.objects.values()), server_now))
        return build_fleet(self.config, listed, self.max_server_skew_s)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for name in self.names:
                tg.start_soon(self._follow, name)

    async def _list(self, name: str) -> str | None:
        """LIST once; mirror what it says; return its resourceVersion."""
        await self.clusters.check_identity(name)
        with anyio.fail_after(self.clusters.timeout + 1):
            resp = await self.clusters.client(name).request("GET", ALL_LEASES, query={"labelSelector": SELECTOR})
        m = self.mirrors[name]
        items = resp.body.get("items")
        m.objects = {_object_key(obj): obj for obj in items if _is_lock_lease(obj)} if isinstance(items, list) else {}
        m.offset = resp.server_time - clock.wall_now() if resp.server_time is not None else None
        m.outcome, m.detail = Outcome.OK, ""
        self._tell()
        return _resource_version(resp.body)

    async def _watch(self, name: str, rv: str | None) -> str | None:
        """One watch request from ``rv``; returns the last resourceVersion seen when the
        server ends it. Raises _Gone on 410, KubeError when it breaks or when the server
        has not ended it ``--timeout`` after it should have (a server that stopped answering)."""
        query: dict[str, Any] = {"labelSelector": SELECTOR, "allowWatchBookmarks": "true"}
        if rv is not None:
            query["resourceVersion"] = rv
        m = self.mirrors[name]
        # The connection's own limit is a backstop behind this deadline, which names the silence.
        late = self.clusters.timeout
        events = self.clusters.client(name).watch(ALL_LEASES, query=query, timeout=self.watch_s, grace=late + 1)
        try:
            with anyio.fail_after(self.watch_s + late):
                async for ev in events:
                    kind, obj = ev.get("type"), ev.get("object")
                    if kind == "ERROR":
                        code = obj.get("code") if isinstance(obj, dict) else None
                        if code == 410:
                            raise _Gone()
                        message = obj.get("message") if isinstance(obj, dict) else None
                        raise KubeError(kube.ERROR, f"watch error {code}: {message}")
                    rv = _resource_version(obj) or rv
                    if kind == "BOOKMARK" or not _is_lock_lease(obj):
                        continue
                    assert isinstance(obj, dict)
                    if kind in ("ADDED", "MODIFIED"):
                        m.objects[_object_key(obj)] = obj
                    elif kind == "DELETED":
                        m.objects.pop(_object_key(obj), None)
                    self._tell()
        except TimeoutError:
            # Not seen now: shown unseen at once, in the words of a LIST that got no answer
            # (the LIST that follows changes nothing more while the server stays silent).
            silent = KubeError(kube.UNREACHABLE, f"no answer within {self.clusters.timeout:g}s")
            self._unseen(name, silent)
            raise silent from None
        except KubeError as err:
            if err.status == 410:
                raise _Gone() from err
            raise
        finally:
            await events.aclose()
        return rv

    def _unseen(self, name: str, err: Exception) -> None:
        m = self.mirrors[name]
        if isinstance(err, KubeError):
            outcome, detail = outcome_of(err), err.detail
        else:
            outcome, detail = Outcome.UNREACHABLE, f"no answer within {self.clusters.timeout:g}s"
        if (m.outcome, m.detail) != (outcome, detail):
            # Not seen now: nothing it said before is shown as current.
            m.outcome, m.detail, m.objects = outcome, detail, {}
            self._tell()

    async def _follow(self, name: str) -> None:
        backoff = RETRY_S[0]  # before listing again after a LIST failed
        rewatch = RETRY_S[0]  # before listing again after a watch failed
        refused = False
        while True:
            try:
                rv = await self._list(name)
            except (KubeError, TimeoutError) as err:
                self._unseen(name, err)
                log.info("fleet watch: cannot list; trying again", cluster=name, error=str(err), wait_s=backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_S[1])
                continue
            backoff = RETRY_S[0]
            started = clock.monotonic()
            try:
                while True:  # a watch the server ended normally goes on from where it was
                    started = clock.monotonic()
                    rv = await self._watch(name, rv)
                    rewatch = RETRY_S[0]
                    if clock.monotonic() - started < 1.0:
                        await anyio.sleep(1.0)  # a server ending watches at once: do not spin
            except _Gone:
                log.info("fleet watch: resourceVersion gone, listing again", cluster=name)
            except (KubeError, TimeoutError) as err:
                # What was mirrored stays shown until the LIST that follows says otherwise
                # (unless the server stopped answering: `_watch` said so already).
                rewatch = rewatch_wait(rewatch, clock.monotonic() - started)
                if isinstance(err, KubeError) and err.kind == kube.FORBIDDEN and not refused:
                    refused = True
                    log.warning(
                        "fleet watch: may not watch Leases here (grant watch, as `coordinator rbac print --fleet` "
                        f"does); listing them again at most every {RETRY_S[1]:g}s instead",
                        cluster=name,
                        error=err.detail,
                    )
                else:
                    log.info("fleet watch broke; listing again", cluster=name, error=str(err), wait_s=rewatch)
                # A watch refused at once (forbidden, or a server failing it) is followed by
                # a LIST of every Lease of the cluster: back off, as after a failed LIST.
                await anyio.sleep(rewatch)
                rewatch = min(rewatch * 2, RETRY_S[1])  # if the next one is refused too
