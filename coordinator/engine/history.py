"""The lock's history: who held a deployment's lock, from when to when, and how it ended.

Where it lives: one ConfigMap per deployment, ``coordinator-history-<deployment>``, beside
the Lease and the state object in the deployment's namespace, on every member cluster. Its
``data["history.json"]`` is a JSON list of events, each naming a lock id and what happened
to it:

- ``acquired``: by the holder, once the lock was taken on a majority (holder, host, pid,
  reason, fencing token);
- ``released``: by the holder, once its release reached a majority;
- ``broken``: by whoever ran ``lock break`` (``by``, reason), for the lock id it cleared;
- ``expired``: by the next holder, for the lock id whose lease it took over because it had
  lapsed, dated when the taker observed that (the lease ran out some time before: the
  lapse is judged as the lock judges it, never from the previous holder's clock);
- ``lost``: by the holder, when a renewal found its lease held by another lock id or broken,
  or so many of its leases no longer its own that a majority could not be renewed.

Why a ConfigMap of its own and not an annotation of the Lease or the state object: both of
those are written by compare-and-swap on their ``resourceVersion``; an extra writer would
make lock takers and state writers lose races and retry, so history could slow down or
perturb the lock. A separate object takes no part in the lock's decisions. It is granted by
name like the other objects (see coordinator/ops/rbac.py).

What this module promises, and what it does not:

- Recording never stands in the lock's way. The engine hands events over only after a
  decision (taken, released, broken, lost) has been made and its lease writes are done,
  usually to a background task; each member's copy is a read-merge-write bounded by the
  per-cluster timeout; a failure is logged as a warning and never turns a command's
  success into an error.
- Every member keeps a copy; a reader merges the copies it can read, keeping each
  (lock id, event) once. A member that was down while an event was recorded simply lacks
  it; the others have it. Copies are not repaired by reading.
- Bounded: the events of the last :data:`LIMIT` lock ids are kept (and strings cut to
  :data:`MAX_TEXT`), far below the 1 MiB object limit.
- The text comes from whoever may write a ConfigMap in the namespace: malformed entries
  are dropped, and people see it only through :func:`coordinator.text.printable`.
- Who may write it: ``deployment create`` makes an empty copy on every member, so that
  someone allowed only to *create* ConfigMaps (a right Kubernetes cannot limit by name)
  finds the name taken. A copy whose data no coordinator field manager wrote (per its
  managedFields) is not read, and is replaced by the next event recorded there (deleted
  and created again, by uid, where it refuses updates: one made ``immutable``); events
  dated further ahead of the API server's time than :data:`MAX_FUTURE_S` are not read
  and not counted in the bound, so that no planted event can pass for the newest and
  push the real ones out of the bounded list. Writers keep them all the same: "ahead"
  depends on a clock, and a writer whose clock is behind must not erase what others
  recorded. Whoever may
  *update* the ConfigMap (those granted the deployment) can still rewrite it, under any
  field manager: a record for people, not evidence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, TypeAlias, assert_never

from coordinator import clock
from coordinator.engine import cas
from coordinator.engine.clusters import ClusterSet, failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules.evidence import with_records
from coordinator.rules.lease import LeaseView
from coordinator.rules.membership import is_ours
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import (
    ANNOTATION_PREFIX,
    FIELD_MANAGER,
    canonical_time,
    configmaps_path,
    history_name,
    micro_time,
    owned_metadata,
)

log = get_logger(__name__)

LIMIT = 100  # lock ids whose events are kept, the newest
MAX_TEXT = 256  # characters kept of any string field
MAX_LOCK_ID = 64
DATA_KEY = "history.json"
NOTE_ANNOTATION = ANNOTATION_PREFIX + "note"
NOTE = "managed by coordinator: the lock's history (`coordinator lock history`); do not edit"
WRITE_RETRIES = 4
# How far ahead of the API server's clock (the Date of the read) an event may be dated
# and still be read: the writers' clocks may be off (minutes), a planted event dated in
# the year 9000 is not.
MAX_FUTURE_S = 15 * 60

ACQUIRED = "acquired"
RELEASED = "released"
BROKEN = "broken"
EXPIRED = "expired"
LOST = "lost"
EVENTS = (ACQUIRED, RELEASED, BROKEN, EXPIRED, LOST)
# Which end a tenure is shown with when more than one was recorded for it: what the
# holder or an admin did beats what another party inferred.
END_PRIORITY = (BROKEN, RELEASED, EXPIRED, LOST)
_TEXT_FIELDS = ("holder", "host", "pid", "reason", "by", "note")


def history_path(namespace: str, deployment: str) -> str:
    return f"{configmaps_path(namespace)}/{history_name(deployment)}"


def now_text() -> str:
    return micro_time(clock.wall_now())


def event(kind: str, lock_id: str, *, at: str | None = None, token: int | None = None, **text: str) -> dict[str, Any]:
    """One event as stored; empty fields are left out."""
    found: dict[str, Any] = {"lock_id": lock_id, "event": kind, "at": at or now_text()}
    if token is not None:
        found["token"] = token
    for key in _TEXT_FIELDS:
        value = text.get(key)
        if value:
            found[key] = str(value)[:MAX_TEXT]
    return found


# ------------------------------------------------------------------ what the engine saw


def _sorted_views(views: Mapping[str, LeaseView]) -> list[tuple[str, LeaseView]]:
    return sorted(views.items())


def take_events(
    lock_id: str,
    *,
    holder: str,
    host: str,
    pid: str,
    reason: str,
    token: int | None,
    lapsed: Mapping[str, LeaseView],
) -> list[dict[str, Any]]:
    """A lock taken on a majority: its ``acquired`` event, and ``expired`` for every other
    lock id whose lapsed lease it took over (``lapsed``: per cluster, the lease as read
    before the take). The expiry is dated now, when the taker saw it: the lease had run
    out by the lock's own rules some time before, which nobody can date exactly."""
    now = now_text()
    found = [event(ACQUIRED, lock_id, at=now, token=token, holder=holder, host=host, pid=pid, reason=reason)]
    seen: dict[str, list[str]] = {}
    views: dict[str, LeaseView] = {}
    for cluster, view in _sorted_views(lapsed):
        if view.lock_id and view.lock_id != lock_id:
            seen.setdefault(view.lock_id, []).append(cluster)
            views.setdefault(view.lock_id, view)
    for previous, clusters in seen.items():
        view = views[previous]
        last = f"last renewed {micro_time(view.renewed_at)}" if view.renewed_at else "never renewed"
        found.append(
            event(
                EXPIRED,
                previous,
                at=now,
                token=view.token or None,
                holder=view.info.get("holder", ""),
                host=view.info.get("host", ""),
                pid=view.info.get("pid", ""),
                reason=view.info.get("reason", ""),
                by=holder,
                note=f"lease found lapsed and taken over on {', '.join(clusters)} ({last}, TTL {view.ttl_s}s)",
            )
        )
    return found


def release_events(lock_id: str, released: Mapping[str, LeaseView]) -> list[dict[str, Any]]:
    """A release that reached a majority (``released``: the leases as read before)."""
    holder = next((v.info.get("holder", "") for _, v in _sorted_views(released) if v.info.get("holder")), "")
    token = next((v.token for _, v in _sorted_views(released) if v.token), None)
    return [event(RELEASED, lock_id, token=token, holder=holder, by=holder)]


def break_events(*, by: str, reason: str, cleared: Mapping[str, LeaseView]) -> list[dict[str, Any]]:
    """A break: one ``broken`` event per lock id it cleared (``cleared``: leases as read)."""
    now = now_text()
    found: dict[str, dict[str, Any]] = {}
    for cluster, view in _sorted_views(cleared):
        if not view.lock_id:
            continue
        e = found.get(view.lock_id)
        if e is None:
            found[view.lock_id] = event(
                BROKEN,
                view.lock_id,
                at=now,
                token=view.token or None,
                holder=view.info.get("holder", ""),
                host=view.info.get("host", ""),
                pid=view.info.get("pid", ""),
                reason=view.info.get("reason", ""),
                by=by,
                note=(f"break reason: {reason}; " if reason else "") + f"cleared on {cluster}",
            )
        else:
            e["note"] = (e["note"] + f", {cluster}")[:MAX_TEXT]
    return list(found.values())


def lost_events(lock_id: str, *, holder: str, token: int | None, why: str) -> list[dict[str, Any]]:
    """A renewal found the lock taken by another lock id, broken, or no longer its own on a majority."""
    return [event(LOST, lock_id, token=token, holder=holder, by=holder, note=why)]


# ------------------------------------------------------------------ pure: decode, merge


def clean(raw: Any) -> dict[str, Any] | None:
    """``raw`` as a well-formed event, or None. Anyone who may write a ConfigMap in the
    namespace may have written it: every field is checked, strings are cut short."""
    if not isinstance(raw, dict):
        return None
    lock_id, kind, at = raw.get("lock_id"), raw.get("event"), raw.get("at")
    if not isinstance(lock_id, str) or not 0 < len(lock_id) <= MAX_LOCK_ID or kind not in EVENTS:
        return None
    if not isinstance(at, str) or (when := canonical_time(at)) is None:
        return None
    token = raw.get("token")
    if token is not None and (isinstance(token, bool) or not isinstance(token, int) or token < 0):
        token = None
    # What event(kind, lock_id, at=..., token=..., **the string fields) makes, built in
    # place: every read of a copy cleans each of its hundreds of events.
    found: dict[str, Any] = {"lock_id": lock_id, "event": kind, "at": when[0]}
    if token is not None:
        found["token"] = token
    for key in _TEXT_FIELDS:
        value = raw.get(key)
        if value and isinstance(value, str):
            found[key] = value[:MAX_TEXT]
    return found


def written_by_us(obj: Mapping[str, Any]) -> bool:
    """Did a coordinator field manager write this copy's events (per its managedFields)?"""
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(entry, dict) or not is_ours(str(entry.get("manager") or "")):
            continue
        data = (entry.get("fieldsV1") or {}).get("f:data")
        if isinstance(data, dict) and f"f:{DATA_KEY}" in data:
            return True
    return False


def stored(obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every well-formed event stored in one history ConfigMap, whenever it is dated:
    none when it is absent, unreadable or not written by coordinator."""
    if not obj or not written_by_us(obj):
        return []
    data = obj.get("data") or {}
    raw = data.get(DATA_KEY) if isinstance(data, dict) else None
    if not isinstance(raw, str):
        return []
    # Events are flat dicts of strings and numbers: a copy of each is the caller's own.
    found = _stored_events(raw) if len(raw) <= _REMEMBERED_TEXT else _stored_events.__wrapped__(raw)
    return [dict(e) for e in found]


# Copies read again and again (every append reads the copy it merges into, and each
# member's copy changes only when an event is added) are decoded and cleaned once per
# text: the text is all the result depends on. Only texts of the size the bound keeps
# them to are remembered, so that text from the clusters cannot make the cache large.
_REMEMBERED_TEXT = 256 * 1024


@lru_cache(maxsize=32)
def _stored_events(raw: str) -> tuple[dict[str, Any], ...]:
    try:
        loaded = json.loads(raw)
    except (ValueError, RecursionError):  # garbage, or nested too deep to decode
        return ()
    if not isinstance(loaded, list):
        return ()
    return tuple(e for e in (clean(item) for item in loaded) if e is not None)


def _latest(now: datetime | None) -> datetime:
    return (now or clock.wall_now()) + timedelta(seconds=MAX_FUTURE_S)


def decode(obj: Mapping[str, Any] | None, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """The events of one history ConfigMap that a reader shows: :func:`stored`, without
    those dated more than :data:`MAX_FUTURE_S` after ``now`` (the API server's time of
    the read; this machine's clock when it sent none)."""
    latest = _latest(now)
    return [e for e in stored(obj) if _when(e) <= latest]


def merge_for_write(
    have: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    *,
    now: datetime | None = None,
    have_clean: bool = False,
) -> list[dict[str, Any]]:
    """What a writer stores: the copy's events and ``events``, merged and bounded, and the
    copy's events dated more than :data:`MAX_FUTURE_S` after ``now`` (the server's time)
    kept as they were beside them.

    Those are not read, and not counted in the bound, so a planted event in the year
    9000 pushes no real one out; but they are not dropped either. Whether an event is
    "ahead" depends on a clock, and a writer whose clock is behind (or a server's) must
    not erase what the others recorded: the events of a writer whose clock was ahead
    are read once their time has come. They are bounded on their own, to :data:`LIMIT`
    lock ids. ``have_clean``: ``have`` was cleaned already (:func:`stored`)."""
    mine: list[dict[str, Any]] = [dict(e) for e in have] if have_clean else _cleaned(have)
    latest = _latest(now)
    dated = [(_when(e), e) for e in mine]
    kept = _merge_clean([[e for when, e in dated if when <= latest], _cleaned(events)])
    keys = {(e["lock_id"], e["event"]) for e in kept}
    later = _merge_clean([[e for when, e in dated if when > latest]])
    ahead = [e for e in later if (e["lock_id"], e["event"]) not in keys]
    return sorted(kept + ahead, key=_order)


def _when(e: Mapping[str, Any]) -> datetime:
    found = canonical_time(e["at"])  # a clean event's
    return found[1] if found is not None else datetime.min.replace(tzinfo=UTC)


def _order(e: Mapping[str, Any]) -> tuple[datetime, int, str]:
    return (_when(e), EVENTS.index(e["event"]), e["lock_id"])


def merge(*copies: Iterable[Mapping[str, Any]], limit: int = LIMIT) -> list[dict[str, Any]]:
    """Every event of ``copies`` once per (lock id, event), oldest first, bounded to the
    events of the ``limit`` lock ids seen last. Of two records of the same (lock id,
    event) the earlier is kept (ties: the one whose JSON sorts first), so every reader
    and writer merging the same copies gets the same list, in any order."""
    return _merge_clean([_cleaned(copy) for copy in copies], limit=limit)


def _cleaned(raw: Iterable[Any]) -> list[dict[str, Any]]:
    return [e for e in (clean(r) for r in raw) if e is not None]


def _merge_clean(copies: Iterable[Iterable[dict[str, Any]]], *, limit: int = LIMIT) -> list[dict[str, Any]]:
    """:func:`merge` of copies whose events are clean already (cleaning changes none)."""
    # Each event's time is read once and carried beside it (the comparisons and the
    # sort below would otherwise read it again and again).
    chosen: dict[tuple[str, str], tuple[datetime, dict[str, Any]]] = {}
    for copy in copies:
        for e in copy:
            key = (e["lock_id"], e["event"])
            when = _when(e)
            have = chosen.get(key)
            if have is None or (when, _dump(e)) < (have[0], _dump(have[1])):
                chosen[key] = (when, e)
    dated = sorted(chosen.values(), key=_dated_order)
    first_seen: dict[str, datetime] = {}
    for when, e in dated:
        first_seen.setdefault(e["lock_id"], when)
    kept = set(sorted(first_seen, key=lambda lid: (first_seen[lid], lid))[-limit:]) if limit > 0 else set()
    return [e for _, e in dated if e["lock_id"] in kept]


def _dated_order(dated: tuple[datetime, Mapping[str, Any]]) -> tuple[datetime, int, str]:
    """:func:`_order` of an event carried with its time."""
    when, e = dated
    return (when, EVENTS.index(e["event"]), e["lock_id"])


def _dump(e: Mapping[str, Any]) -> str:
    return json.dumps(e, sort_keys=True, separators=(",", ":"))


@dataclass
class Tenure:
    """One lock id's time with the lock, as the merged events tell it."""

    lock_id: str
    holder: str = ""
    host: str = ""
    pid: str = ""
    reason: str = ""
    token: int | None = None
    since: datetime | None = None  # when it was taken (None: its acquisition was not recorded)
    until: datetime | None = None  # when it ended, or was seen to have ended
    ended: str | None = None  # released, broken, expired, lost; None: held, or not known to have ended
    by: str = ""  # who released or broke it, or who saw it expired or lost
    note: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "lock_id": self.lock_id,
            "holder": self.holder or None,
            "host": self.host or None,
            "pid": self.pid or None,
            "reason": self.reason or None,
            "fencing_token": self.token,
            "since": micro_time(self.since) if self.since else None,
            "until": micro_time(self.until) if self.until else None,
            "ended": self.ended,
            "by": self.by or None,
            "note": self.note or None,
            "events": self.events,
        }


def tenures(events: Sequence[Mapping[str, Any]]) -> list[Tenure]:
    """Merged events grouped by lock id, oldest tenure first."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for raw in sorted((e for e in (clean(r) for r in events) if e is not None), key=_order):
        grouped.setdefault(raw["lock_id"], []).append(raw)
    found: list[Tenure] = []
    for lock_id, group in grouped.items():
        t = Tenure(lock_id, events=group)
        by_kind = {e["event"]: e for e in group}
        # The holder's details: its own acquisition first, else what others saw on its
        # lease when they recorded its end (every event names the tenure's holder).
        sources = [by_kind[ACQUIRED], *group] if ACQUIRED in by_kind else group
        t.holder = next((e["holder"] for e in sources if e.get("holder")), "")
        t.host = next((e["host"] for e in sources if e.get("host")), "")
        t.pid = next((e["pid"] for e in sources if e.get("pid")), "")
        t.reason = next((e["reason"] for e in sources if e.get("reason")), "")
        t.token = next((e["token"] for e in sources if e.get("token") is not None), None)
        if ACQUIRED in by_kind:
            t.since = _when(by_kind[ACQUIRED])
        for kind in END_PRIORITY:
            end = by_kind.get(kind)
            if end is not None:
                t.ended, t.until, t.by, t.note = kind, _when(end), end.get("by", ""), end.get("note", "")
                break
        found.append(t)
    found.sort(key=lambda t: (t.since or t.until or datetime.min.replace(tzinfo=UTC), t.lock_id))
    return found


# ------------------------------------------------------------------ in the clusters


def _object(deployment: str, events: list[dict[str, Any]], old: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = owned_metadata(history_name(deployment), deployment)
    if old:
        rv = (old.get("metadata") or {}).get("resourceVersion")
        if rv:
            meta["resourceVersion"] = rv  # compare-and-swap: a concurrent writer makes this 409
    meta["annotations"] = {NOTE_ANNOTATION: NOTE}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {DATA_KEY: json.dumps(events, separators=(",", ":"), ensure_ascii=False)},
    }


def _refused_for_good(err: KubeError, old: Mapping[str, Any]) -> bool:
    """Will this copy refuse every update? An ``immutable`` ConfigMap answers 422 to any
    change of its data; so may a copy whose data no coordinator wrote (planted where the
    name was free, which nobody could read anyway)."""
    if err.status != 422:
        return False
    return old.get("immutable") is True or not written_by_us(old)


# A member's copy as read: the object (None where it has none) and the server's time.
_Copy: TypeAlias = tuple[dict[str, Any] | None, datetime | None]


class HistoryStore:
    """The history ConfigMaps of one deployment on its member clusters."""

    def __init__(self, clusters: ClusterSet, deployment: str, namespace: str, members: Sequence[str]) -> None:
        self.clusters = clusters
        self.deployment = deployment
        self.namespace = namespace
        self.members = list(members)
        self.path = history_path(namespace, deployment)

    async def _get(self, cluster: str) -> tuple[dict[str, Any] | None, datetime | None]:
        """This member's copy (None where it has none) and the server's time of the read
        (None when it sent no Date)."""
        try:
            resp = await self.clusters.client(cluster).request("GET", self.path)
        except KubeError as err:
            if err.kind == kube.NOT_FOUND:
                return None, None
            raise
        return resp.body, resp.server_time

    async def _append_one(self, cluster: str, events: list[dict[str, Any]]) -> ClusterResult[int]:
        client = self.clusters.client(cluster)

        def decide(copy: _Copy) -> cas.Put[tuple[dict[str, Any], int]] | cas.Keep[int]:
            old, server_now = copy
            have = stored(old)
            # Judged by the server's clock, and nothing is dropped for being ahead of it.
            merged = merge_for_write(have, events, now=server_now, have_clean=True)
            unchanged = merged == merge_for_write(have, [], now=server_now, have_clean=True)
            if unchanged and (old is None or written_by_us(old)):
                return cas.Keep(len(merged))
            return cas.Put((_object(self.deployment, merged, old), len(merged)))

        async def write(copy: _Copy, step: tuple[dict[str, Any], int]) -> int:
            body, count = step
            query = {"fieldManager": FIELD_MANAGER}
            if copy[0] is None:
                await client.request("POST", configmaps_path(self.namespace), body=body, query=query)
            else:
                body = with_records(body, copy[0], clock.token_hex(6))
                await client.request("PUT", self.path, body=body, query=query)
            return count

        async def retry(copy: _Copy, err: KubeError) -> bool:
            if await cas.lost_race(copy, err):
                return True  # another writer got there first: merge with theirs
            old = copy[0]
            if old is not None and _refused_for_good(err, old):
                await self._replace(cluster, old)
                return True  # gone: the next round creates a fresh copy
            return False

        try:
            await self.clusters.check_identity(cluster)
            result = await cas.compare_and_swap(
                lambda: self._get(cluster), decide, write, attempts=WRITE_RETRIES, retry=retry
            )
        except KubeError as err:  # the identity check, or replacing a copy that refuses updates
            return failed(cluster, err)  # type: ignore[return-value]
        match result:
            case cas.Written(value=count):
                return ClusterResult(cluster, Outcome.OK, count, detail="recorded")
            case cas.Decided(value=count):
                return ClusterResult(cluster, Outcome.OK, count, detail="already recorded")
            case cas.ReadFailed(error=error) | cas.WriteFailed(error=error):
                return failed(cluster, error)  # type: ignore[return-value]
            case cas.Raced():
                return ClusterResult(cluster, Outcome.CONFLICT, detail="lost the compare-and-swap race repeatedly")
        assert_never(result)

    async def _replace(self, cluster: str, old: Mapping[str, Any]) -> None:
        """Delete a copy that refuses every update (made ``immutable`` by whoever created
        it where the name was free), but only that very object: a uid precondition, so
        that a fresh copy another writer made meanwhile stays. Its events are in the
        list the caller writes next, as far as a reader would have read them."""
        uid = (old.get("metadata") or {}).get("uid")
        if not uid:
            return
        log.warning(
            "lock history copy refuses updates (immutable, or not written by coordinator); replacing it",
            deployment=self.deployment,
            cluster=cluster,
        )
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": str(uid)}}
        try:
            await self.clusters.client(cluster).request("DELETE", self.path, body=options)
        except KubeError as err:
            if err.kind not in (kube.NOT_FOUND, kube.CONFLICT):  # gone already, or another copy now
                raise

    async def append(self, events: list[dict[str, Any]], *, timeout: float) -> dict[str, ClusterResult[int]]:
        """Add ``events`` to every member's copy; per-cluster outcomes, never raises for a
        cluster's failure."""
        return await fan_out(
            self.members, lambda c: self._append_one(c, events), timeout=timeout, silent=self.clusters.silent
        )

    async def record(self, events: list[dict[str, Any]], *, timeout: float) -> None:
        """Best effort: :meth:`append`, any failure logged as a warning. It waits until a
        majority has the events or every member answered but those silent earlier in this
        command (asked, not waited for), then for the others as long again: a paused member
        does not hold the command up at exit (a member left out misses these events)."""
        if not events:
            return
        majority = len(self.members) // 2 + 1
        silent = self.clusters.silent

        def enough(rs: Mapping[str, ClusterResult[int]]) -> bool:
            ok = sum(1 for r in rs.values() if r.ok)
            return ok >= majority or all(c in rs or c in silent for c in self.members)

        try:
            results = await fan_out(
                self.members, lambda c: self._append_one(c, events), timeout=timeout, until=enough, grace_factor=1.0,
                silent=silent,
            )  # fmt: skip
        except Exception as err:  # history must never sink the command that made it
            log.warning("lock history not recorded", deployment=self.deployment, error=f"{type(err).__name__}: {err}")
            return
        missed = {c: f"{r.outcome}: {r.detail}" for c, r in results.items() if not r.ok}
        unasked = "not waited for: it gave no answer earlier in this command"
        missed.update({c: unasked if c in silent else "no answer" for c in self.members if c not in results})
        if missed:
            kept = sum(1 for r in results.values() if r.ok)
            some = f"not recorded on a majority: on {kept} of {len(self.members)} members"
            # A member that answered this command but was slower than the others to take
            # the events, with a majority recorded, loses nothing a reader sees (it merges
            # every copy): not a problem on a healthy run, and said at -v. One that refused
            # them, or gave no answer earlier in the command (down), is worth a warning.
            trouble = any(c in results or c in silent for c in missed)
            say = log.warning if kept < majority or trouble else log.info
            say(
                f"lock history {'not recorded on every member; the others keep it' if kept >= majority else some}",
                deployment=self.deployment,
                events=",".join(sorted({e["event"] for e in events})),
                clusters=missed,
            )

    async def read(self, *, timeout: float) -> tuple[list[dict[str, Any]], dict[str, ClusterResult[int]]]:
        """The merged events of every copy that could be read, and per-cluster outcomes
        (OK with the number of events that member keeps; 0 where it has no copy yet)."""
        copies: dict[str, list[dict[str, Any]]] = {}

        async def one(cluster: str) -> ClusterResult[int]:
            try:
                await self.clusters.check_identity(cluster)
                obj, server_now = await self._get(cluster)
            except KubeError as err:
                return failed(cluster, err)  # type: ignore[return-value]
            copies[cluster] = decode(obj, now=server_now)
            return ClusterResult(cluster, Outcome.OK, len(copies[cluster]))

        results = await fan_out(self.members, one, timeout=timeout, silent=self.clusters.silent)
        return _merge_clean(copies.values()), results

    async def create_empty(self, cluster: str) -> ClusterResult[str]:
        """Create this member's copy, holding no event, so that the name is taken (one
        already there is left as it is: the next event recorded replaces it unless a
        coordinator wrote it)."""
        body = _object(self.deployment, [], None)
        try:
            await self.clusters.client(cluster).request(
                "POST", configmaps_path(self.namespace), body=body, query={"fieldManager": FIELD_MANAGER}
            )
        except KubeError as err:
            if err.kind == kube.ALREADY_EXISTS:
                return ClusterResult(cluster, Outcome.OK, "exists")
            return failed(cluster, err)  # type: ignore[return-value]
        return ClusterResult(cluster, Outcome.OK, "created")
