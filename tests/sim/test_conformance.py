"""The in-memory API server (tests/sim/apiserver.py) against a real kube-apiserver.

Every test runs twice, through the product's own client: against the in-memory server
(``[sim]``, a unit test) and against the first cluster of the session's sandbox
(``[real]``, an integration test). The assertions say what the real server does, as
far as coordinator's engines depend on it; when the two differ, the in-memory server
is wrong.

What cannot be made to happen on a real server on demand is compared by the shape the
client sees, in the tests marked ``sim only`` at the end: a 429 from API Priority and
Fairness (tests/kube/integration/test_throttling.py makes real ones, with a webhook that
holds requests, and checks the same shape), a server whose clock is off (the sandbox's
HA clusters model that with a proxy, tests/sandbox/integration/test_sandbox_ha.py), an answer
lost on the way back, a stopped server.
"""

from __future__ import annotations

import re
import uuid
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from coordinator.kube.client import Endpoint, KubeClient, KubeError
from coordinator.rules.lease import A_TOKEN, A_UID, LeaseView, manager_time
from coordinator.rules.resources import configmaps_path, lease_path, leases_path, namespace_path, secrets_path
from sim.apiserver import World
from sim.targets import Target

JSON = dict[str, Any]
SECOND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")  # a server stamp: whole seconds, UTC
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


async def fails(call: Any) -> KubeError:
    """The KubeError an awaitable raises (a test failure if it succeeds)."""
    try:
        await call
    except KubeError as err:
        return err
    raise AssertionError("the request succeeded")


def fields_of(obj: JSON) -> dict[tuple[str, str], Any]:
    """managedFields by (manager, operation): their fieldsV1."""
    return {(e["manager"], e["operation"]): e.get("fieldsV1") for e in obj["metadata"].get("managedFields", [])}


def times_of(obj: JSON) -> dict[str, str | None]:
    return {e["manager"]: e.get("time") for e in obj["metadata"].get("managedFields", [])}


def cm(name: str, *, data: dict[str, str] | None = None, **meta: Any) -> JSON:
    body: JSON = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}}
    if data is not None:
        body["data"] = data
    return body


def lease(name: str, **spec: Any) -> JSON:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": spec}


def rv(obj: JSON) -> int:
    return int(obj["metadata"]["resourceVersion"])


# --------------------------------------------------------------------------- stamps


def test_a_create_is_stamped_by_the_server(target: Target) -> None:
    """uid, creationTimestamp and managedFields time in whole seconds, a resourceVersion,
    the User-Agent's first word as field manager, and the Date header."""
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        before = datetime.now(UTC).replace(microsecond=0)
        made = await client.request(
            "POST", configmaps_path(ns), body=cm("a", data={"k": "v"}, labels={"x": "y"}, annotations={"p": "q"})
        )
        after = datetime.now(UTC)
        assert made.status == 201
        obj = made.body
        meta = obj["metadata"]
        assert (obj["kind"], obj["apiVersion"], meta["namespace"]) == ("ConfigMap", "v1", ns)
        assert uuid.UUID(meta["uid"]).version == 4
        assert meta["resourceVersion"].isdigit()
        assert SECOND.fullmatch(meta["creationTimestamp"])
        created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
        assert before - timedelta(seconds=5) <= created <= after + timedelta(seconds=5)
        (entry,) = meta["managedFields"]
        assert entry == {
            "manager": "coordinator",  # from the User-Agent: no fieldManager was named
            "operation": "Update",
            "apiVersion": "v1",
            "time": meta["creationTimestamp"],
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:data": {".": {}, "f:k": {}},
                "f:metadata": {"f:annotations": {".": {}, "f:p": {}}, "f:labels": {".": {}, "f:x": {}}},
            },
        }
        assert made.server_time is not None and abs((made.server_time - created).total_seconds()) <= 2
        got = await client.request("GET", f"{configmaps_path(ns)}/a")
        assert got.body == obj and got.server_time is not None
        named = await client.request("POST", configmaps_path(ns), body=cm("b", data={}), query={"fieldManager": "m"})
        assert "data" not in named.body and "managedFields" not in named.body["metadata"]  # nothing owned

    target.run(body)


def test_the_identity_namespace_and_the_version(target: Target) -> None:
    async def body(client: KubeClient) -> None:
        system = (await client.request("GET", namespace_path("kube-system"))).body
        assert uuid.UUID(system["metadata"]["uid"])
        assert system["metadata"]["labels"] == {"kubernetes.io/metadata.name": "kube-system"}
        assert system["status"] == {"phase": "Active"} and system["spec"] == {"finalizers": ["kubernetes"]}
        mine = (await client.request("GET", namespace_path(target.namespace))).body
        assert fields_of(mine) == {
            ("coordinator", "Update"): {"f:metadata": {"f:labels": {".": {}, "f:kubernetes.io/metadata.name": {}}}}
        }
        version = (await client.request("GET", "/version")).body
        assert re.fullmatch(r"v1\.\d+\.\d+.*", version["gitVersion"]) and version["major"] == "1"
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": target.namespace, "verb": "get", "resource": "leases"}},
        }
        answered = await client.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review)
        assert answered.status == 201 and answered.body["status"]["allowed"] is True

    target.run(body)


# --------------------------------------------------------------------------- errors of reads and creates


def test_not_found_and_already_exists(target: Target) -> None:
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        err = await fails(client.request("GET", lease_path(ns, "none")))
        assert (err.kind, err.status, err.detail) == ("not-found", 404, 'leases.coordination.k8s.io "none" not found')
        err = await fails(client.request("GET", f"{configmaps_path(ns)}/none"))
        assert err.detail == 'configmaps "none" not found'
        err = await fails(client.request("GET", f"/api/v1/namespaces/{ns}/widgets/x"))
        assert (err.status, err.detail) == (404, "the server could not find the requested resource")
        err = await fails(client.request("POST", configmaps_path("no-such-ns"), body=cm("a")))
        assert (err.kind, err.detail) == ("not-found", 'namespaces "no-such-ns" not found')
        await client.request("POST", leases_path(ns), body=lease("l"))
        err = await fails(client.request("POST", leases_path(ns), body=lease("l")))
        assert (err.kind, err.status) == ("already-exists", 409)
        assert err.detail == 'leases.coordination.k8s.io "l" already exists'
        err = await fails(client.request("POST", configmaps_path(ns), body=cm("c", resourceVersion="5")))
        assert (err.kind, err.status, err.detail) == (
            "error",
            500,
            "HTTP 500: resourceVersion should not be set on objects to be created",
        )
        err = await fails(client.request("PUT", f"{configmaps_path(ns)}/none", body=cm("none")))
        assert (err.kind, err.detail) == ("not-found", 'configmaps "none" not found')
        err = await fails(client.request("PUT", lease_path(ns, "l"), body=lease("other")))
        assert (err.status, err.detail) == (
            400,
            "HTTP 400: the name of the object (other) does not match the name on the URL (l)",
        )

    target.run(body)


# --------------------------------------------------------------------------- compare-and-swap


def test_an_update_is_a_compare_and_swap_on_the_resource_version(target: Target) -> None:
    ns = target.namespace
    path = lease_path(ns, "l")

    async def body(client: KubeClient) -> None:
        first = (await client.request("POST", leases_path(ns), body=lease("l", holderIdentity="a"))).body
        taken = dict(first, spec={"holderIdentity": "b"})
        second = (await client.request("PUT", path, body=taken, query={"fieldManager": "coordinator"})).body
        assert rv(second) > rv(first) and second["spec"] == {"holderIdentity": "b"}
        stale = dict(first, spec={"holderIdentity": "c"})
        err = await fails(client.request("PUT", path, body=stale))
        assert (err.kind, err.status) == ("conflict", 409)
        assert err.detail == (
            'Operation cannot be fulfilled on leases.coordination.k8s.io "l": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        # The same object again: nothing is written, the resourceVersion stays.
        again = (await client.request("PUT", path, body=second, query={"fieldManager": "other"})).body
        assert again == second
        # No resourceVersion: a Lease is never updated blind; a ConfigMap is.
        err = await fails(client.request("PUT", path, body=lease("l", holderIdentity="d")))
        assert (err.status, err.detail) == (
            422,
            'HTTP 422: leases.coordination.k8s.io "l" is invalid: metadata.resourceVersion: Invalid value: 0: '
            "must be specified for an update",
        )
        # A PUT of a missing Lease creates it, whatever resourceVersion it names (a PUT of
        # a missing ConfigMap is 404, see test_not_found_and_already_exists).
        stale = {**lease("new", holderIdentity="n"), "metadata": {"name": "new", "resourceVersion": "5"}}
        created = await client.request("PUT", lease_path(ns, "new"), body=stale, query={"fieldManager": "q"})
        assert created.status == 201 and rv(created.body) > rv(second)
        assert fields_of(created.body) == {("q", "Update"): {"f:spec": {"f:holderIdentity": {}}}}
        err = await fails(client.request("PUT", lease_path("no-such-ns", "x"), body=lease("x")))
        assert (err.kind, err.detail) == ("not-found", 'namespaces "no-such-ns" not found')
        # The uid a body names is a precondition: no write to another object of the name,
        # and no create in place of a missing one.
        for name, found in (("l", first["metadata"]["uid"]), ("gone", "")):
            other = {**lease(name), "metadata": {"name": name, "uid": "u-1", "resourceVersion": "5"}}
            err = await fails(client.request("PUT", lease_path(ns, name), body=other))
            said = (
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": StorageError: invalid '
                f"object, Code: 4, Key: /registry/leases/{ns}/{name}, ResourceVersion: 0, AdditionalErrorMsg: "
                f"Precondition failed: UID in precondition: u-1, UID in object meta: {found}"
            )
            assert (err.kind, err.detail) == ("conflict", said.strip())  # the client drops a trailing space

    target.run(body)


# --------------------------------------------------------------------------- managedFields


def test_managed_fields_follow_who_changed_what(target: Target) -> None:
    """An update gives its manager the fields it added or changed and takes them from the
    others; a map it makes appear is itself owned ("."); a field removed is taken from
    everyone; a manager that changed nothing gets no entry and no new time."""
    ns = target.namespace
    path = f"{configmaps_path(ns)}/a"

    async def put(client: KubeClient, obj: JSON, manager: str) -> JSON:
        return (await client.request("PUT", path, body=obj, query={"fieldManager": manager})).body

    async def body(client: KubeClient) -> None:
        obj = (
            await client.request("POST", configmaps_path(ns), body=cm("a", data={"k": "v"}, annotations={"p": "q"}))
        ).body
        obj["metadata"]["annotations"]["p2"] = "v2"
        obj = await put(client, obj, "B")
        assert fields_of(obj)[("B", "Update")] == {"f:metadata": {"f:annotations": {"f:p2": {}}}}
        noop = await put(client, obj, "C")
        assert noop == obj and ("C", "Update") not in fields_of(noop)
        del obj["metadata"]["annotations"]
        obj = await put(client, obj, "C")
        assert fields_of(obj) == {("coordinator", "Update"): {"f:data": {".": {}, "f:k": {}}}}  # B's entry is gone
        obj["metadata"]["annotations"] = {"z": "1"}
        obj = await put(client, obj, "E")
        obj["data"]["k"] = "v9"
        obj = await put(client, obj, "E")
        assert fields_of(obj) == {
            ("coordinator", "Update"): {"f:data": {}},  # the map it made appear stays its own
            ("E", "Update"): {"f:data": {"f:k": {}}, "f:metadata": {"f:annotations": {".": {}, "f:z": {}}}},
        }
        assert all(SECOND.fullmatch(t or "") for t in times_of(obj).values())
        # A lease's spec is there in every lease: never owned itself.
        made = (await client.request("POST", leases_path(ns), body=lease("l", holderIdentity="h"))).body
        assert fields_of(made) == {("coordinator", "Update"): {"f:spec": {"f:holderIdentity": {}}}}
        empty = (await client.request("POST", leases_path(ns), body=lease("e"))).body
        assert empty["spec"] == {} and "managedFields" not in empty["metadata"]

    target.run(body)


def test_stripped_managed_fields_stay_stripped_until_an_apply(target: Target) -> None:
    """``managedFields: [{}]`` strips them; updates do not bring them back; an apply does,
    with a ``before-first-apply`` entry for what the object held. Entries a PUT carries
    replace the stored ones."""
    ns = target.namespace
    path = f"{configmaps_path(ns)}/a"

    async def body(client: KubeClient) -> None:
        await client.request("POST", configmaps_path(ns), body=cm("a", data={"x": "1"}))
        stripped = (
            await client.request("PATCH", path, body={"metadata": {"managedFields": [{}]}}, content_type=MERGE)
        ).body
        assert "managedFields" not in stripped["metadata"]
        stripped["data"]["x"] = "2"
        updated = (await client.request("PUT", path, body=stripped, query={"fieldManager": "m"})).body
        assert "managedFields" not in updated["metadata"] and rv(updated) > rv(stripped)
        updated["metadata"]["managedFields"] = []  # an empty list is not a change
        updated["data"]["x"] = "3"
        updated = (await client.request("PUT", path, body=updated, query={"fieldManager": "m"})).body
        assert "managedFields" not in updated["metadata"]
        config = cm("a", annotations={"s": "1"})
        applied = (
            await client.request("PATCH", path, body=config, query={"fieldManager": "S"}, content_type=APPLY)
        ).body
        assert fields_of(applied) == {
            ("S", "Apply"): {"f:metadata": {"f:annotations": {"f:s": {}}}},
            ("before-first-apply", "Update"): {"f:data": {".": {}, "f:x": {}}},
        }
        own = {
            "manager": "y",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2020-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:x": {}}},
        }
        applied["metadata"]["managedFields"] = [own]
        applied["metadata"]["annotations"]["t"] = "2"
        replaced = (await client.request("PUT", path, body=applied, query={"fieldManager": "z"})).body
        assert replaced["metadata"]["managedFields"][0] == own  # kept as given, its time too
        assert fields_of(replaced)[("z", "Update")] == {"f:metadata": {"f:annotations": {"f:t": {}}}}

    target.run(body)


def test_server_side_apply_conflicts_and_force(target: Target) -> None:
    ns = target.namespace
    path = lease_path(ns, "l")

    async def apply(client: KubeClient, config: JSON, manager: str, *, force: bool = False) -> JSON:
        query = {"fieldManager": manager, **({"force": "true"} if force else {})}
        return (await client.request("PATCH", path, body=config, query=query, content_type=APPLY)).body

    async def body(client: KubeClient) -> None:
        created = await apply(client, lease("l", holderIdentity="a", leaseDurationSeconds=10), "coordinator")
        assert fields_of(created) == {
            ("coordinator", "Apply"): {"f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {}}}
        }
        err = await fails(apply(client, lease("l", holderIdentity="b"), "other"))
        assert (err.kind, err.status) == ("conflict", 409)
        assert err.detail == 'Apply failed with 1 conflict: conflict with "coordinator": .spec.holderIdentity'
        made = (await client.request("POST", leases_path(ns), body=lease("u", holderIdentity="a"))).body
        query = {"fieldManager": "other"}
        err = await fails(client.request("PATCH", lease_path(ns, "u"), body=lease("u", holderIdentity="b"),
                                         query=query, content_type=APPLY))  # fmt: skip
        assert err.detail == (  # an Update entry is named with its API version
            'Apply failed with 1 conflict: conflict with "coordinator" using coordination.k8s.io/v1: '
            ".spec.holderIdentity"
        )
        assert made
        forced = await apply(client, lease("l", holderIdentity="b"), "other", force=True)
        assert forced["spec"]["holderIdentity"] == "b"
        assert fields_of(forced) == {
            ("coordinator", "Apply"): {"f:spec": {"f:leaseDurationSeconds": {}}},
            ("other", "Apply"): {"f:spec": {"f:holderIdentity": {}}},
        }
        # The same value as the owner's: shared, no conflict; the object is the same, so
        # the new owner's entry has no time, but the entries changed: a new version.
        shared = await apply(client, lease("l", leaseDurationSeconds=10), "third")
        assert rv(shared) > rv(forced) and shared["spec"] == forced["spec"]
        assert times_of(shared)["third"] is None and SECOND.fullmatch(times_of(shared)["coordinator"] or "")
        again = await apply(client, lease("l", leaseDurationSeconds=10), "third")
        assert rv(again) == rv(shared)
        # A field its applier leaves out, that nobody else owns, is removed; an empty
        # struct applied is owned itself.
        dropped = await apply(client, lease("l"), "other")
        assert "holderIdentity" not in dropped["spec"] and fields_of(dropped)[("other", "Apply")] == {"f:spec": {}}
        err = await fails(client.request("PATCH", path, body=lease("l"), content_type=APPLY))
        assert (err.status, err.detail) == (
            422,
            'HTTP 422: PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for '
            "apply patch",
        )
        stale = {**lease("l"), "metadata": {"name": "l", "resourceVersion": created["metadata"]["resourceVersion"]}}
        err = await fails(apply(client, stale, "other"))
        assert err.kind == "conflict" and "the object has been modified" in err.detail
        # YAML as the server reads it: YAML 1.1, where a bare y is true.
        text = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: l\nspec:\n  holderIdentity: {}\n"
        err = await fails(apply(client, text.format("y").encode(), "yaml", force=True))  # type: ignore[arg-type]
        assert err.status == 500 and err.detail.startswith("HTTP 500: failed to create typed patch object (/l; ")
        from_yaml = await apply(client, text.format("hy").encode(), "yaml", force=True)  # type: ignore[arg-type]
        assert from_yaml["spec"]["holderIdentity"] == "hy"

    target.run(body)


# --------------------------------------------------------------------------- patches


def test_merge_strategic_and_json_patches(target: Target) -> None:
    ns = target.namespace
    path = lease_path(ns, "l")

    async def body(client: KubeClient) -> None:
        made = (await client.request("POST", leases_path(ns), body=lease("l", holderIdentity="a"))).body
        patched = (
            await client.request(
                "PATCH", path, body={"metadata": {"annotations": {"m": "1"}}, "spec": {"holderIdentity": None}},
                content_type=MERGE,
            )
        ).body  # fmt: skip
        assert patched["spec"] == {} and patched["metadata"]["annotations"] == {"m": "1"}
        assert fields_of(patched) == {
            ("coordinator", "Update"): {"f:metadata": {"f:annotations": {".": {}, "f:m": {}}}}
        }
        strategic = (
            await client.request(
                "PATCH", path, body={"metadata": {"annotations": {"n": "2"}}}, query={"fieldManager": "kubectl-patch"},
                content_type="application/strategic-merge-patch+json",
            )
        ).body  # fmt: skip
        assert strategic["metadata"]["annotations"] == {"m": "1", "n": "2"}
        ops = [{"op": "add", "path": "/spec/holderIdentity", "value": "j"}]
        jsoned = (await client.request("PATCH", path, body=ops, content_type="application/json-patch+json")).body
        assert jsoned["spec"] == {"holderIdentity": "j"}
        stale = {"metadata": {"resourceVersion": made["metadata"]["resourceVersion"], "annotations": {"o": "3"}}}
        err = await fails(client.request("PATCH", path, body=stale, content_type=MERGE))
        assert err.kind == "conflict"
        err = await fails(client.request("PATCH", lease_path(ns, "none"), body={}, content_type=MERGE))
        assert err.kind == "not-found"
        err = await fails(client.request("PATCH", path, body={}))
        assert (err.status, err.detail) == (415, "HTTP 415: 415: Unsupported Media Type")

    target.run(body)


# --------------------------------------------------------------------------- what the server checks


def test_a_lease_as_the_lock_rules_read_it_after_other_clients_edits(target: Target) -> None:
    """The stamps the lock rules read (``LeaseView.parse``) through other clients' edits:
    an annotation under another field manager leaves coordinator's write time where it
    was; a duration another manager set is not coordinator's until coordinator writes it
    again; stripped managedFields leave no write time and no verified uid note, and the
    lease's fingerprint (what local observation watches) does not change, and its holder
    is one nobody can name (no writer on record); a copy created
    again from the old object names the object it was copied from, not itself."""
    ns = target.namespace
    name = "lock"
    path = lease_path(ns, name)

    async def put(client: KubeClient, obj: JSON, manager: str | None = None) -> JSON:
        query = {"fieldManager": manager} if manager else None
        return (await client.request("PUT", path, body=obj, query=query)).body

    async def body(client: KubeClient) -> None:
        made = (await client.request("POST", leases_path(ns), body=lease(name, holderIdentity="alice/L1",
                                                                         leaseDurationSeconds=30))).body  # fmt: skip
        made["metadata"]["annotations"] = {A_TOKEN: "1", A_UID: made["metadata"]["uid"]}
        taken = LeaseView.parse(await put(client, made))  # coordinator's own write (its user agent)
        assert taken.verified and taken.token == 1 and taken.ttl_owned and taken.lock_id == "L1"
        assert taken.own_write is not None
        await anyio.sleep(1.1)  # server stamps have whole seconds: later edits get later ones
        obj = taken.obj
        obj["metadata"]["annotations"]["team"] = "payments"
        edited = LeaseView.parse(await put(client, obj, "labeler"))
        assert edited.own_write == taken.own_write and edited.fingerprint == taken.fingerprint
        labeled = manager_time(edited.obj, "labeler")
        assert labeled is not None and labeled > taken.own_write
        obj = edited.obj
        obj["spec"]["leaseDurationSeconds"] = 7
        shortened = LeaseView.parse(await put(client, obj, "kubectl-edit"))
        assert shortened.ttl_s == 7 and not shortened.ttl_owned and shortened.own_write == taken.own_write
        obj = shortened.obj
        obj["spec"]["leaseDurationSeconds"] = 30
        obj["spec"]["renewTime"] = "2026-01-01T00:00:01.000000Z"
        renewed = LeaseView.parse(await put(client, obj))
        assert renewed.ttl_s == 30 and renewed.ttl_owned and renewed.own_write is not None
        assert renewed.own_write >= labeled and renewed.verified
        stripped = LeaseView.parse(
            (await client.request("PATCH", path, body={"metadata": {"managedFields": [{}]}}, content_type=MERGE)).body
        )
        assert stripped.own_write is None and not stripped.ttl_owned and not stripped.verified
        assert stripped.fingerprint == renewed.fingerprint
        # nobody is on record as writing the holder field: a holder nobody can name, still blocking
        assert stripped.lock_id is None and stripped.unknown_holder
        await client.request("DELETE", path)
        copy = {k: v for k, v in renewed.obj.items() if k != "status"}
        copy["metadata"] = {k: v for k, v in renewed.obj["metadata"].items()
                            if k in ("name", "annotations", "labels")}  # fmt: skip
        again = LeaseView.parse((await client.request("POST", leases_path(ns), body=copy)).body)
        assert again.uid != renewed.uid and again.uid_claim == renewed.uid and not again.verified
        assert again.fingerprint != renewed.fingerprint  # a new object: a new sighting

    target.run(body)


def test_lease_times_are_micro_times_and_fields_are_typed(target: Target) -> None:
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        spec = {"renewTime": "2026-01-01T01:00:00.500000+01:00", "leaseDurationSeconds": 5, "bogus": 1}
        made = (await client.request("POST", leases_path(ns), body=lease("l", **spec))).body
        assert made["spec"] == {"renewTime": "2026-01-01T00:00:00.500000Z", "leaseDurationSeconds": 5}
        err = await fails(client.request("POST", leases_path(ns), body=lease("m", renewTime="2026-01-01T00:00:00Z")))
        assert err.status == 400 and 'cannot be handled as a Lease: parsing time "2026-01-01T00:00:00Z"' in err.detail
        err = await fails(client.request("POST", leases_path(ns), body=lease("m", leaseDurationSeconds="5")))
        assert err.status == 400 and "cannot be handled as a Lease" in err.detail
        bad_label = {**lease("m"), "metadata": {"name": "m", "labels": {"a": 1}}}
        err = await fails(client.request("POST", leases_path(ns), body=bad_label))
        assert err.status == 400

    target.run(body)


def test_secrets_are_stored_as_data_with_a_type(target: Target) -> None:
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"a": "xx"}}
        made = (await client.request("POST", secrets_path(ns), body=secret)).body
        assert made["data"] == {"a": "eHg="} and made["type"] == "Opaque" and "stringData" not in made
        assert fields_of(made) == {("coordinator", "Update"): {"f:data": {".": {}, "f:a": {}}, "f:type": {}}}

    target.run(body)


def test_an_immutable_config_map_keeps_its_data_but_not_its_finalizers(target: Target) -> None:
    ns = target.namespace
    path = f"{configmaps_path(ns)}/i"

    async def body(client: KubeClient) -> None:
        frozen = {**cm("i", data={"k": "v"}, finalizers=["t.io/keep"]), "immutable": True}
        made = (await client.request("POST", configmaps_path(ns), body=frozen)).body
        assert fields_of(made)[("coordinator", "Update")]["f:metadata"] == {
            "f:finalizers": {".": {}, 'v:"t.io/keep"': {}}
        }
        changed = dict(made, data={"k": "w"})
        err = await fails(client.request("PUT", path, body=changed))
        assert (err.status, err.detail) == (
            422,
            'HTTP 422: ConfigMap "i" is invalid: data: Forbidden: field is immutable when `immutable` is set',
        )
        deleted = (await client.request("DELETE", path)).body
        assert deleted["metadata"]["deletionTimestamp"] and deleted["metadata"]["deletionGracePeriodSeconds"] == 0
        assert rv(deleted) > rv(made)
        kept = (await client.request("GET", path)).body
        kept["metadata"]["finalizers"] = []
        await client.request("PUT", path, body=kept)  # the last finalizer goes, and the object with it
        err = await fails(client.request("GET", path))
        assert err.kind == "not-found"

    target.run(body)


def test_size_limits(target: Target) -> None:
    """Annotations over 256 KiB and ConfigMap data over 1 MiB are invalid (422); an object
    etcd would not take fails in the server (500); a body over 3 MiB is refused (413)."""
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        big = {"a": "x" * (256 * 1024)}
        err = await fails(client.request("POST", configmaps_path(ns), body=cm("s1", annotations=big)))
        assert (err.status, err.detail) == (
            422,
            'HTTP 422: ConfigMap "s1" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes',
        )
        full = (await client.request("POST", configmaps_path(ns), body=cm("s2", data={"a": "x" * 1024 * 1024}))).body
        assert len(full["data"]["a"]) == 1024 * 1024  # exactly the limit is fine
        err = await fails(
            client.request("POST", configmaps_path(ns), body=cm("s3", data={"a": "x" * 1024 * 1024, "b": "y"}))
        )
        assert (err.status, err.detail) == (
            422,
            'HTTP 422: ConfigMap "s3" is invalid: []: Too long: may not be more than 1048576 bytes',
        )
        err = await fails(client.request("POST", leases_path(ns), body=lease("s4", holderIdentity="x" * 1700 * 1024)))
        assert (err.status, err.detail) == (500, "HTTP 500: etcdserver: request is too large")
        err = await fails(client.request("POST", leases_path(ns), body=lease("s5", holderIdentity="x" * 2100 * 1024)))
        assert err.status == 500
        assert re.fullmatch(
            r"HTTP 500: rpc error: code = ResourceExhausted desc = trying to send message larger than max "
            r"\(\d+ vs\. 2097152\)",
            err.detail,
        )
        err = await fails(
            client.request("POST", leases_path(ns), body=lease("s6", holderIdentity="x" * 4 * 1024 * 1024))
        )
        assert (err.status, err.detail) == (413, "HTTP 413: Request entity too large: limit is 3145728")

    target.run(body, timeout=30)


def test_an_admission_policy_turns_writes_away(target: Target) -> None:
    """A ValidatingAdmissionPolicy's denial is 422 Invalid; it comes after the
    resourceVersion check (409) and before the create's name check (no 409 for a name
    taken); a write that changes nothing is still turned away; deletes pass."""
    ns = target.namespace
    path = f"{configmaps_path(ns)}/held"

    async def body(client: KubeClient) -> None:
        made = (await client.request("POST", configmaps_path(ns), body=cm("held", data={"k": "v"}))).body
        stale = dict(made, metadata={**made["metadata"], "resourceVersion": "1"})
        await target.reject_writes(client, "held", "writes rejected by the test")
        err = await fails(client.request("POST", configmaps_path(ns), body=cm("held")))
        policy = f"{ns}-reject"
        assert (err.kind, err.status) == ("error", 422)
        assert err.detail == (
            f"HTTP 422: configmaps \"held\" is forbidden: ValidatingAdmissionPolicy '{policy}' with binding "
            f"'{policy}' denied request: writes rejected by the test"
        )
        err = await fails(client.request("PUT", path, body=stale))
        assert err.kind == "conflict"
        current = (await client.request("GET", path)).body
        err = await fails(client.request("PUT", path, body=current))
        assert err.status == 422
        await client.request("DELETE", path)

    target.run(body, timeout=20)


# --------------------------------------------------------------------------- deletes and namespaces


def test_delete_answers_and_preconditions(target: Target) -> None:
    ns = target.namespace
    path = f"{configmaps_path(ns)}/d"

    async def body(client: KubeClient) -> None:
        made = (await client.request("POST", configmaps_path(ns), body=cm("d"))).body
        uid = made["metadata"]["uid"]
        wrong = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "x"}}
        err = await fails(client.request("DELETE", path, body=wrong))
        assert (err.kind, err.detail) == (
            "conflict",
            f'Operation cannot be fulfilled on ConfigMap "d": the UID in the precondition (x) does not match the '
            f"UID in record ({uid}). The object might have been deleted and then recreated",
        )
        err = await fails(client.request("DELETE", path, body={"preconditions": {"resourceVersion": "1"}}))
        assert err.kind == "conflict" and "the ResourceVersion in the precondition (1)" in err.detail
        gone = (await client.request("DELETE", path, body={"preconditions": {"uid": uid}})).body
        assert gone == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": "d", "kind": "configmaps", "uid": uid},
        }
        err = await fails(client.request("DELETE", path))
        assert err.kind == "not-found"
        await client.request("POST", leases_path(ns), body=lease("l"))
        gone = (await client.request("DELETE", lease_path(ns, "l"))).body
        assert gone["details"]["group"] == "coordination.k8s.io" and gone["details"]["kind"] == "leases"
        for name, mark in (("e", "1"), ("f", "1"), ("g", "2")):
            await client.request("POST", configmaps_path(ns), body=cm(name, labels={"m": mark}))
        swept = (await client.request("DELETE", configmaps_path(ns), query={"labelSelector": "m=1"})).body
        assert swept["kind"] == "ConfigMapList" and [i["metadata"]["name"] for i in swept["items"]] == ["e", "f"]
        left = (await client.request("GET", configmaps_path(ns), query={"labelSelector": "m"})).body
        assert [i["metadata"]["name"] for i in left["items"]] == ["g"]

    target.run(body)


def test_a_deleted_namespace_is_terminating_until_finalized(target: Target) -> None:
    """Without a controller-manager (the sandbox runs none) a deleted namespace stays
    Terminating: nothing new is created in it; what is in it stays, and stays readable
    after the namespace is finalized away."""

    async def body(client: KubeClient) -> None:
        other = target.namespace + "-x"
        made = (await client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": other}})).body
        # Its spec changes only through finalize; an update trying is recorded as if it had.
        made["spec"]["finalizers"].append("t.io/x")
        kept = (await client.request("PUT", namespace_path(other), body=made, query={"fieldManager": "m"})).body
        assert kept["spec"] == {"finalizers": ["kubernetes"]}
        assert fields_of(kept)[("m", "Update")] == {"f:spec": {"f:finalizers": {}}}
        inside = (await client.request("POST", configmaps_path(other), body=cm("in"))).body
        going = (await client.request("DELETE", namespace_path(other))).body
        assert going["status"] == {"phase": "Terminating"} and SECOND.fullmatch(going["metadata"]["deletionTimestamp"])
        assert going["spec"] == {"finalizers": ["kubernetes"]}
        again = (await client.request("DELETE", namespace_path(other))).body
        assert again == going
        err = await fails(client.request("POST", configmaps_path(other), body=cm("in2")))
        assert (err.kind, err.status) == ("forbidden", 403)
        assert err.detail == (
            f'HTTP 403: configmaps "in2" is forbidden: unable to create new content in namespace {other} because it '
            "is being terminated"
        )
        inside["data"] = {"a": "b"}
        await client.request("PUT", f"{configmaps_path(other)}/in", body=inside)  # updates go on
        going["spec"]["finalizers"] = []
        finalized = (await client.request("PUT", f"{namespace_path(other)}/finalize", body=going)).body
        assert finalized["spec"] == {} and rv(finalized) == rv(going)
        err = await fails(client.request("GET", namespace_path(other)))
        assert err.kind == "not-found"
        left = (await client.request("GET", f"{configmaps_path(other)}/in")).body
        assert left["data"] == {"a": "b"}

    target.run(body)


# --------------------------------------------------------------------------- lists


def test_lists_select_by_label_and_name_across_namespaces(target: Target) -> None:
    ns = target.namespace
    mark = f"conformance.test/{ns}"

    async def body(client: KubeClient) -> None:
        other = ns + "-y"
        await client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": other}})
        for where, name, value in ((ns, "a", "1"), (ns, "b", "2"), (other, "a", "1")):
            obj = {**lease(name), "metadata": {"name": name, "labels": {mark: value}}}
            await client.request("POST", leases_path(where), body=obj)
        mine = (await client.request("GET", leases_path(ns), query={"labelSelector": f"{mark}=1"})).body
        assert mine["kind"] == "LeaseList" and mine["apiVersion"] == "coordination.k8s.io/v1"
        assert [i["metadata"]["name"] for i in mine["items"]] == ["a"]
        assert "kind" not in mine["items"][0] and "apiVersion" not in mine["items"][0]
        assert int(mine["metadata"]["resourceVersion"]) >= rv(mine["items"][0])
        everywhere = (
            await client.request("GET", "/apis/coordination.k8s.io/v1/leases", query={"labelSelector": mark})
        ).body
        assert sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in everywhere["items"]) == [
            (ns, "a"), (ns, "b"), (other, "a"),
        ]  # fmt: skip
        named = await client.request(
            "GET",
            "/apis/coordination.k8s.io/v1/leases",
            query={"labelSelector": mark, "fieldSelector": "metadata.name=b"},
        )
        assert [i["metadata"]["name"] for i in named.body["items"]] == ["b"]
        notin = await client.request("GET", leases_path(ns), query={"labelSelector": f"{mark} notin (1)"})
        assert [i["metadata"]["name"] for i in notin.body["items"]] == ["b"]
        err = await fails(client.request("GET", leases_path(ns), query={"resourceVersion": "abc"}))
        assert err.status == 400 and "invalid resource version" in err.detail
        ahead = int(mine["metadata"]["resourceVersion"]) + 10**9
        err = await fails(client.request("GET", leases_path(ns), query={"resourceVersion": str(ahead)}))
        assert (err.kind, err.status) == ("unreachable", 504)  # the real one waits 3 s first
        assert err.detail.startswith(f"HTTP 504: Timeout: Too large resource version: {ahead}, current: ")

    target.run(body)


# --------------------------------------------------------------------------- watch


async def collect(
    client: KubeClient, path: str, query: dict[str, str], *, until: int, timeout: float = 30
) -> list[JSON]:
    """Events of one watch, until ``until`` of them arrived or the watch ended."""
    got: list[JSON] = []
    async with aclosing(client.watch(path, query=query, timeout=timeout)) as events:
        async for event in events:
            got.append(event)
            if len(got) >= until:
                break
    return got


def test_a_watch_from_a_resource_version_sees_every_change_after_it(target: Target) -> None:
    ns = target.namespace
    mark = f"conformance.test/{ns}"

    async def body(client: KubeClient) -> None:
        listed = (await client.request("GET", leases_path(ns))).body
        since = listed["metadata"]["resourceVersion"]
        made = (
            await client.request(
                "POST", leases_path(ns), body={**lease("l"), "metadata": {"name": "l", "labels": {mark: "1"}}}
            )
        ).body
        made["spec"] = {"holderIdentity": "a"}
        changed = (await client.request("PUT", lease_path(ns, "l"), body=made)).body
        changed["metadata"]["labels"] = {mark: "2"}  # leaves a selection on mark=1
        moved = (await client.request("PUT", lease_path(ns, "l"), body=changed)).body
        await client.request("DELETE", lease_path(ns, "l"))
        events = await collect(client, leases_path(ns), {"resourceVersion": since}, until=4)
        assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
        assert [rv(e["object"]) for e in events[:3]] == [rv(made), rv(changed), rv(moved)]
        assert rv(events[3]["object"]) > rv(moved)
        assert events[3]["object"]["metadata"]["labels"] == {mark: "2"}
        assert events[0]["object"]["kind"] == "Lease"
        selected = await collect(
            client, leases_path(ns), {"resourceVersion": since, "labelSelector": f"{mark}=1"}, until=3
        )
        assert [e["type"] for e in selected] == ["ADDED", "MODIFIED", "DELETED"]
        left = selected[2]["object"]  # the object as it was when it matched, at the change's version
        assert left["metadata"]["labels"] == {mark: "1"} and rv(left) == rv(moved)
        named = await collect(
            client, leases_path(ns), {"resourceVersion": since, "fieldSelector": "metadata.name=l"}, until=4
        )
        assert len(named) == 4

    target.run(body, timeout=30)


def test_a_watch_without_a_resource_version_starts_with_the_objects(target: Target) -> None:
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        for name in ("b", "a"):
            await client.request("POST", leases_path(ns), body=lease(name))
        seen: list[JSON] = []
        listed = anyio.Event()  # the watch told what there is
        other = target.client()

        async def watch() -> None:
            async with aclosing(other.watch(leases_path(ns), query={}, timeout=30)) as events:
                async for event in events:
                    seen.append(event)
                    if len(seen) == 2:
                        listed.set()
                    if len(seen) == 3:
                        return

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                with anyio.fail_after(30):
                    await listed.wait()
                await client.request("POST", leases_path(ns), body=lease("c"))
        finally:
            await other.close()
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [
            ("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c"),
        ]  # fmt: skip

    target.run(body, timeout=30)


def test_a_watch_asking_for_bookmarks_gets_one_before_it_ends(target: Target) -> None:
    """A bookmark tells a resourceVersion newer than the watch's, from a change it does not
    select (a Lease in another namespace). When the real server sends them depends on its
    one-second dispatch: about 1 to 2.5 s before the watch ends, sometimes twice, sometimes
    not at all in a watch of a few seconds; a 12 s watch has always had one."""
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        listed = (await client.request("GET", leases_path(ns))).body
        since = int(listed["metadata"]["resourceVersion"])
        await client.request("POST", leases_path("default"), body={**lease("x"), "metadata": {"generateName": "c-"}})
        query = {"resourceVersion": str(since), "allowWatchBookmarks": "true"}
        async with aclosing(client.watch(leases_path(ns), query=query, timeout=12)) as watch:
            events = [e async for e in watch]
        assert events and all(e["type"] == "BOOKMARK" for e in events), events
        for event in events:
            obj = event["object"]
            told = obj["metadata"]["resourceVersion"]
            kind = {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1"}
            assert obj == {**kind, "metadata": {"resourceVersion": told}, "spec": {}}
            assert int(told) > since

    target.run(body, timeout=30)


def test_a_watch_from_an_expired_resource_version_is_gone(target: Target) -> None:
    """410 Gone, as an ERROR event in a 200 answer, for a resourceVersion older than the
    history kept; the stream ends there."""
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        old = (await client.request("POST", leases_path(ns), body=lease("a"))).body
        await client.request("POST", leases_path(ns), body=lease("b"))
        await target.expire_history()
        await client.close()  # the restarted server's connection is gone
        events = [e async for e in client.watch(leases_path(ns), query={"resourceVersion": str(rv(old))}, timeout=10)]
        assert len(events) == 1 and events[0]["type"] == "ERROR", events
        status = events[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        found = re.fullmatch(r"too old resource version: (\d+) \((\d+)\)", status["message"])
        assert found and int(found.group(1)) == rv(old) and int(found.group(2)) > rv(old)
        fresh = (await client.request("GET", leases_path(ns))).body  # listing again is the way back
        assert len(fresh["items"]) == 2

    target.run(body, timeout=30)


# --------------------------------------------------------------------------- a paused server


def test_a_paused_server_answers_who_still_waits(target: Target) -> None:
    """A paused kube-apiserver (stopped: connections taken, no answer) does, once it goes
    on, the requests whose senders still wait, and not those that gave up."""
    ns = target.namespace

    async def body(client: KubeClient) -> None:
        await client.request("GET", namespace_path(ns))  # the connection is there
        await target.pause()
        try:
            err = await fails(client.request("POST", configmaps_path(ns), body=cm("given-up"), timeout=1))
            assert (err.kind, err.detail) == ("unreachable", "no answer within 1s")
            waiting = target.client(timeout=60)
            answered: list[int] = []

            async def wait() -> None:
                answered.append((await waiting.request("POST", configmaps_path(ns), body=cm("waited"))).status)

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(1)
                await target.resume()
            await waiting.close()
        finally:
            await target.resume()
        assert answered == [201]
        await anyio.sleep(2)
        err = await fails(client.request("GET", f"{configmaps_path(ns)}/given-up"))
        assert err.kind == "not-found"

    target.run(body, timeout=30)


# --------------------------------------------------------------------------- sim only


@pytest.mark.unit
def test_sim_only_a_throttled_request_gets_429_and_retry_after() -> None:
    """APF's answer: 429, reason TooManyRequests, Retry-After (the shape
    tests/kube/integration/test_throttling.py sees from a real server: kind throttled, status
    429, retry_after 1.0); the client retries within its deadline."""
    world = World(clock=lambda: datetime.now(UTC))
    server = world.cluster("c1").server

    async def go() -> None:
        client = sim_client(world)
        server.throttle("1", count=1)
        got = await client.request("GET", namespace_path("default"), timeout=5)
        assert got.status == 200 and server.requests == 2
        server.throttle("1")
        err = await fails(client.request("GET", namespace_path("default"), timeout=1))
        assert (err.kind, err.status, err.retry_after) == ("throttled", 429, 1.0)
        assert "not retried" in err.detail

    anyio.run(go)


@pytest.mark.unit
def test_sim_only_a_skewed_server_stamps_its_own_clock() -> None:
    """One of an HA pair with its clock 30 s ahead: what it writes (creationTimestamp,
    managedFields times) and its Date are 30 s ahead, read through either server (the
    stamps are stored), as tests/sandbox/integration/test_sandbox_ha.py shows for the sandbox."""
    now = datetime(2026, 12, 1, 12, 0, 0, 400000, tzinfo=UTC)
    world = World(clock=lambda: now)
    cluster = world.cluster("c1", apiservers=2)
    cluster.servers[0].offset = timedelta(seconds=30)

    async def go() -> None:
        skewed = sim_client(world, server=0)
        true = sim_client(world, server=1)
        made = await skewed.request("POST", configmaps_path("default"), body=cm("a", data={"k": "v"}))
        assert made.body["metadata"]["creationTimestamp"] == "2026-12-01T12:00:30Z"
        assert made.server_time == datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)
        read = await true.request("GET", f"{configmaps_path('default')}/a")
        assert read.server_time == datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
        assert times_of(read.body) == {"coordinator": "2026-12-01T12:00:30Z"}

    anyio.run(go)


@pytest.mark.unit
def test_sim_only_a_lost_answer_and_a_stopped_server() -> None:
    world = World(clock=lambda: datetime.now(UTC))
    server = world.cluster("c1").server

    async def go() -> None:
        client = sim_client(world)
        server.lose_answers(1)
        err = await fails(client.request("POST", configmaps_path("default"), body=cm("a")))
        assert err.kind == "unreachable" and "Connection reset" in err.detail
        assert (await client.request("GET", f"{configmaps_path('default')}/a")).status == 200  # it was made
        server.stop()
        err = await fails(client.request("GET", "/version"))
        assert err.kind == "unreachable" and "connection refused" in err.detail
        server.start()
        assert (await client.request("GET", "/version")).status == 200

    anyio.run(go)


def sim_client(world: World, *, server: int | None = None) -> KubeClient:
    return KubeClient(Endpoint("c1", "c1"), timeout=5, transport=world.clusters["c1"].transport(server))
