"""The rules of the replicated state register, as pure functions (no I/O, no clock).

Every member cluster holds one object; its ``envelope.json`` is the replica's value,
its ``coordinator.io/state-promise`` annotation the newest stamp it has promised.

**Stamps.** Every write attempt draws a stamp ``(token, version, write id)``: the
fencing token of its lock, a version, and a random 128-bit write id. Stamps are ordered
by token, then version, then write id (plain tuple order), so the order is total and
two different write attempts never share a stamp. An envelope is only ever written
under the stamp of the attempt that built it, so *one stamp names one document*:
equal stamps cannot differ. (The same document under two stamps is not a divergence:
it is two writes of the same data.)

**Promises.** A write first reads every member, then takes a version above every
version a majority holds *or has promised*, then promises its stamp to a majority, and
only then sends its data. Any envelope on any replica was therefore promised on a
majority before it was written, and every later write reads a majority, which shares
a member with that one: a write that starts after another attempt sent data always
draws a higher stamp, even when that data landed only where the new writer cannot see.
A partial write that surfaces later is older than every write that started after it.

**Replicas.** A replica takes a promise only if it is newer than anything it holds or
promised, a write only if it is newer than what it holds and not older than what it
promised, and a repair (a read writing the value it returns back) only if it is newer
than what it holds. Each is a compare-and-swap on the object's resourceVersion, so
the rule is checked on the very value that is replaced.

**Corrupt replicas** (an envelope or a promise that is not coordinator's word, or one
that fails a check) are never returned, and never count among the majority a value is
chosen from: a read, a write that builds on the data and ``state sync`` need a majority
of replicas that decode, as if the corrupt ones had not answered. Whatever stamp a
corrupt replica names, whoever wrote it, is kept as a bound (``Replica.claimed``): it
takes no promise or write below it, a writer draws its version above it and is fenced
out by a token in it, and ``state sync`` writes no older value over it. A confirmed
write is on a majority; a field another client took over without changing it (the
server's managedFields cap, a strip) still names its stamp.

**Reads** take the newest stamp among the replicas of a majority and write it back to
the ones behind before returning it, so it is on a majority when returned and no
later read (which reads a majority too) can return an older one.

**Evidence, not authority.** A replica whose token (of its envelope or its promise) is
above every token the leases of a majority have seen was not written by any holder of
the lock: it is *suspect*. It is never returned, never repaired onto other members and
never lets a writer's version or fencing check be steered by it; ``state sync --from``
adopts or overwrites it deliberately.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import ValidationError

from coordinator.config.models import HISTORY_LIMIT, STATE_SCHEMA, AuditEntry, StateEnvelope
from coordinator.errors import UsageError
from coordinator.rules.evidence import Writer, annotation, owners, writer
from coordinator.rules.resources import ANNOTATION_PREFIX, owned_metadata
from coordinator.text import printable

DATA_KEY = "envelope.json"
# For whoever finds the object with kubectl.
NOTE_ANNOTATION = "coordinator.io/note"
NOTE = "managed by coordinator: do not edit; read and change it with `coordinator state`"
PROMISE_ANNOTATION = ANNOTATION_PREFIX + "state-promise"
# On the empty state `deployment create` seeds: this empty replica is the state as it was
# created, an answer like any other. An empty replica without it (made to carry a
# promise, or a token floor where the object was missing) may stand where a deleted one
# held the newest write: it is no answer.
SEEDED_ANNOTATION = ANNOTATION_PREFIX + "seeded"
# A ConfigMap or Secret may hold 1 MiB; keep room for metadata and the history.
OBJECT_LIMIT = 1024 * 1024
ENVELOPE_LIMIT = OBJECT_LIMIT - 16 * 1024

_WRITE_ID = re.compile(r"^[0-9a-z][0-9a-z-]{0,63}$")
# A number as str() writes it: ASCII digits (not '٣', which int() reads too), no leading zero.
# At most 19 digits: no write's token or version is longer, and a longer one (planted)
# would not even print (Python's limit on converting long integers to text).
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}", re.ASCII)
# Every token and version a stamp names is below LIMIT. A writer draws its version one
# above the versions it reads, so a version at or above VERSION_CEILING (far above any
# that one write after another reaches) is planted and raises nobody's version: the
# stamp drawn above it could not be written down.
LIMIT = 2**63
VERSION_CEILING = 2**62
# How deep a state document may be nested (the data mapping is level 1, a value in it
# level 2): `state set` and `state apply` refuse deeper input, and a replica holding
# deeper data is corrupt, since printing it (as JSON or YAML) would recurse past any
# stack. What one writes the other takes back.
MAX_DEPTH = 100


# ------------------------------------------------------------------ stamps


@dataclass(frozen=True, order=True)
class Stamp:
    """Names one write attempt; ordered by (token, version, write id)."""

    token: int
    version: int
    write_id: str = ""

    def __str__(self) -> str:
        return f"{self.token}/{self.version}/{self.write_id}"

    def short(self) -> str:
        return f"{self.token}/{self.version}/{self.write_id[:8]}"

    @classmethod
    def parse(cls, text: str) -> Stamp:
        """The inverse of ``str()``; ValueError for anything else."""
        parts = str(text).split("/")
        if len(parts) != 3 or not all(_DECIMAL.fullmatch(p) for p in parts[:2]) or not _WRITE_ID.fullmatch(parts[2]):
            raise ValueError(f"{text!r} is not a stamp (TOKEN/VERSION/WRITE-ID)")
        token, version = int(parts[0]), int(parts[1])
        if token >= LIMIT or version >= LIMIT:
            raise ValueError(f"{text!r} is not a stamp (its numbers are at most {LIMIT - 1})")
        return cls(token, version, parts[2])


NO_STAMP = Stamp(0, 0, "")


def new_write_id() -> str:
    """128 random bits: two write attempts never draw the same id."""
    from coordinator import clock

    return clock.token_hex(16)


def stamp_of(env: StateEnvelope) -> Stamp:
    return Stamp(env.token, env.version, env.write_id)


# A promise sent to a cluster that holds no object yet creates one whose envelope stands
# for "no state" (version 0, never a write's: versions start at 1), so that every state
# object anyone reads has an envelope with a token. Decoded, it holds nothing.
GENESIS_WRITE_ID = "genesis"

# The envelope's own field for a promise (Replica.sealed): a member change's copy keeps
# its promise there, where removing it makes the replica corrupt (the annotation is
# anyone's to remove who may annotate the object).
SEAL_FIELD = "promise"


def sealed_text(text: str, stamp: Stamp) -> str:
    """The envelope ``text`` with the promise of ``stamp`` kept inside it."""
    doc = json.loads(text)
    doc[SEAL_FIELD] = str(stamp)
    return json.dumps(doc, sort_keys=False, separators=(",", ":"))


# ------------------------------------------------------------------ envelope


def checksum(data: dict[str, Any]) -> str:
    canon = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def encode_envelope(env: StateEnvelope) -> str:
    return json.dumps(env.model_dump(mode="json", by_alias=True), sort_keys=False, separators=(",", ":"))


def genesis_text(deployment: str | None = None, membership: dict[str, Any] | None = None) -> str:
    """The envelope of an object created to carry a promise (or with its deployment, and
    the member set it was created with): the empty state."""
    env = StateEnvelope(
        deployment=deployment,
        schema=STATE_SCHEMA,
        version=0,
        token=0,
        write_id=GENESIS_WRITE_ID,
        checksum=checksum({}),
        written_by="coordinator",
        written_at=datetime(1970, 1, 1, tzinfo=UTC),
        members=[],
        data={},
    )
    if membership is not None:
        setattr(env, "membership", membership)  # noqa: B010 - an extra field of the model
    return encode_envelope(env)


def stored_size(text: str, storage: str) -> int:
    size = len(text.encode())
    return size * 4 // 3 + 4 if storage == "secret" else size


def check_size(text: str, storage: str) -> None:
    stored = stored_size(text, storage)
    if stored > ENVELOPE_LIMIT:
        raise UsageError(
            f"The state document would take {stored:,} bytes in the {storage}, over the limit of "
            f"{ENVELOPE_LIMIT:,} bytes (a Kubernetes object holds at most 1 MiB, envelope and "
            "history included). Nothing was written. Keep large artifacts elsewhere and store "
            "a reference to them."
        )


def build_envelope(
    base: StateEnvelope | None,
    data: dict[str, Any],
    stamp: Stamp,
    *,
    who: str,
    host: str,
    command: str,
    now: datetime,
    members: list[str],
    member_ids: dict[str, str],
    namespace: str | None,
    storage: str | None,
    keys: list[str],
    note: str | None = None,
    membership: dict[str, Any] | None = None,
    deployment: str | None = None,
) -> tuple[StateEnvelope, str]:
    """The envelope a write sends, and its text; the audit log keeps the newest entries
    that fit the object (at least the new one)."""
    history = list(base.history) if base else []
    history.append(
        AuditEntry(
            at=now,
            who=who,
            host=host,
            command=command,
            version=stamp.version,
            token=stamp.token,
            write_id=stamp.write_id,
            keys=keys,
            note=note,
        )
    )
    env = StateEnvelope(
        schema=STATE_SCHEMA,
        version=stamp.version,
        token=stamp.token,
        write_id=stamp.write_id,
        checksum=checksum(data),
        written_by=who,
        written_at=now,
        members=members,
        member_ids=member_ids,
        namespace=namespace,
        storage=storage,
        data=data,
        history=history[-HISTORY_LIMIT:],
        deployment=deployment,
    )
    if membership is not None:
        # the member set by identity with its epoch, as the leases store it (an extra field)
        setattr(env, "membership", membership)  # noqa: B010 - an extra field of the model
    text = encode_envelope(env)
    while len(text.encode()) > ENVELOPE_LIMIT and len(env.history) > 1:
        env.history = env.history[len(env.history) // 2 :]
        text = encode_envelope(env)
    return env, text


# ------------------------------------------------------------------ one replica


@dataclass
class Replica:
    """One cluster's object, as read and judged."""

    cluster: str
    exists: bool
    envelope: StateEnvelope | None = None
    corrupt: str | None = None  # why it cannot be trusted
    newer_schema: int | None = None
    raw: str | None = None
    obj: dict[str, Any] = field(default_factory=dict)
    promise: Stamp | None = None
    # On a corrupt replica: the newest stamp its envelope or its promise names, whoever
    # wrote them (see claimed_stamp). Never the replica's value or promise; a lower bound
    # on what it may hold or have promised.
    claimed: Stamp = NO_STAMP
    seeded: bool = False  # the empty state `deployment create` made, as coordinator wrote it
    # A promise kept inside the envelope (SEAL_FIELD; a member change's copy makes one):
    # unlike the annotation, nobody removes it without making the replica corrupt.
    sealed: Stamp | None = None

    @property
    def answers(self) -> bool:
        """Whether it counts as an answer to which state is newest: it holds a state (or
        a newer schema's), or the empty state `deployment create` seeded. A missing
        object, an empty one made since (where one may have been deleted) and a corrupt
        one do not: the newest confirmed write may have been where they are."""
        return (
            self.exists and not self.corrupt and (self.envelope is not None or self.seeded or bool(self.newer_schema))
        )

    @property
    def blank(self) -> bool:
        """Missing, or an empty object made since the deployment was created: not corrupt,
        yet no answer (it may stand where a deleted replica held the newest write)."""
        return not self.answers and not self.corrupt

    @property
    def stamp(self) -> Stamp:
        """The stamp of the envelope it holds (NO_STAMP for none)."""
        return stamp_of(self.envelope) if self.envelope is not None else NO_STAMP

    @property
    def reserved(self) -> Stamp:
        """The newest stamp it holds or has promised."""
        return max(self.stamp, self.promise or NO_STAMP)

    @property
    def bound(self) -> Stamp:
        """The newest stamp it holds, promised, or (corrupt) carries in fields that are not
        its word: no write below it may replace it."""
        return max(self.reserved, self.claimed)

    @property
    def order(self) -> tuple[int, int]:
        return (self.stamp.token, self.stamp.version)

    @property
    def checksum(self) -> str | None:
        return self.envelope.checksum if self.envelope is not None else None

    @property
    def resource_version(self) -> str | None:
        return (self.obj.get("metadata") or {}).get("resourceVersion")


def nested_deeper(value: Any, limit: int) -> bool:
    """Is ``value`` (decoded JSON) nested more than ``limit`` levels deep, a value inside
    the top mapping or list counting as one more? Without recursion."""
    stack = [(value, 1)]
    while stack:
        cur, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(cur, dict):
            stack.extend((v, depth + 1) for v in cur.values())
        elif isinstance(cur, list):
            stack.extend((v, depth + 1) for v in cur)
    return False


def decode_replica(
    cluster: str,
    obj: dict[str, Any] | None,
    storage: str,
    *,
    deployment: str | None = None,
    from_file: bool = False,
) -> Replica:
    """Judge one object as read: absent, corrupt (why), newer schema, or a valid envelope
    (checksum verified), with the promise it carries. With ``deployment``, an
    envelope written for another deployment (an object copied under this one's name) is
    corrupt. ``from_file``: the text came from a backup file the user hands over, which
    has no recorded writers; its checksum is all there is to check. A corrupt replica
    keeps the newest stamp the object names as ``claimed``."""
    rep = _decode(cluster, obj, storage, deployment=deployment, from_file=from_file)
    if rep.corrupt and obj:
        rep.claimed = claimed_stamp(obj, storage)
    return rep


def _int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < LIMIT
    return value if ok else None


def claimed_stamp(obj: dict[str, Any], storage: str) -> Stamp:
    """The newest stamp ``obj`` names in its promise annotation or its envelope, whoever
    wrote them and whatever else is wrong with them (NO_STAMP where neither parses).

    Another client can take a field from coordinator without changing it (the API server
    merges old managedFields entries into ``ancient-changes``; stripping names nobody), so a
    replica that is not coordinator's word may still hold a confirmed write or a newer
    holder's promise. What it names is kept as a bound: a stamp that high may have been
    promised there, so no older write replaces it. A bound set too high by hand costs
    availability (writes below it are refused there), never a confirmed write."""
    found = [NO_STAMP]
    annotations = (obj.get("metadata") or {}).get("annotations")
    text = annotations.get(PROMISE_ANNOTATION) if isinstance(annotations, dict) else None
    if isinstance(text, str):
        try:
            found.append(Stamp.parse(text))
        except ValueError:
            pass
    data = obj.get("data")
    raw = data.get(DATA_KEY) if isinstance(data, dict) else None
    try:
        if isinstance(raw, str) and storage == "secret":
            raw = base64.b64decode(raw, validate=True).decode("utf-8")
        doc = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        token, version, write_id = _int(doc.get("token")), _int(doc.get("version")), doc.get("write_id")
        if not (isinstance(write_id, str) and _WRITE_ID.fullmatch(write_id)):
            write_id = ""  # no write of coordinator's: its token and version still count
        if token is not None and version is not None:
            found.append(Stamp(token, version, write_id))
    return max(found)


def _decode(
    cluster: str,
    obj: dict[str, Any] | None,
    storage: str,
    *,
    deployment: str | None,
    from_file: bool,
) -> Replica:
    if not obj:
        return Replica(cluster, exists=False)
    rep = Replica(cluster, exists=True, obj=obj)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    present = ((obj.get("data") or {}).get(DATA_KEY) is not None, PROMISE_ANNOTATION in annotations)
    unparsed = None  # the promise's text, where coordinator wrote one that is no stamp
    if present[1] and (from_file or writer(obj, annotation(PROMISE_ANNOTATION)) is Writer.OURS):
        # A promise coordinator wrote is this object's word even where its envelope is
        # not: a writer's data lands only where its own promise shows (judge).
        try:
            rep.promise = Stamp.parse(str(annotations.get(PROMISE_ANNOTATION)))
        except ValueError:
            unparsed = str(annotations.get(PROMISE_ANNOTATION))
    for path, what, there in (
        (("data", DATA_KEY), f"its {DATA_KEY}", present[0]),
        (annotation(PROMISE_ANNOTATION), "its promise", present[1]),
    ):
        if there and not from_file and writer(obj, path) is not Writer.OURS:
            # Evidence has an owner (coordinator/rules/evidence.py): an envelope or a promise that
            # no coordinator field manager owns is not a replica's word, however
            # well-formed (another client wrote it, or nobody the server recorded: the
            # managedFields stripped); a write replaces it.
            named = [m for m in owners(obj, path) if m]
            who = f"by another client ({printable(', '.join(named))[:80]})" if named else "with no recorded writer"
            rep.corrupt = f"{what} was written {who}, not by coordinator"
            return rep
    if unparsed is not None:
        rep.corrupt = f"the {PROMISE_ANNOTATION} annotation {unparsed[:80]!r} is not a stamp"
        return rep
    raw = (obj.get("data") or {}).get(DATA_KEY)
    if raw is None:  # even an object made for a promise has one (the genesis envelope)
        rep.corrupt = f"the object has no {DATA_KEY} key"
        return rep
    if storage == "secret":
        try:
            raw = base64.b64decode(raw, validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            rep.corrupt = "the Secret's value is not base64 UTF-8"
            rep.raw = str(raw)
            return rep
    rep.raw = str(raw)
    try:
        doc = json.loads(rep.raw)
    except (ValueError, RecursionError) as err:
        rep.corrupt = f"not JSON ({err})"
        return rep
    if not isinstance(doc, dict):
        rep.corrupt = "not a JSON object"
        return rep
    if nested_deeper(doc, MAX_DEPTH + 1):  # the envelope is one level above its data
        rep.corrupt = f"nested more than {MAX_DEPTH} levels deep (no write of coordinator makes that)"
        return rep
    schema = doc.get("schema", 0)
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 0:
        # The model would read "99" as 99 and take it past the newer-schema refusal below.
        rep.corrupt = f"the envelope's schema {printable(repr(schema))[:40]} is not a schema number"
        return rep
    if schema > STATE_SCHEMA:
        rep.newer_schema = schema
        return rep
    if schema < STATE_SCHEMA:
        rep.corrupt = f"the envelope's schema {schema} is older than any release of coordinator writes ({STATE_SCHEMA})"
        return rep
    seal = doc.get(SEAL_FIELD)
    if seal is not None:
        try:
            rep.sealed = Stamp.parse(str(seal))
        except ValueError:
            rep.corrupt = f"the envelope's {SEAL_FIELD} {printable(repr(seal))[:80]} is not a stamp"
            return rep
        rep.promise = max(rep.promise or NO_STAMP, rep.sealed)
    try:
        env = StateEnvelope.model_validate(doc)
    except ValidationError as err:
        # ``loc`` names keys of the envelope, which whoever wrote it chose: one line,
        # escaped (the reason is put into error paragraphs whose own lines are kept).
        first = err.errors()[0]
        where = printable(".".join(map(str, first["loc"])))[:100]
        rep.corrupt = f"invalid envelope: {where}: {printable(str(first['msg']))[:200]}"
        return rep
    try:
        actual = checksum(env.data)
    except (TypeError, ValueError, RecursionError):
        actual = ""
    if actual != env.checksum:
        rep.corrupt = "checksum mismatch (data edited by hand?)"
        return rep
    if deployment is not None and env.deployment is not None and env.deployment != deployment:
        rep.corrupt = f"written for deployment {env.deployment[:80]!r}, not {deployment!r} (a copy?)"
        return rep
    if env.version == 0:
        # created by `deployment create`, to carry a promise, or for a token floor: no state yet
        rep.seeded = SEEDED_ANNOTATION in annotations and writer(obj, annotation(SEEDED_ANNOTATION)) is Writer.OURS
        return rep
    rep.envelope = env
    return rep


def build_object(
    rep: Replica,
    *,
    name: str,
    deployment: str,
    storage: str,
    promise: Stamp,
    envelope_text: str | None = None,
) -> dict[str, Any]:
    """The object to PUT (or POST, when ``rep`` does not exist) for a promise
    (``envelope_text`` None: the data stays as it is, or is the empty state's genesis
    envelope in a new object) or a write."""
    kind = "Secret" if storage == "secret" else "ConfigMap"
    if rep.exists:
        obj = copy.deepcopy(rep.obj)
        meta = obj.setdefault("metadata", {})
        labels = dict(meta.get("labels") or {})
        labels.update(owned_metadata(name, deployment)["labels"])
        meta["labels"] = labels
    else:
        obj = {"apiVersion": "v1", "kind": kind, "metadata": owned_metadata(name, deployment)}
        meta = obj["metadata"]
    ours = {PROMISE_ANNOTATION: str(promise), NOTE_ANNOTATION: NOTE}
    meta["annotations"] = dict(meta.get("annotations") or {}) | ours
    if envelope_text is None and not rep.exists:
        envelope_text = genesis_text(deployment)
    if envelope_text is not None:
        value = base64.b64encode(envelope_text.encode()).decode() if storage == "secret" else envelope_text
        obj["data"] = {DATA_KEY: value}
    if storage == "secret":
        obj["type"] = obj.get("type") or "Opaque"
    return obj


# ------------------------------------------------------------------ the replica's rule


class Kind(StrEnum):
    PROMISE = "promise"  # reserve a stamp before sending data
    WRITE = "write"  # the data of a write that a majority promised
    REPAIR = "repair"  # a read writing back the value it returns
    OVERWRITE = "overwrite"  # `state sync --from`: deliberately replace a suspect or corrupt replica


@dataclass(frozen=True)
class Verdict:
    accept: bool
    done: bool = False  # the replica already holds it: nothing to send
    reason: str = ""


def judge(rep: Replica, stamp: Stamp, kind: Kind) -> Verdict:
    """Whether ``rep`` may take ``stamp`` (checked again on every compare-and-swap retry)."""
    if rep.newer_schema:
        return Verdict(False, reason=f"replica has envelope schema {rep.newer_schema}, newer than {STATE_SCHEMA}")
    if kind is Kind.OVERWRITE:
        return Verdict(True, done=rep.stamp == stamp and rep.corrupt is None)
    if rep.corrupt:
        if kind is Kind.REPAIR:
            return Verdict(False, reason=f"corrupt ({rep.corrupt}); run `state sync`")
        # Not its word, but what it names may be a newer holder's promise or a confirmed
        # write: a stamp below that bound never replaces it (the one stamp equal to it is
        # this very attempt, retried). A writer saved it to a file first.
        if stamp < rep.bound:
            return Verdict(False, reason=_refusal(rep, stamp))
        if kind is Kind.WRITE and rep.promise != stamp:
            return Verdict(False, reason=_unpromised(rep, stamp))
        return Verdict(True)
    held, promised = rep.stamp, rep.promise or NO_STAMP
    if kind is Kind.PROMISE:
        if promised == stamp:
            return Verdict(True, done=True)
        if stamp <= rep.reserved:
            return Verdict(False, reason=_refusal(rep, stamp))
        return Verdict(True)
    if held == stamp:
        return Verdict(True, done=True)
    if stamp < held or (kind is Kind.WRITE and stamp < promised):
        return Verdict(False, reason=_refusal(rep, stamp))
    if kind is Kind.WRITE and promised != stamp:
        return Verdict(False, reason=_unpromised(rep, stamp))
    return Verdict(True)


def _unpromised(rep: Replica, stamp: Stamp) -> str:
    """A write's data lands only where the replica shows that write's own promise, as
    coordinator wrote it: where it was removed or rewritten by another client (the
    replica then counts as corrupt, or as having promised nothing), a write of a lock
    lost since could otherwise land under a newer holder's value."""
    shown = rep.promise.short() if rep.promise is not None else "none"
    return f"refused: it does not show this write's promise {stamp.short()} (it shows {shown})"


def _refusal(rep: Replica, stamp: Stamp) -> str:
    top = rep.bound
    what = "holds" if top == rep.stamp else "promised" if top == rep.reserved else "is corrupt and carries"
    if top.token > stamp.token:
        return f"refused: replica {what} fencing token {top.token} > {stamp.token}"
    return f"refused: replica {what} version {top.version} (stamp {top.short()}), not older than {stamp.short()}"


def promise_after(rep: Replica, stamp: Stamp, kind: Kind) -> Stamp:
    """The promise annotation a replica carries once it took ``stamp``: promises only
    rise, except where a replica is deliberately overwritten."""
    if kind is Kind.OVERWRITE:
        return stamp
    return max(rep.promise or NO_STAMP, stamp)


def text_after(rep: Replica, stamp: Stamp, kind: Kind, text: str | None) -> str | None:
    """The envelope text ``rep`` is sent with ``stamp``: ``text``, with the promise sealed
    inside the replica's envelope kept in it where ``stamp`` is below that promise (a
    repair: it is still promised). A deliberate overwrite drops it, as it drops the
    annotation's."""
    if text is None or rep.sealed is None or kind is Kind.OVERWRITE or stamp >= rep.sealed:
        return text
    return sealed_text(text, rep.sealed)


# ------------------------------------------------------------------ evidence


def lease_evidence(tokens: Iterable[int], q: int) -> int | None:
    """The highest fencing token the leases read have seen, when at least ``q`` of them
    carry one (any token ever taken was taken on a majority, which shares a member with
    these); None when there is not enough evidence to judge (leases deleted)."""
    seen = [t for t in tokens if t > 0]
    return max(seen) if len(seen) >= q else None


def suspicion(rep: Replica, evidence: int | None) -> str | None:
    """Why ``rep`` cannot have been written by a holder of the lock, or None."""
    if evidence is None:
        return None
    top = rep.bound.token
    if top <= evidence:
        return None
    what = "holds" if rep.stamp.token == top else "promised" if rep.reserved.token == top else "is corrupt and carries"
    return (
        f"{what} fencing token {top}, above every token the leases of a majority have seen "
        f"(the highest is {evidence}): no holder of this lock wrote it (edited by hand, or copied from elsewhere?)"
    )


# ------------------------------------------------------------------ reads


@dataclass
class Choice:
    """What a read of some replicas decides."""

    winner: Replica | None  # the value to return (None: no valid replica)
    current: list[str]  # hold the winner's stamp
    stale: list[str]  # behind it and repairable (absent and promise-only ones too)
    suspect: dict[str, str]
    corrupt: dict[str, str]
    conflict: list[str]  # hold the newest stamp with other data: impossible unless edited by hand

    @property
    def top(self) -> Stamp:
        return self.winner.stamp if self.winner else NO_STAMP


def choose(replicas: Mapping[str, Replica], evidence: int | None) -> Choice:
    """The newest trusted envelope wins; replicas behind it are to be repaired."""
    suspect = {k: why for k, r in replicas.items() if (why := suspicion(r, evidence))}
    corrupt = {k: r.corrupt for k, r in replicas.items() if r.corrupt and k not in suspect}
    valid = [r for k, r in replicas.items() if r.envelope is not None and k not in suspect]
    if not valid:
        return Choice(None, [], [], suspect, corrupt, [])
    top = max(r.stamp for r in valid)
    at_top = sorted((r for r in valid if r.stamp == top), key=lambda r: r.cluster)
    if len({r.checksum for r in at_top}) > 1:
        return Choice(None, [], [], suspect, corrupt, [r.cluster for r in at_top])
    stale = [
        k for k, r in replicas.items() if k not in suspect and not r.corrupt and not r.newer_schema and r.stamp < top
    ]
    return Choice(at_top[0], [r.cluster for r in at_top], sorted(stale), suspect, corrupt, [])


def next_stamp(replicas: Iterable[Replica], token: int, evidence: int | None, write_id: str) -> Stamp:
    """A write's stamp: a version above every version held or promised by the replicas
    read (a majority), or named by a corrupt one, suspect ones and planted versions (at or
    above VERSION_CEILING) aside."""
    trusted = [r for r in replicas if suspicion(r, evidence) is None]
    version = max((v for r in trusted if (v := r.bound.version) < VERSION_CEILING), default=0) + 1
    return Stamp(token, version, write_id)


def newer_token(replicas: Iterable[Replica], token: int, evidence: int | None) -> int | None:
    """The fencing token of a newer holder that has written or promised (or that a corrupt
    replica names), if any."""
    top = max((r.bound.token for r in replicas if suspicion(r, evidence) is None), default=0)
    return top if top > token else None


# ------------------------------------------------------------------ outcomes


class Delivery(StrEnum):
    CONFIRMED = "confirmed"  # the replica took it
    REFUSED = "refused"  # it definitely did not (rule, compare-and-swap, 4xx answer)
    UNANSWERED = "unanswered"  # no answer, or an answer that does not say: it may have


def write_outcome(deliveries: Mapping[str, Delivery], q: int) -> Literal["ok", "nothing", "unknown"]:
    """``ok`` with q confirmations; ``nothing`` when no replica can have taken it;
    else ``unknown`` (it may still surface: a later read repairs the newest replica)."""
    confirmed = sum(1 for d in deliveries.values() if d is Delivery.CONFIRMED)
    if confirmed >= q:
        return "ok"
    if confirmed == 0 and all(d is Delivery.REFUSED for d in deliveries.values()):
        return "nothing"
    return "unknown"
