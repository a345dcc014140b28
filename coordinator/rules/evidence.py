"""Who wrote a field: the one ownership rule every piece of evidence goes through.

A rule may read a field of a Lease or a state object only as far as coordinator wrote
it. The API server records, per field manager, which fields each writer set last
(``metadata.managedFields``); anyone who may edit an object in the namespace can write any
of its fields (`kubectl annotate`, `kubectl edit`, a server-side apply with
``--force-conflicts``), and the server then hands the field to that writer's manager.
So a field counts as coordinator's word only while a coordinator field manager
(``coordinator`` or ``coordinator-*``) owns it. A field whose writer the server no longer
records has no known writer (:attr:`Writer.UNKNOWN`) and is not coordinator's word either:
every rule treats it as not ours. That is a field nobody is recorded as owning
(managedFields stripped), one owned by ``before-first-apply`` (the name the server gives
fields it found unowned), or one owned by ``ancient-changes`` (the entry into which the
server merges the oldest Update entries once more than ten field managers have updated
the object: another client adding annotations under eleven managers of its own merges
coordinator's entries there, although nobody touched coordinator's fields). Any client can
also write under either name. Reports say the record of who wrote such a field is gone,
never that another client edited it.

Pure: no I/O, no clock. ``EVIDENCE`` lists every field a rule reads, who may write it,
what the rules do when another manager owns it or it is missing, and the test that shows
it; the documentation's evidence table is this list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from coordinator.rules.resources import FIELD_MANAGER


def is_ours(manager: str) -> bool:
    """A field manager some coordinator write uses (``coordinator``, ``coordinator-release``...)."""
    return manager == FIELD_MANAGER or manager.startswith(FIELD_MANAGER + "-")


def _fields_key(part: str) -> str:
    return "f:" + part


def owners(obj: dict[str, Any], path: Sequence[str]) -> tuple[str, ...]:
    """The field managers that own the field at ``path`` of ``obj`` per its managedFields,
    e.g. ``("metadata", "annotations", "coordinator.io/fencing-token")`` or
    ``("spec", "holderIdentity")``."""
    entries = (obj.get("metadata") or {}).get("managedFields") if isinstance(obj, dict) else None
    if not isinstance(entries, list) or not entries:
        return ()
    keys = [_fields_key(part) for part in path]  # once, not once per entry
    found: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        node: Any = entry.get("fieldsV1")
        for key in keys:
            if not isinstance(node, dict):
                break
            node = node.get(key)
        if isinstance(node, dict):
            found.append(str(entry.get("manager") or ""))
    return tuple(dict.fromkeys(found))


def ours(obj: dict[str, Any], path: Sequence[str]) -> bool:
    """Is the field at ``path`` coordinator's word: owned by a coordinator field manager?
    (Several managers own a field together only when they applied the same value, so one
    of ours among them vouches for the value.)"""
    return any(is_ours(m) for m in owners(obj, path))


def annotation(name: str) -> tuple[str, str, str]:
    return ("metadata", "annotations", name)


# Field managers that name nobody: none at all (managedFields stripped); the one a
# server-side apply gives every field that had no recorded writer; and the one the server
# merges the oldest Update entries into when more than ten managers have updated an object.
BEFORE_FIRST_APPLY = "before-first-apply"
ANCIENT_CHANGES = "ancient-changes"
NO_WRITERS = frozenset({"", BEFORE_FIRST_APPLY, ANCIENT_CHANGES})

# What a report says of a field with no known writer (Writer.UNKNOWN), and how that comes.
RECORD_GONE_HOW = (
    "managedFields stripped, or merged by the API server into ancient-changes after more than ten field "
    "managers updated the object"
)
RECORD_GONE = f"the record of who wrote it is gone ({RECORD_GONE_HOW})"


class Writer(StrEnum):
    """Who last wrote a field, as far as managedFields tell."""

    OURS = "ours"  # a coordinator field manager
    OTHER = "other"  # another client
    UNKNOWN = "unknown"  # no record (stripped managedFields, before-first-apply, ancient-changes)


def writer(obj: dict[str, Any], path: Sequence[str]) -> Writer:
    """Who wrote the field at ``path`` of ``obj`` (see :class:`Writer`)."""
    found = owners(obj, path)
    if any(is_ours(m) for m in found):
        return Writer.OURS
    if any(m not in NO_WRITERS for m in found):
        return Writer.OTHER
    return Writer.UNKNOWN


def tracked(obj: dict[str, Any]) -> bool:
    """Does the object carry managedFields at all? Stripped (``managedFields: [{}]``), the
    server stops recording writers until the next server-side apply."""
    entries = (obj.get("metadata") or {}).get("managedFields") if isinstance(obj, dict) else None
    return isinstance(entries, list) and any(isinstance(e, dict) and e.get("manager") for e in entries)


# Written by coordinator on an object whose writers the server stopped recording, together
# with the records it starts again from (see with_records).
A_RECORDS = "coordinator.io/records"


def with_records(body: dict[str, Any], read: dict[str, Any] | None, nonce: str) -> dict[str, Any]:
    """``body`` (the object to PUT in place of ``read``) so that the server records writers
    again where it stopped (managedFields stripped): an update alone does not restart the
    records, an update that brings managedFields does. The entry brought names only a fresh
    nonce annotation, so the write then owns exactly the fields it changes, under its own
    field manager and with the server's time stamp; fields it leaves as they were keep no
    known writer. Nothing is claimed for coordinator that coordinator does not write."""
    if read is None or tracked(read):
        return body
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), A_RECORDS: nonce}
    meta["managedFields"] = [
        {
            "manager": FIELD_MANAGER + "-records",
            "operation": "Update",
            "apiVersion": str(read.get("apiVersion") or body.get("apiVersion") or "v1"),
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {"f:" + A_RECORDS: {}}}},
        }
    ]
    return {**body, "metadata": meta}


@dataclass(frozen=True)
class Evidence:
    """One row of the evidence table."""

    field: str  # where it lives
    read_by: str  # which rule reads it
    writers: str  # who may write it (its field manager)
    otherwise: str  # what the rules do when another manager owns it, or it is missing
    test: str  # the test that shows it


EVIDENCE: tuple[Evidence, ...] = (
    Evidence(
        "Lease spec.holderIdentity",
        "who holds a lease; a renewal's 'still ours'",
        "coordinator (takes), coordinator-release (releases and breaks write it empty)",
        "another manager's, or none (removed, stripped, before-first-apply, ancient-changes): held by an unknown "
        "holder until "
        "coordinator's own write stamp, or local observation, shows a TTL passed; never ours, never free",
        "tests/lock/integration/test_evidence_owners.py::test_a_holder_edited_by_another_client_is_neither_free_nor_ours",
    ),
    Evidence(
        "Lease coordinator.io/fencing-token",
        "the next fencing token; a take racing a concurrent attempt",
        "coordinator",
        "another manager's, or none: the lease keeps no token history (as if deleted) and is no bound; "
        "the next token is proven by the leases that kept theirs, or by every lease with the state "
        "objects' floors, and goes above all of them",
        "tests/lock/integration/test_evidence_owners.py::test_kubectl_annotate_of_the_token_never_repeats_a_token",
    ),
    Evidence(
        "Lease managedFields time of manager coordinator",
        "expiry (our last take or renewal, against a probe's stamp)",
        "the API server, for writes under coordinator",
        "absent (stripped, or merged by the server into ancient-changes): expiry only by local observation of "
        "the fields the lock rules read, unchanged for a maximum TTL (other edits do not restart it)",
        "tests/lock/integration/test_lock_hardening.py::test_a_capped_lease_of_a_dead_holder_lapses_in_a_max_ttl_while_another_client_edits_it",
    ),
    Evidence(
        "Lease spec.leaseDurationSeconds",
        "the TTL a contender waits out",
        "coordinator",
        "another manager's: the deployment's maximum TTL instead",
        "tests/lock/integration/test_annotation_edits.py::test_annotation_edits_do_not_keep_a_dead_holders_lock_alive_forever",
    ),
    Evidence(
        "Lease coordinator.io/max-ttl",
        "the deployment's maximum TTL (tombstones, copies, durations not ours)",
        "coordinator",
        "another manager's, missing or above a day: the local record's maximum",
        "tests/lock/unit/test_max_ttl_notes.py::test_a_max_ttl_note_longer_than_a_day_is_not_believed_even_under_the_coordinator_manager",
    ),
    Evidence(
        "Lease coordinator.io/vanished",
        "a tombstone: held by an unknown holder for a maximum TTL",
        "coordinator",
        "another manager's, or none: not a tombstone (the mark neither lengthens a lock nor says a lease was deleted)",
        "tests/lock/integration/test_evidence_owners.py::test_a_planted_vanished_mark_does_not_keep_a_dead_holders_lock",
    ),
    Evidence(
        "Lease coordinator.io/uid",
        "this very object was written by coordinator (a copy names another uid)",
        "coordinator, coordinator-release",
        "another manager's, or none: the lease is treated as a copy (blocks for a maximum TTL after "
        "its creation, keeps no token history)",
        "tests/lock/integration/test_evidence_owners.py::test_a_uid_note_written_by_another_client_does_not_vouch_for_a_copy",
    ),
    Evidence(
        "Lease coordinator.io/last-break",
        "a renewal learns its lock was broken",
        "coordinator-release (lock break)",
        "another manager's, or none: ignored (a renewal then judges the holder field alone)",
        "tests/lock/integration/test_evidence_owners.py::test_a_planted_break_note_does_not_end_a_live_lock",
    ),
    Evidence(
        "Lease coordinator.io/membership",
        "the member set the members store",
        "coordinator",
        "another manager's: possibly planted, commands stop (exit 5); none: silence",
        "tests/members/integration/test_forged_member_sets.py",
    ),
    Evidence(
        "Lease coordinator.io/next",
        "whose turn is next",
        "coordinator-line",
        "another manager's, or none: ignored (claims only ever delay a take)",
        "tests/lock/integration/test_evidence_owners.py::test_a_planted_claim_does_not_reserve_the_next_turn",
    ),
    Evidence(
        "Lease managedFields time of manager coordinator-release",
        "when a lease was released (the next turn's reservation)",
        "the API server, for releases",
        "absent: no reservation (claims only delay)",
        "tests/lock/integration/test_lock_turns.py",
    ),
    Evidence(
        "State object coordinator.io/token-floor",
        "the next fencing token",
        "coordinator",
        "another manager's, or none: the object counts as missing for the token",
        "tests/state/integration/test_floor_evidence.py",
    ),
    Evidence(
        "State object coordinator.io/membership",
        "the member set, where a lease says nothing",
        "coordinator",
        "another manager's, or none: silence",
        "tests/state/integration/test_state_object_annotations.py::test_removing_the_state_objects_set_annotation_does_not_let_a_stale_envelope_speak",
    ),
    Evidence(
        "State object data envelope.json",
        "the replicated state (reads, confirmations, repair)",
        "coordinator",
        "another manager's, or none (ancient-changes, the server's merge of old entries, too), however "
        "well-formed: the replica is corrupt, never returned or copied, and unanswered where a value is "
        "chosen (reads, writes that build on the data, sync need a majority that decodes); the stamp "
        "it names is a bound: no write below it replaces it, sync writes no older value over it",
        "tests/state/integration/test_evidence_cap.py::test_one_corrupt_replica_and_one_down_refuse_a_write_rather_than_lose_a_confirmed_one",
    ),
    Evidence(
        "State object coordinator.io/state-promise",
        "the newest stamp a replica promised (writes below it are refused)",
        "coordinator",
        "another manager's, or none: the replica is corrupt until a write replaces it; the stamp is still a "
        "bound: no promise or write below it is taken (a fenced-out token replaces nothing)",
        "tests/state/integration/test_evidence_cap.py::test_a_fenced_out_write_never_replaces_a_confirmed_write_on_capped_replicas",
    ),
    Evidence(
        "State object coordinator.io/seeded",
        "an empty replica is the state `deployment create` made (an answer), not one made since",
        "coordinator",
        "another manager's, or none: the empty replica is no answer (as a missing object is none): it may "
        "stand where a deleted replica held the newest write",
        "tests/state/integration/test_evidence_cap.py::test_an_empty_object_a_lock_made_where_one_was_deleted_is_no_answer",
    ),
    Evidence(
        "History ConfigMap history.json",
        "lock history",
        "coordinator",
        "another manager's: not read; replaced by the next event",
        "tests/lock/integration/test_lock_history.py",
    ),
)
