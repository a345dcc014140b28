"""Pure rules of one cluster's Lease: what it says, whether it may be taken, which token.

No I/O happens here and no clock is read: every rule takes the lease as parsed
(:class:`LeaseView`) and the times it needs as arguments, so each can be unit-tested
case by case. :mod:`coordinator.engine.lock` is the engine that reads, writes and fans out.

Evidence of expiry
------------------
A lease held by someone else may be taken over only when it has lapsed, and the only
evidence accepted is the coordinator's own: the time the API server stamped on the
``managedFields`` entry of the ``coordinator`` field manager (our takes and renewals),
compared with a second server stamp taken *after* the read — the stamp of a probe
write made under another field manager (:data:`PROBE_MANAGER`). Both stamps come
from API servers, so no client clock enters the rule, and neither is the HTTP ``Date``
header, which a proxy or load balancer may rewrite. Edits by other field managers
(labels, annotations, ``kubectl edit``) move neither stamp, so they neither renew nor
expire a lease. Where the two stamps may come from different API servers of one
cluster (HA control planes), their clock offset is bounded by ``max_server_skew`` and
added to the margin.

A lease with no entry of ours (``managedFields`` stripped, our entries merged by the
server into ``ancient-changes`` once more than ten managers updated it, or all our fields
taken by another manager) gives no evidence: it lapses only by local observation — the
fields the lock rules read unchanged for a whole TTL plus margin on the contender's own
clock, as client-go's leader election judges. A ``leaseDurationSeconds`` that another manager changed is not
believed: the deployment's maximum TTL applies instead; nor is a ``coordinator.io/max-ttl``
note that no coordinator field manager wrote, or one longer than a day. What is written
under a coordinator field manager is taken as coordinator's own: anyone may name it.

A lease that existed and is gone (deleted, namespace recreated, etcd restored) is not
free: the first contender to see it missing records a *tombstone* (a holderless lease
marked ``vanished``), which counts as held by an unknown holder until the maximum TTL
has passed since it was recorded, by the same stamps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from coordinator.rules.evidence import Writer, annotation, writer
from coordinator.rules.membership import annotation_writers, is_ours
from coordinator.rules.resources import ANNOTATION_PREFIX, FIELD_MANAGER, parse_time
from coordinator.rules.turnline import HANDOFF_GRACE_S as HANDOFF_GRACE_S
from coordinator.rules.turnline import Line, after_take, joined, parse_line, turns
from coordinator.rules.turnline import TurnClaim as TurnClaim

A_HOLDER = ANNOTATION_PREFIX + "holder"
A_HOST = ANNOTATION_PREFIX + "host"
A_PID = ANNOTATION_PREFIX + "pid"
A_REASON = ANNOTATION_PREFIX + "reason"
A_COMMAND = ANNOTATION_PREFIX + "command"
A_TOKEN = ANNOTATION_PREFIX + "fencing-token"
A_MEMBERS = ANNOTATION_PREFIX + "members"
A_NAMESPACE = ANNOTATION_PREFIX + "namespace"
A_LAST_BREAK = ANNOTATION_PREFIX + "last-break"
A_NEXT = ANNOTATION_PREFIX + "next"
A_RELEASED = ANNOTATION_PREFIX + "released-at"
A_VANISHED = ANNOTATION_PREFIX + "vanished"
A_MAX_TTL = ANNOTATION_PREFIX + "max-ttl"
A_PROBE = ANNOTATION_PREFIX + "probe"
# The lease's own metadata.uid, written by every coordinator write: a lease recreated from
# a copy (a backup restored, a manifest re-applied) carries another object's uid.
A_UID = ANNOTATION_PREFIX + "uid"
HOLDER_ANNOTATIONS = (A_HOLDER, A_HOST, A_PID, A_REASON, A_COMMAND)

# Claims on the next turn are written under their own field manager, so that a claim
# never counts as a write of the lease: a waiter must not make a dead holder look alive.
LINE_MANAGER = "coordinator-line"
# Probes (a fresh server time stamp, see the module doc) have their own manager too.
PROBE_MANAGER = "coordinator-probe"
# Releases by the holder: the server's stamp on this manager dates the last real release,
# from which the next turn stays reserved for the longest waiter (takes and give-backs of
# failed attempts do not move it).
RELEASE_MANAGER = "coordinator-release"

# How far a holder's clock rate may differ from an API server's, as a fraction.
DRIFT_FACTOR = 0.01
# managedFields times have one-second resolution; two of them bound an interval only
# to within two seconds.
TIMESTAMP_SLACK_S = 2.0
DEFAULT_MAX_SERVER_SKEW_S = 5.0
DEFAULT_MAX_TTL_S = 600.0
# The longest maximum TTL a deployment may have (`deployment create --max-ttl`), and so the
# largest `coordinator.io/max-ttl` note a lease may carry. A note above it is not believed
# even where a coordinator field manager wrote it: anyone who names that manager
# (`kubectl annotate --field-manager=coordinator`) could otherwise keep a dead holder's
# lock, or a deleted lease, for years. A day is longer than any step a lock guards.
MAX_MAX_TTL_S = 24 * 3600
MAX_TTL_NOTE_S = MAX_MAX_TTL_S

# What reading an annotation may raise besides ValueError. Annotations are written by
# whoever may create or edit a Lease in the namespace: a number no float or datetime holds
# (OverflowError), JSON nested past the recursion limit (RecursionError), a field of
# another type. A reader drops what it cannot read; it never raises.
UNREADABLE = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError)


def boot_clock() -> float:
    """Seconds on CLOCK_BOOTTIME: like the monotonic clock, but it keeps counting while
    the machine sleeps, so a suspended holder wakes up knowing its lease ran out. Read
    through coordinator/clock.py (the system's, unless a caller set another)."""
    from coordinator import clock

    return clock.boot()


def drift_allowance(ttl_s: float) -> float:
    return ttl_s * DRIFT_FACTOR + 0.05


def remaining_validity(ttl_s: float, elapsed_s: float) -> float:
    """How long a holder may still act, counted on its own clock from the moment
    *before* it sent the requests that took or renewed the leases."""
    return ttl_s - elapsed_s - drift_allowance(ttl_s)


def lapse_margin(ttl_s: float, max_server_skew_s: float) -> float:
    """What a contender adds to the TTL before it believes a lease lapsed."""
    return drift_allowance(ttl_s) + TIMESTAMP_SLACK_S + max(0.0, max_server_skew_s)


# ------------------------------------------------------------------ parsing


def holder_identity(holder: str, lock_id: str) -> str:
    """What ``spec.holderIdentity`` says: who holds it and the lock id, e.g.
    ``alice@laptop/3f2a9c0d1e4b5a69`` (readable in `kubectl get lease`). The lock id is
    what follows the last slash, so a holder name may contain slashes."""
    who = " ".join("".join(ch if ch.isprintable() else " " for ch in holder).split())[:120]
    return f"{who}/{lock_id}" if who else lock_id


def pid_of(raw: Any) -> int | None:
    """The holder's pid from its annotation, or None: ASCII digits only ('²' is a digit
    to ``str.isdigit`` and no number to ``int``), and no longer than a pid can be."""
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 18:
        return int(raw)
    return None


def lock_id_of(identity: Any) -> str | None:
    """The lock id in a ``holderIdentity`` (the whole value for leases written before
    holder names were added, or by other tools)."""
    if not isinstance(identity, str) or not identity:
        return None
    return identity.rsplit("/", 1)[-1] or None


def manager_time(obj: dict[str, Any], manager: str) -> datetime | None:
    """The newest time the server stamped on ``manager``'s managedFields entries."""
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    times = [parse_time(e.get("time")) for e in entries if isinstance(e, dict) and e.get("manager") == manager]
    stamps = [t for t in times if t is not None]
    return max(stamps) if stamps else None


def _owns_ttl(obj: dict[str, Any]) -> bool:
    for e in (obj.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(e, dict) or e.get("manager") != FIELD_MANAGER:
            continue
        spec = (e.get("fieldsV1") or {}).get("f:spec") or {}
        if isinstance(spec, dict) and "f:leaseDurationSeconds" in spec:
            return True
    return False


def _positive_int(raw: Any) -> int | None:
    try:
        value = int(raw)
    except UNREADABLE:
        return None
    return value if value > 0 else None


def _max_ttl_note(obj: dict[str, Any], raw: Any) -> int | None:
    """The deployment's maximum TTL as this lease stores it, when a coordinator wrote the
    note and it is no longer than any deployment's may be (:data:`MAX_MAX_TTL_S`).
    Anyone who may edit the lease can write ``coordinator.io/max-ttl``: believed, a note
    of 100000000 would keep a dead holder's lock for years. Unowned (or stripped with the
    managedFields), or longer than a day, it says nothing, and the deployment record's
    maximum applies."""
    value = _positive_int(raw)
    if value is None or value > MAX_TTL_NOTE_S:
        return None
    return value if any(is_ours(w) for w in annotation_writers(obj, A_MAX_TTL)) else None


def _holder_edited(holder_writer: Writer) -> bool:
    """Is the holder field not coordinator's word? Coordinator writes it on every take and
    release (empty when free), so a holder field no coordinator manager owns was written or
    removed by another client (a `kubectl edit` that "frees" a lease, or names another lock
    id), or its writer is no longer on record (managedFields stripped, or the field owned by
    before-first-apply or ancient-changes: coordinator.rules.evidence.NO_WRITERS). Such a lease
    blocks for a holder nobody can name until coordinator's own last write there, or local
    observation, shows a TTL passed; and it is no holder's own."""
    return holder_writer is not Writer.OURS


@dataclass
class LeaseView:
    """One cluster's lease as read (``exists=False``: the server said 404)."""

    exists: bool
    obj: dict[str, Any] = field(default_factory=dict)
    lock_id: str | None = None
    ttl_s: int | None = None
    ttl_owned: bool = False
    acquired_at: datetime | None = None
    renewed_at: datetime | None = None
    transitions: int | None = None
    token: int = 0
    token_malformed: bool = False
    # Who wrote the token annotation: only coordinator's is the lease's token history.
    token_writer: Writer = Writer.UNKNOWN
    # The holder field is not coordinator's word (another client wrote or removed it, or
    # who wrote it is no longer on record): the lease counts as held by a holder nobody can
    # name (``lock_id`` is None; ``claimed`` says what the field says), until coordinator's
    # own write stamp shows a TTL passed.
    holder_edited: bool = False
    holder_writer: Writer = Writer.UNKNOWN
    claimed: str | None = None
    info: dict[str, str] = field(default_factory=dict)
    server_now: datetime | None = None  # the response's Date header: a hint, never evidence
    own_write: datetime | None = None  # the server's stamp on our field manager's last write
    released: datetime | None = None  # the server's stamp on the last release by a holder
    resource_version: str | None = None
    line: Line = ()  # the waiters listed for their turns, in line order
    vanished: bool = False  # a tombstone: the lease was found deleted
    max_ttl_note: int | None = None  # believed only when a coordinator field manager wrote it
    break_note: dict[str, Any] | None = None
    uid: str | None = None
    uid_note: str | None = None  # the uid note, where coordinator wrote it
    uid_claim: str | None = None  # the uid note whoever wrote it (see names_itself)
    created: datetime | None = None  # the server's creationTimestamp

    @classmethod
    def parse(cls, obj: dict[str, Any] | None, server_now: datetime | None = None) -> LeaseView:
        if not obj:
            return cls(exists=False, server_now=server_now)
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        ann = meta.get("annotations") or {}
        token, malformed = 0, False
        token_writer = writer(obj, annotation(A_TOKEN)) if A_TOKEN in ann else Writer.UNKNOWN
        raw = ann.get(A_TOKEN) if token_writer is Writer.OURS else None
        if raw is not None:
            try:
                token = int(raw)
                malformed = token < 0
            except UNREADABLE:
                malformed = True
        uid_note = ann.get(A_UID) if isinstance(ann.get(A_UID), str) else None
        uid_writer = writer(obj, annotation(A_UID)) if uid_note is not None else Writer.OTHER
        claimed = lock_id_of(spec.get("holderIdentity"))
        holder_writer = writer(obj, ("spec", "holderIdentity"))
        edited = _holder_edited(holder_writer)
        ttl = spec.get("leaseDurationSeconds")
        note: dict[str, Any] | None = None
        if isinstance(ann.get(A_LAST_BREAK), str) and writer(obj, annotation(A_LAST_BREAK)) is Writer.OURS:
            try:
                loaded = json.loads(ann[A_LAST_BREAK])
                note = loaded if isinstance(loaded, dict) else None
            except UNREADABLE:
                note = None
        return cls(
            exists=True,
            obj=obj,
            lock_id=None if edited else claimed,
            ttl_s=int(ttl) if isinstance(ttl, int) and ttl > 0 else None,
            ttl_owned=_owns_ttl(obj),
            acquired_at=parse_time(spec.get("acquireTime")),
            renewed_at=parse_time(spec.get("renewTime")),
            transitions=spec.get("leaseTransitions"),
            token=max(token, 0),
            token_malformed=malformed,
            token_writer=token_writer,
            holder_edited=edited,
            holder_writer=holder_writer,
            claimed=claimed,
            info={k[len(ANNOTATION_PREFIX) :]: str(v) for k, v in ann.items() if k in HOLDER_ANNOTATIONS},
            server_now=server_now,
            own_write=manager_time(obj, FIELD_MANAGER),
            released=manager_time(obj, RELEASE_MANAGER),
            resource_version=meta.get("resourceVersion"),
            line=parse_line(ann.get(A_NEXT)) if writer(obj, annotation(A_NEXT)) is Writer.OURS else (),
            vanished=A_VANISHED in ann and writer(obj, annotation(A_VANISHED)) is Writer.OURS,
            max_ttl_note=_max_ttl_note(obj, ann.get(A_MAX_TTL)),
            break_note=note,
            uid=meta.get("uid") or None,
            uid_note=uid_note if uid_writer is Writer.OURS else None,
            # the note unless another client is on record as its writer (a stripped one
            # has no known writer: see names_itself)
            uid_claim=uid_note if uid_writer is not Writer.OTHER else None,
            created=parse_time(meta.get("creationTimestamp")),
        )

    @property
    def held(self) -> bool:
        return self.lock_id is not None

    @property
    def verified(self) -> bool:
        """Was this very object last written by coordinator (its uid annotation names
        it)? A copy recreated from a backup names the object it was copied from."""
        return self.exists and self.uid is not None and self.uid_note == self.uid

    @property
    def names_itself(self) -> bool:
        """Does the uid note name this very object, written by coordinator or by nobody on
        record? Weaker than :attr:`verified` (after managedFields were stripped the note
        has no known writer, and any client could have written it before the strip); a
        note another client is on record as writing never counts. A member change uses it
        only to take a stripped lease's set for a step of its own when the set *equals*
        that step, and to tell a lease of this deployment on a joining member."""
        return self.exists and self.uid is not None and self.uid_claim == self.uid

    @property
    def blocking(self) -> bool:
        """Held by a lock id, a tombstone standing for an unknown holder, or a holder field
        another client edited (whoever held it may still)."""
        return self.held or self.vanished or self.holder_edited

    @property
    def unknown_holder(self) -> bool:
        """Blocking for a holder nobody can name: a tombstone, or an edited holder field."""
        return self.blocking and not self.held

    @property
    def fingerprint(self) -> tuple[Any, ...]:
        """What local observation watches for change: the fields the lock rules read that
        every take, renewal or tombstone of coordinator's changes (the object, its holder,
        its take and renewal times, its token, its tombstone mark), and nothing else.
        Labels, other annotations and the duration are left out: anyone may change those
        (a duration coordinator did not write is not believed anyway), and continual edits
        of them must not restart the observation and keep a dead holder's lock for ever."""
        spec = self.obj.get("spec") or {}
        ann = (self.obj.get("metadata") or {}).get("annotations") or {}
        return (
            self.exists,
            self.uid,  # a lease deleted and recreated (a new tombstone) is a new sighting
            spec.get("holderIdentity"),
            spec.get("renewTime"),
            spec.get("acquireTime"),
            ann.get(A_TOKEN),
            ann.get(A_VANISHED),
        )

    def broken_for(self, lock_id: str) -> bool:
        """Does the last break note name ``lock_id`` as the holder it cleared?"""
        return bool(self.break_note) and str((self.break_note or {}).get("previous_lock_id")) == lock_id

    # -- expiry, as the rules below judge it

    def effective_ttl(self, max_ttl_s: float) -> float:
        return effective_ttl(self, max_ttl_s)

    def remaining_hint(self, max_ttl_s: float = DEFAULT_MAX_TTL_S, skew_s: float = 0.0) -> float | None:
        return remaining_hint(self, max_ttl_s=max_ttl_s, max_server_skew_s=skew_s)

    def expired(self, max_ttl_s: float = DEFAULT_MAX_TTL_S, skew_s: float = 0.0) -> bool | None:
        """A hint (by the response's ``Date``): True when not blocking or seemingly
        lapsed, None without evidence. Taking over never relies on it alone. ``skew_s``:
        the ``--max-server-skew`` margin a takeover would add (an API server whose clock
        runs that far ahead answers with a ``Date`` that makes a live lease look lapsed);
        what tells people whether a lock is free passes it."""
        if not self.blocking:
            return True
        rem = self.remaining_hint(max_ttl_s, skew_s)
        return None if rem is None else rem <= 0

    def remaining_s(self) -> float | None:
        return self.remaining_hint() if self.held else None

    # -- taking turns (fairness only: these may delay a take, never allow one)

    def live_for_other(self, lock_id: str) -> bool:
        """Blocking for ``lock_id`` and not seemingly lapsed (by the Date hint)."""
        return self.blocking and self.lock_id != lock_id and self.expired() is not True

    @property
    def next_claim(self) -> TurnClaim | None:
        """The first waiter listed, whatever its standing."""
        return self.line[0] if self.line else None

    @property
    def live_claim(self) -> TurnClaim | None:
        """The claim whose turn it is, or was last (bound or not: :meth:`claim_fresh`)."""
        order, k, _ = turns(self)
        return order[k] if order else None

    def reserved_left_s(self) -> float | None:
        """Seconds until the turn of :attr:`live_claim` stops binding: while the lease is
        live, and for HANDOFF_GRACE_S after it was freed or lapsed (by the Date hint) —
        or after the turns of the waiters listed before it (coordinator.rules.turnline)."""
        order, _, left = turns(self)
        return left if order else None

    def claim_fresh(self) -> bool:
        left = self.reserved_left_s() if self.live_claim is not None else None
        if left is None:
            return False
        return left > 0 if self.held else left >= 0

    def claim_ahead(self, lock_id: str, mine: TurnClaim | None = None) -> TurnClaim | None:
        """The claim of a contender that has waited longer than ``mine`` (None: one who
        has not waited), fresh or not."""
        claim = self.live_claim
        if claim is None or claim.lock_id == lock_id or (mine is not None and mine < claim):
            return None
        return claim

    def binding_claim(self, lock_id: str, mine: TurnClaim | None = None) -> TurnClaim | None:
        """:meth:`claim_ahead`, if it still binds."""
        claim = self.claim_ahead(lock_id, mine)
        return claim if claim is not None and self.claim_fresh() else None

    def reserved_for_other(self, lock_id: str, mine: TurnClaim | None = None) -> bool:
        return self.lock_id != lock_id and self.binding_claim(lock_id, mine) is not None

    # -- the line as a write leaves it (coordinator.rules.turnline)

    def line_joined(self, mine: TurnClaim) -> Line | None:
        return joined(self, mine)

    def line_without(self, lock_id: str | None) -> Line:
        return tuple(c for c in self.line if c.lock_id != lock_id)

    def line_after_take(self) -> Line:
        return after_take(self)


# ------------------------------------------------------------------ the rules


def effective_ttl(view: LeaseView, max_ttl_s: float) -> float:
    """The TTL a contender must wait out. The lease's own duration when our field
    manager set it; the deployment's maximum TTL for a tombstone or for a duration
    someone else wrote (it might have been shortened behind the holder's back): the
    larger of the record's and the note a coordinator stored on the lease."""
    ceiling = max(float(max_ttl_s), float(view.max_ttl_note or 0))
    if view.vanished or view.ttl_s is None or not view.ttl_owned:
        return ceiling
    return float(view.ttl_s)


def lapsed_by_stamps(
    view: LeaseView, stamp: datetime | None, *, max_ttl_s: float, max_server_skew_s: float
) -> bool | None:
    """Has ``view`` lapsed, judged by two server stamps: our own last write to it and
    ``stamp``, a server time stamped after the read (a probe). None: no evidence."""
    if view.own_write is None or stamp is None:
        return None
    ttl = effective_ttl(view, max_ttl_s)
    return (stamp - view.own_write).total_seconds() > ttl + lapse_margin(ttl, max_server_skew_s)


def shown_expired(view: LeaseView, max_ttl_s: float, max_server_skew_s: float) -> bool | None:
    """Whether what people are shown (`lock status`, the fleet view) calls ``view``
    expired: only once no takeover could still be refused. The Date of the server that
    answered may run up to the skew ahead of the one that stamped the last write, and a
    takeover's probe stamp up to the skew behind it, on top of the skew a takeover adds:
    three skews in all. Read-only, status never probes; so it errs towards "held"."""
    return view.expired(max_ttl_s, 3 * max_server_skew_s)


def remaining_hint(view: LeaseView, *, max_ttl_s: float, max_server_skew_s: float = 0.0) -> float | None:
    """Seconds until ``view`` may lapse, estimated from the response's ``Date``. For
    display and for deciding when to probe — never for taking over."""
    if view.own_write is None or view.server_now is None:
        return None
    ttl = effective_ttl(view, max_ttl_s)
    elapsed = (view.server_now - view.own_write).total_seconds()
    return ttl + lapse_margin(ttl, max_server_skew_s) - elapsed


@dataclass
class Sighting:
    """When this process first saw a lease's own fields as they are now (its clock)."""

    fingerprint: tuple[Any, ...]
    since: float


def observe(previous: Sighting | None, view: LeaseView, now: float) -> Sighting:
    """Update a local observation: it restarts whenever our fields change."""
    if previous is not None and previous.fingerprint == view.fingerprint:
        return previous
    return Sighting(view.fingerprint, now)


def lapsed_by_observation(
    sighting: Sighting | None, view: LeaseView, now: float, *, max_ttl_s: float, max_server_skew_s: float
) -> bool:
    """Local observation: our fields unchanged for a whole TTL plus margin, counted on
    this process's own clock."""
    if sighting is None or sighting.fingerprint != view.fingerprint:
        return False
    ttl = effective_ttl(view, max_ttl_s)
    return now - sighting.since > ttl + lapse_margin(ttl, max_server_skew_s)


class Standing(StrEnum):
    """Where a lease stands for one contender, before any write."""

    MISSING = "missing"  # 404: record a tombstone; it blocks for a maximum TTL
    FREE = "free"
    OURS = "ours"
    HELD = "held"  # blocking, and not known to have lapsed
    PROBE = "probe"  # blocking, and the Date hint says it may have lapsed: get a stamp
    LAPSED = "lapsed"  # blocking, but provably lapsed: may be taken over


def standing(
    view: LeaseView,
    lock_id: str,
    *,
    max_ttl_s: float,
    max_server_skew_s: float,
    stamp: datetime | None = None,
    observed_lapse: bool = False,
    date_trusted: bool = True,
) -> Standing:
    """The one rule deciding whether a contender may write a lease.

    ``stamp``: a server stamp taken after the read (a probe), if any; ``observed_lapse``:
    local observation says our fields sat unchanged for a whole TTL; ``date_trusted``:
    this cluster's ``Date`` header agreed with its stamps when last checked."""
    if not view.exists:
        return Standing.MISSING
    if view.lock_id == lock_id:
        return Standing.OURS
    copy = copy_standing(
        view, stamp, max_ttl_s=max_ttl_s, max_server_skew_s=max_server_skew_s, date_trusted=date_trusted
    )
    if copy is not None:
        return copy
    if not view.blocking:
        return Standing.FREE
    if view.own_write is None:
        return Standing.LAPSED if observed_lapse else Standing.HELD
    if stamp is not None:
        lapsed = lapsed_by_stamps(view, stamp, max_ttl_s=max_ttl_s, max_server_skew_s=max_server_skew_s)
        return Standing.LAPSED if lapsed else Standing.HELD
    hint = remaining_hint(view, max_ttl_s=max_ttl_s, max_server_skew_s=max_server_skew_s)
    if not date_trusted or hint is None or hint <= 0:
        return Standing.PROBE
    return Standing.HELD


def copy_standing(
    view: LeaseView,
    stamp: datetime | None,
    *,
    max_ttl_s: float,
    max_server_skew_s: float,
    date_trusted: bool = True,
) -> Standing | None:
    """The young-copy rule, which acquisitions (:func:`standing`) and `lock status` both
    apply: a lease not written by coordinator as this very object (:attr:`LeaseView.verified`
    false: its uid note is missing, names another object, or has no coordinator writer) may
    be a recreated copy of a deleted lease, so it blocks like a tombstone for a maximum TTL
    after its creation (a server stamp), whatever it says. HELD while it is that young;
    PROBE when only a probe's stamp can tell (the ``Date`` hint says it is older, or says
    nothing, or is not trusted); None when the rule does not hold the lease (verified, a
    tombstone, or proven older)."""
    if not view.exists or view.verified or view.vanished:
        return None
    young = _young(view, stamp, max_ttl_s=max_ttl_s, max_server_skew_s=max_server_skew_s)
    if young is None:
        return Standing.PROBE if stamp is None else Standing.HELD
    if young:
        if stamp is not None:
            return Standing.HELD
        return Standing.PROBE if not date_trusted else Standing.HELD
    return None


def _young(view: LeaseView, stamp: datetime | None, *, max_ttl_s: float, max_server_skew_s: float) -> bool | None:
    """Was ``view`` created less than a maximum TTL (plus margin) ago? By the probe
    ``stamp`` when given, else by the Date hint (None when neither says)."""
    if view.created is None:
        return None
    ceiling = max(float(max_ttl_s), float(view.max_ttl_note or 0))
    limit = ceiling + lapse_margin(ceiling, max_server_skew_s)
    now = stamp if stamp is not None else view.server_now
    if now is None:
        return None
    age = (now - view.created).total_seconds()
    if stamp is None and age <= limit:
        return True  # the hint says young: believe it (it only delays)
    if stamp is None:
        return None  # the hint says old: only a stamp may prove it
    return age <= limit


class RenewVerdict(StrEnum):
    RENEW = "renew"  # still ours: extend it
    BROKEN = "broken"  # a break cleared our lock id: the lock is lost at once
    TAKEN = "taken"  # another lock id holds it: the lock is lost at once
    GONE = "gone"  # free or missing: not ours here any more


def renew_verdict(view: LeaseView, lock_id: str) -> RenewVerdict:
    """What a renewal finds. A renewal never re-takes a lease it no longer holds."""
    if view.exists and view.lock_id == lock_id:
        return RenewVerdict.RENEW
    if view.exists and view.broken_for(lock_id):
        return RenewVerdict.BROKEN
    if view.held:
        return RenewVerdict.TAKEN
    return RenewVerdict.GONE


def token_taken(view: LeaseView, lock_id: str, token: int) -> bool:
    """Has ``token`` (or a later one) already been used on this lease by another lock
    id? Then an attempt with ``token`` must not take it: two attempts that read the same
    leases choose the same token, and a lease freed by the first keeps its token."""
    return view.lock_id != lock_id and view.token_writer is Writer.OURS and view.token >= token


def history_known(view: LeaseView) -> bool:
    """Does this lease carry the token history of its cluster? Only when coordinator wrote
    its token there (per managedFields) on this very object: not when it is missing, a
    tombstone, a copy, its token unreadable, or written (even removed) by another client."""
    return (
        view.exists
        and view.verified
        and not view.vanished
        and not view.token_malformed
        and view.token_writer is Writer.OURS
    )


def next_token(views: list[LeaseView], state_tokens: list[int], *, proven: bool) -> int | None:
    """The fencing token of a new acquisition, or None when none can be proven new yet.

    Every granted token T was written on a majority of leases and, before the acquisition
    counted, recorded as the floor of a majority of state objects. ``proven`` says the
    reads include one of those majorities' worth: a majority of leases that kept their
    history (:func:`history_known`), or every member's lease (a surviving lease not read
    may remember a token the floors do not have yet) together with the floors of a
    majority of state objects. The token goes above everything read: the leases' tokens
    and ``state_tokens``, the floors coordinator wrote on the state objects read. So an
    edit of one record (a token annotated lower, a floor removed) lowers nothing while the
    other holds T. Tokens another client wrote are no bound at all (``LeaseView.parse``
    drops them)."""
    if not proven:
        return None
    seen = [v.token for v in views if v.exists and not v.token_malformed]
    return max([*seen, *state_tokens, 0]) + 1
