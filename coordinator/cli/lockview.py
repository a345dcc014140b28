"""How the lock commands show what they found: JSON documents for scripts (their shapes
are in the specification) and text for people. No command logic, no cluster access."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from coordinator.cli.output import dump_document, live_line, note, say, table, when
from coordinator.text import printable


def claim_document(claim: Any) -> dict[str, Any] | None:
    """A waiter's claim on the next turn, for scripts."""
    if claim is None:
        return None
    from datetime import UTC, datetime

    try:
        since: datetime | None = datetime.fromtimestamp(claim.since, UTC)
    except (OverflowError, OSError, ValueError):  # a time no datetime holds: not a time
        since = None
    return {"holder": claim.holder or None, "lock_id": claim.lock_id, "waiting_since": since}


def pid_field(info: dict[str, str]) -> int | None:
    from coordinator.rules.lease import pid_of

    return pid_of(info.get("pid"))


def lease_fields(view: Any, next_claim: Any = None) -> dict[str, Any]:
    """Who holds one cluster's lease, as fields (the prose ``detail`` says the same)."""
    if view is None:
        keys = ("holder", "lock_id", "reason", "host", "pid", "acquired_at", "renewed_at", "expires_in_s")
        return {k: None for k in keys} | {"next_in_line": claim_document(next_claim)}
    from coordinator.engine.lock.results import lease_expiry_s

    info = view.info if view.held else {}
    rem = lease_expiry_s(view) if view.held else None
    if next_claim is None and view.live_claim is not None and view.claim_fresh():
        next_claim = view.live_claim
    return {
        "holder": (info.get("holder") or None) if view.held else None,
        "lock_id": view.lock_id,
        "reason": info.get("reason") or None,
        "host": info.get("host") or None,
        "pid": pid_field(info),
        "acquired_at": view.acquired_at if view.held else None,
        "renewed_at": view.renewed_at if view.held else None,
        "expires_in_s": round(rem, 1) if rem is not None else None,
        "next_in_line": claim_document(next_claim),
    }


def acquire_document(result: Any) -> dict[str, Any]:
    from coordinator.engine.fanout import NOT_WAITED_FOR

    return {
        "deployment": result.deployment,
        "lock_id": result.lock_id if result.acquired else None,
        "fencing_token": result.fencing_token if result.acquired else None,
        "holder": result.holder,
        "acquired": result.acquired,
        "clusters": [
            {
                "name": name,
                "outcome": str(r.outcome),
                "detail": r.detail,
                # the lease as this attempt found (or left) it: a refusal names its holder
                **lease_fields(r.value.view if r.value else None, r.extra.get("next")),
            }
            for name in result.members
            for r in [result.results.get(name)]
            if r is not None
        ]
        + [
            # Nobody waited for its answer: it may have answered since. Never "unreachable".
            {"name": name, "outcome": "not-waited-for", "detail": NOT_WAITED_FOR}
            for name in result.members
            if name not in result.results
        ],
        "expires_in_s": round(result.expires_in(), 1) if result.acquired else None,
    }


def acquired_text(result: Any) -> None:
    from coordinator.rules.durations import format_duration

    exp = result.expires_in()
    say(
        f"Locked {result.deployment} as {result.holder}: lock id {result.lock_id}, fencing token "
        f"{result.fencing_token}, on {sum(1 for r in result.results.values() if r.ok)} of "
        f"{len(result.members)} clusters; valid for {format_duration(exp)} unless renewed."
    )
    table(
        ["cluster", "outcome", "detail"],
        [[d["name"], d["outcome"], d["detail"]] for d in acquire_document(result)["clusters"]],
    )
    say(f"Release with: coordinator lock release {result.deployment} --lock-id {result.lock_id}")


def end_live_line() -> None:
    """End the line a waiting acquire kept rewriting (on a terminal only)."""
    if sys.stderr.isatty():
        try:
            sys.stderr.write("\n")
        except (OSError, ValueError):  # a closed stderr ends nothing
            pass


def wait_reporter() -> Any:
    """A live status line on a terminal; a log line now and then otherwise."""
    last = [0.0]
    tty = sys.stderr.isatty()

    def report(result: Any, left: float) -> None:
        from coordinator.ops.verdicts import waiting
        from coordinator.rules.durations import format_duration

        w = waiting(result.results)
        who = (
            f"held by {', '.join(w.holders)}"
            if w.holders
            else f"not taken yet ({', '.join(w.other_outcomes) or 'no answer'})"
        )
        # Short, the most telling first: on a terminal it is cut to one line of its width.
        exp = f", expires in {format_duration(w.expires_in_s)}" if w.expires_in_s is not None else ""
        line = f"waiting for {result.deployment}: {who}{exp}; giving up in {format_duration(left)}"
        now = time.monotonic()
        if tty:
            live_line(line)
        elif now - last[0] >= 10:
            note(line)
            last[0] = now

    return report


def status_document(st: Any) -> dict[str, Any]:
    return {
        "deployment": st.deployment,
        "namespace": st.namespace,
        "quorum": st.quorum,
        "holder": st.holder,
        "lock_id": st.lock_id,
        "fencing_token": st.fencing_token,
        "held_by_majority": st.held_by_majority,
        "expires_in_s": st.expires_in_s,
        # who holds it, in fields
        "reason": (st.info.get("reason") or None) if st.held_by_majority else None,
        "host": (st.info.get("host") or None) if st.held_by_majority else None,
        "pid": pid_field(st.info) if st.held_by_majority else None,
        "command": (st.info.get("command") or None) if st.held_by_majority else None,
        "renewed_ago_s": st.renewed_ago_s,
        "next_in_line": claim_document(st.next_in_line),
        # held, unknown (someone may hold it: the members seen do not decide), partly-held, free
        "status": st.verdict,
        "possible_holders": [
            {"holder": p.holder, "lock_id": p.lock_id, "clusters": list(p.clusters)} for p in st.possible
        ]
        + (
            [{"holder": None, "lock_id": None, "clusters": [*st.unobserved, *st.unnamed]}] if st.possible_unseen else []
        ),
        "clusters": [
            {
                "name": r.name,
                "status": r.status,
                "holder": r.holder,
                "lock_id": r.lock_id,
                "token": r.token,
                "acquired_at": r.acquired_at,
                "renewed_at": r.renewed_at,
                "ttl_s": r.ttl_s,
                "transitions": r.transitions,
                "error": r.error,
                "reason": (r.info.get("reason") or None) if r.lock_id else None,
                "host": (r.info.get("host") or None) if r.lock_id else None,
                "pid": pid_field(r.info) if r.lock_id else None,
                "command": (r.info.get("command") or None) if r.lock_id else None,
                "renewed_ago_s": r.renewed_ago_s,
                "expires_in_s": round(r.remaining_s, 1) if r.remaining_s is not None else None,
            }
            for r in st.clusters
        ],
    }


def status_text(st: Any, wide: bool = False) -> None:
    """A lock's status for people; ``wide`` (-o wide) adds each lease's lock id and fencing
    token, which tell two holders' leases apart."""
    from coordinator.ops.verdicts import status_verdict
    from coordinator.rules.durations import format_duration

    if st.held_by_majority:
        info = st.info
        say(
            f"{st.deployment} is LOCKED by {st.holder} (lock {st.lock_id}, token {st.fencing_token}, "
            f"host {info.get('host', '?')}, pid {info.get('pid', '?')}, reason: {info.get('reason') or '-'}); "
            f"majority held for {format_duration(st.expires_in_s or 0)} more unless renewed."
        )
        # What a break decision needs: is the holder still renewing, and what is it running?
        taken = next((r.acquired_at for r in st.clusters if r.lock_id == st.lock_id and r.acquired_at), None)
        renewed = f"last renewed {ago(st.renewed_ago_s)}" if st.renewed_ago_s is not None else "renewal time unknown"
        say(f"Taken {when(taken)}, {renewed}; command: {info.get('command') or '-'}")
    elif st.verdict == "unknown":
        verdict = status_verdict(st)
        say(
            f"{st.deployment}: UNKNOWN whether it is held. It may be held by {verdict.who_may_hold()}: "
            f"{verdict.why_undecided()}, and a majority of {st.quorum} may include them."
        )
    else:
        unseen = status_verdict(st).not_seen
        extra = f" ({', '.join(unseen)} could not be observed)" if unseen else ""
        held = " (live leases, but no lock id can hold a majority)" if st.verdict == "partly-held" else ""
        say(f"{st.deployment} is not held by a majority of {st.quorum}{held}{extra}.")
    if st.next_in_line is not None:
        say(f"Next in line: {st.next_in_line.holder or '?'} (lock {st.next_in_line.lock_id}), waiting longest.")
    more = ["lock id", "token"] if wide else []
    table(
        ["cluster", "status", "holder", *more, "renewed", "expires", "ttl", "since", "detail"],
        [
            [
                r.name,
                r.status,
                r.holder or "-",
                *([r.lock_id or "-", "-" if r.token is None else r.token] if wide else []),
                ago(r.renewed_ago_s) if r.renewed_ago_s is not None else "-",
                f"in {format_duration(r.remaining_s)}" if r.remaining_s is not None else "-",
                f"{r.ttl_s}s" if r.ttl_s and r.status != "free" else "-",
                when(r.acquired_at) if r.acquired_at else "-",
                r.error or "",
            ]
            for r in st.clusters
        ],
    )


def ago(seconds: float) -> str:
    """``12s ago``, ``4m10s ago``: how long ago, in whole seconds (the stamps it comes from
    have no finer resolution)."""
    from coordinator.rules.durations import format_duration

    whole = round(max(seconds, 0.0))
    return f"{whole}s ago" if whole < 60 else f"{format_duration(whole)} ago"


def _maybe(entry: Any) -> str:
    """The holder column of a fleet row no majority decides: who may hold it, with a "?"."""
    if entry.status == "held":
        return "?"
    if entry.status != "unknown":
        return "-"
    return " or ".join([*entry.possible, *(["unseen"] if entry.possible_unseen else [])]) + "?"


def lock_names(fleet: Any) -> list[str]:
    """-o name of the fleet view: the lock of each deployment shown, held or free."""
    return [f"lock/{e.deployment}" for e in fleet.deployments]


def fleet_text(fleet: Any) -> None:
    from coordinator.rules.durations import format_duration

    held = sum(1 for e in fleet.deployments if e.status == "held")
    say(f"{len(fleet.deployments)} deployment(s), {held} locked.")
    table(
        # Free text (the reason) last: on a terminal a line is cut at its width.
        [
            "deployment",
            "namespace",
            "status",
            "holder",
            "expires",
            "renewed",
            "next in line",
            "unseen",
            "since",
            "reason",
        ],
        [
            [
                e.deployment + ("" if e.imported else " *"),
                e.namespace,
                e.status,
                e.holder or _maybe(e),
                f"in {format_duration(e.expires_in_s)}" if e.expires_in_s is not None else "-",
                ago(e.renewed_ago_s) if e.renewed_ago_s is not None else "-",
                (e.next_in_line.holder or e.next_in_line.lock_id) if e.next_in_line else "-",
                ", ".join(e.unseen) or "-",
                when(e.since) if e.since else "-",
                e.reason or "-",
            ]
            for e in fleet.deployments
        ],
    )
    for e in fleet.deployments:
        if not e.imported:
            say(f"* {e.deployment} ({e.namespace}): not imported: `{e.import_hint}`")
    if fleet.unseen_clusters:
        say(
            "Could not list: "
            + "; ".join(f"{c} ({fleet.clusters[c]})" for c in fleet.unseen_clusters)
            + ". Their deployments may be missing above; nothing there is assumed free."
        )


def print_watch_round(fmt: str, doc: Any, text: Any, names: list[str]) -> None:
    """One round of a ``--watch`` (``names`` for -o name); a watch whose reader went away
    ends (exit 0)."""
    _print_round(fmt, doc, text, names)
    sys.stdout.flush()
    end_if_reader_gone()


def end_if_reader_gone() -> None:
    """End a ``--watch`` (exit 0, as a closed stdout ends any command) once whoever read
    it went away (``| head -1``), whether or not it had more to print."""
    from coordinator.cli.output import reader_gone

    if reader_gone():
        import errno

        raise BrokenPipeError(errno.EPIPE, "the reader of the watch went away")


def _print_round(fmt: str, doc: Any, text: Any, names: list[str]) -> None:
    if fmt.startswith("jsonpath="):
        from coordinator.cli.output import render_document

        # One line per round, whatever the template's own ending.
        click.echo(render_document(doc, fmt))
    elif fmt == "name":
        for name in names:
            click.echo(printable(name))
    elif fmt == "json":
        import json

        from coordinator.cli.output import to_jsonable

        click.echo(json.dumps(to_jsonable(doc)))
    elif fmt == "yaml":
        click.echo("---\n" + dump_document(doc, "yaml"))
    else:
        from datetime import UTC, datetime

        say(f"--- {datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%SZ')}")
        text()
