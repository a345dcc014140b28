"""Drift: what a deployment's state records of the resources it watches, and how what a
cluster holds now compares with it.

The record (the *expectations*) is the part of the state document under the top-level
key ``drift``: a list of watched resources, each with the fields that matter (JSONPath,
as kubectl writes it: ``.spec.replicas``) and the values recorded for them, one value for
every member and, per cluster, the values where a member differed when it was recorded::

    drift:
      resources:
      - resource: apps/v1/Deployment/api
        namespace: payments
        fields:
        - path: .spec.replicas
          value: 3
          clusters: {eu-2: 2}

Each read of a watched resource on a member comes to one of four findings: ``match``;
``drifted`` (a field's value differs from the record: the field, both values, and who
changed it last per the object's managedFields, and when); ``gone`` (the API server
answered 404 for the object while its namespace is there); ``unobservable`` (no answer,
403, throttled, a kind the server does not serve, a missing namespace): the resource may be
anything, and it is never reported as gone. (A member whose identity does not match is
not compared at all: the command stops, as every command does.)

Pure: no I/O and no clock; what was read comes in as arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from jsonpath_ng import jsonpath as jp

from coordinator.errors import UsageError
from coordinator.rules.evidence import NO_WRITERS
from coordinator.rules.fieldpaths import compiled, many, parse_field, same_json, value_at
from coordinator.rules.quorum import quorum_size

STATE_KEY = "drift"

# Kinds that may be named as KIND/NAME; any other kind is named GROUP/VERSION/KIND/NAME
# (VERSION/KIND/NAME for the core group). Keys are lower case, as kubectl takes them.
SHORT_KINDS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("deployment", "deployments", "deploy"), ("apps/v1", "Deployment")),
    **dict.fromkeys(("statefulset", "statefulsets", "sts"), ("apps/v1", "StatefulSet")),
    **dict.fromkeys(("daemonset", "daemonsets", "ds"), ("apps/v1", "DaemonSet")),
    **dict.fromkeys(("configmap", "configmaps", "cm"), ("v1", "ConfigMap")),
    **dict.fromkeys(("service", "services", "svc"), ("v1", "Service")),
    **dict.fromkeys(("cronjob", "cronjobs", "cj"), ("batch/v1", "CronJob")),
}


# The fields recorded when `drift record` is given no --field.
DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {
    "Deployment": (".spec.replicas", ".spec.template.spec.containers[*].image"),
    "StatefulSet": (".spec.replicas", ".spec.template.spec.containers[*].image"),
    "DaemonSet": (".spec.template.spec.containers[*].image",),
    "CronJob": (".spec.schedule", ".spec.jobTemplate.spec.template.spec.containers[*].image"),
    "ConfigMap": (".data",),
}
FALLBACK_FIELDS = (".spec",)

# Kinds whose values must not be copied into the state (which any reader of the
# deployment's namespace may read, and which is a ConfigMap by default).
REFUSED_KINDS = frozenset({"Secret"})

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# Namespaces and cluster names are DNS labels (as the API server and the config take them).
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$")
_GROUP = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_VERSION = re.compile(r"^v[0-9]+((alpha|beta)[0-9]+)?$")

RESOURCE_FORMS = (
    "KIND/NAME for Deployment, StatefulSet, DaemonSet, ConfigMap, Service or CronJob (e.g. deployment/api), "
    "otherwise GROUP/VERSION/KIND/NAME (e.g. example.com/v1/Widget/w1; v1/KIND/NAME for the core group)"
)


NAMESPACED, CLUSTER = "Namespaced", "Cluster"


@dataclass(frozen=True, order=True)
class ResourceRef:
    """One watched resource: API version, kind, name, namespace (None for cluster-scoped
    kinds is decided by the server; here it is the namespace given or the deployment's),
    and the one member it is watched on (None: every member)."""

    api_version: str
    kind: str
    name: str
    namespace: str
    cluster: str | None = None
    # How the members served the kind when it was recorded: NAMESPACED or CLUSTER (None in
    # a record written by hand). Not part of the resource's identity.
    scope: str | None = field(default=None, compare=False)

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def resource(self) -> str:
        """The text the record keeps: GROUP/VERSION/KIND/NAME (VERSION/KIND/NAME in the core group)."""
        return f"{self.api_version}/{self.kind}/{self.name}"

    @property
    def label(self) -> str:
        """How reports name it: ``Deployment payments/api`` (``@CLUSTER`` when watched on one)."""
        where = f"@{self.cluster}" if self.cluster else ""
        return f"{self.kind} {self.namespace}/{self.name}{where}"

    def same(self, other: ResourceRef) -> bool:
        return (self.resource, self.namespace, self.cluster) == (other.resource, other.namespace, other.cluster)


def parse_resource(text: str, namespace: str, cluster: str | None = None) -> ResourceRef:
    """A RESOURCE as typed on the command line (see :data:`RESOURCE_FORMS`)."""
    parts = text.split("/")
    if len(parts) == 2:
        short = SHORT_KINDS.get(parts[0].lower())
        if short is None:
            raise UsageError(f"Unknown kind {parts[0]!r} in {text!r}: name a resource as {RESOURCE_FORMS}.")
        api_version, kind, name = short[0], short[1], parts[1]
    elif len(parts) == 3:
        api_version, kind, name = parts
    elif len(parts) == 4:
        api_version, kind, name = f"{parts[0]}/{parts[1]}", parts[2], parts[3]
    else:
        raise UsageError(f"Cannot read the resource {text!r}: name it as {RESOURCE_FORMS}.")
    group, _, version = api_version.rpartition("/")
    problem = None
    if group and not _GROUP.fullmatch(group):
        problem = f"{group!r} is no API group"
    elif not _VERSION.fullmatch(version):
        problem = f"{version!r} is no API version (v1, v1beta1, ...)"
    elif not _KIND.fullmatch(kind):
        problem = f"{kind!r} is no kind (kinds are CamelCase, e.g. Deployment)"
    elif not _NAME.fullmatch(name):
        problem = f"{name!r} is no object name (lower case letters, digits, '-' and '.')"
    elif not _LABEL.fullmatch(namespace):
        problem = f"{namespace!r} is no namespace name (lower case letters, digits and '-')"
    elif cluster is not None and not (isinstance(cluster, str) and _LABEL.fullmatch(cluster)):
        problem = f"{cluster!r} is no cluster name"
    if problem:
        raise UsageError(f"Cannot read the resource {text!r}: {problem}. Name it as {RESOURCE_FORMS}.")
    if kind in REFUSED_KINDS:
        raise UsageError(
            f"{kind} objects are not watched for drift: their values would be copied into the deployment's "
            "state, which every reader of the namespace may read."
        )
    return ResourceRef(api_version, kind, name, namespace, cluster)


# ------------------------------------------------------------------ who changed it


@dataclass(frozen=True)
class Change:
    """The last recorded write of a field: the field manager, its operation, its time."""

    manager: str
    operation: str = ""
    time: str = ""  # the server leaves it out of a subresource's entry (`kubectl scale`)
    subresource: str = ""
    exact: bool = True  # False: the field has no recorded owner; this is the object's last write

    def text(self) -> str:
        what = self.manager or "unknown"
        how = ", ".join(p for p in (self.operation, self.subresource and f"{self.subresource} subresource") if p)
        if how:
            what += f" ({how})"
        if self.time:
            what += f" at {self.time}"
        return what if self.exact else f"{what}, the object's last write (the field has no recorded writer)"


_ABSENT = object()
Step = str | int  # a field name, or an index into a list


def _steps(match: Any) -> list[Step] | None:
    """The concrete path of one JSONPath match, from the object's top: field names and
    list indices; None for a step of another kind."""
    steps: list[Step] = []
    datum = match
    while datum is not None and datum.context is not None:
        step = datum.path
        if isinstance(step, jp.Fields) and len(step.fields) == 1:
            steps.append(str(step.fields[0]))
        elif isinstance(step, jp.Index) and len(getattr(step, "indices", ())) == 1:
            steps.append(int(step.indices[0]))
        else:
            return None
        datum = datum.context
    return steps[::-1]


def _changed_leaves(recorded: Any, actual: Any) -> list[list[Step]] | None:
    """Where ``actual`` differs from ``recorded``, followed through maps down to what
    differs (relative steps); None when a difference lies inside a list (an element
    added or removed cannot be told from one changed)."""
    if isinstance(recorded, dict) and isinstance(actual, dict):
        found: list[list[Step]] = []
        for key in sorted(set(recorded) | set(actual)):
            a, b = recorded.get(key, _ABSENT), actual.get(key, _ABSENT)
            if a is not _ABSENT and b is not _ABSENT and same_json(a, b):
                continue
            below = _changed_leaves(a, b)
            if below is None:
                return None
            found += [[key, *steps] for steps in below]
        return found
    if isinstance(recorded, list) or isinstance(actual, list):
        return None
    return [[]]


def _changed_steps(obj: Mapping[str, Any], path: str, recorded: Any) -> list[list[Step]] | None:
    """The concrete paths in ``obj`` of what differs from ``recorded`` at ``path`` (every
    match when nothing was recorded); None when they cannot be told: a field gone, a list
    of matches that grew or shrank, a difference inside a list."""
    expr = compiled(path)
    matches = [(_steps(m), m.value) for m in expr.find(obj)]
    if not matches or any(steps is None for steps, _ in matches):
        return None
    if recorded is _ABSENT:
        return [steps for steps, _ in matches if steps is not None]
    if many(expr):
        if not isinstance(recorded, list) or len(recorded) != len(matches):
            return None
        pairs = [(steps, r, v) for (steps, v), r in zip(matches, recorded, strict=True) if not same_json(r, v)]
    else:
        pairs = [(matches[0][0], recorded, matches[0][1])]
    found: list[list[Step]] = []
    for steps, r, v in pairs:
        below = _changed_leaves(r, v)
        if below is None or steps is None:
            return None
        found += [[*steps, *rest] for rest in below]
    return found


def _owns(node: Any, steps: Sequence[Step], value: Any) -> bool:
    """Whether a managedFields entry (its fieldsV1 ``node``) owns the field at ``steps``
    in the object (``value``: the object at this level). A list element is found under
    the key the entries give it: its key fields (``k:{"name":"api"}``), its value
    (``v:...``) or its index (``i:0``)."""
    if not steps:
        return isinstance(node, dict)
    if not isinstance(node, dict):
        return False
    step, rest = steps[0], steps[1:]
    if isinstance(step, str):
        return _owns(node.get("f:" + step), rest, value.get(step) if isinstance(value, dict) else None)
    element = value[step] if isinstance(value, list) and 0 <= step < len(value) else _ABSENT
    for key, child in node.items():
        if not isinstance(key, str) or key[:2] not in ("k:", "v:", "i:"):
            continue
        if key[:2] == "i:":
            if key[2:] == str(step):
                return _owns(child, rest, element)
            continue
        try:
            named = json.loads(key[2:])
        except (ValueError, RecursionError):  # a key someone wrote nested too deeply: nobody's
            continue
        if key[:2] == "v:" and same_json(named, element):
            return _owns(child, rest, element)
        if (
            key[:2] == "k:"
            and isinstance(named, dict)
            and isinstance(element, dict)
            and all(k in element and same_json(element[k], v) for k, v in named.items())
        ):
            return _owns(child, rest, element)
    return False


def last_change(obj: Mapping[str, Any], path: str, recorded: Any = _ABSENT) -> Change | None:
    """Who changed the field at ``path`` last, per the object's managedFields.

    Exact only where the entries name an owner for everything at ``path`` that differs
    from ``recorded`` (followed through maps, and into list elements by the keys the
    entries give them): then the newest of those owners. Otherwise (a field nobody owns:
    defaulted by the server, removed, or managedFields stripped; elements added or
    removed) the object's newest entry, marked as not exact. None when the object records
    no writer at all."""
    entries = [e for e in ((obj.get("metadata") or {}).get("managedFields") or []) if isinstance(e, dict)]
    if not entries:
        return None
    changed = _changed_steps(obj, path, recorded)
    owners: list[dict[str, Any]] = []
    for steps in changed or []:
        owning = [e for e in entries if _owns(e.get("fieldsV1"), steps, obj)]
        if not owning:
            changed = None
            break
        owners += [e for e in owning if e not in owners]
    named = [e for e in owners if str(e.get("manager") or "") not in NO_WRITERS] or owners
    exact = bool(changed) and bool(named)
    pick = max(named if exact else entries, key=lambda e: str(e.get("time") or ""))
    return Change(
        str(pick.get("manager") or ""),
        str(pick.get("operation") or ""),
        str(pick.get("time") or ""),
        str(pick.get("subresource") or ""),
        exact,
    )


# ------------------------------------------------------------------ the record


@dataclass
class FieldRecord:
    path: str
    value: Any
    clusters: dict[str, Any] = field(default_factory=dict)  # where a member's value differs

    def expected(self, cluster: str) -> Any:
        return self.clusters[cluster] if cluster in self.clusters else self.value

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path, "value": self.value}
        if self.clusters:
            doc["clusters"] = dict(sorted(self.clusters.items()))
        return doc


@dataclass
class Expectation:
    ref: ResourceRef
    fields: list[FieldRecord]

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"resource": self.ref.resource, "namespace": self.ref.namespace}
        if self.ref.cluster:
            doc["cluster"] = self.ref.cluster
        if self.ref.scope:
            doc["scope"] = self.ref.scope
        doc["fields"] = [f.to_doc() for f in self.fields]
        return doc


def _bad_record(why: str) -> UsageError:
    return UsageError(
        f"The drift record in the deployment's state (its key {STATE_KEY!r}) cannot be read: {why}. "
        "Record the resources again with `coordinator drift record`, or fix the key with `coordinator state apply`."
    )


def read_expectations(data: Mapping[str, Any] | None, namespace: str) -> list[Expectation]:
    """The expectations a state document holds (none without the key); a malformed record
    is a UsageError naming what is wrong."""
    section = (data or {}).get(STATE_KEY)
    if section is None:
        return []
    if not isinstance(section, dict) or not isinstance(section.get("resources", []), list):
        raise _bad_record("it must be a mapping with a list under 'resources'")
    out: list[Expectation] = []
    for i, item in enumerate(section.get("resources") or []):
        if not isinstance(item, dict) or not isinstance(item.get("resource"), str):
            raise _bad_record(f"resource {i + 1} has no 'resource' text")
        try:
            ref = parse_resource(item["resource"], str(item.get("namespace") or namespace), item.get("cluster"))
            if item.get("scope") not in (None, NAMESPACED, CLUSTER):
                raise UsageError(f"'scope' must be {NAMESPACED} or {CLUSTER}")
            ref = replace(ref, scope=item.get("scope"))
            fields = []
            for f in item.get("fields") or []:
                clusters = f.get("clusters") or {}
                if not isinstance(clusters, dict):
                    raise UsageError("'clusters' must be a mapping")
                # the value is required: a field without one would match a field gone missing
                fields.append(FieldRecord(parse_field(str(f["path"])), f["value"], dict(clusters)))
        except (UsageError, KeyError, TypeError, AttributeError) as err:
            why = err.message if isinstance(err, UsageError) else f"missing or malformed {err}"
            raise _bad_record(f"resource {i + 1} ({item['resource']}): {why}") from None
        twice = next((j for j, e in enumerate(out) if e.ref.same(ref)), None)
        if twice is not None:
            # Counted twice, one resource would pass for two: its findings would make a
            # majority of members seen out of a minority.
            raise _bad_record(f"resource {i + 1} ({item['resource']}) repeats resource {twice + 1}")
        out.append(Expectation(ref, fields))
    return out


def record_document(data: Mapping[str, Any] | None, namespace: str, recorded: Iterable[Expectation]) -> dict[str, Any]:
    """The ``drift`` section after recording ``recorded``: each replaces the expectation of
    the same resource (same namespace and cluster); the others stay as they were."""
    new = list(recorded)
    kept = [e for e in read_expectations(data, namespace) if not any(e.ref.same(n.ref) for n in new)]
    return {"resources": [e.to_doc() for e in [*kept, *new]]}


def expectation_from(ref: ResourceRef, paths: Sequence[str], objects: Mapping[str, Mapping[str, Any]]) -> Expectation:
    """The expectation of ``ref`` from the objects read on each member (name → object):
    per field, the value most members hold, and the others per cluster."""
    fields = []
    for path in paths:
        values = {c: value_at(obj, path) for c, obj in sorted(objects.items())}
        counts: list[tuple[Any, int]] = []
        for v in values.values():
            for i, (seen, n) in enumerate(counts):
                if same_json(seen, v):
                    counts[i] = (seen, n + 1)
                    break
            else:
                counts.append((v, 1))
        common = max(counts, key=lambda vc: vc[1])[0] if counts else None
        fields.append(FieldRecord(path, common, {c: v for c, v in values.items() if not same_json(v, common)}))
    return Expectation(ref, fields)


# ------------------------------------------------------------------ findings


class Status(StrEnum):
    MATCH = "match"
    DRIFTED = "drifted"
    GONE = "gone"
    UNOBSERVABLE = "unobservable"


@dataclass
class FieldDrift:
    path: str
    recorded: Any
    actual: Any
    changed_by: Change | None

    def to_doc(self) -> dict[str, Any]:
        by = self.changed_by
        return {
            "path": self.path,
            "recorded": self.recorded,
            "actual": self.actual,
            "changed_by": None
            if by is None
            else {
                "manager": by.manager,
                "operation": by.operation,
                "subresource": by.subresource,
                "time": by.time or None,
                "exact": by.exact,
            },
        }


@dataclass
class Finding:
    cluster: str
    ref: ResourceRef
    status: Status
    detail: str = ""
    fields: list[FieldDrift] = field(default_factory=list)
    # The member answered with the object, but it could not be read or compared (nested
    # deeper than the client decodes): not seen, and nobody can vouch for the resource.
    unreadable: bool = False

    def to_doc(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "resource": self.ref.resource,
            "namespace": self.ref.namespace,
            "status": str(self.status),
            "detail": self.detail,
            "fields": [f.to_doc() for f in self.fields],
        }


def compare(cluster: str, exp: Expectation, obj: Mapping[str, Any]) -> Finding:
    """``match`` or ``drifted`` for an object read on ``cluster``."""
    drifts = []
    for f in exp.fields:
        recorded, actual = f.expected(cluster), value_at(obj, f.path)
        if not same_json(recorded, actual):
            drifts.append(FieldDrift(f.path, recorded, actual, last_change(obj, f.path, recorded)))
    if not drifts:
        return Finding(cluster, exp.ref, Status.MATCH)
    return Finding(cluster, exp.ref, Status.DRIFTED, fields=drifts)


def watched_on(exp: Expectation, members: Sequence[str]) -> list[str]:
    """The members ``exp`` is watched on."""
    return [exp.ref.cluster] if exp.ref.cluster else list(members)


@dataclass
class Verdict:
    """What the findings add up to: confirmed drift; or, for some resource, too few of its
    clusters observed to say it matches (``unsure`` names them)."""

    drifted: list[Finding]
    unobservable: list[Finding]
    unsure: list[str]

    @property
    def confirmed(self) -> bool:
        return bool(self.drifted)


def verdict(findings: Sequence[Finding], expectations: Sequence[Expectation], members: Sequence[str]) -> Verdict:
    """Confirmed drift wherever a cluster showed it; a resource whose clusters were observed
    on fewer than a majority of those it is watched on is one nobody can vouch for, and so
    is one that a member answered with an object that could not be read: whoever can edit
    the object could otherwise hide a hand change behind a majority that matches."""
    drifted = [f for f in findings if f.status in (Status.DRIFTED, Status.GONE)]
    unobservable = [f for f in findings if f.status is Status.UNOBSERVABLE]
    unsure = []
    for exp in expectations:
        on = watched_on(exp, members)
        mine = [f for f in findings if f.ref == exp.ref]
        seen = [f for f in mine if f.status is not Status.UNOBSERVABLE]
        if len(seen) < quorum_size(len(on)) or any(f.unreadable for f in mine):
            unsure.append(exp.ref.label)
    return Verdict(drifted, unobservable, unsure)
