"""The stored member set against whoever may write a lease: a set forged on one member is
neither adopted nor a way to a second holder, forged identities print escaped, a lease
planted for a future deployment stops its create, and add-cluster never takes over another
deployment's member; a token at the conversion limit is refused, not a crash.

Who attacks: someone with write access to the namespace on one member (``kubectl
annotate`` under their own field manager); someone with only the ``create`` right the
printed Role of another deployment grants; a second deployment of the same name on other
clusters. Found by an outside attack on the membership input (docs/regressions.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import Env
from helpers.members import connected_machine, identities, pay, replica_data, stored_set, succeeded

from coordinator.config.store import ConfigStore
from coordinator.kube.client import Endpoint, KubeClient
from coordinator.rules.membership import A_MEMBERSHIP, Membership
from coordinator.rules.resources import LABEL_DEPLOYMENT, LABEL_MANAGED_BY, LABEL_VALUE, lease_path

pytestmark = pytest.mark.integration

TITLE = "\x1b]0;pwned\x07"
FORGED_LINE = "\r\nc9   epoch 99: forged\x9b31m"
RAW = ("\x1b", "\x9b", "\r", "\x07")


def _clean(text: str) -> None:
    for ch in RAW:
        assert ch not in text, (ch, text)
    for line in text.splitlines():
        assert not line.lstrip().startswith("c9 "), line


def _annotate(
    env: Env, index: int, deployment: str, annotations: dict[str, str], manager: str = "kubectl-annotate"
) -> None:
    """What `kubectl annotate --overwrite` does: a merge patch under its own field manager."""

    async def go() -> None:
        client = env.client(index)
        try:
            await client.request(
                "PATCH",
                lease_path(env.namespace, f"coordinator-lock-{deployment}"),
                body={"metadata": {"annotations": annotations}},
                query={"fieldManager": manager},
                content_type="application/merge-patch+json",
            )
        finally:
            await client.close()

    anyio.run(go)


def _ident(env: Env, name: str) -> str:
    return ConfigStore(env.config).load().clusters[name].identity


# -- a member set forged on one member by another field manager


def test_import_does_not_adopt_a_member_set_forged_on_one_member(dep3: Env, tmp_path: Path) -> None:
    """On c2, someone with write access to the namespace annotates web's lease with a
    member set of c2 alone, at a newer epoch. A new machine imports web from c2."""
    forged = Membership.of([_ident(dep3, "c2")], epoch=7)
    _annotate(dep3, 2, "web", {A_MEMBERSHIP: forged.dump()})
    newcomer = connected_machine(dep3, tmp_path / "newcomer")
    imported = newcomer.cli("deployment", "import", "web", "--cluster", "c2", "-n", dep3.namespace)
    if imported.returncode == 0:
        shown = json.loads(succeeded(newcomer.cli("-o", "json", "deployment", "show", "web")).stdout)
        # the members that really hold the deployment, never the set one cluster was told
        assert shown["clusters"] == ["c1", "c2", "c3"], shown
    else:
        assert imported.returncode in (5, 6), imported.stderr


def test_a_forged_member_set_on_one_member_stops_or_is_overwritten_by_the_legit_machine(dep3: Env) -> None:
    """The same forgery seen from the machine that made the deployment. Its acquisition
    decides on the first majority it reads: when c2 is among them it stops (exit 5) and
    takes nothing; when c1 and c3 answer first it takes the lock on them with the real set,
    and leaves c2 alone (a lease storing another set is never taken over: the forgery stays
    for a person to look at). Either way no member is left holding for a set that a
    majority does not store."""
    forged = Membership.of([_ident(dep3, "c2")], epoch=7)
    _annotate(dep3, 2, "web", {A_MEMBERSHIP: forged.dump()})
    got = dep3.cli("-o", "json", "--timeout", "3s", "lock", "acquire", "web", "--holder", "legit")
    assert got.returncode in (0, 5), got.stderr
    real = Membership.of(identities(dep3, "c1", "c2", "c3"), epoch=1)
    for i in (1, 2, 3):
        lease = anyio.run(dep3.raw, i, "GET", lease_path(dep3.namespace, "coordinator-lock-web"))
        holder = (lease.get("spec") or {}).get("holderIdentity")
        stored = Membership.parse(lease["metadata"]["annotations"][A_MEMBERSHIP])
        if got.returncode == 5 or (i == 2 and not holder):
            assert not holder, lease["spec"]
        else:
            assert json.loads(got.stdout)["lock_id"] in str(holder)
            assert stored == real


def test_a_member_set_forged_on_one_member_does_not_give_a_second_holder(dep3: Env, tmp_path: Path) -> None:
    """H takes web while c2 is paused (H holds c1, c3). On c2, someone annotates the lease
    with a set of c2 alone (epoch 7). A newcomer follows the usual advice and imports web
    from c2, then takes the lock: it must not get it while H holds a majority."""
    dep3.sandbox.pause(2)
    held = dep3.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "web", "--holder", "H", "--ttl", "120s")
    assert held.returncode == 0, held.stderr
    dep3.sandbox.resume(2)
    _annotate(dep3, 2, "web", {A_MEMBERSHIP: Membership.of([_ident(dep3, "c2")], epoch=7).dump()})
    newcomer = connected_machine(dep3, tmp_path / "newcomer")
    imported = newcomer.cli("deployment", "import", "web", "--cluster", "c2", "-n", dep3.namespace)
    if imported.returncode == 0:
        second = newcomer.cli("-o", "json", "--timeout", "3s", "lock", "acquire", "web", "--holder", "N")
        assert second.returncode != 0, "two holders at once: " + second.stdout


def _forge_escapes(env: Env) -> None:
    forged = Membership.of([TITLE + FORGED_LINE, _ident(env, "c1"), _ident(env, "c3")], epoch=9)
    _annotate(env, 2, "web", {A_MEMBERSHIP: forged.dump()})


def test_a_refusal_naming_forged_identities_prints_them_escaped(dep3: Env) -> None:
    """Identities come from an annotation anyone with write access can set. `lock status`
    reads every member and stops on the conflicting set, naming its members."""
    _forge_escapes(dep3)
    got = dep3.cli("--timeout", "3s", "lock", "status", "web")
    assert got.returncode == 5, got.stderr
    _clean(got.stderr + got.stdout)


def test_deployment_show_prints_forged_identities_escaped(dep3: Env) -> None:
    _forge_escapes(dep3)
    shown = dep3.cli("deployment", "show", "web")
    _clean(shown.stdout + shown.stderr)
    as_json = dep3.cli("-o", "json", "deployment", "show", "web")
    assert as_json.returncode == 0, as_json.stderr
    json.loads(as_json.stdout)


def test_the_fleet_view_prints_forged_identities_escaped(dep3: Env) -> None:
    _forge_escapes(dep3)
    fleet = dep3.cli("lock", "status", "--all")
    _clean(fleet.stdout + fleet.stderr)


# -- planted leases (the create right the printed Role grants for any name)


def _plant(
    env: Env,
    index: int,
    deployment: str,
    annotations: dict[str, str],
    holder: str | None = None,
    as_user: Any = None,
) -> None:
    """Create a lease for ``deployment`` on cluster ``index``, as the admin or as the
    minted user ``as_user`` (whose printed Role grants `create` on Leases by any name)."""
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"coordinator-lock-{deployment}",
            "labels": {LABEL_MANAGED_BY: LABEL_VALUE, LABEL_DEPLOYMENT: deployment},
            "annotations": annotations,
        },
        "spec": {"leaseDurationSeconds": 3600, **({"holderIdentity": holder} if holder else {})},
    }

    async def go() -> None:
        if as_user is None:
            client = env.client(index)
        else:
            client = KubeClient(Endpoint(f"u{index}", as_user.contexts[index - 1], str(as_user.path)), timeout=5)
        try:
            await client.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{env.namespace}/leases",
                                 body=body, query={"fieldManager": "planter"})  # fmt: skip
        finally:
            await client.close()

    anyio.run(go)


def _restricted(env: Env, tmp_path: Path, deployment: str) -> Any:
    """A freshly minted user granted exactly what `rbac print --deployment` prints for
    ``deployment`` (as test_rbac_live applies it)."""
    from helpers.rbac import grant, mint_user

    user, minted = mint_user(env.sandbox, tmp_path, "planter")
    grant(env.sandbox, env, env.namespace, user, deployments=(deployment,))
    return minted


def test_a_lease_planted_for_a_future_deployment_stops_its_create(dep3: Env, tmp_path: Path) -> None:
    """A user granted deployment `app` only plants, before deployment `ledger` exists, a
    lease for it on c1 naming c1 alone (epoch 5): `create` by any name is all it needs.
    `deployment create ledger` on c1..c3 then refuses and records nothing."""
    minted = _restricted(dep3, tmp_path, "app")
    forged = Membership.of([_ident(dep3, "c1")], epoch=5).dump()
    _plant(dep3, 1, "ledger", {A_MEMBERSHIP: forged}, as_user=minted)
    made = dep3.cli("deployment", "create", "ledger", "-n", dep3.namespace,
                    "--cluster", "c1", "--cluster", "c2", "--cluster", "c3")  # fmt: skip
    assert made.returncode == 6, made.stderr + made.stdout
    assert "planted" in made.stderr, made.stderr
    assert "ledger" not in ConfigStore(dep3.config).load().deployments


def test_following_the_advice_after_a_planted_lease_does_not_adopt_its_member_set(dep3: Env, tmp_path: Path) -> None:
    minted = _restricted(dep3, tmp_path, "app")
    forged = Membership.of([_ident(dep3, "c1")], epoch=5).dump()
    _plant(dep3, 1, "ledger", {A_MEMBERSHIP: forged}, as_user=minted)
    made = dep3.cli("deployment", "create", "ledger", "-n", dep3.namespace,
                    "--cluster", "c1", "--cluster", "c2", "--cluster", "c3")  # fmt: skip
    assert made.returncode == 6, made.stderr
    # The refusal says what it found and that it may be planted; any import it advises,
    # and the import from the one cluster that stores the set, must not adopt it.
    assert "planted" in made.stderr, made.stderr
    advice = [w.strip("`") for w in made.stderr.split("`") if w.startswith("coordinator deployment import")]
    attempts = [a.split()[1:] for a in advice] + [["deployment", "import", "ledger", "--cluster", "c1"]]
    for attempt in attempts:
        imported = dep3.cli(*attempt, "-n", dep3.namespace)
        if imported.returncode == 0:
            shown = json.loads(succeeded(dep3.cli("-o", "json", "deployment", "show", "ledger")).stdout)
            assert shown["clusters"] != ["c1"], "the planted set was adopted: " + json.dumps(shown)
            succeeded(dep3.cli("deployment", "delete", "ledger"))
        else:
            assert imported.returncode == 5, imported.stderr


def test_a_planted_ghost_deployment_in_the_fleet_view_is_escaped(dep3: Env) -> None:
    """A lease labelled as the tool labels its own, with a holder and a member set full of
    escapes, shows up in the fleet view as a deployment not imported here: escaped."""
    _plant(
        dep3,
        1,
        "ghost",
        {
            A_MEMBERSHIP: Membership.of([TITLE + FORGED_LINE], epoch=1).dump(),
            "coordinator.io/holder": "evil" + TITLE + FORGED_LINE,
            "coordinator.io/reason": "x" * 20000 + FORGED_LINE,
        },
        holder="evil" + TITLE,
    )
    fleet = dep3.cli("lock", "status", "--all")
    assert fleet.returncode in (0, 3, 4), fleet.stderr
    _clean(fleet.stdout + fleet.stderr)
    as_json = dep3.cli("-o", "json", "lock", "status", "--all")
    doc = json.loads(as_json.stdout)
    ghosts = [e for e in doc["deployments"] if e["deployment"] == "ghost"] if isinstance(doc, dict) else []
    assert ghosts and not ghosts[0]["imported"], doc


# -- a cluster that already hosts another deployment of the same name


@pytest.mark.slow
def test_add_cluster_does_not_take_over_another_deployments_member(dep5: Env, tmp_path: Path) -> None:
    """Deployment `pay` on c1..c3 (this machine) and another `pay` on c4, c5 in the same
    namespace (another machine: a second fleet sharing clusters). Adding c4 to the first
    must not overwrite the second's lease or state on c4."""
    pay(dep5, "c1", "c2", "c3")
    other = connected_machine(dep5, tmp_path / "other")
    succeeded(other.cli("deployment", "create", "pay", "-n", dep5.namespace, "--cluster", "c4", "--cluster", "c5"))
    lock = json.loads(
        succeeded(other.cli("-o", "json", "lock", "acquire", "pay", "--holder", "b", "--ttl", "30s")).stdout
    )
    succeeded(other.cli("state", "set", "pay", "release=B", "--lock-id", lock["lock_id"]))
    succeeded(other.cli("lock", "release", "pay", "--holder", "b"))
    theirs = stored_set(dep5, 4)
    assert set(theirs.members) == identities(dep5, "c4", "c5")

    added = dep5.cli("--timeout", "3s", "deployment", "add-cluster", "pay", "c4")
    # whatever the first deployment's machine was told, the second deployment is intact on c4
    assert replica_data(dep5, 4)["release"] == "B"
    assert stored_set(dep5, 4) == theirs
    assert added.returncode != 0, added.stdout
    again = other.cli("-o", "json", "lock", "acquire", "pay", "--holder", "b2", "--ttl", "30s")
    assert again.returncode == 0, again.stderr


# -- SIGKILL at moments helpers.members.KILL_AFTER_JOINT does not cover


# -- removing a member "dead" that is alive


# -- input bombs in `state apply -f` and `state set`


# -- a fencing token at the edge of what Python converts


def test_a_token_at_the_conversion_limit_is_refused_not_a_crash(dep3: Env) -> None:
    """Someone with write access to the namespace sets the token annotation on c1 and c2 to
    the largest number Python still reads from text."""
    for i in (1, 2):  # every majority reads one of them
        _annotate(dep3, i, "web", {"coordinator.io/fencing-token": "9" * 4300})
    got = dep3.cli("--timeout", "3s", "lock", "acquire", "web", "--holder", "after")
    assert "Internal error" not in got.stderr, got.stderr
    assert got.returncode != 1, got.stderr


# -- files
