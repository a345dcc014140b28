"""Second adversary round, against the newest changes only: the token floor on the state
objects, the seeding of state objects by `deployment create`, and the lock history's
reader. Each attempt is kept whether it broke something or not: the safe behaviour is
asserted where it held; where it broke, the test asserts the safe behaviour and is a
strict xfail whose reason gives the repro.

Everything runs on the real sandbox API servers; the other clients are `kubectl` under
their own field managers or a user holding exactly what `rbac print` prints.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env, make_env
from faults.admission import add_policy, remove_policy
from faults.kubectl import kubectl as run_kubectl
from helpers.rbac import connect, grant, mint_user, stdout_ok, user_env
from helpers.web import FLOOR, LEASE, STATE, acquire, doc, holder_on, kubectl

from coordinator.kube.client import Endpoint, KubeClient, KubeError

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def short(sandbox3: Any, tmp_path: Path) -> Env:
    """A deployment whose maximum TTL is 8 s, so that deleted leases free up quickly."""
    return make_env(sandbox3, tmp_path, max_ttl_s=8)


def state_obj(env: Env, index: int) -> dict[str, Any] | None:
    try:
        return anyio.run(env.raw, index, "GET", f"/api/v1/namespaces/{env.namespace}/configmaps/{STATE}")
    except KubeError as err:
        assert err.kind == "not-found"
        return None


def floor_on(env: Env, index: int) -> str | None:
    obj = state_obj(env, index)
    return None if obj is None else (obj["metadata"].get("annotations") or {}).get(FLOOR)


def delete_all_leases(env: Env) -> None:
    for i in (1, 2, 3):
        kubectl(env, i, "delete", "lease", LEASE)


def after_deletion(env: Env, holder: str) -> Any:
    """Acquire once every lease was deleted: the tombstones block one maximum TTL (8 s)."""
    proc = acquire(env, holder, "--ttl", "8s", "--wait", "60s", "--max-server-skew", "0s")
    assert proc.returncode == 0, proc.stderr
    return doc(proc)


# -- 1. the token floor


def test_a_floor_past_18_digits_is_forgotten_and_the_token_goes_down(short: Env) -> None:
    for i in (1, 2, 3):
        # under coordinator's manager: a floor another client wrote does not speak at all
        kubectl(short, i, "annotate", "--overwrite", "--field-manager=coordinator", "configmap", STATE,
                f"{FLOOR}=999999999999999999")  # fmt: skip
    delete_all_leases(short)
    carol = after_deletion(short, "carol")
    assert carol["fencing_token"] >= 10**18, carol
    assert short.cli("lock", "release", "web", "--holder", "carol").returncode == 0
    delete_all_leases(short)
    dave = after_deletion(short, "dave")
    assert dave["fencing_token"] > carol["fencing_token"], (carol["fencing_token"], dave["fencing_token"])


def test_a_garbage_floor_is_overwritten_by_the_next_acquisition_not_believed(short: Env) -> None:
    """Another client writes garbage (with an escape) and a 19-digit floor: neither blocks
    the lock nor reaches the next token; the next acquisition writes its own floor over
    them, and its output carries no raw escape."""
    kubectl(short, 1, "annotate", "--overwrite", "--field-manager=mallory", "configmap", STATE,
            f"{FLOOR}=12\x1b]0;pwned\x07")  # fmt: skip
    kubectl(short, 2, "annotate", "--overwrite", "--field-manager=mallory", "configmap", STATE,
            f"{FLOOR}={'9' * 25}")  # fmt: skip
    a = short.cli("lock", "acquire", "web", "--holder", "alice", "--ttl", "8s")
    assert a.returncode == 0, a.stderr
    assert "\x1b" not in a.stdout + a.stderr
    st = short.cli("lock", "status", "web")
    assert "\x1b" not in st.stdout + st.stderr
    floors = [floor_on(short, i) for i in (1, 2, 3)]
    assert sum(1 for f in floors if f is not None and f.isdigit() and len(f) < 19) >= 2, floors


@pytest.mark.parametrize(
    "tamper",
    ["deleted", "lowered", "garbage"],
)
def test_one_tampered_state_object_after_a_minority_missed_the_floor_repeats_a_token(
    short: Env, tamper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    short.sandbox.pause(3)
    try:
        a = acquire(short, "alice", "--ttl", "8s")
        assert a.returncode == 0, a.stderr
    finally:
        short.sandbox.resume(3)
    held = doc(a)["fencing_token"]
    # c3 keeps the floor its object was created with (0)
    assert [floor_on(short, i) for i in (1, 2, 3)] == [str(held), str(held), "0"]
    assert short.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    if tamper == "deleted":
        kubectl(short, 2, "delete", "configmap", STATE)
    else:
        value = "0" if tamper == "lowered" else "not-a-number"
        kubectl(short, 2, "annotate", "--overwrite", "--field-manager=mallory", "configmap", STATE, f"{FLOOR}={value}")
    delete_all_leases(short)

    # c1 answers the state read a little later than the others (any slower network):
    # that only fixes which majority the read meets; unslowed, it is a race.
    original = KubeClient.request

    async def slow_c1(self: KubeClient, method: str, path: str, *args: Any, **kw: Any) -> Any:
        if self.endpoint.name == "c1" and method == "GET" and path.endswith(f"/configmaps/{STATE}"):
            await anyio.sleep(1.5)
        return await original(self, method, path, *args, **kw)

    monkeypatch.setattr(KubeClient, "request", slow_c1)

    async def carol() -> int:
        async with short.api(timeout=3.0) as coord:
            coord.max_server_skew_s = 0.0
            result = await coord.acquire("web", ttl=8, wait=60, holder="carol")
            token = result.fencing_token
            await coord.release("web", result.lock_id)
            assert token is not None
            return token

    assert anyio.run(carol) > held


def test_state_writes_refused_by_an_admission_policy_on_a_minority_or_a_majority(short: Env) -> None:
    """A ValidatingAdmissionPolicy refusing writes of the state object: on one member the
    lock is taken (the floor is on the other two); on two, the acquisition exits 4 and
    gives every lease back, and the next holder's token is above the refused one's."""
    ns = short.namespace
    names: list[tuple[int, str]] = []

    def refuse_on(i: int) -> None:
        name = f"refuse-state-{ns}"
        expression = f"request.namespace != '{ns}' || object.metadata.name != '{STATE}'"
        add_policy(short.sandbox.admin(i), name, expression, "state writes are frozen", exist_ok=False)
        names.append((i, name))
        deadline = time.monotonic() + 30
        while True:  # a new policy takes effect asynchronously: wait until a dry run is refused
            probe = subprocess_kubectl(short, i, "annotate", "--overwrite", "--dry-run=server", "configmap", STATE,
                                       "probe=1")  # fmt: skip
            if probe != 0:
                return
            assert time.monotonic() < deadline, "the policy never took effect"
            time.sleep(0.5)

    try:
        refuse_on(3)
        a = acquire(short, "alice", "--ttl", "8s")
        assert a.returncode == 0, a.stderr
        assert floor_on(short, 3) == "0"  # the floor its object was created with: the write was refused
        assert short.cli("lock", "release", "web", "--holder", "alice").returncode == 0
        refuse_on(2)
        b = acquire(short, "bob", "--ttl", "8s")
        assert b.returncode == 4, b.stderr
        assert "could not record that token" in b.stderr, b.stderr
        assert all(holder_on(short, i) is None for i in (1, 2, 3))
        assert short.cli("-o", "json", "lock", "status", "web").returncode in (0, 3)
    finally:
        for i, name in names:
            remove_policy(short.sandbox.admin(i), name)
    deadline = time.monotonic() + 30
    while True:
        c = acquire(short, "carol", "--ttl", "8s")
        if c.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert c.returncode == 0, c.stderr
    assert doc(c)["fencing_token"] > doc(a)["fencing_token"] + 1  # above bob's refused token too


def subprocess_kubectl(env: Env, index: int, *args: str) -> int:
    return run_kubectl(env.kubeconfig, index, env.namespace, *args).returncode


# -- 2. deployment create and planted state


def test_a_planted_lease_next_to_a_planted_state_does_not_pass_the_state_off_as_the_new_deployments(
    sandbox3: Any, namespace: str, tmp_path: Path
) -> None:
    mallory, mallory_kc = mint_user(sandbox3, tmp_path, "mallory")
    env = user_env(sandbox3, tmp_path, namespace, "mallory")
    grant(sandbox3, env, namespace, mallory, deployments=("mine",))
    connect(env, mallory_kc)
    members = ("--cluster", "u1", "--cluster", "u2", "--cluster", "u3")
    stdout_ok(env.cli("deployment", "create", "mine", "-n", namespace, *members))
    stdout_ok(env.cli("lock", "acquire", "mine", "--ttl", "60s"))
    stdout_ok(env.cli("state", "set", "mine", "image=evil:latest"))
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    async def plant() -> None:
        for i, context in enumerate(mallory_kc.contexts, start=1):
            client = KubeClient(Endpoint(f"u{i}", context, str(mallory_kc.path)), timeout=5)
            try:
                mine = (await client.request("GET", f"{cms}/coordinator-state-mine")).body
                envelope = json.loads(next(iter(mine["data"].values())))
                envelope["deployment"] = "theirs"
                envelope["token"] = 0
                key = next(iter(mine["data"]))
                labels = {k: v for k, v in mine["metadata"].get("labels", {}).items() if "mine" not in v}
                await client.request("POST", leases, body={
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "coordinator-lock-theirs", "labels": labels}, "spec": {}})  # fmt: skip
                await client.request("POST", cms, body={
                    "apiVersion": "v1", "kind": "ConfigMap", "data": {key: json.dumps(envelope)},
                    "metadata": {"name": "coordinator-state-theirs", "labels": labels}})  # fmt: skip
            finally:
                await client.close()

    anyio.run(plant)
    owner, owner_kc = mint_user(sandbox3, tmp_path, "owner")
    theirs = user_env(sandbox3, tmp_path, namespace, "owner")
    grant(sandbox3, theirs, namespace, owner, deployments=("theirs",))
    connect(theirs, owner_kc)
    created = theirs.cli("deployment", "create", "theirs", "-n", namespace, *members)
    if created.returncode == 6:
        return  # refused, naming the plant: safe
    assert created.returncode == 0, created.stderr
    read = theirs.cli("-o", "json", "state", "get", "theirs")
    assert read.returncode != 0 or json.loads(read.stdout) == {}, read.stdout


# -- 4. the lock history's reader


def _put_history(env: Env, index: int, text: str) -> None:
    path = f"/api/v1/namespaces/{env.namespace}/configmaps/coordinator-history-web"
    try:
        current: dict[str, Any] | None = anyio.run(env.raw, index, "GET", path)
    except KubeError as err:
        assert err.kind == "not-found"
        current = None
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"history.json": text},
                            "metadata": {"name": "coordinator-history-web"}}  # fmt: skip
    if current is None:
        anyio.run(env.raw, index, "POST", f"/api/v1/namespaces/{env.namespace}/configmaps", body)
    else:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        anyio.run(env.raw, index, "PUT", path, body)


def _history_problems(env: Env) -> list[str]:
    problems = []
    for args in (("lock", "acquire", "web", "--holder", "bob", "--ttl", "20s"),
                 ("lock", "history", "web"), ("-o", "json", "lock", "history", "web"),
                 ("lock", "release", "web", "--holder", "bob")):  # fmt: skip
        proc = env.cli(*args)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            problems.append(f"{args}: exit {proc.returncode}")
        if "Traceback" in proc.stderr or "recursion depth" in out:
            problems.append(f"{args}: a traceback / recursion error on stderr")
        if "\x1b" in out or "\x07" in out:
            problems.append(f"{args}: a raw escape reached the terminal")
        if args[0] != "-o" and ("\r" in out or "\nforged line" in out):
            problems.append(f"{args}: a carriage return or forged line reached the terminal")
    return problems


def test_history_events_carrying_escapes_and_odd_values_are_printed_escaped(dep3: Env) -> None:
    """Whoever may write the history ConfigMap puts events whose text fields and lock id
    carry terminal escapes, a token of 31 digits, a time in year 9999 and one that is no
    time: acquire, release and `lock history` work and print no raw escape."""
    assert dep3.cli("lock", "acquire", "web", "--holder", "alice", "--ttl", "20s").returncode == 0
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    evil = "\x1b]0;pwned\x07\r\x1b[2Kforged line\n"
    events = [
        {
            "lock_id": "L\x1b[31mred",
            "event": "acquired",
            "at": "2026-12-01T00:00:00.000000Z",
            "token": 7,
            "holder": evil,
            "host": evil,
            "reason": evil,
            "note": evil,
        },
        {"lock_id": "L\x1b[31mred", "event": "released", "at": "2026-12-01T00:00:01.000000Z", "by": evil},
        {"lock_id": "x" * 64, "event": "acquired", "at": "9999-12-31T23:59:59.999999Z", "token": 10**30},
        {"lock_id": "y", "event": "acquired", "at": "not a time"},
    ]
    for i in (1, 2, 3):
        _put_history(dep3, i, json.dumps(events))
    problems = _history_problems(dep3)
    assert not problems, "\n".join(problems)
    shown = dep3.cli("-o", "json", "lock", "history", "web")
    assert "pwned" in shown.stdout  # the hostile events were read (and escaped), not skipped


def test_deeply_nested_history_json_is_ignored_quietly(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--holder", "alice", "--ttl", "20s").returncode == 0
    assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    _put_history(dep3, 1, "[" * 100_000 + "]" * 100_000)
    problems = _history_problems(dep3)
    assert not problems, "\n".join(problems)


# -- 3. member changes


def _other_machine(env: Env, tmp_path: Path, label: str) -> Env:
    """A second machine: a copy of this machine's config, with its own lock records."""
    import shutil

    other = tmp_path / label / "config.yaml"
    other.parent.mkdir(parents=True)
    shutil.copy(env.config, other)
    return Env(sandbox=env.sandbox, config=other, namespace=env.namespace, deployment=env.deployment,
               clusters=list(env.clusters))  # fmt: skip


def test_a_waiter_on_another_machine_does_not_follow_a_change_made_elsewhere(dep3: Env, tmp_path: Path) -> None:
    """Machine B waits for the lock with the record {c1, c2, c3}; machine A, holding the
    lock, removes c3 and releases. B's record did not follow (the change was made on A),
    so B must stop with exit 5 (import), never take the lock under the old set."""
    b = _other_machine(dep3, tmp_path, "machine-b")
    a = acquire(dep3, "alice", "--ttl", "60s")
    assert a.returncode == 0, a.stderr
    lock_id = doc(a)["lock_id"]
    # (a change before the first state write is stuck: see the last test of this file)
    assert dep3.cli("state", "set", "web", "replicas=3", "--lock-id", lock_id).returncode == 0
    import subprocess

    waiter = b.popen("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--wait", "20s",
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        time.sleep(3)
        removed = dep3.cli("deployment", "remove-cluster", "web", "c3", "--lock-id", lock_id)
        assert removed.returncode == 0, removed.stderr
        assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
        out, err = waiter.communicate(timeout=90)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 5, (waiter.returncode, out, err)
    assert "import" in err, err
    # A, with the new set, takes the lock; B with the old one is refused again.
    assert acquire(dep3, "carol").returncode == 0
    assert b.cli("lock", "acquire", "web", "--holder", "dave").returncode == 5


def test_force_dead_cannot_take_a_lock_another_machine_holds(dep3: Env, tmp_path: Path) -> None:
    """Machine B holds the lock on all three members; c3 dies; machine A runs
    `remove-cluster web c3 --force-dead` without the lock. It must not take the lock on
    {c1, c2} (B holds both), so no second holder and no commit of the new set."""
    b = _other_machine(dep3, tmp_path, "machine-b")
    held = b.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--ttl", "60s")
    assert held.returncode == 0, held.stderr
    dep3.sandbox.pause(3)
    try:
        forced = dep3.cli("--timeout", "2s", "deployment", "remove-cluster", "web", "c3", "--force-dead")
        assert forced.returncode == 3, (forced.returncode, forced.stderr)
        st = b.cli("--timeout", "2s", "-o", "json", "lock", "status", "web")
        assert json.loads(st.stdout)["lock_id"] == doc(held)["lock_id"], st.stdout
        assert all(holder_on(dep3, i) == doc(held)["lock_id"] for i in (1, 2))
    finally:
        dep3.sandbox.resume(3)
    assert b.cli("lock", "release", "web", "--holder", "bob").returncode == 0


def test_a_member_change_works_before_the_first_state_write(dep3: Env) -> None:
    """`deployment create` now seeds empty state objects; a member change made before
    anyone wrote the state must still go through (and leave no joint set behind)."""
    removed = dep3.cli("deployment", "remove-cluster", "web", "c3")
    shown = dep3.cli("-o", "json", "deployment", "show", "web")
    locked = acquire(dep3, "alice")
    assert removed.returncode == 0, removed.stderr
    assert "nothing to copy" in removed.stdout, removed.stdout
    assert json.loads(shown.stdout)["change_in_progress"] is None, shown.stdout
    assert json.loads(shown.stdout)["clusters"] == ["c1", "c2"], shown.stdout
    assert locked.returncode == 0, locked.stderr
