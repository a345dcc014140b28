"""``Sandbox``: a handle on the sandbox in one directory, as tests and scripts hold it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from coordinator.errors import UsageError
from coordinator_sandbox import frontproxy
from coordinator_sandbox.adminclient import AdminClient
from coordinator_sandbox.credentials import admin_client, mint_kubeconfig, read_token
from coordinator_sandbox.operations import (
    chosen_backends,
    heal,
    kill,
    pause,
    resume,
    set_date_offset,
    start,
    status,
)
from coordinator_sandbox.records import (
    DownReport,
    Layout,
    SandboxRecord,
    SandboxStatus,
    UserKubeconfig,
    cluster_of,
    require_record,
)
from coordinator_sandbox.servers import processes_of
from coordinator_sandbox.shutdown import down


class Sandbox:
    """A handle on the sandbox in one directory; every call reads ``sandbox.json`` afresh.

    Cluster indices are 1-based, as in the context names ``sandbox-1`` … ``sandbox-N``.
    """

    def __init__(self, dir: Path | str | None = None) -> None:
        self._layout = Layout.of(dir)

    def __repr__(self) -> str:
        return f"Sandbox({str(self.dir)!r})"

    @property
    def dir(self) -> Path:
        return self._layout.root

    @property
    def record(self) -> SandboxRecord:
        """The state file's contents; :class:`UsageError` when there is no sandbox."""
        return require_record(self._layout)

    @property
    def exists(self) -> bool:
        return self._layout.state.exists()

    @property
    def n(self) -> int:
        return len(self.record.clusters)

    @property
    def kubeconfig(self) -> Path:
        return self._layout.kubeconfig

    @property
    def contexts(self) -> list[str]:
        """Cluster-admin contexts, ``sandbox-1`` … ``sandbox-N``."""
        return [c.name for c in self.record.clusters]

    @property
    def restricted_contexts(self) -> list[str]:
        """Contexts of a user with no rights on leases, and only get/create on
        ConfigMaps in :attr:`restricted_namespace`."""
        return [f"{c.name}-restricted" for c in self.record.clusters]

    @property
    def token_contexts(self) -> list[str]:
        """Cluster-admin contexts that authenticate with a bearer token (:attr:`token`)."""
        return [f"{c.name}-token" for c in self.record.clusters]

    @property
    def restricted_namespace(self) -> str:
        return self.record.restricted_namespace

    @property
    def token(self) -> str:
        """The bearer token of the ``-token`` contexts (to check it never leaks)."""
        return read_token(self._layout)

    @property
    def servers(self) -> list[str]:
        return [c.server for c in self.record.clusters]

    def context(self, index: int) -> str:
        return cluster_of(self.record, index).name

    def server(self, index: int) -> str:
        return cluster_of(self.record, index).server

    def pids(self) -> list[int]:
        """Pids of every recorded server process, running or not."""
        return [s.pid for c in self.record.clusters for s in processes_of(c)]

    def admin(self, index: int, *, timeout: float = 5.0) -> AdminClient:
        """A cluster-admin HTTP client for cluster ``index`` (standard library only)."""
        return admin_client(self._layout, cluster_of(self.record, index).apiserver_port, timeout)

    @property
    def apiservers(self) -> int:
        """kube-apiservers per cluster (more than one: behind a front proxy)."""
        return self.record.apiservers

    def backend_admin(self, index: int, apiserver: int, *, timeout: float = 5.0) -> AdminClient:
        """A cluster-admin client for one kube-apiserver of an HA cluster, past the proxy."""
        c = cluster_of(self.record, index)
        ((j, _server),) = chosen_backends(c, apiserver)
        port = c.backends[j - 1].port if c.ha else c.apiserver_port
        return admin_client(self._layout, port, timeout)

    def proxy_stats(self, index: int) -> dict[str, Any]:
        """What cluster ``index``'s front proxy counted: requests per kube-apiserver,
        stamps shifted (see :mod:`coordinator_sandbox.frontproxy`)."""
        c = cluster_of(self.record, index)
        if not c.ha:
            raise UsageError(f"Cluster {index} has one kube-apiserver and no front proxy.")
        return frontproxy.read_stats(c.apiserver_port, self._layout.pki / "ca.crt")

    def set_date_offset(self, offset: float, *, apiserver: int = 1, stamps: bool = True) -> None:
        set_date_offset(self.dir, offset, apiserver=apiserver, stamps=stamps)

    def status(self) -> SandboxStatus:
        return status(self.dir)

    def pause(self, index: int, *, apiserver: int | None = None) -> None:
        pause(self.dir, index, apiserver=apiserver)

    def resume(self, index: int, *, apiserver: int | None = None) -> None:
        resume(self.dir, index, apiserver=apiserver)

    def kill(self, index: int, *, apiserver: int | None = None) -> None:
        kill(self.dir, index, apiserver=apiserver)

    def start(self, index: int) -> None:
        start(self.dir, index)

    def heal(self) -> list[int]:
        return heal(self.dir)

    def down(self, *, grace: float = 10.0) -> DownReport:
        return down(self.dir, grace=grace)

    def mint_kubeconfig(
        self,
        user: str,
        groups: Sequence[str] = (),
        *,
        clusters: int | Iterable[int] | None = None,
        path: Path | str | None = None,
    ) -> UserKubeconfig:
        return mint_kubeconfig(self.dir, user, groups, clusters=clusters, path=path)
