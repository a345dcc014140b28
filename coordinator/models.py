"""Pydantic models: the local config, lock records, and the in-cluster state envelope."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Leases are named coordinator-lock-<deployment>; keep the whole name a valid label.
MAX_DEPLOYMENT_NAME = 63 - len("coordinator-state-")


def utcnow() -> datetime:
    return datetime.now(UTC)


def check_dns_label(value: str, *, what: str, max_len: int = 63) -> str:
    """Return ``value`` if it is a DNS-1123 label, else raise ValueError saying why."""
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > max_len:
        raise ValueError(f"{what} {value!r} is {len(value)} characters long; the limit is {max_len}")
    if not DNS1123_LABEL.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a valid DNS-1123 label: use lower-case letters, digits "
            "and '-', starting and ending with a letter or digit"
        )
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClusterRecord(_Model):
    """A connected cluster: how to reach it and which cluster it proved to be."""

    name: str
    context: str
    kubeconfig: str | None = None
    # Reached with a pod's ServiceAccount (this directory's token and ca.crt) instead of a
    # kubeconfig; ``context`` is then "in-cluster".
    in_cluster: str | None = None
    server: str = ""
    identity: str
    identity_source: Literal["kube-system-uid", "configmap-uuid"]
    identity_namespace: str | None = None
    connected_at: datetime = Field(default_factory=utcnow)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns_label(v, what="cluster name")


class DeploymentRecord(_Model):
    """A deployment: its namespace and the clusters it spans."""

    name: str
    namespace: str
    clusters: list[str]
    storage: Literal["configmap", "secret"] = "configmap"
    created_at: datetime = Field(default_factory=utcnow)
    # No lease may be taken for longer; a lease found deleted blocks for this long.
    max_ttl_s: float = Field(default=600.0, ge=1.0)
    # The configuration epoch of the member set, as stored on the members.
    epoch: int = Field(default=1, ge=1)
    # While a member change is in progress (a joint configuration): the new member set.
    joint: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns_label(v, what="deployment name", max_len=MAX_DEPLOYMENT_NAME)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return check_dns_label(v, what="namespace")

    @field_validator("clusters")
    @classmethod
    def _clusters(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("a deployment needs at least one cluster")
        if len(set(v)) != len(v):
            raise ValueError("a cluster is listed twice")
        return v

    @property
    def quorum(self) -> int:
        return len(self.clusters) // 2 + 1


class LocalConfig(_Model):
    """The whole local config file."""

    version: Literal[1] = 1
    clusters: dict[str, ClusterRecord] = Field(default_factory=dict)
    deployments: dict[str, DeploymentRecord] = Field(default_factory=dict)


class LockRecord(_Model):
    """A lock this machine took, so that ``release``/``renew`` work without ``--lock-id``."""

    deployment: str
    lock_id: str
    fencing_token: int
    holder: str
    ttl_s: float
    acquired_at: datetime = Field(default_factory=utcnow)


class LockBook(_Model):
    version: Literal[1] = 1
    locks: list[LockRecord] = Field(default_factory=list)


# ---------------------------------------------------------------- state envelope

# 2: every envelope names the write attempt that built it (``write_id``); replicas carry
# promises. A coordinator that knows only schema 1 would reuse versions, so it must
# refuse to write over schema 2 (it does: a newer schema is never overwritten).
STATE_SCHEMA = 2
HISTORY_LIMIT = 50


class AuditEntry(BaseModel):
    """One line of the bounded audit log kept inside the state envelope."""

    model_config = ConfigDict(extra="allow", defer_build=True)

    at: datetime
    who: str
    host: str
    command: str
    version: int
    token: int
    write_id: str | None = None  # absent in entries written before schema 2
    keys: list[str] = Field(default_factory=list)
    note: str | None = None


class StateEnvelope(BaseModel):
    """What one replica stores: the user's data plus what orders and audits it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)

    schema_: int = Field(STATE_SCHEMA, alias="schema")
    version: int = Field(ge=0)
    # The fencing token of the write that produced this envelope.
    token: int = Field(ge=0)
    # With token and version, the stamp of the write attempt that built this envelope
    # (coordinator.register.Stamp): one stamp never names two different documents.
    write_id: str = Field(pattern=r"^[0-9a-z][0-9a-z-]{0,63}$")
    checksum: str
    written_by: str
    written_at: datetime
    members: list[str]
    data: dict[str, Any]
    history: list[AuditEntry] = Field(default_factory=list)
    # Lets `deployment import` map members onto locally connected clusters by identity.
    member_ids: dict[str, str] = Field(default_factory=dict)
    namespace: str | None = None
    storage: str | None = None
    # The deployment the envelope was written for: a copy of another deployment's object
    # put under this one's name is not taken for this one's state. None in envelopes
    # written before it was recorded.
    deployment: str | None = None

    def order(self) -> tuple[int, int]:
        """(fencing token, version); the full order adds the write id (register.Stamp)."""
        return (self.token, self.version)
