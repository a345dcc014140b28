"""How coordinator.kube.client builds clients, without a cluster: kubeconfig merging,
the copy each loader gets, and the shared TLS contexts."""

from __future__ import annotations

import base64
import copy
import os
import re
import ssl
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from helpers.certs import signed
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.kube_config import ConfigNode, KubeConfigLoader, KubeConfigMerger

from coordinator.errors import UsageError
from coordinator.kube import client as kc
from coordinator.kube import wire
from coordinator.kube.client import Endpoint, KubeClient, load_client_configuration
from coordinator.kube.transport import Request

# ------------------------------------------------------------------ material


def _pem_pair(tmp: Path, name: str, issuer: tuple[Any, x509.Certificate] | None = None) -> tuple[Path, Path]:
    cert, key, _, _ = signed(name, issuer)
    crt, pem_key = tmp / f"{name}.crt", tmp / f"{name}.key"
    crt.write_bytes(cert)
    pem_key.write_bytes(key)
    return crt, pem_key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("pki")
    ca_crt, ca_key = _pem_pair(tmp, "ca")
    ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    ca_private = serialization.load_pem_private_key(ca_key.read_bytes(), None)
    user_crt, user_key = _pem_pair(tmp, "user", (ca_private, ca_cert))
    other_ca, _ = _pem_pair(tmp, "other-ca")
    return {"ca": ca_crt, "cert": user_crt, "key": user_key, "other_ca": other_ca}


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _cluster(name: str, server: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": server, **extra}}


def _context(name: str, cluster: str, user: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"cluster": cluster}
    if user:
        body["user"] = user
    return {"name": name, "context": body}


def _write(path: Path, doc: Any) -> str:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def _tree(node: Any, *, names: bool = True) -> Any:
    """A ConfigNode tree as plain, comparable data (paths included, and names unless not
    ``names``)."""
    if isinstance(node, ConfigNode):
        return ("node", node.name if names else None, node.path, _tree(node.value, names=names))
    if isinstance(node, dict):
        return {k: _tree(v, names=names) for k, v in node.items()}
    if isinstance(node, list):
        return [_tree(v, names=names) for v in node]
    return node


# ------------------------------------------------------------------ merging


def _multi_file_sets(tmp: Path, pki: dict[str, Path]) -> list[list[str]]:
    """Kubeconfig file lists with overlapping names and current-context in various files."""
    a = _write(
        tmp / "a.yaml",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {"colors": True},
            "current-context": "ctx-a",
            "clusters": [
                _cluster("shared", "https://127.0.0.1:1001", **{"certificate-authority-data": _b64(pki["ca"])}),
                _cluster("only-a", "https://127.0.0.1:1002", **{"certificate-authority": str(pki["ca"])}),
            ],
            "users": [{"name": "u", "user": {"token": "from-a"}}],
            "contexts": [_context("ctx-a", "shared", "u"), _context("both", "only-a", "u")],
        },
    )
    b = _write(
        tmp / "b.yaml",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "ctx-b",
            "clusters": [
                _cluster("shared", "https://127.0.0.1:2001"),  # a's wins when a comes first
                _cluster("only-b", "https://127.0.0.1:2002", **{"insecure-skip-tls-verify": True}),
            ],
            "users": [
                {"name": "u", "user": {"token": "from-b"}},
                {"name": "cert-user", "user": {"client-certificate": "user.crt", "client-key": "user.key"}},
            ],
            "contexts": [_context("ctx-b", "only-b", "cert-user"), _context("both", "shared", None)],
        },
    )
    c = _write(tmp / "c.yaml", {"apiVersion": "v1", "clusters": None, "contexts": [_context("ctx-c", "shared", "u")]})
    d = _write(tmp / "d.yaml", {"apiVersion": "v1", "current-context": "ctx-c"})  # no lists at all
    return [[a], [b], [a, b], [b, a], [a, b, c], [c, a], [a, d], [d, b, a], [a, c, d, b], [a, a]]


def test_merge_documents_is_the_librarys_merge(tmp_path: Path, pki: dict[str, Path]) -> None:
    for files in _multi_file_sets(tmp_path, pki):
        docs = [kc._check_kubeconfig_file(Path(f)) for f in files]
        mine = kc._merge_documents(files, docs)
        theirs = KubeConfigMerger(os.pathsep.join(files)).config
        assert _tree(mine, names=False) == _tree(theirs, names=False), files
        # Entries are named by file and place, never by their contents (the library's
        # names quote the whole entry, credentials included, in every error about it).
        for item in ("clusters", "contexts", "users"):
            for entry in mine.value[item]:
                assert re.fullmatch(rf"{re.escape(entry.path)}/{item}\[\d+\]", entry.name), entry.name


def test_libyaml_parses_kubeconfigs_as_the_pure_python_parser(tmp_path: Path, pki: dict[str, Path]) -> None:
    texts = [Path(f).read_text() for f in _multi_file_sets(tmp_path, pki)[4]]
    texts += [
        "\ufeffapiVersion: v1\nclusters: []\n",  # byte order mark
        "a: yes\nb: 0o17\nc: 2024-01-02\nd: ~\ne: 1_000\nf: '012'\ng: .inf\n",  # YAML 1.1 scalars
        "a: &x {k: v}\nb: *x\nc: !!str 12\n",
        "",
    ]
    for text in texts:
        assert kc._load_yaml(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text",
    ["clusters: [x\n", "a: b\n  c: d\n", "---\na: 1\n---\nb: 2\n", "a: !!python/object:os.system x\n", "\ta: 1\n"],
)
def test_bad_yaml_reads_as_before(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(yaml.YAMLError) as pure:
        yaml.safe_load(text)
    with pytest.raises(UsageError) as ours:
        kc._check_kubeconfig_file(path)
    mark = getattr(pure.value, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(pure.value, "problem", None) or pure.value
    assert f"is not valid YAML{where}: {problem}." in ours.value.message


# ------------------------------------------------------------------ the copy a loader gets


async def _loaded(config: Any, context: str) -> dict[str, Any]:
    cfg = Configuration()
    await KubeConfigLoader(config_dict=config, active_context=context, config_base_path=None).load_and_set(cfg)
    keys = ("host", "ssl_ca_cert", "cert_file", "key_file", "verify_ssl", "tls_server_name", "proxy")
    return {k: getattr(cfg, k) for k in keys} | {"api_key": dict(cfg.api_key)}


def _loaded_or_error(config: Any, context: str) -> Any:
    try:
        return anyio.run(_loaded, config, context)
    except (ConfigException, KeyError, TypeError, ValueError, AttributeError, OSError, AssertionError) as err:
        return (type(err).__name__, str(err))


def test_context_copy_loads_as_the_whole_merge(tmp_path: Path, pki: dict[str, Path]) -> None:
    for name in ("user.crt", "user.key"):  # b.yaml names them relative to its directory
        (tmp_path / name).write_bytes(pki["cert" if name.endswith("crt") else "key"].read_bytes())
    for files in _multi_file_sets(tmp_path, pki):
        merged = KubeConfigMerger(os.pathsep.join(files)).config
        before = _tree(merged)
        for ctx in merged.value.get("contexts") or []:
            name = ctx["name"]
            given = kc._context_config(merged, name)
            assert _loaded_or_error(given, name) == _loaded_or_error(copy.deepcopy(merged), name), (files, name)
            assert len(given.value["clusters"]) <= 1 and len(given.value["users"]) <= 1
        assert _tree(merged) == before  # the shared merge is never handed out


def test_context_copy_keeps_the_loaders_errors(tmp_path: Path) -> None:
    broken = {
        "no-cluster": _context("no-cluster", "nowhere", "u"),
        "no-user": _context("no-user", "c", "nobody"),
        "no-body": {"name": "no-body"},
        "body-not-a-map": {"name": "body-not-a-map", "context": "x"},
        "cluster-key-missing": {"name": "cluster-key-missing", "context": {"user": "u"}},
        "cluster-without-server": _context("cluster-without-server", "bare", "u"),
    }
    path = _write(
        tmp_path / "k.yaml",
        {
            "clusters": [_cluster("c", "https://127.0.0.1:1"), {"name": "bare", "cluster": {}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": list(broken.values()),
        },
    )
    merged = KubeConfigMerger(path).config
    for name in broken:
        given = kc._context_config(merged, name)
        assert _loaded_or_error(given, name) == _loaded_or_error(copy.deepcopy(merged), name), name


def test_auth_provider_refresh_does_not_reach_the_shared_merge(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "k.yaml",
        {
            "clusters": [_cluster("c", "http://127.0.0.1:1")],
            "users": [{"name": "u", "user": {"auth-provider": {"name": "oidc", "config": {"id-token": "a"}}}}],
            "contexts": [_context("x", "c", "u")],
        },
    )
    merged = KubeConfigMerger(path).config
    given = kc._context_config(merged, "x")
    given.value["users"][0]["user"]["auth-provider"]["config"].value["id-token"] = "b"
    assert merged.value["users"][0]["user"]["auth-provider"]["config"]["id-token"] == "a"


# ------------------------------------------------------------------ TLS contexts


def _config(**fields: Any) -> Any:
    cfg = Configuration()
    for k, v in fields.items():
        setattr(cfg, k, str(v) if isinstance(v, Path) else v)
    return cfg


def test_one_tls_context_per_setting(tmp_path: Path, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    kc._tls_cache.clear()
    full = {"ssl_ca_cert": pki["ca"], "cert_file": pki["cert"], "key_file": pki["key"]}
    first = kc.tls_context(_config(host="https://a", **full))
    assert kc.tls_context(_config(host="https://b", tls_server_name="x", **full)) is first
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    others = [
        kc.tls_context(_config(**(full | {"ssl_ca_cert": pki["other_ca"]}))),
        kc.tls_context(_config(ssl_ca_cert=pki["ca"])),  # no client certificate
        kc.tls_context(_config(**full, verify_ssl=False)),
        kc.tls_context(_config(**full, disable_strict_ssl_verification=True)),
        kc.tls_context(_config()),  # the system's CAs
    ]
    assert len({id(c) for c in [first, *others]}) == 1 + len(others)
    insecure = others[2]
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname  # untouched by the insecure one
    assert not others[3].verify_flags & ssl.VERIFY_X509_STRICT
    # Without a CA of its own, a context trusts the system's CAs: wherever they are now.
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["other_ca"]))
    system = kc.tls_context(_config())
    assert system is not others[4] and kc.tls_context(_config()) is system
    assert system.get_ca_certs() == kc._build_tls_context(_config()).get_ca_certs()
    # A rewritten CA file is read again.
    ca = tmp_path / "ca.crt"
    ca.write_bytes(pki["ca"].read_bytes())
    before = kc.tls_context(_config(ssl_ca_cert=ca))
    ca.write_bytes(pki["other_ca"].read_bytes())
    os.utime(ca, ns=(1, 1))
    assert kc.tls_context(_config(ssl_ca_cert=ca)) is not before


def _kubeconfig_with(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Endpoint:
    path = _write(
        tmp_path / "k.yaml",
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", **cluster}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [_context("x", "c", "u")],
        },
    )
    return Endpoint("c1", "x", path)


@pytest.mark.parametrize("where", ["ca", "cert", "key"])
def test_bad_pem_is_still_a_usage_error(tmp_path: Path, pki: dict[str, Path], where: str) -> None:
    junk = base64.b64encode(b"this is not a certificate").decode()
    cluster = {"certificate-authority-data": junk if where == "ca" else _b64(pki["ca"])}
    user = {
        "client-certificate-data": junk if where == "cert" else _b64(pki["cert"]),
        "client-key-data": junk if where == "key" else _b64(pki["key"]),
    }
    with pytest.raises(UsageError, match="is not valid PEM"):
        anyio.run(load_client_configuration, _kubeconfig_with(tmp_path, cluster, user))


def test_missing_ca_file_is_reported_as_before(tmp_path: Path) -> None:
    cfg = _config(host="https://127.0.0.1:1", ssl_ca_cert=tmp_path / "gone.crt")
    with pytest.raises(FileNotFoundError) as theirs:
        ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    with pytest.raises(UsageError) as ours:
        kc._check_connection_settings(cfg, "x", "k.yaml")
    assert f"({theirs.value})" in ours.value.message


def test_session_uses_the_shared_context_and_the_kubeconfigs_settings(tmp_path: Path, pki: dict[str, Path]) -> None:
    """The HTTP session is ours, built from the public ``Configuration`` only: the shared
    TLS context, the kubeconfig's proxy and TLS server name."""
    endpoint = _kubeconfig_with(
        tmp_path,
        {"certificate-authority-data": _b64(pki["ca"]), "tls-server-name": "kubernetes", "proxy-url": "http://p:3128"},
        {"client-certificate-data": _b64(pki["cert"]), "client-key-data": _b64(pki["key"])},
    )

    async def go() -> None:
        cfg = await load_client_configuration(endpoint)
        one, two = wire.new_session(cfg), wire.new_session(cfg)
        try:
            assert one.connector._ssl is two.connector._ssl is kc.tls_context(cfg)
            assert one.trust_env == kc.environment_has_proxy_or_netrc()
            query = kc._encoded_query({"limit": 5, "watch": True})
            args = await wire._request_args(cfg, Request("GET", "/api/v1/namespaces", query))
            assert args["url"] == "https://127.0.0.1:1/api/v1/namespaces?limit=5&watch=true"
            assert args["proxy"] == "http://p:3128"
            assert args["server_hostname"] == "kubernetes"
            assert "authorization" not in args["headers"]  # a client certificate, no token
            assert "data" not in args
        finally:
            for s in (one, two):
                await s.close()

    anyio.run(go)


def test_request_credentials_come_from_auth_settings_each_time(tmp_path: Path, pki: dict[str, Path]) -> None:
    """A token is read through ``Configuration.auth_settings()`` for every request, so a
    refresh hook (exec plugins, a rotated ServiceAccount token) is honoured."""
    endpoint = _kubeconfig_with(tmp_path, {"certificate-authority-data": _b64(pki["ca"])}, {"token": "first"})

    async def go() -> None:
        cfg = await load_client_configuration(endpoint)
        body = kc._encoded_body({"a": [1, "b"]})
        args = await wire._request_args(cfg, Request("POST", "/x", (), {"Content-Type": "application/json"}, body))
        assert args["headers"]["authorization"] == "Bearer first"
        assert args["headers"]["Content-Type"] == "application/json"
        assert args["data"] == b'{"a": [1, "b"]}' and args["url"] == "https://127.0.0.1:1/x"
        assert "proxy" not in args and "server_hostname" not in args
        calls = []

        def hook(c: Configuration) -> None:
            calls.append(1)
            c.api_key["BearerToken"] = f"Bearer rotated-{len(calls)}"

        cfg.refresh_api_key_hook = hook
        for n in (1, 2):
            args = await wire._request_args(cfg, Request("GET", "/x"))
            assert args["headers"]["authorization"] == f"Bearer rotated-{n}"

    anyio.run(go)


def test_clients_of_one_kubeconfig_share_one_context(tmp_path: Path, pki: dict[str, Path]) -> None:
    path = _write(
        tmp_path / "k.yaml",
        {
            "clusters": [
                _cluster(f"c{i}", f"https://127.0.0.1:{i}", **{"certificate-authority-data": _b64(pki["ca"])})
                for i in range(1, 4)
            ],
            "users": [
                {
                    "name": "u",
                    "user": {"client-certificate-data": _b64(pki["cert"]), "client-key-data": _b64(pki["key"])},
                }
            ],
            "contexts": [_context(f"x{i}", f"c{i}", "u") for i in range(1, 4)],
        },
    )

    async def go() -> set[int]:
        clients = [KubeClient(Endpoint(f"c{i}", f"x{i}", path)) for i in range(1, 4)]
        try:
            for c in clients:
                await c.open()
            return {id(c.transport._session.connector._ssl) for c in clients}
        finally:
            for c in clients:
                await c.close()

    assert len(anyio.run(go)) == 1


def test_environment_is_trusted_only_when_it_has_something_to_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "NETRC":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("no_proxy", "localhost")  # not a proxy: nothing for aiohttp to use
    assert kc.environment_has_proxy_or_netrc() is False
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert kc.environment_has_proxy_or_netrc() is True
    monkeypatch.delenv("HTTPS_PROXY")
    (tmp_path / ".netrc").write_text("machine example.com login a password b\n")
    assert kc.environment_has_proxy_or_netrc() is True
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("NETRC", str(tmp_path / "elsewhere"))
    assert kc.environment_has_proxy_or_netrc() is True
