"""Clusters and deployments, as a user meets them on the command line, against real API servers."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from coord_fixtures import Env, make_env

from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet
from coordinator.ops.admin import connect_cluster, create_deployment
from coordinator.rules.resources import (
    configmaps_path,
    lease_path,
    leases_path,
    namespace_path,
    secrets_path,
)

pytestmark = pytest.mark.integration

OURS = "coordinator.io/managed-by"
HELMS = "app.kubernetes.io/managed-by"
LEAKS = ("Unclosed client session", "Unclosed connector")


# ----------------------------------------------------------------------------- helpers


def cli(env: Env, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command line; whatever it does, it must not leak clients nor dump a traceback."""
    proc = env.cli(*args, env=extra)
    for leak in LEAKS:
        assert leak not in proc.stderr, f"{args}: {proc.stderr}"
    assert "Traceback" not in proc.stderr, f"{args}: {proc.stderr}"
    return proc


def ok(env: Env, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = cli(env, *args, extra=extra)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}: {proc.stderr}"
    return proc


def doc(env: Env, *args: str, extra: dict[str, str] | None = None) -> Any:
    return json.loads(ok(env, "-o", "json", *args, extra=extra).stdout)


def one_paragraph(stderr: str) -> str:
    text = stderr.strip()
    assert text, "nothing on stderr"
    assert "\n\n" not in text, f"more than one paragraph:\n{stderr}"
    assert text.count("Error:") == 1, stderr
    return text


def bare_env(sandbox: Any, tmp_path: Path) -> Env:
    """A config with nothing connected yet (the file does not exist)."""
    return Env(sandbox=sandbox, config=tmp_path / "config" / "config.yaml", namespace="t-" + secrets.token_hex(4))


def snapshot(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def kube_system_uid(sandbox: Any, index: int) -> str:
    return str(sandbox.admin(index).get(namespace_path("kube-system"))["metadata"]["uid"])


def fresh_namespace(sandbox: Any, *indices: int) -> str:
    name = "t-" + secrets.token_hex(4)
    for i in indices:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        sandbox.admin(i).create("/api/v1/namespaces", body)
    return name


def items(sandbox: Any, index: int, path: str) -> list[dict[str, Any]]:
    return list((sandbox.admin(index).get(path) or {}).get("items") or [])


def versions(sandbox: Any, index: int, namespace: str) -> dict[str, str]:
    """name -> resourceVersion of every lease, ConfigMap and Secret in ``namespace``."""
    out = {}
    for kind, path in (("lease", leases_path), ("configmap", configmaps_path), ("secret", secrets_path)):
        for obj in items(sandbox, index, path(namespace)):
            out[f"{kind}/{obj['metadata']['name']}"] = obj["metadata"]["resourceVersion"]
    return out


def connect_all(env: Env, names: dict[str, str], kubeconfig: str | None = None, **kw: Any) -> None:
    """Connect clusters through the library (for tests whose subject comes later)."""
    store = ConfigStore(env.config)

    async def go() -> None:
        for name, context in names.items():
            await connect_cluster(store, name, context, kubeconfig or env.kubeconfig, **kw)

    anyio.run(go)
    env.clusters = list(names)


def define(env: Env, name: str, namespace: str, members: list[str], storage: str = "configmap") -> None:
    store = ConfigStore(env.config)

    async def go() -> None:
        cs = ClusterSet(store.load(), timeout=5)
        try:
            await create_deployment(store, cs, name, namespace, members, storage)
        finally:
            await cs.aclose()

    anyio.run(go)


# ----------------------------------------------------------------------------- connect and list


def test_three_clusters_connect_with_three_identities_and_are_listed(sandbox3: Any, tmp_path: Path) -> None:
    env = bare_env(sandbox3, tmp_path)
    connected = {}
    for i in (1, 2, 3):
        proc = ok(env, "cluster", "connect", f"c{i}", "--context", f"sandbox-{i}")
        assert f"Connected c{i}" in proc.stdout and "kube-system" in proc.stdout
        connected[f"c{i}"] = kube_system_uid(sandbox3, i)
        assert connected[f"c{i}"] in proc.stdout
    assert len(set(connected.values())) == 3

    listed = doc(env, "cluster", "list")
    assert [c["name"] for c in listed] == ["c1", "c2", "c3"]
    for i, c in enumerate(listed, start=1):
        assert c["identity"] == connected[c["name"]]
        assert c["identity_source"] == "kube-system-uid"
        assert c["context"] == f"sandbox-{i}" and c["server"] == sandbox3.server(i)

    as_yaml = yaml.safe_load(ok(env, "-o", "yaml", "cluster", "list").stdout)
    assert as_yaml == listed

    table = ok(env, "cluster", "list", extra={"COLUMNS": "80"}).stdout.splitlines()
    assert table[0].split() == ["NAME", "CONTEXT", "SERVER", "IDENTITY"]
    assert len(table) == 4
    for i, line in enumerate(table[1:], start=1):
        assert len(line) <= 80, line
        name, context, server, ident = line.split()
        assert (name, context, server) == (f"c{i}", f"sandbox-{i}", sandbox3.server(i))
        assert connected[name].startswith(ident)


def test_two_connects_started_at_the_same_instant_both_land(sandbox3: Any, tmp_path: Path) -> None:
    env = bare_env(sandbox3, tmp_path)
    procs = [
        env.popen(
            "cluster", "connect", f"c{i}", "--context", f"sandbox-{i}", stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for i in (1, 2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert not any(leak in err for leak in LEAKS), err
    assert sorted(c["name"] for c in doc(env, "cluster", "list")) == ["c1", "c2"]


def test_the_same_cluster_twice_under_two_names_is_refused(sandbox3: Any, tmp_path: Path) -> None:
    env = bare_env(sandbox3, tmp_path)
    ok(env, "cluster", "connect", "c1", "--context", "sandbox-1")
    before = snapshot(env.config)
    # Other credentials, same cluster: the identity gives it away.
    proc = cli(env, "cluster", "connect", "again", "--context", "sandbox-1-token")
    assert proc.returncode == 2, proc.stderr
    text = one_paragraph(proc.stderr)
    assert "same cluster" in text and "'c1'" in text and kube_system_uid(sandbox3, 1) in text
    assert snapshot(env.config) == before

    ok(
        env,
        "cluster",
        "connect",
        "r2",
        "--context",
        "sandbox-2-restricted",
        "--identity-namespace",
        "sandbox-restricted",
    )
    before = snapshot(env.config)
    proc = cli(
        env,
        "cluster",
        "connect",
        "r2b",
        "--context",
        "sandbox-2-restricted",
        "--identity-namespace",
        "sandbox-restricted",
    )
    assert proc.returncode == 2 and "same cluster" in one_paragraph(proc.stderr) and "'r2'" in proc.stderr
    assert snapshot(env.config) == before
    assert [c["name"] for c in doc(env, "cluster", "list")] == ["c1", "r2"]

    # The same cluster proven by different means: each side's ConfigMap proof is read
    # through the other side's context. r2 by its ConfigMap, then c2 by kube-system:
    proc = cli(env, "cluster", "connect", "c2", "--context", "sandbox-2")
    assert proc.returncode == 2, proc.stderr
    text = one_paragraph(proc.stderr)
    assert "same cluster as 'r2'" in text and "reads the identity ConfigMap of 'r2'" in text, text
    assert snapshot(env.config) == before
    # c1 by kube-system, then r1 by its ConfigMap (which c1's context can read):
    proc = cli(
        env,
        "cluster",
        "connect",
        "r1",
        "--context",
        "sandbox-1-restricted",
        "--identity-namespace",
        "sandbox-restricted",
    )
    assert proc.returncode == 2, proc.stderr
    text = one_paragraph(proc.stderr)
    assert "same cluster as 'c1'" in text, text
    assert "the context of 'c1' reads this context's identity ConfigMap" in text, text
    assert snapshot(env.config) == before
    # A different cluster proven by its ConfigMap is not mistaken for one of them.
    ok(
        env,
        "cluster",
        "connect",
        "r3",
        "--context",
        "sandbox-3-restricted",
        "--identity-namespace",
        "sandbox-restricted",
    )
    assert [c["name"] for c in doc(env, "cluster", "list")] == ["c1", "r2", "r3"]


def test_restricted_context_connects_through_the_uuid_configmap(sandbox3: Any, tmp_path: Path) -> None:
    env = bare_env(sandbox3, tmp_path)
    ns = sandbox3.restricted_namespace  # the sandbox lets this user get/create ConfigMaps there, nothing else

    refused = cli(env, "cluster", "connect", "r3", "--context", "sandbox-3-restricted")
    assert refused.returncode == 2, refused.stderr
    assert "--identity-namespace" in one_paragraph(refused.stderr) and "forbidden" in refused.stderr
    assert snapshot(env.config) is None

    proc = ok(env, "cluster", "connect", "r3", "--context", "sandbox-3-restricted", "--identity-namespace", ns)
    assert f"ConfigMap {ns}/coordinator-identity" in proc.stdout and "kube-system is not readable" in proc.stdout
    cm = sandbox3.admin(3).get(f"{configmaps_path(ns)}/coordinator-identity")
    assert cm is not None
    (rec,) = doc(env, "cluster", "list")
    assert rec["identity_source"] == "configmap-uuid" and rec["identity_namespace"] == ns
    assert rec["identity"] == cm["data"]["uuid"] != kube_system_uid(sandbox3, 3)
    assert cm["metadata"]["labels"][OURS] == "coordinator" and HELMS not in cm["metadata"]["labels"]

    info = doc(env, "cluster", "info", "r3", "--namespace", ns)
    assert info["identity_ok"] is True and info["reachable"] is True
    assert info["permissions"]["configmaps"]["get"] is True and info["permissions"]["configmaps"]["create"] is True
    assert not any(info["permissions"]["leases"].values())
    missing = set(info["missing_permissions"])
    assert {"create leases", "update leases", "watch leases", "update configmaps", "delete configmaps"} <= missing
    assert "get configmaps" not in missing and "create configmaps" not in missing

    text = ok(env, "cluster", "info", "r3", "--namespace", ns).stdout
    assert f"Missing permissions in namespace {ns}" in text and "create leases" in text
    assert "configmap-uuid" in text and "identity check" in text


# ----------------------------------------------------------------------------- identity gate


def _repoint(kubeconfig: Path, how: str, sandbox: Any, to: int) -> None:
    """Make context sandbox-1 of ``kubeconfig`` lead to cluster ``to``, the way people do it."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    if how == "context":
        (ctx,) = [c for c in cfg["contexts"] if c["name"] == "sandbox-1"]
        ctx["context"]["cluster"] = f"sandbox-{to}"
    else:
        (entry,) = [c for c in cfg["clusters"] if c["name"] == "sandbox-1"]
        entry["cluster"]["server"] = sandbox.server(to)
    kubeconfig.write_text(yaml.safe_dump(cfg))


@pytest.mark.parametrize("how", ["context", "server"])
def test_repointed_context_stops_every_command_with_exit_5(sandbox3: Any, tmp_path: Path, how: str) -> None:
    """Member ``a`` was connected through a copied kubeconfig; its context is then edited to
    lead to cluster 3, which is no member. Every command stops, naming ``a``, the identity it
    was connected as and the one it found, and cluster 3 receives nothing."""
    env = bare_env(sandbox3, tmp_path)
    copy = tmp_path / "kubeconfig"
    copy.write_bytes(sandbox3.kubeconfig.read_bytes())
    connect_all(env, {"a": "sandbox-1"}, kubeconfig=str(copy))
    connect_all(env, {"b": "sandbox-2"})
    ns = fresh_namespace(sandbox3, 3)  # exists on the wrong cluster, so a stray write would land
    define(env, "two", ns, ["a", "b"])
    lock_id = doc(env, "lock", "acquire", "two", "--ttl", "300s")["lock_id"]
    ok(env, "state", "set", "two", "x=1")
    backup = tmp_path / "backup.json"
    ok(env, "state", "backup", "two", "-f", str(backup))

    expected, found = kube_system_uid(sandbox3, 1), kube_system_uid(sandbox3, 3)
    wrong_before = versions(sandbox3, 3, ns)
    member_before = versions(sandbox3, 2, ns)
    assert "lease/coordinator-lock-two" in member_before
    _repoint(copy, how, sandbox3, 3)
    config_before = snapshot(env.config)

    apply_file = tmp_path / "apply.yaml"
    apply_file.write_text("x: 3\n")
    other_ns = "t-" + secrets.token_hex(4)

    def stopped(*args: str) -> None:
        proc = cli(env, *args)
        assert proc.returncode == 5, f"{args} exited {proc.returncode}: {proc.stderr}"
        assert "'a'" in proc.stderr and expected in proc.stderr and found in proc.stderr, (args, proc.stderr)
        assert snapshot(env.config) == config_before, args

    stopped("lock", "status", "two")
    stopped("lock", "acquire", "two")
    stopped("state", "get", "two")
    stopped("state", "set", "two", "x=2")
    if how == "context":  # the same gate for everything else that talks to a cluster
        for args in [
            ("-o", "json", "lock", "status", "two"),
            ("lock", "run", "two", "--", "true"),
            ("state", "get", "two", "x"),
            ("state", "apply", "two", "-f", str(apply_file)),
            ("state", "diff", "two"),
            ("state", "sync", "two"),
            ("state", "history", "two"),
            ("state", "backup", "two", "-f", str(tmp_path / "b2.json")),
            ("state", "restore", "two", "-f", str(backup)),
            ("cluster", "info", "a"),
            ("deployment", "create", "other", "-n", other_ns, "--cluster", "a", "--cluster", "b"),
            ("deployment", "delete", "two", "--purge", "--yes"),
        ]:
            stopped(*args)
        for i in (2, 3):
            assert sandbox3.admin(i).get(namespace_path(other_ns)) is None, i
    # So far not even the true member was touched.
    assert versions(sandbox3, 2, ns) == member_before
    identity = sandbox3.admin(2).get(lease_path(ns, "coordinator-lock-two"))["spec"]["holderIdentity"]
    assert identity.endswith("/" + lock_id)

    if how == "context":
        # Giving up a lock still acts on the members that proved themselves, and says
        # that the repointed one was left alone.
        for args in [("lock", "renew", "two"), ("lock", "release", "two"), ("lock", "break", "two", "--yes")]:
            stopped(*args)
        ok(env, "deployment", "delete", "two")  # the local record only: no cluster is touched
        proc = cli(env, "deployment", "import", "two", "--cluster", "a")
        assert proc.returncode == 5, proc.stderr
        assert expected in proc.stderr and found in proc.stderr

    assert versions(sandbox3, 3, ns) == wrong_before  # nothing ever landed on the wrong cluster
    state = "configmap/coordinator-state-two"
    assert versions(sandbox3, 2, ns)[state] == member_before[state]


# ----------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def prepared(sandbox3: Any, tmp_path_factory: pytest.TempPathFactory) -> Env:
    """c1..c3 connected and deployment ``web`` defined; every case must leave it as it is."""
    tmp = tmp_path_factory.mktemp("bad-input")
    for name, text in {
        "garbage.yaml": "clusters: [unclosed\n",
        "list.yaml": "- just\n- a list\n",
        "words.yaml": "hello world\n",
    }.items():
        (tmp / name).write_text(text)
    (tmp / "binary.yaml").write_bytes(bytes(range(256)) * 2)
    return make_env(sandbox3, tmp)


LONG = "a" * 64
BAD_INPUT: dict[str, tuple[list[str], dict[str, str], str]] = {
    # id: (args, extra environment, what the message must name); "{tmp}" is the fixture's directory
    "unknown-context": (["cluster", "connect", "x", "--context", "nope"], {}, "'nope'"),
    "missing-kubeconfig": (
        ["cluster", "connect", "x", "--context", "sandbox-1", "--kubeconfig", "{tmp}/none"],
        {},
        "No kubeconfig file",
    ),
    "missing-KUBECONFIG": (
        ["cluster", "connect", "x", "--context", "sandbox-1"],
        {"KUBECONFIG": "{tmp}/none:{tmp}/none2"},
        "No kubeconfig file",
    ),
    "garbage-kubeconfig": (
        ["cluster", "connect", "x", "--context", "sandbox-1", "--kubeconfig", "{tmp}/garbage.yaml"],
        {},
        "not valid YAML at line",
    ),
    "garbage-KUBECONFIG": (
        ["cluster", "connect", "x", "--context", "sandbox-1"],
        {"KUBECONFIG": "{tmp}/garbage.yaml"},
        "garbage.yaml",
    ),
    "list-kubeconfig": (
        ["cluster", "connect", "x", "--context", "sandbox-1", "--kubeconfig", "{tmp}/list.yaml"],
        {},
        "list.yaml",
    ),
    "words-kubeconfig": (
        ["cluster", "connect", "x", "--context", "sandbox-1", "--kubeconfig", "{tmp}/words.yaml"],
        {},
        "words.yaml",
    ),
    "binary-kubeconfig": (
        ["cluster", "connect", "x", "--context", "sandbox-1", "--kubeconfig", "{tmp}/binary.yaml"],
        {},
        "binary.yaml",
    ),
    "cluster-name-not-dns": (["cluster", "connect", "Bad_Name", "--context", "sandbox-1"], {}, "DNS-1123"),
    "cluster-name-too-long": (["cluster", "connect", LONG, "--context", "sandbox-1"], {}, "limit is 63"),
    "cluster-name-empty": (["cluster", "connect", "", "--context", "sandbox-1"], {}, "must not be empty"),
    "identity-namespace-not-dns": (
        ["cluster", "connect", "x", "--context", "sandbox-1", "--identity-namespace", "No.Such"],
        {},
        "DNS-1123",
    ),
    "cluster-name-taken": (["cluster", "connect", "c1", "--context", "sandbox-2"], {}, "already connected"),
    "deployment-name-not-dns": (["deployment", "create", "Web", "-n", "ok", "--cluster", "c1"], {}, "DNS-1123"),
    "deployment-name-too-long": (["deployment", "create", "d" * 46, "-n", "ok", "--cluster", "c1"], {}, "limit is 45"),
    "namespace-not-dns": (["deployment", "create", "ok", "-n", "-bad", "--cluster", "c1"], {}, "DNS-1123"),
    "namespace-too-long": (["deployment", "create", "ok", "-n", LONG, "--cluster", "c1"], {}, "limit is 63"),
    "unknown-member": (["deployment", "create", "ok", "-n", "ok", "--cluster", "c1", "--cluster", "c9"], {}, "'c9'"),
    "duplicate-member": (
        ["deployment", "create", "ok", "-n", "ok", "--cluster", "c1", "--cluster", "c1"],
        {},
        "listed twice",
    ),
    "deployment-exists": (["deployment", "create", "web", "-n", "ok", "--cluster", "c1"], {}, "already exists"),
    "show-unknown": (["deployment", "show", "nope"], {}, "'nope'"),
    "delete-unknown": (["deployment", "delete", "nope"], {}, "'nope'"),
    "purge-unknown": (["deployment", "delete", "nope", "--purge", "--yes"], {}, "'nope'"),
    "import-from-unknown-cluster": (["deployment", "import", "x", "--cluster", "c9"], {}, "'c9'"),
    "import-bad-name": (["deployment", "import", "Bad", "--cluster", "c1"], {}, "DNS-1123"),
    "import-bad-namespace": (["deployment", "import", "x", "--cluster", "c1", "-n", "Bad"], {}, "DNS-1123"),
    "import-existing": (["deployment", "import", "web", "--cluster", "c1"], {}, "already exists"),
    "info-unknown": (["cluster", "info", "c9"], {}, "'c9'"),
    "disconnect-unknown": (["cluster", "disconnect", "c9"], {}, "'c9'"),
    "disconnect-in-use": (["cluster", "disconnect", "c2"], {}, "--force"),
    "lock-unknown-deployment": (["lock", "acquire", "nope"], {}, "'nope'"),
    "status-unknown-deployment": (["lock", "status", "nope"], {}, "'nope'"),
    "state-unknown-deployment": (["state", "get", "nope"], {}, "'nope'"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_2_with_one_paragraph_and_leaves_the_config_alone(prepared: Env, case: str) -> None:
    args, extra, named = BAD_INPUT[case]
    tmp = str(prepared.config.parent.parent)
    args = [a.replace("{tmp}", tmp) for a in args]
    extra = {k: v.replace("{tmp}", tmp) for k, v in extra.items()}
    before, locks_before = snapshot(prepared.config), snapshot(prepared.config.with_name("config.locks.yaml"))
    proc = cli(prepared, *args, extra=extra)
    assert proc.returncode == 2, f"exited {proc.returncode}: {proc.stderr}"
    text = one_paragraph(proc.stderr)
    assert text.startswith("Error:") and named.replace("{tmp}", tmp) in text, text
    assert "TypeError" not in text and "KeyError" not in text
    assert proc.stdout == ""
    assert snapshot(prepared.config) == before
    assert snapshot(prepared.config.with_name("config.locks.yaml")) == locks_before


# ----------------------------------------------------------------------------- disconnect


def test_disconnect_is_refused_while_a_deployment_uses_it_unless_forced(dep3: Env) -> None:
    before = snapshot(dep3.config)
    refused = cli(dep3, "cluster", "disconnect", "c1")
    assert refused.returncode == 2
    text = one_paragraph(refused.stderr)
    assert "'c1'" in text and "deployment(s) web" in text and "--force" in text
    assert snapshot(dep3.config) == before
    forced = doc(dep3, "cluster", "disconnect", "c1", "--force")
    assert forced == {"disconnected": "c1", "deployments_affected": ["web"]}
    assert [c["name"] for c in doc(dep3, "cluster", "list")] == ["c2", "c3"]
    ok(dep3, "deployment", "delete", "web")
    assert "Disconnected c2." in ok(dep3, "cluster", "disconnect", "c2").stdout


# ----------------------------------------------------------------------------- deployments


def test_create_makes_the_namespace_where_allowed_and_says_where_not(sandbox3: Any, tmp_path: Path) -> None:
    env = bare_env(sandbox3, tmp_path)
    connect_all(env, {"c1": "sandbox-1", "c3": "sandbox-3"})
    connect_all(env, {"r2": "sandbox-2-restricted"}, identity_namespace=sandbox3.restricted_namespace)
    ns = "t-" + secrets.token_hex(4)
    created = doc(env, "deployment", "create", "mix", "-n", ns, "--cluster", "c1", "--cluster", "r2", "--cluster", "c3")
    assert created["clusters"] == ["c1", "r2", "c3"] and created["quorum"] == 2
    rows = {r["name"]: r for r in created["namespace_on_clusters"]}
    assert [r["name"] for r in created["namespace_on_clusters"]] == ["c1", "r2", "c3"]
    assert rows["c1"]["outcome"] == rows["c3"]["outcome"] == "ok"
    assert "created" in rows["c1"]["detail"] and "created" in rows["c3"]["detail"]
    assert rows["r2"]["outcome"] == "forbidden" and "ask an admin" in rows["r2"]["detail"]
    for i in (1, 3):
        labels = sandbox3.admin(i).get(namespace_path(ns))["metadata"]["labels"]
        assert labels[OURS] == "coordinator" and HELMS not in labels
    assert sandbox3.admin(2).get(namespace_path(ns)) is None

    # An existing namespace is used as it is; the table says so per cluster.
    text = ok(env, "deployment", "create", "mix2", "-n", ns, "--cluster", "c1", "--cluster", "c3").stdout
    assert "Created deployment mix2" in text and text.count("namespace exists") == 2


def test_list_and_show_in_every_format(dep3: Env) -> None:
    listed = doc(dep3, "deployment", "list")
    assert listed == [
        {
            "name": "web",
            "namespace": dep3.namespace,
            "clusters": ["c1", "c2", "c3"],
            "quorum": 2,
            "storage": "configmap",
        }
    ]
    assert yaml.safe_load(ok(dep3, "-o", "yaml", "deployment", "list").stdout) == listed
    table = ok(dep3, "deployment", "list").stdout.splitlines()
    assert table[0].split() == ["NAME", "NAMESPACE", "QUORUM", "CLUSTERS"]
    assert table[1].split() == ["web", dep3.namespace, "2/3", "c1,c2,c3"]

    shown = doc(dep3, "deployment", "show", "web")
    assert {k: shown[k] for k in ("name", "namespace", "clusters", "quorum", "storage")} == listed[0]
    assert shown["created_at"].endswith("Z")
    assert yaml.safe_load(ok(dep3, "-o", "yaml", "deployment", "show", "web").stdout) == shown
    text = ok(dep3, "deployment", "show", "web").stdout
    assert dep3.namespace in text and "c1,c2,c3" in text


def _tool_objects(env: Env, index: int) -> dict[str, str | None]:
    """Lease and state object of the env's deployment on cluster ``index``: path -> resourceVersion or None."""
    out: dict[str, str | None] = {}
    for path in (
        lease_path(env.namespace, f"coordinator-lock-{env.deployment}"),
        f"{configmaps_path(env.namespace)}/coordinator-state-{env.deployment}",
    ):
        obj = env.sandbox.admin(index).get(path)
        out[path] = obj["metadata"]["resourceVersion"] if obj else None
    return out


@pytest.fixture
def lone(sandbox3: Any, tmp_path: Path) -> Env:
    """Like ``dep3``, with a deployment name no other test uses (import looks in every namespace)."""
    return make_env(sandbox3, tmp_path, deployment="d-" + secrets.token_hex(4))


def test_local_delete_then_import_from_the_state(lone: Env, tmp_path: Path) -> None:
    name = lone.deployment
    ok(lone, "lock", "acquire", name)
    ok(lone, "state", "set", name, "replicas:=3")
    ok(lone, "lock", "release", name)
    before = [_tool_objects(lone, i) for i in (1, 2, 3)]

    assert "local record only" in ok(lone, "deployment", "delete", name).stdout
    assert doc(lone, "deployment", "list") == []
    assert [_tool_objects(lone, i) for i in (1, 2, 3)] == before  # nothing changed in the clusters

    imported = doc(lone, "deployment", "import", name, "--cluster", "c2")
    assert imported == {
        "name": name,
        "namespace": lone.namespace,
        "clusters": ["c1", "c2", "c3"],
        "source": "lock lease (member set epoch 1)",
        "max_ttl_s": 600.0,
    }
    assert doc(lone, "state", "get", name) == {"replicas": 3}

    # Members are matched by identity, so a machine that named the clusters differently
    # gets its own names back.
    other = bare_env(lone.sandbox, tmp_path / "elsewhere")
    connect_all(other, {"eu": "sandbox-1", "us": "sandbox-2", "ap": "sandbox-3"})
    text = ok(other, "deployment", "import", name, "--cluster", "ap").stdout
    assert "from the lock lease" in text
    assert doc(other, "deployment", "show", name)["clusters"] == ["eu", "us", "ap"]


def test_import_from_the_lock_lease_when_there_is_no_state(lone: Env) -> None:
    name = lone.deployment
    held = doc(lone, "lock", "acquire", name)
    ok(lone, "deployment", "delete", name)
    imported = doc(lone, "deployment", "import", name, "--cluster", "c3")
    assert imported == {
        "name": name,
        "namespace": lone.namespace,
        "clusters": ["c1", "c2", "c3"],
        "source": "lock lease (member set epoch 1)",
        "max_ttl_s": 600.0,
    }
    assert doc(lone, "lock", "status", name)["lock_id"] == held["lock_id"]
    ok(lone, "lock", "release", name)


def test_import_of_a_name_used_in_two_namespaces_asks_which(lone: Env, tmp_path: Path) -> None:
    name = lone.deployment
    ok(lone, "lock", "acquire", name)
    # The same deployment name in another namespace, as another team would have it.
    twin = make_env(lone.sandbox, tmp_path / "twin", deployment=name)
    ok(twin, "lock", "acquire", name)
    ok(lone, "deployment", "delete", name)
    before = snapshot(lone.config)

    proc = cli(lone, "deployment", "import", name, "--cluster", "c1")
    assert proc.returncode == 2, proc.stderr
    text = one_paragraph(proc.stderr)
    assert lone.namespace in text and twin.namespace in text and "--namespace" in text
    assert snapshot(lone.config) == before
    chosen = doc(lone, "deployment", "import", name, "--cluster", "c1", "--namespace", twin.namespace)
    assert chosen["namespace"] == twin.namespace and chosen["source"].startswith("lock lease")


def test_purge_removes_lease_and_state_everywhere_under_the_lock(lone: Env) -> None:
    name = lone.deployment
    ok(lone, "lock", "acquire", name, "--holder", "alice", "--ttl", "120s")
    ok(lone, "state", "set", name, "a=1", extra={"COORDINATOR_HOLDER": "alice"})
    before = [_tool_objects(lone, i) for i in (1, 2, 3)]
    assert all(v is not None for objs in before for v in objs.values())

    # Someone holds the lock: no purge, nothing deleted, the record kept.
    held = cli(lone, "deployment", "delete", name, "--purge", "--yes")
    assert held.returncode == 3 and "alice" in held.stderr
    assert [_tool_objects(lone, i) for i in (1, 2, 3)] == before
    assert [d["name"] for d in doc(lone, "deployment", "list")] == [name]
    ok(lone, "lock", "release", name, extra={"COORDINATOR_HOLDER": "alice"})

    # A member that does not answer keeps the record, so the purge can be finished later.
    lone.sandbox.pause(3)
    partial = cli(lone, "--timeout", "2s", "deployment", "delete", name, "--purge", "--yes")
    assert partial.returncode == 4, partial.stderr
    assert "c3" in one_paragraph(partial.stderr) and "--purge" in partial.stderr
    assert [d["name"] for d in doc(lone, "deployment", "list")] == [name]
    lone.sandbox.resume(3)

    purged = doc(lone, "deployment", "delete", name, "--purge", "--yes")
    assert purged["deleted"] == name and set(purged["purged"]) == {"c1", "c2", "c3"}
    for i in (1, 2, 3):
        assert set(_tool_objects(lone, i).values()) == {None}, i
    assert doc(lone, "deployment", "list") == []
    gone = cli(lone, "deployment", "import", name, "--cluster", "c1")
    assert gone.returncode == 2 and "No state or lock" in one_paragraph(gone.stderr)


# ----------------------------------------------------------------------------- labels


def test_everything_the_tool_creates_carries_its_own_label(sandbox3: Any, tmp_path: Path) -> None:
    env = bare_env(sandbox3, tmp_path)
    ns = "t-" + secrets.token_hex(4)
    secret_ns = "t-" + secrets.token_hex(4)
    for i in (1, 2, 3):
        ok(env, "cluster", "connect", f"c{i}", "--context", f"sandbox-{i}")
    # The identity ConfigMap (from another config: in this one, c1 is already this cluster)
    ok(
        bare_env(sandbox3, tmp_path / "other"),
        "cluster",
        "connect",
        "r1",
        "--context",
        "sandbox-1-restricted",
        "--identity-namespace",
        sandbox3.restricted_namespace,
    )
    members = ["--cluster", "c1", "--cluster", "c2", "--cluster", "c3"]
    ok(env, "deployment", "create", "cm", "-n", ns, *members)
    ok(env, "deployment", "create", "sec", "-n", secret_ns, "--storage", "secret", *members)
    for dep in ("cm", "sec"):
        ok(env, "lock", "acquire", dep)
        ok(env, "state", "set", dep, "k=v")
        ok(env, "lock", "release", dep)

    expected = {
        f"namespace/{ns}",
        f"namespace/{secret_ns}",
        f"lease/{ns}/coordinator-lock-cm",
        f"configmap/{ns}/coordinator-state-cm",
        f"lease/{secret_ns}/coordinator-lock-sec",
        f"secret/{secret_ns}/coordinator-state-sec",
    }
    mine = {ns, secret_ns, sandbox3.restricted_namespace}  # other tests plant foreign objects elsewhere
    for i in (1, 2, 3):
        seen: dict[str, dict[str, str]] = {}
        for kind, path in (
            ("namespace", "/api/v1/namespaces"),
            ("lease", "/apis/coordination.k8s.io/v1/leases"),
            ("configmap", "/api/v1/configmaps"),
            ("secret", "/api/v1/secrets"),
        ):
            for obj in items(sandbox3, i, path):
                meta = obj["metadata"]
                if (meta.get("namespace") or meta["name"]) not in mine:
                    continue
                key = "/".join(p for p in (kind, meta.get("namespace"), meta["name"]) if p)
                seen[key] = meta.get("labels") or {}
        ours = {k for k, labels in seen.items() if labels.get(OURS) == "coordinator"}
        assert expected <= ours, (i, expected - ours)
        if i == 1:
            assert f"configmap/{sandbox3.restricted_namespace}/coordinator-identity" in ours
        for key, labels in seen.items():
            if key.rsplit("/", 1)[-1].startswith("coordinator-") or key in ours:
                assert labels.get(OURS) == "coordinator", key
                assert HELMS not in labels, key


# ----------------------------------------------------------------------------- kubeconfig


def test_kubeconfig_with_several_paths_works(sandbox3: Any, tmp_path: Path) -> None:
    whole = yaml.safe_load(sandbox3.kubeconfig.read_text())
    servers = tmp_path / "servers.yaml"  # clusters and users
    contexts = tmp_path / "contexts.yaml"  # contexts only
    servers.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": whole["clusters"],
                "users": whole["users"],
                "contexts": [],
            }
        )
    )
    contexts.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "contexts": whole["contexts"]}))
    split = {"KUBECONFIG": f"{contexts}:{tmp_path / 'absent.yaml'}:{servers}"}
    env = bare_env(sandbox3, tmp_path)

    for i in (1, 2):
        ok(env, "cluster", "connect", f"c{i}", "--context", f"sandbox-{i}", extra=split)
    # The same split given explicitly is recorded, and used whatever KUBECONFIG says later.
    ok(env, "cluster", "connect", "c3", "--context", "sandbox-3", "--kubeconfig", f"{servers}:{contexts}")
    assert doc(env, "cluster", "list")[2]["kubeconfig"] == f"{servers}:{contexts}"
    ns = "t-" + secrets.token_hex(4)
    ok(
        env,
        "deployment",
        "create",
        "web",
        "-n",
        ns,
        "--cluster",
        "c1",
        "--cluster",
        "c2",
        "--cluster",
        "c3",
        extra=split,
    )
    ok(env, "lock", "acquire", "web", extra=split)
    ok(env, "state", "set", "web", "v:=1", extra=split)
    assert doc(env, "state", "get", "web", extra=split) == {"v": 1}
    status = doc(env, "lock", "status", "web", extra=split)
    assert status["held_by_majority"] and {c["status"] for c in status["clusters"]} == {"held"}
    assert doc(env, "cluster", "info", "c1", extra=split)["identity_ok"] is True
    ok(env, "lock", "release", "web", extra=split)


def test_a_relative_kubeconfig_path_is_recorded_absolute(sandbox3: Any, tmp_path: Path) -> None:
    env = bare_env(sandbox3, tmp_path)
    (tmp_path / "kc").write_bytes(sandbox3.kubeconfig.read_bytes())
    proc = env.cli(
        "cluster", "connect", "c1", "--context", "sandbox-1", "--kubeconfig", "kc", prefix=["env", "-C", str(tmp_path)]
    )
    assert proc.returncode == 0, proc.stderr
    assert doc(env, "cluster", "list")[0]["kubeconfig"] == str(tmp_path / "kc")
    assert doc(env, "cluster", "info", "c1")["identity_ok"] is True  # run from another directory
