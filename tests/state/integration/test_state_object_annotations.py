"""Another client removes the annotations of the state objects (member set, token floor):
no stale envelope speaks, no token is granted twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from helpers.members import (
    DEP,
    LEASE,
    STATE,
    acquire,
    holders,
    json_doc,
    kubectl_on,
    machine,
    pay,
    pay_short,
    replica,
    succeeded,
)

from coordinator.rules.membership import A_MEMBERSHIP
from coordinator.rules.resources import configmaps_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


A_FLOOR = "coordinator.io/token-floor"


def _state_object(env: Env, index: int) -> dict[str, Any]:
    return anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/{STATE}")


def _annotate(env: Env, index: int, kind: str, name: str, *edits: str) -> None:
    done = kubectl_on(env, index, "annotate", "--overwrite", kind, name, *edits)
    assert done.returncode == 0, done.stderr


def test_removing_the_state_objects_set_annotation_does_not_let_a_stale_envelope_speak(
    dep5: Env, tmp_path: Path
) -> None:
    """{c1,c2,c3} -> {c1,c4,c5} by two replaces; the stale machine keeps epoch 1. On the
    removed members c2 and c3, someone removes the member-set annotation from the lease
    (round 3 tried that alone: held, because the state objects note the newer set) *and*
    from the state ConfigMap (`kubectl annotate configmap coordinator-state-pay
    coordinator.io/membership-`). The envelopes there still carry the set of their last
    write, epoch 1 — coordinator wrote it, long ago. docs/design.md: a member whose lease says
    nothing speaks through its state object, and a set another client edited is no
    evidence; nothing was deleted and no member missed a commit, so the concession of
    "What is assumed" does not apply. c1 down: the stale record must not get {c2,c3}
    while the real one gets {c4,c5}.

    BROKE: both acquisitions exit 0 — "two holders: A on ['c4', 'c5'] token 4, B on
    ['c2', 'c3'] token 4" (one token granted twice), c2's envelope membership is epoch 1;
    the stale holder's `state set pay release=9.9` exits 0 ("c2 ok wrote version 2, c3 ok
    wrote version 2"), and the real record's `state get pay release` then prints 1.2.0: a
    confirmed write contradicted. Flaw: lock/floor.py:envelope_evidence takes the envelope's
    own `membership` (written_by_us is True for a set parsed from an envelope) when the
    state object's coordinator-owned annotation is gone, and kept_set_speaks lets it speak
    at the record's own epoch; acquire.py (maybe_choose_token) and
    state/replicas.py:members_verdict then count it as agreeing."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4"))
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c2", "c5"))
    for i in (2, 3):
        _annotate(dep5, i, "lease", LEASE, f"{A_MEMBERSHIP}-")
        _annotate(dep5, i, "configmap", STATE, f"{A_MEMBERSHIP}-")
    envelopes = {i: (replica(dep5, i) or {}).get("membership") for i in (2, 3)}
    dep5.sandbox.pause(1)
    try:
        b = acquire(stale, "bob", "--ttl", "60s")
        a = acquire(dep5, "alice", "--ttl", "60s")
        wrote = read = None
        if a.returncode == 0 and b.returncode == 0:
            # what the two holders then do with the state
            wrote = stale.cli(
                "--timeout", "2s", "state", "set", DEP, "release=9.9", "--lock-id", json_doc(b)["lock_id"]
            )
            read = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
    finally:
        dep5.sandbox.resume(1)
    assert not (a.returncode == 0 and b.returncode == 0), (
        holders(a, b),
        envelopes,
        wrote and (wrote.returncode, wrote.stdout.strip()),
        read and (read.returncode, read.stdout.strip()),
    )


def test_removing_the_token_floor_annotation_does_not_let_a_token_be_granted_again(dep5: Env) -> None:
    """pay on {c1,c2,c3}, state written under token T0. Alice takes the lock (token T1 >
    T0) and never writes the state: her token lives on the leases and, docs/design.md, on the
    token floor (`coordinator.io/token-floor`) the acquisition raised on the state
    objects. Someone removes that annotation from the three state ConfigMaps (`kubectl
    annotate configmap coordinator-state-pay coordinator.io/token-floor-`: an annotation
    edit, nothing deleted) and deletes the three leases (docs/design.md: handled). docs/design.md: "the
    next holder's writes are accepted again with no purge", tokens strictly increase; the
    concession (a token granted again) needs the leases *and the state objects* of a
    majority deleted. Bob's token must be above Alice's.

    BROKE: Bob gets fencing token 2, Alice's token (floors read before the edit: '2' on
    all three). By hand, with no state ever written, `lock history pay` lists alice
    (released) and bob both with token 1. Flaw: lock/floor.py:token_floor reads the
    annotation whoever wrote it and a removed one as 0, and
    TokenFloor._state_evidence / envelope_evidence then give max(envelope token, 0); nothing
    records that the floor was ever higher. Fixed: every state object is created with a
    floor, and one without it counts as having had it removed (no token is proven new
    until a floor is put back)."""
    env = dep5
    pay_short(env, "c1", "c2", "c3", max_ttl="8s")
    alice = json_doc(succeeded(acquire(env, "alice", "--ttl", "8s")))
    succeeded(env.cli("lock", "release", DEP, "--holder", "alice"))
    floors = {i: (_state_object(env, i)["metadata"].get("annotations") or {}).get(A_FLOOR) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        _annotate(env, i, "configmap", STATE, f"{A_FLOOR}-")
        assert kubectl_on(env, i, "delete", "lease", LEASE).returncode == 0
    # Now: an object without a floor had it removed (coordinator creates every state object
    # with one), so no token is proven new: Bob is refused, not given Alice's token.
    bob = acquire(env, "bob", "--ttl", "8s", "--max-server-skew", "0s")
    # (exit 5: with the leases deleted and no state object that counts, nothing confirms
    # the member set either)
    assert bob.returncode in (4, 5), (bob.returncode, bob.stdout, bob.stderr, floors)
    assert json_doc(bob)["fencing_token"] is None and not json_doc(bob)["acquired"], bob.stdout
    # The operator puts a floor back (at least the highest token the lock history shows):
    # the next token is above it.
    for i in (1, 2, 3):  # under coordinator's field manager: another client's floor does not speak
        done = kubectl_on(env, i, "annotate", "--overwrite", "--field-manager=coordinator", "configmap", STATE,
                        f"{A_FLOOR}={alice['fencing_token']}")  # fmt: skip
        assert done.returncode == 0, done.stderr
    bob = acquire(env, "bob", "--ttl", "8s", "--wait", "60s", "--max-server-skew", "0s")
    succeeded(bob)
    assert json_doc(bob)["fencing_token"] > alice["fencing_token"], (alice["fencing_token"], json_doc(bob), floors)
