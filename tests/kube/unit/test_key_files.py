"""No certificate or key of a kubeconfig is left on disk once a client's TLS context is built.

The client library writes embedded TLS data (``certificate-authority-data``,
``client-certificate-data``, ``client-key-data``) and an exec plugin's client certificate
and key to files of its own in the temporary directory, and removes them only at
interpreter exit: a command killed with SIGKILL left the user's private key behind. Here
the temporary directory is one of the test's own, so "nothing left" is checked exactly,
and a local TLS server that demands a client certificate proves that the material held in
memory is the one the connection presents, on the first connection and on a reconnect
whose context is built again.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from helpers.certs import signed
from kubernetes_asyncio.config import kube_config

from coordinator.kube import tls
from coordinator.kube.client import Endpoint, load_client_configuration
from coordinator.kube.transport import Request
from coordinator.kube.wire import AiohttpTransport

# ------------------------------------------------------------------ material


class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all fresh (so
    that no file the library wrote for other tests is reused for these)."""

    def __init__(self, where: Path) -> None:
        self.ca, _, ca_key, ca_cert = signed("test-ca")
        self.server_cert, self.server_key, _, _ = signed("server", (ca_key, ca_cert), ip="127.0.0.1")
        self.cert, self.key, _, _ = signed("client-alice", (ca_key, ca_cert))
        self.files = where
        where.mkdir()
        for name in ("ca", "server_cert", "server_key", "cert", "key"):
            (where / f"{name}.pem").write_bytes(getattr(self, name))

    def path(self, name: str) -> str:
        return str(self.files / f"{name}.pem")

    def secrets(self) -> dict[str, bytes]:
        """What must be left nowhere: the key's PEM, a line of its base64, the certificates."""
        body = [line for line in self.key.splitlines() if line and not line.startswith(b"-----")]
        return {"client key": self.key, "client key line": body[0], "client certificate": self.cert, "CA": self.ca}


@pytest.fixture
def tmpdir_of_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory of this process, for the test alone (TMPDIR and
    ``tempfile.tempdir``, which the library's mkstemp and ours use)."""
    where = tmp_path / "tmp"
    where.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(where))
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


@pytest.fixture(params=["memfd", "private-file"])
def transient(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways material reaches OpenSSL: Linux's anonymous memory file, and elsewhere a
    file of its own in a private directory, removed at once."""
    if request.param == "private-file":
        monkeypatch.delattr(os, "memfd_create", raising=False)
    elif not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create here")
    return str(request.param)


def _left_behind(where: Path, secrets: dict[str, bytes]) -> list[str]:
    """Every file under ``where``, and what of ``secrets`` each holds."""
    found = []
    for path in sorted(where.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            holds = [what for what, secret in secrets.items() if secret in data] or ["nothing known"]
            found.append(f"{path.relative_to(where)} ({', '.join(holds)})")
    return found


def _kubeconfig(path: Path, server: str, cluster: dict[str, Any], user: dict[str, Any]) -> Endpoint:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return Endpoint("c1", "x", str(path))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ------------------------------------------------------------------ a server that wants a client certificate


@asynccontextmanager
async def _mtls_server(pki: Pki) -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTPS server on 127.0.0.1 that refuses a connection without a client
    certificate of the CA; yields its URL and the common names of the clients it saw."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki.path("ca"))
    context.load_cert_chain(pki.path("server_cert"), pki.path("server_key"))
    context.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            peer = writer.get_extra_info("peercert") or {}
            seen.append(next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), ""))
            await reader.readuntil(b"\r\n\r\n")
            body = json.dumps({"kind": "Status", "seen": seen[-1]}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    try:
        port = server.sockets[0].getsockname()[1]
        yield f"https://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


async def _ask(transport: AiohttpTransport) -> dict[str, Any]:
    async with transport.send(Request("GET", "/version"), timeout=10) as reply:
        assert reply.status == 200
        answer: dict[str, Any] = json.loads(await reply.read())
        return answer


async def _connect_twice(endpoint: Endpoint) -> list[str]:
    """Open a transport, ask once, close; drop the process's TLS contexts (so that the
    reconnect builds its own again, from memory); open, ask, close. The client names
    the server saw."""
    names = []
    for _ in range(2):
        tls._tls_cache.clear()
        transport = AiohttpTransport(endpoint)
        try:
            await transport.open()
            names.append(str((await _ask(transport))["seen"]))
        finally:
            await transport.close()
    return names


# ------------------------------------------------------------------ the tests


def test_embedded_key_is_in_no_file_once_the_context_is_built(
    tmp_path: Path, tmpdir_of_test: Path, pki: Pki, transient: str
) -> None:
    """The defect itself: a kubeconfig embedding the CA, the client certificate and its
    key. Once the transport is built (and then again after a reconnect), the temporary
    directory holds nothing at all; the server saw the client certificate both times."""

    async def go() -> tuple[list[str], list[str]]:
        async with _mtls_server(pki) as (url, _):
            endpoint = _kubeconfig(
                tmp_path / "kubeconfig",
                url,
                {"certificate-authority-data": _b64(pki.ca)},
                {"client-certificate-data": _b64(pki.cert), "client-key-data": _b64(pki.key)},
            )
            tls._tls_cache.clear()
            transport = AiohttpTransport(endpoint)
            try:
                await transport.open()  # the configuration loaded, the TLS context built
                after_open = _left_behind(tmpdir_of_test, pki.secrets())
                await _ask(transport)
            finally:
                await transport.close()
            return after_open, await _connect_twice(endpoint)

    after_open, names = anyio.run(go)
    assert after_open == [], f"left in the temporary directory once the transport was built: {after_open}"
    assert names == ["client-alice", "client-alice"]
    assert _left_behind(tmpdir_of_test, pki.secrets()) == []


def test_material_held_in_memory_says_nothing_of_itself(tmp_path: Path, tmpdir_of_test: Path, pki: Pki) -> None:
    endpoint = _kubeconfig(
        tmp_path / "kubeconfig",
        "https://127.0.0.1:1",
        {"certificate-authority-data": _b64(pki.ca)},
        {"client-certificate-data": _b64(pki.cert), "client-key-data": _b64(pki.key)},
    )
    cfg = anyio.run(load_client_configuration, endpoint)
    # Nothing names a file: the library was never given the data to write one.
    assert (cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file) == (None, None, None)
    material = tls.tls_material(cfg)
    assert (material.ca, material.cert, material.key) == (pki.ca, pki.cert, pki.key)
    assert repr(material) == "TlsMaterial(in memory: ca, cert, key)"
    assert not any(path.startswith(str(tmpdir_of_test)) for path in kube_config._temp_files.values())


def test_files_the_kubeconfig_names_are_used_and_kept(tmp_path: Path, tmpdir_of_test: Path, pki: Pki) -> None:
    """A kubeconfig naming its certificate, key and CA files: they are read where they
    are and stay there; nothing is written. Mixed (embedded certificate, key file; CA
    file, embedded key) works alike."""
    named = {"certificate-authority": pki.path("ca")}
    users = [
        {"client-certificate": pki.path("cert"), "client-key": pki.path("key")},
        {"client-certificate-data": _b64(pki.cert), "client-key": pki.path("key")},
        {"client-certificate": pki.path("cert"), "client-key-data": _b64(pki.key)},
    ]

    async def go() -> list[list[str]]:
        out = []
        async with _mtls_server(pki) as (url, _):
            for i, user in enumerate(users):
                out.append(await _connect_twice(_kubeconfig(tmp_path / f"kubeconfig-{i}", url, named, user)))
        return out

    assert anyio.run(go) == [["client-alice", "client-alice"]] * len(users)
    for name in ("ca", "cert", "key"):
        assert Path(pki.path(name)).read_bytes() == getattr(pki, name)
    assert _left_behind(tmpdir_of_test, pki.secrets()) == []


def test_exec_plugin_certificate_and_key_leave_no_file(tmp_path: Path, tmpdir_of_test: Path, pki: Pki) -> None:
    """An exec plugin that gives a client certificate and key (the library writes those to
    files itself): they are read back and removed at once, and the library is made to
    forget them, so that a reconnect (the plugin run again, the same output) works."""
    plugin = tmp_path / "plugin.py"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": pki.cert.decode(), "clientKeyData": pki.key.decode()},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o700)
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}}

    async def go() -> list[str]:
        async with _mtls_server(pki) as (url, _):
            endpoint = _kubeconfig(
                tmp_path / "kubeconfig", url, {"certificate-authority-data": _b64(pki.ca)}, exec_user
            )
            return await _connect_twice(endpoint)

    assert anyio.run(go) == ["client-alice", "client-alice"]
    assert _left_behind(tmpdir_of_test, pki.secrets()) == []
    assert list(tmpdir_of_test.iterdir()) == []  # the private directory of each load is gone too
    assert not any(path.startswith(str(tmpdir_of_test)) for path in kube_config._temp_files.values())


def test_exec_plugin_token_and_bearer_token_still_work(tmp_path: Path, tmpdir_of_test: Path, pki: Pki) -> None:
    """Tokens (from the kubeconfig, from an exec plugin) with an embedded CA: the
    credentials reach the request; nothing is written."""
    plugin = tmp_path / "plugin.py"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-the-plugin"},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o700)
    cluster = {"certificate-authority-data": _b64(pki.ca)}
    for i, (user, header) in enumerate(
        [
            ({"token": "from-the-kubeconfig"}, "Bearer from-the-kubeconfig"),
            (
                {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}},
                "Bearer from-the-plugin",
            ),
        ]
    ):
        endpoint = _kubeconfig(tmp_path / f"k{i}", "https://127.0.0.1:1", cluster, user)
        cfg = anyio.run(load_client_configuration, endpoint)
        assert anyio.run(cfg.auth_settings)["BearerToken"]["value"] == header
        assert tls.tls_material(cfg).ca == pki.ca and tls.tls_context(cfg).get_ca_certs()
    assert list(tmpdir_of_test.iterdir()) == []


@pytest.fixture
def no_memfd(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delattr(os, "memfd_create", raising=False)
    yield


def test_transient_file_is_private_and_gone_after_the_block(tmpdir_of_test: Path, no_memfd: None) -> None:
    """Where there is no memfd: a file (0600) in a directory (0700) of its own, removed
    when the block ends, by an error too."""
    with tls.transient_pem_path(b"secret bytes") as path:
        assert Path(path).read_bytes() == b"secret bytes"
        assert Path(path).stat().st_mode & 0o777 == 0o600
        assert Path(path).parent.stat().st_mode & 0o777 == 0o700
        assert Path(path).parent.parent == tmpdir_of_test
    assert list(tmpdir_of_test.iterdir()) == []
    with pytest.raises(RuntimeError), tls.transient_pem_path(b"secret bytes"):
        raise RuntimeError("loading failed")
    assert list(tmpdir_of_test.iterdir()) == []


def test_an_embedded_ca_bundle_with_comments_loads_as_a_file_did(
    tmp_path: Path, tmpdir_of_test: Path, pki: Pki
) -> None:
    """A CA bundle whose comments are not ASCII (as certifi's are) loads from memory as it
    loaded from the library's file (``cadata`` would refuse it with a TypeError)."""
    bundle = "# Label: Főtanúsítvány\n".encode() + pki.ca
    endpoint = _kubeconfig(
        tmp_path / "kubeconfig", "https://127.0.0.1:1", {"certificate-authority-data": _b64(bundle)}, {"token": "t"}
    )
    cfg = anyio.run(load_client_configuration, endpoint)
    assert [c["subject"] for c in tls.tls_context(cfg).get_ca_certs()] == [((("commonName", "test-ca"),),)]
    assert list(tmpdir_of_test.iterdir()) == []
