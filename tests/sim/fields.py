"""Field ownership as kube-apiserver tracks it in ``metadata.managedFields``, for the
objects the in-memory API server (apiserver.py) serves.

A field set is a set of paths; a path is a tuple of elements as ``fieldsV1`` writes them
(``"f:data"``, ``"f:key"``, ``'v:"a/finalizer"'``). What the real server does, as far as
coordinator and its tests depend on it (tests/sim/test_conformance.py compares):

- An **update** (create, PUT, merge patch) gives its manager the fields it added or
  changed, and takes them from every other manager; a field it removed is taken from
  everyone. Its entry is stamped with the time (whole seconds) only when it changed a
  field. An object with no managedFields gets none from an update (only a create or an
  apply starts tracking).
- An **apply** (server-side apply) makes its manager own exactly the fields of the applied
  configuration; a field it applied before and leaves out now is removed from the object
  unless another manager owns it; a field another manager owns that it sets to another
  value is a conflict (409) unless forced, and forced it is taken. An object without
  managedFields first gets a ``before-first-apply`` entry owning what it holds.
- A map (``data``, ``labels``, ``annotations``) is itself a member of an update's set
  when the update makes it appear (``".": {}`` in fieldsV1), and taken from its owner
  when it disappears; a struct every object of the kind has (a Lease's ``spec``,
  ``metadata``) never appears, so it never is. An apply's set holds the keys only.
  ``metadata.finalizers`` is a set of values (``v:"name"``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

Path = tuple[str, ...]
FieldSet = frozenset[Path]
JSON = dict[str, Any]


# ------------------------------------------------------------------ the shape of an object


@dataclass(frozen=True)
class Struct:
    """Named fields; a field not named is a leaf (compared as a whole)."""

    fields: Mapping[str, Node] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenMap:
    """A map of arbitrary keys to scalars (``data``, ``labels``)."""


@dataclass(frozen=True)
class SetList:
    """A list of distinct scalars (``metadata.finalizers``)."""


@dataclass(frozen=True)
class Leaf:
    """A scalar, or a list or map replaced as a whole."""


Node = Struct | OpenMap | SetList | Leaf
LEAF = Leaf()

METADATA = Struct({"labels": OpenMap(), "annotations": OpenMap(), "finalizers": SetList()})

# What the real server never records in managedFields (its "strip meta" step).
_STRIPPED_TOP = frozenset({"apiVersion", "kind", "status"})
_STRIPPED_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    }
)

SCHEMAS: dict[str, Struct] = {
    "configmaps": Struct({"metadata": METADATA, "data": OpenMap(), "binaryData": OpenMap()}),
    "secrets": Struct({"metadata": METADATA, "data": OpenMap(), "stringData": OpenMap()}),
    "leases": Struct({"metadata": METADATA, "spec": Struct()}),
    "namespaces": Struct({"metadata": METADATA, "spec": Struct()}),
}


def tracked(obj: Mapping[str, Any]) -> JSON:
    """The part of ``obj`` whose fields are owned: without the stripped fields."""
    out = {k: v for k, v in obj.items() if k not in _STRIPPED_TOP}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items() if k not in _STRIPPED_META}
    return out


# ------------------------------------------------------------------ comparing two objects


def _f(key: str) -> str:
    return f"f:{key}"


def _v(value: Any) -> str:
    return "v:" + json.dumps(value, separators=(",", ":"))


def _present(value: Any) -> bool:
    """Whether a value is there at all (an empty map or list is not: the server drops them)."""
    return value is not None and value != {} and value != []


@dataclass
class Comparison:
    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)

    @property
    def changed(self) -> FieldSet:
        return frozenset(self.added | self.modified)


def compare(old: Mapping[str, Any], new: Mapping[str, Any], schema: Struct) -> Comparison:
    """The fields ``new`` added, modified and removed, compared with ``old``."""
    out = Comparison()
    before, after = tracked(old), tracked(new)
    for key in before.keys() | after.keys():
        _compare(before.get(key), after.get(key), schema.fields.get(key, LEAF), (_f(key),), out)
    return out


def _compare(old: Any, new: Any, node: Node, path: Path, out: Comparison) -> None:
    if isinstance(node, Struct | OpenMap) and (isinstance(old, dict) or isinstance(new, dict)):
        # A map or struct that appears (or goes) is itself a member of the change; one
        # that is there empty (a struct every object has, like a Lease's spec) is not.
        before = old if isinstance(old, dict) else None
        after = new if isinstance(new, dict) else None
        if before is None and after:
            out.added.add(path)
        elif before and after is None:
            out.removed.add(path)
        children = node.fields if isinstance(node, Struct) else {}
        for key in (before or {}).keys() | (after or {}).keys():
            child = children.get(key, LEAF)
            _compare((before or {}).get(key), (after or {}).get(key), child, (*path, _f(key)), out)
        return
    if isinstance(node, SetList) and (isinstance(old, list) or isinstance(new, list)):
        before_items = old if isinstance(old, list) else []
        after_items = new if isinstance(new, list) else []
        if not before_items and after_items:
            out.added.add(path)
        elif before_items and not after_items:
            out.removed.add(path)
        for item in after_items:
            if item not in before_items:
                out.added.add((*path, _v(item)))
        for item in before_items:
            if item not in after_items:
                out.removed.add((*path, _v(item)))
        return
    _compare_leaf(old, new, path, out)


def _compare_leaf(old: Any, new: Any, path: Path, out: Comparison) -> None:
    if not _present(old) and not _present(new):
        return
    if not _present(old):
        out.added.add(path)
    elif not _present(new):
        out.removed.add(path)
    elif old != new:
        out.modified.add(path)


# ------------------------------------------------------------------ the fields of an applied configuration


def applied_fields(config: Mapping[str, Any], schema: Struct) -> FieldSet:
    """The fields an applied configuration sets (an apply's set: keys, not their maps)."""
    out: set[Path] = set()
    _applied(tracked(config), schema, (), out)
    out.discard(("f:metadata",))  # never owned itself (stripped, as the real server strips it)
    return frozenset(out)


def _applied(value: Any, node: Node, path: Path, out: set[Path]) -> None:
    if isinstance(node, Struct) and isinstance(value, dict):
        if not value and path:
            out.add(path)
        for key, item in value.items():
            _applied(item, node.fields.get(key, LEAF), (*path, _f(key)), out)
    elif isinstance(node, OpenMap) and isinstance(value, dict):
        out.update((*path, _f(key)) for key in value)
    elif isinstance(node, SetList) and isinstance(value, list):
        out.update((*path, _v(item)) for item in value)
    else:
        out.add(path)


def merge_applied(live: Mapping[str, Any], config: Mapping[str, Any], schema: Node) -> Any:
    """``live`` with the applied configuration merged in: maps by key, sets by value,
    anything else replaced."""
    if isinstance(schema, Struct | OpenMap) and isinstance(live, dict) and isinstance(config, dict):
        out = dict(live)
        for key, value in config.items():
            child = schema.fields.get(key, LEAF) if isinstance(schema, Struct) else LEAF
            out[key] = merge_applied(live[key], value, child) if key in live else value
        return out
    if isinstance(schema, SetList) and isinstance(live, list) and isinstance(config, list):
        return list(live) + [item for item in config if item not in live]
    return config


def remove_fields(obj: JSON, paths: Iterable[Path]) -> None:
    """Take the fields at ``paths`` out of ``obj`` (in place); maps and sets left empty go."""
    for path in sorted(paths, key=len, reverse=True):
        _remove(obj, path)


def _remove(container: Any, path: Path) -> None:
    if not path or not isinstance(container, dict):
        return
    head, rest = path[0], path[1:]
    if not head.startswith("f:"):
        return
    key = head[2:]
    if key not in container:
        return
    if not rest:
        del container[key]
        return
    child = container[key]
    if rest[0].startswith("v:") and isinstance(child, list):
        value = json.loads(rest[0][2:])
        container[key] = [item for item in child if item != value]
    else:
        _remove(child, rest)
    if container[key] in ({}, []):
        del container[key]


# ------------------------------------------------------------------ fieldsV1


def encode(fields: Iterable[Path]) -> JSON:
    """A field set as fieldsV1: a tree of elements in order, ``"."`` (first) marking a
    member that also has members below it."""
    # Every write encodes each entry of the object again, mostly the same sets: a set's
    # tree is made once, and each caller gets its own copy of it.
    return _copy_tree(_encoded(fields if isinstance(fields, frozenset) else frozenset(fields)))


def _copy_tree(tree: JSON) -> JSON:
    return {element: _copy_tree(child) for element, child in tree.items()}


@lru_cache(maxsize=1024)
def _encoded(fields: FieldSet) -> JSON:
    # A trie of the paths (each node: its children, and whether it is a member itself),
    # written out with every node's children in sorted order.
    root: tuple[dict[str, Any], list[bool]] = ({}, [False])
    for path in fields:
        node = root
        for element in path:
            found = node[0].get(element)
            if found is None:
                found = node[0][element] = ({}, [False])
            node = found
        node[1][0] = True

    def write(node: tuple[dict[str, Any], list[bool]]) -> JSON:
        children = node[0]
        out: JSON = {".": {}} if children and node[1][0] else {}
        for element in sorted(children):
            out[element] = write(children[element])
        return out

    return write(root)


def decode(fields_v1: Any) -> FieldSet:
    """A fieldsV1 tree as a field set (anything that is not a tree gives none)."""
    out: set[Path] = set()

    def walk(node: Any, path: Path) -> None:
        if not isinstance(node, dict):
            return
        if path and (not node or "." in node):
            out.add(path)
        for element, child in node.items():
            if element != ".":
                walk(child, (*path, element))

    walk(fields_v1, ())
    return frozenset(out)


def describe(path: Path) -> str:
    """A path as a conflict message names it: ``.spec.holderIdentity``."""
    parts = []
    for element in path:
        kind, _, name = element.partition(":")
        parts.append(f".{name}" if kind == "f" else f"[={name}]")
    return "".join(parts)


# ------------------------------------------------------------------ managedFields entries

BEFORE_FIRST_APPLY = "before-first-apply"
ANCIENT_CHANGES = "ancient-changes"
MAX_UPDATE_MANAGERS = 10  # more Update entries than this: the oldest are merged


@dataclass
class Entry:
    """One managedFields entry; ``time`` as the server writes it (whole seconds), or None."""

    manager: str
    operation: str
    api_version: str
    fields: FieldSet
    time: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.api_version)


def read_entries(obj: Mapping[str, Any]) -> list[Entry]:
    """The entries of ``obj``'s managedFields (an entry that is not an object is skipped)."""
    raw = (obj.get("metadata") or {}).get("managedFields") or []
    out = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict):
            time = item.get("time")
            out.append(
                Entry(
                    str(item.get("manager") or ""),
                    str(item.get("operation") or ""),
                    str(item.get("apiVersion") or ""),
                    decode(item.get("fieldsV1")),
                    time if isinstance(time, str) else None,
                )
            )
    return out


def write_entries(entries: Iterable[Entry]) -> list[JSON]:
    """The entries as managedFields, in the server's order: by operation, time (none
    first), manager, API version. Entries that own nothing are left out."""
    kept = [e for e in entries if e.fields]
    kept.sort(key=lambda e: (e.operation, e.time or "", e.manager, e.api_version))
    out = []
    for e in kept:
        item: JSON = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
        if e.time is not None:
            item["time"] = e.time
        item["fieldsType"] = "FieldsV1"
        item["fieldsV1"] = encode(e.fields)
        out.append(item)
    return out


def record_update(
    entries: list[Entry],
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    schema: Struct,
    manager: str,
    api_version: str,
    now: str,
) -> list[Entry]:
    """The entries after ``manager`` changed ``old`` into ``new`` with an update."""
    cmp = compare(old, new, schema)
    taken = cmp.changed | cmp.removed
    out = [Entry(e.manager, e.operation, e.api_version, e.fields - taken, e.time) for e in entries]
    if cmp.changed:
        key = (manager, "Update", api_version)
        mine = next((e for e in out if e.key == key), None)
        if mine is None:
            out.append(Entry(manager, "Update", api_version, cmp.changed, now))
        else:
            mine.fields, mine.time = mine.fields | cmp.changed, now
    return _capped([e for e in out if e.fields])


@dataclass
class ApplyConflict(Exception):
    """Fields an apply would change that other managers own: (manager, operation, API
    version, path)."""

    conflicts: list[tuple[str, str, str, Path]]


def record_apply(
    entries: list[Entry],
    live: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    schema: Struct,
    manager: str,
    api_version: str,
    now: str,
    *,
    force: bool,
    empty: Mapping[str, Any],
) -> tuple[JSON, list[Entry], bool]:
    """The object after ``manager`` applied ``config`` to ``live`` (None: it does not exist
    yet, ``empty`` stands for it), the entries after it, and whether the object changed.
    Raises :class:`ApplyConflict` for conflicts when not ``force``."""
    base = dict(live) if live is not None else dict(empty)
    entries = list(entries)
    if live is not None and not entries:
        entries = record_update([], empty, live, schema, BEFORE_FIRST_APPLY, api_version, now)
    merged = merge_applied(base, config, schema)
    assert isinstance(merged, dict)
    applied = applied_fields(config, schema)
    key = (manager, "Apply", api_version)
    last = next((e.fields for e in entries if e.key == key), frozenset())
    others = [e for e in entries if e.key != key]
    owned: set[Path] = set(applied)
    for e in others:
        owned |= e.fields
    remove_fields(merged, [p for p in last if p not in owned])
    cmp = compare(base, merged, schema)
    conflicts = [(e.manager, e.operation, e.api_version, p) for e in others for p in sorted(e.fields & cmp.changed)]
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    out = [Entry(e.manager, e.operation, e.api_version, e.fields - cmp.changed - cmp.removed, e.time) for e in others]
    changed = tracked(merged) != tracked(base)
    previous = next((e.time for e in entries if e.key == key), None)
    out.append(Entry(manager, "Apply", api_version, applied, now if changed else previous))
    return merged, _capped([e for e in out if e.fields]), changed


def _capped(entries: list[Entry]) -> list[Entry]:
    """At most MAX_UPDATE_MANAGERS Update entries: from the oldest on, the Update entries
    of one API version after its first are merged into one ``ancient-changes`` entry
    (which takes the first's fields, and the time of the newest merged)."""
    updates = sorted((e for e in entries if e.operation == "Update"), key=lambda e: (e.time or "", e.manager))
    count = len(updates)
    out = list(entries)
    first: dict[str, Entry] = {}
    for e in updates:
        if count <= MAX_UPDATE_MANAGERS:
            break
        if e.api_version not in first:
            first[e.api_version] = e
            continue
        bucket = next((b for b in out if b.key == (ANCIENT_CHANGES, "Update", e.api_version)), None)
        if bucket is None:
            moved = first[e.api_version]
            out.remove(moved)
            bucket = Entry(ANCIENT_CHANGES, "Update", e.api_version, moved.fields, moved.time)
            out.append(bucket)
        if e is bucket:
            continue
        bucket.fields |= e.fields
        bucket.time = e.time
        out.remove(e)
        count -= 1
    return out
