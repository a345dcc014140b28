"""Paths and shapes of the Kubernetes objects the tool reads and writes."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

LABEL_MANAGED_BY = "coordinator.io/managed-by"
LABEL_VALUE = "coordinator"
LABEL_DEPLOYMENT = "coordinator.io/deployment"
ANNOTATION_PREFIX = "coordinator.io/"
FIELD_MANAGER = "coordinator"
# On a state object: the highest fencing token granted that it knows of (lock/floor.py).
A_TOKEN_FLOOR = ANNOTATION_PREFIX + "token-floor"
IDENTITY_CONFIGMAP = "coordinator-identity"


def lease_name(deployment: str) -> str:
    return f"coordinator-lock-{deployment}"


def state_name(deployment: str) -> str:
    return f"coordinator-state-{deployment}"


def history_name(deployment: str) -> str:
    """The ConfigMap of the lock's history (coordinator/engine/history.py)."""
    return f"coordinator-history-{deployment}"


def leases_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def lease_path(namespace: str, name: str) -> str:
    return f"{leases_path(namespace)}/{name}"


def configmaps_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps"


def secrets_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets"


def state_paths(namespace: str, deployment: str, storage: str) -> tuple[str, str]:
    """The collection and the path of a deployment's state object (a Secret with
    ``storage`` "secret", a ConfigMap otherwise)."""
    collection = secrets_path(namespace) if storage == "secret" else configmaps_path(namespace)
    return collection, f"{collection}/{state_name(deployment)}"


def namespace_path(name: str) -> str:
    return f"/api/v1/namespaces/{name}"


def owned_metadata(name: str, deployment: str | None = None) -> dict[str, Any]:
    labels = {LABEL_MANAGED_BY: LABEL_VALUE}
    if deployment:
        labels[LABEL_DEPLOYMENT] = deployment
    return {"name": name, "labels": labels}


def micro_time(when: datetime) -> str:
    """Kubernetes MicroTime text, e.g. 2026-11-30T08:00:00.123456Z."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time as an aware UTC datetime; None when it is absent or no time a
    datetime holds in UTC (``9999-12-31T23:59:59-14:00`` is one day too late)."""
    if not text or not isinstance(text, str):
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        return None


@lru_cache(maxsize=4096)
def _canonical(text: str) -> tuple[str, datetime] | None:
    value = parse_time(text)
    return None if value is None else (micro_time(value), value)


def canonical_time(text: str) -> tuple[str, datetime] | None:
    """``text`` as MicroTime text and as :func:`parse_time` reads it; None when it is no
    time. Remembered, for callers that sort the same times over and over (the lock
    history): of short texts only (no RFC 3339 time is longer), so that text from the
    clusters cannot make the cache large."""
    return _canonical(text) if len(text) <= 40 else _canonical.__wrapped__(text)


def last_write_time(obj: dict[str, Any]) -> datetime | None:
    """When the API server last changed ``obj``, by its own clock.

    The server stamps ``metadata.managedFields[].time`` itself on every write that
    changes a field, so this is server-side evidence, independent of client clocks.
    """
    meta = obj.get("metadata") or {}
    times = [parse_time(e.get("time")) for e in meta.get("managedFields") or [] if isinstance(e, dict)]
    stamps = [t for t in times if t is not None]
    if stamps:
        return max(stamps)
    return parse_time(meta.get("creationTimestamp"))
