"""The state copy a member change makes before it commits: confirmed writes survive, planted state is not copied."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from faults.kubectl import kubectl
from helpers.members import (
    DEP,
    LEASE,
    STATE,
    acquire,
    drop_policies,
    json_doc,
    kubectl_on,
    lease_on,
    machine,
    pay,
    refuse_state_data,
    replica,
    succeeded,
    write_partially,
)

from coordinator.engine.register import checksum
from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.rules.resources import configmaps_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_replace_whose_state_copy_failed_does_not_lose_a_confirmed_write(dep5: Env) -> None:
    """Replacing c3 by c4 in {c1,c2,c3}: the newest confirmed write is on {c1,c3} only (c2
    was down). If the copy cannot bring it to a majority of the new set {c1,c2,c4}, the
    change must not commit; a read with one member of the new set down must never return
    the older value."""
    pay(dep5, "c1", "c2", "c3")
    write_partially(dep5, "1.3.0", paused=2)
    made = refuse_state_data(dep5, (2, 4))
    try:
        changed = dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4")
    finally:
        drop_policies(dep5, made)
    if changed.returncode != 0:
        return  # refused to commit without the copy: safe
    dep5.sandbox.pause(1)
    try:
        got = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
        # the next holder writes on what it read (c1 still down) ...
        lock = json_doc(succeeded(acquire(dep5, "next", "--ttl", "30s")))
        succeeded(dep5.cli("--timeout", "2s", "state", "set", DEP, "note=after", "--lock-id", lock["lock_id"]))
        succeeded(dep5.cli("--timeout", "2s", "lock", "release", DEP, "--holder", "next"))
    finally:
        dep5.sandbox.resume(1)
    # ... and once c1 is back, the confirmed 1.3.0 must still be the value
    later = dep5.cli("state", "get", DEP, "release")
    assert (got.returncode != 0 or got.stdout.strip() == "1.3.0") and later.stdout.strip() == "1.3.0", (
        changed.stdout,
        got.stdout,
        later.stdout,
    )


def test_a_replace_with_the_new_member_down_keeps_the_state_readable_with_another_member_down(dep5: Env) -> None:
    """c4 is paused for the whole `replace-cluster pay c3 c4` (it gets neither lease nor
    state). Held: the change commits on {c1,c2}; the state is there. With c2 down, c4
    stores no member set yet, and a member that stores nothing confirms nothing (it could
    be a removed member that was wiped: test_adversary_round5_membership.py), so the read
    is refused as unobservable (exit 4) rather than answered from c1 alone; with c2 back
    the newest value is returned and c4 is repaired."""
    pay(dep5, "c1", "c2", "c3")
    dep5.sandbox.pause(4)
    try:
        succeeded(dep5.cli("--timeout", "2s", "deployment", "replace-cluster", DEP, "c3", "c4"))
    finally:
        dep5.sandbox.resume(4)
    dep5.sandbox.pause(2)
    try:
        refused = dep5.cli("--timeout", "2s", "state", "get", DEP, "release")
    finally:
        dep5.sandbox.resume(2)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "c4 store no member set" in refused.stderr and "c2 could not be read" in refused.stderr
    got = succeeded(dep5.cli("--timeout", "2s", "state", "get", DEP, "release"))
    assert got.stdout.strip() == "1.2.0"
    assert (replica(dep5, 4) or {}).get("data", {}).get("release") == "1.2.0"


def _forged_envelope(env: Env, data: dict[str, Any], token: int) -> str:
    """An envelope in coordinator's format (the code is public), for deployment `pay`,
    with a token as high as the attacker likes."""
    doc = replica(env, 1)
    assert doc is not None
    doc.update(data=data, checksum=checksum(data), token=token, version=doc["version"] + 1, write_id="ab" * 16)
    return json.dumps(doc, separators=(",", ":"))


def test_add_cluster_does_not_copy_a_state_planted_on_the_new_member(dep5: Env, tmp_path: Path) -> None:
    """Threat model: a user with the printed rights of another deployment in the namespace
    can create objects under any name, and can change nothing of `pay`. Planting `pay`'s
    lease and state object on a cluster before it is added must not let it rewrite `pay`'s
    state on the members."""
    from helpers.rbac import grant, mint_user

    pay(dep5, "c1", "c2", "c3")
    user, minted = mint_user(dep5.sandbox, tmp_path, "other-team")
    grant(dep5.sandbox, dep5, dep5.namespace, user, clusters=(4,), deployments=("other",))
    ns = dep5.namespace
    planted_lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": ns, "annotations": {"coordinator.io/fencing-token": "1000000"}},
        "spec": {},
    }
    planted_state = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": STATE, "namespace": ns},
        "data": {"envelope.json": _forged_envelope(dep5, {"release": "evil"}, 1000000)},
    }

    async def plant() -> None:
        client = KubeClient(Endpoint("u4", minted.contexts[3], str(minted.path)), timeout=5)
        try:
            await client.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", body=planted_lease)
            await client.request("POST", configmaps_path(ns), body=planted_state)
            with pytest.raises(KubeError):  # it may not touch `pay`'s objects otherwise
                await client.request("GET", f"{configmaps_path(ns)}/{STATE}")
        finally:
            await client.close()

    anyio.run(plant)
    added = dep5.cli("deployment", "add-cluster", DEP, "c4")
    after = {i: ((replica(dep5, i) or {}).get("data") or {}).get("release") for i in (1, 2, 3)}
    got = dep5.cli("state", "get", DEP, "release")
    assert after == {1: "1.2.0", 2: "1.2.0", 3: "1.2.0"}, (added.returncode, added.stdout, after)
    assert got.returncode != 0 or got.stdout.strip() == "1.2.0", got.stdout


def test_a_stale_record_cannot_read_old_state_once_leases_are_deleted(dep5: Env, tmp_path: Path) -> None:
    """docs/design.md: a member whose lease was deleted stores nothing, and state envelopes speak
    for deleted leases. A stale machine's state read must stop (exit 5) rather than
    return a value older than a confirmed write."""
    pay(dep5, "c1", "c2", "c3")
    stale = machine(dep5, tmp_path, "stale")
    succeeded(dep5.cli("deployment", "replace-cluster", DEP, "c3", "c4"))
    write_partially(dep5, "2.0", paused=2)  # confirmed on c1, c4
    for i in (2, 3):
        assert kubectl_on(dep5, i, "delete", "lease", LEASE).returncode == 0
    dep5.sandbox.pause(1)
    try:
        got = stale.cli("--timeout", "2s", "state", "get", DEP, "release")
    finally:
        dep5.sandbox.resume(1)
    assert got.returncode != 0 or got.stdout.strip() == "2.0", got.stdout


def test_a_member_added_where_its_namespace_is_missing_gets_it_and_answers_reads_of_an_empty_state(
    dep5: Env, tmp_path: Path
) -> None:
    """`pay` is made on c1, c2, c3 in a namespace of its own (c4 and c5 do not have it),
    and nothing is written to its state. `add-cluster pay c4` must make the namespace on
    c4 as `deployment create` does: the old set's three members reach the new set's
    majority (3 of 4) without c4, so the change finished while every write to c4 failed,
    leaving a member with no lease, no history and no state object. And c4's state object
    must answer reads as the others' do (seeded, as create seeds them): with c3 then
    unreachable, `state get` reads the empty state from c1, c2, c4 (it exited 4, "2 of 4
    clusters answered", when c4's object was an empty one made later)."""
    env = Env(sandbox=dep5.sandbox, config=dep5.config, namespace="t-add-" + secrets.token_hex(3),
              deployment=DEP, clusters=list(dep5.clusters))  # fmt: skip
    args = [a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]
    succeeded(env.cli("deployment", "create", DEP, "-n", env.namespace, *args, "--max-ttl", "8s"))
    assert kubectl_on(env, 4, "get", "namespace", env.namespace).returncode != 0  # not there yet
    succeeded(env.cli("deployment", "add-cluster", DEP, "c4", "--ttl", "8s"))
    assert lease_on(env, 4) is not None, "c4 holds no lease after it was added"
    env.sandbox.pause(3)
    try:
        read = env.cli("--timeout", "3", "-o", "json", "state", "get", DEP)
    finally:
        env.sandbox.resume(3)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {}


def test_a_lease_another_client_made_on_a_new_member_is_not_taken_for_ours_by_its_uid_note(dep5: Env) -> None:
    """Found by an outside attack: another client creates `pay`'s lease on c4 before c4
    is added and annotates it with its own uid (`kubectl annotate ... coordinator.io/uid=
    <uid>`), managedFields left as kubectl wrote them. A uid note another client is on
    record as writing says nothing of who made the lease: `add-cluster pay c4` refuses it
    as a lease coordinator did not write (exit 5), as it refuses one without the note. It
    took the note for coordinator's and added c4 (exit 0)."""
    env = dep5
    args = [a for m in ("c1", "c2", "c3") for a in ("--cluster", m)]
    succeeded(env.cli("deployment", "create", DEP, "-n", env.namespace, *args, "--max-ttl", "8s"))
    planted = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": env.namespace},
        "spec": {"leaseDurationSeconds": 60},
    }
    succeeded(kubectl(env.kubeconfig, 4, env.namespace, "create", "-f", "-", stdin=json.dumps(planted)))
    uid = succeeded(kubectl_on(env, 4, "get", "lease", LEASE, "-o", "jsonpath={.metadata.uid}")).stdout.strip()
    succeeded(kubectl_on(env, 4, "annotate", "lease", LEASE, f"coordinator.io/uid={uid}"))
    added = env.cli("--timeout", "3s", "deployment", "add-cluster", DEP, "c4", "--ttl", "8s")
    assert added.returncode == 5, (added.returncode, added.stdout, added.stderr)
    assert "c4" in added.stderr, added.stderr
    shown = json_doc(succeeded(env.cli("-o", "json", "deployment", "show", DEP)))
    assert shown["clusters"] == ["c1", "c2", "c3"], shown
