"""Field paths of watched resources: JSONPath as kubectl writes it (parsed with
jsonpath-ng, restricted to kubectl's grammar), the values they select, and JSON equality.

Pure: no I/O; used by the drift rules (coordinator/rules/expectations.py)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonpath_ng import jsonpath as jp
from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext.filter import Filter
from jsonpath_ng.ext.parser import parse as jsonpath_parse

from coordinator.errors import UsageError


@lru_cache(maxsize=256)
def compiled(path: str) -> Any:
    # The extended parser: kubectl's filters (`[?(@.name=="api")]`) are JSONPath it reads.
    return jsonpath_parse("$" + path)


# What kubectl's JSONPath has: fields, indices, slices, wildcards, `..`, and filters that
# compare (no regular expressions, arithmetic or jsonpath-ng's named extensions).
_FILTER_OPS = frozenset({"==", "!=", "<", "<=", ">", ">=", None})


def _kubectl_grammar(node: Any) -> bool:
    if isinstance(node, jp.Child | jp.Descendants):
        return _kubectl_grammar(node.left) and _kubectl_grammar(node.right)
    if type(node) in (jp.Root, jp.This, jp.Fields, jp.Index, jp.Slice, jp.Wildcard):
        return True
    if isinstance(node, Filter):
        return all(
            getattr(e, "op", None) in _FILTER_OPS and _kubectl_grammar(getattr(e, "target", None))
            for e in node.expressions
        )
    return False


def parse_field(text: str) -> str:
    """A field path as kubectl writes it (``.spec.replicas``, ``{.spec.replicas}``,
    ``.spec.template.spec.containers[*].image``), checked; returned in the dotted form."""
    path = text.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1].strip()
    if path.startswith("$"):
        path = path[1:]
    if not path.startswith("."):
        raise UsageError(
            f"Cannot read the field {text!r}: a field is a JSONPath from the object's top, starting with a dot, "
            "e.g. .spec.replicas or .spec.template.spec.containers[*].image."
        )
    try:
        expr = compiled(path)
    # The parser raises its lexer's and parser's errors, and plain exceptions for some input.
    except (JsonPathLexerError, JsonPathParserError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise UsageError(
            f"Cannot read the field {text!r} as a JSONPath ({str(err).strip() or type(err).__name__}); "
            "write it like .spec.replicas or .spec.template.spec.containers[*].image."
        ) from None
    if not _kubectl_grammar(expr):
        raise UsageError(
            f"Cannot use the field {text!r}: only kubectl's JSONPath is taken (fields, [N], [*], [a:b], .., and "
            'filters that compare, such as [?(@.name=="api")]); no arithmetic, regular expressions or '
            "named functions."
        )
    return path


def many(node: Any) -> bool:
    """Whether a path can match more than one value (then its value is a list): anything
    but fields and single indices (wildcards, slices, filters, ``..``)."""
    if isinstance(node, jp.Child):
        return many(node.left) or many(node.right)
    if isinstance(node, jp.Root | jp.This):
        return False
    if isinstance(node, jp.Fields):
        return len(node.fields) != 1 or node.fields[0] == "*"
    if isinstance(node, jp.Index):
        return len(getattr(node, "indices", (0,))) != 1
    return True


def found_in(obj: Mapping[str, Any], path: str) -> bool:
    """Whether ``path`` matches anything in ``obj`` (an explicit null counts)."""
    return bool(compiled(path).find(obj))


def value_at(obj: Mapping[str, Any], path: str) -> Any:
    """The value of ``path`` in ``obj``: one value (None when absent) for a path naming one
    field, a list of every match for one that may match several (``[*]``)."""
    expr = compiled(path)
    found = [m.value for m in expr.find(obj)]
    if many(expr):
        return found
    return found[0] if found else None


def same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same value: Python's ``==`` takes ``true``
    for ``1`` and ``false`` for ``0`` (also inside lists and maps), which JSON and the API
    server do not. Numbers compare by value (``1`` and ``1.0`` are one JSON number)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
