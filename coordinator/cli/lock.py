"""`coordinator lock ...`: acquire, renew, release, status, break, run, history."""

from __future__ import annotations

import functools
import sys
from typing import Any

import click

from coordinator.cli import output
from coordinator.cli.base import Group, prints_names
from coordinator.cli.lockview import (
    acquire_document,
    acquired_text,
    claim_document,
    end_if_reader_gone,
    end_live_line,
    fleet_text,
    lock_names,
    print_watch_round,
    status_document,
    status_text,
    wait_reporter,
)
from coordinator.cli.output import app_of, dump_document, emit, note, run, say, table


def _coordinator(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.ops.api import Coordinator

    app = app_of(ctx)
    return Coordinator.from_config(app.config_path, timeout=app.timeout)


def _duration(value: str, what: str, least: tuple[float, str] | None = None) -> float:
    """``value`` in seconds; with ``least`` (the shortest that makes sense, and what a
    shorter one would do), anything shorter is refused (exit 2)."""
    from coordinator.rules.durations import parse_duration

    if least is None:
        return parse_duration(value, what=what)
    return parse_duration(value, what=what, at_least=least[0], why=least[1])


def default_ttl(ctx: click.Context, ttl_s: float, c: Any, deployment: str) -> float:
    """``--ttl`` as given; left at its default, no longer than the deployment's maximum
    TTL (a deployment made with ``--max-ttl 2m`` takes the lock without one)."""
    from click.core import ParameterSource

    if ctx.get_parameter_source("ttl") is not ParameterSource.DEFAULT:
        return ttl_s
    try:
        return min(ttl_s, float(c.deployment(deployment).max_ttl_s))
    except Exception:  # an unknown deployment is reported by the command itself
        return ttl_s


@click.group(cls=Group)
def lock() -> None:
    """Take, hold, inspect and release the majority-wins lock of a deployment."""


_ttl = click.option(
    "--ttl",
    default="180s",
    help="Lease duration; a crashed holder frees the lock after it "
    "[default: 180s, or the deployment's --max-ttl if shorter].",
)
_wait = click.option("--wait", default="0s", show_default=True, help="Keep trying this long (e.g. 5m) if it is held.")
_reason = click.option("--reason", default="", help="Why you take it (shown to others).")
_holder = click.option(
    "--holder",
    envvar="COORDINATOR_HOLDER",
    default=None,
    help="Who holds it [env COORDINATOR_HOLDER; default user@host].",
)
_lock_id = click.option(
    "--lock-id",
    envvar="COORDINATOR_LOCK_ID",
    default=None,
    help="Lock id [env COORDINATOR_LOCK_ID; default: the one recorded for this holder].",
)


_max_server_skew = click.option(
    "--max-server-skew",
    envvar="COORDINATOR_MAX_SERVER_SKEW",
    default="5s",
    show_default=True,
    help="Bound on clock offsets between the API servers of one cluster (HA control planes); "
    "added to the margin before a lease of someone else counts as expired "
    "[env COORDINATOR_MAX_SERVER_SKEW].",
)


@lock.command("acquire")
@click.argument("deployment")
@_ttl
@_wait
@_reason
@_holder
@_max_server_skew
@click.pass_context
def acquire(
    ctx: click.Context, deployment: str, ttl: str, wait: str, reason: str, holder: str | None, max_server_skew: str
) -> None:
    """Take the lock on a majority of the deployment's clusters.

    Example: coordinator lock acquire payments --ttl 3m --wait 5m --reason "release 1.2"
    """
    from coordinator.errors import CoordinatorError
    from coordinator.rules.durations import TTL_MIN

    ttl_s, wait_s = _duration(ttl, "--ttl", TTL_MIN), _duration(wait, "--wait")
    c = _coordinator(ctx)
    ttl_s = default_ttl(ctx, ttl_s, c, deployment)
    c.max_server_skew_s = _duration(max_server_skew, "--max-server-skew")
    reporter = wait_reporter() if wait_s > 0 else None

    taken: list[Any] = []

    async def go() -> Any:
        async with c:
            res = await c.acquire(deployment, ttl=ttl_s, wait=wait_s, reason=reason, holder=holder, on_wait=reporter)
            taken.append(res)  # held and recorded: from here on the lock is reported, not undone
            return res

    try:
        result = run(go)
    except KeyboardInterrupt:
        if not taken:
            raise  # the acquisition was cancelled and gave back what it had written
        # Ctrl-C while the connections were closing: the lock is already held and recorded
        # on this machine, so the answer is the lock, not "Aborted" over a lock nobody sees.
        result = taken[0]
        click.echo("Interrupted after the lock was taken; it is held (see below).", err=True)
    except CoordinatorError as err:
        if reporter is not None and sys.stderr.isatty():
            sys.stderr.write("\n")
        if err.payload is not None and hasattr(err.payload, "members"):
            emit(ctx, acquire_document(err.payload), lambda: None)
        raise
    _ignore_interrupts()  # the lock is ours: printing it is all that is left to do
    if reporter is not None and sys.stderr.isatty():
        sys.stderr.write("\n")
    emit(ctx, acquire_document(result), lambda: acquired_text(result))


def _ignore_interrupts() -> None:
    """Ctrl-C no longer undoes anything: ignore it, so that the output is written whole and
    the exit status says what happened (a SIGINT in the interpreter's last moments would
    otherwise end the process by the signal after the lock was reported)."""
    import signal

    if output.AS_PROGRAM:  # not when the CLI is called inside another program (tests)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@lock.command("renew")
@click.argument("deployment")
@_lock_id
@_holder
@click.option("--ttl", default=None, help="New lease duration [default: as acquired].")
@click.pass_context
def renew(ctx: click.Context, deployment: str, lock_id: str | None, holder: str | None, ttl: str | None) -> None:
    """Extend the lock's leases on a majority.

    Example: coordinator lock renew payments
    """
    from coordinator.rules.durations import TTL_MIN

    ttl_s = _duration(ttl, "--ttl", TTL_MIN) if ttl else None
    c = _coordinator(ctx)

    async def go() -> Any:
        async with c:
            return await c.renew(deployment, lock_id, ttl=ttl_s, holder=holder)

    result = run(go)
    emit(ctx, acquire_document(result), lambda: acquired_text(result))


@lock.command("release")
@click.argument("deployment")
@_lock_id
@_holder
@click.option(
    "--if-held",
    is_flag=True,
    help="Exit 0 when this holder holds nothing (for cleanup steps that always run).",
)
@click.option(
    "--grace",
    default=None,
    help="How long to wait for the command of a `lock run` of this machine that holds the lock to end "
    "[default: that run's --grace, plus 2s].",
)
@click.option(
    "--force",
    is_flag=True,
    help="Release even while the command of a `lock run` of this machine that holds the lock still runs "
    "(that `lock run` then stops its command and exits 7).",
)
@click.pass_context
def release(
    ctx: click.Context,
    deployment: str,
    lock_id: str | None,
    holder: str | None,
    if_held: bool,
    grace: str | None,
    force: bool,
) -> None:
    """Release the lock wherever it is still ours (never someone else's).

    Without --lock-id, the lock this holder took on this machine, never one that a running
    `lock run` holds: that lock is its process's. A lock whose `lock run` command still
    runs on this machine (its `lock run` alive, or killed and its watchdog stopping the
    command) is released only once the command's process group has ended: the release
    waits up to --grace, then exits 3 unless --force.

    A release that reaches fewer than a majority of the clusters exits 4 and keeps the
    local record, so that running it again finishes the job.

    Example: coordinator lock release payments --lock-id 3f2a9c0d1e4b5a69
    """
    from coordinator.cli.output import note

    grace_s = _duration(grace, "--grace") if grace is not None else None
    c = _coordinator(ctx)

    async def go() -> Any:
        async with c:
            return await c.release(
                deployment, lock_id, holder, if_held=if_held, force=force, grace=grace_s, on_wait=note
            )

    out = run(go)
    rows = [{"name": k, "outcome": str(r.outcome), "detail": r.detail} for k, r in sorted(out["results"].items())]
    doc = {"deployment": deployment, "lock_id": out["lock_id"], "released": out["held"], "clusters": rows}

    def text() -> None:
        if not out["held"]:
            say(f"Holder holds no lock of {deployment}; nothing to release.")
            return
        released = sum(1 for r in out["results"].values() if r.extra.get("ours"))
        say(f"Released lock {out['lock_id']} of {deployment} on {released} cluster(s).")
        table(["cluster", "outcome", "detail"], [[r["name"], r["outcome"], r["detail"]] for r in rows])

    emit(ctx, doc, text)


# What moves with the clock alone: a --watch prints a round when anything else changes.
MOVING = ("expires_in_s", "renewed_ago_s")


def _fleet(ctx: click.Context, watch: bool, every: float, namespace: str | None, skew: float) -> None:
    import dataclasses

    from coordinator.ops.fleet import fleet_document, survey

    c = _coordinator(ctx)
    c.max_server_skew_s = skew
    fmt = app_of(ctx).output
    from coordinator.errors import missing_config

    if c.store is not None and (missing := missing_config(c.store.path, "No lock to show")) is not None:
        raise missing

    def doc_of(fleet: Any) -> dict[str, Any]:
        return fleet_document(fleet, claim_document)

    def scoped(fleet: Any) -> Any:
        if namespace is None:
            return fleet
        return dataclasses.replace(fleet, deployments=[e for e in fleet.deployments if e.namespace == namespace])

    if not watch:

        async def once() -> Any:
            async with c:
                return await survey(c.config, c.clusters, c.max_server_skew_s)

        fleet = scoped(run(once))
        emit(ctx, doc_of(fleet), lambda: fleet_text(fleet), names=lambda: lock_names(fleet))
        from coordinator.ops.verdicts import fleet_problem

        if (problem := fleet_problem(fleet)) is not None:
            raise problem
        return

    async def follow() -> None:
        import anyio

        from coordinator.ops.fleet import FleetWatch

        # One LIST and then one watch per cluster; between events, the view is rebuilt
        # from what the watches mirror every --interval (expiry moves on with the clock).
        watch = FleetWatch(c.config, c.clusters, max_server_skew_s=c.max_server_skew_s)
        last: str | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run)
            await watch.ready.wait()
            while True:
                fleet = scoped(watch.fleet())
                doc = doc_of(fleet)
                stable = {
                    **doc,
                    "deployments": [{k: v for k, v in d.items() if k not in MOVING} for d in doc["deployments"]],
                }
                key = dump_document(stable, "json")
                if key != last:
                    last = key
                    print_watch_round(fmt, doc, functools.partial(fleet_text, fleet), lock_names(fleet))
                with anyio.move_on_after(every):
                    await watch.changed.wait()
                end_if_reader_gone()

    _run_watch(c, follow)


def _run_watch(c: Any, follow: Any) -> None:
    async def loop() -> None:
        import signal

        import anyio

        # The watch ends normally on SIGINT, SIGTERM or SIGHUP: output flushed, clients
        # closed (outside the cancelled scope), exit 0. A signal ignored at start stays
        # ignored: a background job of a script starts with SIGINT ignored, and is
        # stopped with SIGTERM.
        stops = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
        async with c:
            with anyio.open_signal_receiver(*stops) as signals:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follow)
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        break

    try:
        run(loop)
    except KeyboardInterrupt:
        pass


@lock.command("status")
@click.argument("deployment", required=False)
@click.option(
    "--all",
    "all_",
    is_flag=True,
    help="Every deployment: known here or found on the connected clusters (the default without DEPLOYMENT).",
)
@click.option(
    "--namespace",
    "-n",
    "namespace",
    metavar="NS",
    help="With the fleet: only the deployments in namespace NS; with DEPLOYMENT: check that it is in NS.",
)
@click.option("--watch", "-w", is_flag=True, help="Keep printing changes until interrupted.")
@click.option("--interval", default="1s", show_default=True, help="With --watch: how often to look.")
@_max_server_skew
@click.pass_context
@prints_names
def status(
    ctx: click.Context,
    deployment: str | None,
    all_: bool,
    namespace: str | None,
    watch: bool,
    interval: str,
    max_server_skew: str,
) -> None:
    """Who holds the lock, where, since when, until when.

    Without DEPLOYMENT (or with --all): every deployment this machine knows and every
    one found on the connected clusters, with one LIST of leases per cluster. Those
    found on the clusters but not known here are marked, with the command that imports
    them.

    When the clusters it could see do not decide who holds the lock (a holder may have
    a majority with the members it could not see), it says UNKNOWN, names who may hold
    it, and exits 4 after printing; it never calls such a lock free. For the fleet it
    exits 4 when fewer than a majority of the connected clusters could be listed.

    \b
    Examples:
      coordinator lock status payments -o json
      coordinator lock status            # the fleet: what is locked, anywhere?
    """
    from coordinator.rules.durations import INTERVAL_MIN

    every = _duration(interval, "--interval", INTERVAL_MIN)
    # A lease shown expired must be one an acquisition could take: past the same margins.
    skew = _duration(max_server_skew, "--max-server-skew")
    if deployment is None or all_:
        if deployment is not None:
            from coordinator.errors import UsageError

            raise UsageError("--all shows every deployment: give either DEPLOYMENT or --all, not both.")
        _fleet(ctx, watch, every, namespace, skew)
        return
    c = _coordinator(ctx)
    if namespace is not None and (recorded := c.deployment(deployment).namespace) != namespace:
        # With one deployment, -n is a check, as kubectl users give it: the record knows
        # where the deployment lives.
        from coordinator.errors import UsageError

        raise UsageError(
            f"Deployment {deployment!r} is in namespace {recorded!r}, not {namespace!r} (with a "
            "deployment, -n checks the namespace it was created or imported with; without one, -n "
            f"narrows the fleet view). Leave -n out, or give -n {recorded}."
        )
    c.max_server_skew_s = skew
    fmt = app_of(ctx).output

    if not watch:

        async def once() -> Any:
            async with c:
                return await c.status(deployment)

        st = run(once)
        emit(
            ctx,
            status_document(st),
            lambda: status_text(st),
            names=lambda: [f"lock/{st.deployment}"],
            wide=lambda: status_text(st, wide=True),
        )
        from coordinator.ops.verdicts import status_verdict

        if (problem := status_verdict(st).problem()) is not None:
            raise problem
        return

    async def follow() -> None:
        import anyio

        last: str | None = None
        while True:
            st = await c.status(deployment)
            doc = status_document(st)
            key = dump_document(
                {k: v for k, v in doc.items() if k not in MOVING}
                | {"clusters": [{k: v for k, v in r.items() if k not in MOVING} for r in doc["clusters"]]},
                "json",
            )
            if key != last:
                last = key
                print_watch_round(
                    fmt, doc, functools.partial(status_text, st, wide=fmt == "wide"), [f"lock/{st.deployment}"]
                )
            await anyio.sleep(every)
            end_if_reader_gone()

    _run_watch(c, follow)


@lock.command("break")
@click.argument("deployment")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--reason", default="", help="Why (kept in the audit note on the leases).")
@click.option(
    "--lock-id",
    default=None,
    help="Break only this lock (as shown by `lock status`): if another lock holds the deployment by the "
    "time the break runs, it is left alone and the command exits 3.",
)
@click.pass_context
def break_(ctx: click.Context, deployment: str, yes: bool, reason: str, lock_id: str | None) -> None:
    """Clear the lock whatever its holder (admin override, like terraform force-unlock).

    With --lock-id, only the leases of that lock are cleared: a lock taken since you looked
    (the holder renewed and another took over, say) is never broken by mistake.

    \b
    Examples:
      coordinator lock break payments --yes --reason "holder's CI runner died"
      coordinator lock break payments --lock-id 3f2a9c0d1e4b5a69 --yes
    """
    if not yes and not sys.stdin.isatty():
        from coordinator.errors import UsageError

        # Nobody can answer the question: a script (or CI job) must say it means it.
        raise UsageError(
            f"Breaking the lock of {deployment!r} needs confirmation, and standard input is not a "
            "terminal to ask on; use --yes to break it without asking."
        )
    c = _coordinator(ctx)
    if not yes:

        async def peek() -> Any:
            async with c:
                return await c.status(deployment)

        st = run(peek)
        from coordinator.text import printable

        # The holder is the lease's text: a title-setting or line-rewriting sequence in it
        # would change the question the user answers.
        who = printable(st.holder) if st.holder else "nobody (by majority)"
        what = f"lock {printable(lock_id)} of {deployment!r}" if lock_id else f"the lock of {deployment!r}"
        held = f"held by {who}" + (f" (lock {st.lock_id})" if lock_id and st.lock_id else "")
        click.confirm(f"Break {what}, {held}? The holder is not told.", abort=True)
        c = _coordinator(ctx)

    async def go() -> Any:
        async with c:
            return await c.break_lock(deployment, reason=reason, lock_id=lock_id)

    results = run(go)
    rows = [{"name": k, "outcome": str(r.outcome), "detail": r.detail} for k, r in sorted(results.items())]
    from coordinator.ops.verdicts import break_verdict

    verdict = break_verdict(deployment, results, lock_id)

    def text() -> None:
        if lock_id is None:
            say(f"Broke the lock of {deployment}; an audit note is on each lease.")
        elif verdict.broken:
            say(f"Broke lock {lock_id} of {deployment} on {', '.join(verdict.broken)}; an audit note is on each.")
        else:
            say(f"Lock {lock_id} holds no lease of {deployment}; nothing was broken.")
        table(["cluster", "outcome", "detail"], [[r["name"], r["outcome"], r["detail"]] for r in rows])

    doc = {"deployment": deployment, "lock_id": lock_id, "broken": verdict.broken, "clusters": rows}
    emit(ctx, doc, text)
    if (problem := verdict.problem()) is not None:
        raise problem


@lock.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("deployment")
@_ttl
@_wait
@_reason
@_holder
@click.option(
    "--grace",
    default="10s",
    show_default=True,
    help="After SIGTERM to the child's group (lock lost, or processes left behind), wait this long before SIGKILL.",
)
@click.option(
    "--lock-id",
    envvar="COORDINATOR_LOCK_ID",
    default=None,
    help="Run under this lock, already held by this holder (e.g. from `lock acquire`), instead of taking "
    "one; it stays held afterwards unless --release [env COORDINATOR_LOCK_ID, when COORDINATOR_DEPLOYMENT "
    "is unset or names this deployment].",
)
@click.option("--release", is_flag=True, help="With --lock-id: release the lock when the command ends.")
@click.option(
    "--check-drift",
    is_flag=True,
    help="Once the lock is held, check the watched resources (`coordinator drift`); on confirmed drift "
    "(exit 8), or too few clusters read to say (exit 4), give the lock back and do not run the command.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run_(
    ctx: click.Context,
    deployment: str,
    ttl: str,
    wait: str,
    reason: str,
    holder: str | None,
    grace: str,
    lock_id: str | None,
    release: bool,
    check_drift: bool,
    command: tuple[str, ...],
) -> None:
    """Run a command while holding the lock (renewed in the background, released at the end).

    The command runs in a process group of its own, with COORDINATOR_LOCK_ID,
    COORDINATOR_FENCING_TOKEN, COORDINATOR_DEPLOYMENT, COORDINATOR_HOLDER and
    COORDINATOR_CLUSTERS (the member clusters, comma-separated) in its environment. Signals
    sent to `lock run` go to the whole group. If the lock is lost (taken, broken, or
    released by someone else), the group gets SIGTERM, then SIGKILL after --grace, and
    the exit status is 7. The lock is released only once no process of the group is
    left; if `lock run` itself is killed, a watchdog stops the group. Ctrl-Z stops the
    group too, and the lock is checked before it continues. The lock is this run's: other
    commands on this machine do not take it from the local record, and a `lock release`
    here waits for the group to end.

    Exit status: the command's (128+N if it was killed by signal N); 127 if it is not
    found, 126 if it cannot be run; 7 if the lock was lost.

    Example: coordinator lock run payments --wait 10m -- ./deploy.sh v1.2
    """
    from click.core import ParameterSource

    from coordinator.rules.durations import TTL_MIN
    from coordinator.run.lockrun import RunOptions, run_locked

    if lock_id and ctx.get_parameter_source("lock_id") is ParameterSource.ENVIRONMENT:
        import os

        # A child of another `lock run` inherits its lock id: it is ours only for the
        # same deployment.
        named = os.environ.get("COORDINATOR_DEPLOYMENT")
        if named and named != deployment:
            lock_id = None
    if release and not lock_id:
        from coordinator.errors import UsageError

        raise UsageError("--release goes with --lock-id: without it, `lock run` always releases the lock it took.")
    ttl_given = ctx.get_parameter_source("ttl") is not ParameterSource.DEFAULT
    wait_s = _duration(wait, "--wait")
    c = _coordinator(ctx)
    opts = RunOptions(
        deployment=deployment,
        command=list(command),
        ttl_s=default_ttl(ctx, _duration(ttl, "--ttl", TTL_MIN), c, deployment) if ttl_given or not lock_id else None,
        wait_s=wait_s,
        reason=reason,
        holder=holder,
        grace_s=_duration(grace, "--grace"),
        lock_id=lock_id,
        release=release,
        on_wait=wait_reporter() if wait_s > 0 and not lock_id else None,
        on_wait_end=end_live_line,
        own_process=output.AS_PROGRAM,
        before_start=_drift_gate(deployment) if check_drift else None,
    )
    code = run_locked(c, opts)
    sys.stdout.flush()
    ctx.exit(code)


def _drift_gate(deployment: str) -> Any:
    """`lock run --check-drift`: raise the drift check's verdict (coordinator/ops/drift.py)."""

    async def gate(c: Any) -> None:
        from coordinator.ops.drift import check

        report = await check(c, deployment)
        if not report.expectations:
            # Asked to check, with nothing recorded to check against: passes, but says so.
            note(
                f"coordinator: --check-drift: nothing is watched for drift in {deployment} (record resources "
                f"with `coordinator drift record {deployment} KIND/NAME ...`); the command runs."
            )
        if (problem := report.problem()) is not None:
            raise problem

    return gate


from coordinator.cli.history import history as _history  # noqa: E402  (its own module: `lock history`)

lock.add_command(_history)
