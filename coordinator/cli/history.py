"""`coordinator lock history DEPLOYMENT`: who held the lock, from when to when, how it ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import click

from coordinator.cli.base import Command
from coordinator.cli.output import app_of, emit, note, run, say, table


def _since(value: str | None) -> datetime | None:
    """``--since``: a duration back from now (``2h``, ``30m``) or a UTC time
    (``2026-12-01T02:10:00Z``)."""
    if value is None:
        return None
    from coordinator.rules.resources import parse_time

    when = parse_time(value.strip()) if any(c in value for c in "-:T") else None
    if when is not None:
        return when
    from coordinator.rules.durations import parse_duration

    return datetime.now(UTC) - timedelta(seconds=parse_duration(value, what="--since"))


def select(tenures: list[Any], *, since: datetime | None, limit: int | None) -> list[Any]:
    """The tenures that overlap ``since`` .. now (an unended one always does), the last
    ``limit`` of them."""
    if since is not None:
        tenures = [t for t in tenures if t.until is None or t.until >= since]
    if limit is not None:
        tenures = tenures[-limit:] if limit > 0 else []
    return tenures


def _ended(t: Any) -> str:
    if t.ended is None:
        return "held or not known to have ended"
    if t.ended == "expired":
        return f"expired (seen by {t.by or '?'})"
    if t.ended == "broken":
        return f"broken by {t.by or '?'}"
    if t.ended == "lost":
        return "lost (taken over or broken)"
    return str(t.ended)


def _time(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


@click.command("history", cls=Command)
@click.argument("deployment")
@click.option("--since", default=None, help="Only tenures that had not ended by then: a duration (2h) or a UTC time.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Only the last N tenures.")
@click.pass_context
def history(ctx: click.Context, deployment: str, since: str | None, limit: int | None) -> None:
    """Who held the lock, from when to when, and how it ended.

    Read from every member cluster (each keeps a copy of the last 100 holders) and merged,
    so a member that was down while something was recorded loses nothing. Endings:
    released; broken by whom; expired, as seen by the next holder when it took the lease
    over (the lease had run out by then, at a time nobody can state exactly); lost, as
    the holder saw when a renewal found the lock taken or broken.

    Exits 4 (after printing) when fewer than a majority of the members could be read:
    what is shown may then miss entries.

    \b
    Examples:
      coordinator lock history payments
      coordinator lock history payments --since 2026-12-01T02:00:00Z --limit 5
      coordinator lock history payments -o json
    """
    from coordinator.ops.api import Coordinator
    from coordinator.ops.verdicts import history_verdict

    start = _since(since)
    app = app_of(ctx)
    c = Coordinator.from_config(app.config_path, timeout=app.timeout)

    async def go() -> Any:
        async with c:
            return await c.lock_history(deployment)

    found, results = run(go)
    shown = select(found, since=start, limit=limit)
    verdict = history_verdict(deployment, c.config.deployments[deployment].clusters, results)
    members, unread = verdict.members, verdict.unread
    doc = {
        "deployment": deployment,
        "tenures": [t.to_json() for t in shown],
        "clusters": [
            {
                "name": name,
                "read": name in results and results[name].ok,
                "events": results[name].value if name in results and results[name].ok else None,
                "detail": unread.get(name),
            }
            for name in members
        ],
    }

    def text() -> None:
        say(
            f"{len(shown)} holder(s) of the lock of {deployment}"
            + (f" (of {len(found)} kept)" if shown != found else "")
        )
        table(
            ["from", "to", "holder", "lock id", "token", "reason", "ended", "note"],
            [
                [
                    _time(t.since) if t.since else "(not recorded)",
                    _time(t.until),
                    t.holder or "?",
                    t.lock_id,
                    t.token if t.token is not None else "-",
                    t.reason or "-",
                    _ended(t),
                    t.note or "",
                ]
                for t in shown
            ],
        )

    emit(ctx, doc, text)
    if unread:
        note(
            "Could not read the history on "
            + "; ".join(f"{k} ({v})" for k, v in unread.items())
            + ": entries recorded only there are missing above."
        )
    if (problem := verdict.problem()) is not None:
        raise problem
