"""The least Kubernetes RBAC a person, group or CI service account needs to use the tool.

Everything here is pure: functions build manifests as plain dicts, ready to be dumped as
YAML or JSON and applied with ``kubectl apply -f -`` on every member cluster.

What the tool touches, and so what is granted, by name wherever Kubernetes allows:

- per deployment, in its namespace (a ``Role`` and a ``RoleBinding`` each): the Lease
  ``coordinator-lock-<deployment>`` and the ConfigMap or Secret
  ``coordinator-state-<deployment>``, to get, list and watch (only with a
  ``fieldSelector`` on ``metadata.name``, which Kubernetes authorizes by name), update
  and delete; ``get``, ``update`` and ``delete`` on the ConfigMap
  ``coordinator-history-<deployment>`` (the lock's history); ``get`` on the ConfigMap
  ``coordinator-identity`` (the fallback cluster identity); and ``create`` on Leases
  and on ConfigMaps (and Secrets with Secret storage). Kubernetes authorizes a create
  before the object has a name, so a rule with ``resourceNames`` never matches one:
  ``create`` is granted for any name in the namespace, and says so in the printed
  YAML. It lets the subject make new objects of those kinds, never read, change or
  delete anyone else's.
- cluster-wide (a ``ClusterRole`` and a ``ClusterRoleBinding``): ``get`` on exactly two
  namespaces, ``kube-system`` (whose UID is the cluster identity) and the deployment's
  own, and ``create`` on SelfSubjectAccessReviews (``cluster info`` asks what it may do);
- optionally, ``create`` on namespaces, for ``deployment create`` to make the namespace.
  Kubernetes cannot narrow ``create`` by name, so this is a separate, opt-in pair;
- optionally (``--fleet``), ``list`` and ``watch`` on Leases in every namespace, for
  ``lock status`` without a deployment (``--watch`` lists once, then watches). Neither
  can be narrowed by name: opt-in too.

Object names are stable for a given input, so applying the output twice changes nothing,
and distinct subjects and deployments get distinct objects: granting a second user, or
a second deployment, never replaces the first (a binding's ``roleRef`` is immutable, and
its ``subjects`` list, like a Role's ``rules``, would be replaced). Names are
``:``-separated like Kubernetes' own ``system:`` roles, e.g. the binding
``coordinator:deployment:payments:configmap:group:release-engineers``; no part holds a
``:``, so two different inputs never produce the same name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from coordinator.config.records import DNS1123_LABEL, MAX_DEPLOYMENT_NAME, check_dns_label
from coordinator.errors import UsageError
from coordinator.rules.expectations import SHORT_KINDS, ResourceRef
from coordinator.rules.resources import (
    IDENTITY_CONFIGMAP,
    LABEL_MANAGED_BY,
    LABEL_VALUE,
    history_name,
    lease_name,
    state_name,
)

Storage = Literal["configmap", "secret"]
SubjectKind = Literal["User", "Group", "ServiceAccount"]
Manifest = dict[str, Any]

STORAGES: tuple[Storage, ...] = ("configmap", "secret")
RBAC_API_GROUP = "rbac.authorization.k8s.io"
RBAC_API_VERSION = f"{RBAC_API_GROUP}/v1"
# What the tool does to its own objects, by name: read (``list`` and ``watch`` only with a
# fieldSelector on metadata.name: `deployment import`, waiting for a release), compare-and-
# swap update, and delete (purge). Never patch, never deletecollection. ``create`` cannot
# be limited by name and is a rule of its own.
NAMED_VERBS: tuple[str, ...] = ("get", "list", "watch", "update", "delete")
CREATE_NOTE = (
    "create cannot be limited by name: Kubernetes authorizes a create before the object "
    "has a name, so a rule with resourceNames never matches one. This rule lets the "
    "subject create new {kinds} under any name in this namespace; it cannot read, "
    "change or delete any it does not name above."
)
NAMED_NOTE = (
    "Only the objects named here: get, list and watch (only with a fieldSelector on "
    "metadata.name, which Kubernetes authorizes by name), update and delete."
)
IDENTITY_NOTE = "The fallback cluster identity (used only where kube-system cannot be read): read by name."
# The lock's history (`lock history`): read, compare-and-swap update, delete (purge).
HISTORY_VERBS: tuple[str, ...] = ("get", "update", "delete")
HISTORY_NOTE = (
    "The lock's history (`lock history`), a ConfigMap of its own whatever the storage: "
    "get, update (compare-and-swap) and delete (purge), by name."
)
EVENTS_NOTE = (
    "The lock's life as Kubernetes Events about its Lease (`kubectl describe lease`, `kubectl "
    "get events`): create cannot be limited by name (each Event gets a generated name), and "
    "nothing here reads, changes or deletes an Event. Without this rule every command works "
    "the same; the Events are not written."
)
DRIFT_NOTE = (
    "Drift (`coordinator drift`, `drift record`): get on the watched objects, by name. For a kind "
    "that is not built in, the resource is the plural Kubernetes derives from the kind; check it "
    "with `kubectl api-resources`."
)
NAMESPACE_CREATOR_ROLE = "coordinator:create-namespaces"
LEASE_LISTER_ROLE = "coordinator:list-leases"
DRIFT_ROLE = "coordinator:drift-reads"

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SLUG_UNSAFE = re.compile(r"[^a-z0-9.-]+")


@dataclass(frozen=True)
class Subject:
    """Who is granted the rules: a user, a group, or a service account."""

    kind: SubjectKind
    name: str
    namespace: str | None = None  # service accounts only

    @classmethod
    def user(cls, name: str) -> Subject:
        """A user as the API server authenticates it (e.g. ``alice@example.com``)."""
        return cls("User", _check_principal(name, what="user name"))

    @classmethod
    def group(cls, name: str) -> Subject:
        """A group as the API server authenticates it (e.g. ``release-engineers``)."""
        return cls("Group", _check_principal(name, what="group name"))

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Subject:
        """The service account ``name`` in ``namespace`` (e.g. a CI runner's)."""
        validate_namespace(namespace, what="service account namespace")
        if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
            raise UsageError(
                f"Service account name {name!r} is not a valid Kubernetes object name: use "
                "lower-case letters, digits, '-' and '.', starting and ending with a letter or "
                "digit, at most 253 characters."
            )
        return cls("ServiceAccount", name, namespace)

    def to_manifest(self) -> dict[str, str]:
        """The subject as it appears in a binding's ``subjects`` list."""
        if self.kind == "ServiceAccount":
            assert self.namespace is not None
            return {"kind": "ServiceAccount", "name": self.name, "namespace": self.namespace}
        return {"kind": self.kind, "apiGroup": RBAC_API_GROUP, "name": self.name}

    def describe(self) -> str:
        """For people: ``Group coordinator-users``, ``ServiceAccount ci/deployer``."""
        if self.kind == "ServiceAccount":
            return f"ServiceAccount {self.namespace}/{self.name}"
        return f"{self.kind} {self.name}"


def parse_service_account(ref: str) -> Subject:
    """``NAMESPACE:NAME`` (the form of ``--service-account``) as a subject."""
    namespace, sep, name = ref.partition(":")
    if not sep or not namespace or not name:
        raise UsageError(
            f"Service account {ref!r} is not of the form NAMESPACE:NAME; for the service "
            "account 'deployer' in the namespace 'ci', pass --service-account ci:deployer."
        )
    return Subject.service_account(namespace, name)


def validate_namespace(namespace: str, *, what: str = "namespace") -> str:
    """Return ``namespace`` if Kubernetes accepts it as a namespace name, else UsageError."""
    if len(namespace) <= 63 and DNS1123_LABEL.fullmatch(namespace):
        return namespace
    if not namespace:
        why = "it is empty"
    elif len(namespace) > 63:
        why = f"it is {len(namespace)} characters long"
    elif namespace != namespace.lower():
        why = "it has upper-case letters"
    elif re.fullmatch(r"[-a-z0-9]+", namespace):
        why = "it starts or ends with '-'"
    else:
        why = "it has characters other than lower-case letters, digits and '-'"
    raise UsageError(
        f"Invalid {what} {namespace!r}: {why}. A Kubernetes namespace name is a DNS-1123 "
        "label: at most 63 lower-case letters, digits and '-', starting and ending with a "
        "letter or digit (for example 'payments-prod')."
    )


def validate_deployment(name: str) -> str:
    """Return ``name`` if it is a valid deployment name, else UsageError."""
    try:
        return check_dns_label(name, what="deployment name", max_len=MAX_DEPLOYMENT_NAME)
    except ValueError as err:
        raise UsageError(
            f"{str(err)[0].upper()}{str(err)[1:]}. Name each deployment with --deployment as it "
            "was (or will be) created."
        ) from None


def deployments_of(names: Sequence[str]) -> list[str]:
    """The deployment names, validated, each once, in the order given; at least one."""
    if not names:
        raise UsageError(
            "Name the deployment(s) to grant with --deployment NAME (repeatable): the rights are "
            "granted on each deployment's own lock and state objects by name, not on every "
            "object in the namespace."
        )
    return list(dict.fromkeys(validate_deployment(n) for n in names))


def role(namespace: str, deployment: str, *, storage: Storage = "configmap") -> Manifest:
    """The namespaced ``Role`` for one deployment: its Lease and its state object by name,
    the identity ConfigMap by name, and ``create`` (which cannot be limited by name)."""
    validate_namespace(namespace)
    validate_deployment(deployment)
    if storage not in STORAGES:
        raise UsageError(f"Unknown storage {storage!r}; choose one of: {', '.join(STORAGES)}.")
    state_resource = "configmaps" if storage == "configmap" else "secrets"
    rules = [
        _rule("coordination.k8s.io", "leases", NAMED_VERBS, resource_names=(lease_name(deployment),)),
        _rule("", state_resource, NAMED_VERBS, resource_names=(state_name(deployment),)),
        _rule("", "configmaps", ("get",), resource_names=(IDENTITY_CONFIGMAP,)),
        _rule("", "configmaps", HISTORY_VERBS, resource_names=(history_name(deployment),)),
        _rule("coordination.k8s.io", "leases", ("create",)),
        # The state object (ConfigMap or Secret), and the identity ConfigMap, made once.
        _rule("", ("configmaps",) if storage == "configmap" else ("configmaps", "secrets"), ("create",)),
        # Events about the Lease (coordinator/engine/lock/kubeevents.py): best effort, create only.
        _rule("events.k8s.io", "events", ("create",)),
    ]
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": _metadata(role_name(deployment, storage), namespace),
        "rules": rules,
    }


def role_binding(namespace: str, deployment: str, subject: Subject, *, storage: Storage = "configmap") -> Manifest:
    """Binds :func:`role` of ``deployment`` to ``subject`` in ``namespace``."""
    validate_namespace(namespace)
    return _binding("Role", role_name(validate_deployment(deployment), storage), subject, namespace)


def rule_note(rule: Manifest) -> str:
    """Why a rule of :func:`role` is there, for a comment above it in the printed YAML."""
    if rule.get("apiGroups") == ["events.k8s.io"]:
        return EVENTS_NOTE
    if rule.get("resourceNames") == [IDENTITY_CONFIGMAP]:
        return IDENTITY_NOTE
    if rule.get("verbs") == list(HISTORY_VERBS):
        return HISTORY_NOTE
    if rule.get("verbs") == ["get"] and rule.get("resourceNames"):
        return DRIFT_NOTE
    if rule.get("resourceNames"):
        return NAMED_NOTE
    kinds = {"leases": "Leases", "configmaps": "ConfigMaps", "secrets": "Secrets"}
    return CREATE_NOTE.format(kinds=" and ".join(kinds.get(r, r) for r in rule["resources"]))


def cluster_role(namespace: str) -> Manifest:
    """The ``ClusterRole``: ``get`` on kube-system and ``namespace`` only, and access reviews."""
    validate_namespace(namespace)
    namespaces = ["kube-system"] if namespace == "kube-system" else ["kube-system", namespace]
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRole",
        "metadata": _metadata(cluster_role_name(namespace)),
        "rules": [
            _rule("", "namespaces", ("get",), resource_names=namespaces),
            _rule("authorization.k8s.io", "selfsubjectaccessreviews", ("create",)),
        ],
    }


def cluster_role_binding(namespace: str, subject: Subject) -> Manifest:
    """Binds :func:`cluster_role` for ``namespace`` to ``subject``."""
    return _binding("ClusterRole", cluster_role_name(namespace), subject)


def namespace_creator_cluster_role() -> Manifest:
    """Optional ``ClusterRole`` letting ``deployment create`` create the namespace."""
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRole",
        "metadata": _metadata(NAMESPACE_CREATOR_ROLE),
        "rules": [_rule("", "namespaces", ("create",))],
    }


def namespace_creator_binding(subject: Subject) -> Manifest:
    """Binds :func:`namespace_creator_cluster_role` to ``subject``."""
    return _binding("ClusterRole", NAMESPACE_CREATOR_ROLE, subject)


def lease_lister_cluster_role() -> Manifest:
    """Optional ``ClusterRole`` letting ``lock status`` without a deployment (the fleet
    view) list Leases in every namespace: one LIST per cluster, by label, and with
    ``--watch`` one watch per cluster from there (without ``watch`` it would fall back to
    listing every Lease of the cluster again and again). Neither can be limited by name,
    so the subject sees every Lease of the cluster (holders of other applications'
    leader elections too), though it may change none."""
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRole",
        "metadata": _metadata(LEASE_LISTER_ROLE),
        "rules": [_rule("coordination.k8s.io", "leases", ("list", "watch"))],
    }


def lease_lister_binding(subject: Subject) -> Manifest:
    """Binds :func:`lease_lister_cluster_role` to ``subject``."""
    return _binding("ClusterRole", LEASE_LISTER_ROLE, subject)


# Built-in kinds whose resource name is not the plural derived from the kind.
IRREGULAR_PLURALS = {"Endpoints": "endpoints"}
# Built-in kinds that are cluster-scoped: a namespaced Role cannot grant them.
CLUSTER_SCOPED_KINDS = frozenset(
    {
        ("", "Namespace"),
        ("", "Node"),
        ("", "PersistentVolume"),
        ("storage.k8s.io", "StorageClass"),
        ("storage.k8s.io", "CSIDriver"),
        ("storage.k8s.io", "CSINode"),
        ("storage.k8s.io", "VolumeAttachment"),
        ("rbac.authorization.k8s.io", "ClusterRole"),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
        ("apiregistration.k8s.io", "APIService"),
        ("scheduling.k8s.io", "PriorityClass"),
        ("networking.k8s.io", "IngressClass"),
        ("node.k8s.io", "RuntimeClass"),
        ("certificates.k8s.io", "CertificateSigningRequest"),
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"),
        ("flowcontrol.apiserver.k8s.io", "FlowSchema"),
        ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
    }
)


def plural_of(kind: str) -> str:
    """The resource name RBAC rules use for ``kind``: the name the API server serves it
    under for built-in kinds, otherwise the plural Kubernetes derives from a kind by
    default (as CRDs mostly name themselves: Widget → widgets, Policy → policies)."""
    known = {k: name for name, (_, k) in SHORT_KINDS.items() if name.endswith("s") and name[:-1] in SHORT_KINDS}
    known.update(IRREGULAR_PLURALS)
    if kind in known:
        return known[kind]
    lower = kind.lower()
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "i", "o", "u"):
        return lower[:-1] + "ies"
    return lower + "s"


def _drift_rules(refs: Sequence[ResourceRef]) -> list[Manifest]:
    names: dict[tuple[str, str], set[str]] = {}
    for ref in refs:
        names.setdefault((ref.group, plural_of(ref.kind)), set()).add(ref.name)
    return [_rule(group, plural, ("get",), resource_names=sorted(n)) for (group, plural), n in sorted(names.items())]


def cluster_scoped(ref: ResourceRef) -> bool:
    return (ref.group, ref.kind) in CLUSTER_SCOPED_KINDS


def drift_cluster_role(refs: Sequence[ResourceRef]) -> Manifest | None:
    """The ``ClusterRole`` that lets a subject read the watched resources of built-in
    cluster-scoped kinds (a StorageClass, a CRD), by name; None when there are none."""
    scoped = [r for r in refs if cluster_scoped(r)]
    return _reads("ClusterRole", scoped) if scoped else None


def drift_role(namespace: str, refs: Sequence[ResourceRef]) -> Manifest:
    """The ``Role`` that lets a subject read the watched resources ``refs``: ``get`` by name,
    one rule per API group and resource. Its name carries a digest of the rules, so that
    granting another set of resources never takes these away from whoever has them."""
    validate_namespace(namespace)
    return _reads("Role", [r for r in refs if not cluster_scoped(r)], namespace)


def _reads(kind: str, refs: Sequence[ResourceRef], namespace: str | None = None) -> Manifest:
    """A drift Role or ClusterRole (``kind``) of :func:`_drift_rules`, named by their digest."""
    rules = _drift_rules(refs)
    digest = hashlib.sha256(repr(rules).encode()).hexdigest()[:10]
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": kind,
        "metadata": _metadata(f"{DRIFT_ROLE}:{digest}", namespace),
        "rules": rules,
    }


def drift_binding(role_manifest: Manifest, subject: Subject) -> Manifest:
    """Binds a drift Role or ClusterRole (:func:`drift_role`, :func:`drift_cluster_role`) to
    ``subject``."""
    meta = role_manifest["metadata"]
    return _binding(role_manifest["kind"], meta["name"], subject, meta.get("namespace"))


def _binding(role_kind: str, name: str, subject: Subject, namespace: str | None = None) -> Manifest:
    """A RoleBinding (or ClusterRoleBinding, for ``role_kind`` ClusterRole) of the role
    ``name`` to ``subject``, named after both."""
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": f"{role_kind}Binding",
        "metadata": _metadata(f"{name}:{_subject_part(subject)}", namespace),
        "roleRef": {"apiGroup": RBAC_API_GROUP, "kind": role_kind, "name": name},
        "subjects": [subject.to_manifest()],
    }


def manifests(
    namespace: str,
    subject: Subject,
    deployments: Sequence[str],
    *,
    storage: Storage = "configmap",
    create_namespace: bool = False,
    fleet: bool = False,
    drift: Sequence[ResourceRef] = (),
) -> list[Manifest]:
    """Every object ``subject`` needs to use ``deployments`` in ``namespace``, in apply order
    (with ``drift``: the right to read those watched resources).

    Roles come before the bindings that refer to them.
    """
    validate_namespace(namespace)
    names = deployments_of(deployments)
    objects = [role(namespace, d, storage=storage) for d in names]
    reads = drift_role(namespace, drift) if any(not cluster_scoped(r) for r in drift) else None
    cluster_reads = drift_cluster_role(drift)
    objects += [reads] if reads else []
    objects += [role_binding(namespace, d, subject, storage=storage) for d in names]
    objects += [drift_binding(reads, subject)] if reads else []
    objects += [cluster_role(namespace), cluster_role_binding(namespace, subject)]
    if cluster_reads:
        objects += [cluster_reads, drift_binding(cluster_reads, subject)]
    if create_namespace:
        objects += [namespace_creator_cluster_role(), namespace_creator_binding(subject)]
    if fleet:
        objects += [lease_lister_cluster_role(), lease_lister_binding(subject)]
    return objects


def role_name(deployment: str, storage: Storage) -> str:
    """Name of a deployment's Role, shared by every subject granted that deployment."""
    return f"coordinator:deployment:{deployment}:{storage}"


def cluster_role_name(namespace: str) -> str:
    """Name of the ClusterRole; one per namespace, because it names the namespace."""
    return f"coordinator:namespace:{namespace}"


def _rule(
    api_group: str,
    resources: str | tuple[str, ...],
    verbs: tuple[str, ...],
    *,
    resource_names: tuple[str, ...] | list[str] = (),
) -> Manifest:
    listed = [resources] if isinstance(resources, str) else list(resources)
    rule: Manifest = {"apiGroups": [api_group], "resources": listed}
    if resource_names:
        rule["resourceNames"] = list(resource_names)
    rule["verbs"] = list(verbs)
    return rule


def _metadata(name: str, namespace: str | None = None) -> Manifest:
    meta: Manifest = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {LABEL_MANAGED_BY: LABEL_VALUE}
    return meta


def _subject_part(subject: Subject) -> str:
    """The subject's share of a binding name: readable, name-safe, and without collisions."""
    if subject.kind == "ServiceAccount":
        # Both parts are already DNS names (no ':'), and read best as they are.
        return f"sa:{subject.namespace}:{subject.name}"
    slug = _SLUG_UNSAFE.sub("-", subject.name.lower()).strip("-.")
    if slug != subject.name or len(slug) > 63:
        # Lower-casing or replacing characters could make two subjects look alike:
        # a digest of the exact name keeps their bindings apart.
        digest = hashlib.sha256(subject.name.encode()).hexdigest()[:10]
        slug = f"{slug[:52].rstrip('-.')}-{digest}".lstrip("-")
    return f"{subject.kind.lower()}:{slug}"


def _check_principal(name: str, *, what: str) -> str:
    if not name or not name.strip():
        raise UsageError(f"The {what} must not be empty.")
    if not name.isprintable():
        raise UsageError(
            f"The {what} {name!r} contains control characters (such as a newline); pass the "
            "name exactly as the API server authenticates it."
        )
    return name
