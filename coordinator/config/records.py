"""The local config's records (clusters, deployments), as plain dataclasses.

Every command reads the local config at start-up, and most only read it: importing
pydantic costs more than the rest of a read-only command's own code. So the records are
plain, and :func:`from_document` reads a file's document into them without pydantic when
every value is of the one plain shape the config writer produces. Anything else (a
missing or unknown field, a value of another type, a name that is not a DNS label) is
not judged here: the caller validates it with the pydantic models of
``coordinator.config.models``, which stay the one definition of what is valid and word every
error. Writing the config validates with them too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import datetime
from typing import Any, Literal, Self, cast

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Leases are named coordinator-lock-<deployment>; keep the whole name a valid label.
MAX_DEPLOYMENT_NAME = 63 - len("coordinator-state-")


def utcnow() -> datetime:
    from coordinator import clock

    return clock.wall_now()


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


class _Record:
    """What callers used of the pydantic models these records were: a copy with changes,
    and the document (JSON mode: as the config file and ``-o json`` show it)."""

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Self:
        copy: Self = dataclasses.replace(cast(Any, self), **(update or {}))
        return copy

    def model_dump(self, *, mode: str = "python", by_alias: bool = False) -> dict[str, Any]:
        if mode == "python":
            return dataclasses.asdict(cast(Any, self))
        from coordinator.config.models import schema_of  # pydantic words the JSON form, as it always did

        return schema_of(cast(Any, self)).model_dump(mode=mode, by_alias=by_alias)


@dataclasses.dataclass(kw_only=True, eq=True)
class ClusterRecord(_Record):
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
    connected_at: datetime = dataclasses.field(default_factory=utcnow)


@dataclasses.dataclass(kw_only=True, eq=True)
class DeploymentRecord(_Record):
    """A deployment: its namespace and the clusters it spans."""

    name: str
    namespace: str
    clusters: list[str]
    storage: Literal["configmap", "secret"] = "configmap"
    created_at: datetime = dataclasses.field(default_factory=utcnow)
    # No lease may be taken for longer; a lease found deleted blocks for this long.
    max_ttl_s: float = 600.0
    # The configuration epoch of the member set, as stored on the members.
    epoch: int = 1
    # While a member change is in progress (a joint configuration): the new member set.
    joint: list[str] | None = None

    @property
    def quorum(self) -> int:
        return len(self.clusters) // 2 + 1


@dataclasses.dataclass(kw_only=True, eq=True)
class LocalConfig(_Record):
    """The whole local config file."""

    version: Literal[1] = 1
    clusters: dict[str, ClusterRecord] = dataclasses.field(default_factory=dict)
    deployments: dict[str, DeploymentRecord] = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------ the plain read

# The times the config writer produces (pydantic's JSON form); others go to pydantic.
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)")


class _CannotVouch(Exception):
    """A value this reader does not judge (pydantic will)."""


def _str(v: Any) -> str:
    if type(v) is not str:
        raise _CannotVouch
    return v


def _opt_str(v: Any) -> str | None:
    return None if v is None else _str(v)


def _label(v: Any, max_len: int = 63) -> str:
    s = _str(v)
    if not s or len(s) > max_len or not DNS1123_LABEL.fullmatch(s):
        raise _CannotVouch
    return s


def _str_list(v: Any) -> list[str]:
    if type(v) is not list:
        raise _CannotVouch
    return [_str(x) for x in v]


def _time(v: Any) -> datetime:
    if type(v) is datetime:
        return v
    if not _TIME.fullmatch(_str(v)):
        raise _CannotVouch
    try:
        return datetime.fromisoformat(v)
    except ValueError:
        raise _CannotVouch from None


def _fields(raw: Any, required: set[str], allowed: set[str]) -> dict[str, Any]:
    if type(raw) is not dict or not required <= raw.keys() <= allowed:
        raise _CannotVouch
    return raw


_CLUSTER_FIELDS = {f.name for f in dataclasses.fields(ClusterRecord)}
_DEPLOYMENT_FIELDS = {f.name for f in dataclasses.fields(DeploymentRecord)}


def _cluster(raw: Any) -> ClusterRecord:
    d = _fields(raw, {"name", "context", "identity", "identity_source"}, _CLUSTER_FIELDS)
    if d["identity_source"] not in ("kube-system-uid", "configmap-uuid"):
        raise _CannotVouch
    rec = ClusterRecord(
        name=_label(d["name"]),
        context=_str(d["context"]),
        kubeconfig=_opt_str(d.get("kubeconfig")),
        in_cluster=_opt_str(d.get("in_cluster")),
        server=_str(d.get("server", "")),
        identity=_str(d["identity"]),
        identity_source=d["identity_source"],
        identity_namespace=_opt_str(d.get("identity_namespace")),
    )
    if "connected_at" in d:
        rec.connected_at = _time(d["connected_at"])
    return rec


def _deployment(raw: Any) -> DeploymentRecord:
    d = _fields(raw, {"name", "namespace", "clusters"}, _DEPLOYMENT_FIELDS)
    clusters = _str_list(d["clusters"])
    if not clusters or len(set(clusters)) != len(clusters):
        raise _CannotVouch
    storage = d.get("storage", "configmap")
    if storage not in ("configmap", "secret"):
        raise _CannotVouch
    max_ttl = d.get("max_ttl_s", 600.0)
    if type(max_ttl) is int:
        max_ttl = float(max_ttl) if 1 <= max_ttl <= 2**53 else math.nan  # an int too large for a float too
    if type(max_ttl) is not float or not math.isfinite(max_ttl) or max_ttl < 1:
        raise _CannotVouch
    epoch = d.get("epoch", 1)
    if type(epoch) is not int or epoch < 1:
        raise _CannotVouch
    joint = d.get("joint")
    rec = DeploymentRecord(
        name=_label(d["name"], MAX_DEPLOYMENT_NAME),
        namespace=_label(d["namespace"]),
        clusters=clusters,
        storage=storage,
        max_ttl_s=max_ttl,
        epoch=epoch,
        joint=None if joint is None else _str_list(joint),
    )
    if "created_at" in d:
        rec.created_at = _time(d["created_at"])
    return rec


def _mapping(raw: Any, build: Any) -> dict[str, Any]:
    if type(raw) is not dict:
        raise _CannotVouch
    return {_str(k): build(v) for k, v in raw.items()}


def from_document(raw: dict[str, Any]) -> LocalConfig | None:
    """The config a file's document holds, or None if a value is not of the plain shape
    the config writer produces (then pydantic judges it: see the module docstring)."""
    try:
        d = _fields(raw, set(), {"version", "clusters", "deployments"})
        version = d.get("version", 1)
        if type(version) is not int or version != 1:
            raise _CannotVouch
        return LocalConfig(
            clusters=_mapping(d.get("clusters", {}), _cluster),
            deployments=_mapping(d.get("deployments", {}), _deployment),
        )
    except _CannotVouch:
        return None
