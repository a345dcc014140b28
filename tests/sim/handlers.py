"""How the in-memory API server (apiserver.py) answers a request on objects: routing,
the order of the real server's checks (decoding, namespace lifecycle, preconditions,
validation, admission, storage), patches and server-side apply, deletes and finalizers."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from coordinator.kube.transport import Request
from sim import fields
from sim.objects import (
    ETCD_MAX_REQUEST_BYTES,
    JSON,
    KINDS,
    ApiError,
    Kind,
    bad_request,
    check_stored_size,
    clone,
    decode,
    field_selector,
    label_selector,
    not_found,
    server_time,
    validate,
)

if TYPE_CHECKING:
    from sim.apiserver import ApiServer

Key = tuple[str, str, str]  # resource, namespace ("" for a cluster-scoped one), name


class Handler:
    """One request on objects of one kind."""

    def __init__(
        self,
        server: ApiServer,
        kind: Kind,
        namespace: str | None,
        name: str | None,
        query: Mapping[str, str],
        request: Request,
    ) -> None:
        self.server = server
        self.store = server.store
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.query = query
        self.request = request

    def key(self, name: str) -> Key:
        return (self.kind.resource, self.namespace or "", name)

    def now(self) -> str:
        return server_time(self.server.now())

    def manager(self) -> str:
        """The field manager: the one named, or the User-Agent's first word (as the real server)."""
        given = self.query.get("fieldManager")
        if given:
            return given
        agent = next((v for k, v in self.request.headers.items() if k.lower() == "user-agent"), "")
        return agent.split("/")[0]

    def run(self, sub: str | None) -> tuple[int, JSON]:
        method = self.request.method
        if self.name is None:
            if method == "GET":
                return self.list_objects()
            if method == "POST" and (self.namespace is not None or not self.kind.namespaced):
                return self.create(self.body_object())
            if method == "DELETE" and self.namespace is not None:
                return self.delete_collection()
            raise method_not_allowed()
        if sub == "finalize":
            if method != "PUT":
                raise method_not_allowed()
            return self.finalize(self.body_object())
        if sub is not None:
            raise no_such_resource()
        if method == "GET":
            found = self.store.peek(self.key(self.name))
            if found is None:
                raise not_found(self.kind, self.name)
            return 200, found
        if method == "PUT":
            return self.update(self.body_object())
        if method == "PATCH":
            return self.patch()
        if method == "DELETE":
            return self.delete(json_body(self.request))
        raise method_not_allowed()

    def body_object(self) -> JSON:
        doc = json_body(self.request)
        obj = decode(self.kind, doc)
        given = obj["metadata"].get("namespace")
        if self.kind.namespaced:
            if given is not None and given != self.namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            obj["metadata"]["namespace"] = self.namespace
        return obj

    # ------------------------------------------------------------ reads

    def list_objects(self) -> tuple[int, JSON]:
        wanted = resource_version(self.query.get("resourceVersion", ""))
        if wanted > self.store.revision:
            # The real server first waits 3 s for its cache to catch up; one store has
            # nothing to catch up with.
            raise ApiError(
                504,
                "Timeout",
                f"Timeout: Too large resource version: {wanted}, current: {self.store.revision}",
                {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                 "retryAfterSeconds": 1},
                headers={"Retry-After": "1"},
            )  # fmt: skip
        labels = label_selector(self.query.get("labelSelector", ""))
        names = field_selector(self.query.get("fieldSelector", ""))
        items = []
        for key in sorted(self.store.objects):
            if key[0] != self.kind.resource or (self.namespace is not None and key[1] != self.namespace):
                continue
            obj = self.store.objects[key]
            if labels(obj["metadata"].get("labels") or {}) and names(obj):
                item = clone(obj)
                del item["kind"], item["apiVersion"]
                items.append(item)
        body = {
            "kind": f"{self.kind.kind}List",
            "apiVersion": self.kind.api_version,
            "metadata": {"resourceVersion": str(self.store.revision)},
            "items": items,
        }
        return 200, body

    # ------------------------------------------------------------ writes

    def _namespace_open(self, name: str) -> None:
        """NamespaceLifecycle: nothing is created in a namespace that is missing or going."""
        if not self.kind.namespaced:
            return
        ns = self.store.objects.get(("namespaces", "", self.namespace or ""))
        if ns is None:
            raise not_found(KINDS["namespaces"], self.namespace or "")
        if ns["metadata"].get("deletionTimestamp"):
            message = f"unable to create new content in namespace {self.namespace} because it is being terminated"
            cause = {"reason": "NamespaceTerminating", "message": f"namespace {self.namespace} is being terminated",
                     "field": "metadata.namespace"}  # fmt: skip
            details = {**self.kind.details(name), "causes": [cause]}
            raise ApiError(403, "Forbidden", f'{self.kind.qualified} "{name}" is forbidden: {message}', details)

    def _admit(self, operation: str, obj: JSON, old: JSON | None) -> None:
        for policy in self.server.policies.values():
            if policy.rejects(operation, self.kind, obj, old):
                name = obj["metadata"].get("name", "")
                said = f"ValidatingAdmissionPolicy '{policy.name}' with binding '{policy.name}' denied request: " + (
                    policy.message
                )
                details = {**self.kind.details(name), "causes": [{"message": said}]}
                raise ApiError(422, "Invalid", f'{self.kind.qualified} "{name}" is forbidden: {said}', details)

    def _write(self, key: Key, obj: JSON) -> JSON:
        where = "/registry/" + "/".join(k for k in key if k)

        def check(encoded: bytes) -> None:
            # The stored object's JSON, spaced, is at least as long as ``obj``'s compact
            # JSON (its resourceVersion is a later revision, or ``obj`` had none): within
            # etcd's limit, so is ``obj``, and the size need not be counted again.
            if len(where) + len(encoded) > ETCD_MAX_REQUEST_BYTES:
                check_stored_size(where, obj)

        return self.store.put(key, obj, check=check)

    def create(self, obj: JSON, entries: list[fields.Entry] | None = None) -> tuple[int, JSON]:
        """POST; ``entries``: the managedFields an apply that creates the object made."""
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                self.server.rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
            )
        name = meta.get("name", "")
        self._namespace_open(name)
        validate(self.kind, obj, None)
        self._admit("CREATE", obj, None)
        if meta.get("resourceVersion"):
            raise ApiError(500, None, "resourceVersion should not be set on objects to be created")
        key = self.key(name)
        if key in self.store.objects:
            raise ApiError(
                409, "AlreadyExists", f'{self.kind.qualified} "{name}" already exists', self.kind.details(name)
            )
        if entries is None:
            # Entries the body carries are the starting point; the creating manager then
            # takes every field it sets from them.
            given = fields.read_entries(obj)
            entries = fields.record_update(
                given, self.kind.empty(), obj, self.kind.schema, self.manager(), self.kind.api_version, self.now()
            )
        for stamp in ("deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            meta.pop(stamp, None)
        meta["uid"] = str(uuid.UUID(int=self.server.rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = self.now()
        _set_entries(obj, entries)
        if self.kind.resource == "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        return 201, self._write(key, obj)

    def update(self, obj: JSON) -> tuple[int, JSON]:
        assert self.name is not None
        meta = obj["metadata"]
        if meta.get("name") and meta["name"] != self.name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({self.name})"
            )
        meta["name"] = self.name
        key = self.key(self.name)
        cur = self.store.peek(key)  # looked at, never changed
        if cur is None and not self.kind.create_on_update:
            raise not_found(self.kind, self.name)
        # The uid the body names is a precondition, checked first (by the storage).
        found_uid = cur["metadata"]["uid"] if cur is not None else ""
        if meta.get("uid") and meta["uid"] != found_uid:
            where = f"/registry/{'/'.join(k for k in key if k)}"
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {self.kind.qualified} "{self.name}": StorageError: invalid object, '
                f"Code: 4, Key: {where}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in "
                f"precondition: {meta['uid']}, UID in object meta: {found_uid}",
                self.kind.details(self.name),
            )
        if cur is None:
            # A Lease is created by a PUT, whatever resourceVersion it names.
            meta.pop("resourceVersion", None)
            return self.create(obj)
        old_meta = cur["metadata"]
        if not meta.get("resourceVersion") and not self.kind.unconditional_update:
            message = "Invalid value: 0: must be specified for an update"
            cause = {"reason": "FieldValueInvalid", "message": message, "field": "metadata.resourceVersion"}
            raise ApiError(
                422,
                "Invalid",
                f'{self.kind.qualified} "{self.name}" is invalid: metadata.resourceVersion: {message}',
                {**self.kind.details(self.name), "causes": [cause]},
            )
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise _conflict(self.kind, self.name)
        # The entries the body brings, or else the object's; a body that brings back the
        # managedFields it read (as writers do) brings the object's.
        given = (
            fields.read_entries(obj)
            if meta.get("managedFields") and meta["managedFields"] != old_meta.get("managedFields")
            else self.store.entries(cur)
        )
        for stamp in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if stamp in old_meta:
                meta[stamp] = old_meta[stamp]
            else:
                meta.pop(stamp, None)
        validate(self.kind, obj, cur)
        self._admit("UPDATE", obj, cur)
        # An object without managedFields gets none from an update (only a create or an
        # apply starts tracking).
        entries = (
            fields.record_update(given, cur, obj, self.kind.schema, self.manager(), self.kind.api_version, self.now())
            if given
            else []
        )
        if self.kind.resource == "namespaces":
            # Changed only through finalize and by the server; the entries above are
            # made before this, as the real server's are.
            obj["spec"], obj["status"] = cur["spec"], cur["status"]
        _set_entries(obj, entries)
        return self._store_update(key, obj, cur)

    def _store_update(self, key: Key, obj: JSON, cur: JSON) -> tuple[int, JSON]:
        meta = obj["metadata"]
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not (obj.get("spec") or {}).get("finalizers")
        ):
            self.store.delete(key)
            return 200, obj  # the last finalizer gone: the object goes with it
        if obj == cur:
            return 200, cur  # nothing changed: nothing is written
        return 200, self._write(key, obj)

    def patch(self) -> tuple[int, JSON]:
        assert self.name is not None
        ctype = next((v for k, v in self.request.headers.items() if k.lower() == "content-type"), "")
        ctype = ctype.split(";")[0].strip()
        if ctype == "application/apply-patch+yaml":
            return self.apply()
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json",
                         "application/json-patch+json"):  # fmt: skip
            raise ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
        cur = self.store.get(self.key(self.name))
        if cur is None:
            raise not_found(self.kind, self.name)
        patch = json_body(self.request)
        if ctype == "application/json-patch+json":
            target = _json_patch(cur, patch)
        else:
            if not isinstance(patch, dict):
                raise bad_request("the patch is not a JSON object")
            target = _merge_patch(cur, patch, strategic=ctype.startswith("application/strategic"))
        obj = decode(self.kind, target)
        if self.kind.namespaced:
            obj["metadata"]["namespace"] = self.namespace
        return self.update(obj)

    def apply(self) -> tuple[int, JSON]:
        assert self.name is not None
        manager = self.query.get("fieldManager")
        if not manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
                {"group": "meta.k8s.io", "kind": "PatchOptions",
                 "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch",
                             "field": "fieldManager"}]},
            )  # fmt: skip
        try:
            doc = yaml.load((self.request.body or b"").decode(), Loader=_Yaml11Loader)
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise bad_request(f"error decoding YAML: {err}") from None
        try:
            config = decode(self.kind, doc)
        except ApiError as err:
            what = f"/{self.name}; {self.kind.api_version}, Kind={self.kind.kind}"
            raise ApiError(500, None, f"failed to create typed patch object ({what}): {err.message}") from None
        meta = config["metadata"]
        if meta.get("name") and meta["name"] != self.name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({self.name})"
            )
        meta["name"] = self.name
        if self.kind.namespaced:
            meta["namespace"] = self.namespace
        if self.kind.resource == "namespaces":
            config.pop("status", None)
        key = self.key(self.name)
        cur = self.store.get(key)
        if (
            cur is not None
            and meta.get("resourceVersion")
            and meta["resourceVersion"] != cur["metadata"]["resourceVersion"]
        ):
            raise _conflict(self.kind, self.name)
        meta.pop("resourceVersion", None)
        force = self.query.get("force") in ("true", "1")
        entries = fields.read_entries(cur) if cur is not None else []
        try:
            merged, entries, _ = fields.record_apply(
                entries,
                cur,
                config,
                self.kind.schema,
                manager,
                self.kind.api_version,
                self.now(),
                force=force,
                empty={**self.kind.empty(), "kind": self.kind.kind, "apiVersion": self.kind.api_version,
                       "metadata": {"name": self.name, **({"namespace": self.namespace} if self.namespace else {})}},
            )  # fmt: skip
        except fields.ApplyConflict as err:
            raise _apply_conflict(err) from None
        if cur is None:
            obj = decode(self.kind, merged)
            if self.kind.namespaced:
                obj["metadata"]["namespace"] = self.namespace
            return self.create(obj, entries)
        validate(self.kind, merged, cur)
        self._admit("UPDATE", merged, cur)
        _set_entries(merged, entries)
        return self._store_update(key, merged, cur)

    def finalize(self, obj: JSON) -> tuple[int, JSON]:
        """PUT …/namespaces/NAME/finalize: set the namespace's spec.finalizers."""
        assert self.name is not None
        key = self.key(self.name)
        cur = self.store.get(key)
        if cur is None:
            raise not_found(self.kind, self.name)
        new = clone(cur)
        finalizers = (obj.get("spec") or {}).get("finalizers") or []
        new["spec"] = {"finalizers": finalizers} if finalizers else {}
        return self._store_update(key, new, cur)

    def delete(self, options: Any) -> tuple[int, JSON]:
        assert self.name is not None
        answer, _ = self._delete(self.name, options)
        return 200, answer

    def _delete(self, name: str, options: Any) -> tuple[JSON, JSON]:
        """Delete one object: the answer, and the object as it is left (gone, or marked
        for deletion while finalizers keep it)."""
        key = self.key(name)
        cur = self.store.get(key)
        if cur is None:
            raise not_found(self.kind, name)
        meta = cur["metadata"]
        pre = (options or {}).get("preconditions") if isinstance(options, dict) else None
        if isinstance(pre, dict):
            where = f'Operation cannot be fulfilled on {self.kind.kind} "{name}": '
            details = {"name": name, "kind": self.kind.kind}
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise ApiError(
                    409,
                    "Conflict",
                    where + f"the UID in the precondition ({pre['uid']}) does not match the UID in record "
                    f"({meta['uid']}). The object might have been deleted and then recreated",
                    details,
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    where + f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not match the "
                    f"ResourceVersion in record ({meta['resourceVersion']}). The object might have been modified",
                    details,
                )
        self._admit("DELETE", cur, cur)
        namespace_kept = self.kind.resource == "namespaces" and (cur.get("spec") or {}).get("finalizers")
        if meta.get("finalizers") or namespace_kept:
            if meta.get("deletionTimestamp"):
                return cur, cur
            new = clone(cur)
            new["metadata"]["deletionTimestamp"] = self.now()
            if self.kind.resource == "namespaces":
                new["status"] = {"phase": "Terminating"}
            else:
                new["metadata"]["deletionGracePeriodSeconds"] = 0
            written = self._write(key, new)
            return written, written
        gone = self.store.delete(key)
        if self.kind.resource == "namespaces":
            return gone, gone
        details = {**self.kind.details(name), "uid": meta["uid"]}
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}, gone

    def delete_collection(self) -> tuple[int, JSON]:
        labels = label_selector(self.query.get("labelSelector", ""))
        names = field_selector(self.query.get("fieldSelector", ""))
        chosen = [
            key[2]
            for key, obj in sorted(self.store.objects.items())
            if key[0] == self.kind.resource
            and key[1] == (self.namespace or "")
            and labels(obj["metadata"].get("labels") or {})
            and names(obj)
        ]
        items = []
        for name in chosen:
            _, left = self._delete(name, None)
            items.append({k: v for k, v in left.items() if k not in ("kind", "apiVersion")})
        body = {
            "kind": f"{self.kind.kind}List",
            "apiVersion": self.kind.api_version,
            "metadata": {"resourceVersion": str(self.store.revision)},
            "items": items,
        }
        return 200, body


class _Yaml11Loader(yaml.SafeLoader):
    """YAML as the API server reads an apply: YAML 1.1, where y and n are booleans too."""

    bool_values: ClassVar[dict[str, bool]] = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


_Yaml11Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


def _set_entries(obj: JSON, entries: list[fields.Entry]) -> None:
    written = fields.write_entries(entries)
    if written:
        obj["metadata"]["managedFields"] = written
    else:
        obj["metadata"].pop("managedFields", None)


def _conflict(kind: Kind, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {kind.qualified} "{name}": the object has been modified; please apply '
        "your changes to the latest version and try again",
        kind.details(name),
    )


def _apply_conflict(err: fields.ApplyConflict) -> ApiError:
    """409 for an apply's conflicts, worded as the real server words them (an Update
    entry's manager with its API version, an Apply entry's by name)."""

    def who(manager: str, operation: str, version: str) -> str:
        return f'"{manager}" using {version}' if operation == "Update" else f'"{manager}"'

    by: dict[str, list[str]] = {}
    for manager, operation, version, path in err.conflicts:
        by.setdefault(who(manager, operation, version), []).append(fields.describe(path))
    n = len(err.conflicts)
    if n == 1:
        ((name, (where,)),) = by.items()
        text = f"Apply failed with 1 conflict: conflict with {name}: {where}"
    else:
        parts = []
        for name, paths in by.items():
            if len(paths) == 1:
                parts.append(f"conflict with {name}: {paths[0]}")
            else:
                parts.append(f"conflicts with {name}:\n" + "\n".join(f"- {p}" for p in paths))
        text = f"Apply failed with {n} conflicts: " + "\n".join(parts)
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {who(manager, operation, version)}",
         "field": fields.describe(path)}
        for manager, operation, version, path in err.conflicts
    ]  # fmt: skip
    return ApiError(409, "Conflict", text, {"causes": causes})


def resource_version(text: str) -> int:
    """A resourceVersion parameter as a number (0 when not given); 400 when it is none."""
    if not text:
        return 0
    if not text.isdigit():
        raise bad_request(
            f'invalid resource version: resourceVersion: Invalid value: "{text}": strconv.ParseUint: '
            f'parsing "{text}": invalid syntax'
        )
    return int(text)


def no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def method_not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})


def json_body(request: Request) -> Any:
    if not request.body:
        return None
    try:
        return json.loads(request.body)
    except (ValueError, RecursionError) as err:
        raise bad_request(f"error decoding JSON: {err}") from None


@dataclass(frozen=True)
class Route:
    kind: Kind
    namespace: str | None
    name: str | None
    sub: str | None = None


@lru_cache(maxsize=4096)
def route(path: str) -> Route | str | None:
    """Where a path leads: objects of a kind, "version", "access-review", or nowhere
    (remembered: a Route is immutable, and a run asks for a few dozen paths)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts == ["version"]:
        return "version"
    if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]:
        return "access-review"
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:3] == ["apis", "coordination.k8s.io", "v1"]:
        group, rest = "coordination.k8s.io", parts[3:]
    else:
        return None
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
        if group == "" and rest == ["finalize"]:
            return Route(KINDS["namespaces"], None, namespace, "finalize")
    if not rest:
        return None
    kind = KINDS.get(rest[0])
    if kind is None or kind.group != group or len(rest) > 3:
        return None
    if not kind.namespaced and namespace is not None:
        return None
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    return Route(kind, namespace, name, sub)


def _merge_patch(target: Any, patch: Any, *, strategic: bool = False, key: str = "") -> Any:
    """RFC 7386 merge patch; ``strategic``: a list of finalizers is merged (union), as
    Kubernetes' strategic merge patch merges it."""
    if not isinstance(patch, dict):
        if strategic and key == "finalizers" and isinstance(target, list) and isinstance(patch, list):
            return target + [x for x in patch if x not in target]
        return clone(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v, strategic=strategic, key=k)
    return out


def _json_patch(target: JSON, ops: Any) -> JSON:
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    doc: Any = clone(target)
    if not isinstance(ops, list):
        raise bad_request("a JSON patch is a list of operations")
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise bad_request("a JSON patch operation needs an op and a path")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = (
                parent[int(part)]
                if isinstance(parent, list)
                else parent.get(part)
                if isinstance(parent, dict)
                else None
            )
            if parent is None:
                raise ApiError(422, "Invalid", f"doc is missing path: {op['path']}")
        last = parts[-1] if parts else ""
        kind = op.get("op")
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ApiError(422, "Invalid", f"testing value {op['path']} failed: test failed")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, op.get("value"))
                else:
                    parent[index] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(
                        422, "Invalid", f"replace operation does not apply: doc is missing key: {op['path']}"
                    )
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"remove operation does not apply: doc is missing path: {op['path']}")
        else:
            raise bad_request(f"unexpected JSON patch operation {kind!r}")
    assert isinstance(doc, dict)
    return doc
