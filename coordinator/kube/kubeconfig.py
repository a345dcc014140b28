"""Kubeconfig files: read once per process, merged as kubectl merges them, and turned
into a kubernetes_asyncio ``Configuration`` for one context (its public loader).

Only the entries the context uses (its cluster and user) are handed to the loader, so
the work per cluster does not grow with the size of the kubeconfig.

In a pod, a cluster can also be reached with the pod's ServiceAccount (in-cluster
credentials): the API server from KUBERNETES_SERVICE_HOST/PORT, the CA and the token
from the ServiceAccount directory. The kubelet rotates a projected token by replacing
the file; it is read again whenever the file changes (kube/credentials.py, which also
runs an exec plugin again for a new token)."""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from coordinator.errors import UsageError
from coordinator.kube.credentials import CREDENTIAL_ATTRIBUTE, ExecToken, TokenFile
from coordinator.kube.tls import MATERIAL_ATTRIBUTE, TlsMaterial, tls_context
from coordinator.text import printable

# Where Kubernetes mounts a pod's ServiceAccount credentials; COORDINATOR_SERVICEACCOUNT_DIR
# (or ``cluster connect --serviceaccount-dir``) points elsewhere, e.g. for tests.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER_CONTEXT = "in-cluster"


def service_account_dir(given: str | None = None) -> str:
    return os.path.abspath(given or os.environ.get("COORDINATOR_SERVICEACCOUNT_DIR") or SERVICE_ACCOUNT_DIR)


@dataclass(frozen=True)
class Endpoint:
    """How to reach one cluster: a context in a kubeconfig (``None`` = kubectl's default),
    or, with ``in_cluster`` (a ServiceAccount directory), the pod's own credentials."""

    name: str
    context: str
    kubeconfig: str | None = None
    in_cluster: str | None = None

    def kubeconfig_paths(self) -> str:
        if self.kubeconfig:
            return self.kubeconfig
        return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def preload() -> None:
    """Import the Kubernetes client library's kubeconfig loader, and aiohttp, now (it
    takes seconds on a slow machine).

    Call it before any per-cluster deadline starts: otherwise the first cluster's
    deadline pays for the import and a healthy cluster is reported unreachable.
    """
    import aiohttp  # noqa: F401
    import kubernetes_asyncio.config.kube_config  # noqa: F401


# Parsed and merged kubeconfig files, keyed by the files' identity: every cluster of a
# command usually comes from the same kubeconfig, and parsing it costs tens of
# milliseconds (pure-Python YAML) per cluster otherwise. A changed or replaced file is
# parsed again.
_merged_cache: dict[tuple[tuple[str, int, int, int], ...], Any] = {}


def _kubeconfig_key(existing: list[str]) -> tuple[tuple[str, int, int, int], ...]:
    return tuple((p, st.st_ino, st.st_mtime_ns, st.st_size) for p in existing for st in [Path(p).expanduser().stat()])


def _merged_kubeconfig(existing: list[str], key: tuple[tuple[str, int, int, int], ...], docs: list[Any]) -> Any:
    """``KubeConfigMerger(paths).config`` for these files, parsed once per process. The
    result is shared: callers copy what they hand to a loader (see ``_context_config``).
    ``docs`` are the files' documents when they are not cached yet."""
    from kubernetes_asyncio.config.kube_config import KubeConfigMerger

    found = _merged_cache.get(key)
    if found is None:
        if all(isinstance(doc, dict) for doc in docs):
            with contextlib.suppress(Exception):  # the library's own merge says what is wrong
                found = _merge_documents(existing, docs)
        if found is None:
            found = KubeConfigMerger(os.pathsep.join(existing)).config
        if len(_merged_cache) >= 32:  # kubeconfigs rewritten over and over: keep it small
            _merged_cache.clear()
        _merged_cache[key] = found
    return found


def _context_config(merged: Any, context: str) -> Any:
    """A copy, for one loader, of what ``context`` uses in the merged kubeconfig: the
    context entry, the cluster and user entries it names, the top-level scalars.

    The loader may change what it is given (refreshed tokens of auth providers), so the
    shared merge is never handed out; copying only these entries instead of the whole
    merge keeps the cost per cluster flat in the size of the kubeconfig. The loader finds
    the same entries, under the same node names and file paths (relative certificate
    paths resolve alike), and says the same things about them. Anything irregular gets a
    copy of the whole merge, so that the loader's own error is unchanged."""
    from kubernetes_asyncio.config.kube_config import ConfigNode

    try:
        root = merged.value
        lists = {item: root[item] for item in ("clusters", "contexts", "users")}
        if not all(isinstance(v, list) for v in lists.values()):
            raise TypeError("not lists")

        def named(item: str, name: Any) -> list[Any]:
            found = []
            for entry in lists[item]:
                value = entry.value if isinstance(entry, ConfigNode) else entry
                if not isinstance(value, dict) or "name" not in value:
                    raise TypeError("entry without a name")
                if value["name"] == name:
                    found.append(entry)
            return found

        ctx = named("contexts", context)
        if len(ctx) != 1:
            raise LookupError(context)
        entry = ctx[0].value if isinstance(ctx[0], ConfigNode) else ctx[0]
        body = entry.get("context")
        if not isinstance(body, dict):
            raise TypeError("context without a body")
        subset = {k: v for k, v in root.items() if k not in lists}
        subset["contexts"] = ctx
        subset["clusters"] = named("clusters", body["cluster"]) if "cluster" in body else []
        subset["users"] = named("users", body["user"]) if body.get("user") else []
        return copy.deepcopy(ConfigNode(merged.name, subset, merged.path))
    except Exception:
        return copy.deepcopy(merged)


def _merge_documents(existing: list[str], docs: list[dict[str, Any]]) -> Any:
    """What ``KubeConfigMerger(paths).config`` gives, from documents already parsed: the
    same rules (the first file naming a cluster, context or user wins; the last
    current-context wins) and the same ``ConfigNode`` objects, except for their names:
    ``FILE/users[2]``, where the library writes the entry's whole dict."""
    from kubernetes_asyncio.config.kube_config import ConfigNode

    merged: Any = None
    for raw_path, config in zip(existing, docs, strict=True):
        path = os.path.expanduser(raw_path)
        if merged is None:
            base = copy.deepcopy(config)
            for item in ("clusters", "contexts", "users"):
                base[item] = []
            merged = ConfigNode(path, base, path)
        for item in ("clusters", "contexts", "users"):
            for index, new_item in enumerate(config.get(item, []) or []):
                if not any(exists["name"] == new_item["name"] for exists in merged.value[item]):
                    # Named by file and place, never by the entry itself (the library's
                    # merger names it by the whole dict, which every error about a
                    # missing key then quotes: tokens and keys included).
                    merged.value[item].append(ConfigNode(f"{path}/{item}[{index}]", new_item, path))
        if "current-context" in config:
            merged.value["current-context"] = config["current-context"]
    return merged


# The TLS fields of a context whose ``-data`` form the client library writes to a file of
# its own (mkstemp in the temporary directory), which it removes only at interpreter exit:
# a command killed with SIGKILL left the user's private key there. ``load_client_configuration``
# takes these out of the loader's copy, so that the library never sees them, and holds
# them in memory (``tls.TlsMaterial``). (entry, field, Configuration attribute)
_EMBEDDED_TLS = (
    ("cluster", "certificate-authority", "ssl_ca_cert"),
    ("user", "client-certificate", "cert_file"),
    ("user", "client-key", "key_file"),
)


def _active_nodes(given: Any, context: str) -> dict[str, Any]:
    """The cluster and user entries (the loader's nodes, inside ``given``) that a loader of
    ``given`` uses for ``context``, found as its ``set_active_context`` finds them; an
    entry that cannot be found, or is no mapping, is left out (the loader then says what
    is wrong)."""
    found: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        body = given["contexts"].get_with_name(context)["context"]
        if body.safe_get("user") and given.safe_get("users"):
            user = given["users"].get_with_name(body["user"], safe=True)
            if user:
                found["user"] = user["user"]
        found["cluster"] = given["clusters"].get_with_name(body["cluster"])["cluster"]
    return {k: v for k, v in found.items() if isinstance(getattr(v, "value", None), dict)}


def _take_embedded_tls(entries: dict[str, Any]) -> dict[str, str | bytes]:
    """Take ``*-data`` TLS fields out of the loader's copy of the entries, with the file
    field beside each (the library prefers the data and never looks at the file then):
    the raw values, by Configuration attribute, an empty value included (the library
    takes it as no file at all). A value of another type is left for the library to
    refuse as it always has (it fails to decode it before writing anything)."""
    taken: dict[str, str | bytes] = {}
    for entry, field, attribute in _EMBEDDED_TLS:
        fields = entries.get(entry)
        if fields is not None and isinstance(fields.get(f"{field}-data"), str | bytes):
            taken[attribute] = fields.pop(f"{field}-data")
            fields.pop(field, None)
    return taken


def _decoded_tls(cfg: Any, taken: dict[str, str | bytes]) -> dict[str, bytes]:
    """The embedded material the library would have loaded into ``cfg``, decoded as it
    decodes it (its errors included): only for an https server (it reads no TLS fields
    otherwise), an empty value is none, and a client certificate and key that an exec
    plugin gave win (the library then does not read the user's)."""
    if not str(cfg.host or "").startswith("https"):
        return {}
    decoded = {}
    for _, _, attribute in _EMBEDDED_TLS:
        raw = taken.get(attribute)
        if raw and getattr(cfg, attribute) is None:
            decoded[attribute] = base64.standard_b64decode(raw.encode() if isinstance(raw, str) else raw)
    return decoded


def _spill_directory(user: dict[str, Any] | None) -> str | None:
    """A fresh private directory (0700) for what the library writes while it loads the
    credentials of an exec plugin, or ``None``: no exec plugin (the library then writes
    nothing), or no directory to be had (the library's own default then, as before)."""
    if user is None or "exec" not in user:
        return None
    try:
        return os.path.abspath(tempfile.mkdtemp(prefix="coordinator-exec-"))
    except OSError:
        return None


def _take_spilled_tls(cfg: Any, spill: str) -> dict[str, bytes]:
    """Read back what the library wrote to ``spill`` (an exec plugin's client certificate
    and key: it writes them to files itself) and clear those paths from ``cfg``."""
    taken = {}
    for _, _, attribute in _EMBEDDED_TLS:
        path = getattr(cfg, attribute)
        if path and os.path.dirname(os.path.abspath(path)) == spill:
            taken[attribute] = Path(path).read_bytes()
            setattr(cfg, attribute, None)
    return taken


def _remove_spill(spill: str) -> None:
    """Remove ``spill`` (a directory this load made, holding only what the library wrote
    there) and make the library forget its files: it reuses a file it wrote for the same
    content, and would otherwise hand the next load (a reconnect) a path that is gone."""
    from kubernetes_asyncio.config import kube_config

    written = getattr(kube_config, "_temp_files", None)
    if isinstance(written, dict):
        for content, path in list(written.items()):
            if isinstance(path, str) and os.path.dirname(os.path.abspath(path)) == spill:
                written.pop(content, None)
    shutil.rmtree(spill, ignore_errors=True)


async def _in_cluster_configuration(endpoint: Endpoint) -> Any:
    from kubernetes_asyncio.client import Configuration

    where = Path(endpoint.in_cluster or service_account_dir())
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        raise UsageError(
            "In-cluster credentials need KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, which "
            "Kubernetes sets in every container of a pod; they are not set here. Run this in a pod, "
            "or connect the cluster with --context."
        )
    token, ca = where / "token", where / "ca.crt"
    tokens = TokenFile(token)
    for path, what in ((token, "token"), (ca, "CA certificate")):
        if not path.is_file():
            raise UsageError(
                f"No ServiceAccount {what} at {path}. Is a ServiceAccount token mounted in this pod "
                "(automountServiceAccountToken, or a projected volume)? Point --serviceaccount-dir or "
                "COORDINATOR_SERVICEACCOUNT_DIR at the directory that holds token and ca.crt."
            )
    cfg = Configuration()
    cfg.host = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    cfg.ssl_ca_cert = str(ca)
    tokens.refresh(cfg)
    if not tokens.token:
        raise UsageError(f"The ServiceAccount token {token} is empty or cannot be read.")
    cfg.refresh_api_key_hook = tokens.refresh
    setattr(cfg, CREDENTIAL_ATTRIBUTE, tokens)
    _check_connection_settings(cfg, IN_CLUSTER_CONTEXT, str(where))
    return cfg


async def load_client_configuration(endpoint: Endpoint) -> Any:
    """Build a kubernetes_asyncio ``Configuration``; bad kubeconfigs become UsageError."""
    if endpoint.in_cluster is not None:
        return await _in_cluster_configuration(endpoint)
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.config_exception import ConfigException
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader

    paths = endpoint.kubeconfig_paths()
    existing = [p for p in paths.split(os.pathsep) if p and Path(p).expanduser().is_file()]
    if not existing:
        raise UsageError(
            f"No kubeconfig file found at {paths}. Pass --kubeconfig PATH or set KUBECONFIG to a file that exists."
        )
    key = _kubeconfig_key(existing)
    docs: list[Any] = []
    if key not in _merged_cache:  # files already parsed and merged passed these checks
        docs = [_check_kubeconfig_file(Path(path).expanduser()) for path in existing]
    merged: Any = None
    try:
        merged = _merged_kubeconfig(existing, key, docs)
        contexts = [c["name"] for c in (merged.value.get("contexts") or [])] if merged else []
        given = _context_config(merged, endpoint.context) if endpoint.context in contexts else None
    except Exception as err:
        # ``from None``: the library's own exception, shown by -v, may quote entries.
        why = _library_error(err, merged.value if merged is not None else docs, with_kind=True)
        raise UsageError(
            f"The kubeconfig {printable(paths)} cannot be read: {why}. Check that it is a valid kubeconfig YAML file."
        ) from None
    if endpoint.context not in contexts:
        # Names are text of whoever wrote the kubeconfig: one line each, escaped.
        known = ", ".join(sorted(repr(printable(str(c))) for c in contexts)) or "none"
        raise UsageError(
            f"The kubeconfig {printable(paths)} has no context named {printable(repr(endpoint.context))} "
            f"(contexts found: {known}). Pass one of those with --context."
        )
    cfg = Configuration()
    where = f"The context {printable(repr(endpoint.context))} in {printable(paths)} cannot be used"
    # Embedded certificates and keys are taken out of the loader's copy (``given`` is this
    # load's own) and kept in memory: the library would write each to a file it removes
    # only at exit. What it still writes itself, an exec plugin's client certificate and
    # key, goes to a private directory made for this load (only when the user runs an
    # exec plugin) and is read back and removed before this returns.
    nodes = _active_nodes(given, endpoint.context)
    entries = {k: v.value for k, v in nodes.items()}
    embedded = _take_embedded_tls(entries)
    spill = _spill_directory(entries.get("user"))
    try:
        loader = KubeConfigLoader(
            config_dict=given, active_context=endpoint.context, config_base_path=None, temp_file_path=spill
        )
        await loader.load_and_set(cfg)
        material = _decoded_tls(cfg, embedded)  # first: it skips what the exec plugin gave
        material |= _take_spilled_tls(cfg, spill) if spill else {}
    except (ConfigException, KeyError, TypeError, ValueError, AttributeError, OSError) as err:
        why = _library_error(err, merged.value)
        raise UsageError(f"{where}: {why}. Check its cluster and user entries.") from None
    finally:
        if spill:
            _remove_spill(spill)
    user = nodes.get("user")
    # The loader's node, not the plain mapping: the plugin runner reads it as the loader does.
    exec_config = user["exec"] if user is not None and user.safe_get("exec") else None
    if exec_config is not None and (cfg.api_key or {}).get("BearerToken"):
        # A token the plugin gives again when it expires or is revoked (a client
        # certificate it gave is taken once: the connection is built on it).
        credential = ExecToken(exec_config)
        cfg.refresh_api_key_hook = credential.refresh
        setattr(cfg, CREDENTIAL_ATTRIBUTE, credential)
    if material:
        names = {"ssl_ca_cert": "ca", "cert_file": "cert", "key_file": "key"}
        setattr(cfg, MATERIAL_ATTRIBUTE, TlsMaterial(**{names[k]: v for k, v in material.items()}))
    _check_credentials(cfg, where)
    _check_connection_settings(cfg, endpoint.context, paths)
    return cfg


# Strings shorter than this are left in a quoted error: no credential is that short,
# and masking "u" or "true" everywhere would garble the message.
_SHORTEST_SECRET = 4
REDACTED = "<redacted>"
# Keys of a user entry whose values name things rather than prove anything: an error
# about them says which file or plugin is wrong. Everything else is masked.
_NOT_SECRET = frozenset(
    {
        "name",
        "command",
        "apiVersion",
        "kind",
        "tokenFile",
        "client-certificate",
        "client-key",
        "installHint",
        "interactiveMode",
        "provideClusterInfo",
    }
)


def _credentials_in(root: Any) -> set[str]:
    """The strings of the ``users`` entries of a kubeconfig (merged, or its documents)
    that may prove something: tokens, passwords, keys, auth-provider secrets, an exec
    plugin's arguments and environment; anything but names, paths and plugin commands.
    Whatever the entry's shape: a token one level too high is still a credential."""
    from kubernetes_asyncio.config.kube_config import ConfigNode

    found: set[str] = set()

    def walk(value: Any, depth: int) -> None:
        if isinstance(value, ConfigNode):
            value = value.value
        if depth > 50:
            return
        if isinstance(value, str):
            if len(value) >= _SHORTEST_SECRET:
                found.add(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                if not (k in _NOT_SECRET and isinstance(v, str | bool | int)):
                    walk(v, depth + 1)
        elif isinstance(value, list):
            for v in value:
                walk(v, depth + 1)

    roots = root if isinstance(root, list) else [root]
    for doc in roots:
        doc = doc.value if isinstance(doc, ConfigNode) else doc
        users = doc.get("users") if isinstance(doc, dict) else None
        for entry in users if isinstance(users, list) else []:
            walk(entry, 0)
    return found


def _library_error(err: BaseException, root: Any, *, with_kind: bool = False) -> str:
    """What the client library said about a kubeconfig, fit to print: every credential
    of the kubeconfig's users masked (a message may quote an entry, in whole or in
    part, as the library's node names and an exec plugin's stderr do), on one line,
    escaped, and cut short."""
    text = f"{type(err).__name__}: {err}" if with_kind else str(err)
    try:
        secrets = _credentials_in(root)
    except Exception:  # an entry no walk can read: say only what kind of error it was
        return type(err).__name__
    for secret in sorted(secrets, key=len, reverse=True):
        for form in {secret, repr(secret)[1:-1], repr(secret)}:
            text = text.replace(form, REDACTED)
    text = printable(text)
    return text if len(text) <= 400 else text[:400] + "..."


def _check_credentials(cfg: Any, where: str) -> None:
    """A bearer token as kubectl takes it: whitespace around it (a token file saved with a
    final CRLF) is dropped; any other control character is refused here, where the HTTP
    client would fail on every request with an internal error."""
    for key, value in list((cfg.api_key or {}).items()):
        if not isinstance(value, str):
            continue
        value = header_value(value)
        if value is None:
            raise UsageError(
                f"{where}: its user's credential (a token, or what its token file, exec plugin or auth "
                "provider gave) holds a control character or a line break inside it, which no HTTP "
                "header may carry. Check the token or tokenFile of its user entry; whitespace around "
                "the token is ignored, as kubectl ignores it."
            )
        cfg.api_key[key] = value


def header_value(value: str) -> str | None:
    """``value`` for an HTTP header: surrounding whitespace dropped (inside a ``Bearer``
    credential too); None when a control character is left in it."""
    scheme, sep, rest = value.strip().partition(" ")
    value = f"{scheme}{sep}{rest.strip()}" if sep and scheme in ("Bearer", "Basic") else value.strip()
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return None
    return value


def _check_connection_settings(cfg: Any, context: str, paths: str) -> None:
    """Reject now what the HTTP client would only trip over later (as an internal error,
    or as a misleading "unreachable"): a server that is not a URL, TLS material that is
    not PEM."""
    where = f"The context {printable(repr(context))} in {printable(paths)} cannot be used"
    host = str(cfg.host or "")
    server = urlsplit(host)
    try:
        port_ok = server.port is None or server.port > 0
    except ValueError:
        port_ok = False
    # urlsplit drops tabs and line breaks, so check the text itself too: a server with a
    # line break would forge a line of every error that names it (kubectl refuses it).
    if server.scheme not in ("http", "https") or not server.hostname or not port_ok or not host.isprintable():
        raise UsageError(
            f"{where}: its server {printable(repr(host))} is not an http(s) URL with a host name. Check the "
            "server entry of its cluster."
        )
    try:
        tls_context(cfg)  # the one the client will use: built (and so checked) once
    except (ssl.SSLError, OSError, ValueError) as err:
        raise UsageError(
            f"{where}: its certificate authority, client certificate or client key is not valid PEM "
            f"({err}). Check certificate-authority(-data) of its cluster and client-certificate(-data) "
            "and client-key(-data) of its user."
        ) from err


def _check_kubeconfig_file(path: Path) -> Any:
    """The document in a kubeconfig file; say in words what is wrong with one that is not a
    YAML mapping (the client library would fail on it with a bare TypeError or a
    multi-line trace)."""
    import yaml

    hint = "Check that it is a valid kubeconfig YAML file, or leave it out of --kubeconfig/KUBECONFIG."
    try:
        doc = _load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"The kubeconfig {path} cannot be read: {err}. {hint}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UsageError(
            f"The kubeconfig {path} is not valid YAML{where}: {getattr(err, 'problem', None) or err}. {hint}"
        ) from err
    if doc is not None and not isinstance(doc, dict):
        raise UsageError(
            f"The kubeconfig {path} holds a {type(doc).__name__} at the top level, not a kubeconfig "
            f"mapping (apiVersion, clusters, contexts, users). {hint}"
        )
    return doc


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load``, with libyaml's parser when PyYAML has it (ten times faster on a
    kubeconfig); a document it rejects is parsed again by the pure-Python parser, so that
    errors read exactly as they always did."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        with contextlib.suppress(Exception):
            return yaml.load(text, Loader=fast)  # the C twin of SafeLoader: same constructor
    return yaml.safe_load(text)
