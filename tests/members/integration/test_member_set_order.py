"""A member's lease never stores a newer member set than its own state object, and a
state object that stores a newer set speaks against its member whatever the lease says.

Found by the outside attack on member changes (docs/regressions.md): a `replace-cluster`
with members killed and started between its steps left c1's lease at the new epoch and
its state object at the old one, and c3's lease at the old epoch with its state object at
the joint one. After `kubectl annotate lease ... coordinator.io/membership-` on c1, a
machine whose record predated the change took c1 (its state object spoke for the silent
lease) and c3 (its lease agreed) while the new set's machine took c2 and c4: two holders,
the later one with the lower token. Everything runs on the real 5-cluster sandbox."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import COMMIT_TIMEOUT_S, Env
from helpers.members import DEP, LEASE, STATE, acquire, json_doc, kubectl_on, machine, pay, record, succeeded

from coordinator.errors import CoordinatorError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.rules.membership import A_MEMBERSHIP, Membership, in_lease_object
from coordinator.rules.resources import FIELD_MANAGER, configmaps_path, lease_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _sets(env: Env, index: int) -> tuple[Membership | None, Membership | None]:
    """The member sets coordinator wrote on cluster ``index``: its lease's, its state object's."""

    async def get(path: str) -> dict[str, Any]:
        return await env.raw(index, "GET", path)

    def written(obj: dict[str, Any]) -> Membership | None:
        stored = in_lease_object(obj)
        return stored if isinstance(stored, Membership) and stored.written_by_us else None

    lease = anyio.run(get, lease_path(env.namespace, LEASE))
    state = anyio.run(get, f"{configmaps_path(env.namespace)}/{STATE}")
    return written(lease), written(state)


# Broke before the fix: the joint and commit steps wrote c1's lease although its state
# object refused every write, so c1's lease stored epoch 3 and its state object epoch 1;
# with the lease's note removed, the state object spoke for the old set.


def test_a_lease_never_stores_a_newer_set_than_its_state_object(dep5: Env, tmp_path: Path) -> None:
    """`replace-cluster pay c3 c4` while c1's state object takes no write: the change
    finishes on the other members, and c1's lease keeps the old set with its state
    object. With c1's lease note then removed and c2 stopped, a machine whose record
    predates the change is refused (exit 5): nothing on c1 speaks for the old set."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    from coordinator.ops.reconfig import change_members

    async def main() -> None:
        async with dep5.api(timeout=COMMIT_TIMEOUT_S) as c:
            c1 = c.clusters.client("c1")
            original = c1.request
            state = f"{configmaps_path(dep5.namespace)}/{STATE}"

            async def refusing(method: str, path: str, *args: Any, **kw: Any) -> Any:
                if method != "GET" and (path == state or path == configmaps_path(dep5.namespace)):
                    raise KubeError(kube.FORBIDDEN, "state object writes refused on c1 (test)", status=403)
                return await original(method, path, *args, **kw)

            c1.request = refusing  # type: ignore[method-assign]
            await change_members(c, DEP, ["c1", "c2", "c4"], ttl=20)

    anyio.run(main)
    assert record(dep5).epoch == 3
    for i in (1, 2, 3, 4):
        on_lease, on_state = _sets(dep5, i)
        if on_lease is not None and on_state is not None:
            assert on_lease.epoch <= on_state.epoch, (f"c{i}", on_lease.epoch, on_state.epoch)
    assert _sets(dep5, 1)[1] is not None and _sets(dep5, 1)[1].epoch == 1  # type: ignore[union-attr]
    succeeded(kubectl_on(dep5, 1, "annotate", "lease", LEASE, f"{A_MEMBERSHIP}-"))
    dep5.sandbox.pause(2)
    try:
        refused = acquire(stale, "stale", "--ttl", "30s")
    finally:
        dep5.sandbox.resume(2)
    assert refused.returncode == 5, (refused.returncode, refused.stdout, refused.stderr)


# Broke before the fix: an acquisition judged a member by its lease alone where the lease
# stored a set; a state object storing a newer one was read and not heard.


def test_a_state_object_with_a_newer_set_speaks_against_its_member(dep5: Env, tmp_path: Path) -> None:
    """After `replace-cluster pay c3 c4`, c1's and c3's leases carry the old set again
    as coordinator wrote it (as leases that missed the change's lease steps, while their
    state objects saw them), and c2 is stopped. A machine whose record predates the
    change reads c1 and c3, whose leases agree with it: their state objects store the
    newer set, so it is refused (exit 5), not given the lock beside the new set's
    majority c2, c4."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    old_set = _sets(dep5, 1)[0]
    assert old_set is not None and old_set.epoch == 1
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4", "--ttl", "10s"))
    assert record(dep5).epoch == 3

    async def old_note(index: int) -> None:
        client = dep5.client(index)
        try:
            lease = (await client.request("GET", lease_path(dep5.namespace, LEASE))).body
            lease["metadata"]["annotations"][A_MEMBERSHIP] = old_set.dump()
            await client.request("PUT", lease_path(dep5.namespace, LEASE), body=lease,
                                 query={"fieldManager": FIELD_MANAGER})  # fmt: skip
        finally:
            await client.close()

    for i in (1, 3):
        anyio.run(old_note, i)
        on_lease, on_state = _sets(dep5, i)
        assert on_lease == old_set and on_state is not None and on_state.epoch > 1, (i, on_lease, on_state)
    dep5.sandbox.pause(2)
    try:
        refused = acquire(stale, "stale", "--ttl", "30s")
        assert refused.returncode == 5, (refused.returncode, refused.stdout, refused.stderr)
        # The state commands hear the members the same way (second attack, finding G4:
        # a stale read returned the value from before a confirmed write).
        read = stale.cli("-o", "json", "--timeout", "3s", "state", "get", DEP)
        assert read.returncode == 5, (read.returncode, read.stdout, read.stderr)
        # A state object that cannot be read may be such a one: its member is not heard
        # (finding F3 of the second attack: garbled, the envelope silenced the note).
        for i in (1, 3):
            patch = '{"data":{"envelope.json":"garbled"}}'
            succeeded(kubectl_on(dep5, i, "patch", "configmap", STATE, "--type=merge", "-p", patch))
        unheard = acquire(stale, "stale", "--ttl", "30s")
        assert unheard.returncode == 4, (unheard.returncode, unheard.stdout, unheard.stderr)
    finally:
        dep5.sandbox.resume(2)


# Broke before the fix (outside attack on the member-set order, finding F1): a floor raise
# decided under the old set and landing after the change, where the state object's note
# had been removed (or the object deleted), wrote the old set there as coordinator's.


def test_a_late_write_never_notes_an_old_set_where_the_note_was_removed(dep5: Env, tmp_path: Path) -> None:
    """After `replace-cluster pay c3 c4`, c1's state object loses its note (`kubectl
    annotate ... coordinator.io/membership-`), then is deleted. Writes of a machine
    whose record predates the change, landing now as a delayed one would (the token
    floor of its acquisition, the note before a take), leave it without a note: it stays
    silent, never speaking for the old set."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4", "--ttl", "10s"))
    state = f"{configmaps_path(dep5.namespace)}/{STATE}"
    succeeded(kubectl_on(dep5, 1, "annotate", "configmap", STATE, f"{A_MEMBERSHIP}-"))

    async def late(delete_first: bool) -> None:
        if delete_first:
            await dep5.raw(1, "DELETE", state)
        async with stale.api(timeout=COMMIT_TIMEOUT_S) as c:
            floor = c.lock_engine(DEP)._floor
            assert await floor.set_first("c1") is None
            assert (await floor._raise_floor("c1", 1)).ok

    for delete_first in (False, True):
        anyio.run(late, delete_first)
        annotations = anyio.run(dep5.raw, 1, "GET", state)["metadata"]["annotations"]
        assert A_MEMBERSHIP not in annotations, (delete_first, annotations)


# Broke before the fix (second attack on the member-set order, finding G1): the state
# object `deployment create` seeds carried the epoch-1 set and the seeded mark in its
# create, which has no precondition; held up on the network, it landed after a member
# change and a deletion of the object, and the old set spoke for c1 again.


def test_a_seed_whose_create_lands_alone_says_nothing(dep5: Env) -> None:
    """The create of a member's seeded state object lands, and the call gives up before
    the object is marked (as a create held up on the network lands after its command
    ended): the object carries no member set and no seeded mark, so it speaks for no
    set and answers no read."""
    from coordinator.engine.register import SEEDED_ANNOTATION
    from coordinator.ops.admin import seed_state

    pay(dep5, "c1", "c2", "c3")
    state = f"{configmaps_path(dep5.namespace)}/{STATE}"
    anyio.run(dep5.raw, 1, "DELETE", state)

    async def main() -> None:
        async with dep5.api(timeout=COMMIT_TIMEOUT_S) as c:
            client = c.clusters.client("c1")
            original = client.request

            async def gone_after_create(method: str, path: str, *args: Any, **kw: Any) -> Any:
                if method == "PUT":
                    raise KubeError(kube.UNREACHABLE, "the call gave up (test)")
                return await original(method, path, *args, **kw)

            client.request = gone_after_create  # type: ignore[method-assign]
            rec = c.deployment(DEP)
            await seed_state(c.clusters, rec, "c1", c.lock_engine(DEP).membership.document())

    anyio.run(main)
    annotations = anyio.run(dep5.raw, 1, "GET", state)["metadata"].get("annotations") or {}
    assert A_MEMBERSHIP not in annotations and SEEDED_ANNOTATION not in annotations, annotations


# Broke before the fix (outside attack on the member-set order, third round, G2): the copy
# wrote the old value under its old stamp, so a write of the lock the change took over
# was fenced on the old members only by the change's member-set note and token floor,
# annotations anyone who may annotate the object can remove. Both removed, the paused
# write landed on c1 and c2 (a majority of the old set: confirmed) and the new set, c3,
# c4 and c5, never saw it.


@pytest.mark.parametrize("written", [True, False], ids=["written", "empty"])
def test_a_write_of_a_lock_lost_across_a_change_is_refused_by_the_copys_stamp(dep5: Env, written: bool) -> None:
    """Holder `a` promised its stamp on c1, c2, c3 and paused before its data went out;
    its lock was released, and a change moved `pay` to c3, c4, c5. With the member-set
    note, the token floor and the promise removed from c1's and c2's state objects, its
    data then arrives: every member refuses it (the change wrote the state again under
    its own token, a higher stamp), and the new set reads the value from before. Also
    where no state was written before (`empty`): the change writes the empty state."""
    from coordinator.engine.register import PROMISE_ANNOTATION, Kind, build_envelope, new_write_id, next_stamp
    from coordinator.ops.reconfig import change_members
    from coordinator.rules.resources import A_TOKEN_FLOOR

    if written:
        pay(dep5, "c1", "c2", "c3")
    else:
        members = [a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]
        succeeded(dep5.cli("deployment", "create", DEP, "-n", dep5.namespace, *members))
    token = json_doc(succeeded(acquire(dep5, "a", "--ttl", "30s")))["fencing_token"]
    old = ("c1", "c2", "c3")

    async def main() -> dict[str, Any]:
        async with dep5.api(timeout=COMMIT_TIMEOUT_S) as c:
            replicas = c.state(DEP).replicas  # `a`'s view: the record from before the change
            reps = {k: (await replicas.read_one(k, with_lease=False)).replica for k in old}
            stamp = next_stamp(reps.values(), token, None, new_write_id())
            base = reps["c1"].envelope
            _env, text = build_envelope(
                base, {"release": "9.9.9"}, stamp, who="a", host="h", command="state set",
                now=datetime.now(UTC), members=list(old),
                member_ids={}, namespace=dep5.namespace, storage="configmap", keys=["release"],
                membership=replicas.membership.document(), deployment=DEP,
            )  # fmt: skip
            promised = {k: await replicas.cas(reps[k], stamp, Kind.PROMISE, None, holder=True) for k in old}
            assert all(r.ok for r in promised.values()), promised
            succeeded(dep5.cli("lock", "release", DEP, "--holder", "a"))
            await change_members(c, DEP, ["c3", "c4", "c5"], ttl=20)
            for i in (1, 2):
                stripped = [f"{A_MEMBERSHIP}-", f"{A_TOKEN_FLOOR}-", f"{PROMISE_ANNOTATION}-"]
                succeeded(kubectl_on(dep5, i, "annotate", "configmap", STATE, *stripped))
            return {k: await replicas.cas(promised[k].value, stamp, Kind.WRITE, text, holder=True) for k in old}  # type: ignore[arg-type]

    landed = anyio.run(main)
    assert record(dep5).clusters == ["c3", "c4", "c5"]
    assert not any(r.ok for r in landed.values()), {k: (r.outcome, r.detail) for k, r in landed.items()}
    for k in ("c1", "c2"):
        assert "fencing token" in landed[k].detail, (k, landed[k].detail)
    read = json_doc(succeeded(dep5.cli("-o", "json", "state", "get", DEP)))
    assert read == ({"release": "1.2.0"} if written else {}), read


# Broke before the fix (outside attack on the copy under the change's token, break A):
# the copy's promise was an annotation only. Removed from c2 and c3 between the copy's
# promise and its data, together with the note and the floor, it let the paused write
# land there (confirmed on the old set); the copy then wrote the old value on c1 and c4
# under its higher token, which every later read preferred.


# And (a second attack on it, break 1): with the envelope rewritten by another field
# manager as well, the replica counted as corrupt, its seal unread, and a corrupt replica
# took any write at or above the stamps it names. A write's data now lands only where
# its own promise shows, as coordinator wrote it.


@pytest.mark.parametrize("tamper", ["annotations", "rewritten"])
def test_a_write_landing_between_the_copys_promise_and_its_data_is_refused(
    dep5: Env, monkeypatch: Any, tamper: str
) -> None:
    """Holder `a` promised its stamp on c1, c2, c3 and paused; its lock was released and
    a change to c3, c4, c5 promised its copy's stamp. Between that promise and the copy's
    data, the promise, note and floor annotations are removed from c2's and c3's state
    objects (`rewritten`: and their envelope is written again by another field manager,
    without the copy's promise in it) and `a`'s data arrives: refused everywhere (the
    copy keeps its promise inside the envelope; a replica that shows no promise of the
    write takes no data), and with only annotations removed the change's value is the
    state."""
    from coordinator.engine.register import PROMISE_ANNOTATION, Kind, build_envelope, new_write_id, next_stamp
    from coordinator.engine.state.replicas import Replicas
    from coordinator.ops.reconfig import change_members
    from coordinator.rules.resources import A_TOKEN_FLOOR

    pay(dep5, "c1", "c2", "c3")
    token = json_doc(succeeded(acquire(dep5, "a", "--ttl", "30s")))["fencing_token"]
    old = ("c1", "c2", "c3")
    original = Replicas.cas
    landed: dict[str, Any] = {}

    async def main() -> None:
        async with dep5.api(timeout=COMMIT_TIMEOUT_S) as c:
            replicas = c.state(DEP).replicas  # `a`'s view: the record from before the change
            reps = {k: (await replicas.read_one(k, with_lease=False)).replica for k in old}
            stamp = next_stamp(reps.values(), token, None, new_write_id())
            _env, text = build_envelope(
                reps["c1"].envelope, {"release": "9.9.9"}, stamp, who="a", host="h", command="state set",
                now=datetime.now(UTC), members=list(old), member_ids={}, namespace=dep5.namespace,
                storage="configmap", keys=["release"], membership=replicas.membership.document(), deployment=DEP,
            )  # fmt: skip
            promised = {k: await original(replicas, reps[k], stamp, Kind.PROMISE, None, holder=True) for k in old}
            assert all(r.ok for r in promised.values()), promised
            succeeded(dep5.cli("lock", "release", DEP, "--holder", "a"))
            attacked = anyio.Event()

            async def hooked(self: Replicas, *args: Any, **kw: Any) -> Any:
                if kw.get("unchanged") is not None:  # the copy's data, after its promise
                    if not landed:
                        landed["started"] = True
                        for i in (2, 3):
                            stripped = [f"{A_MEMBERSHIP}-", f"{A_TOKEN_FLOOR}-", f"{PROMISE_ANNOTATION}-"]
                            succeeded(kubectl_on(dep5, i, "annotate", "configmap", STATE, *stripped))
                            if tamper == "rewritten":
                                client = c.clusters.client(f"c{i}")
                                path = f"{configmaps_path(dep5.namespace)}/{STATE}"
                                obj = (await client.request("GET", path)).body
                                envelope = json.loads(obj["data"]["envelope.json"])
                                envelope.pop("promise", None)
                                obj["data"]["envelope.json"] = json.dumps(envelope)
                                await client.request("PUT", path, body=obj, query={"fieldManager": "evil"})
                        for k in old:
                            fresh = (await replicas.read_one(k, with_lease=False)).replica
                            landed[k] = await original(replicas, fresh, stamp, Kind.WRITE, text, holder=True)
                        attacked.set()
                    await attacked.wait()
                return await original(self, *args, **kw)

            monkeypatch.setattr(Replicas, "cas", hooked)
            try:
                await change_members(c, DEP, ["c3", "c4", "c5"], ttl=20)
            except CoordinatorError:
                # The rewritten replicas hold another stamp than when the copy promised:
                # it does not write over them, and cannot reach the old set's majority.
                assert tamper == "rewritten"

    anyio.run(main)
    assert "started" in landed, "the copy wrote no data"
    accepted = [k for k in old if landed[k].ok]
    assert not accepted, {k: (landed[k].outcome, landed[k].detail) for k in old}
    if tamper == "rewritten":
        return
    assert record(dep5).clusters == ["c3", "c4", "c5"]
    read = json_doc(succeeded(dep5.cli("-o", "json", "state", "get", DEP)))
    assert read == {"release": "1.2.0"}, read


# Broke before the fix (the same attack, break B): with no value seen, the copy counted a
# deleted state object as an answer, and wrote the empty state over a confirmed write.


def test_a_copy_that_cannot_hear_a_majority_of_replicas_writes_nothing(dep5: Env) -> None:
    """x=1 is confirmed on c1 and c2 (c3 paused, it keeps the seeded empty state); then
    c2 is paused and c1's state object deleted. `add-cluster pay c4` cannot know the
    newest state (one replica of three answers): exit 4, and x=1 stays the state."""
    members = [a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]
    succeeded(dep5.cli("deployment", "create", DEP, "-n", dep5.namespace, *members))
    dep5.sandbox.pause(3)
    try:
        lock = json_doc(succeeded(acquire(dep5, "w", "--ttl", "30s")))
        succeeded(dep5.cli("--timeout", "3s", "state", "set", DEP, "x=1", "--lock-id", lock["lock_id"]))
        succeeded(dep5.cli("--timeout", "3s", "lock", "release", DEP, "--holder", "w"))
    finally:
        dep5.sandbox.resume(3)
    dep5.sandbox.pause(2)
    try:
        succeeded(kubectl_on(dep5, 1, "delete", "configmap", STATE))
        added = dep5.cli("--timeout", "3s", "deployment", "add-cluster", DEP, "c4", "--ttl", "10s")
    finally:
        dep5.sandbox.resume(2)
    assert added.returncode == 4, (added.returncode, added.stdout, added.stderr)
    read = json_doc(succeeded(dep5.cli("-o", "json", "state", "get", DEP)))
    assert read == {"x": "1"}, read


# Broke before the fix (simulator seed 8110, two machines changing members): a rerun of a
# member change recognised its own steps on the leases only. A joint step that noted its
# set on the state objects of a majority and then failed on the leases left every
# machine's record behind that note: refused by it (exit 5), and told to import a set
# no lease stored.

_JOINT_REFUSED = "joint set refused (test)"


def _refuse_joint_leases(env: Env, indices: tuple[int, ...], epoch: int) -> list[tuple[int, str]]:
    """A ValidatingAdmissionPolicy on each of ``indices`` that refuses every write of the
    deployment's lease storing a member set at ``epoch`` (a change's joint step), and
    lets every other write of it through (takes, renewals and releases of the set before)."""
    from faults.admission import add_policy

    ns = env.namespace
    name = f"refuse-joint-{ns}"
    anns = "object.metadata.annotations"
    expr = (f"request.namespace != '{ns}' || object.metadata.name != '{LEASE}' || !has({anns}) || "
            f"!('{A_MEMBERSHIP}' in {anns}) || !{anns}['{A_MEMBERSHIP}'].contains('\"epoch\":{epoch},')")  # fmt: skip
    made = []
    for i in indices:
        add_policy(env.sandbox.admin(i), name, expr, _JOINT_REFUSED, api_group="coordination.k8s.io",
                   resource="leases", exist_ok=False)  # fmt: skip
        made.append((i, name))
    for i in indices:
        _until_joint_refused(env, i, epoch, refused=True)
    return made


def _until_joint_refused(env: Env, index: int, epoch: int, *, refused: bool) -> None:
    """Wait until cluster ``index`` refuses (or no longer refuses) a lease storing a set at ``epoch``."""
    import json

    from helpers.members import until_admission

    noted = json.dumps({"epoch": epoch, "members": ["x"]}, separators=(",", ":"))
    probe = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": LEASE, "namespace": env.namespace, "annotations": {A_MEMBERSHIP: noted}}}  # fmt: skip
    until_admission(env, index, ("-f", "-"), refused=refused, message=_JOINT_REFUSED, stdin=json.dumps(probe))


def test_a_change_whose_joint_step_noted_its_set_on_state_objects_only_is_finished_by_running_it_again(
    dep5: Env, tmp_path: Path
) -> None:
    """`add-cluster pay c4` while every member refuses lease writes that store the joint
    set (epoch 2): the joint step notes it on the state objects of c1, c2, c3 (a lease is
    written only after its state object stores its set) and then fails on every lease
    (exit 4, the record stays at epoch 1). A second machine, whose record predates the
    note too, is refused (exit 5) and told which command finishes the change. With the
    policy gone, running the change again recognises its joint set on the state objects
    and finishes it; on the second machine the same command brings the record along. The
    confirmed write survives."""
    from faults.admission import remove_policy
    from helpers.members import json_doc

    pay(dep5, "c1", "c2", "c3")
    other = machine(dep5, tmp_path, "other")
    made = _refuse_joint_leases(dep5, (1, 2, 3, 4), epoch=2)
    try:
        stopped = dep5.cli("deployment", "add-cluster", DEP, "c4", "--ttl", "10s")
        assert stopped.returncode == 4, (stopped.returncode, stopped.stdout, stopped.stderr)
    finally:
        for i, name in made:
            remove_policy(dep5.sandbox.admin(i), name)
    for i, _ in made:
        _until_joint_refused(dep5, i, 2, refused=False)
    assert record(dep5).epoch == 1 and record(dep5).joint is None
    for i in (1, 2, 3):
        on_lease, on_state = _sets(dep5, i)
        assert on_lease is not None and on_lease.epoch == 1, (i, on_lease)
        assert on_state is not None and on_state.epoch == 2 and on_state.joint is not None, (i, on_state)
    refused = acquire(other, "b", "--ttl", "10s")
    rerun = dep5.cli("deployment", "add-cluster", DEP, "c4", "--ttl", "10s", "--wait", "30s")
    assert rerun.returncode == 0, (rerun.returncode, rerun.stdout, rerun.stderr)
    assert "on the state objects of c1, c2, c3 only" in rerun.stdout, rerun.stdout
    assert record(dep5).epoch == 3 and record(dep5).clusters == ["c1", "c2", "c3", "c4"], record(dep5)
    assert refused.returncode == 5, (refused.returncode, refused.stdout, refused.stderr)
    told = refused.stderr + refused.stdout
    assert f"`coordinator deployment add-cluster {DEP} c4`" in told and "deployment import" not in told, told
    succeeded(other.cli("deployment", "add-cluster", DEP, "c4", "--ttl", "10s", "--wait", "30s"))
    assert record(other).epoch == 3 and record(other).clusters == ["c1", "c2", "c3", "c4"], record(other)
    for machine_ in (dep5, other):
        read = json_doc(succeeded(machine_.cli("-o", "json", "state", "get", DEP)))
        assert read["release"] == "1.2.0", read
