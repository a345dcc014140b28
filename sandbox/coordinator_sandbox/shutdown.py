"""Stopping a sandbox: every process of it, recorded or not, and the files it made.

A sandbox's processes are found two ways: from ``sandbox.json``, and by the arguments
only this sandbox's servers carry (so that a sandbox whose record was lost, or never
written because ``sandbox up`` was killed half-way, is stopped all the same).
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Sequence
from pathlib import Path

from coordinator.errors import UsageError
from coordinator_sandbox import process
from coordinator_sandbox.process import ProcessRef
from coordinator_sandbox.records import DownReport, Layout, SandboxRecord, load_record, locked
from coordinator_sandbox.servers import Progress, SandboxError, processes_of, proxy_markers, python_names


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
    for ref in process.find_by_markers(proxy_markers(layout), python_names()):
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


def stop_all(layout: Layout, record: SandboxRecord | None, grace: float) -> DownReport:
    """Stop every process of the sandbox; :class:`SandboxError` if one is left after SIGKILL."""
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


def clear_leftovers(layout: Layout, progress: Progress) -> None:
    """Make DIR ready for a fresh sandbox, or explain why it is not."""
    record, unreadable = _readable_record(layout)
    apiservers, etcds = _all_refs(layout, None)
    recorded_alive = record is not None and any(
        process.state(s.ref) != "gone" for c in record.clusters for s in processes_of(c)
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
        stop_all(layout, None, grace=5.0)
    _remove_owned(layout)
    shutil.rmtree(layout.logs, ignore_errors=True)


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
        report = stop_all(layout, record, grace)
        _remove_owned(layout)
    return report
