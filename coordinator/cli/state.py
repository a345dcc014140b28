"""`coordinator state ...`: get, set, apply, diff, sync, history, backup, restore."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from coordinator.cli.output import app_of, dump_document, emit, run, say, table, when
from coordinator.errors import UsageError
from coordinator.register import ENVELOPE_LIMIT, MAX_DEPTH, OBJECT_LIMIT


def _coordinator(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.api import Coordinator

    app = app_of(ctx)
    return Coordinator.from_config(app.config_path, timeout=app.timeout)


def _with_state(ctx: click.Context, deployment: str, fn: Any) -> Any:
    c = _coordinator(ctx)

    async def go() -> Any:
        async with c:
            return await fn(c.state(deployment))

    return run(go)


_lock_id = click.option(
    "--lock-id",
    envvar="COORDINATOR_LOCK_ID",
    default=None,
    help="Lock id [env COORDINATOR_LOCK_ID; default: the one recorded for this holder].",
)


@dataclass(frozen=True)
class Assignment:
    """``KEY=TEXT`` (a string, exactly as typed) or ``KEY:=JSON`` (a typed value)."""

    key: str
    value: Any
    typed: str | None = None  # the JSON text of KEY:=JSON

    def changed(self) -> bool:
        """Whether the stored value reads differently from what was typed (1.10 -> 1.1)."""
        if self.typed is None:
            return False
        literals: list[str] = []

        def keep(text: str) -> float:
            literals.append(text)
            return 0.0

        json.loads(self.typed, parse_float=keep, parse_int=keep)
        return any(json.dumps(float(t) if any(c in t for c in ".eE") else int(t)) != t for t in literals)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} cannot be stored as JSON")


def parse_assignment(text: str) -> Assignment:
    if "=" not in text:
        raise UsageError(
            f"{text!r} is not KEY=VALUE (for example replicas=3 or app.version=1.2.0; KEY:=JSON for a "
            "typed value, such as replicas:=3 or canary:=true)."
        )
    key, raw = text.split("=", 1)
    typed = key.endswith(":")
    key = key.removesuffix(":").strip()
    if not key or any(not part for part in key.split(".")):
        raise UsageError(f"{text[:100]!r} has an empty key; use names like replicas or app.version.")
    shown = key if len(key) <= 80 else key[:77] + "..."
    if not typed:
        # Within the limits of a whole document where the key puts it, as KEY:=JSON below:
        # a key of 150 parts is a document 151 levels deep, which `state apply` refuses.
        _check_tree(_placed(key, raw), f"The value of {shown}")
        return Assignment(key, raw)
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise UsageError(f"The value of {key} is nested too deeply. Nothing was written.") from None
    except ValueError as err:
        if "cannot be stored as JSON" in str(err):
            raise UsageError(
                f"{key}:={raw}: {err} (use a finite number, or a string with {key}={raw}). Nothing was written."
            ) from None
        raise UsageError(
            f'{key}:={raw} is not a JSON value ({err}). KEY:=JSON takes JSON: 3, 1.5, true, null, "text", '
            f'[1, 2] or {{"a": 1}}; KEY=VALUE stores VALUE as a string. Nothing was written.'
        ) from None
    # Within the limits of a whole document, where the key puts it (what `state get -o
    # json` prints must be taken back by `state apply`).
    _check_tree(_placed(key, value), f"The value of {shown}")
    return Assignment(key, value, raw)


def _placed(key: str, value: Any) -> dict[str, Any]:
    """``value`` where the dotted ``key`` puts it in a document (without recursion)."""
    placed: Any = value
    for part in reversed(key.split(".")):
        placed = {part: placed}
    return dict(placed)


def _number_too_long(source: str) -> UsageError:
    return UsageError(
        f"{source} holds an integer of more than {sys.get_int_max_str_digits():,} digits, which cannot be "
        "converted; store such a number as a string. Nothing was written."
    )


def _is_digits_limit(err: ValueError) -> bool:
    return "integer string conversion" in str(err)


def _write_text(report: Any) -> None:
    say(
        f"Wrote version {report.version} (token {report.token}) on {len(report.confirmed)} of "
        f"{len(report.results)} clusters (quorum {report.quorum})."
    )
    table(["cluster", "outcome", "detail"], [[k, str(r.outcome), r.detail] for k, r in sorted(report.results.items())])
    if report.lagging:
        say(f"Lagging: {', '.join(report.lagging)}; the next read or `state sync` repairs them.")
    for k, path in sorted(report.saved.items()):
        say(f"The replica on {k} was saved to {path} before it was overwritten.")


def _write_doc(report: Any) -> dict[str, Any]:
    doc = {
        "deployment": report.deployment,
        "outcome": report.outcome,
        "version": report.version,
        "token": report.token,
        "write_id": report.write_id,
        "quorum": report.quorum,
        "confirmed": report.confirmed,
        "promised": report.promised,
        "clusters": [
            {"name": k, "outcome": str(r.outcome), "detail": r.detail} for k, r in sorted(report.results.items())
        ],
    }
    if report.saved:
        doc["saved"] = report.saved
    return doc


def _emit_write(
    ctx: click.Context,
    fn: Any,
    deployment: str,
    *,
    notes: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    from coordinator.errors import CoordinatorError

    try:
        report = _with_state(ctx, deployment, fn)
    except CoordinatorError as err:
        if err.payload is not None and hasattr(err.payload, "confirmed"):
            emit(ctx, _write_doc(err.payload) | (extra or {}), lambda: None)
        raise

    def text() -> None:
        _write_text(report)
        for line in notes or []:
            say(line)

    emit(ctx, _write_doc(report) | (extra or {}), text)


@click.group()
def state() -> None:
    """Read and write the deployment's quorum-replicated state."""


@state.command("get")
@click.argument("deployment")
@click.argument("key", required=False)
@click.pass_context
def get(ctx: click.Context, deployment: str, key: str | None) -> None:
    """Print the state (or one dotted KEY), read from a majority.

    Example: coordinator state get payments app.version
    """
    value = _with_state(ctx, deployment, lambda s: s.get(key))
    fmt = app_of(ctx).output
    if fmt in ("json", "yaml"):
        click.echo(dump_document(value, fmt))
    elif isinstance(value, dict | list):
        click.echo(dump_document(value, "yaml"))
    else:
        # For people, like every value printed in a table: whoever may write the state
        # chose it, so control characters and line breaks are shown as escapes
        # (`-o json` prints it exact).
        say("" if value is None else (json.dumps(value) if isinstance(value, bool) else str(value)))


@state.command("set")
@click.argument("deployment")
@click.argument("assignments", nargs=-1, required=True)
@_lock_id
@click.pass_context
def set_(ctx: click.Context, deployment: str, assignments: tuple[str, ...], lock_id: str | None) -> None:
    """Set KEY=VALUE pairs as a new version, under the lock.

    KEY=VALUE stores VALUE as a string, exactly as typed (1.10, 0755, NO, 12:30 stay
    text); KEY:=JSON stores a typed value (replicas:=3, canary:=true, ratio:=0.5,
    tags:='["a","b"]'), and says so when it reads differently from what was typed.

    Example: coordinator state set payments app.version=1.10 replicas:=3 canary:=true
    """
    parsed = [parse_assignment(a) for a in assignments]
    values = {a.key: a.value for a in parsed}
    notes = [
        f"Stored {a.key} as {json.dumps(a.value, ensure_ascii=False)} (typed {a.typed})." for a in parsed if a.changed()
    ]
    _emit_write(
        ctx,
        lambda s: s.set(values, lock=lock_id, command="state set " + " ".join(assignments)[:200]),
        deployment,
        notes=notes,
        extra={"values": values},
    )


# Limits of `state apply` input, checked before and while parsing: a few hundred bytes of
# YAML aliases can stand for billions of nodes.
DOCUMENT_BYTES = 4 * OBJECT_LIMIT  # pretty-printed YAML of the largest state that fits
DOCUMENT_NODES = 200_000  # after aliases are expanded
DOCUMENT_DEPTH = MAX_DEPTH  # a replica nested deeper is corrupt (register.decode_replica)

_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}
_TAG_NAMES = {
    "tag:yaml.org,2002:bool": "the boolean",
    "tag:yaml.org,2002:int": "the number",
    "tag:yaml.org,2002:float": "the number",
    "tag:yaml.org,2002:null": "null",
    "tag:yaml.org,2002:timestamp": "a date or time",
}


def _read_document_text(path: str) -> str:
    """The file's text, refusing one larger than any state could be before reading it all."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(DOCUMENT_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                data = fh.read(DOCUMENT_BYTES + 1)
        if len(data) > DOCUMENT_BYTES:
            raise UsageError(
                f"{path} is larger than {DOCUMENT_BYTES:,} bytes, over the limit of what a state document can "
                f"be (the stored envelope may take at most {ENVELOPE_LIMIT:,} bytes). Nothing was written."
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"Cannot read {path}: {err}.") from err


def _too_big(source: str, what: str) -> UsageError:
    return UsageError(
        f"{source} {what}: over the limit of {DOCUMENT_NODES:,} values, {DOCUMENT_DEPTH} levels deep, that a "
        "state document may have (YAML anchors and aliases count once per use). Nothing was written."
    )


def _check_tree(doc: Any, source: str) -> None:
    """Size and depth of parsed JSON, without recursion."""
    stack = [(doc, 1)]
    count = 0
    while stack:
        cur, depth = stack.pop()
        count += 1
        if count > DOCUMENT_NODES:
            raise _too_big(source, f"has more than {DOCUMENT_NODES:,} values")
        if depth > DOCUMENT_DEPTH:
            raise _too_big(source, f"is nested more than {DOCUMENT_DEPTH} levels deep")
        if isinstance(cur, dict):
            stack.extend((v, depth + 1) for v in cur.values())
        elif isinstance(cur, list):
            stack.extend((v, depth + 1) for v in cur)


def _check_nodes(root: Any, source: str) -> None:
    """Walk the composed YAML graph once (aliases are shared nodes): refuse cycles,
    expanded size and depth over the limits, keys that are not strings and values JSON
    cannot hold, each with where it is and how to quote it."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > DOCUMENT_NODES:
                raise _too_big(source, f"expands to more than {DOCUMENT_NODES:,} values")
            if depth[key] > DOCUMENT_DEPTH:
                raise _too_big(source, f"is nested more than {DOCUMENT_DEPTH} levels deep")
            continue
        if key in size:
            continue
        if key in on_path:
            raise UsageError(f"{source} holds an alias to a node that contains it (a cycle). Nothing was written.")
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for k, _v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag == "tag:yaml.org,2002:merge":
                    continue
                if not isinstance(k, yaml.ScalarNode) or k.tag != "tag:yaml.org,2002:str":
                    raise UsageError(
                        f"{source}, line {k.start_mark.line + 1}: {_key_problem(k)}, and state keys are strings. "
                        "Nothing was written."
                    )
        elif isinstance(node, yaml.ScalarNode) and node.tag not in _PLAIN_TAGS:
            read_as = _TAG_NAMES.get(node.tag, repr(node.tag))
            raise UsageError(
                f"{source}, line {line}: the value {str(node.value)[:100]!r} is read by YAML as {read_as}, "
                f"which is not plain data JSON can hold. Quote it ('{str(node.value)[:100]}') to keep it as text, "
                "or use strings, numbers, booleans, null, lists and maps. Nothing was written."
            )
        elif not isinstance(node, yaml.ScalarNode) and node.tag not in _PLAIN_TAGS:
            raise UsageError(
                f"{source}, line {line}: a value tagged {node.tag!r} is not plain data; use strings, numbers, "
                "booleans, null, lists and maps. Nothing was written."
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _key_problem(k: Any) -> str:
    import yaml

    if not isinstance(k, yaml.ScalarNode):
        return "a key is a list or a map (a YAML complex key)"
    text = str(k.value)[:100]
    try:
        read = yaml.safe_load(text) if k.tag in _TAG_NAMES else None
    except yaml.YAMLError:
        read = None
    if k.tag == "tag:yaml.org,2002:null":
        as_what = "null"
    elif k.tag in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
        as_what = f"{_TAG_NAMES[k.tag]} {json.dumps(read, default=str)}"
    else:
        as_what = _TAG_NAMES.get(k.tag, k.tag)
    return f"the key {text!r} is read by YAML as {as_what}, not as the text {text!r}; quote it ('{text}': ...)"


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def parse_document(text: str, source: str) -> dict[str, Any]:
    """A state document from YAML or JSON text, within the limits above."""
    import yaml

    if len(text.encode()) > DOCUMENT_BYTES:
        raise UsageError(f"{source} is larger than {DOCUMENT_BYTES:,} bytes. Nothing was written.")
    doc: Any = None
    parsed = False
    if text.lstrip().startswith(("{", "[")):
        try:
            doc, parsed = json.loads(text), True
        except RecursionError:
            raise _too_big(source, f"is nested more than {DOCUMENT_DEPTH} levels deep") from None
        except ValueError as err:
            if _is_digits_limit(err):
                raise _number_too_long(source) from None
            # maybe YAML flow style; YAML says what is wrong
        if parsed:
            _check_tree(doc, source)
    if not parsed:
        loader = yaml.CSafeLoader(text) if yaml.__with_libyaml__ else yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_nodes(node, source)
                doc = loader.construct_document(node)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise UsageError(
                f"{source} is neither valid YAML nor JSON{where}: {getattr(err, 'problem', None) or err}. "
                "Nothing was written."
            ) from err
        except RecursionError:
            raise _too_big(source, f"is nested more than {DOCUMENT_DEPTH} levels deep") from None
        except ValueError as err:
            if _is_digits_limit(err):
                raise _number_too_long(source) from None
            raise
        finally:
            loader.dispose()
    if not isinstance(doc, dict):
        raise UsageError(
            f"{source} must hold a mapping at the top level, not {type(doc).__name__}. Nothing was written."
        )
    from coordinator.state import plain_data_problem

    try:
        json.dumps(doc)  # what is stored is JSON text: an integer too long for it is refused here
    except ValueError as err:
        if _is_digits_limit(err):
            raise _number_too_long(source) from None
    problem = plain_data_problem(doc)
    if problem and "finite" not in problem:  # NaN and infinities are refused when written, saying so
        raise UsageError(
            f"{source} holds values that are not plain data ({problem}); use strings, numbers, "
            "booleans, null, lists and maps, with string keys. Nothing was written."
        )
    return doc


@state.command("apply")
@click.argument("deployment")
@click.option("-f", "--file", "path", required=True, help="YAML or JSON file ('-' for stdin); replaces the data.")
@_lock_id
@click.pass_context
def apply(ctx: click.Context, deployment: str, path: str, lock_id: str | None) -> None:
    """Replace the whole state document with a YAML/JSON file, under the lock.

    The lock is checked before the file is parsed; keys must be strings (quote YAML's
    on/off/yes/no and numbers used as keys).

    Example: coordinator state apply payments -f state.yaml
    """
    text = _read_document_text(path)
    _emit_write(
        ctx,
        lambda s: s.apply(lambda: parse_document(text, path), lock=lock_id, command=f"state apply -f {path}"),
        deployment,
    )


@state.command("diff")
@click.argument("deployment")
@click.pass_context
def diff(ctx: click.Context, deployment: str) -> None:
    """Per-cluster stamp (token/version/write id) and checksum, against the value a read returns.

    current: holds it; behind: an older stamp (a read or `state sync` repairs it);
    suspect: a token no lease of a majority has seen (`state sync --from` decides);
    conflict: other data under the same stamp (edited by hand); corrupt; absent.

    Example: coordinator state diff payments
    """
    rows = _with_state(ctx, deployment, lambda s: s.diff())

    def text() -> None:
        table(
            ["cluster", "status", "version", "token", "write id", "checksum", "detail"],
            [
                [
                    r["name"],
                    r["status"],
                    r["version"],
                    r["token"],
                    (r["write_id"] or "")[:8],
                    (r["checksum"] or "")[:19],
                    (r["detail"] or "") + (f" (promised {r['promised']})" if r["promised"] else ""),
                ]
                for r in rows
            ],
        )
        for line in diff_summary(rows, deployment):
            say(line)

    emit(ctx, rows, text)


def diff_summary(rows: list[dict[str, Any]], deployment: str) -> list[str]:
    """What `state diff` concludes: "equal" only when every replica holds the same stamp
    and the same checksum."""
    stamps = {(r["token"], r["version"], r["write_id"]) for r in rows}
    sums = {r["checksum"] for r in rows}
    if all(r["status"] == "current" for r in rows) and len(stamps) == 1 and len(sums) == 1:
        return ["All replicas are equal."]
    if all(r["status"] == "empty" for r in rows):
        return ["No replica holds any state yet."]
    lines = []
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(r["status"], []).append(r["name"])
    if by.get("behind") or by.get("absent"):
        data = {r["checksum"] for r in rows if r["status"] in ("current", "behind")}
        what = "different data" if len(data) > 1 else "the same data under older stamps"
        lines.append(
            f"Replicas differ: {', '.join(by.get('behind', []) + by.get('absent', []))} "
            f"{'is' if len(by.get('behind', []) + by.get('absent', [])) == 1 else 'are'} behind ({what}); "
            f"the next read or `coordinator state sync {deployment}` repairs them."
        )
    for status, advice in (
        (
            "suspect",
            f"never read or repaired; `coordinator state sync {deployment} --from CLUSTER` adopts or "
            "overwrites them deliberately, under the lock",
        ),
        ("conflict", f"`coordinator state sync {deployment} --from CLUSTER` adopts one deliberately"),
        ("corrupt", f"`coordinator state sync {deployment}` saves and overwrites them"),
        ("newer-schema", "upgrade coordinator"),
    ):
        if by.get(status):
            lines.append(f"{status.capitalize()}: {', '.join(by[status])}; {advice}.")
    unseen = [
        r["name"]
        for r in rows
        if r["status"] not in ("current", "behind", "absent", "empty", "suspect", "conflict", "corrupt", "newer-schema")
    ]
    if unseen:
        lines.append(f"Not read: {', '.join(unseen)}; they are not known to be equal.")
    return lines or ["Replicas differ."]


@state.command("sync")
@click.argument("deployment")
@click.option(
    "--backup-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to save replicas before overwriting them (corrupt ones; suspect ones with --from).",
)
@click.option(
    "--from",
    "source",
    default=None,
    metavar="CLUSTER",
    help="Adopt CLUSTER's replica (suspect or not) as a new version on every member, overwriting "
    "suspect replicas; under the lock, with an audit entry.",
)
@_lock_id
@click.pass_context
def sync(ctx: click.Context, deployment: str, backup_dir: str | None, source: str | None, lock_id: str | None) -> None:
    """Bring every reachable replica to the value a read returns (saving corrupt ones first).

    Suspect replicas are left alone; --from CLUSTER adopts one cluster's data deliberately.

    Example: coordinator state sync payments
    """
    folder = Path(backup_dir) if backup_dir else None
    if source is not None:
        _emit_write(
            ctx, lambda s: s.adopt(source, lock=lock_id, backup_dir=folder), deployment, extra={"adopted_from": source}
        )
        return
    out = _with_state(ctx, deployment, lambda s: s.sync(folder))

    def text() -> None:
        say(
            f"Winning version {out['version']} (token {out['token']}, from {out['winner']}); "
            f"repaired: {', '.join(out['repaired']) or 'none'}."
        )
        for k, p in out["saved_corrupt"].items():
            say(f"Corrupt replica on {k} saved to {p} before it was overwritten.")
        for k, why in out["failed"].items():
            say(f"Could not repair {k}: {why}")
        for k, why in out["suspect"].items():
            say(
                f"Suspect replica on {k} left alone: {why}. `coordinator state sync {deployment} --from CLUSTER` "
                "adopts or overwrites it."
            )
        if out["unreachable"]:
            say(f"Not reached: {', '.join(out['unreachable'])}.")

    emit(ctx, out, text)


@state.command("history")
@click.argument("deployment")
@click.pass_context
def history(ctx: click.Context, deployment: str) -> None:
    """Show the audit log kept with the state (who, what, when, from where, which version).

    Example: coordinator state history payments
    """
    entries = _with_state(ctx, deployment, lambda s: s.history())
    docs = [e.model_dump(mode="json") for e in entries]
    emit(
        ctx,
        docs,
        lambda: table(
            ["version", "token", "when", "who", "host", "command", "keys"],
            [
                [
                    e.version,
                    e.token,
                    when(e.at),
                    e.who,
                    e.host,
                    e.command + (f" ({e.note})" if e.note else ""),
                    ",".join(e.keys),
                ]
                for e in entries
            ],
        ),
    )


@state.command("backup")
@click.argument("deployment")
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False), help="File to write.")
@click.pass_context
def backup(ctx: click.Context, deployment: str, path: str) -> None:
    """Write the winning state envelope to a file.

    Example: coordinator state backup payments -f payments-state.json
    """
    env = _with_state(ctx, deployment, lambda s: s.backup(Path(path)))
    emit(
        ctx,
        {"file": path, "version": env.version, "token": env.token},
        lambda: say(f"Saved version {env.version} (token {env.token}) of {deployment} to {path}."),
    )


@state.command("restore")
@click.argument("deployment")
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False), help="Backup file to restore.")
@_lock_id
@click.pass_context
def restore(ctx: click.Context, deployment: str, path: str, lock_id: str | None) -> None:
    """Write a backup's data back as a new version (under the lock, with an audit entry).

    Example: coordinator state restore payments -f payments-state.json
    """
    from coordinator.state import load_backup

    backup = load_backup(Path(path))  # validated before touching any cluster, and read once
    _emit_write(ctx, lambda s: s.restore(Path(path), lock=lock_id, envelope=backup), deployment)
