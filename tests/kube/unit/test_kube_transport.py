"""The client over its transport (coordinator/kube/transport.py): what KubeClient puts on
the wire and how it reads what comes back, whatever carries the bytes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import pytest

from coordinator.kube.client import USER_AGENT, Endpoint, KubeClient, KubeError, request_events
from coordinator.kube.transport import Request, TransportError


@dataclass
class Scripted:
    """A transport that answers from a script: (status, headers, body) per request, or
    an exception to raise, or "hang" to never answer."""

    answers: list[object]
    sent: list[Request] = field(default_factory=list)
    opened: int = 0
    closed: int = 0
    server: str = "https://scripted:1"

    async def open(self) -> None:
        self.opened += 1

    async def close(self) -> None:
        self.closed += 1

    @asynccontextmanager
    async def send(self, request: Request, *, timeout: float) -> AsyncIterator[_Reply]:
        self.sent.append(request)
        answer = self.answers.pop(0)
        if answer == "hang":
            await anyio.sleep_forever()
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, tuple)
        yield _Reply(*answer)

    @asynccontextmanager
    async def watch(self, request: Request, *, timeout: float, connect_timeout: float) -> AsyncIterator[_Reply]:
        self.sent.append(request)
        answer = self.answers.pop(0)
        assert isinstance(answer, tuple)
        yield _Reply(*answer)


class _Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self._headers = {k.lower(): v for k, v in headers.items()}
        self._body = body

    def header(self, name: str) -> str | None:
        return self._headers.get(name.lower())

    async def read(self) -> bytes:
        body, self._body = self._body, b""
        return body

    async def readline(self) -> bytes:
        line, sep, self._body = self._body.partition(b"\n")
        return line + sep


DATE = {"Date": "Sat, 05 Dec 2026 20:07:12 GMT"}


def _client(script: Scripted, timeout: float = 5.0) -> KubeClient:
    return KubeClient(Endpoint("c1", "x"), timeout=timeout, transport=script)


def test_a_request_is_encoded_for_the_wire_and_its_answer_decoded() -> None:
    script = Scripted([(201, DATE, b'{"kind": "Lease", "metadata": {"name": "l"}}')])
    events: list[str] = []

    async def go() -> None:
        request_events.set(events.append)
        client = _client(script)
        resp = await client.request("POST", "/x", query={"fieldManager": "m", "dryRun": True}, body={"a": "é"})
        assert resp.status == 201 and resp.body["metadata"] == {"name": "l"}
        assert resp.server_time is not None and resp.server_time.isoformat() == "2026-12-05T20:07:12+00:00"
        assert client.server == "https://scripted:1"
        await client.close()

    anyio.run(go)
    (sent,) = script.sent
    assert (sent.method, sent.path, sent.query) == ("POST", "/x", (("fieldManager", "m"), ("dryRun", "true")))
    assert dict(sent.headers) == {"Accept": "application/json", "Content-Type": "application/json",
                                  "User-Agent": USER_AGENT}  # fmt: skip
    assert USER_AGENT.startswith("coordinator/")  # the server names the default field manager after it
    assert sent.body == json.dumps({"a": "é"}).encode()
    assert events == ["sent", "answered"]
    assert (script.opened, script.closed) == (1, 1)


@pytest.mark.parametrize(
    ("error", "kind", "detail"),
    [
        (TransportError("cannot connect to x: refused"), "unreachable", "cannot connect to x: refused"),
        (TransportError("TLS certificate rejected: bad", unreachable=False), "error", "TLS certificate rejected: bad"),
        ("hang", "unreachable", "no answer within 0.2s"),
    ],
)
def test_what_the_transport_could_not_carry_is_classified(error: object, kind: str, detail: str) -> None:
    script = Scripted([error])

    async def go() -> KubeError:
        with pytest.raises(KubeError) as caught:
            await _client(script, timeout=0.2).request("GET", "/x")
        return caught.value

    err = anyio.run(go)
    assert (err.kind, err.detail) == (kind, detail)


def test_a_throttled_request_is_sent_again_after_retry_after() -> None:
    status = json.dumps({"kind": "Status", "reason": "TooManyRequests", "code": 429}).encode()
    script = Scripted([(429, {"Retry-After": "0.1", **DATE}, status), (200, DATE, b"{}")])

    async def go() -> None:
        await _client(script).request("GET", "/x")

    anyio.run(go)
    assert len(script.sent) == 2 and script.sent[0] == script.sent[1]


def test_a_watch_reads_events_line_by_line_and_an_error_status_is_classified() -> None:
    lines = b'{"type": "ADDED", "object": {}}\nnot json\n{"type": "BOOKMARK", "object": {}}\n'
    gone = json.dumps({"kind": "Status", "reason": "Forbidden", "message": "no", "code": 403}).encode()
    script = Scripted([(200, DATE, lines), (403, DATE, gone)])

    async def go() -> list[str]:
        client = _client(script)
        seen = [e["type"] async for e in client.watch("/w", query={"labelSelector": "a=b"}, timeout=30)]
        with pytest.raises(KubeError) as caught:
            async for _ in client.watch("/w", query={}, timeout=30):
                pass
        assert caught.value.kind == "forbidden"
        return seen

    assert anyio.run(go) == ["ADDED", "BOOKMARK"]
    first = script.sent[0]
    assert first.query == (("labelSelector", "a=b"), ("watch", "true"), ("timeoutSeconds", "30"))
    assert first.headers["User-Agent"] == USER_AGENT and first.body is None
