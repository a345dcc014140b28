"""The small parts of the state register's rules (coordinator/engine/register.py): envelopes
of older schemas, a stamp of an envelope, the stored size of a document, how deep it is
nested and a replica's resourceVersion.

The replica's accept/refuse rule and the read's choice are in tests/state/unit/test_register.py; the
whole write and read protocol, run by the engine over in-memory API servers one request at a
time, in tests/sim/test_register.py.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from served import served

from coordinator.config.models import STATE_SCHEMA, StateEnvelope
from coordinator.engine import register as reg
from coordinator.engine.register import Replica, Stamp
from coordinator.errors import UsageError

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
documents = st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=4)


def _envelope(data: dict[str, Any], stamp: Stamp) -> tuple[StateEnvelope, str]:
    return reg.build_envelope(
        None,
        data,
        stamp,
        who="me",
        host="h",
        command="test",
        now=NOW,
        members=["c1", "c2", "c3"],
        member_ids={},
        namespace="ns",
        storage="configmap",
        keys=sorted(data),
    )


def _decode(text: str, storage: str = "configmap", **meta: Any) -> Replica:
    value = base64.b64encode(text.encode()).decode() if storage == "secret" else text
    return reg.decode_replica("c1", served({"metadata": dict(meta), "data": {reg.DATA_KEY: value}}), storage)


# ------------------------------------------------------------------ older schemas


@pytest.mark.parametrize("schema", [0, 1])
def test_an_envelope_of_an_older_schema_is_corrupt_and_its_token_still_counts(schema: int) -> None:
    data = {"a": 1}
    doc = {
        "schema": schema,
        "version": 4,
        "token": 9,
        "checksum": reg.checksum(data),
        "written_by": "x",
        "written_at": "2026-11-30T08:00:00Z",
        "members": ["c1"],
        "data": data,
    }
    rep = reg.decode_replica("c1", served({"data": {reg.DATA_KEY: json.dumps(doc)}}), "configmap")
    assert rep.envelope is None and rep.corrupt is not None and "older" in rep.corrupt
    # Never a write id of coordinator's: the claimed stamp keeps its token and version,
    # so a new stamp is still drawn above them.
    assert rep.claimed == Stamp(9, 4, "")


# ------------------------------------------------------------------ stamps of envelopes


@given(st.integers(0, 10**9), st.integers(1, 10**9))
def test_stamp_of_names_the_envelope_by_token_version_and_write_id(token: int, version: int) -> None:
    stamp = Stamp(token, version, reg.new_write_id())
    env, text = _envelope({"k": "v"}, stamp)
    assert reg.stamp_of(env) == stamp
    assert reg.stamp_of(StateEnvelope.model_validate_json(text)) == stamp


def test_encode_envelope_is_compact_json_that_decodes_to_the_same_envelope() -> None:
    env, text = _envelope({"b": 2, "a": [1, {"c": None}]}, Stamp(4, 5, "abc"))
    assert reg.encode_envelope(env) == text
    assert ": " not in text and ", " not in text
    rep = _decode(text)
    assert rep.corrupt is None and rep.envelope is not None
    assert rep.envelope.data == {"b": 2, "a": [1, {"c": None}]} and rep.stamp == Stamp(4, 5, "abc")


# ------------------------------------------------------------------ sizes


def test_stored_size_counts_bytes_not_characters() -> None:
    assert reg.stored_size("abc", "configmap") == 3
    assert reg.stored_size("é", "configmap") == 2
    assert reg.stored_size("", "configmap") == 0


@given(st.text(max_size=300))
def test_stored_size_of_a_secret_covers_its_base64(text: str) -> None:
    encoded = len(base64.b64encode(text.encode()))
    size = reg.stored_size(text, "secret")
    assert encoded <= size <= encoded + 4
    assert size >= reg.stored_size(text, "configmap")


def test_check_size_allows_exactly_the_limit() -> None:
    reg.check_size("x" * reg.ENVELOPE_LIMIT, "configmap")
    with pytest.raises(UsageError, match="over the limit"):
        reg.check_size("x" * (reg.ENVELOPE_LIMIT + 1), "configmap")


# ------------------------------------------------------------------ nesting


def nest(depth: int) -> Any:
    """A value ``depth`` levels deep: ``[[...[]...]]`` (built without recursion)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@given(st.integers(1, 300), st.integers(0, 300))
def test_nested_deeper_is_exactly_depth_above_limit(depth: int, limit: int) -> None:
    assert reg.nested_deeper(nest(depth), limit) is (depth > limit)


def test_nested_deeper_counts_scalars_and_mappings_as_levels() -> None:
    assert not reg.nested_deeper({}, 1)
    assert reg.nested_deeper({"a": 1}, 1)  # the value inside is level 2
    assert not reg.nested_deeper({"a": 1}, 2)
    assert not reg.nested_deeper({"a": {"b": [1]}, "c": 2}, 4)
    assert reg.nested_deeper({"a": {"b": [1]}, "c": 2}, 3)
    assert reg.nested_deeper(5, 0) and not reg.nested_deeper(5, 1)
    assert not reg.nested_deeper("a string is one level, not one per character", 1)


def test_nested_deeper_takes_any_depth_without_recursing() -> None:
    assert reg.nested_deeper(nest(200_000), reg.MAX_DEPTH)


def test_what_a_writer_may_write_a_reader_takes_back() -> None:
    # state writes refuse data nested deeper than MAX_DEPTH; a replica is corrupt only past it
    deepest = {"k": nest(reg.MAX_DEPTH - 1)}
    assert not reg.nested_deeper(deepest, reg.MAX_DEPTH)
    _env, text = _envelope(deepest, Stamp(1, 1, "ab"))
    assert _decode(text).corrupt is None
    too_deep = {"k": nest(reg.MAX_DEPTH)}
    assert reg.nested_deeper(too_deep, reg.MAX_DEPTH)
    _env, text = _envelope(too_deep, Stamp(1, 1, "ab"))
    corrupt = _decode(text).corrupt
    assert corrupt is not None and "nested more than" in corrupt


# ------------------------------------------------------------------ a replica's fields


def test_replica_resource_version_comes_from_the_object_read() -> None:
    _env, text = _envelope({"a": 1}, Stamp(1, 1, "ab"))
    assert _decode(text, resourceVersion="812").resource_version == "812"
    assert _decode(text).resource_version is None
    assert Replica("c1", exists=False).resource_version is None
    assert Replica("c1", exists=True, obj={"metadata": None}).resource_version is None


def test_replica_order_and_checksum_follow_its_envelope() -> None:
    env, text = _envelope({"a": 1}, Stamp(3, 9, "ab"))
    rep = _decode(text, storage="secret")
    assert rep.order == (3, 9) and rep.checksum == env.checksum == reg.checksum({"a": 1})
    empty = Replica("c1", exists=False)
    assert empty.order == (0, 0) and empty.checksum is None and empty.stamp == reg.NO_STAMP
    genesis = _decode(reg.genesis_text("d"))
    assert genesis.exists and genesis.envelope is None and genesis.order == (0, 0)
    assert json.loads(reg.genesis_text("d"))["write_id"] == reg.GENESIS_WRITE_ID


# ------------------------------------------------------------------ what a hand edit may not slip past


@pytest.mark.parametrize("schema", ["99", "3", "2", "1", "0", True, 2.0, None, -1, [2]])
def test_a_schema_that_is_no_schema_number_is_corrupt_not_current(schema: Any) -> None:
    # Only the envelope's schema field edited: the checksum (over the data) still holds.
    _env, text = _envelope({"a": 1}, Stamp(1, 1, "ab"))
    rep = _decode(json.dumps(dict(json.loads(text), schema=schema)))
    assert rep.envelope is None and rep.newer_schema is None
    assert rep.corrupt is not None and "schema" in rep.corrupt


def test_a_newer_schema_number_is_refused_and_an_older_one_is_corrupt() -> None:
    _env, text = _envelope({"a": 1}, Stamp(1, 1, "ab"))
    doc = json.loads(text)
    newer = _decode(json.dumps(dict(doc, schema=STATE_SCHEMA + 1)))
    assert newer.newer_schema == STATE_SCHEMA + 1 and newer.envelope is None and newer.corrupt is None
    doc.pop("schema")
    old = _decode(json.dumps(doc))
    assert old.envelope is None and old.corrupt is not None and "older" in old.corrupt


@pytest.mark.parametrize(
    "text", ["٣/1/ab", "1/٣/ab", "01/1/ab", "1/01/ab", "+1/1/ab", " 1/1/ab", "1/1/ab ", "1/" + "9" * 4300 + "/x"]
)
def test_stamp_parse_takes_only_what_str_writes(text: str) -> None:
    with pytest.raises(ValueError, match="is not a stamp"):
        Stamp.parse(text)


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_stamp_parse_is_the_inverse_of_str(token: int, version: int) -> None:
    stamp = Stamp(token, version, reg.new_write_id())
    assert Stamp.parse(str(stamp)) == stamp
