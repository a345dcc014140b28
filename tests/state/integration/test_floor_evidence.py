"""The state objects as evidence: a state object speaks for the member set only through its
coordinator-written ``coordinator.io/membership`` annotation, and an object without a
``coordinator.io/token-floor`` annotation counts like a missing one (docs/design.md, "Why fencing
tokens", "The member set lives in the clusters").

Found in the seventh adversary round (docs/regressions.md). Everything runs on the real
3-cluster sandbox; the other clients are `kubectl` under their own field manager
(``mallory``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env, make_env
from helpers.web import FLOOR, LEASE, STATE, acquire, doc, kubectl, on_each

from coordinator.errors import CoordinatorError
from coordinator.kube.client import KubeClient, KubeError
from coordinator.rules.membership import A_MEMBERSHIP

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def short(sandbox3: Any, tmp_path: Path) -> Env:
    """A deployment whose maximum TTL is 8 s, so that deleted leases free up quickly."""
    return make_env(sandbox3, tmp_path, max_ttl_s=8)


def _secret_env(sandbox: Any, tmp_path: Path) -> Env:
    """Like ``short``, with the state in Secrets (``--storage secret``)."""
    return make_env(sandbox, tmp_path, max_ttl_s=8, storage="secret")


def state_obj(env: Env, index: int, kind: str = "configmaps") -> dict[str, Any] | None:
    try:
        return anyio.run(env.raw, index, "GET", f"/api/v1/namespaces/{env.namespace}/{kind}/{STATE}")
    except KubeError as err:
        assert err.kind == "not-found"
        return None


def floor_on(env: Env, index: int, kind: str = "configmaps") -> str | None:
    obj = state_obj(env, index, kind)
    return None if obj is None else (obj["metadata"].get("annotations") or {}).get(FLOOR)


def floor_owners(env: Env, index: int, kind: str = "configmaps") -> list[str]:
    obj = state_obj(env, index, kind) or {}
    key = f"f:{FLOOR}"
    return sorted(
        str(e.get("manager"))
        for e in (obj.get("metadata") or {}).get("managedFields") or []
        if key in ((e.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations", {})
    )


def mallory(env: Env, index: int, kind: str, *edits: str) -> None:
    kubectl(env, index, "annotate", "--overwrite", "--field-manager=mallory", kind, STATE, *edits)


def operator(env: Env, index: int, kind: str, *edits: str) -> None:
    """What docs/design.md tells an operator to do to put a floor back: annotate under the
    coordinator field manager (a floor another client wrote does not speak)."""
    kubectl(env, index, "annotate", "--overwrite", "--field-manager=coordinator", kind, STATE, *edits)


def delete_all_leases(env: Env) -> None:
    on_each(lambda i: kubectl(env, i, "delete", "lease", LEASE))


def take(env: Env, holder: str, *args: str) -> Any:
    proc = acquire(env, holder, "--ttl", "8s", *args)
    assert proc.returncode == 0, proc.stderr
    return doc(proc)


def after_deletion(env: Env, holder: str) -> Any:
    """Acquire once every lease was deleted: the tombstones block one maximum TTL (8 s)."""
    return take(env, holder, "--wait", "60s", "--max-server-skew", "0s")


def release(env: Env, holder: str) -> None:
    done = env.cli("lock", "release", "web", "--holder", holder)
    assert done.returncode == 0, done.stderr


def acquire_with_c1_slow(env: Env, holder: str, monkeypatch: pytest.MonkeyPatch, kind: str = "configmaps") -> int | str:
    """An acquisition (in process) whose state read hears c1 last (any slower network):
    that only fixes which majority the read meets."""
    original = KubeClient.request

    async def slow_c1(self: KubeClient, method: str, path: str, *args: Any, **kw: Any) -> Any:
        if self.endpoint.name == "c1" and method == "GET" and path.endswith(f"/{kind}/{STATE}"):
            await anyio.sleep(1.5)
        return await original(self, method, path, *args, **kw)

    monkeypatch.setattr(KubeClient, "request", slow_c1)

    async def run() -> int | str:
        async with env.api(timeout=3.0) as coord:
            coord.max_server_skew_s = 0.0
            try:
                result = await coord.acquire("web", ttl=8, wait=60, holder=holder)
            except CoordinatorError as err:  # refused: nothing taken
                return f"refused: {type(err).__name__}: {err}"
            token = result.fencing_token
            await coord.release("web", result.lock_id)
            assert token is not None
            return token

    try:
        return anyio.run(run)
    finally:
        monkeypatch.setattr(KubeClient, "request", original)


# -- 1. the floor rewritten to a lower number by another client on every state object


def test_floors_lowered_by_another_field_manager_on_every_object_do_not_repeat_a_token(short: Env) -> None:
    """Alice takes the lock (token T) and never writes the state: her token is on the
    leases and on the three floors the acquisition raised. Round 6 removed the floors
    (`kubectl annotate ... coordinator.io/token-floor-`) and deleted the leases; that is
    now refused. Here mallory *rewrites* them instead, to "0", on every object (the same
    edit, one character longer), and deletes every lease. Not the documented open case
    (one object shared by two majorities, after a minority missed the floor): every
    object is edited, by a field manager that is not coordinator's. The commit says "only
    their coordinator-written annotations speak for the member set and the token floor";
    the next token must be above T (or nothing is taken).

    BROKE: carol is granted token 1, Alice's token: floors before the edit ['1','1','1'],
    after ['0','0','0'] owned by ['mallory'] on each object; `lock acquire` exits 0 with
    "fencing_token": 1. Flaw: lock/floor.py:has_floor and token_floor read the annotation
    whoever wrote it (only its spelling is checked), unlike set_on_state, which requires a
    coordinator field manager in managedFields; TokenFloor._state_evidence then counts the
    three objects as floor-bearing, at max(envelope token 0, floor 0). Suggested fix: count
    a floor (has_floor / token_floor) only where a coordinator field manager owns
    `f:coordinator.io/token-floor` (membership.annotation_writers, as for the member set);
    an object whose floor another client last wrote counts like one without a floor
    (NO_FLOOR). That also closes the documented round-2 xfail (the one lowered object no
    longer counts, so the read waits for the other member of the floor's majority)."""
    alice = take(short, "alice")
    release(short, "alice")
    before = [floor_on(short, i) for i in (1, 2, 3)]
    on_each(lambda i: mallory(short, i, "configmap", f"{FLOOR}=0"))
    after = [(floor_on(short, i), floor_owners(short, i)) for i in (1, 2, 3)]
    delete_all_leases(short)
    # The wait outlasts the tombstones (one maximum TTL and the 2 s stamp slack, 10.1 s;
    # seen granted within 15 s on a loaded machine), so that a repeated token would be
    # handed out within it; a refusal is the full wait.
    carol = acquire(short, "carol", "--ttl", "8s", "--wait", "20s", "--max-server-skew", "0s")
    if carol.returncode == 0:
        assert doc(carol)["fencing_token"] > alice["fencing_token"], (alice["fencing_token"], doc(carol), before, after)
    else:
        assert carol.returncode in (4, 5), carol.stderr
        assert not doc(carol)["acquired"]


# -- 2. a read repair recreates a state object deleted on one member


def test_a_read_repair_that_recreates_a_deleted_state_object_does_not_lower_its_floor(
    short: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No annotation is edited. Alice writes the state under token 1 (floors 1). c3 is
    down while Bob takes the lock (token 2: floors 2 on c1 and c2; c3 keeps 1); Bob never
    writes the state. Someone deletes the state ConfigMap on c2 (one member: docs/design.md, "a
    deleted state object says nothing"). A plain `state get web` by anyone then repairs
    the stale replica, recreating c2's object (register.build_object: a recreated object's
    floor is "the write's token"). Every lease is deleted (handled, docs/design.md). The next
    acquisition's state read meets {c2,c3} (c1 answers last): it must not draw token 2.

    HELD, by luck of another rule: the repair recreates c2's object with floor 1 (the
    token of the *value* it was repaired with, not of the lock): floors after the repair
    ['2', '1', '1'], so the majority {c2,c3} no longer holds any floor >= Bob's token, and
    the acquisition's state read does choose fencing token 2 (AcquireResult fencing_token=2,
    acquired False). It is refused only because register.build_object does not note the
    member set on the object it creates: "Only 1 of 3 members of deployment 'web' confirm
    this machine's member set (epoch 1); 2 are needed: c1, c2 store no member set (lease or
    state deleted)" (MembershipError at once, although c1 was only slow and the call had a
    60 s wait). Unslowed, the next acquisition takes token 3. Latent flaw:
    register.build_object sets A_TOKEN_FLOOR = str(promise.token) on every object it
    creates, and a REPAIR (state/reads.py Reads.read; state/sync.py) promises the winner's
    stamp, whose token is that of the last state write, which can be below a token granted
    since by a holder that never wrote (what the floor exists for). The object then counts
    as floor-bearing (has_floor) with a floor below the lock's; only the missing membership
    annotation keeps it from also confirming the set. (Also contradicts envelope_evidence's
    docstring, "so does the object's creation": a register-created object notes no set.)
    Suggested fix: an object created by a repair or copy gets no floor of its own choosing:
    create it without A_TOKEN_FLOOR and mark it so TokenFloor counts it like ABSENT (not
    NO_FLOOR), or give it the highest floor read on a majority of the other replicas; and
    note the member set only where the floor is right."""
    alice = take(short, "alice")
    done = short.cli("--timeout", "3s", "state", "set", "web", "release=1.0", "--lock-id", alice["lock_id"])
    assert done.returncode == 0, done.stderr
    release(short, "alice")
    short.sandbox.pause(3)
    try:
        bob = take(short, "bob")
        release(short, "bob")
    finally:
        short.sandbox.resume(3)
    assert bob["fencing_token"] > alice["fencing_token"]
    floors = [floor_on(short, i) for i in (1, 2, 3)]
    assert floors == [str(bob["fencing_token"]), str(bob["fencing_token"]), str(alice["fencing_token"])], floors
    kubectl(short, 2, "delete", "configmap", STATE)
    got = short.cli("--timeout", "3s", "state", "get", "web", "release")
    assert got.returncode == 0, got.stderr
    repaired = [floor_on(short, i) for i in (1, 2, 3)]
    noted = A_MEMBERSHIP in ((state_obj(short, 2) or {}).get("metadata", {}).get("annotations") or {})
    print("floors after the repair:", repaired, "c2 notes the member set:", noted)
    delete_all_leases(short)
    carol = acquire_with_c1_slow(short, "carol", monkeypatch)
    assert isinstance(carol, str) or carol > bob["fencing_token"], (
        alice["fencing_token"],
        bob["fencing_token"],
        carol,
        repaired,
    )
    # Availability: unslowed, the lock is taken again (within a wait), above Bob's token.
    dave = after_deletion(short, "dave")
    assert dave["fencing_token"] > bob["fencing_token"], (bob, dave, carol, repaired)
    print("carol:", carol, "dave:", dave["fencing_token"])


# -- 3. floor spellings that are no number, on every object; then a floor put back


@pytest.mark.parametrize(
    ("writer", "spelling"),
    [("mallory", "+5"), ("coordinator", "\u0665"), ("coordinator", "9" * 4301)],
    ids=["sign-by-other-manager", "arabic-indic-digit-by-coordinator", "4301-digits-by-coordinator"],
)
def test_a_floor_spelled_as_no_plain_number_on_every_object_blocks_until_one_is_put_back(
    short: Env, writer: str, spelling: str
) -> None:
    """Alice takes the lock (token T), never writes. Every floor is replaced with a
    spelling that is no plain ASCII number of at most 4300 digits (a sign, an
    Arabic-Indic five, 4301 nines), by another field manager or under coordinator's own,
    and every lease is deleted. docs/design.md: such an object counts like one without a floor:
    nothing is taken (exit 4 or 5), never T again; an operator puts a floor back (T) and
    the next token is above T. The other spellings (a leading space, empty, an exponent)
    are the same parse, covered in tests/state/unit/test_floor_rules.py; under another manager
    every spelling is the same case, since no floor another client wrote speaks."""
    edit = mallory if writer == "mallory" else operator
    alice = take(short, "alice")
    release(short, "alice")
    on_each(lambda i: edit(short, i, "configmap", f"{FLOOR}={spelling}"))
    delete_all_leases(short)
    bob = acquire(short, "bob", "--ttl", "8s", "--wait", "12s", "--max-server-skew", "0s")
    assert bob.returncode in (4, 5), (bob.returncode, bob.stdout, bob.stderr)
    assert not doc(bob)["acquired"] and doc(bob)["fencing_token"] is None, bob.stdout
    on_each(lambda i: operator(short, i, "configmap", f"{FLOOR}={alice['fencing_token']}"))
    carol = after_deletion(short, "carol")
    assert carol["fencing_token"] > alice["fencing_token"], (alice, carol)


def test_a_leading_zero_floor_on_every_object_counts_as_its_number(short: Env) -> None:
    """ "05"-style floors (the same number, a leading zero) written higher than the real
    token by another client: safe either way, the next token must be above both."""
    alice = take(short, "alice")
    release(short, "alice")
    high = alice["fencing_token"] + 5
    on_each(lambda i: mallory(short, i, "configmap", f"{FLOOR}=0{high}"))
    delete_all_leases(short)
    # A floor another client wrote does not speak, even a higher one: nothing is taken
    # until a floor of coordinator's is put back; then the token is above it.
    bob = acquire(short, "bob", "--ttl", "8s", "--wait", "12s", "--max-server-skew", "0s")
    assert bob.returncode in (4, 5) and doc(bob)["fencing_token"] is None, (bob.returncode, bob.stdout)
    # (a new value: rewriting the same text would leave mallory its owner)
    on_each(lambda i: operator(short, i, "configmap", f"{FLOOR}={high}"))
    carol = after_deletion(short, "carol")
    assert carol["fencing_token"] > high, (alice, carol)


# -- 4. a fresh deployment whose leases are all deleted before any acquisition


def test_a_fresh_deployment_whose_leases_were_deleted_before_any_lock_can_still_be_locked(short: Env) -> None:
    """Availability: `deployment create` seeds every state object with floor 0 and the
    member set; with every lease deleted before the first acquisition, the lock can still
    be taken (after one maximum TTL), with a token of at least 1; and again after that,
    above it."""
    assert [floor_on(short, i) for i in (1, 2, 3)] == ["0", "0", "0"]
    delete_all_leases(short)
    first = after_deletion(short, "alice")
    assert first["fencing_token"] >= 1
    release(short, "alice")
    delete_all_leases(short)
    second = after_deletion(short, "bob")
    assert second["fencing_token"] > first["fencing_token"], (first, second)


# -- 5. the member-set annotation rewritten by another client to the same set


def test_the_state_objects_set_rewritten_to_the_same_set_by_another_client_is_silent_and_repaired(
    short: Env,
) -> None:
    """Mallory rewrites the member-set annotation of every state object to exactly the
    value it holds (the set coordinator wrote), so another field manager owns it. docs/design.md:
    only a set coordinator wrote speaks; with the leases intact that changes nothing (the
    lock is taken), and the acquisition's floor write notes the set again under
    coordinator's manager, so that once every lease is deleted the lock is taken again,
    above the earlier token."""
    values = []
    for i in (1, 2, 3):
        obj = state_obj(short, i)
        assert obj is not None
        values.append(obj["metadata"]["annotations"][A_MEMBERSHIP])
        mallory(short, i, "configmap", f"{A_MEMBERSHIP}={values[-1]}")
    alice = take(short, "alice")
    release(short, "alice")
    delete_all_leases(short)
    bob = after_deletion(short, "bob")
    assert bob["fencing_token"] > alice["fencing_token"], (alice, bob)


# -- 6. Secret storage: the same two rules


def test_with_secret_storage_floors_removed_or_lowered_do_not_repeat_a_token(sandbox3: Any, tmp_path: Path) -> None:
    """The state in Secrets (`--storage secret`). `deployment create` gives each Secret a
    floor of 0; Alice takes the lock (token T); mallory removes the floor on c1 and sets
    it to garbage on c2 and c3; every lease is deleted. Nothing may be taken (exit 4/5);
    with a floor put back, the next token is above T."""
    env = _secret_env(sandbox3, tmp_path)
    assert [floor_on(env, i, "secrets") for i in (1, 2, 3)] == ["0", "0", "0"]
    alice = take(env, "alice")
    release(env, "alice")
    on_each(lambda i: mallory(env, i, "secret", f"{FLOOR}-" if i == 1 else f"{FLOOR}=x"))
    delete_all_leases(env)
    bob = acquire(env, "bob", "--ttl", "8s", "--wait", "12s", "--max-server-skew", "0s")
    assert bob.returncode in (4, 5), (bob.returncode, bob.stdout, bob.stderr)
    on_each(lambda i: operator(env, i, "secret", f"{FLOOR}={alice['fencing_token']}"))
    carol = after_deletion(env, "carol")
    assert carol["fencing_token"] > alice["fencing_token"], (alice, carol)


# -- 7. the namespace deleted and recreated on one member


def test_a_namespace_recreated_on_one_member_neither_repeats_a_token_nor_blocks_the_lock(
    short: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice takes the lock (token T, floors T on all three) and never writes the state.
    c3's namespace is wiped (one member: its lease and state object gone together); then
    the leases of c1 and c2 are deleted too. HELD. Bob's state read hears c1 last: c3's
    missing object says nothing, so the read must wait for c1 and Bob's token be above T;
    his acquisition recreates c3's state object with a floor and no member-set note (a
    floor write may land late, after a member change: docs/design.md). Every lease
    deleted again: Carol above Bob, the notes of c1 and c2 confirming the set."""
    alice = take(short, "alice")
    release(short, "alice")
    # (the sandbox runs no namespace controller, so a deleted namespace never finishes
    # terminating: what its recreation leaves, both objects gone, is made by hand)
    kubectl(short, 3, "delete", "lease", LEASE)
    kubectl(short, 3, "delete", "configmap", STATE)
    for i in (1, 2):
        kubectl(short, i, "delete", "lease", LEASE)
    bob = acquire_with_c1_slow(short, "bob", monkeypatch)
    assert isinstance(bob, int) and bob > alice["fencing_token"], (alice, bob)
    recreated = state_obj(short, 3)
    assert recreated is not None and floor_on(short, 3) is not None, recreated
    assert A_MEMBERSHIP not in recreated["metadata"]["annotations"], recreated["metadata"]
    delete_all_leases(short)
    carol = acquire_with_c1_slow(short, "carol", monkeypatch)
    assert isinstance(carol, int) and carol > bob, (alice, bob, carol)


# -- 8. a floor at the longest length read: the next token is one digit longer


def test_the_longest_floor_read_does_not_leave_the_lock_unrecoverable(short: Env) -> None:
    """Mallory sets every floor to 4000 nines (the longest floor token_floor reads) and
    deletes every lease: Bob's token is 10**4000 (safe: above everything). Coordinator
    raises the floors to it: 4001 digits. Bob releases; every lease is deleted again. The
    floors coordinator itself wrote must still count (docs/design.md: an object without a floor
    blocks until an operator puts one back, "at least the highest token `lock history`
    shows"); at worst, putting back Bob's token as the floor lets Carol in above it.

    BROKE (availability, not safety): Bob gets 10**4000; the floors coordinator raised
    are 4001 digits ([4001, 4001, 4001]), which has_floor/token_floor do not read (len <=
    4000), so every object counts as stripped: Carol exits 5 ("... 2 are needed: c1, c2, c3
    store no member set ..."; the objects are not counted at all), and after the operator
    puts back Bob's token as the floor, as docs/design.md says, she still exits 5: nothing the
    operator may write as a floor above Bob's token is read, and any floor that is read is
    below it (putting back 4000 nines would make the next token Bob's). Flaw:
    lock/floor.py token_floor/has_floor cap at 4000 digits while _raise_floor writes
    str(token) of any length and lease.py reads lease tokens with int() (up to Python's
    4300 digits). Suggested fix: one length limit for every token, enforced where a token
    is chosen (lease.next_token refusing a token whose text the floor reader would not
    read, or a floor above, say, 10**18 refused as tampering), so coordinator never writes
    a floor it cannot read back."""
    # (under coordinator's manager: another client's floor does not speak)
    on_each(lambda i: operator(short, i, "configmap", f"{FLOOR}={'9' * 4000}"))
    delete_all_leases(short)
    bob = after_deletion(short, "bob")
    assert bob["fencing_token"] == 10**4000
    release(short, "bob")
    lengths = [len(floor_on(short, i) or "") for i in (1, 2, 3)]
    delete_all_leases(short)
    carol = acquire(short, "carol", "--ttl", "8s", "--wait", "12s", "--max-server-skew", "0s")
    first = (carol.returncode, carol.stderr.strip()[-300:])
    if carol.returncode != 0:
        on_each(lambda i: operator(short, i, "configmap", f"{FLOOR}={bob['fencing_token']}"))
        carol = acquire(short, "carol", "--ttl", "8s", "--wait", "20s", "--max-server-skew", "0s")
    assert carol.returncode == 0, (lengths, first, carol.returncode, carol.stderr.strip()[-400:])
    assert doc(carol)["fencing_token"] > bob["fencing_token"]


# Broke before the fix (outside attack on the member-set order, finding F4): a state write
# paused after its promises, resumed after its lock was lost and a member change noted a
# newer set, landed where someone had removed that note: confirmed on a majority, then
# lost. The token floor, which no holder of that write's lock can be above, now fences it.


def test_a_promise_or_write_below_a_state_objects_floor_is_refused(dep3: Env) -> None:
    """Two locks were granted (tokens 1 and 2), so the floors say 2: a lock holder's
    promise or write with token 1 is refused by the object itself, whatever the lease
    says. (A read repair or a sync writes a value back with the stamp it was written
    under, and is not fenced so: tests/security/integration/test_granted_user_limits.py
    syncs a garbled replica after a later acquisition.)"""
    from coordinator.engine.register import Kind, Stamp

    for holder in ("first", "second"):
        assert doc(acquire(dep3, holder, "--ttl", "30s"))["fencing_token"] >= 1
        assert dep3.cli("lock", "release", "web", "--holder", holder).returncode == 0

    async def main() -> None:
        async with dep3.api(timeout=10) as c:
            replicas = c.state("web").replicas
            judged = 0
            for cluster in ("c1", "c2", "c3"):
                rep = (await replicas.read_one(cluster, with_lease=False)).replica
                floor = int(rep.obj["metadata"]["annotations"][FLOOR])
                if floor < 2:
                    continue  # the floor is raised on a majority; this one was not reached
                stale = Stamp(token=1, version=99, write_id="late")
                for kind in (Kind.PROMISE, Kind.WRITE):
                    refused = await replicas.cas(rep, stale, kind, None if kind is Kind.PROMISE else "{}", holder=True)
                    assert not refused.ok and "granted since" in refused.detail, (cluster, kind, refused.detail)
                assert replicas.floor_fenced(rep, Stamp(token=floor, version=99, write_id="x")) is None
                judged += 1
            assert judged >= 2  # a majority carries the floor of the second lock

    anyio.run(main)
