"""A tiny synchronous HTTPS client for the sandbox's own housekeeping.

The sandbox only needs a handful of calls as cluster-admin (readiness, namespaces,
RBAC objects), so it uses the standard library rather than the tool's Kubernetes layer:
the sandbox stays independent of the code it is used to test.
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSON = dict[str, Any]


class AdminRequestError(Exception):
    """An API call answered with an unexpected status, or could not be made at all."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self) -> JSON:
        data = json.loads(self.body or b"{}")
        if not isinstance(data, dict):
            raise AdminRequestError(f"expected a JSON object, got {type(data).__name__}")
        return data


class AdminClient:
    """Cluster-admin access to one sandbox kube-apiserver (client certificate auth)."""

    def __init__(self, port: int, *, ca_file: Path, cert_file: Path, key_file: Path, timeout: float = 5.0) -> None:
        self.port = port
        self.timeout = timeout
        self._context = ssl.create_default_context(cafile=str(ca_file))
        self._context.load_cert_chain(str(cert_file), str(key_file))

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        *,
        timeout: float | None = None,
    ) -> Response:
        """Send one request; connection and TLS failures raise :class:`AdminRequestError`."""
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self._context, timeout=timeout or self.timeout
        )
        headers = {"Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=payload, headers=headers)
            reply = conn.getresponse()
            return Response(reply.status, reply.read())
        except (OSError, http.client.HTTPException) as err:
            raise AdminRequestError(f"{method} {self.server}{path}: {err or type(err).__name__}") from err
        finally:
            conn.close()

    def get(self, path: str, *, timeout: float | None = None) -> JSON | None:
        """The object at ``path``, or None when it does not exist."""
        reply = self.request("GET", path, timeout=timeout)
        if reply.status == 404:
            return None
        self._expect(reply, "GET", path, 200)
        return reply.json()

    def create(self, collection: str, obj: JSON, *, exist_ok: bool = True) -> JSON:
        """POST ``obj`` to ``collection``; an existing object is fine when ``exist_ok``."""
        reply = self.request("POST", collection, obj)
        if reply.status == 409 and exist_ok:
            return obj
        self._expect(reply, "POST", collection, 200, 201, 202)
        return reply.json()

    def delete(self, path: str) -> None:
        reply = self.request("DELETE", path)
        if reply.status != 404:
            self._expect(reply, "DELETE", path, 200, 202)

    def ready(self, *, timeout: float = 2.0) -> tuple[bool, str]:
        """(ready?, why not) from ``/readyz``; never raises."""
        try:
            reply = self.request("GET", "/readyz", timeout=timeout)
        except AdminRequestError as err:
            return False, str(err)
        text = reply.body.decode(errors="replace").strip()
        if reply.status == 200 and text == "ok":
            return True, ""
        return False, f"/readyz answered {reply.status}: {text[-300:]}"

    def _expect(self, reply: Response, method: str, path: str, *ok: int) -> None:
        if reply.status not in ok:
            text = reply.body.decode(errors="replace")[:500]
            raise AdminRequestError(f"{method} {self.server}{path} answered {reply.status}: {text}", reply.status)
