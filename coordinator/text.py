"""Text from the clusters made safe for a terminal.

Holder, reason, command and host annotations, state values and server error messages
are written by whoever may write to a namespace (or sits between us and an API
server). Printed raw, an ESC starts a terminal control sequence (set the window title,
move the cursor, rewrite what was printed), a carriage return overwrites the start of a
line, and a newline forges a line of the tool's own output. :func:`printable` shows every
such character as an escape (``\\x1b``, ``\\r``, ``\\n``, ``\\u202e``) and leaves normal
text, including non-ASCII letters and symbols, as it is.

Only text meant for people goes through it: JSON and YAML output stays exact (both
formats escape control characters themselves).
"""

from __future__ import annotations

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    short = _SHORT.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would act on shown as an escape.

    Escaped: C0 controls (ESC, CR, BEL, backspace, tab, newline, ...), DEL, C1 controls
    (such as the one-byte CSI ``\\x9b``), and what Unicode does not count as printable
    (bidirectional overrides, zero-width and other format characters, line and paragraph
    separators, unassigned code points). With ``keep_newlines``, ``\\n`` is kept, for
    messages whose own lines are the tool's (their cluster text must be escaped where it
    is put in, or a newline in it forges a line).
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or (keep_newlines and ch == "\n") else _escape(ch) for ch in text)
