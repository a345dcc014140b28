"""Cluster identity: the proof that a context still leads to the cluster it was connected as.

The identity is the UID of the ``kube-system`` namespace. Where RBAC forbids reading it,
the tool creates (once) a ConfigMap holding a random UUID in a namespace it can write,
and uses that instead.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from coordinator.kube.client import ErrorKind, KubeClient, KubeError
from coordinator.rules.resources import (
    IDENTITY_CONFIGMAP,
    configmaps_path,
    namespace_path,
    owned_metadata,
)

KUBE_SYSTEM_UID = "kube-system-uid"
CONFIGMAP_UUID = "configmap-uuid"
MAX_IDENTITY = 100


@dataclass(frozen=True)
class Identity:
    value: str
    source: str
    namespace: str | None = None

    def describe(self) -> str:
        return describe_identity(self.source, self.namespace)


def describe_identity(source: str, namespace: str | None) -> str:
    """What an identity of ``source`` is read from, in words (for records and fresh proofs)."""
    if source == KUBE_SYSTEM_UID:
        return "UID of the kube-system namespace"
    return f"UUID in ConfigMap {namespace}/{IDENTITY_CONFIGMAP}"


async def _read_uuid_configmap(client: KubeClient, namespace: str) -> str | None:
    try:
        resp = await client.request("GET", f"{configmaps_path(namespace)}/{IDENTITY_CONFIGMAP}")
    except KubeError as err:
        if err.kind == ErrorKind.NOT_FOUND:
            return None
        raise
    value = (resp.body.get("data") or {}).get("uuid")
    return str(value) if value else None


def _checked(value: str, namespace: str) -> str:
    """An identity found in a ConfigMap, which whoever may edit it wrote: it is recorded
    and printed, so it must be one line of plain text (a UUID is)."""
    if len(value) > MAX_IDENTITY or not value.isprintable() or value != value.strip():
        raise KubeError(
            ErrorKind.ERROR,
            f"the identity ConfigMap {namespace}/{IDENTITY_CONFIGMAP} holds a uuid that is no identity "
            f"(not one line of at most {MAX_IDENTITY} printable characters); ask whoever edited it",
        )
    return value


async def discover_identity(client: KubeClient, fallback_namespace: str) -> Identity:
    """Find the identity of the cluster behind ``client`` (used by ``cluster connect``)."""
    try:
        resp = await client.request("GET", namespace_path("kube-system"))
        uid = (resp.body.get("metadata") or {}).get("uid")
        if uid:
            return Identity(str(uid), KUBE_SYSTEM_UID)
    except KubeError as err:
        if err.kind not in (ErrorKind.FORBIDDEN, ErrorKind.NOT_FOUND):
            raise
    existing = await _read_uuid_configmap(client, fallback_namespace)
    if existing:
        return Identity(_checked(existing, fallback_namespace), CONFIGMAP_UUID, fallback_namespace)
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owned_metadata(IDENTITY_CONFIGMAP),
        "data": {"uuid": str(uuid.uuid4())},
    }
    try:
        await client.request("POST", configmaps_path(fallback_namespace), body=body)
    except KubeError as err:
        if err.kind != ErrorKind.ALREADY_EXISTS:
            raise
    # Read back: whoever created it first, this is the value everyone uses.
    value = await _read_uuid_configmap(client, fallback_namespace)
    if not value:
        raise KubeError(ErrorKind.ERROR, "identity ConfigMap vanished right after it was created")
    return Identity(_checked(value, fallback_namespace), CONFIGMAP_UUID, fallback_namespace)


async def read_identity(client: KubeClient, source: str, namespace: str | None) -> str | None:
    """Read the identity the same way it was recorded; ``None`` if it is no longer there."""
    if source == KUBE_SYSTEM_UID:
        resp = await client.request("GET", namespace_path("kube-system"))
        uid = (resp.body.get("metadata") or {}).get("uid")
        return str(uid) if uid else None
    return await _read_uuid_configmap(client, namespace or "default")
