"""Bad input, each case: its documented exit code, one clear paragraph, and nothing changed.

Exit codes (SPEC/README): 2 usage or bad input, 3 held by someone else, 4 no quorum,
5 identity mismatch, 6 state conflict. For every case the command must print exactly one
paragraph on stderr, starting with ``Error:``, without a traceback; and afterwards the
local files (config, lock records, the case's own files) must be byte for byte what they
were, and every lease and ConfigMap in the deployment's namespace (and the identity
namespace) must have the resourceVersion it had: nothing was written anywhere.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from coord_fixtures import Env, make_env, put_lease

from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet
from coordinator.ops.admin import create_deployment
from coordinator.ops.api import Coordinator
from coordinator.rules.resources import configmaps_path, leases_path

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(sandbox3: Any, tmp_path_factory: pytest.TempPathFactory) -> Env:
    """One config (c1..c3, deployment ``web``) for the whole corpus: every case proves it
    changed nothing, so they can share it."""
    return make_env(sandbox3, tmp_path_factory.mktemp("bad-input"))


# ----------------------------------------------------------------------- arranging


@dataclass
class Ctx:
    env: Env
    tmp: Path
    values: dict[str, str] = field(default_factory=dict)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return anyio.run(fn, *args)


Arrange = Callable[[Ctx], None]


def _file(name: str, content: str | bytes) -> Arrange:
    def arrange(ctx: Ctx) -> None:
        path = ctx.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    return arrange


def _deployment(ctx: Ctx) -> None:
    """A fresh deployment of c1..c3 in the shared namespace: ``{dep}``."""
    name = "d" + secrets.token_hex(4)
    store = ConfigStore(ctx.env.config)

    async def create() -> None:
        cs = ClusterSet(store.load(), timeout=10)
        try:
            await create_deployment(store, cs, name, ctx.env.namespace, ctx.env.clusters, "configmap")
        finally:
            await cs.aclose()

    ctx.run(create)
    ctx.values["dep"] = name


def _locked(ctx: Ctx) -> None:
    """A fresh deployment and its lock: ``{dep}``, ``{lock}``."""
    _deployment(ctx)

    async def take() -> str:
        async with Coordinator.from_config(str(ctx.env.config), timeout=10) as c:
            result = await c.acquire(ctx.values["dep"], ttl=600, holder="arranger")
            return result.lock_id

    ctx.values["lock"] = ctx.run(take)


def _with_state(ctx: Ctx) -> None:
    """A fresh, locked deployment whose state is ``{a: 1}`` on every replica."""
    _locked(ctx)

    async def write() -> None:
        async with Coordinator.from_config(str(ctx.env.config), timeout=10) as c:
            await c.state(ctx.values["dep"]).set({"a": 1}, lock=ctx.values["lock"])

    ctx.run(write)


def _state_path(ctx: Ctx) -> str:
    return f"{configmaps_path(ctx.env.namespace)}/coordinator-state-{ctx.values['dep']}"


def _edit_envelope(how: str, clusters: tuple[int, ...] = (1, 2, 3)) -> Arrange:
    """State written, then its replicas on ``clusters`` edited by hand into garbage."""

    def arrange(ctx: Ctx) -> None:
        _with_state(ctx)
        for i in clusters:
            cm = ctx.run(ctx.env.raw, i, "GET", _state_path(ctx))
            env = json.loads(cm["data"]["envelope.json"])
            if how == "not-json":
                cm["data"]["envelope.json"] = "this is {not json"
            elif how == "json-list":
                cm["data"]["envelope.json"] = "[1, 2, 3]"
            elif how == "no-envelope-key":
                cm["data"] = {"something-else": "x"}
            elif how == "wrong-checksum":
                env["data"]["a"] = 999
                cm["data"]["envelope.json"] = json.dumps(env)
            elif how == "data-not-mapping":
                env["data"] = ["a", 1]
                cm["data"]["envelope.json"] = json.dumps(env)
            elif how == "newer-schema":
                env["schema"] = 99
                cm["data"]["envelope.json"] = json.dumps(env)
            else:
                raise AssertionError(how)
            ctx.run(ctx.env.raw, i, "PUT", _state_path(ctx), cm)

    return arrange


def _lease(annotations: dict[str, str], spec: dict[str, Any] | None = None) -> Arrange:
    """A fresh deployment whose lease on every cluster is written by hand."""

    def arrange(ctx: Ctx) -> None:
        _deployment(ctx)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": f"coordinator-lock-{ctx.values['dep']}", "annotations": annotations},
            # an empty holder, as coordinator keeps it on a free lease (one removed is no evidence)
            "spec": spec or {"holderIdentity": ""},
        }
        for i in (1, 2, 3):
            ctx.run(put_lease, ctx.env, i, body)

    return arrange


FOREIGN_LEASE = _lease(
    {"example.com/owner": "helm", "coordinator.io/pid": "not-a-pid", "coordinator.io/members": "!!!"},
    {
        "holderIdentity": "someone-elses-operator",
        "leaseDurationSeconds": 3600,
        "renewTime": "2020-01-01T00:00:00.000000Z",
    },
)


def _config_copy(edit: Callable[[dict[str, Any]], None] | None = None, lock_book: str | None = None) -> Arrange:
    """``{tmp}/cfg/config.yaml``: a copy of the shared config, edited; maybe a lock book."""

    def arrange(ctx: Ctx) -> None:
        doc = yaml.safe_load(ctx.env.config.read_text())
        if edit is not None:
            edit(doc)
        folder = ctx.tmp / "cfg"
        folder.mkdir()
        (folder / "config.yaml").write_text(yaml.safe_dump(doc))
        if lock_book is not None:
            (folder / "config.locks.yaml").write_text(lock_book)

    return arrange


def _kubeconfig(edit: Callable[[dict[str, Any]], None]) -> Arrange:
    """``{tmp}/kubeconfig``: the sandbox kubeconfig with context sandbox-1 damaged."""

    def arrange(ctx: Ctx) -> None:
        doc = yaml.safe_load(Path(ctx.env.kubeconfig).read_text())
        edit(doc)
        (ctx.tmp / "kubeconfig").write_text(yaml.safe_dump(doc))

    return arrange


def _first(doc: dict[str, Any], section: str) -> dict[str, Any]:
    entry: dict[str, Any] = doc[section][0]
    return entry


def _repoint_c1(ctx: Ctx) -> None:
    """A config whose cluster c1 now reaches sandbox-2 through the same context name."""

    def repointed(doc: dict[str, Any]) -> None:
        contexts = {c["name"]: c for c in doc["contexts"]}
        contexts["sandbox-1"]["context"]["cluster"] = contexts["sandbox-2"]["context"]["cluster"]

    _kubeconfig(repointed)(ctx)
    kubeconfig = str(ctx.tmp / "kubeconfig")

    def use_it(doc: dict[str, Any]) -> None:
        doc["clusters"]["c1"]["kubeconfig"] = kubeconfig

    _config_copy(use_it)(ctx)


NOT_PEM = base64.b64encode(b"this is not a certificate").decode()
MISSING_PLUGIN = {"apiVersion": "client.authentication.k8s.io/v1", "command": "/nonexistent/no-such-credential-plugin"}


def _cluster_entry(**fields: Any) -> Arrange:
    return _kubeconfig(lambda d: _first(d, "clusters")["cluster"].update(fields))


def _user_entry(**fields: Any) -> Arrange:
    return _kubeconfig(lambda d: _first(d, "users")["user"].update(fields))


OVERSIZE = json.dumps({"blob": "x" * (2 * 1024 * 1024)})


def _backup_doc(**changes: Any) -> str:
    doc = {
        "schema": 2,
        "version": 3,
        "token": 2,
        "write_id": "w1",
        "checksum": "sha256:" + "0" * 64,
        "written_by": "someone",
        "written_at": "2026-01-01T00:00:00Z",
        "members": ["c1", "c2", "c3"],
        "data": {"a": 1},
        "history": [],
    }
    doc.update(changes)
    return json.dumps(doc)


# ---------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    code: int
    says: tuple[str, ...] = ()
    arrange: tuple[Arrange, ...] = ()


def case(id: str, args: str | tuple[str, ...], code: int, *says: str, arrange: tuple[Arrange, ...] = ()) -> Case:
    return Case(id, tuple(args.split()) if isinstance(args, str) else args, code, says, arrange)


CONNECT = "cluster connect x9 --context sandbox-1 --kubeconfig {tmp}/kubeconfig"
STATUS_WITH = "--config {tmp}/cfg/config.yaml lock status web"

CASES = [
    # -- the command line itself
    case("unknown-flag", "lock acquire web --bogus", 2, "No such option", "--bogus"),
    case("unknown-subcommand", "lock frobnicate web", 2, "No such command", "frobnicate"),
    case("unknown-command", "frobnicate web", 2, "No such command"),
    case("bad-output-format", "-o xml lock status web", 2, "'xml' is not one of"),
    case("missing-deployment-argument", "lock acquire", 2, "Missing argument"),
    case("run-without-command", "lock run web", 2, "Missing argument"),
    case("config-is-a-directory", "--config {tmp} lock status web", 2, "is a directory"),
    case("ttl-not-a-duration", "lock acquire web --ttl abc", 2, "--ttl", "not a duration"),
    case("ttl-negative", "lock acquire web --ttl -5s", 2, "not a duration"),
    case("ttl-below-one-second", "lock acquire web --ttl 0.5s", 2, "at least 1s"),
    case("ttl-out-of-range", "lock acquire web --ttl 99999999h", 2, "out of range"),
    case("wait-not-a-duration", "lock acquire web --wait 5x", 2, "--wait", "not a duration"),
    case("timeout-not-a-duration", "--timeout nonsense lock status web", 2, "--timeout", "not a duration"),
    case("renew-ttl-not-a-duration", "lock renew web --lock-id 0123456789abcdef --ttl zz", 2, "not a duration"),
    case("grace-not-a-duration", "lock run web --grace soon -- true", 2, "--grace", "not a duration"),
    case("interval-not-a-duration", "lock status web --watch --interval never", 2, "--interval"),
    case("unknown-deployment-lock", "lock acquire nosuch", 2, "Unknown deployment 'nosuch'"),
    case("unknown-deployment-state", "state get nosuch", 2, "Unknown deployment 'nosuch'"),
    # -- names
    case("cluster-name-not-dns", "cluster connect Bad_Name --context sandbox-1", 2, "DNS-1123"),
    case("cluster-name-taken", "cluster connect c1 --context sandbox-1", 2, "already connected"),
    case("identity-namespace-not-dns", "cluster connect x9 --context sandbox-1 --identity-namespace NOPE", 2, "NOPE"),
    case("unknown-context", "cluster connect x9 --context no-such-context", 2, "no context named"),
    case("deployment-name-not-dns", "deployment create Bad -n x1 --cluster c1", 2, "DNS-1123"),
    case("deployment-name-too-long", f"deployment create {'a' * 60} -n x1 --cluster c1", 2, "limit"),
    case("namespace-not-dns", "deployment create d1 -n Not_OK --cluster c1", 2, "Not_OK"),
    case("unknown-member-cluster", "deployment create d2 -n x1 --cluster nope", 2, "Unknown cluster 'nope'"),
    case("member-listed-twice", "deployment create d3 -n x1 --cluster c1 --cluster c1", 2, "twice"),
    case("unknown-storage", "deployment create d4 -n x1 --cluster c1 --storage s3", 2, "'s3' is not one of"),
    case("deployment-exists", "deployment create web -n x1 --cluster c1", 2, "already exists"),
    case("disconnect-unknown-cluster", "cluster disconnect nope", 2, "Unknown cluster 'nope'"),
    case("disconnect-cluster-in-use", "cluster disconnect c1", 2, "--force"),
    case("import-from-unknown-cluster", "deployment import web2 --cluster nope", 2, "Unknown cluster 'nope'"),
    # -- values and files
    case("assignment-without-equals", "state set web novalue", 2, "KEY=VALUE"),
    case("assignment-empty-key", "state set web =3", 2, "empty key"),
    case("assignment-empty-key-part", "state set web a..b=1", 2, "empty key"),
    case(
        "assignment-nan", "state set {dep} x:=NaN --lock-id {lock}", 2, "cannot be stored as JSON", arrange=(_locked,)
    ),
    case("apply-missing-file", "state apply web -f {tmp}/missing.yaml", 2, "Cannot read"),
    # `state apply` checks the lock before it parses the file
    case(
        "apply-not-yaml",
        "state apply {dep} -f {tmp}/s.yaml --lock-id {lock}",
        2,
        "neither valid YAML nor JSON",
        arrange=(_locked, _file("s.yaml", "replicas: [unclosed\n")),
    ),
    case(
        "apply-a-list",
        "state apply {dep} -f {tmp}/s.yaml --lock-id {lock}",
        2,
        "mapping",
        arrange=(_locked, _file("s.yaml", "- a\n- b\n")),
    ),
    case(
        "apply-binary",
        "state apply web -f {tmp}/s.yaml",
        2,
        "Cannot read",
        arrange=(_file("s.yaml", b"\xff\xfe\x00garbage"),),
    ),
    case(
        "apply-a-date",
        "state apply {dep} -f {tmp}/s.yaml --lock-id {lock}",
        2,
        "not plain data",
        "quote it",
        arrange=(_locked, _file("s.yaml", "release: 2026-01-01\n")),
    ),
    case(
        "apply-a-boolean-key",
        "state apply {dep} -f {tmp}/s.yaml --lock-id {lock}",
        2,
        "'on'",
        "quote it",
        arrange=(_locked, _file("s.yaml", "name: ci\non: push\n")),
    ),
    case(
        "apply-unlocked-is-refused-before-parsing",
        "state apply {dep} -f {tmp}/s.yaml",
        6,
        "no lock is held",
        arrange=(_deployment, _file("s.yaml", "replicas: [unclosed\n")),
    ),
    case(
        "apply-nan",
        "state apply {dep} -f {tmp}/s.yaml --lock-id {lock}",
        2,
        "cannot be stored as JSON",
        arrange=(_locked, _file("s.yaml", "ratio: .nan\n")),
    ),
    case(
        "apply-infinity",
        "state apply {dep} -f {tmp}/s.yaml --lock-id {lock}",
        2,
        "cannot be stored as JSON",
        arrange=(_locked, _file("s.yaml", "limit: .inf\n")),
    ),
    case(
        "apply-oversize",
        "state apply {dep} -f {tmp}/big.json --lock-id {lock}",
        2,
        "limit",
        arrange=(_locked, _file("big.json", OVERSIZE)),
    ),
    case(
        "restore-not-json",
        "state restore web -f {tmp}/b.json",
        2,
        "not a valid state envelope",
        arrange=(_file("b.json", "this is not json"),),
    ),
    case(
        "restore-missing-fields",
        "state restore web -f {tmp}/b.json",
        2,
        "not a valid state envelope",
        arrange=(_file("b.json", '{"schema": 2}'),),
    ),
    case(
        "restore-wrong-checksum",
        "state restore web -f {tmp}/b.json",
        2,
        "checksum",
        arrange=(_file("b.json", _backup_doc()),),
    ),
    case(
        "restore-newer-schema",
        "state restore web -f {tmp}/b.json",
        6,
        "schema 99",
        arrange=(_file("b.json", _backup_doc(schema=99)),),
    ),
    case(
        "backup-under-a-file",
        "state backup {dep} -f {tmp}/a-file/sub/b.json",
        2,
        "Cannot write the backup file",
        arrange=(_with_state, _file("a-file", "x")),
    ),
    case("backup-to-a-directory", "state backup web -f {tmp}", 2, "is a directory"),
    # -- local config files
    case("config-not-yaml", STATUS_WITH, 2, "not valid YAML", arrange=(_file("cfg/config.yaml", "clusters: [x\n"),)),
    case("config-a-list", STATUS_WITH, 2, "mapping", arrange=(_file("cfg/config.yaml", "[1, 2]\n"),)),
    case("config-a-scalar", STATUS_WITH, 2, "mapping", arrange=(_file("cfg/config.yaml", "just text\n"),)),
    case("config-wrong-type", STATUS_WITH, 2, "clusters", arrange=(_file("cfg/config.yaml", "clusters: 5\n"),)),
    case("config-newer-version", STATUS_WITH, 2, "version", arrange=(_file("cfg/config.yaml", "version: 2\n"),)),
    case("config-unknown-field", STATUS_WITH, 2, "bogus", arrange=(_file("cfg/config.yaml", "bogus: 1\n"),)),
    case(
        "config-binary",
        STATUS_WITH,
        2,
        "Cannot read the config file",
        arrange=(_file("cfg/config.yaml", b"\xff\xfe\x00\x01"),),
    ),
    case(
        "config-python-tag",
        STATUS_WITH,
        2,
        "not valid YAML",
        arrange=(_file("cfg/config.yaml", "!!python/object/apply:os.system ['true']\n"),),
    ),
    case(
        "config-cluster-without-identity",
        STATUS_WITH,
        2,
        "identity",
        arrange=(_config_copy(lambda d: d["clusters"]["c1"].pop("identity")),),
    ),
    case(
        "config-unknown-identity-source",
        STATUS_WITH,
        2,
        "identity_source",
        arrange=(_config_copy(lambda d: d["clusters"]["c2"].update(identity_source="magic")),),
    ),
    case(
        "config-namespace-not-dns",
        STATUS_WITH,
        2,
        "namespace",
        arrange=(_config_copy(lambda d: d["deployments"]["web"].update(namespace="Not_OK")),),
    ),
    case(
        "config-deployment-without-members",
        STATUS_WITH,
        2,
        "at least one cluster",
        arrange=(_config_copy(lambda d: d["deployments"]["web"].update(clusters=[])),),
    ),
    case(
        "config-member-not-connected",
        STATUS_WITH,
        2,
        "Unknown cluster 'c9'",
        arrange=(_config_copy(lambda d: d["deployments"]["web"].update(clusters=["c1", "c9"])),),
    ),
    case(
        "lock-records-garbage",
        "--config {tmp}/cfg/config.yaml lock release web",
        2,
        "lock record file",
        arrange=(_config_copy(lock_book="locks: {not: [a list\n"),),
    ),
    # -- kubeconfigs
    case("kubeconfig-missing", CONNECT, 2, "No kubeconfig file found"),
    case("kubeconfig-not-yaml", CONNECT, 2, "not valid YAML", arrange=(_file("kubeconfig", "clusters: [x\n"),)),
    case("kubeconfig-a-list", CONNECT, 2, "kubeconfig", arrange=(_file("kubeconfig", "- a\n- b\n"),)),
    case("kubeconfig-binary", CONNECT, 2, "kubeconfig", arrange=(_file("kubeconfig", b"\xff\xfe\x00\x01"),)),
    case(
        "kubeconfig-context-without-cluster",
        CONNECT,
        2,
        "cannot be used",
        arrange=(_kubeconfig(lambda d: _first(d, "contexts")["context"].update(cluster="nowhere")),),
    ),
    case(
        "kubeconfig-server-not-a-url", CONNECT, 2, "not an http(s) URL", arrange=(_cluster_entry(server="not a url"),)
    ),
    case(
        "kubeconfig-ca-not-pem",
        CONNECT,
        2,
        "not valid PEM",
        arrange=(_cluster_entry(**{"certificate-authority-data": NOT_PEM}),),
    ),
    case(
        "kubeconfig-client-cert-not-pem",
        CONNECT,
        2,
        "not valid PEM",
        arrange=(_user_entry(**{"client-certificate-data": NOT_PEM}),),
    ),
    case(
        "kubeconfig-key-not-base64",
        CONNECT,
        2,
        "cannot be used",
        arrange=(_user_entry(**{"client-key-data": "!!notbase64"}),),
    ),
    case(
        "kubeconfig-exec-plugin-missing",
        CONNECT,
        2,
        "no-such-credential-plugin",
        arrange=(_kubeconfig(lambda d: _first(d, "users").update(user={"exec": MISSING_PLUGIN})),),
    ),
    case(
        "context-repointed-lock-status",
        "--config {tmp}/cfg/config.yaml lock status web",
        5,
        "identity",
        arrange=(_repoint_c1,),
    ),
    case(
        "context-repointed-state-get",
        "--config {tmp}/cfg/config.yaml state get web",
        5,
        "identity mismatch",
        arrange=(_repoint_c1,),
    ),
    case(
        "context-repointed-state-set",
        "--config {tmp}/cfg/config.yaml state set web a=1 --lock-id 0123456789abcdef",
        5,
        "identity mismatch",
        arrange=(_repoint_c1,),
    ),
    # -- in-cluster objects edited into garbage
    case(
        "state-not-json-everywhere-get",
        "state get {dep}",
        6,
        "corrupt",
        "not JSON",
        arrange=(_edit_envelope("not-json"),),
    ),
    case(
        "state-not-json-everywhere-set",
        "state set {dep} a=2 --lock-id {lock}",
        6,
        "corrupt",
        arrange=(_edit_envelope("not-json"),),
    ),
    case(
        "state-not-json-everywhere-history", "state history {dep}", 6, "corrupt", arrange=(_edit_envelope("not-json"),)
    ),
    case(
        "state-not-json-everywhere-backup",
        "state backup {dep} -f {tmp}/b.json",
        6,
        "corrupt",
        arrange=(_edit_envelope("not-json"),),
    ),
    case(
        "state-not-json-everywhere-sync",
        "state sync {dep}",
        2,
        "No valid replica",
        arrange=(_edit_envelope("not-json"),),
    ),
    case(
        "state-json-list-everywhere", "state get {dep}", 6, "not a JSON object", arrange=(_edit_envelope("json-list"),)
    ),
    case(
        "state-without-envelope-key",
        "state get {dep}",
        6,
        "envelope.json",
        arrange=(_edit_envelope("no-envelope-key"),),
    ),
    case(
        "state-data-not-a-mapping",
        "state get {dep}",
        6,
        "invalid envelope",
        arrange=(_edit_envelope("data-not-mapping"),),
    ),
    case(
        "state-wrong-checksum-everywhere",
        "state get {dep}",
        6,
        "checksum mismatch",
        arrange=(_edit_envelope("wrong-checksum"),),
    ),
    case(
        "state-wrong-checksum-on-a-majority",
        "state get {dep}",
        4,
        "could not be repaired onto a majority",
        arrange=(_edit_envelope("wrong-checksum", (1, 2)),),
    ),
    case("state-newer-schema-get", "state get {dep}", 6, "schema 99", arrange=(_edit_envelope("newer-schema", (1,)),)),
    case(
        "state-newer-schema-set",
        "state set {dep} a=2 --lock-id {lock}",
        6,
        "schema 99",
        arrange=(_edit_envelope("newer-schema", (2,)),),
    ),
    case(
        "state-newer-schema-sync", "state sync {dep}", 6, "schema 99", arrange=(_edit_envelope("newer-schema", (3,)),)
    ),
    case(
        "lease-token-not-an-integer",
        "lock acquire {dep}",
        4,
        "not a whole number",
        "lock break",
        arrange=(_lease({"coordinator.io/fencing-token": "seven"}),),
    ),
    case(
        "lease-token-negative",
        "lock acquire {dep}",
        4,
        "not a whole number",
        arrange=(_lease({"coordinator.io/fencing-token": "-4"}),),
    ),
    case("lease-held-by-a-foreign-holder", "lock acquire {dep}", 3, "someone-elses-operator", arrange=(FOREIGN_LEASE,)),
    case(
        "lease-foreign-release",
        "lock release {dep} --lock-id 0123456789abcdef",
        6,
        "holds nothing",
        arrange=(FOREIGN_LEASE,),
    ),
    case(
        "lease-foreign-renew",
        "lock renew {dep} --lock-id 0123456789abcdef",
        6,
        "no longer holds",
        arrange=(FOREIGN_LEASE,),
    ),
    case(
        "lease-foreign-state-write",
        "state set {dep} k=v --lock-id 0123456789abcdef",
        6,
        "does not hold",
        arrange=(FOREIGN_LEASE,),
    ),
]


def test_the_corpus_is_big_enough() -> None:
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.code for c in CASES} == {2, 3, 4, 5, 6}


# ------------------------------------------------------------------------ snapshots


def _local_files(*folders: Path) -> dict[str, bytes]:
    """Every file under ``folders`` (file-lock files aside), by path."""
    found: dict[str, bytes] = {}
    for folder in folders:
        if not folder.exists():
            continue
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.name.endswith(".lock"):
                found[str(path)] = path.read_bytes()
    return found


async def _cluster_objects(env: Env) -> dict[str, str]:
    """resourceVersion of every lease and ConfigMap the tool could have touched."""
    found: dict[str, str] = {}
    collections = {
        "lease": leases_path(env.namespace),
        "configmap": configmaps_path(env.namespace),
        "default/configmap": configmaps_path("default"),
    }
    for i in range(1, env.sandbox.n + 1):
        client = env.client(i)
        try:
            for kind, path in collections.items():
                body = (await client.request("GET", path)).body
                for item in body.get("items") or []:
                    meta = item["metadata"]
                    found[f"c{i}/{kind}/{meta['name']}"] = meta["resourceVersion"]
        finally:
            await client.close()
    return found


def _paragraph_problems(stderr: str) -> list[str]:
    text = stderr.strip()
    problems = []
    if not text:
        problems.append("stderr is empty")
    if "Traceback" in text:
        problems.append("a traceback")
    if not text.startswith("Error: "):
        problems.append("it does not start with 'Error: '")
    if "\n\n" in text or any(not line.strip() for line in text.splitlines()):
        problems.append("more than one paragraph")
    if sum(1 for line in text.splitlines() if line.startswith("Error:")) > 1:
        problems.append("more than one error")
    return problems


# ------------------------------------------------------------------------------ test


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(env: Env, tmp_path: Path, case: Case) -> None:
    ctx = Ctx(env, tmp_path, {"tmp": str(tmp_path), "dep": "web", "lock": ""})
    for arrange in case.arrange:
        arrange(ctx)
    args = [a.format_map(ctx.values) for a in case.args]

    local_before = _local_files(env.config.parent, tmp_path)
    objects_before = anyio.run(_cluster_objects, env)
    proc = env.cli(*args, timeout=180)
    local_after = _local_files(env.config.parent, tmp_path)
    objects_after = anyio.run(_cluster_objects, env)

    shown = f"`coordinator {' '.join(args)}` exited {proc.returncode}\nstderr:\n{proc.stderr}\nstdout:\n{proc.stdout}"
    assert proc.returncode == case.code, shown
    assert not _paragraph_problems(proc.stderr), f"{_paragraph_problems(proc.stderr)}: {shown}"
    for words in case.says:
        assert words.lower() in proc.stderr.lower(), f"{words!r} not said: {shown}"
    assert local_after == local_before, f"local files changed: {shown}"
    assert objects_after == objects_before, f"objects in the clusters changed: {shown}"


def test_replicas_are_read_back_exactly_after_a_refused_write(env: Env, tmp_path: Path) -> None:
    """Refusal is not just "same resourceVersion": the garbage itself is still there."""
    ctx = Ctx(env, tmp_path, {"tmp": str(tmp_path)})
    _edit_envelope("not-json")(ctx)
    before = [copy.deepcopy(ctx.run(env.raw, i, "GET", _state_path(ctx))["data"]) for i in (1, 2, 3)]
    proc = env.cli("state", "set", ctx.values["dep"], "a=2", "--lock-id", ctx.values["lock"])
    assert proc.returncode == 6, proc.stderr
    after = [ctx.run(env.raw, i, "GET", _state_path(ctx))["data"] for i in (1, 2, 3)]
    assert after == before == [{"envelope.json": "this is {not json"}] * 3
