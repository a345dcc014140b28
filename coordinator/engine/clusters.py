"""The connected clusters of one process: one shared client each, identity proven once.

Every operation that talks to a cluster goes through :meth:`ClusterSet.check_identity`
before it writes anything, so a kubeconfig context silently repointed at another
cluster never receives locks or state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from coordinator.config.records import ClusterRecord, LocalConfig
from coordinator.engine.fanout import ClusterResult
from coordinator.errors import unknown_cluster
from coordinator.kube import client as kube
from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.kube.identity import read_identity
from coordinator.kube.transport import TransportFactory
from coordinator.rules.outcome import Outcome
from coordinator.text import printable

IDENTITY_MISMATCH = kube.IDENTITY_MISMATCH

_KIND_TO_OUTCOME = {
    kube.UNREACHABLE: Outcome.UNREACHABLE,
    kube.FORBIDDEN: Outcome.FORBIDDEN,
    kube.THROTTLED: Outcome.THROTTLED,
    kube.CONFLICT: Outcome.CONFLICT,
    kube.ALREADY_EXISTS: Outcome.CONFLICT,
    IDENTITY_MISMATCH: Outcome.IDENTITY_MISMATCH,
}


@dataclass(frozen=True)
class ReachThrough:
    """How the members are reached for a while instead of as recorded: another kubeconfig
    for every member connected through one, and another context for some of them (the
    kubectl plugin's --kubeconfig and --context MEMBER=CONTEXT). The identity check still
    applies, so a context that leads elsewhere is refused, never used."""

    kubeconfig: str | None = None
    contexts: Mapping[str, str] = field(default_factory=dict)

    def endpoint(self, rec: ClusterRecord) -> Endpoint:
        context = self.contexts.get(rec.name)
        if context is not None:
            return Endpoint(rec.name, context, self.kubeconfig or rec.kubeconfig)
        if rec.in_cluster:  # the pod's own credentials: no kubeconfig to replace
            return Endpoint(rec.name, rec.context, rec.kubeconfig, rec.in_cluster)
        return Endpoint(rec.name, rec.context, self.kubeconfig or rec.kubeconfig)


_REACH: ContextVar[ReachThrough | None] = ContextVar("coordinator_reach_through", default=None)


@contextmanager
def reaching_through(reach: ReachThrough) -> Iterator[None]:
    """Within the block (and the tasks started in it), clusters are reached per ``reach``."""
    token = _REACH.set(reach)
    try:
        yield
    finally:
        _REACH.reset(token)


def endpoint_of(rec: ClusterRecord) -> Endpoint:
    """Where a connected cluster is reached: as recorded, unless a ReachThrough is in force."""
    reach = _REACH.get()
    if reach is None:
        return Endpoint(rec.name, rec.context, rec.kubeconfig, rec.in_cluster)
    return reach.endpoint(rec)


def outcome_of(err: KubeError) -> Outcome:
    """The one place that maps a failed request onto the outcomes users see."""
    return _KIND_TO_OUTCOME.get(err.kind, Outcome.ERROR)


def failed(cluster: str, err: KubeError) -> ClusterResult[object]:
    return ClusterResult(cluster, outcome_of(err), detail=err.detail)


class ClusterSet:
    """Clients for the clusters in the local config, opened lazily and closed together.

    ``transport_factory`` gives the transport of each cluster's client from its endpoint
    (see coordinator/kube/transport.py); by default HTTPS with the kubeconfig's settings."""

    def __init__(
        self,
        config: LocalConfig,
        *,
        timeout: float = 5.0,
        transport_factory: TransportFactory | None = None,
        config_path: Path | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path  # where ``config`` was read from, for errors that name it
        self.timeout = timeout
        self.transport_factory = transport_factory
        if transport_factory is None:
            kube.preload()  # before any per-cluster deadline starts counting
        self._clients: dict[str, KubeClient] = {}
        self._verified: dict[str, anyio.Event] = {}
        self._verify_errors: dict[str, KubeError] = {}
        self._proven: dict[str, bool] = {}
        # Clusters that left a request unanswered until a fan-out gave up on them, in
        # this process (see fanout.fan_out's ``silent``): later fan-outs of the same
        # command still ask them, but do not linger for them once decided.
        self.silent: set[str] = set()

    def record(self, name: str) -> ClusterRecord:
        try:
            return self.config.clusters[name]
        except KeyError:
            raise unknown_cluster(name, self.config.clusters, self.config_path) from None

    def client(self, name: str) -> KubeClient:
        found = self._clients.get(name)
        if found is None:
            rec = self.record(name)
            endpoint = endpoint_of(rec)
            transport = None if self.transport_factory is None else self.transport_factory(endpoint)
            found = KubeClient(endpoint, timeout=self.timeout, transport=transport)
            self._clients[name] = found
        return found

    async def check_identity(self, name: str) -> None:
        """Raise KubeError (kind ``identity-mismatch``, or why it could not be read) unless
        the context still leads to the recorded cluster. One request per cluster and
        process; concurrent callers share it."""
        while True:
            if self._proven.get(name):
                return
            if name in self._verify_errors:
                raise self._verify_errors[name]
            pending = self._verified.get(name)
            if pending is None:
                break
            await pending.wait()
        event = self._verified[name] = anyio.Event()
        rec = self.record(name)
        try:
            found = await read_identity(self.client(name), rec.identity_source, rec.identity_namespace)
            if found != rec.identity:
                # What was found is read from the cluster (with a ConfigMap identity,
                # written by whoever may edit that ConfigMap): one line, escaped.
                shown = printable(found)[:100] if found else "missing"
                err = KubeError(
                    IDENTITY_MISMATCH,
                    f"context {self.client(name).endpoint.context!r} now leads to a cluster whose identity is "
                    f"{shown}, but {name!r} was connected as {rec.identity} "
                    f"({rec.identity_source})",
                )
                # A definite answer is remembered; a timeout may be retried later.
                self._verify_errors[name] = err
                raise err
            self._proven[name] = True
        finally:
            del self._verified[name]
            event.set()

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()
