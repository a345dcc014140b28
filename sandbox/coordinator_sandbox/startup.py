"""``sandbox up``: certificates, then every cluster's etcd, then its kube-apiserver(s).

Servers of one kind start on every cluster at once and are then waited for together: a
server that lost its port to another process (between the pick and its bind) is started
again on a fresh port, a few times; any other early exit is reported with its log.
``DIR/sandbox.json`` is written before anything is waited on, so that whatever was
started can be found and stopped.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from coordinator.errors import UsageError
from coordinator_sandbox import process
from coordinator_sandbox.binaries import ETCD_VERSION, KUBE_VERSION, Binaries, find_binaries
from coordinator_sandbox.credentials import (
    RESTRICTED_NAMESPACE,
    grant_restricted,
    make_front_proxy_pki,
    make_pki,
    write_kubeconfig,
)
from coordinator_sandbox.handle import Sandbox
from coordinator_sandbox.records import (
    BackendRecord,
    ClusterRecord,
    Layout,
    SandboxRecord,
    ServerProcess,
    locked,
    save_record,
)
from coordinator_sandbox.servers import (
    Kind,
    Progress,
    SandboxError,
    apiserver_ready,
    etcd_healthy,
    port_clash,
    spawn,
    spawn_backend,
    spawn_proxy,
    tail,
)
from coordinator_sandbox.shutdown import clear_leftovers, stop_all

MAX_CLUSTERS = 15
MAX_APISERVERS = 3
_PORT_ATTEMPTS = 4
# Writes of Leases with what the server answered (holder, token, members as stored);
# writes of ConfigMaps (the state objects) by who and when only; nothing else.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  verbs: [create, update, patch, delete]
  resources:
  - group: coordination.k8s.io
    resources: [leases]
- level: Metadata
  verbs: [create, update, patch, delete]
  resources:
  - group: ""
    resources: [configmaps]
- level: None
"""


def _start_wave(
    kind: Kind,
    bins: Binaries,
    layout: Layout,
    record: SandboxRecord,
    deadline: float,
    progress: Progress,
) -> None:
    """Start ``kind`` on every cluster at once, then wait until all of them serve.

    A server that dies because its port was taken after we chose it is started again on
    fresh ports (up to a few times); any other early exit is reported with its log.
    """
    used = {p for c in record.clusters for p in (c.etcd_client_port, c.etcd_peer_port, c.apiserver_port)}
    for c in record.clusters:
        spawn(kind, bins, layout, c)
    save_record(layout, record)
    attempts = {c.index: 1 for c in record.clusters}
    pending = {c.index: c for c in record.clusters}
    why: dict[int, str] = {}
    while pending:
        for index, c in list(pending.items()):
            server = c.etcd if kind == "etcd" else c.apiserver
            assert server is not None
            if process.state(server.ref) == "gone":
                if port_clash(server.log) and attempts[index] < _PORT_ATTEMPTS:
                    attempts[index] += 1
                    if kind == "etcd":
                        c.etcd_client_port, c.etcd_peer_port = process.pick_ports(2, avoid=used)
                        used.update((c.etcd_client_port, c.etcd_peer_port))
                        shutil.rmtree(layout.cluster_dir(index) / "etcd", ignore_errors=True)
                    else:
                        (c.apiserver_port,) = process.pick_ports(1, avoid=used)
                        used.add(c.apiserver_port)
                    progress(f"cluster {index}: {kind} lost its port to another process; retrying")
                    spawn(kind, bins, layout, c)
                    save_record(layout, record)
                    continue
                raise SandboxError(
                    f"The {kind} of cluster {index} exited while starting. Its log is "
                    f"{server.log}; last lines:\n{tail(server.log)}"
                )
            if kind == "etcd":
                ok, why[index] = etcd_healthy(layout, c.etcd_client_port), "etcd /health is not ok yet"
            else:
                ok, why[index] = apiserver_ready(layout, c.apiserver_port)
            if ok:
                del pending[index]
                progress(f"cluster {index}: {kind} is ready")
        if not pending:
            break
        if time.monotonic() > deadline:
            details = "; ".join(
                f"cluster {i} ({why.get(i) or 'no answer'}; log {layout.log(i, kind)})" for i in sorted(pending)
            )
            raise SandboxError(
                f"Timed out waiting for {kind} to become ready on {len(pending)} "
                f"cluster(s): {details}. The machine may be too slow for this many "
                "clusters: try fewer, or a longer --timeout."
            )
        time.sleep(0.2)


def _start_ha(bins: Binaries, layout: Layout, record: SandboxRecord, deadline: float, progress: Progress) -> None:
    """Start every cluster's kube-apiservers, then its front proxy; wait until all serve.

    Like :func:`_start_wave`: a program that lost its port to another process is started
    again on a fresh port, a few times; any other early exit is reported with its log.
    """
    used = {p for c in record.clusters for p in (c.etcd_client_port, c.etcd_peer_port, c.apiserver_port)}
    used.update(b.port for c in record.clusters for b in c.backends)

    def wave(
        what: str,
        units: dict[tuple[int, int], Callable[[], None]],
        ready: Callable[[int, int], tuple[bool, str]],
        server_of: Callable[[int, int], ServerProcess | None],
        new_port: Callable[[int, int, int], None],
    ) -> None:
        for start_unit in units.values():
            start_unit()
        save_record(layout, record)
        attempts = dict.fromkeys(units, 1)
        pending = set(units)
        why: dict[tuple[int, int], str] = {}
        while pending:
            for key in sorted(pending):
                server = server_of(*key)
                assert server is not None
                if process.state(server.ref) == "gone":
                    if port_clash(server.log) and attempts[key] < _PORT_ATTEMPTS:
                        attempts[key] += 1
                        (port,) = process.pick_ports(1, avoid=used)
                        used.add(port)
                        new_port(*key, port)
                        progress(f"cluster {key[0]}: {what} lost its port to another process; retrying")
                        units[key]()
                        save_record(layout, record)
                        continue
                    raise SandboxError(
                        f"The {what} of cluster {key[0]} exited while starting. Its log is "
                        f"{server.log}; last lines:\n{tail(server.log)}"
                    )
                ok, why[key] = ready(*key)
                if ok:
                    pending.discard(key)
                    progress(f"cluster {key[0]}: {what}{f' {key[1]}' if key[1] else ''} is ready")
            if not pending:
                break
            if time.monotonic() > deadline:
                details = "; ".join(f"cluster {i} ({why.get((i, j)) or 'no answer'})" for i, j in sorted(pending))
                raise SandboxError(
                    f"Timed out waiting for the {what} of {len(pending)} cluster(s): {details}. The "
                    "machine may be too slow for this many servers: try fewer, or a longer --timeout."
                )
            time.sleep(0.2)

    by_index = {c.index: c for c in record.clusters}

    def backend_port(i: int, j: int, port: int) -> None:
        by_index[i].backends[j - 1].port = port

    def proxy_port(i: int, _j: int, port: int) -> None:
        by_index[i].apiserver_port = port

    # Each cluster's first kube-apiserver, then the others once it serves. Started at
    # once on one etcd, two of them race to create the kubernetes Service's IPAddress
    # object: the loser's IP repair controller stops, and under load its post-start
    # check then fails and the server exits ("unable to perform initial IP and Port
    # allocation check"). The first one has made it before the others start.
    for first in (True, False):
        backends: dict[tuple[int, int], Callable[[], None]] = {
            (c.index, j): (lambda c=c, j=j: spawn_backend(bins, layout, c, j))  # type: ignore[misc]
            for c in record.clusters
            for j in range(1, len(c.backends) + 1)
            if (j == 1) == first
        }
        wave(
            "kube-apiserver",
            backends,
            lambda i, j: apiserver_ready(layout, by_index[i].backends[j - 1].port),
            lambda i, j: by_index[i].backends[j - 1].process,
            backend_port,
        )
    proxies: dict[tuple[int, int], Callable[[], None]] = {
        (c.index, 0): (lambda c=c: spawn_proxy(layout, record, c))  # type: ignore[misc]
        for c in record.clusters
    }
    wave(
        "front proxy",
        proxies,
        lambda i, _j: apiserver_ready(layout, by_index[i].apiserver_port),
        lambda i, _j: by_index[i].proxy,
        proxy_port,
    )


def _default_timeout(n: int, apiservers: int = 1) -> float:
    # Measured on 2 cores: ~10 s per cluster when all start together; leave ample room.
    return 60.0 + 20.0 * n * apiservers


def up(
    n: int,
    dir: Path | str | None = None,
    *,
    timeout: float | None = None,
    bin_dir: Path | str | None = None,
    on_progress: Progress | None = None,
    apiservers: int = 1,
    date_offset: float = 0.0,
    skewed_apiserver: int = 1,
    audit: bool = False,
) -> Sandbox:
    """Start ``n`` independent clusters (etcd + kube-apiserver each) on 127.0.0.1.

    Returns once every ``/readyz`` is ok and the ``default`` and ``kube-system``
    namespaces exist on every cluster. The servers run in their own sessions and
    outlive the caller; stop them with :func:`down`. If start-up fails or is
    interrupted, whatever was started is stopped again and the logs are kept.

    ``apiservers`` > 1 makes every cluster highly available: that many kube-apiservers
    on its one etcd, behind a front proxy on the cluster's address that sends every
    request to one of them, picked at random. ``date_offset`` (seconds, may be
    negative) makes kube-apiserver ``skewed_apiserver`` of every cluster answer as if
    its clock were that far off (see :mod:`coordinator_sandbox.frontproxy` for what is
    shifted).

    ``audit`` makes every kube-apiserver log each write of a Lease (with the object it
    answered) or a ConfigMap (metadata only) to ``Layout.audit_log``: what the fault
    suite reads when a check fails.
    """
    if isinstance(apiservers, bool) or not isinstance(apiservers, int) or not 1 <= apiservers <= MAX_APISERVERS:
        raise UsageError(f"--apiservers must be a whole number from 1 to {MAX_APISERVERS}, not {apiservers!r}.")
    if date_offset and apiservers < 2:
        raise UsageError(
            "--date-offset needs --apiservers 2 or more: it shifts what one kube-apiserver of an HA "
            "cluster says, behind the front proxy, which a cluster with one kube-apiserver does not have."
        )
    if date_offset and not 1 <= skewed_apiserver <= apiservers:
        raise UsageError(f"The skewed kube-apiserver must be one of 1 to {apiservers}, not {skewed_apiserver}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"--clusters must be a whole number of at least 1, not {n!r}.")
    if n > MAX_CLUSTERS:
        raise UsageError(
            f"--clusters {n} is more than this sandbox supports ({MAX_CLUSTERS}); each "
            "cluster needs about 300 MiB of memory and a share of the CPU."
        )
    progress = on_progress or (lambda _msg: None)
    bins = find_binaries(bin_dir)
    layout = Layout.of(dir)
    budget = timeout if timeout is not None else _default_timeout(n, apiservers)
    with locked(layout, create=True):
        clear_leftovers(layout, progress)
        layout.audit_policy.unlink(missing_ok=True)
        if audit:
            layout.audit_policy.write_text(AUDIT_POLICY)
        started = time.monotonic()
        deadline = started + budget
        progress(f"creating certificates in {layout.pki}")
        make_pki(layout)
        ports = process.pick_ports(3 * n)
        record = SandboxRecord(
            dir=str(layout.root),
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            kube_version=KUBE_VERSION,
            etcd_version=ETCD_VERSION,
            bin_dir=str(bins.etcd.parent),
            kubeconfig=str(layout.kubeconfig),
            restricted_namespace=RESTRICTED_NAMESPACE,
            clusters=[
                ClusterRecord(
                    index=i,
                    name=f"sandbox-{i}",
                    etcd_client_port=ports[3 * (i - 1)],
                    etcd_peer_port=ports[3 * (i - 1) + 1],
                    apiserver_port=ports[3 * (i - 1) + 2],
                )
                for i in range(1, n + 1)
            ],
        )
        if apiservers > 1:
            make_front_proxy_pki(layout)
            record.apiservers = apiservers
            record.date_offset_s = float(date_offset)
            record.skewed_apiserver = skewed_apiserver if date_offset else 0
            extra = iter(process.pick_ports(apiservers * n, avoid=ports))
            for c in record.clusters:
                c.backends = [BackendRecord(port=next(extra)) for _ in range(apiservers)]
        try:
            progress(f"starting {n} etcd server(s)")
            _start_wave("etcd", bins, layout, record, deadline, progress)
            if apiservers > 1:
                progress(f"starting {apiservers * n} kube-apiserver(s) and {n} front prox(ies); this takes a while")
                _start_ha(bins, layout, record, deadline, progress)
            else:
                progress(f"starting {n} kube-apiserver(s); this takes a while")
                _start_wave("kube-apiserver", bins, layout, record, deadline, progress)
            for c in record.clusters:
                grant_restricted(layout, c)
            write_kubeconfig(layout, record)
            save_record(layout, record)
        except BaseException:
            # Interrupted or failed: leave no server behind, keep the logs to read.
            try:
                stop_all(layout, record, grace=5.0)
            finally:
                layout.state.unlink(missing_ok=True)
            raise
        progress(f"{n} cluster(s) ready in {time.monotonic() - started:.1f}s")
    return Sandbox(layout.root)
