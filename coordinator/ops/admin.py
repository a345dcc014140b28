"""Connecting clusters and defining deployments: the local records and their checks."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from coordinator import clock
from coordinator.config.records import ClusterRecord, DeploymentRecord, LocalConfig, check_dns_label
from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet, failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.errors import (
    CoordinatorError,
    IdentityMismatchError,
    NoQuorumError,
    StateConflictError,
    UsageError,
    unknown_cluster,
    unknown_deployment,
)
from coordinator.kube import client as kube
from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.kube.identity import (
    CONFIGMAP_UUID,
    Identity,
    describe_identity,
    discover_identity,
    read_identity,
)
from coordinator.kube.transport import TransportFactory
from coordinator.rules.lease import MAX_MAX_TTL_S
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import (
    FIELD_MANAGER,
    IDENTITY_CONFIGMAP,
    LABEL_MANAGED_BY,
    LABEL_VALUE,
    configmaps_path,
    history_name,
    lease_name,
    lease_path,
    namespace_path,
    state_name,
    state_paths,
)
from coordinator.text import printable


def valid_name(value: str, what: str, max_len: int = 63) -> str:
    try:
        return check_dns_label(value, what=what, max_len=max_len)
    except ValueError as err:
        raise UsageError(f"{str(err)[0].upper()}{str(err)[1:]}.") from None


async def connect_cluster(
    store: ConfigStore,
    name: str,
    context: str,
    kubeconfig: str | None,
    *,
    identity_namespace: str = "default",
    timeout: float = 5.0,
    in_cluster: str | None = None,
    transport_factory: TransportFactory | None = None,
) -> tuple[ClusterRecord, str]:
    """Prove which cluster ``context`` leads to and record it under ``name``; with
    ``in_cluster`` (a ServiceAccount directory), the cluster the pod runs in.
    ``transport_factory``: how clusters are reached (HTTPS with the kubeconfig's settings
    by default, see coordinator/kube/transport.py)."""
    valid_name(name, "cluster name")
    valid_name(identity_namespace, "identity namespace")
    cfg = store.load()
    if name in cfg.clusters:
        raise UsageError(
            f"A cluster named {name!r} is already connected (context "
            f"{cfg.clusters[name].context!r}). Pick another name, or run `coordinator cluster "
            f"disconnect {name}` first."
        )
    if not kubeconfig and in_cluster is None:
        # The kubeconfig this connection is proven through (KUBECONFIG, or kubectl's default)
        # is recorded, so that later commands reach the cluster the same way from a shell
        # without that KUBECONFIG. Files of a KUBECONFIG list that do not exist are left out.
        listed = Endpoint(name, context).kubeconfig_paths().split(os.pathsep)
        kubeconfig = os.pathsep.join(p for p in listed if p and os.path.isfile(os.path.expanduser(p))) or None
    if kubeconfig:
        # Recorded for later runs from any directory: relative paths would break there.
        kubeconfig = os.pathsep.join(os.path.abspath(os.path.expanduser(p)) for p in kubeconfig.split(os.pathsep) if p)
    endpoint = Endpoint(name, context, kubeconfig, in_cluster)
    transport = None if transport_factory is None else transport_factory(endpoint)
    client = KubeClient(endpoint, timeout=timeout, transport=transport)
    try:
        await client.transport.open()  # bad kubeconfig/context -> exit 2 here
        identity = await discover_identity(client, identity_namespace)
        version = await _server_version(client)
        twin = await _same_cluster_by_other_proof(client, identity, cfg, timeout=timeout, factory=transport_factory)
    except KubeError as err:
        raise _connect_error(name, context, err) from err
    finally:
        await client.close()
    if twin is not None:
        other = twin.record
        raise UsageError(
            f"Context {context!r} leads to the same cluster as {other.name!r}: {twin.how}. "
            f"({other.name!r} is known by the {describe_identity(other.identity_source, other.identity_namespace)}, "
            f"this context by the {identity.describe()}.) One cluster cannot be a member twice "
            "under two names: a majority of members would then be fewer real clusters. "
            f"Use {other.name!r}, or disconnect it first."
        )
    record = ClusterRecord(
        name=name,
        context=context,
        kubeconfig=kubeconfig,
        in_cluster=in_cluster,
        server=client.server,
        identity=identity.value,
        identity_source=identity.source,  # type: ignore[arg-type]
        identity_namespace=identity.namespace,
    )
    with store.edit() as live:
        if name in live.clusters:
            raise UsageError(f"A cluster named {name!r} was connected meanwhile; nothing changed.")
        for other in live.clusters.values():
            if other.identity == record.identity:
                raise UsageError(
                    f"Context {context!r} leads to the same cluster as {other.name!r} (identity "
                    f"{record.identity}); one cluster cannot be a member twice under two names. "
                    f"Use {other.name!r}, or disconnect it first."
                )
        live.clusters[name] = record
    return record, version


@dataclass
class _Twin:
    record: ClusterRecord  # the connected cluster that the new context also leads to
    how: str  # the evidence, in words


async def _same_cluster_by_other_proof(
    new: KubeClient, identity: Identity, cfg: LocalConfig, *, timeout: float, factory: TransportFactory | None
) -> _Twin | None:
    """A connected cluster that is the one behind ``new`` although its identity differs,
    because the two were proven by different means (the kube-system UID and an identity
    ConfigMap). Each side's ConfigMap proof is read through the other side's context.
    Where it cannot be read (forbidden, unreachable, a broken context), there is no
    evidence either way and nothing is refused."""
    others = [r for r in cfg.clusters.values() if r.identity != identity.value]
    if not others or not any(CONFIGMAP_UUID in (r.identity_source, identity.source) for r in others):
        return None
    found: list[_Twin] = []
    clusters = ClusterSet(cfg, timeout=timeout, transport_factory=factory)

    def twin(rec: ClusterRecord, how: str, namespace: str | None, uuid: str) -> _Twin:
        return _Twin(rec, f"{how}, {namespace}/{IDENTITY_CONFIGMAP}, with the same UUID {uuid}")

    async def probe(rec: ClusterRecord) -> None:
        with contextlib.suppress(KubeError, CoordinatorError):
            if rec.identity_source == CONFIGMAP_UUID:
                seen = await read_identity(new, CONFIGMAP_UUID, rec.identity_namespace)
                if seen == rec.identity:
                    how = f"this context reads the identity ConfigMap of {rec.name!r}"
                    found.append(twin(rec, how, rec.identity_namespace, seen))
                    return
            if identity.source == CONFIGMAP_UUID:
                await clusters.check_identity(rec.name)  # its context still leads to it
                seen = await read_identity(clusters.client(rec.name), CONFIGMAP_UUID, identity.namespace)
                if seen == identity.value:
                    how = f"the context of {rec.name!r} reads this context's identity ConfigMap"
                    found.append(twin(rec, how, identity.namespace, seen))

    try:
        async with anyio.create_task_group() as tg:
            for rec in others:
                tg.start_soon(probe, rec)
    finally:
        await clusters.aclose()
    return min(found, key=lambda t: t.record.name) if found else None


def _connect_error(name: str, context: str, err: KubeError) -> CoordinatorError:
    if err.kind == kube.FORBIDDEN:
        return UsageError(
            f"Cannot connect {name!r}: context {context!r} may neither read the kube-system "
            f"namespace nor create the identity ConfigMap ({err.detail}). Grant the rights in "
            "`coordinator rbac print`, or pass --identity-namespace with a namespace it may write."
        )
    return NoQuorumError(
        f"Cannot connect {name!r}: the API server of context {context!r} could not be "
        f"observed ({err.kind}: {err.detail}). Check that it is running and reachable."
    )


async def _server_version(client: KubeClient) -> str:
    try:
        resp = await client.request("GET", "/version")
        return str(resp.body.get("gitVersion") or "?")
    except KubeError as err:
        if err.kind == kube.FORBIDDEN:
            return "?"
        raise


@dataclass
class ClusterInfo:
    name: str
    context: str
    server: str
    identity: str
    identity_source: str
    reachable: bool
    identity_ok: bool | None
    latency_ms: float | None
    version: str | None
    error: str | None
    namespace: str
    storage: list[str] = field(default_factory=list)
    permissions: dict[str, dict[str, bool | None]] = field(default_factory=dict)
    deployments: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return [f"{verb} {res}" for res, verbs in self.permissions.items() for verb, ok in verbs.items() if ok is False]


def permission_checks(
    namespace: str, storages: Sequence[str], deployments: Sequence[str] = ()
) -> list[tuple[str, str, str, str | None]]:
    """(api group, resource, verb, resource name or None) for every right the tool needs in
    ``namespace`` for ``deployments`` with the given state storages: read off the Roles that
    `rbac print` emits, so the check and the grant cannot disagree. With no deployment
    named, a deployment's own objects are checked as any object of their kind (stricter
    than the printed Role, which grants them by name only)."""
    from coordinator.ops import rbac

    placeholder = "x"
    checks: dict[tuple[str, str, str, str | None], None] = {}
    for storage in storages:
        for deployment in deployments or [placeholder]:
            for rule in rbac.role(namespace, deployment, storage=storage)["rules"]:  # type: ignore[arg-type]
                names: list[str | None] = list(rule.get("resourceNames") or [None])
                if not deployments:
                    own = {lease_name(placeholder), state_name(placeholder)}
                    names = [None if n in own else n for n in names]
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            for name in names:
                                checks[(group, resource, verb, name)] = None
    return list(checks)


async def cluster_info(
    clusters: ClusterSet,
    name: str,
    namespace: str,
    storages: Sequence[str] = ("configmap",),
    deployments: Sequence[str] = (),
) -> ClusterInfo:
    rec = clusters.record(name)
    client = clusters.client(name)
    info = ClusterInfo(
        name=name,
        context=rec.context,
        server=rec.server,
        identity=rec.identity,
        identity_source=rec.identity_source,
        reachable=False,
        identity_ok=None,
        latency_ms=None,
        version=None,
        error=None,
        namespace=namespace,
        storage=list(storages),
    )
    started = clock.monotonic()
    try:
        await client.open()  # reading the kubeconfig is not part of the round trip
        started = clock.monotonic()
        resp = await client.request("GET", "/version")
        info.latency_ms = round((clock.monotonic() - started) * 1000, 1)
        info.version = str(resp.body.get("gitVersion"))
        info.reachable = True
        info.server = client.server or info.server
    except KubeError as err:
        if err.kind == kube.FORBIDDEN:
            info.reachable = True
            info.latency_ms = round((clock.monotonic() - started) * 1000, 1)
        else:
            info.error = f"{err.kind}: {err.detail}"
            return info
    try:
        await clusters.check_identity(name)
        info.identity_ok = True
    except KubeError as err:
        info.identity_ok = False if err.kind == kube.IDENTITY_MISMATCH else None
        info.error = err.detail
    checks = permission_checks(namespace, storages, deployments)
    answers: dict[tuple[str, str], list[bool | None]] = {}
    for _, resource, verb, _ in checks:
        info.permissions.setdefault(resource, {})[verb] = None
        answers[(resource, verb)] = []

    async def check(group: str, resource: str, verb: str, resource_name: str | None) -> None:
        answers[(resource, verb)].append(await _can_i(client, verb, group, resource, namespace, resource_name))

    async with anyio.create_task_group() as tg:  # one access review per right, all at once
        for entry in checks:
            tg.start_soon(check, *entry)
    for (resource, verb), said in answers.items():
        # a right on several objects: missing if missing on one, unknown if unknown on one
        info.permissions[resource][verb] = False if False in said else (None if None in said else True)
    info.deployments = list(deployments)
    return info


@dataclass
class MemberOf:
    """A deployment an unreachable cluster is a member of, and whether the other members
    that answer still make a majority of it (of every group, during a member change)."""

    deployment: str
    namespace: str
    members: list[str]
    quorum: str  # "2 of 3"; "2 of 3 and 3 of 4" during a member change (old set, new set)
    answering: list[str]  # the other members that answered now
    majority_without: bool


async def deployments_without(clusters: ClusterSet, config: LocalConfig, name: str) -> list[MemberOf]:
    """The deployments ``name`` is a member of, each with the other members that answer a
    request now (one ``GET /version`` per cluster, at once) and whether they make a
    majority without ``name``. A member that answers with 403 answers."""
    from coordinator.rules.quorum import Majorities, quorum_size

    deps = [d for d in config.deployments.values() if name in d.clusters or name in (d.joint or [])]
    others = sorted({m for d in deps for m in [*d.clusters, *(d.joint or [])] if m != name})

    async def probe(member: str) -> ClusterResult[None]:
        try:
            await clusters.client(member).request("GET", "/version")
        except KubeError as err:
            if err.kind != kube.FORBIDDEN:
                return failed(member, err)  # type: ignore[return-value]
        return ClusterResult(member, Outcome.OK)

    known = [m for m in others if m in config.clusters]
    answers = await fan_out(known, probe, timeout=clusters.timeout) if known else {}
    up = {m for m, r in answers.items() if r.ok}
    found = []
    for d in sorted(deps, key=lambda d: d.name):
        majorities = Majorities([d.clusters, *([d.joint] if d.joint else [])])
        answering = [m for m in majorities.members if m in up]
        quorum = " and ".join(f"{quorum_size(len(g))} of {len(g)}" for g in majorities.groups)
        found.append(
            MemberOf(d.name, d.namespace, list(majorities.members), quorum, answering, majorities.reached(answering))
        )
    return found


async def _can_i(
    client: KubeClient, verb: str, group: str, resource: str, namespace: str, resource_name: str | None = None
) -> bool | None:
    attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": resource}
    if resource_name:
        attributes["name"] = resource_name
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    try:
        resp = await client.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=body)
    except KubeError:
        return None
    return bool((resp.body.get("status") or {}).get("allowed"))


def disconnect_cluster(store: ConfigStore, name: str, *, force: bool) -> list[str]:
    with store.edit() as cfg:
        if name not in cfg.clusters:
            raise unknown_cluster(name, cfg.clusters, store.path)
        users = sorted(d.name for d in cfg.deployments.values() if name in d.clusters)
        if users and not force:
            raise UsageError(
                f"Cluster {name!r} is a member of deployment(s) {', '.join(users)}; "
                "disconnecting it would leave them with a missing member. Pass --force to do it anyway."
            )
        del cfg.clusters[name]
    return users


async def create_deployment(
    store: ConfigStore,
    clusters: ClusterSet,
    name: str,
    namespace: str,
    members: list[str],
    storage: str,
    max_ttl_s: float | None = None,
) -> tuple[DeploymentRecord, dict[str, ClusterResult[str]]]:
    from coordinator.config.records import MAX_DEPLOYMENT_NAME

    valid_name(name, "deployment name", MAX_DEPLOYMENT_NAME)
    valid_name(namespace, "namespace")
    if not members:
        raise UsageError("A deployment needs at least one member cluster: pass --cluster NAME (repeatable).")
    if len(set(members)) != len(members):
        raise UsageError("A cluster is listed twice in --cluster; each member counts once.")
    if max_ttl_s is not None and max_ttl_s < 1:
        raise UsageError(f"--max-ttl must be at least 1s, not {max_ttl_s:g}s.")
    if max_ttl_s is not None and max_ttl_s > MAX_MAX_TTL_S:
        # The leases store it, and a longer note is not believed (a planted one could
        # keep a dead holder's lock for years): other machines would wait out less.
        raise UsageError(
            f"--max-ttl may be at most {MAX_MAX_TTL_S // 3600}h, not {max_ttl_s:g}s: contenders wait it "
            "out for a lease found deleted, and no lease note claiming longer is believed."
        )
    cfg = store.load()
    if name in cfg.deployments:
        raise UsageError(f"Deployment {name!r} already exists; `coordinator deployment show {name}` describes it.")
    for m in members:
        clusters.record(m)
    record = DeploymentRecord(name=name, namespace=namespace, clusters=members, storage=storage)  # type: ignore[arg-type]
    if max_ttl_s is not None:
        record.max_ttl_s = max_ttl_s

    async def prove(cluster: str) -> ClusterResult[str]:
        try:
            await clusters.check_identity(cluster)
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]
        return ClusterResult(cluster, Outcome.OK, "proven")

    # Every member proves its identity before any namespace is created anywhere, so a
    # repointed context stops the command before it changes even the true members.
    async def namespace_there(cluster: str) -> ClusterResult[str]:
        return await ensure_namespace(clusters, cluster, namespace)

    for step in (prove, namespace_there):
        results = await fan_out(members, step, timeout=clusters.timeout)
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            raise IdentityMismatchError(
                "Cluster identity mismatch — the deployment was not created: "
                + "; ".join(f"cluster {k!r}: {r.detail}" for k, r in bad.items())
                + ". Fix the kubeconfig context, or reconnect the cluster if it was really rebuilt."
            )
    await _refuse_planted_state(clusters, record)
    await _refuse_existing(clusters, record)
    # The leases are made now, free, so that one missing later is known to have been
    # deleted (and is then treated as held by an unknown holder, never as free).
    from coordinator.engine.lock.engine import LockEngine

    engine = LockEngine(clusters, record)
    leases = await engine.create_leases()
    stored = engine.membership.document()
    seeded = await fan_out(members, lambda c: seed_state(clusters, record, c, stored), timeout=clusters.timeout)
    for k, seed in seeded.items():
        if not seed.ok and results.get(k) is not None and results[k].ok:
            results[k] = ClusterResult(
                k, Outcome.OK, results[k].value, detail=f"{results[k].detail}; state object not created: {seed.detail}"
            )
    # The lock history's ConfigMap too, empty: its name is taken before anyone allowed to
    # create ConfigMaps in the namespace can plant one full of forged events.
    from coordinator.engine.history import HistoryStore

    book = HistoryStore(clusters, name, namespace, members)
    kept = await fan_out(members, book.create_empty, timeout=clusters.timeout)
    for k, made in kept.items():
        if not made.ok and results.get(k) is not None and results[k].ok:
            results[k] = ClusterResult(
                k, Outcome.OK, results[k].value, detail=f"{results[k].detail}; lock history not created: {made.detail}"
            )
    for k, r in leases.items():
        if not r.ok and results.get(k) is not None and results[k].ok:
            results[k] = ClusterResult(
                k, Outcome.OK, results[k].value, detail=f"{results[k].detail}; lease not created: {r.detail}"
            )
    with store.edit() as live:
        if name in live.deployments:
            raise UsageError(f"Deployment {name!r} was created meanwhile; nothing changed.")
        for m in members:
            if m not in live.clusters:
                raise UsageError(f"Cluster {m!r} was disconnected meanwhile; nothing changed.")
        live.deployments[name] = record
    return record, results


async def _refuse_existing(clusters: ClusterSet, record: DeploymentRecord) -> None:
    """Stop a create where anything of the deployment's name is on any member (its lease,
    a state object of either storage kind, its lock history), or where a member cannot be
    asked. Creating it again would make free leases where its leases were deleted (each
    such place counts as held by an unknown holder until a maximum TTL has passed) and
    empty seeded state where its state objects were deleted (which would then answer for
    the newest confirmed write): a deployment that exists is taken up with `deployment
    import`, never created twice. An object coordinator did not make is named as
    possibly planted; whoever owns the namespace removes it."""
    from coordinator.rules.lease import LeaseView

    ns, name = record.namespace, record.name
    paths = (
        ("lease", lease_path(ns, lease_name(name))),
        ("state ConfigMap", state_paths(ns, name, "configmap")[1]),
        ("state Secret", state_paths(ns, name, "secret")[1]),
        ("lock history", f"{configmaps_path(ns)}/{history_name(name)}"),
    )

    async def one(cluster: str) -> ClusterResult[list[str]]:
        found = []
        try:
            for what, path in paths:
                try:
                    obj = (await clusters.client(cluster).request("GET", path)).body
                except KubeError as err:
                    # A kind this user may not read is one this create does not make either.
                    if err.kind in (kube.NOT_FOUND, kube.FORBIDDEN):
                        continue
                    raise
                named = what != "lease" or LeaseView.parse(obj).names_itself
                found.append(what if named else f"{what} coordinator did not make (planted?)")
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]
        return ClusterResult(cluster, Outcome.OK, found)

    results = await fan_out(record.clusters, one, timeout=clusters.timeout)
    there = {k: r.value for k, r in sorted(results.items()) if r.ok and r.value}
    unseen = {k: r for k, r in sorted(results.items()) if not r.ok and r.outcome is not Outcome.FORBIDDEN}
    unseen.update(
        {k: ClusterResult(k, Outcome.UNREACHABLE, detail="no answer") for k in record.clusters if k not in results}
    )
    if there:
        where = "; ".join(f"{k}: {', '.join(v)}" for k, v in there.items())
        first = next(iter(there))
        raise StateConflictError(
            f"Deployment {name!r} already exists in namespace {ns}, or something is in its place ({where}). "
            "It is not created again: that would make free leases where its leases were deleted and empty "
            f"state where its state was deleted. If it is yours, use it from this machine with `coordinator "
            f"deployment import {name} --cluster {first} --namespace {ns}`; an object coordinator did not "
            "make may be planted: look at it with kubectl before anything else. Nothing was created."
        )
    if unseen:
        why = "; ".join(f"{k}: {r.outcome} ({r.detail})" for k, r in unseen.items())
        raise NoQuorumError(
            f"Cannot create deployment {name!r}: whether it already exists could not be checked on every "
            f"member ({why}), and creating it where it exists would free its deleted leases. Nothing was "
            "created; retry when every member answers."
        )


async def _refuse_planted_state(clusters: ClusterSet, record: DeploymentRecord) -> None:
    """Stop a create where a member has a state object of this name but no lease: the
    leases come first, so that object was not written by this deployment. Someone allowed
    to create objects in the namespace (a right Kubernetes cannot limit by name) may have
    put it there for this deployment's readers to take; or it is left from an earlier
    deployment of that name whose leases were deleted. Members that do not answer are
    not checked (the seeding after the leases closes the name on the others)."""
    from coordinator.engine.register import decode_replica
    from coordinator.rules.lease import LeaseView

    _, path = state_paths(record.namespace, record.name, record.storage)

    async def one(cluster: str) -> ClusterResult[str]:
        client = clusters.client(cluster)
        try:
            try:
                lease = (await client.request("GET", lease_path(record.namespace, lease_name(record.name)))).body
                if LeaseView.parse(lease).names_itself:
                    return ClusterResult(cluster, Outcome.OK, "")  # a lease coordinator made and named
                # A lease not named by coordinator (planted by someone who may create
                # Leases, or from a version before leases were named) vouches for nothing.
            except KubeError as err:
                if err.kind != kube.NOT_FOUND:
                    raise
            try:
                obj = (await client.request("GET", path)).body
            except KubeError as err:
                if err.kind != kube.NOT_FOUND:
                    raise
                return ClusterResult(cluster, Outcome.OK, "")
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]
        rep = decode_replica(cluster, obj, record.storage)
        env = rep.envelope
        if env is not None and env.version == 0 and not env.data and env.deployment in (None, record.name):
            return ClusterResult(cluster, Outcome.OK, "")  # an empty state, as a create seeds it
        if env is None:
            what = f"unreadable: {rep.corrupt or 'newer schema'}"
        else:
            who = printable(env.written_by)[:100]  # planted text: one line, escaped
            what = f"version {env.version}, written by {who} at {env.written_at:%Y-%m-%d %H:%M:%SZ}"
            if env.deployment not in (None, record.name):
                what += f" for deployment {env.deployment!r}"
        return ClusterResult(cluster, Outcome.CONFLICT, what)

    results = await fan_out(record.clusters, one, timeout=clusters.timeout)
    planted = {k: r.value for k, r in results.items() if r.outcome is Outcome.CONFLICT}
    if planted:
        kind = "Secret" if record.storage == "secret" else "ConfigMap"
        found = "; ".join(f"{k}: {v}" for k, v in sorted(planted.items()))
        raise StateConflictError(
            f"Deployment {record.name!r} was not created: the {kind} {state_name(record.name)} already exists "
            f"in namespace {record.namespace!r} where no lease coordinator made for that deployment does "
            f"({found}). This "
            "deployment did not write it: someone allowed to create objects in the namespace may have put it "
            "there, or an earlier deployment of that name left it when its leases were deleted. Nothing was "
            f"changed. Look at it (kubectl get {kind.lower()} {state_name(record.name)} -n {record.namespace} "
            "-o yaml); if it is that earlier deployment's state, adopt it with `coordinator deployment import "
            f"{record.name}`, otherwise delete it and run this command again."
        )


async def ensure_namespace(clusters: ClusterSet, cluster: str, namespace: str) -> ClusterResult[str]:
    """Make sure ``namespace`` exists on ``cluster`` (create it where it does not), after
    the cluster proved its identity: FORBIDDEN, with what to ask an admin, where this user
    may not create it."""
    client = clusters.client(cluster)
    try:
        await clusters.check_identity(cluster)
        readable = True
        try:
            await client.request("GET", namespace_path(namespace))
            return ClusterResult(cluster, Outcome.OK, "exists", detail="namespace exists")
        except KubeError as err:
            if err.kind not in (kube.NOT_FOUND, kube.FORBIDDEN):
                raise
            readable = err.kind != kube.FORBIDDEN
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {LABEL_MANAGED_BY: LABEL_VALUE}},
        }
        try:
            await client.request("POST", "/api/v1/namespaces", body=body)
            return ClusterResult(cluster, Outcome.OK, "created", detail="namespace created")
        except KubeError as err:
            if err.kind == kube.ALREADY_EXISTS:
                return ClusterResult(cluster, Outcome.OK, "exists", detail="namespace exists")
            if err.kind == kube.FORBIDDEN:
                detail = (
                    f"may not create namespace {namespace}; ask an admin to create it"
                    if readable
                    else f"may neither read nor create namespace {namespace}; if it does not exist "
                    "yet, ask an admin to create it"
                )
                return ClusterResult(cluster, Outcome.FORBIDDEN, None, detail=detail)
            raise
    except KubeError as err:
        return failed(cluster, err)  # type: ignore[return-value]


async def seed_state(
    clusters: ClusterSet, record: DeploymentRecord, cluster: str, membership: dict[str, Any]
) -> ClusterResult[str]:
    """Create the member's state object holding the empty state for this deployment, so
    the name is taken before anyone else can create an object under it (one already
    there is left as it is). It stores the member set too, which confirms it when every
    lease was deleted before the first state write. Marked seeded, it answers reads
    ("nothing written yet") where an empty object made later does not: it is made
    before any write could have landed there (by `deployment create`, or by a member
    change for a joining member, which no write has reached yet)."""
    from coordinator.engine.lock.floor import genesis_state_object
    from coordinator.engine.register import SEEDED_ANNOTATION
    from coordinator.rules.evidence import with_records
    from coordinator.rules.membership import A_MEMBERSHIP, Membership

    # Made in two steps. The create carries neither the seeded mark nor the member set:
    # a create has no precondition, and one held up on the network can land long after,
    # where the object was deleted since (after a member change, say), so what it carries
    # must say nothing. The mark and the set follow in a compare-and-swap on the very
    # object the create made, which fails wherever anything happened to it since.
    collection, path = state_paths(record.namespace, record.name, record.storage)
    client = clusters.client(cluster)
    body = genesis_state_object(record.name, record.storage, None)
    try:
        made: dict[str, Any] = (
            await client.request("POST", collection, body=body, query={"fieldManager": FIELD_MANAGER})
        ).body
    except KubeError as err:
        if err.kind == kube.ALREADY_EXISTS:
            return ClusterResult(cluster, Outcome.OK, "exists")
        return failed(cluster, err)  # type: ignore[return-value]
    uid = (made.get("metadata") or {}).get("uid")
    noted = Membership.parse(membership)
    current = made
    for _ in range(3):
        meta = dict(current.get("metadata") or {})
        if meta.get("uid") != uid or (meta.get("annotations") or {}).get(SEEDED_ANNOTATION):
            break  # another object by now (deleted and made again), or marked already
        annotations = dict(meta.get("annotations") or {}) | {SEEDED_ANNOTATION: "true"}
        if noted is not None:
            annotations[A_MEMBERSHIP] = noted.dump()
        meta["annotations"] = annotations
        marked = with_records({**current, "metadata": meta}, current, clock.token_hex(6))
        try:
            await client.request("PUT", path, body=marked, query={"fieldManager": FIELD_MANAGER})
            return ClusterResult(cluster, Outcome.OK, "created")
        except KubeError as err:
            if err.kind != kube.CONFLICT:
                return failed(cluster, err)  # type: ignore[return-value]
        try:
            current = (await client.request("GET", path)).body
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]
    return ClusterResult(
        cluster, Outcome.CONFLICT, "created", detail="created, but changed before it was marked seeded"
    )


def delete_deployment_record(store: ConfigStore, name: str) -> DeploymentRecord:
    with store.edit() as cfg:
        if name not in cfg.deployments:
            raise unknown_deployment(name, cfg.deployments, store.path)
        return cfg.deployments.pop(name)


def deployment_document(cfg: LocalConfig, dep: DeploymentRecord) -> dict[str, Any]:
    return {
        "name": dep.name,
        "namespace": dep.namespace,
        "clusters": dep.clusters,
        "quorum": dep.quorum,
        "storage": dep.storage,
        "created_at": dep.created_at,
        "epoch": dep.epoch,
        "change_in_progress": {"to": dep.joint} if dep.joint else None,
        "max_ttl_s": dep.max_ttl_s,
    }
