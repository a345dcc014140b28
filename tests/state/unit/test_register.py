"""The pure rules of the state register (coordinator.engine.register), case by case."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from served import served

from coordinator.config.models import STATE_SCHEMA, StateEnvelope
from coordinator.engine import register as reg
from coordinator.engine.register import NO_STAMP, Delivery, Kind, Replica, Stamp
from coordinator.errors import UsageError

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def envelope(data: dict[str, Any], stamp: Stamp, *, base: StateEnvelope | None = None) -> tuple[StateEnvelope, str]:
    return reg.build_envelope(
        base,
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


def replica(
    cluster: str,
    data: dict[str, Any] | None = None,
    stamp: Stamp | None = None,
    *,
    promise: Stamp | None = None,
    storage: str = "configmap",
) -> Replica:
    """A replica as it would be read back after the writes that made it."""
    rep = Replica(cluster, exists=False)
    obj = None
    if promise is not None or data is not None:
        obj = reg.build_object(rep, name="s", deployment="d", storage=storage, promise=promise or stamp or NO_STAMP)
        if promise is None:
            obj["metadata"]["annotations"].pop(reg.PROMISE_ANNOTATION)
    if data is not None:
        assert stamp is not None
        _env, text = envelope(data, stamp)
        obj = reg.build_object(
            reg.decode_replica(cluster, served(obj), storage),
            name="s",
            deployment="d",
            storage=storage,
            promise=max(promise or NO_STAMP, stamp),
            envelope_text=text,
        )
        if promise is None:
            obj["metadata"]["annotations"].pop(reg.PROMISE_ANNOTATION)
    if obj is not None:
        obj["metadata"]["resourceVersion"] = "1"
    return reg.decode_replica(cluster, served(obj), storage)


# ------------------------------------------------------------------ stamps


def test_stamps_are_ordered_by_token_then_version_then_write_id() -> None:
    ordered = [
        NO_STAMP,
        Stamp(1, 1, "ff"),
        Stamp(1, 2, "0a"),
        Stamp(1, 2, "0b"),
        Stamp(1, 10, "00"),
        Stamp(2, 1, "00"),
    ]
    assert sorted(reversed(ordered)) == ordered
    assert Stamp(1, 2, "0a") != Stamp(1, 2, "0b")  # equal (token, version) are different stamps


def test_stamp_text_round_trip_and_garbage() -> None:
    s = Stamp(3, 17, reg.new_write_id())
    assert Stamp.parse(str(s)) == s
    assert s.short() == f"3/17/{s.write_id[:8]}"
    for bad in ("", "1/2", "1/2/3/4", "a/2/x", "-1/2/x", "1/2/UPPER", "1/2/", "1/2/" + "a" * 65):
        with pytest.raises(ValueError):
            Stamp.parse(bad)


def test_write_ids_do_not_repeat_and_fit_the_envelope() -> None:
    ids = {reg.new_write_id() for _ in range(2000)}
    assert len(ids) == 2000
    _env, text = envelope({"a": 1}, Stamp(1, 1, ids.pop()))
    assert json.loads(text)["write_id"]


# ------------------------------------------------------------------ envelope


def test_encode_decode_round_trip_for_both_storages() -> None:
    stamp = Stamp(2, 5, reg.new_write_id())
    for storage in ("configmap", "secret"):
        rep = replica("c1", {"app": {"version": "1.10"}, "n": 3}, stamp, storage=storage)
        assert rep.envelope is not None and rep.corrupt is None, rep.corrupt
        assert rep.stamp == stamp and rep.reserved == stamp
        assert rep.envelope.data == {"app": {"version": "1.10"}, "n": 3}
        assert rep.envelope.schema_ == STATE_SCHEMA
        assert rep.envelope.history[-1].write_id == stamp.write_id
    raw = replica("c1", {"x": 1}, stamp, storage="secret").obj["data"][reg.DATA_KEY]
    assert json.loads(base64.b64decode(raw))["token"] == 2  # the token stays a top-level integer


def test_an_envelope_written_for_another_deployment_is_corrupt_for_this_one() -> None:
    stamp = Stamp(2, 5, reg.new_write_id())
    _env, text = reg.build_envelope(
        None, {"image": "x"}, stamp, who="w", host="h", command="c", now=datetime.now(UTC), members=["c1"],
        member_ids={}, namespace="ns", storage="configmap", keys=["image"], deployment="mine",
    )  # fmt: skip
    obj = {"metadata": {}, "data": {reg.DATA_KEY: text}}
    assert reg.decode_replica("c1", served(obj), "configmap", deployment="mine").corrupt is None
    copied = reg.decode_replica("c1", served(obj), "configmap", deployment="theirs")
    assert copied.envelope is None and copied.corrupt is not None and "'mine'" in copied.corrupt
    # an envelope that names no deployment is read (the field is optional)
    unnamed = {"metadata": {}, "data": {reg.DATA_KEY: json.dumps(_written({"a": 1}))}}
    assert reg.decode_replica("c1", served(unnamed), "configmap", deployment="theirs").envelope is not None
    genesis = {"metadata": {}, "data": {reg.DATA_KEY: reg.genesis_text("mine")}}
    assert reg.decode_replica("c1", served(genesis), "configmap", deployment="theirs").corrupt is not None


def _written(data: dict[str, Any], *, token: int = 1, version: int = 2) -> dict[str, Any]:
    """An envelope as a write builds it, but by hand (no deployment field)."""
    return {
        "schema": STATE_SCHEMA,
        "write_id": "w1",
        "version": version,
        "token": token,
        "checksum": reg.checksum(data),
        "written_by": "x",
        "written_at": "2026-01-01T00:00:00Z",
        "members": ["c1"],
        "data": data,
        "history": [{"at": "2026-01-01T00:00:00Z", "who": "x", "host": "h", "command": "c", "version": 1, "token": 1}],
    }


def _decode_doc(doc: dict[str, Any], cluster: str = "c1") -> Replica:
    return reg.decode_replica(cluster, served({"metadata": {}, "data": {reg.DATA_KEY: json.dumps(doc)}}), "configmap")


def test_decode_classifies_what_cannot_be_trusted() -> None:
    good = replica("c1", {"x": 1}, Stamp(1, 1, "ab"))
    assert good.envelope is not None
    assert not reg.decode_replica("c1", None, "configmap").exists
    cases = {
        "no-key": ({"metadata": {}, "data": {}}, reg.DATA_KEY),
        "not-json": ({"data": {reg.DATA_KEY: "{nope"}}, "not JSON"),
        "list": ({"data": {reg.DATA_KEY: "[1]"}}, "not a JSON object"),
        "fields": ({"data": {reg.DATA_KEY: '{"schema": 2, "version": 1}'}}, "invalid envelope"),
        "no-schema": ({"data": {reg.DATA_KEY: '{"version": 1}'}}, "older than any release"),
        "bad-write-id": ({"data": {reg.DATA_KEY: json.dumps(_written({}) | {"write_id": "NO!"})}}, "write_id"),
        "negative-token": ({"data": {reg.DATA_KEY: json.dumps(_written({}, token=-1))}}, "token"),
        "edited": ({"data": {reg.DATA_KEY: json.dumps(_written({"a": 1}) | {"data": {"a": 2}})}}, "checksum mismatch"),
        "promise": (
            {"metadata": {"annotations": {reg.PROMISE_ANNOTATION: "soon"}}, "data": good.obj["data"]},
            "not a stamp",
        ),
        "secret": ({"data": {reg.DATA_KEY: "%%%"}}, "base64"),
    }
    for name, (obj, words) in cases.items():
        rep = reg.decode_replica("c1", served(obj), "secret" if name == "secret" else "configmap")
        assert rep.corrupt and words in rep.corrupt, (name, rep.corrupt)
        assert rep.envelope is None
    newer = _decode_doc(_written({}) | {"schema": STATE_SCHEMA + 1})
    assert newer.newer_schema == STATE_SCHEMA + 1 and newer.envelope is None and newer.corrupt is None


def test_a_promise_without_data_is_neither_corrupt_nor_a_value() -> None:
    rep = replica("c1", promise=Stamp(1, 2, "ab"))
    assert rep.exists and rep.corrupt is None and rep.envelope is None
    assert rep.stamp == NO_STAMP and rep.reserved == Stamp(1, 2, "ab")
    # The object a promise creates still has an envelope with an integer token (0), for
    # whoever reads state objects for tokens; it stands for the empty state.
    for storage in ("configmap", "secret"):
        obj = reg.build_object(Replica("c1", exists=False), name="s", deployment="d", storage=storage, promise=S1)
        raw = obj["data"][reg.DATA_KEY]
        doc = json.loads(base64.b64decode(raw) if storage == "secret" else raw)
        assert doc["token"] == 0 and doc["version"] == 0 and doc["data"] == {}
        rep = reg.decode_replica("c1", served(obj), storage)
        assert rep.exists and rep.envelope is None and rep.corrupt is None and rep.promise == S1
    # so an object without an envelope was edited by hand, promise or not: it is corrupt
    bare = {"metadata": {"annotations": {reg.PROMISE_ANNOTATION: str(S1)}}, "data": {"other": "x"}}
    assert reg.DATA_KEY in (reg.decode_replica("c1", served(bare), "configmap").corrupt or "")


def test_build_object_keeps_foreign_metadata_and_touches_data_only_when_writing() -> None:
    rep = replica("c1", {"x": 1}, Stamp(1, 1, "ab"))
    rep.obj["metadata"]["labels"]["team"] = "a"
    rep.obj["metadata"]["annotations"] = {"note": "keep me"}
    promised = reg.build_object(rep, name="s", deployment="d", storage="configmap", promise=Stamp(1, 2, "cd"))
    assert promised["data"] == rep.obj["data"]
    assert promised["metadata"]["labels"]["team"] == "a"
    assert promised["metadata"]["annotations"] == {
        "note": "keep me",
        reg.PROMISE_ANNOTATION: "1/2/cd",
        reg.NOTE_ANNOTATION: reg.NOTE,
    }
    assert promised["metadata"]["resourceVersion"] == "1"  # the compare-and-swap precondition
    assert rep.obj["metadata"]["annotations"] == {"note": "keep me"}  # the replica read is not changed


def test_size_limit_and_history_trimming() -> None:
    reg.check_size("x" * 1000, "configmap")
    with pytest.raises(UsageError) as err:
        reg.check_size("x" * (reg.ENVELOPE_LIMIT + 1), "configmap")
    assert f"{reg.ENVELOPE_LIMIT:,}" in err.value.message
    with pytest.raises(UsageError):
        reg.check_size("x" * (reg.ENVELOPE_LIMIT - 10), "secret")  # base64 grows it by a third
    env, _ = envelope({"n": 0}, Stamp(1, 1, "aa"))
    for i in range(2, 80):
        env, text = envelope({"n": i}, Stamp(1, i, "aa"), base=env)
    assert len(env.history) == 50 and env.history[-1].version == 79
    big, text = envelope({"blob": "x" * 900_000}, Stamp(1, 80, "aa"), base=env)
    assert len(text.encode()) <= reg.ENVELOPE_LIMIT and big.history[-1].version == 80


# ------------------------------------------------------------------ what a replica takes


S1, S2, S3 = Stamp(1, 1, "aa"), Stamp(1, 2, "aa"), Stamp(1, 3, "aa")


@pytest.mark.parametrize(
    ("held", "promised", "kind", "stamp", "accept", "done"),
    [
        # promises: only newer than anything held or promised
        (None, None, Kind.PROMISE, S1, True, False),
        (S1, None, Kind.PROMISE, S2, True, False),
        (S2, None, Kind.PROMISE, S2, False, False),
        (S2, None, Kind.PROMISE, S1, False, False),
        (S1, S3, Kind.PROMISE, S2, False, False),
        (S1, S2, Kind.PROMISE, S2, True, True),  # our own promise, seen again on a retry
        (S1, S2, Kind.PROMISE, Stamp(1, 2, "ab"), True, False),  # equal (token, version), newer id
        (S1, S2, Kind.PROMISE, Stamp(1, 2, "a0"), False, False),
        # writes: newer than held, not older than promised
        (S1, S2, Kind.WRITE, S2, True, False),
        (S1, S3, Kind.WRITE, S2, False, False),
        (S2, S2, Kind.WRITE, S2, True, True),
        (S3, S3, Kind.WRITE, S2, False, False),
        (None, None, Kind.WRITE, S1, False, False),  # not promised there: the data does not land
        (S1, S2, Kind.WRITE, Stamp(1, 2, "ab"), False, False),  # another write's promise shows
        (S1, Stamp(1, 1, "ab"), Kind.WRITE, Stamp(1, 1, "ab"), True, False),
        (S1, None, Kind.WRITE, Stamp(1, 1, "a0"), False, False),
        # repairs: newer than held; promises do not hold them up
        (S1, S3, Kind.REPAIR, S2, True, False),
        (S2, None, Kind.REPAIR, S2, True, True),
        (S3, None, Kind.REPAIR, S2, False, False),
        # deliberate overwrites take anything
        (S3, Stamp(9, 9, "ff"), Kind.OVERWRITE, S2, True, False),
    ],
)
def test_judge(held: Stamp | None, promised: Stamp | None, kind: Kind, stamp: Stamp, accept: bool, done: bool) -> None:
    rep = replica("c1", {"v": str(held)} if held else None, held, promise=promised)
    verdict = reg.judge(rep, stamp, kind)
    assert (verdict.accept, verdict.done) == (accept, done), verdict
    if not accept:
        assert verdict.reason.startswith("refused")


def test_judge_corrupt_and_newer_schema() -> None:
    corrupt = reg.decode_replica("c1", served({"data": {reg.DATA_KEY: "{nope"}}), "configmap")
    assert not reg.judge(corrupt, S1, Kind.WRITE).accept  # not promised there yet
    assert reg.judge(corrupt, S1, Kind.PROMISE).accept
    annotations = {reg.PROMISE_ANNOTATION: str(S1)}
    promised = reg.decode_replica(
        "c1", served({"metadata": {"annotations": annotations}, "data": {reg.DATA_KEY: "{nope"}}), "configmap"
    )
    assert promised.corrupt and promised.promise == S1
    assert reg.judge(promised, S1, Kind.WRITE).accept  # promised: a writer saved it to a file first
    refused = reg.judge(corrupt, S1, Kind.REPAIR)
    assert not refused.accept and "state sync" in refused.reason
    newer = _decode_doc(_written({}) | {"schema": STATE_SCHEMA + 1})
    for kind in Kind:
        assert not reg.judge(newer, S1, kind).accept


def test_fencing_refusal_names_the_token() -> None:
    rep = replica("c1", {"v": 1}, Stamp(5, 1, "aa"))
    assert "fencing token 5 > 3" in reg.judge(rep, Stamp(3, 9, "aa"), Kind.WRITE).reason


def test_promises_only_rise_except_on_a_deliberate_overwrite() -> None:
    rep = replica("c1", {"v": 1}, S1, promise=S3)
    assert reg.promise_after(rep, S2, Kind.REPAIR) == S3
    assert reg.promise_after(rep, Stamp(2, 1, "aa"), Kind.WRITE) == Stamp(2, 1, "aa")
    assert reg.promise_after(rep, S2, Kind.OVERWRITE) == S2


# ------------------------------------------------------------------ evidence


def test_lease_evidence_needs_a_majority_of_leases_with_a_token() -> None:
    assert reg.lease_evidence([3, 3, 0], 2) == 3
    assert reg.lease_evidence([3, 4, 2], 2) == 4
    assert reg.lease_evidence([3, 0, 0], 2) is None  # leases deleted: no evidence, no suspects
    assert reg.lease_evidence([], 1) is None


def test_a_token_above_the_leases_is_suspect() -> None:
    forged = replica("c1", {"v": "forged"}, Stamp(1000, 2, "aa"))
    assert "1000" in (reg.suspicion(forged, 3) or "") and "3" in (reg.suspicion(forged, 3) or "")
    assert reg.suspicion(forged, None) is None
    assert reg.suspicion(replica("c1", {"v": 1}, Stamp(3, 9, "aa")), 3) is None
    promised = replica("c1", {"v": 1}, S1, promise=Stamp(1000, 1, "aa"))
    assert "promised fencing token 1000" in (reg.suspicion(promised, 3) or "")


# ------------------------------------------------------------------ reads


def test_choose_the_newest_trusted_and_repair_the_rest() -> None:
    reps = {
        "c1": replica("c1", {"v": 4}, Stamp(1, 2, "ff")),
        "c2": replica("c2", {"v": 5}, Stamp(1, 3, "00")),
        "c3": replica("c3", {"v": 3}, Stamp(1, 1, "aa"), promise=Stamp(1, 4, "bb")),
        "c4": replica("c4"),
        "c5": replica("c5", promise=Stamp(1, 2, "ff")),
    }
    choice = reg.choose(reps, 1)
    assert choice.winner is reps["c2"] and choice.top == Stamp(1, 3, "00")
    assert choice.current == ["c2"] and choice.stale == ["c1", "c3", "c4", "c5"]
    assert not (choice.suspect or choice.corrupt or choice.conflict)


def test_choose_never_returns_or_repairs_a_suspect() -> None:
    reps = {
        "c1": replica("c1", {"v": "forged"}, Stamp(1000, 9, "aa")),
        "c2": replica("c2", {"v": 3}, Stamp(3, 4, "aa")),
        "c3": replica("c3", {"v": 2}, Stamp(3, 3, "aa")),
    }
    choice = reg.choose(reps, 3)
    assert choice.winner is reps["c2"]
    assert list(choice.suspect) == ["c1"] and choice.stale == ["c3"]
    # with no lease evidence (leases deleted), nothing is suspect
    assert reg.choose(reps, None).winner is reps["c1"]


def test_choose_refuses_different_data_under_one_stamp() -> None:
    same = Stamp(1, 2, "aa")
    reps = {
        "c1": replica("c1", {"v": 4}, same),
        "c2": replica("c2", {"v": 5}, same),
        "c3": replica("c3", {"v": 3}, S1),
    }
    choice = reg.choose(reps, 1)
    assert choice.winner is None and choice.conflict == ["c1", "c2"]
    # the same data under two stamps is no conflict: the newer stamp wins
    twice = {"c1": replica("c1", {"v": 4}, Stamp(1, 2, "aa")), "c2": replica("c2", {"v": 4}, Stamp(1, 3, "aa"))}
    assert reg.choose(twice, 1).winner is twice["c2"]


def test_choose_leaves_corrupt_ones_out() -> None:
    reps = {
        "c1": reg.decode_replica("c1", served({"data": {reg.DATA_KEY: "{nope"}}), "configmap"),
        "c2": replica("c2", {"v": 1}, S1),
    }
    choice = reg.choose(reps, 1)
    assert choice.winner is reps["c2"] and list(choice.corrupt) == ["c1"] and choice.stale == []


# ------------------------------------------------------------------ writes


def test_a_new_version_is_above_every_version_promised() -> None:
    """The issue's step 3: the write of 4 landed on c1 only, which is now out of sight;
    c2 and c3 hold version 1 and the promise of version 2. The write of 5 takes 3."""
    seen = [
        replica("c2", {"replicas": 3}, S1, promise=Stamp(1, 2, "ff")),
        replica("c3", {"replicas": 3}, S1, promise=Stamp(1, 2, "ff")),
    ]
    stamp = reg.next_stamp(seen, 1, 1, "00")
    assert stamp == Stamp(1, 3, "00") and stamp > Stamp(1, 2, "ff")
    # Without promises the version would be 2 again, and the order left to the ids.
    assert max(r.stamp.version for r in seen) + 1 == 2


def test_next_stamp_and_fencing_ignore_suspects() -> None:
    reps = [replica("c1", {"v": 1}, Stamp(1000, 50, "aa")), replica("c2", {"v": 1}, Stamp(3, 4, "aa"))]
    assert reg.next_stamp(reps, 3, 3, "bb") == Stamp(3, 5, "bb")
    assert reg.newer_token(reps, 3, 3) is None
    assert reg.newer_token(reps, 3, None) == 1000
    assert reg.newer_token([replica("c1", promise=Stamp(4, 1, "aa"))], 3, 4) == 4  # a newer holder promised


@pytest.mark.parametrize(
    ("deliveries", "outcome"),
    [
        ("CCC", "ok"),
        ("CCR", "ok"),
        ("CRR", "unknown"),  # landed on one: it may surface
        ("RRR", "nothing"),
        ("RRU", "unknown"),  # no answer: it may have landed
        ("UUU", "unknown"),
        ("CC", "ok"),
    ],
)
def test_write_outcome(deliveries: str, outcome: str) -> None:
    kinds = {"C": Delivery.CONFIRMED, "R": Delivery.REFUSED, "U": Delivery.UNANSWERED}
    q = 2
    assert reg.write_outcome({f"c{i}": kinds[d] for i, d in enumerate(deliveries)}, q) == outcome


def test_an_envelope_or_promise_another_client_wrote_is_corrupt() -> None:
    stamp = Stamp(2, 5, reg.new_write_id())
    obj = replica("c1", {"n": 3}, stamp, promise=stamp).obj

    def owned_by(manager: str, fields: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "metadata": {**obj["metadata"], "managedFields": [{"manager": manager, "fieldsV1": fields}]}}

    data = {"f:data": {"f:" + reg.DATA_KEY: {}}}
    promise = {"f:metadata": {"f:annotations": {"f:" + reg.PROMISE_ANNOTATION: {}}}}
    assert reg.decode_replica("c1", owned_by("coordinator", data | promise), "configmap").corrupt is None
    for theirs, ours in ((data, promise), (promise, data)):
        obj2 = owned_by("kubectl-edit", theirs)
        obj2["metadata"]["managedFields"].append({"manager": "coordinator", "fieldsV1": ours})
        rep = reg.decode_replica("c1", obj2, "configmap")
        assert "written by another client (kubectl-edit)" in (rep.corrupt or ""), rep.corrupt
    # no recorded writer at all (managedFields stripped), or the server's before-first-apply
    # (a name any client may write under): not coordinator's word either
    bare = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
    stripped = reg.decode_replica("c1", bare, "configmap")
    assert "with no recorded writer" in (stripped.corrupt or ""), stripped.corrupt
    bfa = reg.decode_replica("c1", owned_by("before-first-apply", data | promise), "configmap")
    assert "before-first-apply" in (bfa.corrupt or ""), bfa.corrupt


def _unowned(rep: Replica, manager: str = "ancient-changes") -> dict[str, Any]:
    """``rep``'s object with every field handed to ``manager`` (the API server's cap on
    managedFields entries merges coordinator's into ``ancient-changes``)."""
    fields = {"f:data": {"f:" + reg.DATA_KEY: {}}, "f:metadata": {"f:annotations": {"f:" + reg.PROMISE_ANNOTATION: {}}}}
    return {**rep.obj, "metadata": {**rep.obj["metadata"], "managedFields": [{"manager": manager, "fieldsV1": fields}]}}


def test_a_corrupt_replica_keeps_the_stamps_it_names_as_a_bound() -> None:
    held, promised = Stamp(3, 4, "bb"), Stamp(3, 5, "cc")
    for storage in ("configmap", "secret"):
        rep = reg.decode_replica(
            "c1", _unowned(replica("c1", {"k": "B"}, held, promise=promised, storage=storage)), storage
        )
        assert rep.corrupt and "ancient-changes" in rep.corrupt
        # not its word: no value, no promise; but the newest stamp it names is its bound
        assert rep.envelope is None and rep.promise is None and rep.reserved == NO_STAMP
        assert rep.claimed == promised and rep.bound == promised
    # The envelope names the bound when the promise does not parse, and the reverse.
    obj = _unowned(replica("c1", {"k": "B"}, held, promise=held))
    obj["metadata"]["annotations"][reg.PROMISE_ANNOTATION] = "garbage"
    assert reg.decode_replica("c1", obj, "configmap").claimed == held
    obj["data"][reg.DATA_KEY] = "garbled"
    assert reg.decode_replica("c1", obj, "configmap").claimed == NO_STAMP
    obj["metadata"]["annotations"][reg.PROMISE_ANNOTATION] = str(promised)
    assert reg.decode_replica("c1", obj, "configmap").claimed == promised
    # A replica that is coordinator's word claims nothing beyond what it holds and promised.
    ok = replica("c1", {"k": "B"}, held, promise=promised)
    assert ok.corrupt is None and ok.claimed == NO_STAMP and ok.bound == promised


def test_a_corrupt_replica_takes_no_stamp_below_its_bound() -> None:
    newer = Stamp(3, 2, "bb")  # a newer holder's confirmed write, then capped
    rep = reg.decode_replica("c1", _unowned(replica("c1", {"owner": "B"}, newer, promise=newer)), "configmap")
    fenced = Stamp(2, 9, "aa")
    for kind in (Kind.PROMISE, Kind.WRITE):
        verdict = reg.judge(rep, fenced, kind)
        assert not verdict.accept and "fencing token 3 > 2" in verdict.reason, verdict
        assert not reg.judge(rep, Stamp(3, 1, "zz"), kind).accept  # older version, same token
    assert reg.judge(rep, Stamp(3, 3, "aa"), Kind.PROMISE).accept  # newer: the next write promises there
    assert reg.judge(rep, newer, Kind.PROMISE).accept  # the same attempt, retried
    # Its data lands only once its own promise shows, as coordinator wrote it: this
    # object's promise annotation is another client's, so it is not.
    unpromised = reg.judge(rep, Stamp(3, 3, "aa"), Kind.WRITE)
    assert not unpromised.accept and "does not show this write's promise" in unpromised.reason
    assert not reg.judge(rep, newer, Kind.WRITE).accept
    assert reg.judge(rep, fenced, Kind.OVERWRITE).accept  # `state sync --from`, deliberately
    # A writer is fenced out by the token, and draws its version above the bound.
    assert reg.newer_token([rep], 2, evidence=3) == 3
    assert reg.next_stamp([rep], 3, 3, "ww") == Stamp(3, 3, "ww")
    # A token no lease of a majority has seen is suspect: it neither fences nor raises versions.
    planted = reg.decode_replica("c1", _unowned(replica("c1", {"k": 1}, Stamp(10**9, 10**9, "x"))), "configmap")
    assert reg.suspicion(planted, 3) and "corrupt and carries fencing token" in (reg.suspicion(planted, 3) or "")
    assert reg.newer_token([planted], 3, 3) is None and reg.next_stamp([planted], 3, 3, "w") == Stamp(3, 1, "w")


def test_a_planted_version_too_large_to_follow_raises_no_writers_version() -> None:
    """Another client's promise annotation naming version 10**19 - 1 on one replica
    (found by an outside attack): the next stamp drawn above it would not parse back, so
    every promise written would make its replica unreadable. Such a version raises no
    writer's version; the replica still refuses the write (its bound is above it)."""
    beyond = reg.decode_replica(
        "c1", _unowned(replica("c1", {"a": 1}, S1, promise=Stamp(1, 10**19 - 1, "x"))), "configmap"
    )
    assert beyond.corrupt and beyond.bound == S1  # no stamp at all: at most 2**63 - 1
    with pytest.raises(ValueError, match="at most"):
        Stamp.parse(f"1/{2**63}/x")
    planted = Stamp(1, reg.VERSION_CEILING + 5, "x")
    rep = reg.decode_replica("c1", _unowned(replica("c1", {"a": 1}, S1, promise=planted)), "configmap")
    assert rep.corrupt and rep.bound == planted
    other = replica("c2", {"a": 1}, S1)
    stamp = reg.next_stamp([rep, beyond, other], 1, None, "ww")
    assert stamp == Stamp(1, 2, "ww") and Stamp.parse(str(stamp)) == stamp
    assert not reg.judge(rep, stamp, Kind.PROMISE).accept  # that replica refuses it
    assert reg.judge(other, stamp, Kind.PROMISE).accept  # the others take it


def test_a_sealed_promise_stays_in_what_is_written_below_it() -> None:
    """The promise a member change's copy seals inside an envelope stays there when a
    repair below it is written, gives way to a newer promise's text, and goes with a
    deliberate overwrite (as the annotation's does)."""
    seal = Stamp(3, 3, "cc")
    rep = Replica("c1", exists=True, sealed=seal)
    text = json.dumps({"version": 1})
    kept = reg.text_after(rep, Stamp(1, 1, "aa"), Kind.REPAIR, text)
    assert kept is not None and json.loads(kept)[reg.SEAL_FIELD] == str(seal)
    newer = reg.sealed_text(text, Stamp(4, 4, "dd"))
    assert reg.text_after(rep, Stamp(4, 4, "dd"), Kind.PROMISE, newer) == newer
    assert reg.text_after(rep, Stamp(1, 1, "aa"), Kind.OVERWRITE, text) == text
    assert reg.text_after(rep, Stamp(1, 1, "aa"), Kind.PROMISE, None) is None
