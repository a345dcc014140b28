"""One cluster of a running sandbox at a time: observe it, break it, mend it.

``status`` only looks. ``pause`` (SIGSTOP: connections are accepted, nothing answers),
``resume``, ``kill`` (SIGKILL; etcd keeps the data) and ``start`` (whatever is not
running, on the same ports with the same arguments) act on the kube-apiserver(s) of one
cluster; on an HA cluster on all of them, or only on number ``apiserver``. ``heal``
starts whatever is not running everywhere; ``set_date_offset`` changes what the front
proxies shift. Every mutating call takes ``DIR/.sandbox.lock``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path

from coordinator.errors import UsageError
from coordinator_sandbox import frontproxy, process
from coordinator_sandbox.credentials import admin_client
from coordinator_sandbox.records import (
    BackendStatus,
    ClusterRecord,
    ClusterStatus,
    Layout,
    SandboxRecord,
    SandboxStatus,
    ServerProcess,
    cluster_of,
    locked,
    require_record,
    save_record,
)
from coordinator_sandbox.servers import (
    SandboxError,
    apiserver_ready,
    component_state,
    etcd_healthy,
    overall,
    port_clash,
    processes_of,
    respawn,
    tail,
    write_proxy_config,
)

# --------------------------------------------------------------------------- status


def status(dir: Path | str | None = None) -> SandboxStatus:
    """Observe every cluster: process states, ``/readyz``, memory. Never changes anything."""
    layout = Layout.of(dir)
    record = require_record(layout)
    result: list[ClusterStatus] = []
    for c in record.clusters:
        if c.ha:
            result.append(_ha_status(layout, c))
            continue
        api_state = component_state(c.apiserver)
        etcd_state = component_state(c.etcd)
        ready, detail = False, ""
        if api_state == "running":
            ready, detail = admin_client(layout, c.apiserver_port).ready(timeout=2.0)
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
    proxy_state = component_state(c.proxy)
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
        state = component_state(b.process)
        ready = False
        if state == "running":
            ready, why = admin_client(layout, b.port).ready(timeout=2.0)
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
        ready, why = admin_client(layout, c.apiserver_port).ready(timeout=2.0)
        if not ready:
            problems.append(f"through the front proxy: {why}")
    else:
        problems.append(f"the front proxy is {proxy_state}; `sandbox start` starts it again")
    etcd_state = component_state(c.etcd)
    if etcd_state != "running":
        problems.append(f"etcd is {etcd_state}")
    ready = ready and all(b.ready for b in backends)
    rss = 0
    for server in processes_of(c):
        if process.state(server.ref) != "gone":
            memory = process.memory_bytes(server.pid)
            rss += memory[0] if memory else 0
    return ClusterStatus(
        index=c.index,
        name=c.name,
        context=c.name,
        server=c.server,
        apiserver=overall([b.state for b in backends]),
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


# --------------------------------------------------------------------------- waiting, choosing


def _wait_ready(layout: Layout, c: ClusterRecord, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        assert c.apiserver is not None
        if process.state(c.apiserver.ref) == "gone":
            hint = f" Port {c.apiserver_port} is taken by another process." if port_clash(c.apiserver.log) else ""
            raise SandboxError(
                f"The kube-apiserver of cluster {c.index} exited while starting.{hint} "
                f"Its log is {c.apiserver.log}; last lines:\n{tail(c.apiserver.log)}"
            )
        ok, why = apiserver_ready(layout, c.apiserver_port)
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
                    f"{server.log}; last lines:\n{tail(server.log)}"
                )
            ok, detail = apiserver_ready(layout, c.backends[j - 1].port)
            if not ok:
                why = f"kube-apiserver {j}: {detail}"
                break
        if not why:
            ok, detail = apiserver_ready(layout, c.apiserver_port)
            if ok:
                return
            why = f"front proxy: {detail}"
        time.sleep(0.2)
    raise SandboxError(f"Cluster {c.index} is not ready after {timeout:.0f}s ({why}).")


def chosen_backends(c: ClusterRecord, apiserver: int | None) -> list[tuple[int, ServerProcess | None]]:
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


def _ha_signal(c: ClusterRecord, apiserver: int | None, sig: signal.Signals, verb: str) -> list[int]:
    """Send ``sig`` to the chosen kube-apiservers of an HA cluster; return their numbers."""
    chosen = chosen_backends(c, apiserver)
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


# --------------------------------------------------------------------------- breaking


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
        chosen_backends(c, apiserver)
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
        chosen_backends(c, apiserver)
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
            refs = [api.ref for _j, api in chosen_backends(c, apiserver) if api is not None]
            for ref in refs:
                process.send(ref, signal.SIGKILL)
            left = process.wait_gone(refs, 10.0)
            if left:
                pids = ", ".join(str(ref.pid) for ref in left)
                raise SandboxError(f"kube-apiserver(s) of cluster {index} (pid {pids}) survived SIGKILL.")
            return
        chosen_backends(c, apiserver)
        api = c.apiserver
        if api is None:
            return
        process.send(api.ref, signal.SIGKILL)
        if process.wait_gone([api.ref], 10.0):
            raise SandboxError(f"The kube-apiserver of cluster {index} (pid {api.pid}) survived SIGKILL.")


# --------------------------------------------------------------------------- mending


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
            c.etcd = respawn(c.etcd)
            save_record(layout, record)
            deadline = time.monotonic() + timeout
            while not etcd_healthy(layout, c.etcd_client_port):
                if process.state(c.etcd.ref) == "gone" or time.monotonic() > deadline:
                    raise SandboxError(
                        f"etcd of cluster {index} did not come back. Its log is "
                        f"{c.etcd.log}; last lines:\n{tail(c.etcd.log)}"
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
            c.apiserver = respawn(c.apiserver)
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
        c.etcd = respawn(c.etcd)
        save_record(layout, record)
        while not etcd_healthy(layout, c.etcd_client_port):
            if process.state(c.etcd.ref) == "gone" or time.monotonic() > deadline:
                raise SandboxError(
                    f"etcd of cluster {index} did not come back. Its log is {c.etcd.log}; "
                    f"last lines:\n{tail(c.etcd.log)}"
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
            b.process = respawn(b.process)
            save_record(layout, record)
    if process.state(c.proxy.ref) == "gone":
        if not process.wait_port_free(c.apiserver_port):
            raise SandboxError(
                f"Cannot restart the front proxy of cluster {index}: its port {c.apiserver_port} is taken by "
                "another process, and the kubeconfig points there. Free the port, or recreate the sandbox."
            )
        write_proxy_config(layout, record, c)
        c.proxy = respawn(c.proxy)
        save_record(layout, record)
    _wait_ha(layout, c, range(1, len(c.backends) + 1), max(1.0, deadline - time.monotonic()))


def heal(dir: Path | str | None = None, *, timeout: float = 120.0) -> list[int]:
    """Resume paused and restart killed servers; return the clusters that needed it."""
    layout = Layout.of(dir)
    record = require_record(layout)
    touched: list[int] = []
    for c in record.clusters:
        if {component_state(s) for s in c.servers()} != {"running"}:
            touched.append(c.index)
            start(layout.root, c.index, timeout=timeout)
    return touched


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
            write_proxy_config(layout, record, c)
            if c.proxy is not None:
                process.send(c.proxy.ref, signal.SIGHUP)
        save_record(layout, record)
