"""The kinds the in-memory API server serves, and what kube-apiserver checks of an object
before it stores it: decoding (400), validation (422), sizes; its error bodies.

Only what coordinator and its tests send is modelled; texts follow the real server's
where a caller may read them (tests/sim/test_conformance.py compares the statuses and
reasons, and the messages where they are stable).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar

from sim.fields import SCHEMAS, Struct

JSON = dict[str, Any]
_T = TypeVar("_T")

# Request bodies past this are refused before they are read (413).
MAX_REQUEST_BYTES = 3 * 1024 * 1024
# etcd's default --max-request-bytes: a write of a larger object fails in etcd (500).
ETCD_MAX_REQUEST_BYTES = 1536 * 1024
# The gRPC limit of kube-apiserver's etcd client: a larger write does not reach etcd (500).
GRPC_MAX_SEND_BYTES = 2 * 1024 * 1024
MAX_ANNOTATIONS_BYTES = 256 * 1024
MAX_DATA_BYTES = 1024 * 1024  # of a ConfigMap's or a Secret's data


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    group: str
    namespaced: bool
    unconditional_update: bool = True  # a PUT without a resourceVersion is taken
    create_on_update: bool = False  # a PUT of a missing object creates it

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    @property
    def qualified(self) -> str:
        """How messages name the resource: ``configmaps``, ``leases.coordination.k8s.io``."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def schema(self) -> Struct:
        return SCHEMAS[self.resource]

    def details(self, name: str) -> JSON:
        out: JSON = {"name": name}
        if self.group:
            out["group"] = self.group
        out["kind"] = self.resource
        return out

    def empty(self) -> JSON:
        """The zero object of the kind: the structs every object of it has."""
        if self.resource == "leases":
            return {"metadata": {}, "spec": {}}
        if self.resource == "namespaces":
            return {"metadata": {}, "spec": {}, "status": {}}
        return {"metadata": {}}


KINDS = {
    k.resource: k
    for k in (
        Kind("namespaces", "Namespace", "", False),
        Kind("configmaps", "ConfigMap", "", True),
        Kind("secrets", "Secret", "", True),
        Kind("leases", "Lease", "coordination.k8s.io", True, unconditional_update=False, create_on_update=True),
    )
}

# The top-level fields each kind has (others are dropped, as the real server drops
# unknown fields after warning about them).
_TOP = {
    "namespaces": {"spec", "status"},
    "configmaps": {"data", "binaryData", "immutable"},
    "secrets": {"data", "stringData", "type", "immutable"},
    "leases": {"spec"},
}
_META = {
    "name", "generateName", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences",
    "finalizers", "managedFields", "selfLink",
}  # fmt: skip
_LEASE_SPEC = {
    "holderIdentity": str,
    "leaseDurationSeconds": int,
    "acquireTime": "micro",
    "renewTime": "micro",
    "leaseTransitions": int,
}  # strategy and preferredHolder are behind a feature gate the sandbox leaves off: dropped


class ApiError(Exception):
    """An answer other than success, as the real server words it."""

    def __init__(
        self, code: int, reason: str | None, message: str, details: JSON | None = None, *, headers: JSON | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> JSON:
        out: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message}
        if self.reason:
            out["reason"] = self.reason
        if self.details is not None:
            out["details"] = self.details
        out["code"] = self.code
        return out


def clone(value: _T) -> _T:
    """A copy of a JSON document (dicts, lists and scalars): what copy.deepcopy gives,
    several times faster, since nothing in a document is shared or cyclic."""
    kind = type(value)
    if kind is dict:
        return {k: clone(v) for k, v in value.items()}  # type: ignore[attr-defined,return-value]
    if kind is list:
        return [clone(v) for v in value]  # type: ignore[attr-defined,return-value]
    return value


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.qualified} "{name}" not found', kind.details(name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind: Kind, name: str, field: str, cause: str, message: str) -> ApiError:
    """422: the object is invalid (one cause)."""
    details = {"name": name, "kind": kind.kind, "causes": [{"reason": cause, "message": message, "field": field}]}
    return ApiError(422, "Invalid", f'{kind.kind} "{name}" is invalid: {field}: {message}', details)


# ------------------------------------------------------------------ times


_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def whole_second(when: datetime) -> int:
    """The whole second ``when`` (an aware datetime) falls in, counted from the Unix
    epoch (exact integer arithmetic): a key for texts that a second's writes share,
    cheaper to hash than the datetime truncated to its second."""
    return (when - _UNIX_EPOCH) // _SECOND


def server_time(when: datetime) -> str:
    """A metav1.Time as the server writes it: UTC, whole seconds (truncated)."""
    return _server_time(whole_second(when))  # a second's writes share one text


@lru_cache(maxsize=64)
def _server_time(second: int) -> str:
    return (_UNIX_EPOCH + second * _SECOND).strftime("%Y-%m-%dT%H:%M:%SZ")


_MICRO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def _micro_time(kind: Kind, field: str, value: Any) -> str:
    """A MicroTime as the server stores it (UTC, six digits); it takes exactly that form."""
    if not isinstance(value, str):
        raise _cannot_handle(kind, f"json: cannot unmarshal {_json_type(value)} into Go struct field {field}")
    if not _MICRO.fullmatch(value):
        raise _cannot_handle(kind, f'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00"')
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _cannot_handle(kind: Kind, why: str) -> ApiError:
    return bad_request(f'{kind.kind} in version "v1" cannot be handled as a {kind.kind}: {why}')


# ------------------------------------------------------------------ decoding


def decode(kind: Kind, doc: Any) -> JSON:
    """A request's object as the server reads it: the kind's own fields only, maps and
    lists left empty dropped, types checked (400), the kind's defaults filled in."""
    if not isinstance(doc, dict):
        raise _cannot_handle(kind, f"json: cannot unmarshal {_json_type(doc)} into Go value of type struct")
    obj: JSON = {"kind": kind.kind, "apiVersion": kind.api_version}
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise _cannot_handle(kind, "json: cannot unmarshal into Go struct field .metadata of type v1.ObjectMeta")
    obj["metadata"] = _metadata(kind, meta or {})
    for key in _TOP[kind.resource]:
        if key in doc and doc[key] is not None:
            obj[key] = doc[key]
    for key in ("data", "binaryData", "stringData"):
        if key in obj:
            obj[key] = _string_map(kind, key, obj[key])
            if not obj[key]:
                del obj[key]
    if "immutable" in obj and not isinstance(obj["immutable"], bool):
        raise _cannot_handle(kind, "json: cannot unmarshal into Go struct field .immutable of type bool")
    if kind.resource == "secrets":
        _secret(kind, obj)
    elif kind.resource == "leases":
        obj["spec"] = _lease_spec(kind, obj.get("spec"))
    elif kind.resource == "namespaces":
        given = obj.get("spec")
        spec: JSON = given if isinstance(given, dict) else {}
        obj["spec"] = {k: v for k, v in spec.items() if k == "finalizers" and v}
        obj["status"] = {}
        name = obj["metadata"].get("name")
        if name:  # the server's default: every namespace is labelled with its name
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    return obj


def _metadata(kind: Kind, meta: Mapping[str, Any]) -> JSON:
    out = {k: v for k, v in meta.items() if k in _META and v is not None}
    for key in ("labels", "annotations"):
        if key in out:
            out[key] = _string_map(kind, f"metadata.{key}", out[key])
    if "finalizers" in out:
        if not isinstance(out["finalizers"], list) or not all(isinstance(f, str) for f in out["finalizers"]):
            raise _cannot_handle(
                kind, "json: cannot unmarshal into Go struct field .metadata.finalizers of type string"
            )
    for key in ("labels", "annotations", "finalizers", "ownerReferences", "managedFields"):
        if key in out and not out[key]:
            del out[key]
    for key in ("name", "generateName", "namespace", "uid", "resourceVersion"):
        if key in out and not isinstance(out[key], str):
            raise _cannot_handle(kind, f"json: cannot unmarshal into Go struct field .metadata.{key} of type string")
        if out.get(key) == "":
            del out[key]
    return out


def _string_map(kind: Kind, field: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _cannot_handle(kind, f"json: cannot unmarshal {_json_type(value)} into Go struct field .{field}")
    for v in value.values():
        if not isinstance(v, str):
            raise _cannot_handle(
                kind, f"json: cannot unmarshal {_json_type(v)} into Go struct field .{field} of type string"
            )
    return dict(value)


def _secret(kind: Kind, obj: JSON) -> None:
    data = obj.get("data") or {}
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _cannot_handle(kind, f"illegal base64 data in data[{key!r}]") from None
    for key, value in (obj.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(value.encode()).decode()
    if data:
        obj["data"] = data
    obj.setdefault("type", "Opaque")


def _lease_spec(kind: Kind, spec: Any) -> JSON:
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise _cannot_handle(kind, "json: cannot unmarshal into Go struct field Lease.spec of type v1.LeaseSpec")
    out: JSON = {}
    for key, want in _LEASE_SPEC.items():
        if key not in spec or spec[key] is None:
            continue
        value = spec[key]
        where = f"LeaseSpec.spec.{key}"
        if want == "micro":
            out[key] = _micro_time(kind, where, value)
        elif want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise _cannot_handle(kind, f"json: cannot unmarshal {_json_type(value)} into Go struct field {where}")
        elif want is str and not isinstance(value, str):
            raise _cannot_handle(kind, f"json: cannot unmarshal {_json_type(value)} into Go struct field {where}")
        else:
            out[key] = value
    return out


# ------------------------------------------------------------------ validation (422)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DATA_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def validate(kind: Kind, obj: JSON, old: JSON | None) -> None:
    """What the real server's validation refuses (422) of what coordinator and its tests
    write: names, sizes of annotations and data, data keys, immutable objects."""
    meta = obj["metadata"]
    name = meta.get("name", "")
    if not name:
        raise invalid(
            kind, "", "metadata.name", "FieldValueRequired", "Required value: name or generateName is required"
        )
    if kind.resource == "namespaces":
        ok = len(name) <= 63 and _DNS_LABEL.fullmatch(name)
    else:
        ok = len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name)
    if not ok:
        raise invalid(
            kind, name, "metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": a lowercase RFC 1123 name'
        )
    annotations = meta.get("annotations") or {}
    if sum(len(k) + len(v) for k, v in annotations.items()) > MAX_ANNOTATIONS_BYTES:
        raise invalid(
            kind,
            name,
            "metadata.annotations",
            "FieldValueTooLong",
            f"Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes",
        )
    if kind.resource in ("configmaps", "secrets"):
        _validate_data(kind, name, obj, old)


def _validate_data(kind: Kind, name: str, obj: JSON, old: JSON | None) -> None:
    data = obj.get("data") or {}
    binary = obj.get("binaryData") or {}
    for key in [*data, *binary]:
        if not _DATA_KEY.fullmatch(key) or len(key) > 253:
            field = f"data[{key}]"
            raise invalid(kind, name, field, "FieldValueInvalid", f'Invalid value: "{key}": a valid config key')
    if kind.resource == "configmaps":
        size = sum(len(v) for v in data.values()) + sum(len(base64.b64decode(v)) for v in binary.values())
        if size > MAX_DATA_BYTES:
            raise invalid(
                kind, name, "[]", "FieldValueTooLong", f"Too long: may not be more than {MAX_DATA_BYTES} bytes"
            )
    else:
        size = sum(len(base64.b64decode(v)) for v in data.values())
        if size > MAX_DATA_BYTES:
            raise invalid(
                kind, name, "data", "FieldValueTooLong", f"Too long: must have at most {MAX_DATA_BYTES} bytes"
            )
    if old is not None and old.get("immutable"):
        same = old.get("data") == obj.get("data") and old.get("binaryData") == obj.get("binaryData")
        if not same or not obj.get("immutable"):
            field = "data" if not same else "immutable"
            raise invalid(
                kind, name, field, "FieldValueForbidden", "Forbidden: field is immutable when `immutable` is set"
            )


def stored_size(key: str, obj: JSON) -> int:
    """About what etcd is asked to store for ``obj`` (the real server stores protobuf,
    about as long for objects of text)."""
    return len(key) + len(json.dumps(obj, separators=(",", ":")))


def check_stored_size(key: str, obj: JSON) -> None:
    size = stored_size(key, obj)
    if size > GRPC_MAX_SEND_BYTES:
        raise ApiError(
            500,
            None,
            "rpc error: code = ResourceExhausted desc = trying to send message larger than max "
            f"({size} vs. {GRPC_MAX_SEND_BYTES})",
        )
    if size > ETCD_MAX_REQUEST_BYTES:
        raise ApiError(500, None, "etcdserver: request is too large")


# ------------------------------------------------------------------ selectors


def label_selector(text: str) -> Any:
    """A predicate on labels for a labelSelector (equality, inequality, existence, in,
    notin); 400 for one that cannot be read."""
    terms = []
    for part in _split_terms(text):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)", part)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            terms.append((m.group(1), m.group(2), values))
            continue
        m = re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*([^\s!=,]*)", part)
        if m:
            terms.append((m.group(1), "!=" if m.group(2) == "!=" else "=", {m.group(3)}))
            continue
        m = re.fullmatch(r"(!?)([^\s!=]+)", part)
        if m:
            terms.append((m.group(2), "!" if m.group(1) else "exists", set()))
            continue
        raise bad_request(f"unable to parse requirement: found '{part}', expected: identifier")

    def matches(labels: Mapping[str, str]) -> bool:
        for key, op, values in terms:
            has = key in labels
            if op == "exists" and not has:
                return False
            if op == "!" and has:
                return False
            if op in ("=", "in") and (not has or labels[key] not in values):
                return False
            if op in ("!=", "notin") and has and labels[key] in values:
                return False
        return True

    return matches


def _split_terms(text: str) -> list[str]:
    out, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    return out


def field_selector(text: str) -> Any:
    """A predicate on an object for a fieldSelector on ``metadata.name`` and
    ``metadata.namespace`` (what every kind supports); 400 for any other field."""
    terms = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(.*)", part)
        if not m or m.group(1) not in ("metadata.name", "metadata.namespace"):
            raise bad_request(f'"{part}" is not a known field selector: only "metadata.name", "metadata.namespace"')
        terms.append((m.group(1).split(".")[1], m.group(2) != "!=", m.group(3)))

    def matches(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return all((meta.get(f, "") == v) == eq for f, eq, v in terms)

    return matches
