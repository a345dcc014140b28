"""The programs of one sandbox cluster: what they are started with, and whether they serve.

A cluster is one etcd and one kube-apiserver, or (HA, ``sandbox up --apiservers N``) N
kube-apiservers on the one etcd, each on a port of its own, behind the front proxy
(:mod:`coordinator_sandbox.frontproxy`, a Python process) on the cluster's address,
``apiserver_port``; the kubeconfig points at the proxy.

Each program is recorded with its exact arguments, so a later command (in another
process) starts it again just as it was first started.
"""

from __future__ import annotations

import datetime as dt
import http.client
import os
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from coordinator.errors import CoordinatorError, ExitCode
from coordinator_sandbox import frontproxy, pki, process
from coordinator_sandbox.adminclient import AdminRequestError
from coordinator_sandbox.binaries import Binaries
from coordinator_sandbox.credentials import ETCD_CA, ETCD_CLIENT, ETCD_SERVER, admin_client, etcd_tls
from coordinator_sandbox.records import (
    ClusterRecord,
    ComponentState,
    Layout,
    SandboxRecord,
    ServerProcess,
)

Progress = Callable[[str], None]
Kind = Literal["etcd", "kube-apiserver"]


class SandboxError(CoordinatorError):
    """The sandbox could not be started, stopped or changed; the message says what to do."""

    exit_code = ExitCode.INTERNAL


def component_state(server: ServerProcess | None) -> ComponentState:
    return "missing" if server is None else process.state(server.ref)


def overall(states: list[ComponentState]) -> ComponentState:
    """The worst of several programs' states."""
    for worst in ("missing", "gone", "paused"):
        if worst in states:
            return worst
    return "running"


def processes_of(c: ClusterRecord) -> list[ServerProcess]:
    """Every recorded process of a cluster: kube-apiserver(s), front proxy, etcd."""
    found = [s for s in c.apiserver_processes() if s is not None]
    if c.proxy is not None:
        found.append(c.proxy)
    if c.etcd is not None:
        found.append(c.etcd)
    return found


def tail(path: Path | str, lines: int = 12) -> str:
    """The last lines of a log, for an error message."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 16384))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def port_clash(log: str) -> bool:
    """Did the program whose log this is exit because its port was taken?"""
    return "address already in use" in tail(log, 40)


# --------------------------------------------------------------------------- arguments


def etcd_args(bins: Binaries, layout: Layout, c: ClusterRecord) -> list[str]:
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


def apiserver_args(
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
        *(
            [
                f"--audit-policy-file={layout.audit_policy}",
                f"--audit-log-path={layout.audit_log(c.index, cert_dir)}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
            ]
            if layout.audit_policy.exists()
            else []
        ),
    ]


def backend_args(bins: Binaries, layout: Layout, c: ClusterRecord, j: int) -> list[str]:
    """kube-apiserver ``j`` (1-based) of an HA cluster: trusts the front proxy's headers."""
    p = layout.pki
    return [
        *apiserver_args(bins, layout, c, port=c.backends[j - 1].port, cert_dir=f"apiserver-{j}"),
        f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
        f"--requestheader-allowed-names={frontproxy.FRONT_PROXY_USER}",
        f"--requestheader-username-headers={frontproxy.USER_HEADER}",
        f"--requestheader-group-headers={frontproxy.GROUP_HEADER}",
        f"--requestheader-extra-headers-prefix={frontproxy.EXTRA_PREFIX}",
    ]


def proxy_args(layout: Layout, c: ClusterRecord) -> list[str]:
    # Not `-m coordinator_sandbox.frontproxy`: the package imports that module first.
    entry = "from coordinator_sandbox.frontproxy import main; raise SystemExit(main())"
    return [sys.executable, "-c", entry, f"--proxy-config={layout.proxy_config(c.index)}"]


def proxy_markers(layout: Layout) -> tuple[str, ...]:
    """An argument only this sandbox's front proxies carry (to find them without a record)."""
    return (f"--proxy-config={layout.root}{os.sep}cluster-",)


def python_names() -> set[str]:
    """The program names a front proxy runs under."""
    return {os.path.basename(sys.executable), "python", "python3", f"python3.{sys.version_info.minor}"}


def write_proxy_config(layout: Layout, record: SandboxRecord, c: ClusterRecord) -> None:
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


# --------------------------------------------------------------------------- starting


def spawn(kind: Kind, bins: Binaries, layout: Layout, c: ClusterRecord, *, append: bool = False) -> None:
    """Start the etcd or the kube-apiserver of a cluster with one kube-apiserver."""
    log = layout.log(c.index, kind)
    if kind == "etcd":
        args = etcd_args(bins, layout, c)
        ref = process.spawn(args, log, append=append)
        c.etcd = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))
    else:
        args = apiserver_args(bins, layout, c)
        ref = process.spawn(args, log, append=append)
        c.apiserver = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))


def spawn_backend(bins: Binaries, layout: Layout, c: ClusterRecord, j: int) -> None:
    args = backend_args(bins, layout, c, j)
    log = layout.log(c.index, f"kube-apiserver-{j}")
    ref = process.spawn(args, log)
    c.backends[j - 1].process = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))


def spawn_proxy(layout: Layout, record: SandboxRecord, c: ClusterRecord) -> None:
    write_proxy_config(layout, record, c)
    args = proxy_args(layout, c)
    log = layout.log(c.index, "proxy")
    ref = process.spawn(args, log)
    c.proxy = ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=args, log=str(log))


def respawn(server: ServerProcess) -> ServerProcess:
    """Start a program again with exactly the arguments it was first given."""
    with open(server.log, "ab") as log:
        stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        log.write(f"\n----- restarted by coordinator sandbox at {stamp} -----\n".encode())
    ref = process.spawn(server.args, Path(server.log), append=True)
    return ServerProcess(pid=ref.pid, start_ticks=ref.start_ticks, args=server.args, log=server.log)


# --------------------------------------------------------------------------- health


def etcd_healthy(layout: Layout, port: int) -> bool:
    conn: http.client.HTTPConnection
    if etcd_tls(layout):
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


def apiserver_ready(layout: Layout, port: int) -> tuple[bool, str]:
    """(ready?, why not): ``/readyz`` ok, and the ``default`` and ``kube-system`` namespaces exist."""
    admin = admin_client(layout, port, timeout=2.0)
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
