"""What a state object says about fencing tokens and the member set (coordinator/engine/lock/floor.py),
on the dicts an API server returns: only annotations a coordinator field manager owns speak.
The same rules against real API servers: tests/members/integration/test_finishing_runs.py
and tests/state/integration/test_floor_evidence.py."""

from __future__ import annotations

import json
from typing import Any

from coordinator.engine.lock.floor import envelope_evidence, floor_is_ours, genesis_state_object, has_floor, token_floor
from coordinator.rules.membership import A_MEMBERSHIP, Membership
from coordinator.rules.resources import A_TOKEN_FLOOR

SET = Membership.of(["uid-a", "uid-b", "uid-c"], epoch=3)


def state(
    floor: str | None,
    *,
    floor_by: str = "coordinator",
    members: Membership | None = None,
    members_by: str = "coordinator",
    envelope: dict[str, Any] | None = None,
) -> dict[str, Any]:
    anns: dict[str, str] = {}
    fields = []
    if floor is not None:
        anns[A_TOKEN_FLOOR] = floor
        fields.append({"manager": floor_by, "fieldsV1": {"f:metadata": {"f:annotations": {"f:" + A_TOKEN_FLOOR: {}}}}})
    if members is not None:
        anns[A_MEMBERSHIP] = members.dump()
        fields.append({"manager": members_by, "fieldsV1": {"f:metadata": {"f:annotations": {"f:" + A_MEMBERSHIP: {}}}}})
    doc = envelope if envelope is not None else {"token": 2, "membership": {"epoch": 1, "members": ["uid-a"]}}
    return {"metadata": {"annotations": anns, "managedFields": fields}, "data": {"envelope.json": json.dumps(doc)}}


def test_a_floor_is_read_whoever_wrote_it_but_speaks_only_when_coordinators() -> None:
    assert token_floor(state("7")) == 7 and has_floor(state("7")) and floor_is_ours(state("7"))
    other = state("7", floor_by="mallory")
    assert token_floor(other) == 7  # a higher floor only makes the next token higher
    assert not has_floor(other) and not floor_is_ours(other)
    assert floor_is_ours(state("7", floor_by="coordinator-release"))


def test_a_floor_that_is_no_plain_number_says_nothing() -> None:
    for text in ("+5", " 7", "\u0665", "", "1e9", "x", "9" * 4301):
        assert token_floor(state(text)) == 0 and not has_floor(state(text)), text
    assert not has_floor(state(None)) and token_floor(state(None)) == 0


def test_a_floor_as_long_as_a_lease_token_is_read_back() -> None:
    long = "9" * 4001  # what an acquisition above a 4,000-digit floor writes
    assert token_floor(state(long)) == 10**4001 - 1 and has_floor(state(long))


def test_only_the_annotation_speaks_for_the_member_set_never_the_envelope() -> None:
    token, stored = envelope_evidence(state("5", members=SET), secret=False) or (None, None)
    assert token == 5 and stored == SET
    # the envelope's own set (of its last write) is no evidence, with no annotation or
    # with one another client wrote
    assert envelope_evidence(state("5"), secret=False) == (5, None)
    assert envelope_evidence(state("5", members=SET, members_by="kubectl"), secret=False) == (5, None)
    # the envelope's token counts when above the floor
    assert envelope_evidence(state("1", envelope={"token": 9}), secret=False) == (9, None)
    assert envelope_evidence(state("1", envelope={"token": -1}), secret=False) is None


def test_a_new_state_object_carries_a_floor_of_zero_and_the_member_set() -> None:
    body = genesis_state_object("web", "configmap", SET.document())
    anns = body["metadata"]["annotations"]
    assert anns[A_TOKEN_FLOOR] == "0" and Membership.parse(anns[A_MEMBERSHIP]) == SET
    assert genesis_state_object("web", "secret", SET.document())["type"] == "Opaque"
