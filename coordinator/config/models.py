"""Pydantic models: what a valid local config is, lock records, and the in-cluster state envelope.

The config's records themselves are plain (``coordinator.config.records``: a read-only command
does not import pydantic); the models here are the one definition of a valid config,
used when the plain read cannot vouch for a file and whenever the config is written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from coordinator.config.records import (
    DNS1123_LABEL,
    MAX_DEPLOYMENT_NAME,
    ClusterRecord,
    DeploymentRecord,
    LocalConfig,
    check_dns_label,
    utcnow,
)

__all__ = [
    "DNS1123_LABEL",
    "HISTORY_LIMIT",
    "MAX_DEPLOYMENT_NAME",
    "STATE_SCHEMA",
    "AuditEntry",
    "ClusterModel",
    "ClusterRecord",
    "ConfigModel",
    "DeploymentModel",
    "DeploymentRecord",
    "LocalConfig",
    "LockBook",
    "LockRecord",
    "RunClaim",
    "StateEnvelope",
    "check_dns_label",
    "config_of",
    "schema_of",
    "utcnow",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClusterModel(_Model):
    """What a valid :class:`~coordinator.config.records.ClusterRecord` is."""

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


class DeploymentModel(_Model):
    """What a valid :class:`~coordinator.config.records.DeploymentRecord` is."""

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


class ConfigModel(_Model):
    """What a valid local config file (:class:`~coordinator.config.records.LocalConfig`) is."""

    version: Literal[1] = 1
    clusters: dict[str, ClusterModel] = Field(default_factory=dict)
    deployments: dict[str, DeploymentModel] = Field(default_factory=dict)


_SCHEMAS: dict[type, type[_Model]] = {
    ClusterRecord: ClusterModel,
    DeploymentRecord: DeploymentModel,
    LocalConfig: ConfigModel,
}


def schema_of(record: ClusterRecord | DeploymentRecord | LocalConfig) -> _Model:
    """``record`` validated (pydantic.ValidationError if it is not valid)."""
    return _SCHEMAS[type(record)].model_validate(record.model_dump())


def config_of(model: ConfigModel) -> LocalConfig:
    """The plain records of a validated config."""
    return LocalConfig(
        version=model.version,
        clusters={k: ClusterRecord(**dict(v)) for k, v in model.clusters.items()},
        deployments={k: DeploymentRecord(**dict(v)) for k, v in model.deployments.items()},
    )


class RunClaim(_Model):
    """A ``lock run`` of this machine that holds the lock now (coordinator/local/owners.py).

    The process is named by its pid, its start time (clock ticks since boot, from
    ``/proc``; None where there is no ``/proc``) and the boot's id, so that a pid used
    again, or a reboot, never passes for it; its command's process group likewise, by
    the group's id (its leader's pid) and the leader's start time."""

    pid: int
    started: int | None = None
    boot: str = ""
    pgid: int | None = None
    group_started: int | None = None
    grace_s: float = 10.0  # the run's --grace: how long its group may take to stop
    made_record: bool = False  # the record exists for this run alone (a lock id it was given)


class LockRecord(_Model):
    """A lock this machine took, so that ``release``/``renew`` work without ``--lock-id``.

    ``runs``: the ``lock run`` processes holding it. While one of them, or its command's
    process group, is alive, the lock is theirs: no other command uses it through this
    record, and a release waits for the group (coordinator/ops/api.py)."""

    deployment: str
    lock_id: str
    fencing_token: int
    holder: str
    ttl_s: float
    acquired_at: datetime = Field(default_factory=utcnow)
    runs: list[RunClaim] = Field(default_factory=list)


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
    # (coordinator.engine.register.Stamp): one stamp never names two different documents.
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
