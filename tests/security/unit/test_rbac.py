"""``coordinator rbac print`` and the pure manifests behind it: exactly the rights needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.cli import main
from coordinator.errors import UsageError
from coordinator.ops import rbac

ROOT = Path(__file__).resolve().parents[3]
DEPLOY_RBAC = ROOT / "deploy" / "rbac.yaml"
DEPLOY_RBAC_ARGS = (
    "rbac print --namespace my-deployment-ns --deployment my-deployment --group coordinator-users".split()
)

LABEL = ("coordinator.io/managed-by", "coordinator")
RBAC = "rbac.authorization.k8s.io"
NAMED_VERBS = ("get", "list", "watch", "update", "delete")

# One tuple per granted (apiGroup, resource, verb, resourceName); None = any name.
Grant = tuple[str, str, str, str | None]


def _grants(obj: dict[str, Any]) -> list[Grant]:
    """Every single permission a Role or ClusterRole grants, sorted, duplicates kept."""
    found: list[Grant] = []
    for rule in obj["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        names: list[str | None] = list(rule.get("resourceNames") or [None])
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    found += [(group, resource, verb, name) for name in names]
    return sorted(found, key=repr)


def _expected(*grants: Grant) -> list[Grant]:
    return sorted(grants, key=repr)


def _by_name(group: str, resource: str, name: str) -> list[Grant]:
    return [(group, resource, verb, name) for verb in NAMED_VERBS]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    else:  # pragma: no cover - main always exits
        code = 0
    out, err = capsys.readouterr()
    return code, out, err


def _history(deployment: str) -> list[Grant]:
    """The lock's history ConfigMap: read, compare-and-swap update, delete; no list or watch."""
    return [("", "configmaps", verb, f"coordinator-history-{deployment}") for verb in ("get", "update", "delete")]


def _print(capsys: pytest.CaptureFixture[str], *args: str, deployment: str | None = "web") -> list[dict[str, Any]]:
    if deployment is not None:
        args = (*args, "--deployment", deployment)
    code, out, err = _run(capsys, "rbac", "print", *args)
    assert code == 0, err
    return [doc for doc in yaml.safe_load_all(out) if doc is not None]


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = _by_kind(objects, kind)
    return found


# --- what is granted ---------------------------------------------------------------------


def test_default_output_is_role_clusterrole_and_their_bindings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    objects = _print(capsys, "--namespace", "payments", "--group", "release")
    assert [o["kind"] for o in objects] == [
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ]
    assert {o["apiVersion"] for o in objects} == {"rbac.authorization.k8s.io/v1"}


def test_role_grants_the_deployments_objects_by_name_and_only_create_unnamed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    role = _one(_print(capsys, "--namespace", "payments", "--group", "release"), "Role")
    assert role["metadata"]["namespace"] == "payments"
    assert _grants(role) == _expected(
        *_by_name("coordination.k8s.io", "leases", "coordinator-lock-web"),
        *_by_name("", "configmaps", "coordinator-state-web"),
        ("", "configmaps", "get", "coordinator-identity"),
        *_history("web"),
        ("coordination.k8s.io", "leases", "create", None),
        ("", "configmaps", "create", None),
        ("events.k8s.io", "events", "create", None),
    )
    # Nothing but create is granted without a name: no list of every object, no delete
    # of someone else's.
    assert {verb for _, _, verb, name in _grants(role) if name is None} == {"create"}


def test_secret_storage_swaps_configmaps_for_secrets_but_keeps_the_identity_configmap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    objects = _print(capsys, "--namespace", "payments", "--group", "release", "--storage", "secret")
    assert _grants(_one(objects, "Role")) == _expected(
        *_by_name("coordination.k8s.io", "leases", "coordinator-lock-web"),
        *_by_name("", "secrets", "coordinator-state-web"),
        ("", "configmaps", "get", "coordinator-identity"),
        *_history("web"),
        ("coordination.k8s.io", "leases", "create", None),
        ("", "configmaps", "create", None),
        ("", "secrets", "create", None),
        ("events.k8s.io", "events", "create", None),
    )


def test_each_deployment_gets_its_own_role_and_binding(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys,
        "rbac",
        "print",
        "-n",
        "payments",
        "--deployment",
        "web",
        "--deployment",
        "api",
        "--deployment",
        "web",
        "--user",
        "alice",
    )
    assert code == 0, err
    objects = [doc for doc in yaml.safe_load_all(out) if doc is not None]
    assert [o["kind"] for o in objects] == [
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ]
    roles = _by_kind(objects, "Role")
    assert [r["metadata"]["name"] for r in roles] == [
        "coordinator:deployment:web:configmap",
        "coordinator:deployment:api:configmap",
    ]
    assert {name for r in roles for *_, name in _grants(r)} == {
        "coordinator-lock-web",
        "coordinator-state-web",
        "coordinator-lock-api",
        "coordinator-state-api",
        "coordinator-history-web",
        "coordinator-history-api",
        "coordinator-identity",
        None,
    }
    # Printing for one deployment gives the same Role: applying it for a second one
    # never replaces the first's.
    assert _one(_print(capsys, "-n", "payments", "--user", "bob", deployment="api"), "Role") == roles[1]
    for binding, role in zip(_by_kind(objects, "RoleBinding"), roles, strict=True):
        assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_printed_yaml_says_why_create_is_not_limited_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "rbac", "print", "-n", "payments", "--deployment", "web", "--user", "a", "--storage", "secret"
    )
    assert code == 0
    text = " ".join(line.lstrip("# ") for line in out.splitlines() if line.startswith("#"))
    assert "cannot limit `create` by name" in text
    assert "create new ConfigMaps and Secrets under any name" in text
    assert "create new Leases under any name" in text
    # In every Role, each rule has a comment right above it; the create rules say why.
    roles = [doc for doc in out.split("\n---\n") if "\nkind: Role\n" in f"\n{doc}"]
    assert len(roles) == 1
    _, rules = roles[0].split("\nrules:\n")
    chunks = rules.split("\n- apiGroups:")
    comments = [[line for line in chunk.splitlines() if line.startswith("#")] for chunk in chunks[:-1]]
    bodies = ["\n".join(ln for ln in chunk.splitlines() if not ln.startswith("#")) for chunk in chunks[1:]]
    creates = [i for i, body in enumerate(bodies) if body.rstrip().endswith("verbs:\n  - create")]
    assert len(creates) == 3 and all(comments[i] for i in range(len(chunks) - 1))
    for i in creates:
        assert "create cannot be limited by name" in " ".join(comments[i]), comments[i]
    # The Events rule says what it is for, and that nothing breaks without it.
    (events,) = [i for i in creates if "events.k8s.io" in bodies[i]]
    assert "Without this rule every command works the same" in " ".join(c.lstrip("# ") for c in comments[events])


def test_cluster_role_reads_only_kube_system_and_the_namespace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    objects = _print(capsys, "--namespace", "payments", "--group", "release")
    assert _grants(_one(objects, "ClusterRole")) == _expected(
        ("", "namespaces", "get", "kube-system"),
        ("", "namespaces", "get", "payments"),
        ("authorization.k8s.io", "selfsubjectaccessreviews", "create", None),
    )


def test_namespace_creation_is_opt_in_and_separate(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _print(capsys, "--namespace", "payments", "--group", "release")
    assert all(("", "namespaces", "create", None) not in _grants(o) for o in _by_kind(plain, "ClusterRole"))

    objects = _print(capsys, "--namespace", "payments", "--group", "release", "--create-namespace")
    roles = _by_kind(objects, "ClusterRole")
    assert len(roles) == 2
    assert objects[:4] == plain, "the opt-in only adds objects"
    creator = roles[1]
    assert _grants(creator) == [("", "namespaces", "create", None)]
    binding = _by_kind(objects, "ClusterRoleBinding")[1]
    assert binding["roleRef"]["name"] == creator["metadata"]["name"]


def test_listing_leases_for_the_fleet_view_is_opt_in_and_separate(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _print(capsys, "--namespace", "payments", "--group", "release")
    objects = _print(capsys, "--namespace", "payments", "--group", "release", "--fleet")
    assert objects[:4] == plain, "the opt-in only adds objects"
    lister = _by_kind(objects, "ClusterRole")[1]
    assert _grants(lister) == [
        ("coordination.k8s.io", "leases", "list", None),
        ("coordination.k8s.io", "leases", "watch", None),
    ]
    binding = _by_kind(objects, "ClusterRoleBinding")[1]
    assert binding["roleRef"]["name"] == lister["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "Group", "apiGroup": RBAC, "name": "release"}]


def test_everything_carries_the_tool_label(capsys: pytest.CaptureFixture[str]) -> None:
    objects = _print(
        capsys,
        "--namespace",
        "payments",
        "--user",
        "alice",
        "--storage",
        "secret",
        "--create-namespace",
        "--fleet",
    )
    for obj in objects:
        assert obj["metadata"]["labels"] == dict([LABEL]), obj["kind"]


# --- bindings and subjects -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "subject"),
    [
        (
            "--user",
            "alice@example.com",
            {"kind": "User", "apiGroup": RBAC, "name": "alice@example.com"},
        ),
        ("--group", "release", {"kind": "Group", "apiGroup": RBAC, "name": "release"}),
        (
            "--service-account",
            "ci:deployer",
            {"kind": "ServiceAccount", "name": "deployer", "namespace": "ci"},
        ),
    ],
)
def test_bindings_tie_the_roles_to_the_subject(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, subject: dict[str, str]
) -> None:
    objects = _print(capsys, "--namespace", "payments", flag, value)
    role, binding = _one(objects, "Role"), _one(objects, "RoleBinding")
    cluster_role, cluster_binding = (
        _one(objects, "ClusterRole"),
        _one(objects, "ClusterRoleBinding"),
    )
    assert binding["metadata"]["namespace"] == "payments"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert cluster_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": cluster_role["metadata"]["name"],
    }
    assert "namespace" not in cluster_role["metadata"]
    assert "namespace" not in cluster_binding["metadata"]
    assert binding["subjects"] == cluster_binding["subjects"] == [subject]


def test_a_second_subject_gets_its_own_bindings_and_shares_the_roles(
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = _print(capsys, "--namespace", "payments", "--user", "alice")
    second = _print(capsys, "--namespace", "payments", "--user", "Alice")
    for kind in ("Role", "ClusterRole"):
        assert _one(first, kind) == _one(second, kind)
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        assert _one(first, kind)["metadata"]["name"] != _one(second, kind)["metadata"]["name"]


def test_names_are_stable_and_valid_rbac_names(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--namespace", "payments", "--user", "https://issuer.example/#Alice Smith")
    objects = _print(capsys, *args)
    assert objects == _print(capsys, *args)
    for obj in objects:
        name = obj["metadata"]["name"]
        # RBAC object names are path segments: no '/', no '%', not '.' or '..'.
        assert name not in {".", ".."} and "/" not in name and "%" not in name, name
        assert len(name) <= 253


def test_distinct_subjects_that_slug_alike_get_distinct_bindings() -> None:
    names = {
        rbac.role_binding("ns", "web", subject)["metadata"]["name"]
        for subject in (
            rbac.Subject.user("a-b"),
            rbac.Subject.user("a_b"),
            rbac.Subject.user("A-b"),
            rbac.Subject.group("a-b"),
            rbac.Subject.service_account("a", "b"),
        )
    }
    assert len(names) == 5


def test_a_namespace_named_kube_system_is_listed_once() -> None:
    role = rbac.cluster_role("kube-system")
    assert _grants(role) == _expected(
        ("", "namespaces", "get", "kube-system"),
        ("authorization.k8s.io", "selfsubjectaccessreviews", "create", None),
    )


def test_cli_output_is_the_library_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    objects = _print(capsys, "--namespace", "payments", "--service-account", "ci:deployer", "--storage", "secret")
    expected = rbac.manifests("payments", rbac.parse_service_account("ci:deployer"), ["web"], storage="secret")
    assert objects == expected


# --- output formats -----------------------------------------------------------------------


def test_yaml_output_starts_with_how_it_was_made(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "rbac", "print", "--namespace", "payments", "--user", "alice smith", "--deployment", "web"
    )
    assert code == 0
    header = [line for line in out.splitlines() if line.startswith("#")]
    assert "#   coordinator rbac print --namespace payments --deployment web --user 'alice smith'" in header


def test_json_output_is_a_list_kubectl_can_apply(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--namespace", "payments", "--group", "release", "--deployment", "web")
    as_yaml = _print(capsys, *args, deployment=None)
    code, out, err = _run(capsys, "-o", "json", "rbac", "print", *args)
    assert code == 0, err
    assert json.loads(out) == {"apiVersion": "v1", "kind": "List", "items": as_yaml}


def test_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "rbac", "print", "--help")
    assert code == 0
    assert "coordinator rbac print --namespace" in out
    assert "kubectl" in out and "apply -f -" in out


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace",
    ["Payments", "-payments", "payments-", "pay_ments", "pay.ments", "payments\n", "", "p" * 64],
)
def test_an_invalid_namespace_is_a_usage_error(capsys: pytest.CaptureFixture[str], namespace: str) -> None:
    code, out, err = _run(
        capsys, "rbac", "print", "--namespace", namespace, "--group", "release", "--deployment", "web"
    )
    assert code == 2
    assert out == ""
    assert "Invalid namespace" in err and "DNS-1123" in err
    assert err.count("\n") == 1, "one paragraph"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--user", "alice", "--group", "release"],
        ["--service-account", "deployer"],
        ["--service-account", "CI:deployer"],
        ["--service-account", "ci:Deployer"],
        ["--service-account", "ci:deployer\n"],
        ["--user", "alice\nbob"],
        ["--group", " "],
        ["--storage", "etcd", "--group", "release"],
        ["--group", "release", "--deployment", ""],
        ["--group", "release", "--deployment", "Web"],
        ["--group", "release", "--deployment", "w" * 46],
        ["--group", "release", "--deployment", "web\n"],
    ],
    ids=[
        "no-subject",
        "two-subjects",
        "sa-without-ns",
        "sa-bad-ns",
        "sa-bad-name",
        "sa-trailing-newline",
        "newline-user",
        "blank-group",
        "unknown-storage",
        "empty-deployment",
        "upper-case-deployment",
        "too-long-deployment",
        "newline-deployment",
    ],
)
def test_bad_subjects_and_options_are_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    if not any(a == "--deployment" for a in args):
        args = [*args, "--deployment", "web"]
    code, out, err = _run(capsys, "rbac", "print", "--namespace", "payments", *args)
    assert code == 2, err
    assert out == ""
    assert err.strip()


def test_library_rejects_a_bad_namespace_too() -> None:
    with pytest.raises(UsageError, match="Invalid namespace"):
        rbac.manifests("Not_A_Namespace", rbac.Subject.group("release"), ["web"])


def test_a_deployment_must_be_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "rbac", "print", "--namespace", "payments", "--group", "release")
    assert code == 2 and out == ""
    assert "--deployment" in err and "by name" in err
    with pytest.raises(UsageError, match="--deployment"):
        rbac.manifests("payments", rbac.Subject.group("release"), [])


# --- the checked-in example -------------------------------------------------------------------


def test_deploy_rbac_yaml_is_the_current_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, *DEPLOY_RBAC_ARGS)
    assert code == 0, err
    assert DEPLOY_RBAC.read_text() == out, (
        "deploy/rbac.yaml is stale; regenerate it with: coordinator "
        + " ".join(DEPLOY_RBAC_ARGS)
        + " > deploy/rbac.yaml"
    )
    assert "coordinator " + " ".join(DEPLOY_RBAC_ARGS) in out.split("---", 1)[0]
