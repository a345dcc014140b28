"""`coordinator drift`: the watched resources read on every member at once, against the
record in the deployment's state (the rules are in :mod:`coordinator.rules.expectations`).

Reading needs no lock: the record comes from a quorum read of the state, then every member
is asked at once (the fan-out), each only after its identity is proven; a member that
cannot be asked, or whose answer is no answer (timeout, 403, throttled, a kind it does not
serve, a missing namespace), makes its resources ``unobservable``, never ``gone``. A 404
counts as ``gone`` only once the namespace is seen on the same member. A member whose
context now leads to another cluster stops the command (exit 5), as it stops the state read.

Recording is a state write: the resources are read on every member they are watched on
(each must answer with the object), then the record is written as a new version under the
lock, fenced like any other write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from coordinator.engine.clusters import outcome_of
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.errors import CoordinatorError, DriftError, IdentityMismatchError, NoQuorumError, UsageError
from coordinator.kube.client import NOT_FOUND, KubeClient, KubeError
from coordinator.rules.expectations import (
    CLUSTER,
    DEFAULT_FIELDS,
    FALLBACK_FIELDS,
    NAMESPACED,
    STATE_KEY,
    Expectation,
    Finding,
    ResourceRef,
    Status,
    Verdict,
    compare,
    expectation_from,
    read_expectations,
    record_document,
    verdict,
    watched_on,
)
from coordinator.rules.fieldpaths import found_in
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import namespace_path

if TYPE_CHECKING:
    from coordinator.engine.state import WriteReport
    from coordinator.ops.api import Coordinator


@dataclass
class Read:
    """One watched resource as one member answered: the object, or gone, or why not seen."""

    obj: dict[str, Any] | None = None
    gone: str = ""  # why the object counts as gone
    unobservable: str = ""
    unserved: bool = False  # the server serves no such kind: unobservable, and nothing to record
    unreadable: bool = False  # it answered with the object, in a form that cannot be read
    namespaced: bool | None = None  # how the server serves the kind (from discovery)


def _paths(ref: ResourceRef, plural: str, namespaced: bool) -> str:
    base = f"/apis/{ref.api_version}" if ref.group else f"/api/{ref.api_version}"
    return f"{base}/namespaces/{ref.namespace}/{plural}/{ref.name}" if namespaced else f"{base}/{plural}/{ref.name}"


async def _served(client: KubeClient, ref: ResourceRef, cache: dict[str, Any]) -> tuple[str, bool] | str:
    """The resource name and scope the server serves ``ref``'s kind under, or why not."""
    if ref.api_version not in cache:
        base = f"/apis/{ref.api_version}" if ref.group else f"/api/{ref.api_version}"
        try:
            cache[ref.api_version] = (await client.request("GET", base)).body.get("resources") or []
        except KubeError as err:
            if err.kind == NOT_FOUND:
                cache[ref.api_version] = f"the server does not serve {ref.api_version}"
            else:
                raise
    listed = cache[ref.api_version]
    if isinstance(listed, str):
        return listed
    for r in listed:
        if isinstance(r, dict) and r.get("kind") == ref.kind and "/" not in str(r.get("name", "")):
            return str(r["name"]), bool(r.get("namespaced"))
    return f"the server serves no kind {ref.kind} in {ref.api_version}"


async def _read(client: KubeClient, ref: ResourceRef, cache: dict[str, Any]) -> Read:
    try:
        served = await _served(client, ref, cache)
        if isinstance(served, str):
            return Read(unobservable=served, unserved=True)
        plural, namespaced = served
        if ref.scope is not None and (ref.scope == NAMESPACED) != namespaced:
            # Recorded under one scope, served under the other now (a CRD made again
            # with another scope): the object read there would be another object.
            now = "namespaced" if namespaced else "cluster-scoped"
            why = f"the server now serves {ref.kind} {now}; it was recorded {ref.scope.lower()}"
            return Read(unobservable=why, unreadable=True)
        try:
            return Read(obj=(await client.request("GET", _paths(ref, plural, namespaced))).body, namespaced=namespaced)
        except KubeError as err:
            if err.kind != NOT_FOUND:
                raise
            if err.named != ref.name:
                # Not the object's absence: the path itself is not served (the kind's
                # version stopped being served since discovery said it was).
                return Read(unobservable=f"the server no longer serves {ref.api_version} {plural} ({err.detail})")
        if not namespaced:
            return Read(gone="not found")
        # A 404 is the object's absence only where its namespace is seen.
        try:
            await client.request("GET", namespace_path(ref.namespace))
        except KubeError as err:
            if err.kind == NOT_FOUND:
                return Read(unobservable=f"namespace {ref.namespace} not found")
            raise
        return Read(gone=f"not found; namespace {ref.namespace} is there")
    except KubeError as err:
        answered = err.status is not None and 200 <= err.status < 300
        return Read(unobservable=f"{outcome_of(err)}: {err.detail}", unreadable=answered)


async def read_resources(
    c: Coordinator, members: Sequence[str], wanted: Mapping[str, Sequence[ResourceRef]]
) -> dict[str, ClusterResult[dict[ResourceRef, Read]]]:
    """Every member's answer for the resources it watches (``wanted``: member → refs),
    read at once; a member whose identity is not proven answers nothing."""

    async def one(cluster: str) -> ClusterResult[dict[ResourceRef, Read]]:
        try:
            await c.clusters.check_identity(cluster)
        except KubeError as err:
            return ClusterResult(cluster, outcome_of(err), detail=err.detail)
        client = c.clusters.client(cluster)
        cache: dict[str, Any] = {}
        reads = {ref: await _read(client, ref, cache) for ref in wanted[cluster]}
        return ClusterResult(cluster, Outcome.OK, value=reads)

    # A member's reads go one after another on its connection: each gets the request timeout.
    most = max((len(refs) for refs in wanted.values()), default=0)
    timeout = c.timeout * (2 + 3 * most)
    answers = await fan_out([m for m in members if wanted.get(m)], one, timeout=timeout, silent=c.clusters.silent)
    # As for every command (and the state read before this one): a context that leads to
    # another cluster stops the command, whatever the other members say.
    bad = {k: r for k, r in answers.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
    if bad:
        raise IdentityMismatchError(
            "Cluster identity mismatch — no resource was compared: "
            + "; ".join(f"cluster {k!r}: {r.detail}" for k, r in sorted(bad.items()))
            + ". Fix the kubeconfig context, or reconnect the cluster if it was really rebuilt."
        )
    return answers


@dataclass
class DriftReport:
    deployment: str
    members: list[str]
    expectations: list[Expectation]
    findings: list[Finding] = field(default_factory=list)
    version: int | None = None

    @property
    def verdict(self) -> Verdict:
        return verdict(self.findings, self.expectations, self.members)

    def problem(self) -> CoordinatorError | None:
        """The error this report ends in: confirmed drift, or too little observed to say."""
        v = self.verdict
        if v.confirmed:
            where = "; ".join(
                f"{f.ref.label} on {f.cluster}: "
                + ("gone" if f.status is Status.GONE else ", ".join(d.path for d in f.fields))
                for f in v.drifted
            )
            return DriftError(
                f"Deployment {self.deployment!r} has drifted from its record: {where}. Put the resources back as "
                f"recorded, or record what they are now with `coordinator drift record {self.deployment} ...` "
                "under the lock."
            )
        if v.unsure:
            return NoQuorumError(
                f"Cannot say whether {', '.join(v.unsure)} of {self.deployment!r} match the record: fewer than a "
                "majority of the clusters watching them could be read. Nothing was found drifted; retry when more "
                "clusters answer."
            )
        return None


async def check(c: Coordinator, deployment: str) -> DriftReport:
    """Read the record (a quorum read of the state) and every watched resource on every member."""
    dep = c.deployment(deployment)
    state = await c.state(deployment).read()
    data = state.envelope.data if state.envelope else {}
    expectations = read_expectations(data, dep.namespace)
    report = DriftReport(
        deployment, list(dep.clusters), expectations, version=state.envelope.version if state.envelope else None
    )
    if not expectations:
        return report
    for exp in expectations:
        if exp.ref.cluster and exp.ref.cluster not in dep.clusters:
            raise UsageError(
                f"The drift record of {deployment!r} watches {exp.ref.label} on {exp.ref.cluster}, which is not a "
                f"member (members: {', '.join(dep.clusters)}). Record it again without that cluster."
            )
    wanted = {m: [e.ref for e in expectations if m in watched_on(e, dep.clusters)] for m in dep.clusters}
    answers = await read_resources(c, dep.clusters, wanted)
    for exp in expectations:
        for cluster in watched_on(exp, dep.clusters):
            answer = answers.get(cluster)
            if answer is None:
                report.findings.append(Finding(cluster, exp.ref, Status.UNOBSERVABLE, "not waited for"))
            elif not answer.ok or answer.value is None:
                why = f"{answer.outcome}: {answer.detail}" if answer.detail else str(answer.outcome)
                report.findings.append(Finding(cluster, exp.ref, Status.UNOBSERVABLE, why))
            else:
                read = answer.value[exp.ref]
                if read.obj is not None:
                    report.findings.append(_compared(cluster, exp, read.obj))
                elif read.gone:
                    report.findings.append(Finding(cluster, exp.ref, Status.GONE, read.gone))
                else:
                    found = Finding(
                        cluster, exp.ref, Status.UNOBSERVABLE, read.unobservable, unreadable=read.unreadable
                    )
                    report.findings.append(found)
    return report


def _compared(cluster: str, exp: Expectation, obj: dict[str, Any]) -> Finding:
    """``compare``, for an object whoever can edit it shaped: one that cannot be compared
    (values nested deeper than the comparison goes) is unreadable, never a crash."""
    try:
        return compare(cluster, exp, obj)
    except (RecursionError, TypeError, ValueError, KeyError, AttributeError) as err:
        why = f"the object could not be compared ({type(err).__name__})"
        return Finding(cluster, exp.ref, Status.UNOBSERVABLE, why, unreadable=True)


def fields_for(ref: ResourceRef, given: Sequence[str]) -> list[str]:
    return list(given) or list(DEFAULT_FIELDS.get(ref.kind, FALLBACK_FIELDS))


async def record(
    c: Coordinator,
    deployment: str,
    refs: Sequence[ResourceRef],
    fields: Sequence[str],
    *,
    lock: str | None,
    command: str,
) -> tuple[WriteReport, list[Expectation]]:
    """Read ``refs`` on every member they are watched on and write what they are as the
    record (a fenced state write: the lock must be held). Every member must answer with
    the object: a record is never made from part of the members."""
    dep = c.deployment(deployment)
    for ref in refs:
        if ref.cluster and ref.cluster not in dep.clusters:
            raise UsageError(
                f"--cluster {ref.cluster} is not a member of {deployment!r} (members: {', '.join(dep.clusters)}). "
                "Nothing was recorded."
            )
    wanted = {m: [r for r in refs if r.cluster in (None, m)] for m in dep.clusters}
    answers = await read_resources(c, dep.clusters, wanted)
    # (resource, why) -> the members it applies to, to name each resource once
    unseen: dict[tuple[str, str], list[str]] = {}
    missing: dict[tuple[str, str], list[str]] = {}
    recorded = []
    read_objects: list[dict[str, Any]] = []
    mixed: list[str] = []
    for ref in refs:
        objects = {}
        scopes: set[bool] = set()
        for cluster in [ref.cluster] if ref.cluster else dep.clusters:
            answer = answers.get(cluster)
            read = answer.value.get(ref) if answer is not None and answer.ok and answer.value else None
            if read is None:
                why = "not waited for" if answer is None else f"{answer.outcome}: {answer.detail}".rstrip(": ")
                unseen.setdefault((ref.label, why), []).append(cluster)
            elif read.gone or read.unserved:
                missing.setdefault((ref.label, read.unobservable if read.unserved else ""), []).append(cluster)
            elif read.obj is None:
                unseen.setdefault((ref.label, read.unobservable), []).append(cluster)
            else:
                objects[cluster] = read.obj
                scopes |= {read.namespaced} if read.namespaced is not None else set()
        if len(scopes) > 1:
            mixed.append(ref.label)
        scope = (NAMESPACED if scopes.pop() else CLUSTER) if len(scopes) == 1 else None
        recorded.append(expectation_from(replace(ref, scope=scope), fields_for(ref, fields), objects))
        read_objects.append(objects)

    def listed(found: dict[tuple[str, str], list[str]]) -> str:
        return "; ".join(
            f"{label} on {', '.join(on)}" + (f" ({why})" if why else "") for (label, why), on in found.items()
        )

    if missing:
        raise UsageError(
            f"Not found: {listed(missing)}. A record names what exists: create it first, or watch it on the "
            "members that have it with --cluster. Nothing was recorded."
        )
    if mixed:
        raise UsageError(
            f"The members serve {', '.join(mixed)} in different scopes (namespaced on some, cluster-scoped on "
            "others): they hold different objects under that name. Nothing was recorded."
        )
    if unseen:
        raise NoQuorumError(
            f"Could not read {listed(unseen)}. A record is made from every member it covers; retry when they "
            "answer. Nothing was recorded."
        )
    # A --field that matches nothing anywhere (a typo: .spec.replicsa) would be recorded
    # as null and match for ever. (A default field may be absent: a ConfigMap without data.)
    nowhere = [
        f"{f.path} in {exp.ref.label}"
        for exp, objects in zip(recorded, read_objects, strict=True)
        for f in exp.fields
        if fields and objects and not any(found_in(obj, f.path) for obj in objects.values())
    ]
    if nowhere:
        raise UsageError(
            f"No member has the field {'; '.join(nowhere)}: check the path (kubectl get -o yaml shows the "
            "object's fields). Nothing was recorded."
        )

    def change(data: dict[str, Any]) -> dict[str, Any]:
        data[STATE_KEY] = record_document(data, dep.namespace, recorded)
        return data

    report = await c.state(deployment).write(change, lock=lock, command=command)
    return report, recorded
