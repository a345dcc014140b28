"""The bodies written to a lease: a take, a renewal, a release, a tombstone, a claim, a probe.

Pure: no I/O; the engine passes what it knows of the deployment."""

from __future__ import annotations

import math
from typing import Any

from coordinator import clock
from coordinator.engine.lock.results import utc_now
from coordinator.rules.lease import (
    A_COMMAND,
    A_HOLDER,
    A_HOST,
    A_NEXT,
    A_PID,
    A_REASON,
    A_RELEASED,
    A_TOKEN,
    A_UID,
    A_VANISHED,
    HOLDER_ANNOTATIONS,
    LeaseView,
    holder_identity,
)
from coordinator.rules.membership import A_MEMBERSHIP
from coordinator.rules.resources import micro_time, owned_metadata
from coordinator.rules.turnline import Line, dump_line, same_line


def fresh_lease(
    name: str, deployment: str, common: dict[str, str], *, vanished: bool, floor: int = 0
) -> dict[str, Any]:
    """A holderless lease: free (made with the deployment), or a tombstone for one
    found missing (it blocks for a maximum TTL; ``floor`` is the highest token this
    contender saw elsewhere). ``common``: the annotations every lease of the deployment
    carries, its member set included."""
    meta = owned_metadata(name, deployment)
    ann = dict(common)
    # The token and an empty holder are written, so that coordinator owns both from the
    # start: a token or a holder field nobody owns is no evidence (coordinator/rules/evidence.py).
    ann[A_TOKEN] = str(floor)
    if vanished:
        ann[A_VANISHED] = micro_time(utc_now())
        ann.pop(A_MEMBERSHIP, None)
    meta["annotations"] = ann
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {"holderIdentity": ""}}


def lease_body(
    view: LeaseView,
    *,
    name: str,
    deployment: str,
    common: dict[str, str],
    lock_id: str | None,
    token: int,
    ttl_s: float,
    holder: str | None = None,
    reason: str | None = None,
    command: str | None = None,
    renew_only: bool = False,
    keep_claim: bool = False,
) -> dict[str, Any]:
    """The lease ``view`` taken (``lock_id``), renewed (``renew_only``) or released
    (``lock_id`` None; ``keep_claim`` for a failed attempt giving back what it took).
    ``common``: the annotations the engine writes on every lease it writes (the member
    set among them only for takes and member changes)."""
    now = micro_time(utc_now())
    if view.exists:
        obj = {k: v for k, v in view.obj.items() if k not in ("status",)}
        meta = dict(obj.get("metadata") or {})
        spec = dict(obj.get("spec") or {})
    else:
        obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
        meta = owned_metadata(name, deployment)
        spec = {}
    ann = dict(meta.get("annotations") or {})
    if lock_id is None:  # release: clear the holder, keep the object and the token
        for key in HOLDER_ANNOTATIONS:
            ann.pop(key, None)
        if not keep_claim and view.held:
            _set_line(ann, view, view.line_without(view.lock_id))  # the holder's own claim, used up by its turn
        if not keep_claim:
            # A real release; a failed attempt giving back what it took leaves the
            # stamp alone, so that it does not keep the next turn reserved.
            ann[A_RELEASED] = now
        # Empty, not removed: coordinator owns the holder field of a free lease too, so a
        # holder field another client removed is told from a release.
        spec["holderIdentity"] = ""
        spec.pop("acquireTime", None)
        spec.pop("renewTime", None)
    elif renew_only:
        spec["renewTime"] = now
        spec["leaseDurationSeconds"] = math.ceil(ttl_s)
    else:
        if view.lock_id != lock_id:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if view.exists else 0)
            spec["acquireTime"] = now
        spec["holderIdentity"] = holder_identity(holder or "", lock_id)
        spec["leaseDurationSeconds"] = math.ceil(ttl_s)
        spec["renewTime"] = now
        ann.pop(A_VANISHED, None)  # a tombstone taken: its history starts at our token
        ann.pop(A_RELEASED, None)
        # the previous holder's own claim (used up), and those whose turn has passed
        _set_line(ann, view, view.line_after_take())
        ann.update(
            {
                A_HOLDER: holder or "",
                A_HOST: clock.host(),
                A_PID: str(clock.pid()),
                A_REASON: reason or "",
                A_COMMAND: command or "",
            }
        )
    if lock_id is not None:
        ann[A_TOKEN] = str(token)
    if view.exists and view.uid:
        ann[A_UID] = view.uid  # this very object was written by coordinator
    # The member set is written by takes and member changes only, which check first
    # what the lease stores. A renewal or a release leaves it as it is: written there,
    # an engine's set could put an older configuration back over a change made since
    # (or over one someone edited, turning that edit into coordinator's own word).
    ann.update(common)
    meta["annotations"] = ann
    labels = dict(meta.get("labels") or {})
    labels.update(owned_metadata(name, deployment)["labels"])
    meta["labels"] = labels
    obj["metadata"] = meta
    obj["spec"] = spec
    return obj


def with_annotation(obj: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    """The lease ``obj`` (resourceVersion kept: a compare-and-swap) with one annotation set."""
    body = {k: v for k, v in obj.items() if k != "status"}
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), key: value}
    body["metadata"] = meta
    return body


def _set_line(ann: dict[str, str], view: LeaseView, line: Line) -> None:
    """Write ``line`` into the annotations ``ann`` of ``view``'s lease where it differs
    from what the lease lists (an unreadable annotation lists nobody, and goes)."""
    if line and same_line(line, view.line):
        return
    if line:
        ann[A_NEXT] = dump_line(line)
    else:
        ann.pop(A_NEXT, None)


def with_line(obj: dict[str, Any], view: LeaseView, line: Line) -> dict[str, Any]:
    """The lease ``obj`` (resourceVersion kept: a compare-and-swap) listing ``line``
    (no annotation for an empty line); ``view`` is ``obj`` parsed."""
    body = {k: v for k, v in obj.items() if k != "status"}
    meta = dict(body.get("metadata") or {})
    ann = dict(meta.get("annotations") or {})
    _set_line(ann, view, line)
    meta["annotations"] = ann
    body["metadata"] = meta
    return body
