"""The multi-cluster lease engine: acquire, renew, release, break, status.

The per-lease rules (may this lease be taken, has it lapsed, which token, what a
renewal finds) are pure functions in :mod:`coordinator.lease`; this package reads and
writes the leases, fans out over the members and decides the majority.

What it guarantees, and under which assumptions
-----------------------------------------------
A contender holds the lock when its lock id is the ``holderIdentity`` of live leases on
a majority q = floor(n/2) + 1 of the n members. Two majorities share a cluster, and on
one cluster every write is a compare-and-swap on ``resourceVersion``, so at most one
contender holds the lock at a time — provided that a lease is never taken over before
its holder's validity ended, and that a lease that disappears is never taken as free.

* Expiry evidence is the coordinator's own: the server's stamp on the ``coordinator``
  field manager's managedFields entry (our takes and renewals), compared with a fresh
  server stamp from a probe write made after the read. Edits by other field managers
  move neither. The HTTP ``Date`` only tells when to probe. A lease without our entry
  (stripped, or merged by the server into ``ancient-changes``) lapses only by local
  observation (the fields the lock rules read unchanged for a whole TTL on the
  contender's clock). A duration written by someone else is replaced by the
  deployment's maximum TTL.
* The margin before a lapse counts is drift (1 % of the TTL) + 2 s (one-second stamps)
  + ``max_server_skew`` (API servers of one cluster disagreeing on the time).
* The holder counts validity = TTL − elapsed − 1 % on CLOCK_BOOTTIME from the moment
  *before* it sent its writes; every server stamped those writes later, so contenders
  see the lapse strictly after the holder's validity ended, as long as clock rates
  agree within 1 % and server offsets within ``max_server_skew``.
* A lease found missing is recorded as a tombstone that counts as held by an unknown
  holder for one maximum TTL (no lease may be taken for longer). Leases are created
  with the deployment, so a missing one was deleted. A lease whose ``coordinator.io/uid``
  does not name the object itself is a recreated copy: it blocks for a maximum TTL after
  its creation and carries no history.
* Fencing tokens: one more than the highest on a majority of leases that kept their
  history; when deleted leases leave no such majority, every member's lease and the
  state replicas' tokens of a majority are included too; short of that, nothing is taken.
* Renewals return once a majority is renewed, never re-take a lease, and report the
  lock lost at once when a lease names another lock id with a token not below ours (a
  take after ours, or an edit) or a break note names ours.

Assumed: only coordinator writes a lease's ``spec`` holder fields and its
``coordinator.io/`` holder annotations; anyone may label or annotate it, strip its
managedFields, change its duration, or delete it (each handled as above).

Not guaranteed: a holder that stops past its validity may still act, unless it checks
``held.valid`` or the resource checks fencing tokens. A token can be granted again when
the leases and the state objects (which carry the token floor) of a majority are deleted
together: nothing in the clusters remembers it.

The engine is :class:`LockEngine` (``engine``): one ``core`` (the configuration it
counts with, and one lease's reads, writes and compare-and-swap) and one part per job,
each holding the core: ``members`` (the stored member set), ``acquire`` and ``turns``
(taking the lock, waiters' turns), ``renew``, ``release`` (release and break), ``floor``
(the token floor on the state objects), ``status``; ``bodies`` (what is written) and
``results``/``reports`` (what callers and people get) are plain functions and values.
This package re-exports the names other modules use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each name is imported from its module on first use (PEP 562), so that a command that
# only reads the lock (``lock status``) never imports the write side (acquire, turns,
# renew, release, floor) nor the history.
_WHERE = {
    **dict.fromkeys(
        [
            "A_COMMAND",
            "A_HOLDER",
            "A_HOST",
            "A_LAST_BREAK",
            "A_MEMBERS",
            "A_NAMESPACE",
            "A_NEXT",
            "A_PID",
            "A_REASON",
            "A_RELEASED",
            "A_TOKEN",
            "HANDOFF_GRACE_S",
            "LINE_MANAGER",
            "LeaseView",
            "TurnClaim",
        ],
        "coordinator.lease",
    ),
    "first_kube_error": "coordinator.lock.core",
    "LockEngine": "coordinator.lock.engine",
    "A_TOKEN_FLOOR": "coordinator.kube.resources",
    **dict.fromkeys(
        ["ABSENT", "envelope_evidence", "genesis_state_object", "set_on_state", "token_floor"],
        "coordinator.lock.floor",
    ),
    "keep_renewed": "coordinator.lock.renew",
    **dict.fromkeys(["acquire_report", "identity_report", "summarize"], "coordinator.lock.reports"),
    **dict.fromkeys(
        [
            "AcquireResult",
            "ClusterLease",
            "ClusterStatus",
            "Decision",
            "LockStatus",
            "current_command",
            "default_holder",
            "new_lock_id",
        ],
        "coordinator.lock.results",
    ),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from coordinator.kube.resources import A_TOKEN_FLOOR
    from coordinator.lease import (
        A_COMMAND,
        A_HOLDER,
        A_HOST,
        A_LAST_BREAK,
        A_MEMBERS,
        A_NAMESPACE,
        A_NEXT,
        A_PID,
        A_REASON,
        A_RELEASED,
        A_TOKEN,
        HANDOFF_GRACE_S,
        LINE_MANAGER,
        LeaseView,
        TurnClaim,
    )
    from coordinator.lock.core import first_kube_error
    from coordinator.lock.engine import LockEngine
    from coordinator.lock.floor import (
        ABSENT,
        envelope_evidence,
        genesis_state_object,
        set_on_state,
        token_floor,
    )
    from coordinator.lock.renew import keep_renewed
    from coordinator.lock.reports import acquire_report, identity_report, summarize
    from coordinator.lock.results import (
        AcquireResult,
        ClusterLease,
        ClusterStatus,
        Decision,
        LockStatus,
        current_command,
        default_holder,
        new_lock_id,
    )

__all__ = [
    "ABSENT",
    "A_COMMAND",
    "A_HOLDER",
    "A_HOST",
    "A_LAST_BREAK",
    "A_MEMBERS",
    "A_NAMESPACE",
    "A_NEXT",
    "A_PID",
    "A_REASON",
    "A_RELEASED",
    "A_TOKEN",
    "A_TOKEN_FLOOR",
    "HANDOFF_GRACE_S",
    "LINE_MANAGER",
    "AcquireResult",
    "ClusterLease",
    "ClusterStatus",
    "Decision",
    "LeaseView",
    "LockEngine",
    "LockStatus",
    "TurnClaim",
    "acquire_report",
    "current_command",
    "default_holder",
    "envelope_evidence",
    "first_kube_error",
    "genesis_state_object",
    "identity_report",
    "keep_renewed",
    "new_lock_id",
    "set_on_state",
    "summarize",
    "token_floor",
]
