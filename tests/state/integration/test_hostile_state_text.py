"""State text planted by a namespace writer or given on the command line: printed escaped,
refused when too deep, never a crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import UNHURRIED, Env
from helpers.hostile import FORGED, TITLE, clean, no_crash
from helpers.web import edit_envelope

integration = pytest.mark.integration


@integration
def test_state_get_of_one_key_prints_it_escaped(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", f"note=hello{TITLE}\u202e").returncode == 0
    proc = dep3.cli("state", "get", "web", "note")
    assert proc.returncode == 0, proc.stderr
    clean(proc.stdout)
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web", "note").stdout) == f"hello{TITLE}\u202e"


@integration
def test_state_get_of_the_whole_document_escapes_keys_and_values(dep3: Env) -> None:
    """Held: without KEY, `state get` prints YAML, which escapes control characters and
    (ASCII only) bidi overrides and zero-width characters, in keys and values."""
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    key, value = f"k{TITLE}\u202e", f"v{TITLE}\u200b\r\n{FORGED}"
    assert dep3.cli("state", "set", "web", f"{key}={value}").returncode == 0
    proc = dep3.cli("state", "get", "web")
    assert proc.returncode == 0, proc.stderr
    clean(proc.stdout)
    assert "\u200b" not in proc.stdout
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web").stdout) == {key: value}


@integration
def test_a_key_planted_in_corrupt_envelopes_cannot_forge_a_line_of_the_error(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", "k=v").returncode == 0
    for i in (1, 2, 3):
        edit_envelope(dep3, i, lambda d: d.update(member_ids={f"x\n{FORGED}": 1}))
    for args in (("state", "set", "web", "k=v2"), ("state", "get", "web"), ("state", "diff", "web")):
        proc = dep3.cli(*args)
        no_crash(proc)
        clean(proc.stdout + proc.stderr)


@integration
def test_a_planted_deeply_nested_envelope_is_not_a_crash_for_readers(dep3: Env) -> None:
    from coordinator.engine.register import checksum

    # Every command waits for every member (UNHURRIED): on a loaded machine the suite's 3 s
    # can make the set-up fail (exit 4) or the readers give up before they read a planted
    # envelope (exit 4, which no_crash accepts: nothing would have been checked).
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", env=UNHURRIED).returncode == 0
    assert dep3.cli("state", "set", "web", "k=v", env=UNHURRIED).returncode == 0
    data = {"k": json.loads("[" * 600 + "]" * 600)}

    def deepen(doc: dict[str, Any]) -> None:
        doc.update(data=data, checksum=checksum(data), version=doc["version"] + 1, write_id="f" * 32)

    for i in (1, 2, 3):
        edit_envelope(dep3, i, deepen)
    for args in (("state", "get", "web"), ("-o", "json", "state", "get", "web")):
        no_crash(dep3.cli(*args, env=UNHURRIED))


@integration
def test_state_set_with_a_deeply_dotted_key_is_a_usage_error(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    proc = dep3.cli("state", "set", "web", ".".join(["a"] * 300) + "=v")
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-300:]}"
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web").stdout) in ({}, None)


@integration
def test_what_a_deeply_dotted_state_set_writes_state_apply_takes_back(dep3: Env, tmp_path: Path) -> None:
    """Found: `state set` of a 150-part key succeeded, and `state apply -f` of what
    `state get -o json` then printed was refused (more than 100 levels). Now the key is
    refused (exit 2), and the deepest key it takes (99 parts, 100 levels with the value)
    is taken back by `state apply`."""
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    refused = dep3.cli("state", "set", "web", ".".join(["a"] * 150) + "=v")
    assert refused.returncode == 2, refused.stderr
    made = dep3.cli("state", "set", "web", ".".join(["a"] * 99) + "=v")
    assert made.returncode == 0, made.stderr
    dump = tmp_path / "state.json"
    dump.write_text(dep3.cli("-o", "json", "state", "get", "web").stdout)
    back = dep3.cli("state", "apply", "web", "-f", str(dump))
    assert back.returncode == 0, back.stderr[-300:]
    assert dep3.cli("state", "get", "web", ".".join(["a"] * 99)).stdout.strip() == "v"


# Broke before: the Python API wrote data 140 levels deep, which every reader then called corrupt.
@integration
def test_the_python_api_cannot_write_a_state_that_readers_call_corrupt(dep3: Env) -> None:
    from coordinator.errors import CoordinatorError

    assert dep3.cli("lock", "acquire", "web", "--ttl", "120s").returncode == 0
    assert dep3.cli("state", "set", "web", "keep=important").returncode == 0
    lock_id = json.loads(dep3.cli("-o", "json", "lock", "status", "web").stdout)["lock_id"]
    deep: Any = 1
    for _ in range(140):
        deep = [deep]

    async def write() -> str:
        async with dep3.api() as c:
            try:
                await c.state("web").set({"deep": deep}, lock=lock_id)
            except CoordinatorError as err:
                return f"refused: {err.message}"
        return "written"

    outcome = anyio.run(write)
    assert outcome.startswith("refused: ") and "100 levels" in outcome, outcome
    proc = dep3.cli("-o", "json", "state", "get", "web", "keep")
    assert proc.returncode == 0 and json.loads(proc.stdout) == "important", (outcome, proc.stderr[-400:])
