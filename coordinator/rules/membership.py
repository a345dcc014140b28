"""Pure rules of a deployment's member set as the clusters store it.

The member set decides what a majority is, so it cannot be each machine's private
opinion: two machines whose local records name different members could both find "a
majority" in disjoint sets. The set is therefore stored in the clusters, by cluster
*identity* (never by anyone's local names) with a configuration epoch, on every member's
Lease (annotation ``coordinator.io/membership``) and in the state envelope; every command
compares what the members it reaches store with its local record before it decides
anything.

No I/O here: the engine gathers what each member stores and :func:`check` decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import Any, Final

from coordinator.rules.evidence import NO_WRITERS, RECORD_GONE
from coordinator.rules.quorum import Majorities
from coordinator.rules.resources import ANNOTATION_PREFIX, FIELD_MANAGER
from coordinator.text import printable

A_MEMBERSHIP = ANNOTATION_PREFIX + "membership"
# Where annotations are listed in a managedFields entry's fieldsV1.
_F_ANNOTATIONS = "f:annotations"


@dataclass(frozen=True)
class Membership:
    """A member set by identity, with the epoch of the configuration that made it."""

    epoch: int
    members: tuple[str, ...]
    # While the set changes: the new set. Decisions then need a majority of both.
    joint: tuple[str, ...] | None = None
    # Read from a lease: the field manager(s) that own the annotation there ("" when no
    # managedFields entry does). None when not known (parsed from text, or from a state
    # envelope). Not part of the value: two equal sets are equal whoever wrote them.
    writers: tuple[str, ...] | None = field(default=None, compare=False)

    @property
    def unowned(self) -> bool:
        """Read from a lease whose managedFields name no writer of the annotation: who wrote
        it is not known, neither coordinator nor anyone else (coordinator.rules.evidence.NO_WRITERS:
        stripped, ``before-first-apply``, or merged into ``ancient-changes``)."""
        return self.writers is not None and all(w in NO_WRITERS for w in self.writers)

    @property
    def written_by_us(self) -> bool:
        """False when read from a lease where no coordinator field manager owns the
        annotation: someone else (``kubectl annotate``, a planted lease) set it, so it is
        no evidence of what any coordinator decided."""
        return self.writers is None or any(is_ours(w) for w in self.writers)

    def writer_text(self) -> str:
        named = [printable(w) for w in self.writers or () if w not in NO_WRITERS]
        return "field manager " + ", ".join(named) if named else f"no known writer: {RECORD_GONE}"

    @classmethod
    def of(cls, identities: Iterable[str], epoch: int = 1, joint: Iterable[str] | None = None) -> Membership:
        return cls(int(epoch), tuple(sorted(set(identities))), tuple(sorted(set(joint))) if joint is not None else None)

    @classmethod
    def parse(cls, raw: Any) -> Membership | None:
        """From the annotation text (or a decoded JSON document); None if unreadable."""
        if isinstance(raw, str):
            # Every read of a lease or state object parses its annotation, which changes
            # only with the member set: a text is parsed once (a Membership is immutable).
            # Only texts of an annotation's size are remembered, so that text from the
            # clusters cannot make the cache large.
            return _parsed_text(raw) if len(raw) <= _REMEMBERED_TEXT else _parsed_text.__wrapped__(raw)
        return cls._from_document(raw)

    @classmethod
    def _from_document(cls, doc: Any) -> Membership | None:
        if not isinstance(doc, dict):
            return None
        epoch, members = doc.get("epoch"), doc.get("members")
        # a JSON true is an int to Python, but no epoch
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            return None
        if not isinstance(members, list) or not members:
            return None
        if not all(isinstance(m, str) and m for m in members):
            return None
        joint = doc.get("joint")
        if joint is not None and (
            not isinstance(joint, list) or not joint or not all(isinstance(m, str) and m for m in joint)
        ):
            return None
        return cls.of(members, epoch, joint)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"epoch": self.epoch, "members": list(self.members)}
        if self.joint is not None:
            doc["joint"] = list(self.joint)
        return doc

    def dump(self) -> str:
        return json.dumps(self.document(), separators=(",", ":"))

    @property
    def quorum(self) -> int:
        return len(self.members) // 2 + 1


_REMEMBERED_TEXT = 4096


@lru_cache(maxsize=64)
def _parsed_text(raw: str) -> Membership | None:
    try:
        doc = json.loads(raw)
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return None  # garbage, or nested past the recursion limit: unreadable
    return Membership._from_document(doc)


def is_ours(manager: str) -> bool:
    """A field manager some coordinator write uses (``coordinator``, ``coordinator-release``...)."""
    return manager == FIELD_MANAGER or manager.startswith(FIELD_MANAGER + "-")


def annotation_writers(obj: dict[str, Any], annotation: str = A_MEMBERSHIP) -> tuple[str, ...]:
    """The field managers that own ``annotation`` on ``obj`` per its managedFields, e.g.
    ``{"manager": "coordinator", "fieldsV1": {"f:metadata": {"f:annotations":
    {"f:coordinator.io/membership": {}}}}}``."""
    owners = []
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(entry, dict):
            continue
        meta = (entry.get("fieldsV1") or {}).get("f:metadata")
        anns = meta.get(_F_ANNOTATIONS) if isinstance(meta, dict) else None
        if isinstance(anns, dict) and "f:" + annotation in anns:
            owners.append(str(entry.get("manager") or ""))
    return tuple(dict.fromkeys(owners))


class _Unstated:
    """A lease that states no member set: its annotation was removed (anyone allowed to
    annotate the lease can), or never written there. It is no evidence either way, so it
    counts like a member that stores nothing (a deleted lease): never as agreeing."""

    def __repr__(self) -> str:
        return "UNSTATED"


UNSTATED: Final = _Unstated()
Stored = Membership | _Unstated | None  # None: the member answered but stores nothing


class Verdict(StrEnum):
    OK = "ok"
    CONFLICT = "conflict"  # a member stores another set under the same or a newer epoch
    UNCONFIRMED = "unconfirmed"  # fewer than a majority store our set, and all answered
    UNOBSERVABLE = "unobservable"  # could still be confirmed: too few members answered


@dataclass
class Check:
    """The outcome of comparing what the members store with the local record."""

    verdict: Verdict
    local: Membership
    agreeing: list[str] = field(default_factory=list)
    conflicting: dict[str, Membership] = field(default_factory=dict)
    behind: list[str] = field(default_factory=list)  # store an older epoch
    silent: list[str] = field(default_factory=list)  # answered, store nothing
    unseen: list[str] = field(default_factory=list)
    # During a member change (two groups): the groups a confirming majority is missing in.
    short: list[list[str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    def explain(self, deployment: str, names: Mapping[str, str] | None = None) -> str:
        """The paragraph a person reads: what differs, and what to do."""
        names = dict(names or {})

        def name(identity: str) -> str:
            # identities are read from the clusters: anyone who may edit a lease chose them
            return names.get(identity, f"identity {printable(identity)}")

        if self.verdict is Verdict.CONFLICT:
            stored = max(self.conflicting.values(), key=lambda m: m.epoch)
            where = ", ".join(sorted(c for c, m in self.conflicting.items() if m == stored))
            added = [name(i) for i in stored.members if i not in self.local.members]
            removed = [name(i) for i in self.local.members if i not in stored.members]
            parts = []
            if added:
                parts.append("members it has and this machine's record lacks: " + ", ".join(added))
            if removed:
                parts.append("members this machine's record has and it lacks: " + ", ".join(removed))
            if stored.epoch != self.local.epoch:
                parts.append(f"configuration epoch {stored.epoch} there, {self.local.epoch} here")
            head = (
                f"The member set of deployment {deployment!r} stored on {where} differs from this machine's "
                f"record ({'; '.join(parts) or 'different members'}). Nothing was done: a majority counted "
                "over the wrong members would not be a majority."
            )
            if not stored.written_by_us:
                return head + (
                    f" No coordinator wrote that set there (the annotation {A_MEMBERSHIP} is owned by "
                    f"{stored.writer_text()}): it may have been planted or edited by hand. Find out who changed "
                    f"it; if it is not a member change you know of, remove that annotation on {where} and retry."
                )
            adopt = (
                f"`coordinator deployment delete {deployment}` and `coordinator deployment import {deployment} "
                f"--cluster {where.split(', ')[0]}` (connect any missing cluster first; the import checks that a "
                "majority of the stored set's members store it)"
            )
            target = change_from(self.local, stored)
            if target is None:
                return head + f" Adopt the stored set with {adopt}."
            change = (
                f" It is a step of a member change from this machine's member set to "
                f"{', '.join(name(i) for i in target)}"
            )
            run_it = change_command(deployment, self.local, target, name)
            if stored.joint is not None:
                # Its joint set: running that change here recognises it (on a lease or
                # a state object) and finishes it. An import would not do: it reads the
                # leases, and the joint set may be noted on state objects alone (its
                # lease writes refused, or the leases deleted since).
                return head + (
                    f"{change} (its joint configuration), which stopped before this machine's record followed. "
                    f"Run that change here to finish it and bring the record along: {run_it}; then retry."
                )
            return head + (
                f"{change} (its commit). Run that change here to bring the record along (it finishes the change "
                f"if it stopped half-way): {run_it}; or adopt the stored set with {adopt}."
            )
        told = []
        if self.silent:
            told.append(f"{', '.join(self.silent)} store no member set (lease or state deleted)")
        if self.behind:
            told.append(f"{', '.join(self.behind)} store an older configuration")
        if self.unseen:
            told.append(f"{', '.join(self.unseen)} could not be read")
        if self.short:
            group = self.short[0]
            counted = f"{len(set(self.agreeing).intersection(group))} of the {len(group)} members {', '.join(group)}"
            needed = (
                f"{len(group) // 2 + 1} are needed (while a member change is under way, a majority of the old "
                "set and of the new set)"
            )
        else:
            counted = f"{len(self.agreeing)} of {len(self.local.members)} members"
            needed = f"{self.local.quorum} are needed"
        head = (
            f"Only {counted} of deployment {deployment!r} "
            f"confirm this machine's member set (epoch {self.local.epoch}); {needed}"
            + (f": {'; '.join(told)}" if told else "")
            + ". Nothing was done."
        )
        if self.local.joint is not None:
            # The members behind are where a member change that stopped half-way has not
            # written yet: finishing it is what brings them along, not an import.
            going = ", ".join(name(i) for i in self.local.joint)
            return head + (
                f" This machine's record has a member change of {deployment!r} in progress (to {going}) that "
                "stopped half-way: run that change again (the same `coordinator deployment add-cluster`, "
                "`remove-cluster` or `replace-cluster` command) to finish it, then retry; if members are "
                "unreachable, retry when they answer."
            )
        return head + (
            f" If the deployment was changed elsewhere, re-import it with `coordinator deployment import "
            f"{deployment} --cluster NAME`; if members are unreachable, retry when they answer."
        )


def change_from(local: Membership, stored: Membership) -> tuple[str, ...] | None:
    """The new member set of the member change from ``local`` (a record not in a change)
    of which ``stored`` (written by coordinator) is a step, or None: its joint
    configuration (``local``'s members at the next epoch, changing to the new set) or its
    commit (the new set two epochs on, sharing a member with ``local``). Such a change,
    run again from ``local``, recognises the step and finishes it."""
    if local.joint is not None or not stored.written_by_us:
        return None
    if stored.joint is not None:
        return stored.joint if stored.epoch == local.epoch + 1 and stored.members == local.members else None
    if stored.epoch == local.epoch + 2 and set(stored.members).intersection(local.members):
        return stored.members
    return None


def change_command(deployment: str, local: Membership, going: Sequence[str], name: Callable[[str], str]) -> str:
    """The command that changes ``local``'s members to ``going`` (identities; ``name``
    gives a cluster's local name), in words: one added, removed or replaced cluster is
    one command; any other change is named by its target set."""
    added = [name(i) for i in going if i not in local.members]
    removed = [name(i) for i in local.members if i not in going]
    unknown = [n for n in (*added, *removed) if n.startswith("identity ")]
    if unknown:
        return (
            f"the change to {', '.join(name(i) for i in going)} (connect {', '.join(unknown)} first with "
            "`coordinator cluster connect`)"
        )
    if len(added) == 1 and not removed:
        return f"`coordinator deployment add-cluster {deployment} {added[0]}`"
    if len(removed) == 1 and not added:
        return f"`coordinator deployment remove-cluster {deployment} {removed[0]}`"
    if len(added) == 1 and len(removed) == 1:
        return f"`coordinator deployment replace-cluster {deployment} {removed[0]} {added[0]}`"
    return f"the change to {', '.join(name(i) for i in going)}"


def explain_existing(result: Check, deployment: str, namespace: str, names: Mapping[str, str]) -> str:
    """Why ``deployment create`` stops when a member already stores another set, and what
    to do. The import advice is given only for a set that a coordinator wrote and that a
    majority of its own members (among those read here) store: a set found on one
    cluster alone may have been planted by anyone allowed to create leases there, and
    importing it would let them choose the members."""
    stored = max(result.conflicting.values(), key=lambda m: m.epoch)
    where = sorted(c for c, m in result.conflicting.items() if m == stored)
    listed = ", ".join(names.get(i, f"identity {printable(i)}") for i in stored.members)
    found = f"epoch {stored.epoch}, members {listed}, found on {', '.join(where)}"
    confirming = [c for c in where if any(names.get(i) == c for i in stored.members)]
    head = f"Deployment {deployment!r} already exists in namespace {namespace!r} with a different member set ({found})."
    if not stored.written_by_us:
        return head + (
            f" No coordinator wrote that set (the annotation {A_MEMBERSHIP} is owned by {stored.writer_text()}): "
            "it may have been planted by someone allowed to create leases in this namespace, so do not import it. "
            f"Nothing was recorded. If no deployment {deployment!r} of yours lives there, delete that lease "
            f"(coordinator-lock-{deployment} in namespace {namespace!r} on {', '.join(where)}) and create again, "
            "or choose another name."
        )
    if len(confirming) < len(stored.members) // 2 + 1:
        return head + (
            f" Only {len(confirming)} of its {len(stored.members)} members were found storing it here, fewer than a "
            "majority: it may be left over from a removed deployment, or planted. Nothing was recorded. Find out "
            "whose it is; `coordinator deployment import` adopts a set only where a majority of its members store it."
        )
    return head + (
        f" Nothing was recorded. If it is yours, adopt it with `coordinator deployment import {deployment} "
        f"--cluster {confirming[0]}`; otherwise choose another name."
    )


def newer_set(
    stored: Stored, ours: Membership, agrees: Callable[[Membership], bool] | None = None
) -> Membership | None:
    """``stored`` when it is another configuration than ``ours`` at the same or a newer
    epoch (this machine's record is behind or divergent, or the set was edited); None
    otherwise. ``agrees``: which sets count as ours (by default ``ours`` alone; a change
    being finished counts each of its steps)."""
    if not isinstance(stored, Membership) or (agrees(stored) if agrees is not None else stored == ours):
        return None
    return stored if stored.epoch >= ours.epoch else None


def foreign_set(stored: Stored, ours: Membership) -> bool:
    """Whether a lease about to become a member of ``ours`` stores a member set that is
    not this deployment's: one no coordinator wrote, one at our epoch or newer that is not
    ours, or one that shares no member with our current set (another deployment of the
    same name and namespace, made elsewhere). An older set of ours (a cluster that was a
    member before) shares members with ours and may be replaced, also when the lease's
    managedFields were stripped (its writer is then unknown: a set planted by another
    client names that client as its owner, and its lease does not name its own uid,
    which a change refuses as well)."""
    if not isinstance(stored, Membership) or stored == ours:
        return False
    if (not stored.written_by_us and not stored.unowned) or stored.epoch >= ours.epoch:
        return True
    return not set(stored.members).intersection(ours.members)


def check(
    local: Membership,
    stored: Mapping[str, Stored],
    members: Sequence[str],
    groups: Sequence[Sequence[str]] | None = None,
) -> Check:
    """Compare what each member that answered stores (``stored``, by local member name)
    with ``local``. Members absent from ``stored`` did not answer.

    OK needs a majority of the local members to store exactly the local set, and no
    member to store a different set under the same or a newer epoch — such a member
    means this machine's record is stale or divergent. Only a set that a coordinator
    wrote agrees: the same set written by another client (``kubectl annotate``), or no
    set at all (its annotation removed or never written), is silent, like
    a deleted lease."""
    out = Check(Verdict.OK, local)
    for member in members:
        if member not in stored:
            out.unseen.append(member)
            continue
        value = stored[member]
        if value is UNSTATED or value is None:
            out.silent.append(member)
        elif isinstance(value, Membership):
            if value == local and not value.written_by_us:
                out.silent.append(member)
            elif value == local:
                out.agreeing.append(member)
            elif value.epoch >= local.epoch:
                out.conflicting[member] = value
            else:
                out.behind.append(member)
    sets = [list(g) for g in groups] if groups else [list(members)]
    majority_of_each = Majorities(sets).reached

    # A member that stores nothing (its lease deleted and its state object gone or
    # silent) confirms nothing: it may be a member removed since and wiped, as removed
    # clusters are, and a stale record naming it would otherwise be confirmed by one
    # leftover member that still stores the old set. Every group needs a majority that
    # stores exactly our set, on a lease or on a state object.
    counted = list(out.agreeing)
    if len(sets) > 1:
        out.short = [g for g in sets if not Majorities([g]).reached(counted)]
    if out.conflicting:
        out.verdict = Verdict.CONFLICT
    elif majority_of_each(counted):
        out.verdict = Verdict.OK
    elif out.agreeing and majority_of_each([*counted, *out.unseen]):
        out.verdict = Verdict.UNOBSERVABLE
    elif not out.agreeing and not out.silent and not out.behind:
        out.verdict = Verdict.UNOBSERVABLE  # nobody answered
    else:
        out.verdict = Verdict.UNCONFIRMED
    return out


def behind_stand_in(
    result: Check, stored: Mapping[str, Stored], old: Sequence[str], new: Sequence[str], before: Membership
) -> Check:
    """While a change from ``old`` to ``new`` is being finished: a member of the new set
    that stores an *older* configuration of this deployment than ``before`` (the set in
    force when the change started; it missed that one's commit, and so the whole change)
    stands in for the new set's confirmation, so that the run can take its lease and write
    the joint set there. Without this, a joint step that reached a majority of the old set
    but not of the new one could never be finished: the new set's majority would need the
    very member that only the finishing run repairs.

    Only where the old set decides: a majority of ``old`` must confirm (``result.agreeing``),
    no member may store a conflicting set, and a stand-in must be a set a coordinator
    wrote that shares a member with ``before`` (an ancestor, not another deployment's). It
    is evidence, not silence: a member that stores nothing still confirms nothing."""
    if result.verdict is not Verdict.UNCONFIRMED and result.verdict is not Verdict.UNOBSERVABLE:
        return result

    standing_in = [
        m
        for m in result.behind
        if m in new
        and isinstance(value := stored.get(m), Membership)
        and value.written_by_us
        and value.epoch < before.epoch
        and set(value.members).intersection(before.members)
    ]
    if not standing_in:
        return result
    old_set, new_set = Majorities([old]), Majorities([new])
    if old_set.reached(result.agreeing) and new_set.reached([*result.agreeing, *standing_in]):
        return replace(result, verdict=Verdict.OK)
    # Members not read yet may be what completes either majority (the old set's
    # confirmation lets the behind member stand in): not observed, not refused.
    if old_set.reached([*result.agreeing, *result.unseen]) and new_set.reached(
        [*result.agreeing, *standing_in, *result.unseen]
    ):
        return replace(result, verdict=Verdict.UNOBSERVABLE)
    return result


def says_nothing(stored: Stored, local: Membership) -> bool:
    """Whether what a member's lease stores is no evidence of the member set: nothing
    (deleted, a tombstone, no annotation) or this very set written by another client (or
    with its managedFields stripped). Another object of the member, its state object, may
    speak for it then. A *different* set written by someone else is not silence: it stops
    the command as possibly planted."""
    if stored is None or stored is UNSTATED:
        return True
    return isinstance(stored, Membership) and stored == local and not stored.written_by_us


def conflicts_only(result: Check) -> bool:
    """For commands that only read or give back (status, release, break): stop on a
    conflicting stored set, but not merely because confirmation is missing."""
    return result.verdict is Verdict.CONFLICT


def stored_in_lease(view: Any) -> Stored:
    """What one member's lease (a ``lease.LeaseView``) says about the member set: nothing
    when it is missing or a tombstone (written by whoever found the lease missing, it
    proves nothing), UNSTATED for a lease without the member-set annotation."""
    if view is None or not view.exists or view.vanished:
        return None
    return in_lease_object(view.obj)


def in_lease_object(obj: dict[str, Any]) -> Stored:
    """The member set a lease object stores, with who wrote it (see ``written_by_us``)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(A_MEMBERSHIP)
    if raw is None:
        return UNSTATED
    parsed = Membership.parse(raw)
    if parsed is None:
        return None
    return replace(parsed, writers=annotation_writers(obj) or ("",))
