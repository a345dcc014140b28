"""Text from the clusters made safe for a terminal (coordinator/text.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.text import printable


@pytest.mark.parametrize(
    "text",
    ["", "alice@laptop", "déploiement 東京 ✓ 🚀", "tabs? none; quotes ' \" and \\ backslashes"],
)
def test_normal_text_is_left_as_it_is(text: str) -> None:
    assert printable(text) == text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # set the window title
        ("ok\rEVIL", "ok\\rEVIL"),
        ("one\ntwo", "one\\ntwo"),
        ("a\tb", "a\\tb"),
        ("\x7f", "\\x7f"),  # DEL
        ("\x9b2J", "\\x9b2J"),  # the one-byte CSI
        ("abc\u202edef", "abc\\u202edef"),  # right-to-left override
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("line\u2028sep", "line\\u2028sep"),
        ("\U000e0001tag", "\\U000e0001tag"),  # a format character beyond the BMP
    ],
)
def test_what_a_terminal_acts_on_is_shown_escaped(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_keep_newlines_keeps_only_newlines() -> None:
    assert printable("a\nb\rc\x1b", keep_newlines=True) == "a\nb\\rc\\x1b"
    assert printable("a\nb", keep_newlines=False) == "a\\nb"


@given(st.text())
def test_the_result_holds_nothing_a_terminal_acts_on(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    assert all(ch.isprintable() or ch == "\n" for ch in printable(text, keep_newlines=True))
    if text.isprintable():
        assert shown == text
