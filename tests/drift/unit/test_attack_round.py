"""Cases an outside attack on drift found (docs/regressions.md): values that Python calls
equal and JSON does not, a writer named for a field it never wrote, a record that counts one
resource twice or names a namespace that is no namespace (coordinator/rules/expectations.py)."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.errors import UsageError
from coordinator.rules.expectations import (
    STATE_KEY,
    Finding,
    ResourceRef,
    Status,
    compare,
    expectation_from,
    last_change,
    read_expectations,
    verdict,
)
from coordinator.rules.fieldpaths import parse_field, same_json

WIDGET = ResourceRef("example.com/v1", "Widget", "w1", "payments")
MEMBERS = ["eu-1", "eu-2", "eu-3"]


def widget(spec: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "w1", "namespace": "payments"}
    if fields is not None:
        meta["managedFields"] = fields
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta, "spec": spec}


def entry(manager: str, time: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "operation": "Update", "time": time, "fieldsV1": fields}


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (True, 1, False),
        (False, 0, False),
        ({"x": [True]}, {"x": [1]}, False),
        (1, 1.0, True),
        ("1", 1, False),
        (None, None, True),
        ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, True),
        ([1, 2], [2, 1], False),
    ],
)
def test_json_values_are_equal_as_json_says(a: Any, b: Any, same: bool) -> None:
    assert same_json(a, b) is same and same_json(b, a) is same


def test_a_boolean_edited_to_a_number_is_drift() -> None:
    recorded = expectation_from(WIDGET, [".spec.enabled", ".spec.level", ".spec"], {
        c: widget({"enabled": True, "level": 0}) for c in MEMBERS
    })  # fmt: skip
    found = compare("eu-1", recorded, widget({"enabled": 1, "level": False}))
    assert found.status is Status.DRIFTED
    assert [f.path for f in found.fields] == [".spec.enabled", ".spec.level", ".spec"]


def test_a_record_keeps_the_value_most_members_hold_when_python_would_mix_them() -> None:
    objects = {"eu-1": widget({"enabled": 1}), "eu-2": widget({"enabled": True}), "eu-3": widget({"enabled": True})}
    [field] = expectation_from(WIDGET, [".spec.enabled"], objects).fields
    assert field.value is True and field.clusters == {"eu-1": 1}


def test_the_owner_of_a_list_element_is_found_by_its_key_not_any_element() -> None:
    containers = {
        'k:{"name":"api"}': {"f:image": {}},
        'k:{"name":"sidecar"}': {"f:image": {}},
    }
    fields = [
        entry(
            "kubectl-set", "2026-12-06T22:08:42Z", {"f:spec": {"f:containers": {'k:{"name":"api"}': {"f:image": {}}}}}
        ),
        entry(
            "sidecar-bot",
            "2026-12-06T22:08:44Z",
            {"f:spec": {"f:containers": {'k:{"name":"sidecar"}': {"f:image": {}}}}},
        ),
        entry("creator", "2026-12-01T00:00:00Z", {"f:spec": {"f:containers": containers}}),
    ]
    obj = widget(
        {"containers": [{"name": "api", "image": "api:hotfix"}, {"name": "sidecar", "image": "sc:1.1"}]}, fields
    )
    for path, recorded in (
        ('.spec.containers[?(@.name=="api")].image', ["api:1.2.0"]),
        (".spec.containers[0].image", "api:1.2.0"),
        (".spec.containers[*].image", ["api:1.2.0", "sc:1.1"]),
    ):
        change = last_change(obj, path, recorded)
        assert change is not None and (change.manager, change.exact) == ("kubectl-set", True), path


def test_a_field_the_server_defaulted_is_nobodys_not_its_neighbours_writer() -> None:
    """A CRD's schema default added spec.color to an object nobody edited: the map
    differs in a key no entry owns, so no writer is named as exact."""
    fields = [entry("kubectl-client-side-apply", "2026-12-01T00:00:00Z", {"f:spec": {"f:size": {}}})]
    obj = widget({"size": "L", "color": "red"}, fields)
    change = last_change(obj, ".spec", {"size": "L"})
    assert change is not None and not change.exact
    # the writer of the key that did change is named
    assert last_change(widget({"size": "XL"}, fields), ".spec", {"size": "L"}) == last_change(
        widget({"size": "XL"}, fields), ".spec.size"
    )


def test_elements_added_or_removed_name_no_exact_writer() -> None:
    fields = [entry("a", "2026-12-01T00:00:00Z", {"f:spec": {"f:containers": {'k:{"name":"api"}': {"f:image": {}}}}})]
    obj = widget({"containers": [{"name": "api", "image": "x"}, {"name": "new", "image": "y"}]}, fields)
    change = last_change(obj, ".spec.containers[*].image", ["x"])
    assert change is not None and not change.exact


def _record(*items: dict[str, Any]) -> dict[str, Any]:
    return {STATE_KEY: {"resources": list(items)}}


def test_a_record_that_lists_one_resource_twice_is_refused() -> None:
    """Listed twice, one member's findings counted twice made a resource seen on one
    member of three pass for seen on a majority (exit 0)."""
    item = {"resource": "example.com/v1/Widget/w1", "fields": [{"path": ".spec.enabled", "value": True}]}
    for twice in (item, {**item, "namespace": "payments"}):  # the deployment's namespace, said or not
        with pytest.raises(UsageError, match="repeats resource 1"):
            read_expectations(_record(item, twice), "payments")
    # the same name in another namespace, or on one member, is another resource
    assert len(read_expectations(_record(item, {**item, "namespace": "other"}), "payments")) == 2
    assert len(read_expectations(_record(item, {**item, "cluster": "eu-1"}), "payments")) == 2


def test_a_seen_minority_never_passes_for_a_majority() -> None:
    [exp] = read_expectations(_record({"resource": "example.com/v1/Widget/w1", "fields": []}), "payments")
    seen = compare("eu-1", exp, widget({}))
    assert verdict([seen], [exp], MEMBERS).unsure == [WIDGET.label]


@pytest.mark.parametrize(
    "item",
    [
        {"resource": "v1/ConfigMap/ghost", "namespace": "payments/configmaps/api-settings#"},
        {"resource": "v1/ConfigMap/ghost", "namespace": "payments/configmaps/nonexistent/../../.."},
        {"resource": "v1/ConfigMap/ghost", "namespace": "payments\n"},
        {"resource": "v1/ConfigMap/ghost", "cluster": "eu-1/x"},
        {"resource": "v1/ConfigMap/ghost", "cluster": 3},
        {"resource": "v1/ConfigMap/ghost\n"},
    ],
)
def test_a_record_naming_no_namespace_cluster_or_name_is_refused(item: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="cannot be read"):
        read_expectations(_record(item), "payments")


# -- the second attack round


def test_an_object_a_member_answered_but_could_not_be_read_leaves_nobody_to_vouch() -> None:
    """Nested deeper than the client decodes (a managedFields entry 1100 levels deep is
    accepted by the API server), a hand-edited object was unobservable on one member of
    three and the check passed with the two others (exit 0, the step ran)."""
    [exp] = read_expectations(_record({"resource": "example.com/v1/Widget/w1", "fields": []}), "payments")
    seen = [compare(c, exp, widget({})) for c in ("eu-2", "eu-3")]
    hidden = Finding("eu-1", exp.ref, Status.UNOBSERVABLE, "answered, cannot be read", unreadable=True)
    assert verdict([*seen, hidden], [exp], MEMBERS).unsure == [WIDGET.label]
    plain = Finding("eu-1", exp.ref, Status.UNOBSERVABLE, "unreachable")
    assert verdict([*seen, plain], [exp], MEMBERS).unsure == []  # a majority seen, nothing odd


@pytest.mark.parametrize(
    "path",
    [
        ".spec.replicas * 0",
        ".spec.`len`",
        ".metadata.`parent`",
        '.spec.template.spec.containers[?(@.name =~ "(")].image',
    ],
)
def test_a_field_outside_kubectls_jsonpath_is_refused(path: str) -> None:
    with pytest.raises(UsageError, match="only kubectl's JSONPath"):
        parse_field(path)
    item = {"resource": "example.com/v1/Widget/w1", "fields": [{"path": path, "value": 1}]}
    with pytest.raises(UsageError, match="cannot be read"):
        read_expectations(_record(item), "payments")


def test_a_managed_fields_key_nested_too_deeply_is_nobodys_and_no_crash() -> None:
    deep = "v:" + "[" * 3000 + "]" * 3000
    fields = [entry("mallory", "2026-12-06T22:00:00Z", {"f:spec": {"f:items": {deep: {}}}})]
    change = last_change(widget({"items": ["a"]}, fields), ".spec.items[0]", "b")
    assert change is not None and not change.exact
