"""`coordinator state ...`: get, set, apply, diff, sync, history, backup, restore."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from coordinator.cli.base import Group, is_document
from coordinator.cli.output import app_of, dump_document, emit, render_document, run, say, table, when


def _coordinator(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.ops.api import Coordinator

    app = app_of(ctx)
    return Coordinator.from_config(app.config_path, timeout=app.timeout)


def _with_state(ctx: click.Context, deployment: str, fn: Any) -> Any:
    c = _coordinator(ctx)

    async def go() -> Any:
        async with c:
            return await fn(c.state(deployment))

    return run(go)


_lock_id = click.option(
    "--lock-id",
    envvar="COORDINATOR_LOCK_ID",
    default=None,
    help="Lock id [env COORDINATOR_LOCK_ID; default: the one recorded for this holder].",
)


def write_text(report: Any) -> None:
    say(
        f"Wrote version {report.version} (token {report.token}) on {len(report.confirmed)} of "
        f"{len(report.results)} clusters (quorum {report.quorum})."
    )
    table(["cluster", "outcome", "detail"], [[k, str(r.outcome), r.detail] for k, r in sorted(report.results.items())])
    if report.lagging:
        say(f"Lagging: {', '.join(report.lagging)}; the next read or `state sync` repairs them.")
    for k, path in sorted(report.saved.items()):
        done = "before it was overwritten" if k in report.confirmed else "(it did not take this write)"
        say(f"The replica on {k} was saved to {path} {done}.")


def write_doc(report: Any) -> dict[str, Any]:
    doc = {
        "deployment": report.deployment,
        "outcome": report.outcome,
        "version": report.version,
        "token": report.token,
        "write_id": report.write_id,
        "quorum": report.quorum,
        "confirmed": report.confirmed,
        "promised": report.promised,
        "clusters": [
            {"name": k, "outcome": str(r.outcome), "detail": r.detail} for k, r in sorted(report.results.items())
        ],
    }
    if report.saved:
        doc["saved"] = report.saved
    return doc


def _emit_write(
    ctx: click.Context,
    fn: Any,
    deployment: str,
    *,
    notes: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    from coordinator.errors import CoordinatorError

    try:
        report = _with_state(ctx, deployment, fn)
    except CoordinatorError as err:
        if err.payload is not None and hasattr(err.payload, "confirmed"):
            emit(ctx, write_doc(err.payload) | (extra or {}), lambda: None)
        raise

    def text() -> None:
        write_text(report)
        for line in notes or []:
            say(line)

    emit(ctx, write_doc(report) | (extra or {}), text)


@click.group(cls=Group)
def state() -> None:
    """Read and write the deployment's quorum-replicated state."""


@state.command("get")
@click.argument("deployment")
@click.argument("key", required=False)
@click.pass_context
def get(ctx: click.Context, deployment: str, key: str | None) -> None:
    """Print the state (or one dotted KEY), read from a majority.

    Example: coordinator state get payments app.version
    """
    value = _with_state(ctx, deployment, lambda s: s.get(key))
    fmt = app_of(ctx).output
    if is_document(fmt):
        click.echo(render_document(value, fmt), nl=not fmt.startswith("jsonpath="))
    elif isinstance(value, dict | list):
        click.echo(dump_document(value, "yaml"))
    else:
        # For people, like every value printed in a table: whoever may write the state
        # chose it, so control characters and line breaks are shown as escapes
        # (`-o json` prints it exact).
        say("" if value is None else (json.dumps(value) if isinstance(value, bool) else str(value)))


@state.command("set")
@click.argument("deployment")
@click.argument("assignments", nargs=-1, required=True)
@_lock_id
@click.pass_context
def set_(ctx: click.Context, deployment: str, assignments: tuple[str, ...], lock_id: str | None) -> None:
    """Set KEY=VALUE pairs as a new version, under the lock.

    KEY=VALUE stores VALUE as a string, exactly as typed (1.10, 0755, NO, 12:30 stay
    text); KEY:=JSON stores a typed value (replicas:=3, canary:=true, ratio:=0.5,
    tags:='["a","b"]'), and says so when it reads differently from what was typed.

    Example: coordinator state set payments app.version=1.10 replicas:=3 canary:=true
    """
    from coordinator.cli.documents import parse_assignment

    parsed = [parse_assignment(a) for a in assignments]
    values = {a.key: a.value for a in parsed}
    notes = [
        f"Stored {a.key} as {json.dumps(a.value, ensure_ascii=False)} (typed {a.typed})." for a in parsed if a.changed()
    ]
    _emit_write(
        ctx,
        lambda s: s.set(values, lock=lock_id, command="state set " + " ".join(assignments)[:200]),
        deployment,
        notes=notes,
        extra={"values": values},
    )


@state.command("apply")
@click.argument("deployment")
@click.option("-f", "--file", "path", required=True, help="YAML or JSON file ('-' for stdin); replaces the data.")
@_lock_id
@click.pass_context
def apply(ctx: click.Context, deployment: str, path: str, lock_id: str | None) -> None:
    """Replace the whole state document with a YAML/JSON file, under the lock.

    The lock is checked before the file is parsed; keys must be strings (quote YAML's
    on/off/yes/no and numbers used as keys).

    Example: coordinator state apply payments -f state.yaml
    """
    from coordinator.cli.documents import parse_document, read_document_text

    text = read_document_text(path)
    _emit_write(
        ctx,
        lambda s: s.apply(lambda: parse_document(text, path), lock=lock_id, command=f"state apply -f {path}"),
        deployment,
    )


@state.command("diff")
@click.argument("deployment")
@click.pass_context
def diff(ctx: click.Context, deployment: str) -> None:
    """Per-cluster stamp (token/version/write id) and checksum, against the value a read returns.

    current: holds it; behind: an older stamp (a read or `state sync` repairs it);
    suspect: a token no lease of a majority has seen (`state sync --from` decides);
    conflict: other data under the same stamp (edited by hand); corrupt; absent.

    Example: coordinator state diff payments
    """
    rows = _with_state(ctx, deployment, lambda s: s.diff())

    def text() -> None:
        table(
            ["cluster", "status", "version", "token", "write id", "checksum", "detail"],
            [
                [
                    r["name"],
                    r["status"],
                    r["version"],
                    r["token"],
                    (r["write_id"] or "")[:8],
                    (r["checksum"] or "")[:19],
                    (r["detail"] or "") + (f" (promised {r['promised']})" if r["promised"] else ""),
                ]
                for r in rows
            ],
        )
        for line in diff_summary(rows, deployment):
            say(line)

    emit(ctx, rows, text)


def diff_summary(rows: list[dict[str, Any]], deployment: str) -> list[str]:
    """What `state diff` concludes (coordinator.ops.verdicts.replicas_verdict), in words."""
    from coordinator.ops.verdicts import replicas_verdict

    v = replicas_verdict(rows)
    if v.equal:
        return ["All replicas are equal."]
    if v.empty:
        return ["No replica holds any state yet."]
    lines = []
    if v.behind:
        what = "different data" if v.behind_data_differs else "the same data under older stamps"
        lines.append(
            f"Replicas differ: {', '.join(v.behind)} {'is' if len(v.behind) == 1 else 'are'} behind ({what}); "
            f"the next read or `coordinator state sync {deployment}` repairs them."
        )
    for status, advice in (
        (
            "suspect",
            f"never read or repaired; `coordinator state sync {deployment} --from CLUSTER` adopts or "
            "overwrites them deliberately, under the lock",
        ),
        ("conflict", f"`coordinator state sync {deployment} --from CLUSTER` adopts one deliberately"),
        ("corrupt", f"`coordinator state sync {deployment}` saves and overwrites them"),
        ("newer-schema", "upgrade coordinator"),
    ):
        if v.by_status.get(status):
            lines.append(f"{status.capitalize()}: {', '.join(v.by_status[status])}; {advice}.")
    if v.unread:
        lines.append(f"Not read: {', '.join(v.unread)}; they are not known to be equal.")
    return lines or ["Replicas differ."]


@state.command("sync")
@click.argument("deployment")
@click.option(
    "--backup-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to save replicas before overwriting them (corrupt ones; suspect ones with --from).",
)
@click.option(
    "--from",
    "source",
    default=None,
    metavar="CLUSTER",
    help="Adopt CLUSTER's replica (suspect or not) as a new version on every member, overwriting "
    "suspect replicas; under the lock, with an audit entry.",
)
@_lock_id
@click.pass_context
def sync(ctx: click.Context, deployment: str, backup_dir: str | None, source: str | None, lock_id: str | None) -> None:
    """Bring every reachable replica to the value a read returns (saving corrupt ones first).

    Suspect replicas are left alone; --from CLUSTER adopts one cluster's data deliberately.

    Example: coordinator state sync payments
    """
    folder = Path(backup_dir) if backup_dir else None
    if source is not None:
        _emit_write(
            ctx, lambda s: s.adopt(source, lock=lock_id, backup_dir=folder), deployment, extra={"adopted_from": source}
        )
        return
    out = _with_state(ctx, deployment, lambda s: s.sync(folder))

    def text() -> None:
        say(
            f"Winning version {out['version']} (token {out['token']}, from {out['winner']}); "
            f"repaired: {', '.join(out['repaired']) or 'none'}."
        )
        for k, p in out["saved_corrupt"].items():
            done = "before it was overwritten" if k in out["repaired"] else "(it did not take the value)"
            say(f"Corrupt replica on {k} saved to {p} {done}.")
        for k, why in out["failed"].items():
            say(f"Could not repair {k}: {why}")
        for k, why in out["suspect"].items():
            say(
                f"Suspect replica on {k} left alone: {why}. `coordinator state sync {deployment} --from CLUSTER` "
                "adopts or overwrites it."
            )
        if out["unreachable"]:
            say(f"Not reached: {', '.join(out['unreachable'])}.")

    emit(ctx, out, text)


@state.command("history")
@click.argument("deployment")
@click.pass_context
def history(ctx: click.Context, deployment: str) -> None:
    """Show the audit log kept with the state (who, what, when, from where, which version).

    Example: coordinator state history payments
    """
    entries = _with_state(ctx, deployment, lambda s: s.history())
    docs = [e.model_dump(mode="json") for e in entries]
    emit(
        ctx,
        docs,
        lambda: table(
            ["version", "token", "when", "who", "host", "command", "keys"],
            [
                [
                    e.version,
                    e.token,
                    when(e.at),
                    e.who,
                    e.host,
                    e.command + (f" ({e.note})" if e.note else ""),
                    ",".join(e.keys),
                ]
                for e in entries
            ],
        ),
    )


@state.command("backup")
@click.argument("deployment")
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False), help="File to write.")
@click.pass_context
def backup(ctx: click.Context, deployment: str, path: str) -> None:
    """Write the winning state envelope to a file.

    Example: coordinator state backup payments -f payments-state.json
    """
    env = _with_state(ctx, deployment, lambda s: s.backup(Path(path)))
    emit(
        ctx,
        {"file": path, "version": env.version, "token": env.token},
        lambda: say(f"Saved version {env.version} (token {env.token}) of {deployment} to {path}."),
    )


@state.command("restore")
@click.argument("deployment")
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False), help="Backup file to restore.")
@_lock_id
@click.pass_context
def restore(ctx: click.Context, deployment: str, path: str, lock_id: str | None) -> None:
    """Write a backup's data back as a new version (under the lock, with an audit entry).

    Example: coordinator state restore payments -f payments-state.json
    """
    from coordinator.engine.state import load_backup

    backup = load_backup(Path(path))  # validated before touching any cluster, and read once
    _emit_write(ctx, lambda s: s.restore(Path(path), lock=lock_id, envelope=backup), deployment)
