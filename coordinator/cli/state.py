"""`coordinator state ...`: get, set, apply, diff, sync, history, backup, restore."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from coordinator.cli.output import app_of, dump_document, emit, run, say, table, when
from coordinator.errors import UsageError


def _coordinator(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.api import Coordinator

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


def _parse_assignment(text: str) -> tuple[str, Any]:
    import yaml

    if "=" not in text:
        raise UsageError(f"{text!r} is not KEY=VALUE (for example replicas=3 or app.version=1.2.0).")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise UsageError(f"{text!r} has an empty key; use names like replicas or app.version.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, dict | list):
        # KEY=VALUE sets scalars; structured values come from `state apply -f`.
        value = raw
    return key, value


def _write_text(report: Any) -> None:
    say(
        f"Wrote version {report.version} (token {report.token}) on {len(report.confirmed)} of "
        f"{len(report.results)} clusters (quorum {report.quorum})."
    )
    table(["cluster", "outcome", "detail"], [[k, str(r.outcome), r.detail] for k, r in sorted(report.results.items())])
    if report.lagging:
        say(f"Lagging: {', '.join(report.lagging)}; the next read or `state sync` repairs them.")


def _write_doc(report: Any) -> dict[str, Any]:
    return {
        "deployment": report.deployment,
        "version": report.version,
        "token": report.token,
        "quorum": report.quorum,
        "confirmed": report.confirmed,
        "clusters": [
            {"name": k, "outcome": str(r.outcome), "detail": r.detail} for k, r in sorted(report.results.items())
        ],
    }


def _emit_write(ctx: click.Context, fn: Any, deployment: str) -> None:
    from coordinator.errors import CoordinatorError

    try:
        report = _with_state(ctx, deployment, fn)
    except CoordinatorError as err:
        if err.payload is not None and hasattr(err.payload, "confirmed"):
            emit(
                ctx, _write_doc(err.payload) | {"outcome": "unknown" if err.exit_code == 4 else "refused"}, lambda: None
            )
        raise
    emit(ctx, _write_doc(report), lambda: _write_text(report))


@click.group()
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
    if fmt in ("json", "yaml"):
        click.echo(dump_document(value, fmt))
    elif isinstance(value, dict | list):
        click.echo(dump_document(value, "yaml"))
    else:
        click.echo("" if value is None else (json.dumps(value) if isinstance(value, bool) else str(value)))


@state.command("set")
@click.argument("deployment")
@click.argument("assignments", nargs=-1, required=True)
@_lock_id
@click.pass_context
def set_(ctx: click.Context, deployment: str, assignments: tuple[str, ...], lock_id: str | None) -> None:
    """Set KEY=VALUE pairs (values parsed as YAML scalars) as a new version, under the lock.

    Example: coordinator state set payments replicas=3 app.version=1.2.0 canary=true
    """
    values = dict(_parse_assignment(a) for a in assignments)
    _emit_write(
        ctx, lambda s: s.set(values, lock=lock_id, command="state set " + " ".join(assignments)[:200]), deployment
    )


def _load_document(path: str) -> dict[str, Any]:
    import yaml

    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"Cannot read {path}: {err}.") from err
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(
            f"{path} is neither valid YAML nor JSON{where}: {getattr(err, 'problem', err)}. Nothing was written."
        ) from err
    if not isinstance(doc, dict):
        raise UsageError(f"{path} must hold a mapping at the top level, not {type(doc).__name__}. Nothing was written.")
    try:
        json.dumps(doc)
    except (TypeError, ValueError) as err:
        raise UsageError(
            f"{path} holds values that are not plain data ({err}); use strings, numbers, "
            "booleans, lists and maps. Nothing was written."
        ) from err
    return doc


@state.command("apply")
@click.argument("deployment")
@click.option("-f", "--file", "path", required=True, help="YAML or JSON file ('-' for stdin); replaces the data.")
@_lock_id
@click.pass_context
def apply(ctx: click.Context, deployment: str, path: str, lock_id: str | None) -> None:
    """Replace the whole state document with a YAML/JSON file, under the lock.

    Example: coordinator state apply payments -f state.yaml
    """
    doc = _load_document(path)
    _emit_write(ctx, lambda s: s.apply(doc, lock=lock_id, command=f"state apply -f {path}"), deployment)


@state.command("diff")
@click.argument("deployment")
@click.pass_context
def diff(ctx: click.Context, deployment: str) -> None:
    """Per-cluster version, token and checksum; which replicas are behind or corrupt.

    Example: coordinator state diff payments
    """
    rows = _with_state(ctx, deployment, lambda s: s.diff())

    def text() -> None:
        table(
            ["cluster", "status", "version", "token", "checksum", "detail"],
            [
                [r["name"], r["status"], r["version"], r["token"], (r["checksum"] or "")[:19], r["detail"] or ""]
                for r in rows
            ],
        )
        if all(r["status"] == "current" for r in rows):
            say("All replicas are equal.")

    emit(ctx, rows, text)


@state.command("sync")
@click.argument("deployment")
@click.option(
    "--backup-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to save corrupt replicas before overwriting them.",
)
@click.pass_context
def sync(ctx: click.Context, deployment: str, backup_dir: str | None) -> None:
    """Bring every reachable replica to the winning version (saving corrupt ones first).

    Example: coordinator state sync payments
    """
    out = _with_state(ctx, deployment, lambda s: s.sync(Path(backup_dir) if backup_dir else None))

    def text() -> None:
        say(
            f"Winning version {out['version']} (token {out['token']}, from {out['winner']}); "
            f"repaired: {', '.join(out['repaired']) or 'none'}."
        )
        for k, p in out["saved_corrupt"].items():
            say(f"Corrupt replica on {k} saved to {p} before it was overwritten.")
        for k, why in out["failed"].items():
            say(f"Could not repair {k}: {why}")
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
    from coordinator.state import load_backup

    load_backup(Path(path))  # validate before touching any cluster
    _emit_write(ctx, lambda s: s.restore(Path(path), lock=lock_id), deployment)
