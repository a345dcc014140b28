"""Kubeconfig documents for sandbox users, written atomically."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from coordinator_sandbox.pki import write_private


@dataclass(frozen=True)
class KubeUser:
    """A user entry: either a client certificate (PEM) or a bearer token."""

    name: str
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None

    def to_entry(self) -> dict[str, Any]:
        user: dict[str, str] = {}
        if self.cert_pem is not None and self.key_pem is not None:
            user["client-certificate-data"] = _b64(self.cert_pem)
            user["client-key-data"] = _b64(self.key_pem)
        if self.token is not None:
            user["token"] = self.token
        return {"name": self.name, "user": user}


@dataclass(frozen=True)
class KubeContext:
    name: str
    cluster: str
    user: str
    namespace: str | None = None

    def to_entry(self) -> dict[str, Any]:
        context = {"cluster": self.cluster, "user": self.user}
        if self.namespace:
            context["namespace"] = self.namespace
        return {"name": self.name, "context": context}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def render(
    *,
    servers: Sequence[tuple[str, str]],
    ca_pem: bytes,
    users: Sequence[KubeUser],
    contexts: Sequence[KubeContext],
    current: str,
) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates embedded); ``servers`` is (name, url)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {"name": name, "cluster": {"server": url, "certificate-authority-data": _b64(ca_pem)}}
            for name, url in servers
        ],
        "users": [user.to_entry() for user in users],
        "contexts": [context.to_entry() for context in contexts],
        "current-context": current,
    }


def write(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` (mode 0600: it holds keys and tokens)."""
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    write_private(path, text.encode())
