"""`coordinator drift` on real API servers: hand edits by kubectl reported with their field
manager, deleted resources as gone, and members that cannot be read (paused, read rights
removed, the kind no longer served) as unobservable, never gone, and one whose context leads
to another cluster as an identity mismatch (exit 5); `lock run --check-drift` refusing to
start; recording again clearing the drift."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from coord_fixtures import UNHURRIED, Env
from faults.kubectl import kubectl

integration = pytest.mark.integration

APP = """
apiVersion: apps/v1
kind: Deployment
metadata: {{name: api}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: api}}}}
  template:
    metadata: {{labels: {{app: api}}}}
    spec: {{containers: [{{name: api, image: "registry.example/api:{version}"}}]}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: api-settings}}
data: {{mode: fast}}
"""

DRIFT_EXIT = 8


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}{proc.stdout[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def kube(env: Env, index: int, *args: str, stdin: str | None = None) -> str:
    proc = kubectl(env.kubeconfig, index, env.namespace, *args, stdin=stdin, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def deploy_app(env: Env, version: str = "1.2.0") -> None:
    for i in (1, 2, 3):
        kube(env, i, "apply", "-f", "-", stdin=APP.format(version=version))


# `coordinator` as the child of `lock run`, from this interpreter's environment.
COORDINATOR = (sys.executable, "-m", "coordinator")


def record(env: Env, *args: str) -> str:
    """`drift record` under a `lock run` of its own."""
    return ok(env.cli("lock", "run", "web", "--", *COORDINATOR, "drift", "record", "web", *args, env=UNHURRIED))


def check(env: Env, *, expect: int, environ: dict[str, str] | None = None) -> dict[tuple[str, str], Any]:
    """`drift web -o json`: the exit status checked; the findings by (cluster, kind)."""
    proc = env.cli("-o", "json", "drift", "web", env=environ if environ is not None else UNHURRIED)
    assert proc.returncode == expect, f"exit {proc.returncode}: {proc.stderr}{proc.stdout[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return {(f["cluster"], f["resource"].split("/")[-2]): f for f in doc["findings"]}


def statuses(found: dict[tuple[str, str], Any]) -> dict[tuple[str, str], str]:
    return {k: f["status"] for k, f in found.items()}


def all_match() -> dict[tuple[str, str], str]:
    return {(c, k): "match" for c in ("c1", "c2", "c3") for k in ("Deployment", "ConfigMap")}


@integration
def test_a_hand_edit_is_drifted_with_its_field_manager_and_recording_again_clears_it(dep3: Env) -> None:
    deploy_app(dep3)
    printed = record(dep3, "deployment/api", "configmap/api-settings")
    assert "Recorded Deployment" in printed and ".spec.replicas = 3" in printed, printed
    assert statuses(check(dep3, expect=0)) == all_match()
    # The state keeps the record under its documented key.
    stored = json.loads(ok(dep3.cli("-o", "json", "state", "get", "web", "drift", env=UNHURRIED)))
    assert {r["resource"] for r in stored["resources"]} == {"apps/v1/Deployment/api", "v1/ConfigMap/api-settings"}

    edit = subprocess.run(
        ["kubectl", "--kubeconfig", dep3.kubeconfig, "--context", "sandbox-2", "-n", dep3.namespace,
         "edit", "deployment", "api"],
        env={**dep3.environ(), "EDITOR": "sed -i s/api:1.2.0/api:1.2.1-hotfix/", "KUBE_EDITOR": ""},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert edit.returncode == 0, edit.stderr
    found = check(dep3, expect=DRIFT_EXIT)
    assert statuses(found) == {**all_match(), ("c2", "Deployment"): "drifted"}
    [field] = found[("c2", "Deployment")]["fields"]
    assert field["path"] == ".spec.template.spec.containers[*].image"
    assert field["recorded"] == ["registry.example/api:1.2.0"]
    assert field["actual"] == ["registry.example/api:1.2.1-hotfix"]
    assert field["changed_by"]["manager"] == "kubectl-edit" and field["changed_by"]["exact"]
    assert field["changed_by"]["time"]

    # For people: the table, then who changed what, and the error paragraph.
    proc = dep3.cli("drift", "web", env={**UNHURRIED, "COLUMNS": "80"})
    assert proc.returncode == DRIFT_EXIT
    assert "c2: Deployment" in proc.stdout and "changed by kubectl-edit (Update) at" in proc.stdout, proc.stdout
    assert "has drifted from its record" in proc.stderr and "on c2" in proc.stderr, proc.stderr

    # Recording again takes the edit as the record: no drift.
    printed = record(dep3, "deployment/api")
    assert '(c2: ["registry.example/api:1.2.1-hotfix"])' in printed, printed
    assert statuses(check(dep3, expect=0)) == all_match()


@integration
def test_a_deleted_resource_is_gone_and_check_drift_stops_a_lock_run(dep3: Env, tmp_path: Path) -> None:
    deploy_app(dep3)
    # Nothing recorded yet: the command runs, and the check says there was nothing to check.
    first = dep3.cli("lock", "run", "web", "--check-drift", "--", "true", env=UNHURRIED)
    assert first.returncode == 0 and "nothing is watched for drift in web" in first.stderr, first.stderr
    record(dep3, "deployment/api", "configmap/api-settings")
    kube(dep3, 3, "delete", "configmap", "api-settings")
    found = check(dep3, expect=DRIFT_EXIT)
    assert statuses(found) == {**all_match(), ("c3", "ConfigMap"): "gone"}
    assert dep3.namespace in found[("c3", "ConfigMap")]["detail"]

    marker = tmp_path / "ran"
    run = dep3.cli("lock", "run", "web", "--check-drift", "--", "touch", str(marker), env=UNHURRIED)
    assert run.returncode == DRIFT_EXIT, run.stderr
    assert not marker.exists()
    assert "ConfigMap" in run.stderr and "was not run; released it again" in run.stderr, run.stderr
    status = json.loads(ok(dep3.cli("-o", "json", "lock", "status", "web", env=UNHURRIED)))
    assert status["holder"] is None, status

    kube(dep3, 3, "apply", "-f", "-", stdin=APP.format(version="1.2.0"))
    ok(dep3.cli("lock", "run", "web", "--check-drift", "--", "touch", str(marker), env=UNHURRIED))
    assert marker.exists()


@integration
def test_a_paused_member_is_unobservable_never_gone(dep3: Env) -> None:
    deploy_app(dep3)
    record(dep3, "deployment/api", "configmap/api-settings")
    # Deleted on c3, then c3 stops answering: what it holds is not known.
    kube(dep3, 3, "delete", "configmap", "api-settings")
    dep3.sandbox.pause(3)
    try:
        # Every request to c3 costs the whole timeout: shorter than UNHURRIED, long enough
        # for c1 and c2 to answer on a loaded machine.
        found = check(dep3, expect=0, environ={"COORDINATOR_TIMEOUT": "8s"})
    finally:
        dep3.sandbox.resume(3)
    assert statuses(found) == {
        **all_match(),
        ("c3", "Deployment"): "unobservable",
        ("c3", "ConfigMap"): "unobservable",
    }
    assert "unreachable" in found[("c3", "ConfigMap")]["detail"]
    assert statuses(check(dep3, expect=DRIFT_EXIT))[("c3", "ConfigMap")] == "gone"


@integration
def test_a_member_whose_read_rights_are_removed_is_unobservable_never_gone(dep3: Env, tmp_path: Path) -> None:
    from helpers.rbac import connect, grant, mint_user, user_env

    deploy_app(dep3)
    user, minted = mint_user(dep3.sandbox, tmp_path, "reader")
    env = user_env(dep3.sandbox, tmp_path, dep3.namespace, "reader")
    watched = ("--drift", "deployment/api", "--drift", "configmap/api-settings")
    objects = grant(dep3.sandbox, env, dep3.namespace, user, deployments=("app",), flags=watched)
    [reads] = [o["metadata"]["name"] for o in objects if o["kind"] == "RoleBinding" and "drift-reads" in str(o)]
    connect(env, minted)
    members = ["--cluster", "u1", "--cluster", "u2", "--cluster", "u3"]
    ok(env.cli("deployment", "create", "app", "-n", dep3.namespace, *members, env=UNHURRIED))
    ok(
        env.cli(
            "lock", "run", "app", "--", *COORDINATOR, "drift", "record", "app", "deployment/api",
            "configmap/api-settings", env=UNHURRIED,
        )
    )  # fmt: skip

    # Exactly what `rbac print --drift` grants lets the user record and check; then the read
    # rights go on u3, and the ConfigMap with them: u3 is not seen, so not gone.
    kube(dep3, 3, "delete", "rolebinding", reads)
    kube(dep3, 3, "delete", "configmap", "api-settings")
    proc = env.cli("-o", "json", "drift", "app", env=UNHURRIED)
    assert proc.returncode == 0, proc.stderr
    found = {(f["cluster"], f["resource"].split("/")[-2]): f for f in json.loads(proc.stdout)["findings"]}
    assert found[("u3", "ConfigMap")]["status"] == "unobservable", found
    assert found[("u3", "ConfigMap")]["detail"].startswith("forbidden"), found
    assert found[("u3", "Deployment")]["status"] == "unobservable"
    assert {k: f["status"] for k, f in found.items() if k[0] != "u3"} == {
        (c, k): "match" for c in ("u1", "u2") for k in ("Deployment", "ConfigMap")
    }


CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.drift.example.com}
spec:
  group: drift.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: string}
"""

WIDGET = """
apiVersion: drift.example.com/v1
kind: Widget
metadata: {name: w1}
spec: {size: L}
"""


@integration
def test_a_custom_kind_is_watched_and_a_kind_no_longer_served_is_unobservable(dep3: Env) -> None:
    # The CRD is cluster-wide: it stays for the other tests of the sandbox (none uses it).
    for i in (1, 2, 3):
        kube(dep3, i, "apply", "-f", "-", stdin=CRD)
        kube(dep3, i, "wait", "--for", "condition=Established", "crd/widgets.drift.example.com", "--timeout", "60s")
        kube(dep3, i, "apply", "-f", "-", stdin=WIDGET)

    # A kind no member serves cannot be recorded.
    proc = dep3.cli(
        "lock", "run", "web", "--", *COORDINATOR, "drift", "record", "web", "drift.example.com/v1/Gadget/g1",
        env=UNHURRIED,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "serves no kind Gadget" in proc.stderr and "Nothing was recorded" in proc.stderr, proc.stderr

    # A field no member has (a typo) would be recorded as null and match for ever: refused.
    typo = dep3.cli(
        "lock", "run", "web", "--", *COORDINATOR, "drift", "record", "web", "drift.example.com/v1/Widget/w1",
        "--field", ".spec.sise", env=UNHURRIED,
    )  # fmt: skip
    assert typo.returncode == 2, typo.stderr
    assert "No member has the field .spec.sise in Widget" in typo.stderr, typo.stderr
    record(dep3, "drift.example.com/v1/Widget/w1", "--field", ".spec.size")
    kube(dep3, 1, "patch", "widget", "w1", "--type", "merge", "-p", '{"spec": {"size": "XL"}}')
    found = {k[0]: f for k, f in check(dep3, expect=DRIFT_EXIT).items()}
    assert [found[c]["status"] for c in ("c1", "c2", "c3")] == ["drifted", "match", "match"]
    assert found["c1"]["fields"][0]["changed_by"]["manager"] == "kubectl-patch"

    # The kind goes away on c3 (its CRD deleted, and its objects with it): not served is
    # not seen, so c3 is unobservable, not gone.
    kube(dep3, 3, "delete", "crd", "widgets.drift.example.com", "--wait=true")
    found = {k[0]: f for k, f in check(dep3, expect=DRIFT_EXIT).items()}
    assert found["c3"]["status"] == "unobservable", found["c3"]
    assert "does not serve drift.example.com/v1" in found["c3"]["detail"], found["c3"]


@integration
def test_a_member_whose_context_leads_elsewhere_stops_the_check_never_a_match(dep3: Env, tmp_path: Path) -> None:
    import yaml

    deploy_app(dep3)
    record(dep3, "deployment/api", "configmap/api-settings")
    kube(dep3, 3, "delete", "configmap", "api-settings")
    # c3's context now leads to cluster 1, which still has the ConfigMap: without the
    # identity gate c3 would read as a match, and the deletion would go unseen.
    doc = yaml.safe_load(Path(dep3.kubeconfig).read_text())
    contexts = {c["name"]: c for c in doc["contexts"]}
    contexts["sandbox-3"]["context"]["cluster"] = contexts["sandbox-1"]["context"]["cluster"]
    kubeconfig = tmp_path / "repointed.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc))
    config = yaml.safe_load(dep3.config.read_text())
    config["clusters"]["c3"]["kubeconfig"] = str(kubeconfig)
    other = tmp_path / "repointed" / "config.yaml"
    other.parent.mkdir()
    other.write_text(yaml.safe_dump(config))
    for command in (("drift", "web"), ("lock", "run", "web", "--check-drift", "--", "true")):
        proc = dep3.cli(*command, env={**UNHURRIED, "COORDINATOR_CONFIG": str(other)})
        assert proc.returncode == 5, f"{command}: exit {proc.returncode}: {proc.stderr}"
        # `lock run` meets it already taking the lock; `drift` at its first read.
        assert "identity" in proc.stderr and "'c3' was connected as" in proc.stderr, proc.stderr
        assert "match" not in proc.stdout and "gone" not in proc.stdout, proc.stdout


GADGETS = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.drift.example.com}
spec:
  group: drift.example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
  - name: v2
    served: true
    storage: false
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


@integration
def test_a_version_no_longer_served_after_discovery_is_unobservable_never_gone(dep3: Env) -> None:
    """Found by an outside attack: a version of a CRD flipped to not served while a check
    ran made its existing objects `gone` (exit 8), because the 404 of a path the server no
    longer serves was taken for the object's absence. The server's NotFound names the
    object it did not find; the 404 of an unserved path names none."""
    import anyio

    from coordinator.kube.client import KubeError
    from coordinator.ops.drift import _read
    from coordinator.rules.expectations import parse_resource

    kube(dep3, 1, "apply", "-f", "-", stdin=GADGETS)
    kube(dep3, 1, "wait", "--for", "condition=Established", "crd/gadgets.drift.example.com", "--timeout", "60s")
    kube(dep3, 1, "apply", "-f", "-", stdin="apiVersion: drift.example.com/v1\nkind: Gadget\nmetadata: {name: g1}\n")
    ref = parse_resource("drift.example.com/v1/Gadget/g1", dep3.namespace)
    missing = parse_resource("drift.example.com/v2/Gadget/nothing-here", dep3.namespace)

    async def go() -> None:
        client = dep3.client(1)
        try:
            cache: dict[str, Any] = {}
            assert (await _read(client, ref, cache)).obj is not None  # discovery: v1 served
            gone = await _read(client, missing, cache)
            assert gone.gone and not gone.unobservable, gone  # the server named the object
            kube(dep3, 1, "patch", "crd", "gadgets.drift.example.com", "--type", "json",
                 "-p", '[{"op": "replace", "path": "/spec/versions/0/served", "value": false}]')  # fmt: skip
            path = f"/apis/drift.example.com/v1/namespaces/{dep3.namespace}/gadgets/g1"
            with anyio.fail_after(60):
                while True:
                    try:
                        await client.request("GET", path)
                    except KubeError as err:
                        assert err.status == 404 and err.named is None, (err.status, err.named, err.detail)
                        break
                    await anyio.sleep(0.2)
            read = await _read(client, ref, cache)  # the discovery cache still says served
            assert read.unobservable and not read.gone and read.obj is None, read
            assert "no longer serves drift.example.com/v1" in read.unobservable, read
        finally:
            await client.close()

    anyio.run(go)


THINGS = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: things.drift.example.com}}
spec:
  group: drift.example.com
  scope: {scope}
  names: {{plural: things, singular: thing, kind: Thing}}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
"""


@integration
def test_a_kind_made_again_in_another_scope_is_never_a_match(dep3: Env) -> None:
    """Found by an outside attack: on one member the namespaced kind was deleted (its
    objects with it) and made again cluster-scoped, with an object of the same name and
    spec. Discovery led the check to that other object: a match (exit 0). The record notes
    the scope the members served; another scope now is no match, and nobody can vouch."""
    thing = "apiVersion: drift.example.com/v1\nkind: Thing\nmetadata: {name: t1}\nspec: {size: 3}\n"
    for i in (1, 2, 3):
        kube(dep3, i, "apply", "-f", "-", stdin=THINGS.format(scope="Namespaced"))
        kube(dep3, i, "wait", "--for", "condition=Established", "crd/things.drift.example.com", "--timeout", "60s")
        kube(dep3, i, "apply", "-f", "-", stdin=thing)
    record(dep3, "drift.example.com/v1/Thing/t1", "--field", ".spec")
    state = json.loads(ok(dep3.cli("-o", "json", "state", "get", "web", "drift", env=UNHURRIED)))
    assert [r.get("scope") for r in state["resources"] if r["resource"].endswith("/Thing/t1")] == ["Namespaced"]

    kube(dep3, 3, "delete", "crd", "things.drift.example.com", "--wait=true")
    kube(dep3, 3, "apply", "-f", "-", stdin=THINGS.format(scope="Cluster"))
    kube(dep3, 3, "wait", "--for", "condition=Established", "crd/things.drift.example.com", "--timeout", "60s")
    # kubectl's discovery cache still has the kind namespaced: made with a plain request
    admin, deadline = dep3.sandbox.admin(3), time.monotonic() + 60
    body = {"apiVersion": "drift.example.com/v1", "kind": "Thing", "metadata": {"name": "t1"}, "spec": {"size": 3}}
    while admin.request("POST", "/apis/drift.example.com/v1/things", body).status not in (201, 409):
        assert time.monotonic() < deadline, "the cluster-scoped kind was never served"
        time.sleep(0.3)
    proc = dep3.cli("-o", "json", "drift", "web", env=UNHURRIED)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    [c3] = [f for f in report["findings"] if f["cluster"] == "c3" and f["resource"].endswith("/Thing/t1")]
    assert c3["status"] == "unobservable" and "now serves Thing cluster-scoped" in c3["detail"], c3
    assert any("Thing" in label for label in report["unsure"]), report
    kube(dep3, 3, "delete", "crd", "things.drift.example.com", "--wait=true")
