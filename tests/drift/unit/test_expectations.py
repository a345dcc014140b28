"""The drift rules, case by case: resource and field syntax, values, who changed a field,
the record's merge, and what the findings add up to (coordinator/rules/expectations.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.errors import UsageError
from coordinator.rules.expectations import (
    STATE_KEY,
    Expectation,
    FieldRecord,
    Finding,
    ResourceRef,
    Status,
    compare,
    expectation_from,
    last_change,
    parse_resource,
    read_expectations,
    record_document,
    verdict,
)
from coordinator.rules.fieldpaths import parse_field, value_at

MEMBERS = ["eu-1", "eu-2", "eu-3"]


def deployment(replicas: int = 3, images: tuple[str, ...] = ("api:1.2.0",), fields: Any = None) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": image} for i, image in enumerate(images)]
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "payments"},
        "spec": {"replicas": replicas, "template": {"spec": {"containers": containers}}},
    }
    if fields is not None:
        obj["metadata"]["managedFields"] = fields
    return obj


def entry(manager: str, time: str, fields: dict[str, Any], **extra: str) -> dict[str, Any]:
    return {"manager": manager, "operation": "Update", "time": time, "fieldsV1": fields, **extra}


API = ResourceRef("apps/v1", "Deployment", "api", "payments")


# ------------------------------------------------------------------ syntax


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("deployment/api", ("apps/v1", "Deployment", "api")),
        ("deploy/api", ("apps/v1", "Deployment", "api")),
        ("cm/api-settings", ("v1", "ConfigMap", "api-settings")),
        ("ConfigMap/api-settings", ("v1", "ConfigMap", "api-settings")),
        ("v1/ConfigMap/api-settings", ("v1", "ConfigMap", "api-settings")),
        ("example.com/v1beta1/Widget/w1", ("example.com/v1beta1", "Widget", "w1")),
    ],
)
def test_a_resource_is_named_by_short_kind_or_by_group_version_kind(text: str, expected: tuple[str, ...]) -> None:
    ref = parse_resource(text, "payments")
    assert (ref.api_version, ref.kind, ref.name) == expected
    assert ref.namespace == "payments"
    assert parse_resource(ref.resource, "payments") == ref


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("widget/w1", "Unknown kind 'widget'"),
        ("api", "Cannot read the resource 'api'"),
        ("apps/v1/deployment/api", "'deployment' is no kind"),
        ("apps/one/Deployment/api", "'one' is no API version"),
        ("deployment/API", "'API' is no object name"),
        ("a/b/c/d/e", "Cannot read the resource"),
        ("v1/Secret/db-password", "Secret objects are not watched"),
    ],
)
def test_a_resource_that_cannot_be_read_is_a_usage_error_saying_why(text: str, said: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_resource(text, "payments")
    assert said in err.value.message
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (".spec.replicas", ".spec.replicas"),
        ("{.spec.replicas}", ".spec.replicas"),
        ("$.spec.replicas", ".spec.replicas"),
        (".spec.template.spec.containers[*].image", ".spec.template.spec.containers[*].image"),
    ],
)
def test_a_field_is_a_jsonpath_as_kubectl_writes_it(text: str, path: str) -> None:
    assert parse_field(text) == path


@pytest.mark.parametrize("text", ["spec.replicas", ".spec[", ".spec.containers[?(", ""])
def test_a_field_that_is_no_jsonpath_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="JSONPath"):
        parse_field(text)


# ------------------------------------------------------------------ values


def test_a_single_field_reads_as_its_value_and_a_wildcard_as_a_list() -> None:
    obj = deployment(images=("api:1", "sidecar:2"))
    assert value_at(obj, ".spec.replicas") == 3
    assert value_at(obj, ".spec.template.spec.containers[*].image") == ["api:1", "sidecar:2"]
    assert value_at(obj, ".spec.template.spec.containers[1].image") == "sidecar:2"
    assert value_at(obj, ".spec.paused") is None
    assert value_at(deployment(images=()), ".spec.template.spec.containers[*].image") == []
    by_name = parse_field('.spec.template.spec.containers[?(@.name=="c1")].image')
    assert value_at(obj, by_name) == ["sidecar:2"]
    obj["metadata"]["labels"] = {"app.kubernetes.io/version": "1.2"}
    assert value_at(obj, parse_field('.metadata.labels."app.kubernetes.io/version"')) == "1.2"


# ------------------------------------------------------------------ who changed it


def test_the_field_is_attributed_to_its_newest_owner() -> None:
    fields = [
        entry("kubectl-client-side-apply", "2026-12-01T10:00:00Z", {"f:spec": {"f:replicas": {}}}),
        entry("kubectl-edit", "2026-12-02T10:00:00Z", {"f:spec": {"f:replicas": {}}}),
        entry("helm", "2026-12-03T10:00:00Z", {"f:metadata": {"f:labels": {}}}),
    ]
    change = last_change(deployment(fields=fields), ".spec.replicas")
    assert change is not None and (change.manager, change.time, change.exact) == (
        "kubectl-edit",
        "2026-12-02T10:00:00Z",
        True,
    )


def test_an_element_of_a_list_is_found_under_its_key() -> None:
    image = {"f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"c0"}': {"f:image": {}}}}}}}
    fields = [
        entry("kubectl-set", "2026-12-02T10:00:00Z", image),
        entry("kubectl-scale", "2026-12-03T10:00:00Z", {"f:spec": {"f:replicas": {}}}, subresource="scale"),
    ]
    obj = deployment(fields=fields)
    change = last_change(obj, ".spec.template.spec.containers[*].image")
    assert change is not None and change.manager == "kubectl-set" and change.exact
    scaled = last_change(obj, ".spec.replicas")
    assert scaled is not None and "scale subresource" in scaled.text()


def test_a_field_nobody_owns_is_put_on_the_objects_last_write_and_says_so() -> None:
    fields = [entry("kubectl-edit", "2026-12-02T10:00:00Z", {"f:spec": {"f:replicas": {}}})]
    change = last_change(deployment(fields=fields), ".spec.paused")
    assert change is not None and not change.exact
    assert "no recorded writer" in change.text()
    assert last_change(deployment(), ".spec.replicas") is None


# ------------------------------------------------------------------ the record


def test_a_record_keeps_the_common_value_and_each_member_that_differs() -> None:
    objects = {"eu-1": deployment(3), "eu-2": deployment(5), "eu-3": deployment(3)}
    exp = expectation_from(API, [".spec.replicas"], objects)
    assert exp.fields == [FieldRecord(".spec.replicas", 3, {"eu-2": 5})]
    assert compare("eu-2", exp, deployment(5)).status is Status.MATCH
    assert compare("eu-1", exp, deployment(5)).status is Status.DRIFTED


def test_recording_again_replaces_that_resource_and_keeps_the_others() -> None:
    settings = ResourceRef("v1", "ConfigMap", "api-settings", "payments")
    old = record_document(
        {},
        "payments",
        [Expectation(API, [FieldRecord(".spec.replicas", 3)]), Expectation(settings, [FieldRecord(".data", {})])],
    )
    new = record_document(
        {STATE_KEY: old, "app": 1}, "payments", [Expectation(API, [FieldRecord(".spec.replicas", 5)])]
    )
    back = read_expectations({STATE_KEY: new}, "payments")
    assert [(e.ref, e.fields[0].value) for e in back] == [(settings, {}), (API, 5)]


def test_a_record_read_back_is_the_record_written() -> None:
    exp = Expectation(
        ResourceRef("example.com/v1", "Widget", "w1", "other", "eu-2"),
        [FieldRecord(".spec.size", "L", {"eu-1": "M"})],
    )
    doc = record_document(None, "payments", [exp])
    assert read_expectations({STATE_KEY: doc}, "payments") == [exp]


@pytest.mark.parametrize(
    "section",
    [
        ["not", "a", "mapping"],
        {"resources": "deployment/api"},
        {"resources": [{"namespace": "payments"}]},
        {"resources": [{"resource": "apps/v1/Deployment/api", "fields": [{"value": 3}]}]},
        {"resources": [{"resource": "apps/v1/Deployment/api", "fields": [{"path": "spec"}]}]},
    ],
)
def test_a_record_edited_out_of_shape_is_a_usage_error_naming_the_key(section: Any) -> None:
    with pytest.raises(UsageError, match="drift record in the deployment's state"):
        read_expectations({STATE_KEY: section}, "payments")


# ------------------------------------------------------------------ findings


def test_drift_names_the_field_both_values_and_who_changed_it() -> None:
    exp = Expectation(API, [FieldRecord(".spec.replicas", 3)])
    fields = [entry("kubectl-edit", "2026-12-02T10:00:00Z", {"f:spec": {"f:replicas": {}}})]
    found = compare("eu-1", exp, deployment(7, fields=fields))
    assert found.status is Status.DRIFTED
    [d] = found.fields
    assert (d.path, d.recorded, d.actual) == (".spec.replicas", 3, 7)
    assert d.changed_by is not None and d.changed_by.manager == "kubectl-edit"
    assert found.to_doc()["fields"][0]["changed_by"]["manager"] == "kubectl-edit"


def _findings(statuses: list[Status]) -> list[Finding]:
    return [Finding(c, API, s) for c, s in zip(MEMBERS, statuses, strict=True)]


def test_unobservable_never_counts_as_drift_and_a_majority_unseen_is_unsure() -> None:
    exp = [Expectation(API, [])]
    one_unseen = verdict(_findings([Status.MATCH, Status.MATCH, Status.UNOBSERVABLE]), exp, MEMBERS)
    assert not one_unseen.confirmed and not one_unseen.unsure and len(one_unseen.unobservable) == 1
    two_unseen = verdict(_findings([Status.MATCH, Status.UNOBSERVABLE, Status.UNOBSERVABLE]), exp, MEMBERS)
    assert not two_unseen.confirmed and two_unseen.unsure == [API.label]


def test_drift_seen_anywhere_is_confirmed_whatever_the_others() -> None:
    exp = [Expectation(API, [])]
    v = verdict(_findings([Status.GONE, Status.UNOBSERVABLE, Status.UNOBSERVABLE]), exp, MEMBERS)
    assert v.confirmed and [f.cluster for f in v.drifted] == ["eu-1"]


def test_a_resource_watched_on_one_member_needs_that_member() -> None:
    ref = ResourceRef("apps/v1", "Deployment", "api", "payments", "eu-2")
    exp = [Expectation(ref, [])]
    assert verdict([Finding("eu-2", ref, Status.UNOBSERVABLE)], exp, MEMBERS).unsure == [ref.label]
    assert not verdict([Finding("eu-2", ref, Status.MATCH)], exp, MEMBERS).unsure


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from(MEMBERS), json_values, min_size=1))
def test_a_fresh_record_matches_what_it_was_made_from(values: dict[str, Any]) -> None:
    objects = {c: {"spec": {"x": v}} for c, v in values.items()}
    exp = expectation_from(API, [".spec.x"], objects)
    for cluster, obj in objects.items():
        assert compare(cluster, exp, obj).status is Status.MATCH


# ------------------------------------------------------------------ the rights a check needs


@pytest.mark.parametrize(
    ("kind", "plural"),
    [
        ("Deployment", "deployments"),
        ("ConfigMap", "configmaps"),
        ("CronJob", "cronjobs"),
        ("Widget", "widgets"),
        ("Policy", "policies"),
        ("Gateway", "gateways"),
        ("Ingress", "ingresses"),
        ("Endpoints", "endpoints"),
    ],
)
def test_the_rbac_resource_of_a_kind_is_its_plural(kind: str, plural: str) -> None:
    from coordinator.ops.rbac import plural_of

    assert plural_of(kind) == plural


def test_rbac_for_drift_reads_each_watched_object_by_name_and_takes_nothing_from_other_grants() -> None:
    from coordinator.ops import rbac

    refs = [parse_resource(r, "payments") for r in ("deployment/api", "deploy/web", "cm/api-settings")]
    role = rbac.drift_role("payments", refs)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["api-settings"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["api", "web"], "verbs": ["get"]},
    ]
    assert all(rbac.rule_note(r) == rbac.DRIFT_NOTE for r in role["rules"])
    # Another set of resources is another Role: applying it leaves this one as it is.
    other = rbac.drift_role("payments", refs[:1])
    assert other["metadata"]["name"] != role["metadata"]["name"]
    assert rbac.drift_role("payments", list(reversed(refs)))["metadata"]["name"] == role["metadata"]["name"]
    objects = rbac.manifests("payments", rbac.Subject.user("alice"), ["payments"], drift=refs)
    kinds = [o["kind"] for o in objects]
    assert kinds.index("Role") < kinds.index("RoleBinding") and kinds.count("Role") == 2
    assert [o["roleRef"]["name"] for o in objects if o["kind"] == "RoleBinding"][-1] == role["metadata"]["name"]
    assert kinds.count("ClusterRole") == 1  # nothing cluster-scoped is watched


def test_rbac_for_drift_grants_cluster_scoped_kinds_in_a_cluster_role() -> None:
    """Found by an outside attack: a StorageClass was granted in a namespaced Role, which
    cannot grant it, so the check was always forbidden (unobservable)."""
    from coordinator.ops import rbac

    refs = [parse_resource(r, "payments") for r in ("storage.k8s.io/v1/StorageClass/fast", "cm/api-settings")]
    objects = rbac.manifests("payments", rbac.Subject.user("alice"), ["payments"], drift=refs)
    reads = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].startswith(rbac.DRIFT_ROLE)]
    assert [r["rules"] for r in reads] == [
        [
            {
                "apiGroups": ["storage.k8s.io"],
                "resources": ["storageclasses"],
                "resourceNames": ["fast"],
                "verbs": ["get"],
            }
        ]
    ]
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].startswith(rbac.DRIFT_ROLE))
    assert [r["resources"] for r in role["rules"]] == [["configmaps"]]
    bound = [
        o for o in objects if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == reads[0]["metadata"]["name"]
    ]
    assert len(bound) == 1 and bound[0]["subjects"] == [
        {"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}
    ]
