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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from coordinator.kube.resources import ANNOTATION_PREFIX

A_MEMBERSHIP = ANNOTATION_PREFIX + "membership"


@dataclass(frozen=True)
class Membership:
    """A member set by identity, with the epoch of the configuration that made it."""

    epoch: int
    members: tuple[str, ...]
    # While the set changes: the new set. Decisions then need a majority of both.
    joint: tuple[str, ...] | None = None

    @classmethod
    def of(cls, identities: Iterable[str], epoch: int = 1, joint: Iterable[str] | None = None) -> Membership:
        return cls(int(epoch), tuple(sorted(set(identities))), tuple(sorted(set(joint))) if joint is not None else None)

    @classmethod
    def parse(cls, raw: Any) -> Membership | None:
        """From the annotation text (or a decoded JSON document); None if unreadable."""
        doc = raw
        if isinstance(raw, str):
            try:
                doc = json.loads(raw)
            except ValueError:
                return None
        if not isinstance(doc, dict):
            return None
        epoch, members = doc.get("epoch"), doc.get("members")
        if not isinstance(epoch, int) or epoch < 1 or not isinstance(members, list) or not members:
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


class _Legacy:
    """A member whose lease predates stored member sets (written by an older
    coordinator): no evidence either way, counted as agreeing."""

    def __repr__(self) -> str:
        return "LEGACY"


LEGACY: Final = _Legacy()
Stored = Membership | _Legacy | None  # None: the member answered but stores nothing


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

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    def explain(self, deployment: str, names: Mapping[str, str] | None = None) -> str:
        """The paragraph a person reads: what differs, and what to do."""
        names = dict(names or {})

        def name(identity: str) -> str:
            return names.get(identity, f"identity {identity}")

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
            return (
                f"The member set of deployment {deployment!r} stored on {where} differs from this machine's "
                f"record ({'; '.join(parts) or 'different members'}). Nothing was done: a majority counted "
                f"over the wrong members would not be a majority. Adopt the stored set with `coordinator "
                f"deployment delete {deployment}` and `coordinator deployment import {deployment} --cluster "
                f"{where.split(', ')[0]}` (connect any missing cluster first)."
            )
        told = []
        if self.silent:
            told.append(f"{', '.join(self.silent)} store no member set (lease or state deleted)")
        if self.behind:
            told.append(f"{', '.join(self.behind)} store an older configuration")
        if self.unseen:
            told.append(f"{', '.join(self.unseen)} could not be read")
        return (
            f"Only {len(self.agreeing)} of {len(self.local.members)} members of deployment {deployment!r} "
            f"confirm this machine's member set (epoch {self.local.epoch}); {self.local.quorum} are needed"
            + (f": {'; '.join(told)}" if told else "")
            + f". Nothing was done. If the deployment was changed elsewhere, re-import it with `coordinator "
            f"deployment import {deployment} --cluster NAME`; if members are unreachable, retry when they answer."
        )


def check(
    local: Membership,
    stored: Mapping[str, Stored],
    members: Sequence[str],
    groups: Sequence[Sequence[str]] | None = None,
) -> Check:
    """Compare what each member that answered stores (``stored``, by local member name)
    with ``local``. Members absent from ``stored`` did not answer.

    OK needs a majority of the local members to store exactly the local set (or to be
    legacy leases), and no member to store a different set under the same or a newer
    epoch — such a member means this machine's record is stale or divergent."""
    out = Check(Verdict.OK, local)
    for member in members:
        if member not in stored:
            out.unseen.append(member)
            continue
        value = stored[member]
        if value is LEGACY:
            out.agreeing.append(member)
        elif value is None:
            out.silent.append(member)
        elif isinstance(value, Membership):
            if value == local:
                out.agreeing.append(member)
            elif value.epoch >= local.epoch:
                out.conflicting[member] = value
            else:
                out.behind.append(member)
    sets = [list(g) for g in groups] if groups else [list(members)]

    def majority_of_each(names: Iterable[str]) -> bool:
        chosen = set(names)
        return all(len(chosen.intersection(g)) >= len(g) // 2 + 1 for g in sets)

    # A member whose lease was deleted stores nothing. It still counts, as long as some
    # member stores exactly our set and none stores another: a machine whose record names
    # members that were never in the set (whose leases do not exist) finds no member that
    # agrees, and one that names the wrong set finds the right one stored where they meet.
    counted = [*out.agreeing, *out.silent] if out.agreeing else []
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


def conflicts_only(result: Check) -> bool:
    """For commands that only read or give back (status, release, break): stop on a
    conflicting stored set, but not merely because confirmation is missing."""
    return result.verdict is Verdict.CONFLICT


def stored_in_lease(view: Any) -> Stored:
    """What one member's lease (a ``lease.LeaseView``) says about the member set: nothing
    when it is missing or a tombstone (written by whoever found the lease missing, it
    proves nothing), LEGACY for a lease from before stored member sets."""
    if view is None or not view.exists or view.vanished:
        return None
    raw = ((view.obj.get("metadata") or {}).get("annotations") or {}).get(A_MEMBERSHIP)
    if raw is None:
        return LEGACY
    return Membership.parse(raw)
