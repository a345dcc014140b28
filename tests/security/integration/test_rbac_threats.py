"""The threat model's limits, tried on real API servers (docs/threat-model.md).

What a user with exactly the printed rights, someone with write access to the namespace
and a cluster admin of one member can do beyond what the tool refuses. Each test states
the behaviour docs/threat-model.md describes; an open gap is a strict xfail that says what would
close it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from coord_fixtures import put_lease
from helpers.rbac import as_user, connect, grant, mint_user, stdout_json, stdout_ok, user_env

from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.rules.resources import lease_path, secrets_path

pytestmark = pytest.mark.integration

HOLDER_ANNOTATIONS = ("holder", "host", "pid", "reason", "command")
DEPLOY_POLICY = Path(__file__).resolve().parents[3] / "deploy" / "state-secrets-opaque.yaml"


def test_a_lying_member_can_give_two_contenders_a_majority_until_the_first_renews(
    sandbox3: Any, namespace: str, tmp_path: Path
) -> None:
    """The majority argument needs members that answer honestly. Against a holder of all
    three members one lying member gains nothing. But Alice holds a bare majority (c1, c2:
    she has no rights on c3); an admin of c1 makes c1's lease look free; Bob then takes c1
    and c3. Both were told they hold the lock; nothing in either answer showed it. Alice's
    next renewal finds c1 held by another lock and gives up."""
    bob, bob_kc = mint_user(sandbox3, tmp_path, "bob")
    owner = user_env(sandbox3, tmp_path, namespace, "bob")
    grant(sandbox3, owner, namespace, bob)
    connect(owner, bob_kc)
    stdout_ok(owner.cli("deployment", "create", "app", "-n", namespace, "--cluster", "u1", "--cluster", "u2",
                  "--cluster", "u3"))  # fmt: skip

    async def lie() -> None:  # as cluster admin of c1: the lease reads as released
        # Written as coordinator's own release would be, under its field manager (the raw
        # client's user agent names it): a holder field another manager wrote, or one
        # removed, would not be believed.
        lease = await owner.raw(1, "GET", lease_path(namespace, "coordinator-lock-app"))
        lease["spec"] = {k: v for k, v in lease["spec"].items() if k != "renewTime"} | {"holderIdentity": ""}
        annotations = lease["metadata"]["annotations"]
        for key in HOLDER_ANNOTATIONS:
            annotations.pop(f"coordinator.io/{key}", None)
        await put_lease(owner, 1, lease)

    # Held on all three: one liar leaves the other contender one member short.
    stdout_ok(owner.cli("lock", "acquire", "app", "--ttl", "120s", "--holder", "carol"))
    anyio.run(lie)
    refused = owner.cli("lock", "acquire", "app", "--holder", "bob")
    assert refused.returncode == 3, refused.stderr
    stdout_ok(owner.cli("lock", "break", "app", "--yes"))

    alice_user, alice_kc = mint_user(sandbox3, tmp_path, "alice")
    grant(sandbox3, owner, namespace, alice_user, clusters=(1, 2))
    alice = as_user(owner, tmp_path, "alice", alice_kc)

    taken = stdout_json(alice.cli("-o", "json", "lock", "acquire", "app", "--ttl", "120s", "--holder", "alice"))
    assert {c["name"]: c["outcome"] for c in taken["clusters"]} == {"u1": "ok", "u2": "ok", "u3": "forbidden"}

    anyio.run(lie)
    second = owner.cli("-o", "json", "lock", "acquire", "app", "--ttl", "120s", "--holder", "bob")
    assert second.returncode == 0, second.stderr
    assert {c["name"]: c["outcome"] for c in json.loads(second.stdout)["clusters"]}["u1"] == "ok"

    renewed = alice.cli("lock", "renew", "app", "--holder", "alice")
    assert renewed.returncode != 0, renewed.stdout
    assert "lost" in (renewed.stdout + renewed.stderr).lower(), renewed.stdout + renewed.stderr


def test_secret_storage_lets_a_granted_user_turn_the_state_secret_into_a_token_secret(
    sandbox3: Any, namespace: str, tmp_path: Path
) -> None:
    """Kubernetes cannot limit create by name, and a Secret's type is the creator's choice.
    With Secret storage, the printed rights let their holder delete the deployment's state
    Secret and create one of the same name of type kubernetes.io/service-account-token;
    in a cluster that runs kube-controller-manager, its token controller then fills in a
    token of the named service account, which the user may read (the sandbox has no
    controller-manager, so the token stays empty here). The tool does not take such a
    Secret for a replica of the state."""
    user, minted = mint_user(sandbox3, tmp_path, "secret")
    env = user_env(sandbox3, tmp_path, namespace, "secret")
    grant(sandbox3, env, namespace, user, storage="secret")
    connect(env, minted)
    stdout_ok(env.cli("deployment", "create", "app", "-n", namespace, "--storage", "secret", "--cluster", "u1",
                "--cluster", "u2", "--cluster", "u3"))  # fmt: skip
    stdout_ok(env.cli("lock", "acquire", "app", "--ttl", "120s"))
    stdout_ok(env.cli("state", "set", "app", "owner=team"))
    path = f"{secrets_path(namespace)}/coordinator-state-app"

    async def swap() -> dict[str, Any]:
        client = KubeClient(Endpoint("u1", minted.contexts[0], str(minted.path)), timeout=5)
        try:
            await client.request("DELETE", path)
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/service-account-token",
                "metadata": {
                    "name": "coordinator-state-app",
                    "annotations": {"kubernetes.io/service-account.name": "default"},
                },
            }
            await client.request("POST", secrets_path(namespace), body=body)
            return (await client.request("GET", path)).body
        finally:
            await client.close()

    # The state is on every member: any member's admin reads it, Secret storage or not.
    held = sandbox3.admin(2).get(path)
    assert held is not None and "envelope.json" in held["data"]
    swapped = anyio.run(swap)
    assert swapped["type"] == "kubernetes.io/service-account-token"
    diff = stdout_json(env.cli("-o", "json", "state", "diff", "app"))
    assert {r["name"]: r["status"] for r in diff}["u1"] != "current", diff
    assert stdout_json(env.cli("-o", "json", "state", "get", "app")) == {"owner": "team"}

    # deploy/state-secrets-opaque.yaml closes it: the same swap on c2 is refused, while the
    # tool's own (Opaque) state Secret is written as before.
    policy = [doc for doc in yaml.safe_load_all(DEPLOY_POLICY.read_text()) if doc]
    admin = sandbox3.admin(2)
    plurals = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
               "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}  # fmt: skip
    try:
        for doc in policy:
            admin.create(f"/apis/admissionregistration.k8s.io/v1/{plurals[doc['kind']]}", doc, exist_ok=False)
        deadline = time.monotonic() + 30
        while True:  # a new policy takes effect asynchronously
            refused = anyio.run(swap_on, minted, 2, namespace)
            if refused is not None or time.monotonic() > deadline:
                break
            sandbox3.admin(2).delete(path)  # accepted before the policy was in force: undo
            time.sleep(0.5)
        assert refused is not None and "must be of type Opaque" in refused, refused
        # u1 holds the token Secret and u2's replica may have been deleted above: with one
        # replica that answers, writes refuse until the owner copies a good one over the
        # others; then the deleted replica is written again, Opaque.
        stdout_ok(env.cli("state", "sync", "app", "--from", "u3"))
        stdout_ok(env.cli("state", "set", "app", "owner=ops"))
        rewritten = sandbox3.admin(2).get(path)
        assert rewritten is not None and rewritten["type"] == "Opaque", rewritten
    finally:
        for doc in policy:
            admin.delete(f"/apis/admissionregistration.k8s.io/v1/{plurals[doc['kind']]}/{doc['metadata']['name']}")


async def swap_on(minted: Any, cluster: int, namespace: str) -> str | None:
    """As the user, delete the state Secret on ``cluster`` and create a token Secret under
    its name: the API server's refusal of the create, or None if it was accepted."""
    path = f"{secrets_path(namespace)}/coordinator-state-app"
    client = KubeClient(Endpoint(f"u{cluster}", minted.contexts[cluster - 1], str(minted.path)), timeout=5)
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "coordinator-state-app", "annotations": {"kubernetes.io/service-account.name": "x"}},
    }
    try:
        try:
            await client.request("DELETE", path)
        except KubeError as err:
            if err.kind != "not-found":
                raise
        await client.request("POST", secrets_path(namespace), body=token)
    except KubeError as err:
        return err.detail
    finally:
        await client.close()
    return None


def test_a_state_copied_from_another_deployment_is_not_taken_for_this_ones(
    sandbox3: Any, namespace: str, tmp_path: Path
) -> None:
    """A user granted 'mine' copies its state object under the name of 'theirs' before
    'theirs' exists (Kubernetes lets it create objects of any name). Creating 'theirs'
    is refused and names the copy; once it is removed, the create seeds every member's
    state object, so the same plant is refused by the API server and reads see the empty
    state, not the copy."""
    mallory, mallory_kc = mint_user(sandbox3, tmp_path, "mallory")
    env = user_env(sandbox3, tmp_path, namespace, "mallory")
    grant(sandbox3, env, namespace, mallory, deployments=("mine",))
    connect(env, mallory_kc)
    stdout_ok(env.cli("deployment", "create", "mine", "-n", namespace, "--cluster", "u1", "--cluster", "u2",
                "--cluster", "u3"))  # fmt: skip
    stdout_ok(env.cli("lock", "acquire", "mine", "--ttl", "60s"))
    stdout_ok(env.cli("state", "set", "mine", "image=evil:latest"))
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    async def plant() -> list[str]:
        refused = []
        for i, context in enumerate(mallory_kc.contexts, start=1):
            client = KubeClient(Endpoint(f"u{i}", context, str(mallory_kc.path)), timeout=5)
            try:
                mine = (await client.request("GET", f"{path}/coordinator-state-mine")).body
                meta = {"name": "coordinator-state-theirs", "labels": mine["metadata"]["labels"]}
                copy = {"apiVersion": "v1", "kind": "ConfigMap", "data": mine["data"], "metadata": meta}
                await client.request("POST", path, body=copy)
            except KubeError as err:
                refused.append(err.kind)
            finally:
                await client.close()
        return refused

    # Before the deployment 'theirs' exists, Mallory plants hers there.
    assert anyio.run(plant) == []
    owner, owner_kc = mint_user(sandbox3, tmp_path, "owner")
    theirs = user_env(sandbox3, tmp_path, namespace, "owner")
    grant(sandbox3, theirs, namespace, owner, deployments=("theirs",))
    connect(theirs, owner_kc)
    members = ("--cluster", "u1", "--cluster", "u2", "--cluster", "u3")
    create = ("deployment", "create", "theirs", "-n", namespace, *members)
    refused = theirs.cli(*create)
    assert refused.returncode == 6, refused.stderr
    assert "coordinator-state-theirs already exists" in refused.stderr, refused.stderr
    assert "for deployment 'mine'" in refused.stderr, refused.stderr
    assert theirs.cli("state", "get", "theirs").returncode == 2  # nothing was recorded
    for i in (1, 2, 3):
        assert sandbox3.admin(i).get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
                                     "coordinator-lock-theirs") is None  # fmt: skip

    # The owner removes the copies (its Role lets it delete that name) and creates again.
    for i in (1, 2, 3):
        sandbox3.admin(i).delete(f"{path}/coordinator-state-theirs")
    stdout_ok(theirs.cli(*create))
    # Now the name is taken on every member: the same plant is refused by the servers.
    assert anyio.run(plant) == ["already-exists"] * 3
    read = theirs.cli("-o", "json", "state", "get", "theirs")
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {}
