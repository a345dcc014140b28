"""The texts a person reads about the lock: why it could not be had, who holds a lease."""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime

from coordinator import clock
from coordinator.engine.fanout import ANSWERED, NOT_WAITED_FOR, ClusterResult
from coordinator.engine.lock.results import AcquireResult, ClusterLease, lease_expiry_s
from coordinator.rules.durations import format_duration
from coordinator.rules.evidence import RECORD_GONE_HOW, Writer
from coordinator.rules.lease import DEFAULT_MAX_TTL_S, HANDOFF_GRACE_S, LeaseView, TurnClaim
from coordinator.rules.outcome import Outcome
from coordinator.rules.quorum import majority_expiry
from coordinator.text import printable


def next_expiry(result: AcquireResult, max_ttl_s: float = DEFAULT_MAX_TTL_S, max_server_skew_s: float = 0.0) -> float:
    """Seconds until the soonest lease held by another could expire (a wake-up hint),
    by the Date hint with the margin a take waits out (the deployment's maximum TTL where
    the lease's own TTL is not believed, and the server-skew allowance): counted without
    them, a waiter retried every 0.05 s, probing each time, until the margin had passed."""
    hints = []
    for r in result.results.values():
        if r.outcome is Outcome.HELD_BY_OTHER and r.value and r.value.view:
            view = r.value.view
            if r.value.action == "reserved":
                rem = view.reserved_left_s()
            else:
                rem = view.remaining_hint(max_ttl_s, max_server_skew_s) if view.held else None
            if rem is not None:
                hints.append(max(0.05, rem + 0.05))
    return min(hints) if hints else 2.0


def first_in_line(views: Iterable[LeaseView], lock_id: str, mine: TurnClaim | None) -> TurnClaim | None:
    """The earliest binding claim among ``views`` by a waiter before us, if any."""
    return min((c for v in views if (c := v.binding_claim(lock_id, mine)) is not None), default=None)


def reserved_detail(claim: TurnClaim) -> str:
    # Holder and lock id are text of whoever wrote the lease: escaped here, where they
    # enter a paragraph whose own line breaks are kept when it is printed.
    who = printable(claim.holder or "another contender")
    return (
        f"free, but the next turn is {who}'s (lock {printable(claim.lock_id)}), who has waited longer; "
        f"the turn passes to the next waiter if it is not taken within {HANDOFF_GRACE_S:.0f}s"
    )


def holder_field_why(view: LeaseView) -> str:
    """Why a holder field that is not coordinator's word is not: another client wrote or
    removed it, or the record of who wrote it is gone (coordinator.rules.evidence.Writer)."""
    if view.holder_writer is Writer.OTHER:
        return "another client edited the holder field"
    return f"the record of who wrote the holder field is gone ({RECORD_GONE_HOW})"


# What a person reads of a lease the young-copy rule holds (lease.copy_standing).
COPY_WHY = (
    "the lease is not known to be the object coordinator wrote (its coordinator.io/uid note is missing, "
    "names another object, or has no known writer: a lease recreated from a copy looks the same)"
)


def copy_note(max_ttl_s: float) -> str:
    return (
        f"{COPY_WHY}, so it counts as held by an unknown holder until a maximum TTL ({max_ttl_s:.0f}s) after "
        "its creation"
    )


def held_detail(view: LeaseView, max_ttl_s: float = DEFAULT_MAX_TTL_S) -> str:
    if not view.exists or (view.vanished and not view.held):
        rem = view.remaining_hint(max_ttl_s) if view.exists else None
        tail = f"; free in about {max(rem, 0):.0f}s" if rem is not None else ""
        return (
            "the lease was deleted, so it counts as held by an unknown holder until a maximum TTL "
            f"({max_ttl_s:.0f}s) has passed since it was found missing{tail}"
        )
    if view.holder_edited:
        rem = view.remaining_hint(max_ttl_s)
        tail = f"; free in about {max(rem, 0):.0f}s" if rem is not None else ""
        says = f" (it now says {printable(view.claimed)[:80]!r})" if view.claimed else ""
        until = (
            f"until coordinator's last write here is a TTL old{tail}"
            if view.own_write is not None
            else "until seen unchanged for a maximum TTL (no write of coordinator's is on record here)"
        )
        return (
            f"{holder_field_why(view)}{says}, so it counts as held by an unknown holder {until}; use "
            "`coordinator lock break`, not kubectl, to free a lock"
        )
    if not view.held and not view.verified:
        return copy_note(max_ttl_s)
    # Holder and lock id are text of whoever wrote the lease: escaped where they enter
    # the paragraph (errors keep their own line breaks when printed).
    who = printable(str(view.info.get("holder") or "an unknown holder"))
    lock = printable(str(view.lock_id))
    if view.own_write is None:
        return (
            f"held by {who} (lock {lock}), expiry unknown: the lease carries no write of coordinator's "
            "own on record (managedFields stripped, or merged by the API server into ancient-changes), so it "
            "counts as held until seen unchanged for a whole TTL"
        )
    rem = lease_expiry_s(view, max_ttl_s)
    tail = f", expires in {format_duration(rem)} unless renewed" if rem is not None else ""
    return f"held by {who} (lock {lock}){tail}"


def lock_expiry(remaining: list[float], members: int) -> float | None:
    """When a lock seen on these leases stops holding: with a majority of ``members``, when
    it no longer has one (as `lock status` counts it); on fewer, when its last lease here
    runs out. Never below zero."""
    if not remaining:
        return None
    end = majority_expiry(remaining, members)
    return max(0.0, end if end is not None else max(remaining))


def summarize(results: dict[str, ClusterResult[ClusterLease]]) -> str:
    return ", ".join(f"{k}: {r.outcome}" for k, r in sorted(results.items()))


def identity_report(bad: dict[str, ClusterResult[ClusterLease]]) -> str:
    parts = [f"cluster {name!r}: {r.detail}" for name, r in sorted(bad.items())]
    return (
        "Cluster identity mismatch — nothing was written to these clusters: "
        + "; ".join(parts)
        + ". A kubeconfig context was pointed at another cluster. Fix the context, or if "
        "the cluster was really rebuilt, run `coordinator cluster disconnect NAME --force` "
        "and connect it again."
    )


def _fmt_time(when: datetime | None) -> str:
    if when is None:
        return "?"
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def acquire_report(result: AcquireResult) -> str:
    """The paragraph a person reads when the lock could not be had."""
    from coordinator.rules.durations import format_duration

    n = len(result.members)
    got = [k for k, r in result.results.items() if r.ok]
    # Clusters that say the same are one line: "c1, c2, c3: held by alice (...)". A lease
    # held by a named holder is keyed by who holds it, its lock and since when; the line
    # then gives the latest renewal and the lock's expiry over those clusters.
    said: dict[tuple[str, ...], list[str]] = {}
    leases: dict[tuple[str, ...], list[LeaseView]] = {}
    holders: dict[str, list[str]] = {}
    reserved: dict[str, list[str]] = {}
    unseen: list[str] = []
    for name in result.members:
        r = result.results.get(name)
        if r is None:
            said.setdefault(("line", NOT_WAITED_FOR), []).append(name)
            continue
        v = r.value.view if r.value else None
        if r.outcome is Outcome.HELD_BY_OTHER and r.value is not None and r.value.action == "reserved":
            said.setdefault(("line", r.detail), []).append(name)
            claim = r.extra.get("next")
            who = claim.holder if isinstance(claim, TurnClaim) else ""
            reserved.setdefault(who or "another contender", []).append(name)
        elif r.outcome is Outcome.HELD_BY_OTHER and v is not None and (v.vanished or not v.exists or not v.held):
            said.setdefault(("line", r.detail), []).append(name)
            if not v.exists or v.vanished:
                why = "deleted lease"
            elif v.holder_edited:
                why = "holder field edited" if v.holder_writer is Writer.OTHER else "record of the holder's writer gone"
            else:
                why = "lease not known to be coordinator's own object"
            holders.setdefault(f"an unknown holder ({why})", []).append(name)
        elif r.outcome is Outcome.HELD_BY_OTHER and v is not None:
            who = v.info.get("holder") or "?"
            held: tuple[str, ...] = (
                "held",
                who,
                v.info.get("host") or "?",
                v.info.get("pid") or "?",
                str(v.lock_id),
                v.info.get("reason") or "no reason given",
                _fmt_time(v.acquired_at),
            )
            said.setdefault(held, []).append(name)
            leases.setdefault(held, []).append(v)
            holders.setdefault(who, []).append(name)
        else:
            said.setdefault(("line", f"{r.outcome} — {r.detail}"), []).append(name)
            if not r.outcome.observable and not r.extra.get(ANSWERED):
                unseen.append(name)
    lines = []
    for said_key, names in said.items():
        if said_key[0] != "held":
            lines.append(f"{', '.join(names)}: {said_key[1]}")
            continue
        _, who, host, pid, lock, why, since = said_key
        views = leases[said_key]
        renewed = max((v.renewed_at for v in views if v.renewed_at is not None), default=None)
        rem = lock_expiry([x for v in views if (x := lease_expiry_s(v)) is not None], n)
        until = f"expires in {format_duration(rem)}" if rem is not None else "expiry unknown"
        lines.append(
            f"{', '.join(names)}: held by {who} (host {host}, pid {pid}, lock {lock}, reason: {why}) "
            f"since {since}, renewed {_fmt_time(renewed)}, {until}"
        )
    head = (
        f"Could not lock deployment {result.deployment!r}: a majority of {result.quorum} of "
        f"{n} clusters is needed, this attempt got {len(got)}"
        + (f" ({', '.join(got)}), which were released again" if got else "")
        + ". "
    )
    advice = []
    running: int | None = None
    if result.holder in holders:
        # The asker holds it already (under another lock id): not a lock to wait for or
        # to ask anyone about, but one to work under by its id, or to release.
        ids = sorted(
            {v.lock_id for vs in leases.values() for v in vs if v.lock_id and v.info.get("holder") == result.holder}
        )
        lid = ids[0] if len(ids) == 1 else "LOCK_ID"
        dep = result.deployment
        running = _running_here(
            v.info for vs in leases.values() for v in vs if v.lock_id in ids and v.info.get("holder") == result.holder
        )
    if result.holder in holders and running is not None:
        # Another live process on this machine holds it under the same name (a `lock run`,
        # another CI job on this runner): its lock is not this process's to work under or
        # to release, so its id is not offered for that.
        advice.append(
            f"{result.holder} already holds this lock (lock {', '.join(ids) or '?'}, on "
            f"{', '.join(holders[result.holder])}), taken by process {running} on this machine, which is "
            "still running: it is that process's lock, not this one's. Wait for it with --wait, or give each "
            "job a holder name of its own (--holder, COORDINATOR_HOLDER)."
        )
        holders = {h: cs for h, cs in holders.items() if h != result.holder}
    elif result.holder in holders:
        advice.append(
            f"{result.holder} already holds this lock (lock {', '.join(ids) or '?'}, on "
            f"{', '.join(holders[result.holder])}): take it once and work under it by its lock id, e.g. "
            f"`coordinator state set {dep} KEY=VALUE --lock-id {lid}` or `coordinator lock run {dep} --lock-id "
            f"{lid} -- CMD`, renew it with `coordinator lock renew {dep} --lock-id {lid}`, and release it with "
            f"`coordinator lock release {dep} --lock-id {lid}` (also if it is a leftover of a process that is gone)."
        )
        holders = {h: cs for h, cs in holders.items() if h != result.holder}
    if holders:
        who = ", ".join(f"{h} on {', '.join(cs)}" for h, cs in holders.items())
        views = [r.value.view for r in result.results.values() if r.value and r.value.view]
        first = first_in_line(views, result.lock_id, None)
        line = (
            f" {first.holder or 'Another contender'} is already waiting and is next in line; --wait "
            "queues you behind everyone who began waiting earlier."
            if first is not None
            else ""
        )
        advice.append(
            f"It is held by {who}.{line} Wait for it with --wait 5m, ask the holder to release "
            f"it, or if the holder is gone for good, run `coordinator lock break {result.deployment}`."
        )
    if reserved:
        who = ", ".join(f"{h} on {', '.join(cs)}" for h, cs in reserved.items())
        advice.append(
            f"It was just freed and is being handed to the contender that waited longest ({who}); "
            f"waiters take turns in the order they began waiting. Wait for your turn with --wait."
        )
    if unseen:
        advice.append(
            f"Could not observe {', '.join(unseen)}; an unobservable cluster is never counted "
            f"as free. Check `coordinator cluster info NAME` for reachability and permissions."
        )
    # One line per cluster: a line break in what the clusters say (holder, reason, a
    # server's message) must not pass for a line of this report.
    return head + "Per cluster:\n" + "".join(f"  {printable(line)}\n" for line in lines) + printable(" ".join(advice))


def _running_here(infos: Iterable[dict[str, str]]) -> int | None:
    """The pid of a process on this machine, other than this one, that the lease notes
    name as the taker and that is still alive; None if there is none."""
    for info in infos:
        try:
            pid = int(info.get("pid") or "")
        except ValueError:
            continue
        if info.get("host") != clock.host() or pid == clock.pid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except OSError:
            pass  # alive, another user's
        return pid
    return None
