"""What a sandbox is made of on disk, and what its commands report.

A sandbox is a directory. ``sandbox.json`` holds a :class:`SandboxRecord`: everything a
later command, in another process, needs to act on the sandbox (pids and start times,
ports, exact arguments). Layout::

    DIR/sandbox.json             what is running (written before waiting on anything)
    DIR/kubeconfig               contexts sandbox-I, sandbox-I-restricted, sandbox-I-token
    DIR/pki/                     CA, serving and client certificates, token file, SA keys;
                                 etcd's own CA certificate and the certificates of its TLS
    DIR/cluster-I/etcd/          etcd data of cluster I
    DIR/logs/cluster-I-*.log     output of etcd and kube-apiserver of cluster I
    DIR/cluster-I/proxy.json     HA clusters (--apiservers N): the front proxy's configuration
    DIR/users/                   kubeconfigs minted for RBAC tests

Every mutating command takes ``DIR/.sandbox.lock`` (:func:`locked`) so two commands
never interleave.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import platformdirs
from filelock import FileLock
from filelock import Timeout as LockTimeout
from pydantic import BaseModel, ValidationError

from coordinator.config.files import FILE_MODE, private_folder
from coordinator.errors import UsageError
from coordinator_sandbox.pki import write_private
from coordinator_sandbox.process import ProcessRef

STATE_FILE = "sandbox.json"


# --------------------------------------------------------------------------- records


class ServerProcess(BaseModel):
    """One running program of a cluster, as recorded in ``sandbox.json``."""

    pid: int
    start_ticks: int
    args: list[str]
    log: str

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_ticks)


class BackendRecord(BaseModel):
    """One of the kube-apiservers of an HA cluster, on a port of its own."""

    port: int
    process: ServerProcess | None = None


class ClusterRecord(BaseModel):
    index: int
    name: str
    etcd_client_port: int
    etcd_peer_port: int
    # The cluster's address: its kube-apiserver, or with several, the front proxy.
    apiserver_port: int
    etcd: ServerProcess | None = None
    apiserver: ServerProcess | None = None
    # HA clusters only (`sandbox up --apiservers N`, N > 1): the kube-apiservers behind
    # the front proxy, which listens on apiserver_port; ``apiserver`` stays None.
    backends: list[BackendRecord] = []
    proxy: ServerProcess | None = None

    @property
    def ha(self) -> bool:
        return bool(self.backends)

    def apiserver_processes(self) -> list[ServerProcess | None]:
        """Every kube-apiserver of the cluster (None: never started)."""
        if self.backends:
            return [b.process for b in self.backends]
        return [self.apiserver]

    def servers(self) -> list[ServerProcess | None]:
        """Every server the cluster runs: etcd, the front proxy of an HA cluster, and
        every kube-apiserver (None: never started)."""
        return [self.etcd, *([self.proxy] if self.ha else []), *self.apiserver_processes()]

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"


class SandboxRecord(BaseModel):
    format: int = 1
    dir: str
    created_at: str
    kube_version: str
    etcd_version: str
    bin_dir: str
    kubeconfig: str
    restricted_namespace: str
    clusters: list[ClusterRecord]
    # kube-apiservers per cluster; with more than one, a front proxy spreads requests
    # over them and one of them (``skewed_apiserver``, 1-based) may answer with times
    # shifted by ``date_offset_s`` (see sandbox/coordinator_sandbox/frontproxy.py).
    apiservers: int = 1
    skewed_apiserver: int = 0
    date_offset_s: float = 0.0
    shift_stamps: bool = True


# --------------------------------------------------------------------------- results


ComponentState = Literal["running", "paused", "gone", "missing"]


@dataclass(frozen=True)
class BackendStatus:
    """One kube-apiserver of an HA cluster, asked directly (not through the proxy)."""

    index: int
    port: int
    state: ComponentState
    pid: int | None
    ready: bool
    requests: int | None  # served through the front proxy since it started

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "port": self.port,
            "state": self.state,
            "pid": self.pid,
            "ready": self.ready,
            "requests": self.requests,
        }


@dataclass(frozen=True)
class ClusterStatus:
    """What ``status`` observed of one cluster."""

    index: int
    name: str
    context: str
    server: str
    apiserver: ComponentState
    etcd: ComponentState
    apiserver_pid: int | None
    etcd_pid: int | None
    ready: bool
    detail: str
    rss_bytes: int | None
    # HA clusters only: each kube-apiserver behind the front proxy, and the proxy.
    backends: tuple[BackendStatus, ...] = ()
    proxy: ComponentState | None = None
    proxy_pid: int | None = None

    @property
    def up(self) -> bool:
        proxy_ok = self.proxy in (None, "running")
        return self.ready and self.apiserver == "running" and self.etcd == "running" and proxy_ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "context": self.context,
            "server": self.server,
            "up": self.up,
            "ready": self.ready,
            "apiserver": self.apiserver,
            "apiserver_pid": self.apiserver_pid,
            "etcd": self.etcd,
            "etcd_pid": self.etcd_pid,
            "rss_bytes": self.rss_bytes,
            "detail": self.detail or None,
            **(
                {
                    "apiservers": [b.to_dict() for b in self.backends],
                    "proxy": self.proxy,
                    "proxy_pid": self.proxy_pid,
                }
                if self.backends
                else {}
            ),
        }


@dataclass(frozen=True)
class SandboxStatus:
    dir: Path
    kubeconfig: Path
    clusters: list[ClusterStatus]

    @property
    def all_up(self) -> bool:
        return all(c.up for c in self.clusters)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "kubeconfig": str(self.kubeconfig),
            "all_up": self.all_up,
            "clusters": [c.to_dict() for c in self.clusters],
        }


@dataclass(frozen=True)
class DownReport:
    """Which processes ``down`` stopped, and which needed SIGKILL."""

    dir: Path
    stopped: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)

    @property
    def was_running(self) -> bool:
        return bool(self.stopped)


@dataclass(frozen=True)
class UserKubeconfig:
    """A kubeconfig for an arbitrary user, minted by :func:`mint_kubeconfig`."""

    path: Path
    user: str
    groups: tuple[str, ...]
    clusters: tuple[int, ...]
    contexts: tuple[str, ...]

    def context(self, index: int) -> str:
        """The context of this user on cluster ``index`` (1-based)."""
        try:
            return self.contexts[self.clusters.index(index)]
        except ValueError:
            raise UsageError(
                f"{self.path} has no context for cluster {index}; it was minted for "
                f"clusters {', '.join(map(str, self.clusters))}."
            ) from None


# --------------------------------------------------------------------------- layout


def default_dir() -> Path:
    """``$COORDINATOR_SANDBOX_DIR``, else ``<user state dir>/coordinator/sandbox``."""
    override = os.environ.get("COORDINATOR_SANDBOX_DIR")
    if override:
        return Path(override)
    return Path(platformdirs.user_state_dir("coordinator")) / "sandbox"


@dataclass(frozen=True)
class Layout:
    root: Path

    @classmethod
    def of(cls, dir: Path | str | None) -> Layout:
        return cls(Path(dir if dir is not None else default_dir()).expanduser().resolve())

    @property
    def state(self) -> Path:
        return self.root / STATE_FILE

    @property
    def lock(self) -> Path:
        return self.root / ".sandbox.lock"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def users(self) -> Path:
        return self.root / "users"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def cluster_dir(self, index: int) -> Path:
        return self.root / f"cluster-{index}"

    def log(self, index: int, program: str) -> Path:
        return self.logs / f"cluster-{index}-{program}.log"

    def proxy_config(self, index: int) -> Path:
        return self.cluster_dir(index) / "proxy.json"

    @property
    def audit_policy(self) -> Path:
        """Present only in a sandbox started with ``up(audit=True)``: its kube-apiservers
        then log every write of a Lease or ConfigMap to :meth:`audit_log`."""
        return self.root / "audit-policy.yaml"

    def audit_log(self, index: int, server: str = "apiserver") -> Path:
        return self.logs / f"cluster-{index}-{server}-audit.log"

    def markers(self) -> tuple[str, ...]:
        # Substrings only this sandbox's servers carry in their arguments (flags are
        # always written --flag=value), precise enough not to match a nested sandbox.
        return (f"={self.root}{os.sep}pki{os.sep}", f"={self.root}{os.sep}cluster-")

    def owned_paths(self) -> list[Path]:
        """Everything ``up`` creates except the logs (kept for post-mortems)."""
        clusters = sorted(self.root.glob("cluster-*")) if self.root.is_dir() else []
        return [self.state, self.kubeconfig, self.pki, self.users, *clusters]


@contextmanager
def locked(layout: Layout, *, create: bool = False, timeout: float = 600.0) -> Iterator[None]:
    """Hold the sandbox's lock; only ``create`` makes a directory that does not exist."""
    if create:
        # Every folder it makes is 0700 whatever the umask, parents included: another
        # user who may write to a parent could put a sandbox of theirs in its place (a
        # record whose pids `sandbox down` kills, a kubeconfig the tests trust).
        private_folder(layout.root)
    elif not layout.root.is_dir():
        require_record(layout)  # raises: there is no sandbox there
    lock = FileLock(str(layout.lock), timeout=timeout, mode=FILE_MODE)
    try:
        with lock:
            yield
    except LockTimeout:
        raise UsageError(
            f"Another sandbox command has held {layout.lock} for {timeout:.0f}s; "
            "wait for it to finish, or remove the lock file if no such command runs."
        ) from None


def save_record(layout: Layout, record: SandboxRecord) -> None:
    write_private(layout.state, record.model_dump_json(indent=2).encode(), mode=0o644)


def load_record(layout: Layout) -> SandboxRecord | None:
    try:
        text = layout.state.read_text()
    except FileNotFoundError:
        return None
    try:
        return SandboxRecord.model_validate_json(text)
    except ValidationError as err:
        raise UsageError(
            f"{layout.state} is not a sandbox state file this version understands ({err}). "
            f"Stop whatever runs there with `coordinator sandbox down --dir {layout.root}`."
        ) from None


def require_record(layout: Layout) -> SandboxRecord:
    record = load_record(layout)
    if record is None:
        raise UsageError(
            f"There is no sandbox in {layout.root}. Start one with "
            f"`coordinator sandbox up --clusters 3 --dir {layout.root}`."
        )
    return record


def cluster_of(record: SandboxRecord, index: int) -> ClusterRecord:
    for cluster in record.clusters:
        if cluster.index == index:
            return cluster
    raise UsageError(
        f"The sandbox in {record.dir} has clusters 1 to {len(record.clusters)}; there is no cluster {index}."
    )
