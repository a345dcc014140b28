"""The least Kubernetes RBAC a person, group or CI service account needs to use the tool.

Everything here is pure: functions build manifests as plain dicts, ready to be dumped as
YAML or JSON and applied with ``kubectl apply -f -`` on every member cluster.

What the tool touches, and so what is granted:

- in the deployment's namespace (a ``Role`` and a ``RoleBinding``): Leases (the lock) and
  ConfigMaps (the state, and the fallback cluster identity), or with Secret storage,
  Secrets for the state plus only ``get``/``create`` on ConfigMaps for the identity;
- cluster-wide (a ``ClusterRole`` and a ``ClusterRoleBinding``): ``get`` on exactly two
  namespaces, ``kube-system`` (whose UID is the cluster identity) and the deployment's
  own, and ``create`` on SelfSubjectAccessReviews (``cluster info`` asks what it may do);
- optionally, ``create`` on namespaces, for ``deployment create`` to make the namespace.
  Kubernetes cannot narrow ``create`` by name, so this is a separate, opt-in pair.

Object names are stable for a given input, so applying the output twice changes nothing,
and distinct subjects get distinct bindings: granting a second user never replaces the
first (a binding's ``roleRef`` is immutable, and its ``subjects`` list would be replaced).
Names are ``:``-separated like Kubernetes' own ``system:`` roles, e.g. the binding
``coordinator:configmap-storage:group:release-engineers``; no part holds a ``:``, so two
different inputs never produce the same name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

from coordinator.errors import UsageError
from coordinator.kube.resources import IDENTITY_CONFIGMAP, LABEL_MANAGED_BY, LABEL_VALUE
from coordinator.models import DNS1123_LABEL

Storage = Literal["configmap", "secret"]
SubjectKind = Literal["User", "Group", "ServiceAccount"]
Manifest = dict[str, Any]

STORAGES: tuple[Storage, ...] = ("configmap", "secret")
RBAC_API_GROUP = "rbac.authorization.k8s.io"
RBAC_API_VERSION = f"{RBAC_API_GROUP}/v1"
# What the tool does to its own objects: read, watch for releases, create, compare-and-swap
# update, and delete (purge). Never patch, never deletecollection.
OBJECT_VERBS: tuple[str, ...] = ("get", "list", "watch", "create", "update", "delete")
NAMESPACE_CREATOR_ROLE = "coordinator:create-namespaces"

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


def role(namespace: str, *, storage: Storage = "configmap") -> Manifest:
    """The namespaced ``Role``: Leases, plus the state's ConfigMaps or Secrets."""
    validate_namespace(namespace)
    rules = [_rule("coordination.k8s.io", "leases", OBJECT_VERBS)]
    if storage == "configmap":
        # The state and, when kube-system cannot be read, the identity ConfigMap.
        rules.append(_rule("", "configmaps", OBJECT_VERBS))
    elif storage == "secret":
        rules.append(_rule("", "secrets", OBJECT_VERBS))
        # Identity fallback only: read the one ConfigMap by name, create it once.
        # (Kubernetes cannot restrict ``create`` by resource name.)
        rules.append(_rule("", "configmaps", ("get",), resource_names=(IDENTITY_CONFIGMAP,)))
        rules.append(_rule("", "configmaps", ("create",)))
    else:
        raise UsageError(f"Unknown storage {storage!r}; choose one of: {', '.join(STORAGES)}.")
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": _metadata(role_name(storage), namespace),
        "rules": rules,
    }


def role_binding(namespace: str, subject: Subject, *, storage: Storage = "configmap") -> Manifest:
    """Binds :func:`role` to ``subject`` in ``namespace``."""
    validate_namespace(namespace)
    name = role_name(storage)
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": _metadata(f"{name}:{_subject_part(subject)}", namespace),
        "roleRef": {"apiGroup": RBAC_API_GROUP, "kind": "Role", "name": name},
        "subjects": [subject.to_manifest()],
    }


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
    name = cluster_role_name(namespace)
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRoleBinding",
        "metadata": _metadata(f"{name}:{_subject_part(subject)}"),
        "roleRef": {"apiGroup": RBAC_API_GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [subject.to_manifest()],
    }


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
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRoleBinding",
        "metadata": _metadata(f"{NAMESPACE_CREATOR_ROLE}:{_subject_part(subject)}"),
        "roleRef": {
            "apiGroup": RBAC_API_GROUP,
            "kind": "ClusterRole",
            "name": NAMESPACE_CREATOR_ROLE,
        },
        "subjects": [subject.to_manifest()],
    }


def manifests(
    namespace: str,
    subject: Subject,
    *,
    storage: Storage = "configmap",
    create_namespace: bool = False,
) -> list[Manifest]:
    """Every object ``subject`` needs to use deployments in ``namespace``, in apply order.

    Roles come before the bindings that refer to them.
    """
    objects = [
        role(namespace, storage=storage),
        role_binding(namespace, subject, storage=storage),
        cluster_role(namespace),
        cluster_role_binding(namespace, subject),
    ]
    if create_namespace:
        objects += [namespace_creator_cluster_role(), namespace_creator_binding(subject)]
    return objects


def role_name(storage: Storage) -> str:
    """Name of the namespaced Role; one per storage kind, shared by every subject."""
    return f"coordinator:{storage}-storage"


def cluster_role_name(namespace: str) -> str:
    """Name of the ClusterRole; one per namespace, because it names the namespace."""
    return f"coordinator:namespace:{namespace}"


def _rule(
    api_group: str,
    resource: str,
    verbs: tuple[str, ...],
    *,
    resource_names: tuple[str, ...] | list[str] = (),
) -> Manifest:
    rule: Manifest = {"apiGroups": [api_group], "resources": [resource]}
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
