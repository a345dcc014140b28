"""The kinds of failure of the one door to the API server (coordinator/kube/client.py)."""

from __future__ import annotations

import json

import pytest

from coordinator.kube import client as kube
from coordinator.kube.client import ErrorKind, KubeError, _classify_status


def test_the_module_names_are_the_enum_members() -> None:
    for member in ErrorKind:
        assert getattr(kube, member.name) is member
    assert kube.IDENTITY_MISMATCH == "identity-mismatch" and kube.NOT_FOUND == "not-found"


def test_a_kind_given_as_text_becomes_the_member_and_an_unknown_one_is_refused() -> None:
    err = KubeError("not-found", "gone")
    assert err.kind is ErrorKind.NOT_FOUND and err.kind == "not-found"  # type: ignore[comparison-overlap]
    assert f"{err.kind}: {err.detail}" == "not-found: gone"  # reads as its value in messages
    assert json.dumps({"kind": err.kind}) == '{"kind": "not-found"}'
    with pytest.raises(ValueError):
        KubeError("not-fund", "a typo")


@pytest.mark.parametrize(
    ("status", "reason", "kind"),
    [
        (401, None, ErrorKind.FORBIDDEN),
        (403, None, ErrorKind.FORBIDDEN),
        (404, None, ErrorKind.NOT_FOUND),
        (409, "Conflict", ErrorKind.CONFLICT),
        (409, "AlreadyExists", ErrorKind.ALREADY_EXISTS),
        (429, None, ErrorKind.THROTTLED),
        (502, None, ErrorKind.UNREACHABLE),
        (503, None, ErrorKind.UNREACHABLE),
        (504, None, ErrorKind.UNREACHABLE),
        (500, None, ErrorKind.ERROR),
        (410, "Expired", ErrorKind.ERROR),
    ],
)
def test_every_status_is_classified_into_one_kind(status: int, reason: str | None, kind: ErrorKind) -> None:
    body = {"reason": reason, "message": "m"} if reason else {"message": "m"}
    err = _classify_status(status, json.dumps(body).encode(), body)
    assert err.kind is kind and err.status == status
