"""Bring sandbox clusters up and down, and break them on purpose.

A sandbox is a directory. Everything a later command (in another process) needs is in
``DIR/sandbox.json``: pids, start times, ports and the exact argument lists. Layout::

    DIR/sandbox.json             what is running (written before waiting on anything)
    DIR/kubeconfig               contexts sandbox-I, sandbox-I-restricted, sandbox-I-token
    DIR/pki/                     CA, serving and client certificates, token file, SA keys;
                                 etcd's own CA certificate and the certificates of its TLS
    DIR/cluster-I/etcd/          etcd data of cluster I
    DIR/logs/cluster-I-*.log     output of etcd and kube-apiserver of cluster I
    DIR/cluster-I/proxy.json     HA clusters (--apiservers N): the front proxy's configuration
    DIR/users/                   kubeconfigs minted for RBAC tests

Every mutating command takes ``DIR/.sandbox.lock`` so two commands never interleave.
"""

from __future__ import annotations

import datetime as dt
import http.client
import os
import re
import secrets
import shutil
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from coordinator.errors import CoordinatorError, ExitCode, UsageError
from coordinator.sandbox import frontproxy, kubeconfig, pki, process
from coordinator.sandbox.adminclient import AdminClient, AdminRequestError
from coordinator.sandbox.binaries import ETCD_VERSION, KUBE_VERSION, Binaries, find_binaries
from coordinator.sandbox.process import ProcessRef
from coordinator.sandbox.records import (
    BackendRecord,
    BackendStatus,
    ClusterRecord,
    ClusterStatus,
    ComponentState,
    DownReport,
    Layout,
    SandboxRecord,
    SandboxStatus,
    ServerProcess,
    UserKubeconfig,
    cluster_of,
    load_record,
    locked,
    require_record,
    save_record,
)

Progress = Callable[[str], None]

RESTRICTED_USER = "sandbox-restricted"
RESTRICTED_NAMESPACE = "sandbox-restricted"
ADMIN_USER = "sandbox-admin"
TOKEN_USER = "sandbox-token-admin"
MAX_CLUSTERS = 15
MAX_APISERVERS = 3
_PORT_ATTEMPTS = 4


class SandboxError(CoordinatorError):
    """The sandbox could not be started, stopped or changed; the message says what to do."""

    exit_code = ExitCode.INTERNAL


def _component_state(server: ServerProcess | None) -> ComponentState:
    return "missing" if server is None else process.state(server.ref)


def _tail(path: Path | str, lines: int = 12) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 16384))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _admin(layout: Layout, port: int, timeout: float = 5.0) -> AdminClient:
    return AdminClient(
        port,
        ca_file=layout.pki / "ca.crt",
        cert_file=layout.pki / "admin.crt",
        key_file=layout.pki / "admin.key",
        timeout=timeout,
    )


# --------------------------------------------------------------------------- start-up


# etcd serves its clients and its peer port over TLS, and only to a client certificate of
# its own CA (the kube-apiserver's): on plain HTTP any local user could read every Secret
# and ConfigMap, or write leases, past RBAC.
ETCD_CA = "etcd-ca.crt"
ETCD_SERVER = ("etcd-server.crt", "etcd-server.key")
ETCD_CLIENT = ("etcd-client.crt", "etcd-client.key")


def _etcd_tls(layout: Layout) -> bool:
    """Does this sandbox's etcd speak TLS? (One made by an older version does not: its
    servers are restarted with the arguments they were first given.)"""
    return (layout.pki / ETCD_CA).is_file()


def _etcd_args(bins: Binaries, layout: Layout, c: ClusterRecord) -> list[str]:
    p = layout.pki
    client = f"https://127.0.0.1:{c.etcd_client_port}"
    peer = f"https://127.0.0.1:{c.etcd_peer_port}"
    cert, key = (p / name for name in ETCD_SERVER)
    return [
        str(bins.etcd),
        f"--name={c.name}",
        f"--data-dir={layout.cluster_dir(c.index) / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={c.name}={peer}",
        "--initial-cluster-state=new",
        f"--cert-file={cert}",
        f"--key-file={key}",
        "--client-cert-auth=true",
        f"--trusted-ca-file={p / ETCD_CA}",
        f"--peer-cert-file={cert}",
        f"--peer-key-file={key}",
        "--peer-client-cert-auth=true",
        f"--peer-trusted-ca-file={p / ETCD_CA}",
        # Throw-away data: skip fsync, which dominates latency on slow CI disks.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_args(
    bins: Binaries, layout: Layout, c: ClusterRecord, *, port: int | None = None, cert_dir: str = "apiserver"
) -> list[str]:
    p = layout.pki
    return [
        str(bins.kube_apiserver),
        f"--etcd-servers=https://127.0.0.1:{c.etcd_client_port}",
        f"--etcd-cafile={p / ETCD_CA}",
        f"--etcd-certfile={p / ETCD_CLIENT[0]}",
        f"--etcd-keyfile={p / ETCD_CLIENT[1]}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={c.apiserver_port if port is None else port}",
        f"--cert-dir={layout.cluster_dir(c.index) / cert_dir}",
        f"--tls-cert-file={p / 'serving.crt'}",
        f"--tls-private-key-file={p / 'serving.key'}",
        f"--client-ca-file={p / 'ca.crt'}",
        f"--token-auth-file={p / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={p / 'sa.pub'}",
        f"--service-account-signing-key-file={p / 'sa.key'}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        # No controller-manager runs, so no "default" service account would ever exist.
        "--disable-admission-plugins=ServiceAccount",
        # A single loopback apiserver per cluster: nothing to reconcile endpoints with.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    ]


def _make_pki(layout: Layout) -> str:
    """Create the CA, certificates, service-account keys and token file; return the token."""
    d = layout.pki
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca = pki.new_ca()
    ca.write(d / "ca.crt", d / "ca.key")
    pki.issue(
        ca,
        "kube-apiserver",
        dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        ip_addresses=("127.0.0.1", "10.0.0.1"),
        server=True,
    ).write(d / "serving.crt", d / "serving.key")
    pki.issue(ca, ADMIN_USER, organizations=("system:masters",)).write(d / "admin.crt", d / "admin.key")
    pki.issue(ca, RESTRICTED_USER).write(d / "restricted.crt", d / "restricted.key")
    etcd_ca = pki.new_ca("coordinator-sandbox-etcd-ca")
    pki.issue(
        etcd_ca, "etcd", dns_names=("localhost",), ip_addresses=("127.0.0.1",), server=True, client_too=True
    ).write(*(d / name for name in ETCD_SERVER))
    pki.issue(etcd_ca, "kube-apiserver-etcd-client").write(*(d / name for name in ETCD_CLIENT))
    # The CA's key is not kept: nothing is issued later, and no one may mint an etcd client.
    pki.write_private(d / ETCD_CA, etcd_ca.cert_pem, mode=0o644)
    sa_private, sa_public = pki.new_signing_key()
    pki.write_private(d / "sa.key", sa_private)
    pki.write_private(d / "sa.pub", sa_public, mode=0o644)
    token = secrets.token_urlsafe(32)
    pki.write_private(d / "tokens.csv", f'{token},{TOKEN_USER},{TOKEN_USER},"system:masters"\n'.encode())
    return token


def _read_token(layout: Layout) -> str:
    line = (layout.pki / "tokens.csv").read_text().splitlines()[0]
    return line.split(",", 1)[0]


def _write_kubeconfig(layout: Layout, record: SandboxRecord) -> None:
    d = layout.pki
    servers = [(c.name, c.server) for c in record.clusters]
    users = [
        kubeconfig.KubeUser(
            ADMIN_USER, cert_pem=(d / "admin.crt").read_bytes(), key_pem=(d / "admin.key").read_bytes()
        ),
        kubeconfig.KubeUser(
            RESTRICTED_USER,
            cert_pem=(d / "restricted.crt").read_bytes(),
            key_pem=(d / "restricted.key").read_bytes(),
        ),
        kubeconfig.KubeUser(TOKEN_USER, token=_read_token(layout)),
    ]
    contexts: list[kubeconfig.KubeContext] = []
    for c in record.clusters:
        contexts.append(kubeconfig.KubeContext(c.name, c.name, ADMIN_USER))
    for c in record.clusters:
        contexts.append(
            kubeconfig.KubeContext(f"{c.name}-restricted", c.name, RESTRICTED_USER, namespace=RESTRICTED_NAMESPACE)
        )
    for c in record.clusters:
        contexts.append(kubeconfig.KubeContext(f"{c.name}-token", c.name, TOKEN_USER))
    document = kubeconfig.render(
        servers=servers,
        ca_pem=(d / "ca.crt").read_bytes(),
        users=users,
        contexts=contexts,
        current=record.clusters[0].name,
    )
    kubeconfig.write(layout.kubeconfig, document)


def _etcd_healthy(layout: Layout, port: int) -> bool:
    conn: http.client.HTTPConnection
    if _etcd_tls(layout):
        p = layout.pki
        context = ssl.create_default_context(cafile=str(p / ETCD_CA))
        context.load_cert_chain(p / ETCD_CLIENT[0], p / ETCD_CLIENT[1])
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=1.0, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("GET", "/health")
        reply = conn.getresponse()
        return reply.status == 200 and b'"health":"true"' in reply.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _apiserver_ready(layout: Layout, port: int) -> tuple[bool, str]:
    admin = _admin(layout, port, timeout=2.0)
    ok, why = admin.ready(timeout=2.0)
    if not ok:
        return False, why
    try:
        for name in ("default", "kube-system"):
            if admin.get(f"/api/v1/namespaces/{name}") is None:
                return False, f"namespace {name} does not exist yet"
    except AdminRequestError as err:
        return False, str(err)
    return True, ""


def _port_clash(log: str) -> bool:
    return "address already in use" in _tail(log, 40)


Kind = Literal["etcd", "kube-apiserver"]


def _spawn(kind: Kind, bins: Binaries, layout: Layout, c: ClusterRecord, *, append: bool = False) -> None:
    log = layout.log(c.index, kind)
    if kind == "etcd":
        args = _etcd_args(bins, layout, c)
        ref = process.spawn(args, log, append=append)
        c.etcd = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))
    else:
        args = _apiserver_args(bins, layout, c)
        ref = process.spawn(args, log, append=append)
        c.apiserver = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))


def _respawn(kind: Kind, layout: Layout, c: ClusterRecord) -> None:
    """Start a program again with exactly the arguments it was first given."""
    server = c.etcd if kind == "etcd" else c.apiserver
    assert server is not None
    with open(server.log, "ab") as log:
        stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        log.write(f"\n----- restarted by coordinator sandbox at {stamp} -----\n".encode())
    ref = process.spawn(server.args, Path(server.log), append=True)
    fresh = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=server.args, log=server.log)
    if kind == "etcd":
        c.etcd = fresh
    else:
        c.apiserver = fresh


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
        _spawn(kind, bins, layout, c)
    save_record(layout, record)
    attempts = {c.index: 1 for c in record.clusters}
    pending = {c.index: c for c in record.clusters}
    why: dict[int, str] = {}
    while pending:
        for index, c in list(pending.items()):
            server = c.etcd if kind == "etcd" else c.apiserver
            assert server is not None
            if process.state(server.ref) == "gone":
                if _port_clash(server.log) and attempts[index] < _PORT_ATTEMPTS:
                    attempts[index] += 1
                    if kind == "etcd":
                        c.etcd_client_port, c.etcd_peer_port = process.pick_ports(2, avoid=used)
                        used.update((c.etcd_client_port, c.etcd_peer_port))
                        shutil.rmtree(layout.cluster_dir(index) / "etcd", ignore_errors=True)
                    else:
                        (c.apiserver_port,) = process.pick_ports(1, avoid=used)
                        used.add(c.apiserver_port)
                    progress(f"cluster {index}: {kind} lost its port to another process; retrying")
                    _spawn(kind, bins, layout, c)
                    save_record(layout, record)
                    continue
                raise SandboxError(
                    f"The {kind} of cluster {index} exited while starting. Its log is "
                    f"{server.log}; last lines:\n{_tail(server.log)}"
                )
            if kind == "etcd":
                ok, why[index] = _etcd_healthy(layout, c.etcd_client_port), "etcd /health is not ok yet"
            else:
                ok, why[index] = _apiserver_ready(layout, c.apiserver_port)
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


# --------------------------------------------------------------------------- HA clusters
#
# `up(..., apiservers=N)` with N > 1: per cluster N kube-apiservers on the one etcd, each
# on a port of its own, and the front proxy (coordinator/sandbox/frontproxy.py, a Python
# process) on the cluster's address, apiserver_port. The kubeconfig points at the proxy.


def _servers(c: ClusterRecord) -> list[ServerProcess]:
    """Every recorded process of a cluster: kube-apiserver(s), front proxy, etcd."""
    found = [s for s in c.apiserver_processes() if s is not None]
    if c.proxy is not None:
        found.append(c.proxy)
    if c.etcd is not None:
        found.append(c.etcd)
    return found


def _make_front_proxy_pki(layout: Layout) -> None:
    """A CA of its own for the proxy's client certificate: the servers take user names
    from headers only on connections with that certificate, and the sandbox CA never
    signs one a user could present."""
    d = layout.pki
    ca = pki.new_ca("coordinator-sandbox-front-proxy-ca")
    ca.write(d / "front-proxy-ca.crt", d / "front-proxy-ca.key")
    pki.issue(ca, frontproxy.FRONT_PROXY_USER).write(d / "front-proxy-client.crt", d / "front-proxy-client.key")


def _backend_args(bins: Binaries, layout: Layout, c: ClusterRecord, j: int) -> list[str]:
    p = layout.pki
    return [
        *_apiserver_args(bins, layout, c, port=c.backends[j - 1].port, cert_dir=f"apiserver-{j}"),
        f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
        f"--requestheader-allowed-names={frontproxy.FRONT_PROXY_USER}",
        f"--requestheader-username-headers={frontproxy.USER_HEADER}",
        f"--requestheader-group-headers={frontproxy.GROUP_HEADER}",
        f"--requestheader-extra-headers-prefix={frontproxy.EXTRA_PREFIX}",
    ]


def _proxy_args(layout: Layout, c: ClusterRecord) -> list[str]:
    # Not `-m coordinator.sandbox.frontproxy`: the package imports that module first.
    entry = "from coordinator.sandbox.frontproxy import main; raise SystemExit(main())"
    return [sys.executable, "-c", entry, f"--proxy-config={layout.proxy_config(c.index)}"]


def _proxy_markers(layout: Layout) -> tuple[str, ...]:
    return (f"--proxy-config={layout.root}{os.sep}cluster-",)


def _python_names() -> set[str]:
    return {os.path.basename(sys.executable), "python", "python3", f"python3.{sys.version_info.minor}"}


def _write_proxy_config(layout: Layout, record: SandboxRecord, c: ClusterRecord) -> None:
    d = layout.pki
    config = frontproxy.ProxyConfig(
        listen_port=c.apiserver_port,
        backends=[b.port for b in c.backends],
        ca_file=str(d / "ca.crt"),
        serving_cert=str(d / "serving.crt"),
        serving_key=str(d / "serving.key"),
        front_proxy_cert=str(d / "front-proxy-client.crt"),
        front_proxy_key=str(d / "front-proxy-client.key"),
        skewed=record.skewed_apiserver if record.date_offset_s else 0,
        offset_s=record.date_offset_s,
        shift_stamps=record.shift_stamps,
    )
    path = layout.proxy_config(c.index)
    path.parent.mkdir(parents=True, exist_ok=True)
    pki.write_private(path, config.to_json().encode())


def _spawn_backend(bins: Binaries, layout: Layout, c: ClusterRecord, j: int) -> None:
    args = _backend_args(bins, layout, c, j)
    log = layout.log(c.index, f"kube-apiserver-{j}")
    ref = process.spawn(args, log)
    c.backends[j - 1].process = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))


def _spawn_proxy(layout: Layout, record: SandboxRecord, c: ClusterRecord) -> None:
    _write_proxy_config(layout, record, c)
    args = _proxy_args(layout, c)
    log = layout.log(c.index, "proxy")
    ref = process.spawn(args, log)
    c.proxy = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))


def _respawn_server(server: ServerProcess) -> ServerProcess:
    """Start a program again with exactly the arguments it was first given."""
    with open(server.log, "ab") as log:
        stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        log.write(f"\n----- restarted by coordinator sandbox at {stamp} -----\n".encode())
    ref = process.spawn(server.args, Path(server.log), append=True)
    return ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=server.args, log=server.log)


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
                    if _port_clash(server.log) and attempts[key] < _PORT_ATTEMPTS:
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
                        f"{server.log}; last lines:\n{_tail(server.log)}"
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

    backends: dict[tuple[int, int], Callable[[], None]] = {
        (c.index, j): (lambda c=c, j=j: _spawn_backend(bins, layout, c, j))  # type: ignore[misc]
        for c in record.clusters
        for j in range(1, len(c.backends) + 1)
    }
    wave(
        "kube-apiserver",
        backends,
        lambda i, j: _apiserver_ready(layout, by_index[i].backends[j - 1].port),
        lambda i, j: by_index[i].backends[j - 1].process,
        backend_port,
    )
    proxies: dict[tuple[int, int], Callable[[], None]] = {
        (c.index, 0): (lambda c=c: _spawn_proxy(layout, record, c))  # type: ignore[misc]
        for c in record.clusters
    }
    wave(
        "front proxy",
        proxies,
        lambda i, _j: _apiserver_ready(layout, by_index[i].apiserver_port),
        lambda i, _j: by_index[i].proxy,
        proxy_port,
    )


def _ha_ready(layout: Layout, c: ClusterRecord) -> tuple[bool, str]:
    """Every kube-apiserver of an HA cluster ready on its own port, and through the proxy."""
    for j, b in enumerate(c.backends, 1):
        ok, why = _apiserver_ready(layout, b.port)
        if not ok:
            return False, f"kube-apiserver {j}: {why}"
    ok, why = _apiserver_ready(layout, c.apiserver_port)
    return ok, ("" if ok else f"front proxy: {why}")


def _chosen_backends(c: ClusterRecord, apiserver: int | None) -> list[tuple[int, ServerProcess | None]]:
    """(1-based number, process) of the kube-apiservers an operation acts on."""
    everyone = list(enumerate(c.apiserver_processes(), 1))
    if apiserver is None:
        return everyone
    if not c.ha:
        if apiserver != 1:
            raise UsageError(f"Cluster {c.index} has one kube-apiserver; there is no kube-apiserver {apiserver}.")
        return everyone
    if not 1 <= apiserver <= len(c.backends):
        raise UsageError(
            f"Cluster {c.index} has kube-apiservers 1 to {len(c.backends)}; there is no kube-apiserver {apiserver}."
        )
    return [everyone[apiserver - 1]]


def _overall(states: list[ComponentState]) -> ComponentState:
    for worst in ("missing", "gone", "paused"):
        if worst in states:
            return worst
    return "running"


def _grant_restricted(layout: Layout, c: ClusterRecord) -> None:
    """The restricted user may get/create ConfigMaps in its own namespace, nothing else."""
    admin = _admin(layout, c.apiserver_port, timeout=10.0)
    ns = RESTRICTED_NAMESPACE
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    name = "sandbox-restricted-configmaps"
    admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    admin.create(
        f"{rbac}/namespaces/{ns}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]}],
        },
    )
    admin.create(
        f"{rbac}/namespaces/{ns}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "subjects": [{"kind": "User", "name": RESTRICTED_USER, "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "Role", "name": name, "apiGroup": "rbac.authorization.k8s.io"},
        },
    )


def _all_refs(layout: Layout, record: SandboxRecord | None) -> tuple[list[ProcessRef], list[ProcessRef]]:
    """(kube-apiservers, etcds) of the sandbox that are still there, recorded or not."""
    apiservers: dict[int, ProcessRef] = {}
    etcds: dict[int, ProcessRef] = {}
    if record is not None:
        for c in record.clusters:
            # Front proxies (HA clusters) are stopped with the kube-apiservers, first.
            for server in [c.proxy, *c.apiserver_processes()]:
                if server is not None and process.state(server.ref) != "gone":
                    apiservers[server.pid] = server.ref
            if c.etcd is not None and process.state(c.etcd.ref) != "gone":
                etcds[c.etcd.pid] = c.etcd.ref
    for ref in process.find_by_markers(layout.markers(), ["kube-apiserver"]):
        apiservers.setdefault(ref.pid, ref)
    for ref in process.find_by_markers(_proxy_markers(layout), _python_names()):
        apiservers.setdefault(ref.pid, ref)
    for ref in process.find_by_markers(layout.markers(), ["etcd"]):
        etcds.setdefault(ref.pid, ref)
    return list(apiservers.values()), list(etcds.values())


def _stop(refs: Sequence[ProcessRef], grace: float) -> tuple[list[int], list[int]]:
    """SIGCONT + SIGTERM, then SIGKILL after ``grace``; return (stopped, needed SIGKILL)."""
    stopped = [ref.pid for ref in refs if process.state(ref) != "gone"]
    for ref in refs:
        # A paused process cannot act on SIGTERM until it runs again.
        process.send(ref, signal.SIGCONT)
        process.send(ref, signal.SIGTERM)
    left = process.wait_gone(refs, grace)
    for ref in left:
        process.send(ref, signal.SIGKILL)
    process.wait_gone(left, 10.0)
    return stopped, [ref.pid for ref in left]


def _stop_all(layout: Layout, record: SandboxRecord | None, grace: float) -> DownReport:
    apiservers, etcds = _all_refs(layout, record)
    # API servers first: they would only spin on errors while etcd went away under them.
    stopped_a, killed_a = _stop(apiservers, grace)
    stopped_e, killed_e = _stop(etcds, grace)
    process.reap_exited_children(("etcd", "kube-apiserver"))
    left_a, left_e = _all_refs(layout, record)
    if left_a or left_e:
        pids = ", ".join(str(ref.pid) for ref in [*left_a, *left_e])
        raise SandboxError(
            f"Some processes of the sandbox in {layout.root} are still there after SIGKILL "
            f"(pids {pids}). Check them with `ps -o pid,stat,cmd -p {pids.replace(' ', '')}`."
        )
    return DownReport(layout.root, stopped=stopped_a + stopped_e, killed=killed_a + killed_e)


def _remove_owned(layout: Layout) -> None:
    for path in layout.owned_paths():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _readable_record(layout: Layout) -> tuple[SandboxRecord | None, bool]:
    """(record, whether a state file exists but cannot be read)."""
    try:
        return load_record(layout), False
    except UsageError:
        return None, True


def _clear_leftovers(layout: Layout, progress: Progress) -> None:
    """Make DIR ready for a fresh sandbox, or explain why it is not."""
    record, unreadable = _readable_record(layout)
    apiservers, etcds = _all_refs(layout, None)
    recorded_alive = record is not None and any(
        process.state(s.ref) != "gone" for c in record.clusters for s in _servers(c)
    )
    if recorded_alive or (unreadable and (apiservers or etcds)):
        size = f"with {len(record.clusters)} cluster(s) " if record is not None else ""
        raise UsageError(
            f"A sandbox {size}is already running in {layout.root} (see `coordinator sandbox "
            f"status --dir {layout.root}`). Stop it first with `coordinator sandbox down --dir "
            f"{layout.root}`, or use another --dir."
        )
    if record is not None or unreadable or apiservers or etcds:
        # A crashed run: its servers died (or never got recorded); start from scratch.
        progress(
            f"found the remains of an earlier sandbox in {layout.root} "
            f"({len(apiservers) + len(etcds)} process(es) still running); cleaning up"
        )
        _stop_all(layout, None, grace=5.0)
    _remove_owned(layout)
    shutil.rmtree(layout.logs, ignore_errors=True)


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
    its clock were that far off (see :mod:`coordinator.sandbox.frontproxy` for what is
    shifted).
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
        _clear_leftovers(layout, progress)
        started = time.monotonic()
        deadline = started + budget
        progress(f"creating certificates in {layout.pki}")
        _make_pki(layout)
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
            _make_front_proxy_pki(layout)
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
                _grant_restricted(layout, c)
            _write_kubeconfig(layout, record)
            save_record(layout, record)
        except BaseException:
            # Interrupted or failed: leave no server behind, keep the logs to read.
            try:
                _stop_all(layout, record, grace=5.0)
            finally:
                layout.state.unlink(missing_ok=True)
            raise
        progress(f"{n} cluster(s) ready in {time.monotonic() - started:.1f}s")
    return Sandbox(layout.root)


# --------------------------------------------------------------------------- operations


def status(dir: Path | str | None = None) -> SandboxStatus:
    """Observe every cluster: process states, ``/readyz``, memory. Never changes anything."""
    layout = Layout.of(dir)
    record = require_record(layout)
    result: list[ClusterStatus] = []
    for c in record.clusters:
        if c.ha:
            result.append(_ha_status(layout, c))
            continue
        api_state = _component_state(c.apiserver)
        etcd_state = _component_state(c.etcd)
        ready, detail = False, ""
        if api_state == "running":
            ready, detail = _admin(layout, c.apiserver_port).ready(timeout=2.0)
        elif api_state == "paused":
            detail = "kube-apiserver is paused (SIGSTOP); `sandbox resume` continues it"
        else:
            detail = "kube-apiserver is not running; `sandbox start` starts it again"
        if etcd_state != "running" and not detail:
            detail = f"etcd is {etcd_state}"
        rss = 0
        for server in (c.apiserver, c.etcd):
            if server is not None and process.state(server.ref) != "gone":
                memory = process.memory_bytes(server.pid)
                rss += memory[0] if memory else 0
        result.append(
            ClusterStatus(
                index=c.index,
                name=c.name,
                context=c.name,
                server=c.server,
                apiserver=api_state,
                etcd=etcd_state,
                apiserver_pid=c.apiserver.pid if c.apiserver else None,
                etcd_pid=c.etcd.pid if c.etcd else None,
                ready=ready,
                detail=detail,
                rss_bytes=rss or None,
            )
        )
    return SandboxStatus(dir=layout.root, kubeconfig=Path(record.kubeconfig), clusters=result)


def _ha_status(layout: Layout, c: ClusterRecord) -> ClusterStatus:
    """One HA cluster: each kube-apiserver asked on its own port, the proxy, etcd."""
    proxy_state = _component_state(c.proxy)
    counts: list[int | None] = [None] * len(c.backends)
    if proxy_state == "running":
        try:
            stats = frontproxy.read_stats(c.apiserver_port, layout.pki / "ca.crt", timeout=2.0)
            counts = [int(b["requests"]) for b in stats["backends"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    backends: list[BackendStatus] = []
    problems: list[str] = []
    for j, b in enumerate(c.backends, 1):
        state = _component_state(b.process)
        ready = False
        if state == "running":
            ready, why = _admin(layout, b.port).ready(timeout=2.0)
            if not ready:
                problems.append(f"kube-apiserver {j}: {why}")
        elif state == "paused":
            problems.append(f"kube-apiserver {j} is paused (SIGSTOP); `sandbox resume` continues it")
        else:
            problems.append(f"kube-apiserver {j} is not running; `sandbox start` starts it again")
        backends.append(
            BackendStatus(
                index=j,
                port=b.port,
                state=state,
                pid=b.process.pid if b.process else None,
                ready=ready,
                requests=counts[j - 1] if j - 1 < len(counts) else None,
            )
        )
    ready = False
    if proxy_state == "running":
        ready, why = _admin(layout, c.apiserver_port).ready(timeout=2.0)
        if not ready:
            problems.append(f"through the front proxy: {why}")
    else:
        problems.append(f"the front proxy is {proxy_state}; `sandbox start` starts it again")
    etcd_state = _component_state(c.etcd)
    if etcd_state != "running":
        problems.append(f"etcd is {etcd_state}")
    ready = ready and all(b.ready for b in backends)
    rss = 0
    for server in _servers(c):
        if process.state(server.ref) != "gone":
            memory = process.memory_bytes(server.pid)
            rss += memory[0] if memory else 0
    return ClusterStatus(
        index=c.index,
        name=c.name,
        context=c.name,
        server=c.server,
        apiserver=_overall([b.state for b in backends]),
        etcd=etcd_state,
        apiserver_pid=backends[0].pid if backends else None,
        etcd_pid=c.etcd.pid if c.etcd else None,
        ready=ready,
        detail="; ".join(problems),
        rss_bytes=rss or None,
        backends=tuple(backends),
        proxy=proxy_state,
        proxy_pid=c.proxy.pid if c.proxy else None,
    )


def down(dir: Path | str | None = None, *, grace: float = 10.0) -> DownReport:
    """Stop every process of the sandbox and remove its files (logs are kept).

    SIGCONT (a paused server cannot die gracefully), SIGTERM, then SIGKILL after
    ``grace`` seconds. Afterwards checks that no process of the sandbox is left, and
    raises :class:`SandboxError` if one is. Stopping a sandbox that is not running is
    not an error.
    """
    layout = Layout.of(dir)
    if not layout.root.is_dir():
        return DownReport(layout.root)
    with locked(layout):
        # An unreadable state file is no excuse to leave servers running: they are
        # found by their arguments all the same.
        record, _ = _readable_record(layout)
        report = _stop_all(layout, record, grace)
        _remove_owned(layout)
    return report


def _wait_ready(layout: Layout, c: ClusterRecord, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        assert c.apiserver is not None
        if process.state(c.apiserver.ref) == "gone":
            hint = f" Port {c.apiserver_port} is taken by another process." if _port_clash(c.apiserver.log) else ""
            raise SandboxError(
                f"The kube-apiserver of cluster {c.index} exited while starting.{hint} "
                f"Its log is {c.apiserver.log}; last lines:\n{_tail(c.apiserver.log)}"
            )
        ok, why = _apiserver_ready(layout, c.apiserver_port)
        if ok:
            return
        time.sleep(0.2)
    raise SandboxError(
        f"The kube-apiserver of cluster {c.index} is not ready after {timeout:.0f}s "
        f"({why}). Its log is {c.apiserver.log if c.apiserver else '?'}."
    )


def _wait_ha(layout: Layout, c: ClusterRecord, chosen: Sequence[int], timeout: float) -> None:
    """Wait until kube-apiservers ``chosen`` of an HA cluster answer, and the proxy does."""
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        why = ""
        for j in chosen:
            server = c.backends[j - 1].process
            assert server is not None
            if process.state(server.ref) == "gone":
                raise SandboxError(
                    f"kube-apiserver {j} of cluster {c.index} exited while starting. Its log is "
                    f"{server.log}; last lines:\n{_tail(server.log)}"
                )
            ok, detail = _apiserver_ready(layout, c.backends[j - 1].port)
            if not ok:
                why = f"kube-apiserver {j}: {detail}"
                break
        if not why:
            ok, detail = _apiserver_ready(layout, c.apiserver_port)
            if ok:
                return
            why = f"front proxy: {detail}"
        time.sleep(0.2)
    raise SandboxError(f"Cluster {c.index} is not ready after {timeout:.0f}s ({why}).")


def _ha_signal(c: ClusterRecord, apiserver: int | None, sig: signal.Signals, verb: str) -> list[int]:
    """Send ``sig`` to the chosen kube-apiservers of an HA cluster; return their numbers."""
    chosen = _chosen_backends(c, apiserver)
    for j, api in chosen:
        if api is None or process.state(api.ref) == "gone":
            raise UsageError(
                f"kube-apiserver {j} of cluster {c.index} is not running, so it cannot be {verb}. "
                f"Start it with `coordinator sandbox start {c.index}`."
            )
    for _j, api in chosen:
        assert api is not None
        process.send(api.ref, sig)
    return [j for j, _api in chosen]


def pause(dir: Path | str | None, index: int, *, apiserver: int | None = None) -> None:
    """SIGSTOP cluster ``index``'s kube-apiserver: it accepts connections, never answers.

    On an HA cluster every kube-apiserver is paused, or only number ``apiserver``."""
    layout = Layout.of(dir)
    with locked(layout):
        c = cluster_of(require_record(layout), index)
        if c.ha:
            for j in _ha_signal(c, apiserver, signal.SIGSTOP, "paused"):
                api = c.backends[j - 1].process
                assert api is not None
                if not process.wait_paused(api.ref):
                    raise SandboxError(f"kube-apiserver {j} of cluster {index} (pid {api.pid}) did not stop.")
            return
        _chosen_backends(c, apiserver)
        api = c.apiserver
        if api is None or process.state(api.ref) == "gone":
            raise UsageError(
                f"The kube-apiserver of cluster {index} is not running, so it cannot be "
                f"paused. Start it with `coordinator sandbox start {index}`."
            )
        process.send(api.ref, signal.SIGSTOP)
        if not process.wait_paused(api.ref):
            raise SandboxError(f"The kube-apiserver of cluster {index} (pid {api.pid}) did not stop.")


def resume(dir: Path | str | None, index: int, *, timeout: float = 60.0, apiserver: int | None = None) -> None:
    """SIGCONT cluster ``index``'s kube-apiserver and wait until it answers again."""
    layout = Layout.of(dir)
    with locked(layout):
        c = cluster_of(require_record(layout), index)
        if c.ha:
            _wait_ha(layout, c, _ha_signal(c, apiserver, signal.SIGCONT, "resumed"), timeout)
            return
        _chosen_backends(c, apiserver)
        api = c.apiserver
        if api is None or process.state(api.ref) == "gone":
            raise UsageError(
                f"The kube-apiserver of cluster {index} is not running (it was killed, not "
                f"paused). Start it with `coordinator sandbox start {index}`."
            )
        process.send(api.ref, signal.SIGCONT)
        _wait_ready(layout, c, timeout)


def kill(dir: Path | str | None, index: int, *, apiserver: int | None = None) -> None:
    """SIGKILL cluster ``index``'s kube-apiserver (etcd keeps running). Idempotent.

    On an HA cluster every kube-apiserver is killed (the front proxy stays and refuses
    nothing: it answers 503), or only number ``apiserver``."""
    layout = Layout.of(dir)
    with locked(layout):
        c = cluster_of(require_record(layout), index)
        if c.ha:
            refs = [api.ref for _j, api in _chosen_backends(c, apiserver) if api is not None]
            for ref in refs:
                process.send(ref, signal.SIGKILL)
            left = process.wait_gone(refs, 10.0)
            if left:
                pids = ", ".join(str(ref.pid) for ref in left)
                raise SandboxError(f"kube-apiserver(s) of cluster {index} (pid {pids}) survived SIGKILL.")
            return
        _chosen_backends(c, apiserver)
        api = c.apiserver
        if api is None:
            return
        process.send(api.ref, signal.SIGKILL)
        if process.wait_gone([api.ref], 10.0):
            raise SandboxError(f"The kube-apiserver of cluster {index} (pid {api.pid}) survived SIGKILL.")


def start(dir: Path | str | None, index: int, *, timeout: float = 120.0) -> None:
    """Start cluster ``index`` again: whatever of it is not running, same ports and args.

    A paused kube-apiserver is resumed; a running one is left alone. Returns once the
    cluster is ready.
    """
    layout = Layout.of(dir)
    with locked(layout):
        record = require_record(layout)
        c = cluster_of(record, index)
        if c.ha:
            _start_ha_cluster(layout, record, c, timeout)
            return
        if c.etcd is None or c.apiserver is None:
            raise UsageError(
                f"Cluster {index} in {layout.root} was never fully started; recreate the "
                "sandbox with `coordinator sandbox down` and `coordinator sandbox up`."
            )
        if process.state(c.etcd.ref) == "gone":
            if not process.wait_port_free(c.etcd_client_port):
                raise SandboxError(
                    f"Cannot restart etcd of cluster {index}: port {c.etcd_client_port} is taken by another process."
                )
            _respawn("etcd", layout, c)
            save_record(layout, record)
            deadline = time.monotonic() + timeout
            while not _etcd_healthy(layout, c.etcd_client_port):
                if process.state(c.etcd.ref) == "gone" or time.monotonic() > deadline:
                    raise SandboxError(
                        f"etcd of cluster {index} did not come back. Its log is "
                        f"{c.etcd.log}; last lines:\n{_tail(c.etcd.log)}"
                    )
                time.sleep(0.2)
        api_state = process.state(c.apiserver.ref)
        if api_state == "paused":
            process.send(c.apiserver.ref, signal.SIGCONT)
        elif api_state == "gone":
            if not process.wait_port_free(c.apiserver_port):
                raise SandboxError(
                    f"Cannot restart the kube-apiserver of cluster {index}: its port "
                    f"{c.apiserver_port} is taken by another process, and the kubeconfig "
                    "points there. Free the port, or recreate the sandbox."
                )
            _respawn("kube-apiserver", layout, c)
            save_record(layout, record)
        _wait_ready(layout, c, timeout)


def _start_ha_cluster(layout: Layout, record: SandboxRecord, c: ClusterRecord, timeout: float) -> None:
    """:func:`start` for an HA cluster: etcd, every kube-apiserver, the front proxy."""
    index = c.index
    if c.etcd is None or c.proxy is None or any(b.process is None for b in c.backends):
        raise UsageError(
            f"Cluster {index} in {layout.root} was never fully started; recreate the "
            "sandbox with `coordinator sandbox down` and `coordinator sandbox up`."
        )
    deadline = time.monotonic() + timeout
    if process.state(c.etcd.ref) == "gone":
        if not process.wait_port_free(c.etcd_client_port):
            raise SandboxError(
                f"Cannot restart etcd of cluster {index}: port {c.etcd_client_port} is taken by another process."
            )
        c.etcd = _respawn_server(c.etcd)
        save_record(layout, record)
        while not _etcd_healthy(layout, c.etcd_client_port):
            if process.state(c.etcd.ref) == "gone" or time.monotonic() > deadline:
                raise SandboxError(
                    f"etcd of cluster {index} did not come back. Its log is {c.etcd.log}; "
                    f"last lines:\n{_tail(c.etcd.log)}"
                )
            time.sleep(0.2)
    for j, b in enumerate(c.backends, 1):
        assert b.process is not None
        api_state = process.state(b.process.ref)
        if api_state == "paused":
            process.send(b.process.ref, signal.SIGCONT)
        elif api_state == "gone":
            if not process.wait_port_free(b.port):
                raise SandboxError(
                    f"Cannot restart kube-apiserver {j} of cluster {index}: its port {b.port} is taken by "
                    "another process. Free the port, or recreate the sandbox."
                )
            b.process = _respawn_server(b.process)
            save_record(layout, record)
    if process.state(c.proxy.ref) == "gone":
        if not process.wait_port_free(c.apiserver_port):
            raise SandboxError(
                f"Cannot restart the front proxy of cluster {index}: its port {c.apiserver_port} is taken by "
                "another process, and the kubeconfig points there. Free the port, or recreate the sandbox."
            )
        _write_proxy_config(layout, record, c)
        c.proxy = _respawn_server(c.proxy)
        save_record(layout, record)
    _wait_ha(layout, c, range(1, len(c.backends) + 1), max(1.0, deadline - time.monotonic()))


def set_date_offset(dir: Path | str | None, offset: float, *, apiserver: int = 1, stamps: bool = True) -> None:
    """Make kube-apiserver ``apiserver`` of every cluster answer ``offset`` seconds off
    from now on (0 for none); stamps it wrote before keep the shift they had.
    ``stamps=False`` shifts its ``Date`` header only, not the times it writes."""
    layout = Layout.of(dir)
    with locked(layout):
        record = require_record(layout)
        if record.apiservers < 2:
            raise UsageError(
                f"The sandbox in {layout.root} has one kube-apiserver per cluster; a date offset needs "
                "`sandbox up --apiservers 2` or more."
            )
        if not 1 <= apiserver <= record.apiservers:
            raise UsageError(f"The skewed kube-apiserver must be one of 1 to {record.apiservers}, not {apiserver}.")
        record.date_offset_s = float(offset)
        record.skewed_apiserver = apiserver if offset else 0
        record.shift_stamps = stamps
        for c in record.clusters:
            _write_proxy_config(layout, record, c)
            if c.proxy is not None:
                process.send(c.proxy.ref, signal.SIGHUP)
        save_record(layout, record)


def heal(dir: Path | str | None = None, *, timeout: float = 120.0) -> list[int]:
    """Resume paused and restart killed servers; return the clusters that needed it."""
    layout = Layout.of(dir)
    record = require_record(layout)
    touched: list[int] = []
    for c in record.clusters:
        if c.ha:
            if {_component_state(s) for s in [c.etcd, c.proxy, *c.apiserver_processes()]} != {"running"}:
                touched.append(c.index)
                start(layout.root, c.index, timeout=timeout)
            continue
        states = {_component_state(c.etcd), _component_state(c.apiserver)}
        if states != {"running"}:
            touched.append(c.index)
            start(layout.root, c.index, timeout=timeout)
    return touched


_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def mint_kubeconfig(
    dir: Path | str | None,
    user: str,
    groups: Sequence[str] = (),
    *,
    clusters: int | Iterable[int] | None = None,
    path: Path | str | None = None,
) -> UserKubeconfig:
    """Write a kubeconfig for ``user`` (member of ``groups``) on the given clusters.

    The user authenticates with a client certificate signed by the sandbox CA, so it has
    exactly the rights RBAC grants that name and those groups (plus what every
    authenticated user gets). ``clusters`` is one index or several (default: all); there
    is one context per cluster, named ``USER@sandbox-I``, the first one current.
    """
    if not user.strip():
        raise UsageError("A kubeconfig can only be minted for a non-empty user name.")
    layout = Layout.of(dir)
    record = require_record(layout)
    if clusters is None:
        indices = tuple(c.index for c in record.clusters)
    elif isinstance(clusters, int):
        indices = (clusters,)
    else:
        indices = tuple(clusters)
    chosen = [cluster_of(record, i) for i in indices]
    if not chosen:
        raise UsageError("Name at least one cluster to mint a kubeconfig for.")
    ca = pki.KeyPair((layout.pki / "ca.crt").read_bytes(), (layout.pki / "ca.key").read_bytes())
    pair = pki.issue(ca, user, organizations=tuple(groups))
    safe = _SAFE_NAME.sub("-", user).strip("-") or "user"
    target = Path(path) if path is not None else layout.users / f"{safe}.kubeconfig"
    contexts = [kubeconfig.KubeContext(f"{safe}@{c.name}", c.name, safe) for c in chosen]
    document = kubeconfig.render(
        servers=[(c.name, c.server) for c in chosen],
        ca_pem=ca.cert_pem,
        users=[kubeconfig.KubeUser(safe, cert_pem=pair.cert_pem, key_pem=pair.key_pem)],
        contexts=contexts,
        current=contexts[0].name,
    )
    kubeconfig.write(target, document)
    return UserKubeconfig(
        path=target,
        user=user,
        groups=tuple(groups),
        clusters=indices,
        contexts=tuple(ctx.name for ctx in contexts),
    )


# --------------------------------------------------------------------------- handle


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
        return _read_token(self._layout)

    @property
    def servers(self) -> list[str]:
        return [c.server for c in self.record.clusters]

    def context(self, index: int) -> str:
        return cluster_of(self.record, index).name

    def server(self, index: int) -> str:
        return cluster_of(self.record, index).server

    def pids(self) -> list[int]:
        """Pids of every recorded server process, running or not."""
        return [s.pid for c in self.record.clusters for s in _servers(c)]

    def admin(self, index: int, *, timeout: float = 5.0) -> AdminClient:
        """A cluster-admin HTTP client for cluster ``index`` (standard library only)."""
        return _admin(self._layout, cluster_of(self.record, index).apiserver_port, timeout)

    @property
    def apiservers(self) -> int:
        """kube-apiservers per cluster (more than one: behind a front proxy)."""
        return self.record.apiservers

    def backend_admin(self, index: int, apiserver: int, *, timeout: float = 5.0) -> AdminClient:
        """A cluster-admin client for one kube-apiserver of an HA cluster, past the proxy."""
        c = cluster_of(self.record, index)
        ((j, _server),) = _chosen_backends(c, apiserver)
        port = c.backends[j - 1].port if c.ha else c.apiserver_port
        return _admin(self._layout, port, timeout)

    def proxy_stats(self, index: int) -> dict[str, Any]:
        """What cluster ``index``'s front proxy counted: requests per kube-apiserver,
        stamps shifted (see :mod:`coordinator.sandbox.frontproxy`)."""
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
