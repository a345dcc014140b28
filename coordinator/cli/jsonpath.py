"""kubectl's JSONPath templates (``-o jsonpath=TEMPLATE``) over a JSON document.

A template is literal text with actions in braces, as kubectl writes them:

* ``{.holder}``, ``{.clusters[*].name}``, ``{..name}``, ``{.clusters[?(@.status=="held")].name}``:
  a JSONPath from the current object (the document, or the element a ``range`` is at);
  ``{$.deployment}`` starts from the document's top, ``{@}`` is the current object;
* ``{range .clusters[*]}...{end}``: the text between, once per element found;
* ``{"\\n"}``, ``{"\\t"}``: a quoted string, with JSON's escapes.

The paths themselves are read by jsonpath-ng's extended parser (the filters). What is
found is printed as kubectl prints it: several values of one path separated by a space,
a string as it is, anything else as compact JSON; a path that finds nothing (or finds
null) prints nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext.parser import parse as _jsonpath_parse


class TemplateError(ValueError):
    """A template that does not parse; the message says where and why."""


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Path:
    source: str  # as written, for messages
    from_root: bool  # `$...`: from the document's top, not the current object
    compiled: Any


@dataclass(frozen=True)
class _Range:
    path: _Path
    body: tuple[_Text | _Path | _Range, ...]


_Node = _Text | _Path | _Range


@dataclass(frozen=True)
class Template:
    source: str
    nodes: tuple[_Node, ...]

    def render(self, document: Any) -> str:
        return "".join(_render(self.nodes, document, document))


def _actions(template: str) -> list[tuple[bool, str]]:
    """The template cut into (is-action, text) pieces. A brace inside a quoted string of
    an action (`{"}"}`, a filter's `"a}b"`) does not end it."""
    pieces: list[tuple[bool, str]] = []
    i, n = 0, len(template)
    while i < n:
        start = template.find("{", i)
        if start < 0:
            pieces.append((False, template[i:]))
            break
        if start > i:
            pieces.append((False, template[i:start]))
        j, quote = start + 1, ""
        while j < n:
            ch = template[j]
            if quote:
                if ch == "\\":
                    j += 1
                elif ch == quote:
                    quote = ""
            elif ch in "\"'":
                quote = ch
            elif ch == "}":
                break
            elif ch == "{":
                raise TemplateError(f"a '{{' at column {j + 1} inside the action opened at column {start + 1}")
            j += 1
        if j >= n:
            raise TemplateError(f"the '{{' at column {start + 1} is not closed by a '}}'")
        pieces.append((True, template[start + 1 : j].strip()))
        i = j + 1
    return pieces


def _path(source: str) -> _Path:
    if source.startswith("$"):
        from_root, path = True, source
    elif source.startswith("@"):
        from_root, path = False, "$" + source[1:]
    elif source.startswith((".", "[")):
        from_root, path = False, "$" + source
    else:
        raise TemplateError(
            f"{{{source}}} is neither a path (starting with '.', '[', '@' or '$'), a quoted string, range nor end"
        )
    try:
        compiled = _jsonpath_parse(path)
    # The parser raises its lexer's and parser's errors, and plain exceptions for some input.
    except (JsonPathLexerError, JsonPathParserError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise TemplateError(f"{{{source}}} is no JSONPath ({str(err).strip() or type(err).__name__})") from None
    return _Path(source, from_root, compiled)


def _literal(source: str) -> str:
    body = source[1:-1]
    if source[0] == "'":  # a single-quoted string: the same escapes, its own quote
        body = body.replace("\\'", "'").replace('"', '\\"')
    try:
        value = json.loads(f'"{body}"')
    except json.JSONDecodeError:
        raise TemplateError(f"{{{source}}} is no quoted string (escapes are JSON's: \\n, \\t, \\\", \\\\)") from None
    return str(value)


def parse(template: str) -> Template:
    """``template`` read, or :class:`TemplateError` saying what does not parse."""
    stack: list[tuple[_Path | None, list[_Node]]] = [(None, [])]
    for is_action, text in _actions(template):
        body = stack[-1][1]
        if not is_action:
            body.append(_Text(text))
        elif text == "end":
            if len(stack) == 1:
                raise TemplateError("{end} without a {range ...} before it")
            over, inner = stack.pop()
            assert over is not None
            stack[-1][1].append(_Range(over, tuple(inner)))
        elif text == "range" or text.startswith(("range ", "range\t", "range[")):
            over_text = text[len("range") :].strip()
            if not over_text:
                raise TemplateError("{range} needs a path to go over, e.g. {range .clusters[*]}")
            stack.append((_path(over_text), []))
        elif len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            body.append(_Text(_literal(text)))
        elif not text:
            raise TemplateError("an empty action {}")
        else:
            body.append(_path(text))
    if len(stack) > 1:
        raise TemplateError(f"{{range {stack[-1][0].source if stack[-1][0] else ''}}} is not closed by an {{end}}")
    return Template(template, tuple(stack[0][1]))


def _found(path: _Path, root: Any, current: Any) -> list[Any]:
    try:
        return [m.value for m in path.compiled.find(root if path.from_root else current)]
    except (TypeError, AttributeError, KeyError, IndexError, ValueError):
        # A filter comparing values of different types: kubectl finds nothing there too.
        return []


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _render(nodes: tuple[_Node, ...], root: Any, current: Any) -> list[str]:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Path):
            out.append(" ".join(_text(v) for v in _found(node, root, current)))
        else:
            for item in _found(node.path, root, current):
                out.extend(_render(node.body, root, item))
    return out
