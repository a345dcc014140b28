"""``coordinator sandbox``: local control planes for demos and tests (rendering only)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import click

from coordinator.cli.base import Group
from coordinator.cli.output import emit, note, say, table
from coordinator.errors import CoordinatorError, ExitCode

_DIR_HELP = (
    "Sandbox directory [env COORDINATOR_SANDBOX_DIR; default: the user state dir, "
    "e.g. ~/.local/state/coordinator/sandbox]."
)


def _dir_option(fn: Any) -> Any:
    return click.option(
        "--dir",
        "dir_",
        type=click.Path(file_okay=False, path_type=Path),
        envvar="COORDINATOR_SANDBOX_DIR",
        default=None,
        help=_DIR_HELP,
    )(fn)


def _index_argument(fn: Any) -> Any:
    return click.argument("index", metavar="I", type=int)(fn)


class SandboxNotUpError(CoordinatorError):
    """`sandbox status` found a cluster that is not up."""

    exit_code = ExitCode.NO_QUORUM


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:.0f} MiB"


@click.group(
    "sandbox",
    cls=Group,
    short_help="Run local Kubernetes control planes (etcd + kube-apiserver) for demos and tests.",
    epilog="\b\nExample: coordinator sandbox up --clusters 3 && coordinator sandbox status",
)
def sandbox() -> None:
    """Run local Kubernetes control planes (etcd + kube-apiserver) for demos and tests.

    Each cluster is one etcd and one kube-apiserver on 127.0.0.1 (or several behind a
    front proxy, with `sandbox up --apiservers N`), with RBAC on. The
    binaries come from scripts/build-controlplane.sh (or $COORDINATOR_BIN_DIR). The
    servers keep running after the command returns; `sandbox down` stops them.
    Clusters are numbered from 1, like their contexts sandbox-1 ... sandbox-N.
    """


@sandbox.command(
    "up",
    epilog='\b\nExample: eval "$(coordinator sandbox up --clusters 3 --dir /tmp/sb | tail -n 1)"',
)
@click.option(
    "--clusters",
    "-n",
    "clusters",
    type=int,
    default=3,
    show_default=True,
    help="How many independent clusters to start.",
)
@click.option(
    "--apiservers",
    type=click.IntRange(1, 3),
    default=1,
    show_default=True,
    help="kube-apiservers per cluster, on its one etcd. More than one: a highly available "
    "control plane behind a front proxy on the cluster's address, which sends every request "
    "to one of them, picked at random.",
)
@click.option(
    "--date-offset",
    type=float,
    default=0.0,
    metavar="SECONDS",
    help="With --apiservers 2 or more: kube-apiserver 1 of every cluster answers as if its "
    "clock were SECONDS off (its Date header, and the managedFields times and "
    "creationTimestamps it writes, as every reader sees them). Negative: behind, "
    "e.g. --date-offset=-90.",
)
@_dir_option
@click.option(
    "--timeout",
    type=str,
    default=None,
    help="How long to wait for every cluster to be ready, e.g. 3m [default: 60s + 20s per kube-apiserver].",
)
@click.pass_context
def up_command(
    ctx: click.Context,
    clusters: int,
    apiservers: int,
    date_offset: float,
    dir_: Path | None,
    timeout: str | None,
) -> None:
    """Start N local clusters and write a kubeconfig for them.

    The kubeconfig has three contexts per cluster: sandbox-I (cluster admin),
    sandbox-I-restricted (no rights on leases; may get/create ConfigMaps only in the
    sandbox-restricted namespace) and sandbox-I-token (cluster admin by bearer token).
    The last line printed is an `export KUBECONFIG=...` line.

    With --apiservers 2 every context points at the cluster's front proxy, which
    checks client certificates and passes the user on to the kube-apiservers (as
    Kubernetes front proxies do); `sandbox status` shows how many requests each
    kube-apiserver served.
    """
    import coordinator_sandbox as sb
    from coordinator.rules.durations import parse_duration

    wait = (
        parse_duration(timeout, what="--timeout", at_least=1, why="no cluster starts at once")
        if timeout is not None
        else None
    )
    began = time.monotonic()
    extra: dict[str, Any] = {}
    if apiservers != 1 or date_offset:
        extra = {"apiservers": apiservers, "date_offset": date_offset}
    handle = sb.up(clusters, dir_, timeout=wait, on_progress=lambda msg: note(f"sandbox: {msg}"), **extra)
    took = time.monotonic() - began
    rows = [
        {"index": i, "context": ctx_name, "server": server}
        for i, (ctx_name, server) in enumerate(zip(handle.contexts, handle.servers, strict=True), 1)
    ]
    doc = {
        "dir": str(handle.dir),
        "kubeconfig": str(handle.kubeconfig),
        "clusters": rows,
        "restricted_contexts": handle.restricted_contexts,
        "token_contexts": handle.token_contexts,
        "restricted_namespace": handle.restricted_namespace,
        "startup_seconds": round(took, 1),
    }
    if extra:
        doc["apiservers"] = apiservers
        doc["date_offset_seconds"] = date_offset

    def ha_line() -> None:
        if extra:
            shifted = f"; kube-apiserver 1 answers {date_offset:+g}s off" if date_offset else ""
            say(f"Each cluster: {apiservers} kube-apiservers behind a front proxy on its address{shifted}.")

    def text() -> None:
        say(f"Sandbox with {len(handle.contexts)} cluster(s) is up in {handle.dir} ({took:.1f}s).")
        table(
            ["cluster", "context", "server"],
            [[c["index"], c["context"], c["server"]] for c in rows],
        )
        ha_line()
        say("Also: sandbox-I-restricted (limited user) and sandbox-I-token (bearer token) contexts.")
        say(f"Kubeconfig: {handle.kubeconfig}")
        say(f"export KUBECONFIG={shlex.quote(str(handle.kubeconfig))}")

    emit(ctx, doc, text)


@sandbox.command("status", epilog="\b\nExample: coordinator -o json sandbox status --dir /tmp/sb")
@_dir_option
@click.pass_context
def status_command(ctx: click.Context, dir_: Path | None) -> None:
    """Show whether every cluster is up; exit 0 only if all are.

    A cluster is up when its etcd and kube-apiserver run and /readyz answers ok (with
    --apiservers 2: every kube-apiserver, and through the front proxy).
    Exit status: 0 all up, 4 some cluster is not up, 2 no sandbox in the directory.
    """
    import coordinator_sandbox as sb

    report = sb.status(dir_)

    def text() -> None:
        table(
            ["cluster", "context", "server", "up", "kube-apiserver", "etcd", "memory", "detail"],
            [
                [
                    c.index,
                    c.context,
                    c.server,
                    "yes" if c.up else "no",
                    f"{c.apiserver} ({c.apiserver_pid})" if c.apiserver_pid else c.apiserver,
                    f"{c.etcd} ({c.etcd_pid})" if c.etcd_pid else c.etcd,
                    _mib(c.rss_bytes),
                    c.detail,
                ]
                for c in report.clusters
            ],
            title=f"Sandbox in {report.dir}",
        )
        ha = [c for c in report.clusters if c.backends]
        if ha:
            table(
                ["cluster", "kube-apiserver", "port", "state", "ready", "requests via proxy"],
                [
                    [
                        c.index,
                        b.index,
                        b.port,
                        f"{b.state} ({b.pid})" if b.pid else b.state,
                        "yes" if b.ready else "no",
                        "-" if b.requests is None else b.requests,
                    ]
                    for c in ha
                    for b in c.backends
                ],
                title="Behind each cluster's front proxy",
            )
        say(f"export KUBECONFIG={shlex.quote(str(report.kubeconfig))}")

    emit(ctx, report.to_dict(), text)
    if not report.all_up:
        down = [f"cluster {c.index} ({c.detail or 'not ready'})" for c in report.clusters if not c.up]
        raise SandboxNotUpError(
            f"{len(down)} of {len(report.clusters)} sandbox cluster(s) are not up: {'; '.join(down)}."
        )


@sandbox.command("down", epilog="\b\nExample: coordinator sandbox down --dir /tmp/sb")
@_dir_option
@click.option(
    "--grace",
    type=str,
    default="10s",
    show_default=True,
    help="How long to wait after SIGTERM before SIGKILL.",
)
@click.pass_context
def down_command(ctx: click.Context, dir_: Path | None, grace: str) -> None:
    """Stop every process of the sandbox and remove its files.

    SIGTERM first, SIGKILL after the grace period; the logs are kept. Stopping a
    sandbox that is not running is not an error.
    """
    import coordinator_sandbox as sb
    from coordinator.rules.durations import parse_duration

    report = sb.down(dir_, grace=parse_duration(grace, what="--grace"))
    doc = {"dir": str(report.dir), "stopped_pids": report.stopped, "killed_pids": report.killed}

    def text() -> None:
        if not report.was_running:
            say(f"No sandbox process was running in {report.dir}.")
            return
        forced = f", {len(report.killed)} of them with SIGKILL" if report.killed else ""
        say(f"Stopped {len(report.stopped)} process(es){forced}; {report.dir} is clean.")

    emit(ctx, doc, text)


def _apiserver_option(fn: Any) -> Any:
    return click.option(
        "--apiserver",
        "apiserver",
        metavar="J",
        type=click.IntRange(1),
        default=None,
        help="On a cluster started with --apiservers N: only its kube-apiserver J [default: all of them].",
    )(fn)


def _simple(name: str, summary: str, example: str, past: str, *, per_apiserver: bool = True) -> None:
    """Register one `sandbox NAME I` command acting on cluster I's API server."""

    def command(ctx: click.Context, index: int, dir_: Path | None, apiserver: int | None = None) -> None:
        import coordinator_sandbox as sb

        action = getattr(sb, name)
        if apiserver is None:
            action(dir_, index)
            doc = {"cluster": index, "action": name, "ok": True}
            emit(ctx, doc, lambda: say(f"Cluster {index}: {past}."))
        else:
            action(dir_, index, apiserver=apiserver)
            doc = {"cluster": index, "apiserver": apiserver, "action": name, "ok": True}
            emit(ctx, doc, lambda: say(f"Cluster {index}, kube-apiserver {apiserver}: {past}."))

    decorated: Any = click.pass_context(command)
    decorated = _dir_option(decorated)
    if per_apiserver:
        decorated = _apiserver_option(decorated)
    decorated = _index_argument(decorated)
    sandbox.command(name, help=summary, short_help=summary.split("\n")[0], epilog=f"\b\nExample: {example}")(decorated)


_simple(
    "pause",
    "Freeze cluster I's kube-apiserver (SIGSTOP).\n\n"
    "It keeps accepting TCP connections but answers nothing, like a hung server.",
    "coordinator sandbox pause 1",
    "kube-apiserver paused (connections hang until `sandbox resume`)",
)
_simple(
    "resume",
    "Unfreeze cluster I's kube-apiserver (SIGCONT) and wait until it answers.",
    "coordinator sandbox resume 1",
    "kube-apiserver resumed and ready",
)
_simple(
    "kill",
    "Kill cluster I's kube-apiserver (SIGKILL); its etcd keeps the data.\n\n"
    "Connections to its port are refused until `sandbox start` (on an HA cluster the\n"
    "front proxy answers 503 while none of its kube-apiservers runs).",
    "coordinator sandbox kill 2",
    "kube-apiserver killed (connections are refused until `sandbox start`)",
)
_simple(
    "start",
    "Start cluster I's servers again on the same port, and wait until ready.\n\n"
    "Restarts whatever of the cluster is not running; a paused server is resumed.",
    "coordinator sandbox start 2",
    "up and ready",
    per_apiserver=False,
)
