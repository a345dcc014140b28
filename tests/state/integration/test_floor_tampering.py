"""The token floor on the state objects against other clients: floors too long to read,
garbage, a tampered state object after a minority missed the floor, state writes refused
by an admission policy, and a lease planted next to a planted state object.

Found in the second adversary round (docs/regressions.md). Everything runs on the real
sandbox API servers; the other clients are `kubectl` under their own field managers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import UNHURRIED, Env, make_env
from faults.admission import add_policy, remove_policy
from faults.kubectl import kubectl as run_kubectl
from helpers.rbac import connect, grant, mint_user, stdout_ok, user_env
from helpers.web import FLOOR, LEASE, STATE, acquire, doc, holder_on, kubectl, on_each

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
    on_each(lambda i: kubectl(env, i, "delete", "lease", LEASE))


def after_deletion(env: Env, holder: str) -> Any:
    """Acquire once every lease was deleted: the tombstones block one maximum TTL (8 s)."""
    proc = acquire(env, holder, "--ttl", "8s", "--wait", "60s", "--max-server-skew", "0s")
    assert proc.returncode == 0, proc.stderr
    return doc(proc)


# -- 1. the token floor


def test_a_floor_past_18_digits_is_forgotten_and_the_token_goes_down(short: Env) -> None:
    # under coordinator's manager: a floor another client wrote does not speak at all
    on_each(lambda i: kubectl(short, i, "annotate", "--overwrite", "--field-manager=coordinator", "configmap", STATE,
                              f"{FLOOR}=999999999999999999"))  # fmt: skip
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
        # (every member must answer for 0 or 3: nothing is paused, so no 3 s deadline)
        assert short.cli("-o", "json", "lock", "status", "web", env=UNHURRIED).returncode in (0, 3)
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


# -- 3. member changes
