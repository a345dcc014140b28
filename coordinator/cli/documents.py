"""What `state set` and `state apply` are given, parsed and checked before any cluster is
asked: ``KEY=VALUE`` / ``KEY:=JSON`` assignments and whole YAML or JSON documents, within
the limits of what a state document may be (size, depth, expanded YAML aliases), with
errors that say where the input is wrong and how to write it."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from coordinator.engine.register import ENVELOPE_LIMIT, MAX_DEPTH, OBJECT_LIMIT
from coordinator.errors import UsageError


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


def read_document_text(path: str) -> str:
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
    from coordinator.engine.state import plain_data_problem

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
