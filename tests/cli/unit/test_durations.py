"""Durations as people type and read them (coordinator/rules/durations.py), as properties:
what format_duration prints, parse_duration reads back; anything else is a UsageError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.errors import UsageError
from coordinator.rules.durations import format_duration, parse_duration

TEN_YEARS = 10 * 365 * 86400


@given(st.floats(10, TEN_YEARS - 1))
def test_what_is_printed_reads_back_to_the_second(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == round(seconds)


@given(st.floats(0, 9.94))
def test_short_durations_print_to_a_tenth(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=0.05 + 1e-9)


@given(st.floats(0.01, TEN_YEARS))
def test_a_negative_duration_prints_with_a_minus(seconds: float) -> None:
    assert format_duration(-seconds) == "-" + format_duration(seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("1h1m1s", 3661.0), (" 90S ", 90.0), (7, 7.0), (2.5, 2.5), ("0", 0.0), (TEN_YEARS, TEN_YEARS)],
)
def test_parse_takes_units_numbers_and_the_limits(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", [True, "", "s", "1m30", "1.5.5s", "-1s", "-3", "nan", "inf", "1d", "1 m", TEN_YEARS + 1, float("nan")]
)
def test_parse_refuses_anything_else_with_the_option_named(text: str | float) -> None:
    with pytest.raises(UsageError, match=r"^--wait: "):
        parse_duration(text, what="--wait")


@pytest.mark.parametrize(("text", "floor"), [("0", 0.1), ("0s", 1.0), ("50ms", 0.1), ("0.9", 1.0)])
def test_a_duration_below_its_floor_is_refused_saying_why(text: str, floor: float) -> None:
    with pytest.raises(UsageError) as refused:
        parse_duration(text, what="--ttl", at_least=floor, why="a lease must outlive the requests that take it")
    assert refused.value.message == (
        f"--ttl: {text!r} is too short; it must be at least {floor:g}s: a lease must outlive the requests that take it."
    )


def test_the_floor_itself_is_accepted() -> None:
    assert parse_duration("100ms", at_least=0.1) == pytest.approx(0.1)
    assert parse_duration("0", what="--wait") == 0.0  # no floor: zero means what it says
