"""Integers too long to convert and nesting bombs in state input: usage errors (exit 2) that write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coord_fixtures import Env
from helpers.members import succeeded

from coordinator.errors import UsageError

pytestmark = pytest.mark.integration


HUGE_INT = "1" * 5000


def _alias_fanout() -> str:
    """Seven levels of lists, each naming the previous level 50 times: 50**7 values once
    expanded, a few kilobytes as text."""
    lines = ["l0: &l0 [" + ", ".join(["x"] * 50) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 50) + "]" for i in range(1, 7)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text", [f'{{"a": {HUGE_INT}}}', f"a: {HUGE_INT}\n", "a: 0x" + "f" * 5000 + "\n"], ids=["json", "yaml", "yaml-hex"]
)
def test_an_integer_too_long_to_convert_is_a_usage_error(text: str) -> None:
    from coordinator.cli.documents import parse_document

    with pytest.raises(UsageError):
        parse_document(text, "bomb.yaml")


@pytest.mark.parametrize(
    "text",
    [
        "# flow mappings nested past any limit\n" + "{a: " * 20000 + "1" + "}" * 20000,
        "[" * 100000 + "]" * 100000,
        '{"k": ' * 5000 + "1" + "}" * 5000,
        _alias_fanout(),
        json.dumps({f"k{i}": i for i in range(250000)}),
    ],
    ids=["deep-flow-yaml", "deep-json-list", "deep-json-map", "alias-fanout", "many-keys"],
)
def test_bombs_are_refused_as_usage_errors(text: str) -> None:
    from coordinator.cli.documents import parse_document

    with pytest.raises(UsageError):
        parse_document(text, "bomb.yaml")


def test_state_apply_of_a_huge_integer_exits_2_and_writes_nothing(dep3: Env, tmp_path: Path) -> None:
    lock = json.loads(
        succeeded(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "w", "--ttl", "60s")).stdout
    )
    succeeded(dep3.cli("state", "set", "web", "keep=1", "--lock-id", lock["lock_id"]))
    bomb = tmp_path / "bomb.json"
    bomb.write_text(f'{{"a": {HUGE_INT}}}')
    applied = dep3.cli("state", "apply", "web", "-f", str(bomb), "--lock-id", lock["lock_id"])
    assert dep3.cli("state", "get", "web", "keep").stdout.strip() == "1"
    assert applied.returncode == 2, applied.stderr
    assert "Nothing was written" in applied.stderr


def test_a_typed_value_too_long_to_convert_is_a_usage_error() -> None:
    from coordinator.cli.documents import parse_assignment

    with pytest.raises(UsageError):
        parse_assignment("replicas:=" + HUGE_INT)


def test_what_state_set_writes_state_apply_takes_back(dep3: Env, tmp_path: Path) -> None:
    lock = json.loads(
        succeeded(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "w", "--ttl", "60s")).stdout
    )
    deep = "[" * 150 + "]" * 150
    wrote = dep3.cli("state", "set", "web", f"nested:={deep}", "--lock-id", lock["lock_id"])
    if wrote.returncode != 0:  # refused as apply refuses it: consistent
        assert wrote.returncode == 2, wrote.stderr
        return
    printed = succeeded(dep3.cli("-o", "json", "state", "get", "web")).stdout
    saved = tmp_path / "state.json"
    saved.write_text(printed)
    back = dep3.cli("state", "apply", "web", "-f", str(saved), "--lock-id", lock["lock_id"])
    assert back.returncode == 0, back.stderr
