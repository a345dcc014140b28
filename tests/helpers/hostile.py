"""Hostile text and servers: terminal escapes, forged lines, a proxy that answers anything, a planting user."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import anyio
from coord_fixtures import Env

from coordinator.kube.client import Endpoint, KubeClient

# A terminal escape that sets the window title: what a hostile value carries.
TITLE = "\x1b]0;pwned\x07"


# Characters no printed text may carry raw (escapes, carriage return, bell, backspace, bidi override).
RAW = ("\x1b", "\x9b", "\r", "\x07", "\x08", "\u202e")


# The start of a line a hostile value tries to forge in an error paragraph.
FORGED = "Error: forged line"


def clean(text: str) -> None:
    """Fail if ``text`` carries a raw control character or a line starting with FORGED."""
    for ch in RAW:
        assert ch not in text, (ch, text)
    for line in text.splitlines():
        assert not line.lstrip().startswith(FORGED), line


def no_crash(proc: subprocess.CompletedProcess[str]) -> None:
    """Fail if a command crashed (exit 1, an internal error or a traceback)."""
    assert proc.returncode != 1, f"exit 1: {proc.stdout}\n{proc.stderr}"
    assert "Internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


class Hostile:
    """A plain-HTTP server standing for a proxy that answers whatever the test says."""

    def __init__(self, tmp_path: Path) -> None:
        import http.server

        self.answer: tuple[int, dict[str, str], bytes] = (200, {}, b"{}")
        self.authorizations: set[str] = set()  # every Authorization header it was sent
        hostile = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                hostile.authorizations.add(self.headers.get("Authorization") or "")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, headers, body = hostile.answer
                self.send_response_only(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        port = self.server.server_address[1]
        self.kubeconfig = tmp_path / "hostile.kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f'clusters: [{{name: p, cluster: {{server: "http://127.0.0.1:{port}"}}}}]\n'
            "users: [{name: u, user: {}}]\n"
            "contexts: [{name: p, context: {cluster: p, user: u}}]\ncurrent-context: p\n"
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# What Hostile answers, by case: headers and bodies no server should send.
HOSTILE_ANSWERS = {
    "Date with an offset no datetime holds": (
        200,
        {"Date": "Mon, 01 Jan 2020 00:00:00 -99999999999999999999", "Content-Type": "application/json"},
        b"{}",
    ),
    "error body nested 5000 deep": (500, {}, b"[" * 5000),
    "success body nested 5000 deep": (200, {}, b"[" * 5000),
    "429 whose Retry-After date overflows": (
        429,
        {"Retry-After": "Mon, 01 Jan 2020 00:00:00 -99999999999999999999", "Date": "Mon, 01 Jan 2020 00:00:00 GMT"},
        b"{}",
    ),
}


# The case name under which the leak script raises inside the request instead of answering.
BUG = "a bug inside the request"


def minted_user(env: Env, tmp_path: Path) -> Any:
    """A user granted deployment `app` only (the printed rights): its minted kubeconfig."""
    from helpers.rbac import grant, mint_user

    user, minted = mint_user(env.sandbox, tmp_path, "planter")
    grant(env.sandbox, env, env.namespace, user, deployments=("app",))
    return minted


def request_as(
    minted: Any, index: int, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
) -> Any:
    """One raw API request on cluster ``index`` as the minted user; the answer's body."""

    async def go() -> Any:
        client = KubeClient(Endpoint(f"u{index}", minted.contexts[index - 1], str(minted.path)), timeout=5)
        try:
            return (await client.request(method, path, body=body, query=query)).body
        finally:
            await client.close()

    return anyio.run(go)
