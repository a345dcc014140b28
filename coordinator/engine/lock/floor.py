"""The token floor: a granted fencing token outlives the deletion of every lease.

The floor and the member set live on the state objects too (annotations); this module
reads what they record (for a new token when leases were deleted) and raises the floor
before an acquisition counts."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, assert_never

from coordinator import clock
from coordinator.engine import cas
from coordinator.engine.clusters import failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.core import EngineCore
from coordinator.engine.lock.release import Release
from coordinator.engine.lock.results import AcquireResult, ClusterLease, Decision
from coordinator.errors import NoQuorumError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules.evidence import with_records
from coordinator.rules.lease import LeaseView
from coordinator.rules.membership import (
    A_MEMBERSHIP,
    Membership,
    Stored,
    annotation_writers,
    in_lease_object,
    is_ours,
    says_nothing,
)
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import A_TOKEN_FLOOR, FIELD_MANAGER, owned_metadata, state_name, state_paths

log = get_logger("coordinator.engine.lock")


ABSENT = "no state object"
NO_FLOOR = "no token floor"


# As many digits as a lease's token may have (Python's int() refuses longer text).
_MAX_DIGITS = 4300


def _floor_text(obj: dict[str, Any]) -> str | None:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(A_TOKEN_FLOOR)
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS:
        return raw
    return None


def token_floor(obj: dict[str, Any]) -> int:
    """The token floor a state object carries (0 for none or garbage), whoever wrote it:
    a higher floor only makes the next token higher. Any length a lease's token may have
    is read: a floor read as 0 would let tokens go down."""
    raw = _floor_text(obj)
    return int(raw) if raw is not None else 0


def floor_is_ours(obj: dict[str, Any]) -> bool:
    """Whether a coordinator field manager owns the floor annotation (managedFields)."""
    return any(is_ours(w) for w in annotation_writers(obj, A_TOKEN_FLOOR))


def set_on_state(obj: dict[str, Any]) -> Membership | None:
    """The member set a state object's annotation stores, when a coordinator field
    manager wrote it (anyone allowed to edit the object could have put any set there)."""
    stored = in_lease_object(obj)  # the same annotation, read the same way
    if not isinstance(stored, Membership) or not stored.written_by_us:
        return None
    return stored


def _set_on_state_is_behind(obj: dict[str, Any], ours: Membership) -> bool:
    return _kept_is_behind(set_on_state(obj), ours)


def _kept_is_behind(noted: Stored, ours: Membership) -> bool:
    """Whether a state object's noted set (see set_on_state) is an older one of
    coordinator's than ``ours``: only such a note is raised to ``ours``.

    A missing note (never written, removed, or written by another client) is left
    missing. A write is decided before it lands, and may land late: a note written where
    none is could put back a set from before a member change that someone's removal of
    the note had left silent, and a member that then says nothing on its lease would
    agree with a stale record. Raising an older note never goes below what is there."""
    return isinstance(noted, Membership) and noted.epoch < ours.epoch


def has_floor(obj: dict[str, Any]) -> bool:
    """Whether a state object carries a token floor that speaks: a number, written by
    coordinator. Every acquisition raises the floor on a majority before it counts, and
    `deployment create` creates the objects with one, so a majority of objects carry one;
    an object without it (recreated by a state write, or its floor removed, garbled or
    rewritten by another client, perhaps lowered) knows only the token of its last state
    write, which can be below a token granted since."""
    return _floor_text(obj) is not None and floor_is_ours(obj)


def envelope_evidence(obj: dict[str, Any], *, secret: bool) -> tuple[int, Stored] | None:
    """From a state object: the highest fencing token it records (its envelope's or its
    token floor) and the member set its annotation stores, when a coordinator field
    manager wrote it; None when the envelope is unreadable.

    The envelope's own member set is not evidence: it is the set of the object's last
    state write, which a removed member keeps for ever, and with the annotation removed
    (by anyone allowed to annotate the object) it would speak for the old set again.
    Acquisitions and member changes note the set in the annotation; so does
    `deployment create`."""
    raw = (obj.get("data") or {}).get("envelope.json")
    if not isinstance(raw, str):
        return None
    token = (
        _envelope_token(raw, secret) if len(raw) <= _REMEMBERED_ENVELOPE else _envelope_token.__wrapped__(raw, secret)
    )
    if token is None:
        return None
    return max(token, token_floor(obj)), set_on_state(obj)


# Every acquisition reads the state objects for their tokens, and an envelope changes only
# with a state write: an envelope's token is read once per text (the text is all it
# depends on). Only envelopes up to this size are remembered, so that the cache stays small.
_REMEMBERED_ENVELOPE = 64 * 1024


@lru_cache(maxsize=32)
def _envelope_token(raw: str, secret: bool) -> int | None:
    """The fencing token an envelope's text records; None when it is unreadable."""
    try:
        text = base64.b64decode(raw).decode() if secret else raw
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    token = doc.get("token") if isinstance(doc, dict) else None
    if not isinstance(token, int) or token < 0:
        return None
    return token


def kept_set_speaks(lease_set: Stored, kept: Stored, ours: Membership) -> Membership | None:
    """The member set a state object keeps (``kept``), where it speaks for a member whose
    lease says nothing of the set (deleted, a tombstone, its set removed): when it is ours
    or newer. Envelopes keep the set of their last write, so an older epoch says nothing."""
    if isinstance(kept, Membership) and kept.epoch >= ours.epoch and says_nothing(lease_set, ours):
        return kept
    return None


def genesis_state_object(
    deployment: str, storage: str, membership: dict[str, Any] | None, *, seeded: bool = False
) -> dict[str, Any]:
    """A state object holding the empty state of ``deployment`` and its member set (None:
    no note of one); ``seeded`` for `deployment create`'s (an answer to reads,
    register.SEEDED_ANNOTATION), not for one made later where the object was missing (it
    may have been deleted)."""
    from coordinator.engine.register import DATA_KEY, NOTE, NOTE_ANNOTATION, SEEDED_ANNOTATION, genesis_text

    text = genesis_text(deployment, membership)
    secret = storage == "secret"
    annotations = {NOTE_ANNOTATION: NOTE, A_TOKEN_FLOOR: "0"}  # no token granted yet
    if seeded:
        annotations[SEEDED_ANNOTATION] = "true"
    noted = Membership.parse(membership) if membership is not None else None
    if noted is not None:
        annotations[A_MEMBERSHIP] = noted.dump()
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret" if secret else "ConfigMap",
        "metadata": owned_metadata(state_name(deployment), deployment) | {"annotations": annotations},
        "data": {DATA_KEY: base64.b64encode(text.encode()).decode() if secret else text},
    }
    if secret:
        body["type"] = "Opaque"
    return body


class TokenFloor:
    """The engine's token floor on the state objects."""

    def __init__(self, core: EngineCore, releases: Release) -> None:
        self.core = core
        self.releases = releases  # to give the lock back when the floor cannot be raised

    async def state_one(self, cluster: str) -> ClusterResult[tuple[int, Stored]]:
        """What one member's state object says: the fencing token it records (its
        envelope's or its token floor, the higher) and the member set it stores; the
        detail says when it is missing (ABSENT) or carries no floor of coordinator's."""
        _, path = state_paths(self.core.dep.namespace, self.core.dep.name, self.core.dep.storage)
        try:
            resp = await self.core.clusters.client(cluster).request("GET", path)
        except KubeError as err:
            if err.kind == kube.NOT_FOUND:
                return ClusterResult(cluster, Outcome.OK, (0, None), detail=ABSENT)
            return failed(cluster, err)  # type: ignore[return-value]
        found = envelope_evidence(resp.body, secret=self.core.dep.storage == "secret")
        if found is None:
            return ClusterResult(cluster, Outcome.ERROR, detail="unreadable state envelope")
        return ClusterResult(cluster, Outcome.OK, found, detail="" if has_floor(resp.body) else NO_FLOOR)

    def present(self, results: Mapping[str, ClusterResult[tuple[int, Stored]]]) -> list[str]:
        # An object without a floor counts like a missing one: it may be one whose floor
        # was removed, and the token it knows may be below one granted since.
        return [k for k, r in results.items() if r.ok and r.detail not in (ABSENT, NO_FLOOR)]

    def everyone(self, results: Mapping[str, ClusterResult[tuple[int, Stored]]]) -> bool:
        return len(results) == self.core.n and all(r.ok for r in results.values())

    def judge_state(
        self, results: Mapping[str, ClusterResult[tuple[int, Stored]]]
    ) -> dict[str, tuple[int, Stored]] | None:
        """From the state objects read: per member, the token and the member set of a
        majority that carry a floor, or None while no such majority speaks.

        A missing state object, or one without a token floor, says nothing (it may have
        held the floor of the token to beat and been deleted): it counts, as token 0,
        only when every member answered and too few objects are left to make a majority
        (a state never recorded anywhere, or deleted on a majority, which no record
        survives) and none of those left lacks a floor. Not when an object is there
        without a floor of coordinator's: `deployment create` gives every object one and
        acquisitions raise it, so its floor was removed or rewritten (or the object was
        recreated by a state write after a deletion), and what it knows may be below a
        token granted since. No token is proven new then (exit 4 or 5) until an
        acquisition, or an operator, puts a floor back."""
        counted = self.present(results)
        if not self.core.majorities.reached(counted):
            if not self.everyone(results):
                return None
            floorless = [k for k, r in results.items() if r.ok and r.detail == NO_FLOOR]
            if floorless:
                log.warning("state objects without a token floor of coordinator's", clusters=sorted(floorless))
                return None
            counted = list(results)
        return self.core.evidence_of({k: v for k in counted if (v := results[k].value) is not None})

    async def state_evidence(self) -> dict[str, tuple[int, Stored]]:
        """What a majority of the state replicas say (see :meth:`judge_state`); returns
        as soon as a majority of state objects with a floor answered. Empty when none
        such majority could be read."""
        results = await fan_out(
            self.core.members,
            self.state_one,
            timeout=self.core.timeout,
            until=lambda rs: self.core.majorities.reached(self.present(rs)) or self.everyone(rs),
            silent=self.core.clusters.silent,
        )
        return self.judge_state(results) or {}

    async def record_token_floor(self, result: AcquireResult) -> None:
        """Raise the token floor of the state objects of a majority to the new token
        before the acquisition counts. The leases are the tokens' history, but a holder
        that never writes the state leaves its token on the leases alone: with every lease
        deleted, the next acquisition would hand it out again. The floor lives on the
        state objects (`coordinator.io/token-floor`), whose tokens the next acquisition
        reads when the leases lost their history. When it cannot be raised on a majority,
        the lock is given back and the acquisition fails (exit 4)."""
        if result.fencing_token is not None:
            await self.raise_token_floor(result.fencing_token, result.lock_id, payload=result)

    async def raise_token_floor(self, token: int, lock_id: str, *, payload: Any = None) -> None:
        """Raise the token floor to ``token`` on a majority of every set of this
        configuration; otherwise give lock ``lock_id`` back and raise NoQuorumError.
        The same write stores this configuration's member set on the state objects
        (annotation ``coordinator.io/membership``) where they carry an older one."""
        results = await fan_out(
            self.core.members,
            lambda c: self._raise_floor(c, token),
            timeout=self.core.timeout,
            until=lambda rs: self.core.majorities.reached(k for k, r in rs.items() if r.ok),
            silent=self.core.clusters.silent,
        )
        if self.core.majorities.reached(k for k, r in results.items() if r.ok):
            return
        undone = await self.releases.give_back(lock_id, "leases taken")
        why = "; ".join(f"{k}: {r.detail or r.outcome}" for k, r in sorted(results.items()) if not r.ok)
        raise NoQuorumError(
            f"Took the leases of {self.core.dep.name!r} with fencing token {token}, but could not record that token "
            f"on the state objects of a majority ({why}). {undone} Without that record a token could be handed "
            "out twice if every lease were deleted, so the lock is not taken. Retry when the members accept "
            "writes of the state object again.",
            payload=payload,
        )

    async def store_set_on_state(self, token: int) -> dict[str, ClusterResult[int]]:
        """Store this configuration's member set (and the floor ``token``) on every
        member's state object; the results per member. A member change calls it once
        the new set is committed: the leases are not the only place that set lives, so
        deleting every lease cannot leave the members unable to confirm it."""
        return await fan_out(
            self.core.members,
            lambda c: self._raise_floor(c, token),
            timeout=self.core.timeout,
            silent=self.core.clusters.silent,
        )

    async def set_first(
        self, cluster: str, known: ClusterResult[tuple[int, Stored]] | None = None
    ) -> ClusterResult[int] | None:
        """Before a lease write that stores this engine's member set on ``cluster``: the
        member's state object stores that set first, where it keeps an older one (or its
        note was removed). None when the lease may be written; the failure otherwise.

        So a lease never stores a newer set than its own state object (unless someone
        removed the state object's note, which leaves it silent): removing the lease's
        note, or the lease, lets the state object speak for the newer set, never for an
        older one a machine with a stale record would take for agreement. ``known`` is
        the state object as this attempt read it; where it already stores this set (or
        a newer one), or is missing or carries no note, nothing is written."""
        if known is not None and known.ok and known.value is not None:
            if known.detail == ABSENT or not _kept_is_behind(known.value[1], self.core.membership):
                return None
        result = await self._raise_floor(cluster, None)
        return None if result.ok else result

    async def before_lease_write(
        self,
        cluster: str,
        view: LeaseView,
        decide: Callable[[LeaseView], Decision],
        known: ClusterResult[tuple[int, Stored]] | None = None,
        *,
        refused_as: str = "not written",
    ) -> ClusterResult[ClusterLease] | None:
        """set_first where ``decide`` says this read of the lease will be written (a
        refusal writes nothing anywhere): None when the lease may be written, else the
        lease's result, ``refused_as`` saying what became of it."""
        if isinstance(decide(view), ClusterResult):
            return None
        refused = await self.set_first(cluster, known)
        if refused is None:
            return None
        return ClusterResult(
            cluster,
            refused.outcome,
            ClusterLease(view, "not attempted"),
            detail=f"{refused_as}: the member set could not be noted on its state object first "
            f"({refused.detail or refused.outcome})",
        )

    async def _raise_floor(self, cluster: str, token: int | None) -> ClusterResult[int]:
        """Raise ``cluster``'s token floor to ``token`` and note this engine's set on its
        state object where it keeps an older one; ``token`` None: the set only, and a
        missing state object is left missing (a missing one says nothing of any set)."""
        collection, path = state_paths(self.core.dep.namespace, self.core.dep.name, self.core.dep.storage)
        client = self.core.clusters.client(cluster)
        query = {"fieldManager": FIELD_MANAGER}

        async def read() -> dict[str, Any] | None:
            try:
                body: dict[str, Any] = (await client.request("GET", path)).body
            except KubeError as err:
                if err.kind != kube.NOT_FOUND:
                    raise
                return None
            return body

        def decide(obj: dict[str, Any] | None) -> cas.Put[dict[str, Any]] | cas.Keep[int]:
            if obj is None:
                if token is None:
                    return cas.Keep(0)
                # Made with the floor and no member-set note: this write may land long
                # after it was decided, where the object was deleted after a member
                # change, and a note of this engine's set could be a stale one.
                body = genesis_state_object(self.core.dep.name, self.core.dep.storage, None)
                body["metadata"]["annotations"][A_TOKEN_FLOOR] = str(token)
                return cas.Put(body)
            changes: dict[str, str] = {}
            if token is not None and (token_floor(obj) < token or not has_floor(obj)):
                # (a floor another client wrote is made ours, never lowered)
                changes[A_TOKEN_FLOOR] = str(max(token, token_floor(obj)))
            if _set_on_state_is_behind(obj, self.core.membership):
                changes[A_MEMBERSHIP] = self.core.membership.dump()
            if not changes:
                return cas.Keep(token_floor(obj))
            meta = dict(obj.get("metadata") or {})
            meta["annotations"] = dict(meta.get("annotations") or {}) | changes
            return cas.Put({**obj, "metadata": meta})

        async def write(obj: dict[str, Any] | None, body: dict[str, Any]) -> int:
            if obj is None:
                await client.request("POST", collection, body=body, query=query)
            else:
                body = with_records(body, obj, clock.token_hex(6))
                await client.request("PUT", path, body=body, query=query)  # resourceVersion: CAS
            return token or 0

        result = await cas.compare_and_swap(read, decide, write)
        match result:
            case cas.Written(value=floor) | cas.Decided(value=floor):
                return ClusterResult(cluster, Outcome.OK, floor)
            case cas.ReadFailed(error=err) | cas.WriteFailed(error=err):
                return failed(cluster, err)  # type: ignore[return-value]
            case cas.Raced():
                return ClusterResult(cluster, Outcome.CONFLICT, detail="lost the compare-and-swap race repeatedly")
        assert_never(result)
