"""Bring sandbox clusters up and down, and break them on purpose.

A sandbox is a directory. Everything a later command (in another process) needs is in
``DIR/sandbox.json``: pids, start times, ports and the exact argument lists. Layout::

    DIR/sandbox.json             what is running (written before waiting on anything)
    DIR/kubeconfig               contexts sandbox-I, sandbox-I-restricted, sandbox-I-token
    DIR/pki/                     CA, serving and client certificates, token file, SA keys
    DIR/cluster-I/etcd/          etcd data of cluster I
    DIR/logs/cluster-I-*.log     output of etcd and kube-apiserver of cluster I
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
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

from coordinator.errors import CoordinatorError, ExitCode, UsageError
from coordinator.sandbox import kubeconfig, pki, process
from coordinator.sandbox.admin import AdminClient, AdminRequestError
from coordinator.sandbox.binaries import ETCD_VERSION, KUBE_VERSION, Binaries, find_binaries
from coordinator.sandbox.process import ProcessRef
from coordinator.sandbox.records import (
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


def _etcd_args(bins: Binaries, layout: Layout, c: ClusterRecord) -> list[str]:
    client = f"http://127.0.0.1:{c.etcd_client_port}"
    peer = f"http://127.0.0.1:{c.etcd_peer_port}"
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
        # Throw-away data: skip fsync, which dominates latency on slow CI disks.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_args(bins: Binaries, layout: Layout, c: ClusterRecord) -> list[str]:
    p = layout.pki
    return [
        str(bins.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{c.etcd_client_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={c.apiserver_port}",
        f"--cert-dir={layout.cluster_dir(c.index) / 'apiserver'}",
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


def _etcd_healthy(port: int) -> bool:
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
                ok, why[index] = _etcd_healthy(c.etcd_client_port), "etcd /health is not ok yet"
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
            if c.apiserver is not None and process.state(c.apiserver.ref) != "gone":
                apiservers[c.apiserver.pid] = c.apiserver.ref
            if c.etcd is not None and process.state(c.etcd.ref) != "gone":
                etcds[c.etcd.pid] = c.etcd.ref
    for ref in process.find_by_markers(layout.markers(), ["kube-apiserver"]):
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
        s is not None and process.state(s.ref) != "gone" for c in record.clusters for s in (c.etcd, c.apiserver)
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


def _default_timeout(n: int) -> float:
    # Measured on 2 cores: ~10 s per cluster when all start together; leave ample room.
    return 60.0 + 20.0 * n


def up(
    n: int,
    dir: Path | str | None = None,
    *,
    timeout: float | None = None,
    bin_dir: Path | str | None = None,
    on_progress: Progress | None = None,
) -> Sandbox:
    """Start ``n`` independent clusters (etcd + kube-apiserver each) on 127.0.0.1.

    Returns once every ``/readyz`` is ok and the ``default`` and ``kube-system``
    namespaces exist on every cluster. The servers run in their own sessions and
    outlive the caller; stop them with :func:`down`. If start-up fails or is
    interrupted, whatever was started is stopped again and the logs are kept.
    """
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
    budget = timeout if timeout is not None else _default_timeout(n)
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
        try:
            progress(f"starting {n} etcd server(s)")
            _start_wave("etcd", bins, layout, record, deadline, progress)
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


def pause(dir: Path | str | None, index: int) -> None:
    """SIGSTOP cluster ``index``'s kube-apiserver: it accepts connections, never answers."""
    layout = Layout.of(dir)
    with locked(layout):
        c = cluster_of(require_record(layout), index)
        api = c.apiserver
        if api is None or process.state(api.ref) == "gone":
            raise UsageError(
                f"The kube-apiserver of cluster {index} is not running, so it cannot be "
                f"paused. Start it with `coordinator sandbox start {index}`."
            )
        process.send(api.ref, signal.SIGSTOP)
        if not process.wait_paused(api.ref):
            raise SandboxError(f"The kube-apiserver of cluster {index} (pid {api.pid}) did not stop.")


def resume(dir: Path | str | None, index: int, *, timeout: float = 60.0) -> None:
    """SIGCONT cluster ``index``'s kube-apiserver and wait until it answers again."""
    layout = Layout.of(dir)
    with locked(layout):
        c = cluster_of(require_record(layout), index)
        api = c.apiserver
        if api is None or process.state(api.ref) == "gone":
            raise UsageError(
                f"The kube-apiserver of cluster {index} is not running (it was killed, not "
                f"paused). Start it with `coordinator sandbox start {index}`."
            )
        process.send(api.ref, signal.SIGCONT)
        _wait_ready(layout, c, timeout)


def kill(dir: Path | str | None, index: int) -> None:
    """SIGKILL cluster ``index``'s kube-apiserver (etcd keeps running). Idempotent."""
    layout = Layout.of(dir)
    with locked(layout):
        c = cluster_of(require_record(layout), index)
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
            while not _etcd_healthy(c.etcd_client_port):
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


def heal(dir: Path | str | None = None, *, timeout: float = 120.0) -> list[int]:
    """Resume paused and restart killed servers; return the clusters that needed it."""
    layout = Layout.of(dir)
    record = require_record(layout)
    touched: list[int] = []
    for c in record.clusters:
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
        return [s.pid for c in self.record.clusters for s in (c.etcd, c.apiserver) if s]

    def admin(self, index: int, *, timeout: float = 5.0) -> AdminClient:
        """A cluster-admin HTTP client for cluster ``index`` (standard library only)."""
        return _admin(self._layout, cluster_of(self.record, index).apiserver_port, timeout)

    def status(self) -> SandboxStatus:
        return status(self.dir)

    def pause(self, index: int) -> None:
        pause(self.dir, index)

    def resume(self, index: int) -> None:
        resume(self.dir, index)

    def kill(self, index: int) -> None:
        kill(self.dir, index)

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
