"""The sandbox: real etcd + kube-apiserver processes on loopback, driven by the CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

import coordinator_sandbox as sb
from coordinator.errors import UsageError
from coordinator_sandbox import process

pytestmark = pytest.mark.integration

COORDINATOR = [sys.executable, "-m", "coordinator"]


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the real command line in a subprocess: (exit code, stdout, stderr)."""
    merged = {**os.environ, "NO_COLOR": "1", **(env or {})}
    merged.pop("COORDINATOR_SANDBOX_DIR", None)
    done = await anyio.run_process([*COORDINATOR, *args], check=False, env=merged)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@asynccontextmanager
async def coordination_api(kubeconfig: Path, context: str) -> AsyncIterator[client.CoordinationV1Api]:
    api_client = await config.new_client_from_config(config_file=str(kubeconfig), context=context, persist_config=False)
    async with api_client:
        yield client.CoordinationV1Api(api_client)


@asynccontextmanager
async def core_api(kubeconfig: Path, context: str) -> AsyncIterator[client.CoreV1Api]:
    api_client = await config.new_client_from_config(config_file=str(kubeconfig), context=context, persist_config=False)
    async with api_client:
        yield client.CoreV1Api(api_client)


def lease(name: str, holder: str = "test") -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=30),
    )


def gone(pid: int, start_ticks: int) -> bool:
    """The process has exited (a zombie counts as exited) or the pid now names another."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0] in ("Z", "X") or int(fields[19]) != start_ticks


def recorded_processes(directory: Path) -> list[tuple[int, int]]:
    state = json.loads((directory / "sandbox.json").read_text())
    return [
        (proc["pid"], proc["start_ticks"])
        for cluster in state["clusters"]
        for proc in (cluster["etcd"], cluster["apiserver"])
    ]


# --------------------------------------------------------------------------- the CLI


@pytest.mark.anyio
@pytest.mark.slow
async def test_cli_sandbox_lifecycle(tmp_path: Path) -> None:
    directory = tmp_path / "sb"
    try:
        code, out, err = await cli("sandbox", "up", "--clusters", "3", "--dir", str(directory))
        assert code == 0, err
        kubeconfig = directory / "kubeconfig"
        assert f"Kubeconfig: {kubeconfig}" in out
        assert out.strip().splitlines()[-1] == f"export KUBECONFIG={kubeconfig}"
        token = sb.Sandbox(directory).token
        assert token not in out + err

        # Each context leads to its own working cluster.
        for context in ("sandbox-1", "sandbox-2", "sandbox-3"):
            async with coordination_api(kubeconfig, context) as api:
                created = await api.create_namespaced_lease("default", lease(f"from-{context}"))
                assert created.spec.holder_identity == "test"
                names = {item.metadata.name for item in (await api.list_namespaced_lease("default")).items}
                assert names == {f"from-{context}"}, "clusters must not share storage"

        # Paused: the port still accepts connections, but nothing ever answers.
        code, _, err = await cli("sandbox", "pause", "1", "--dir", str(directory))
        assert code == 0, err
        async with coordination_api(kubeconfig, "sandbox-1") as api:
            with anyio.fail_after(20), pytest.raises(TimeoutError):
                await api.read_namespaced_lease("from-sandbox-1", "default", _request_timeout=2)
        code, _, err = await cli("sandbox", "resume", "1", "--dir", str(directory))
        assert code == 0, err
        async with coordination_api(kubeconfig, "sandbox-1") as api:
            back = await api.read_namespaced_lease("from-sandbox-1", "default", _request_timeout=10)
            assert back.spec.holder_identity == "test"

        # Killed: status says so (non-zero); started again: same port, same data.
        code, _, err = await cli("sandbox", "kill", "2", "--dir", str(directory))
        assert code == 0, err
        code, out, _ = await cli("-o", "json", "sandbox", "status", "--dir", str(directory))
        assert code != 0
        report = json.loads(out)
        assert [c["up"] for c in report["clusters"]] == [True, False, True]
        assert report["clusters"][1]["apiserver"] == "gone"
        code, _, err = await cli("sandbox", "start", "2", "--dir", str(directory))
        assert code == 0, err
        code, out, _ = await cli("-o", "json", "sandbox", "status", "--dir", str(directory))
        assert code == 0, out
        assert json.loads(out)["all_up"] is True
        assert token not in out
        async with coordination_api(kubeconfig, "sandbox-2") as api:
            kept = await api.read_namespaced_lease("from-sandbox-2", "default", _request_timeout=10)
            assert kept.metadata.name == "from-sandbox-2"

        # Down: every process of the sandbox is gone.
        processes = recorded_processes(directory)
        assert len(processes) == 6
        code, out, err = await cli("sandbox", "down", "--dir", str(directory))
        assert code == 0, err
        assert [pid for pid, ticks in processes if not gone(pid, ticks)] == []
        assert not (directory / "sandbox.json").exists()
        code, _, err = await cli("sandbox", "status", "--dir", str(directory))
        assert code == 2
        assert "no sandbox" in err.lower()
    finally:
        sb.down(directory, grace=2.0)


@pytest.mark.anyio
@pytest.mark.parametrize("count", ["0", "-1"])
async def test_up_needs_at_least_one_cluster(tmp_path: Path, count: str) -> None:
    code, _, err = await cli("sandbox", "up", "--clusters", count, "--dir", str(tmp_path))
    assert code == 2
    assert f"--clusters must be a whole number of at least 1, not {count}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "sandbox.json").exists()


@pytest.mark.anyio
async def test_missing_binaries_name_the_build_script(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(UsageError, match=r"scripts/build-controlplane\.sh"):
        sb.find_binaries(empty)
    code, _, err = await cli(
        "sandbox", "up", "--clusters", "1", "--dir", str(tmp_path / "sb"), env={"COORDINATOR_BIN_DIR": str(empty)}
    )
    assert code == 2
    assert "scripts/build-controlplane.sh" in err
    assert "etcd and kube-apiserver are missing" in err


# --------------------------------------------------------------------------- users and RBAC


@pytest.mark.anyio
async def test_restricted_context_is_forbidden_on_leases(sandbox3: sb.Sandbox) -> None:
    for context in sandbox3.restricted_contexts:
        async with coordination_api(sandbox3.kubeconfig, context) as api:
            for namespace in ("default", sandbox3.restricted_namespace):
                with pytest.raises(ApiException) as denied:
                    await api.create_namespaced_lease(namespace, lease("nope"))
                assert denied.value.status == 403
                with pytest.raises(ApiException) as denied:
                    await api.list_namespaced_lease(namespace)
                assert denied.value.status == 403


@pytest.mark.anyio
async def test_restricted_context_keeps_configmaps_in_its_own_namespace(sandbox3: sb.Sandbox) -> None:
    own = sandbox3.restricted_namespace
    name = "identity-" + os.urandom(3).hex()
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"uid": "x"})
    async with core_api(sandbox3.kubeconfig, sandbox3.restricted_contexts[0]) as api:
        await api.create_namespaced_config_map(own, body)
        assert (await api.read_namespaced_config_map(name, own)).data == {"uid": "x"}
        for call in (
            api.read_namespace("kube-system"),
            api.create_namespaced_config_map("default", body),
            api.read_namespaced_config_map("kube-root-ca.crt", "default"),
            api.delete_namespaced_config_map(name, own),
        ):
            with pytest.raises(ApiException) as denied:
                await call
            assert denied.value.status == 403


@pytest.mark.anyio
async def test_token_context_is_admin_and_the_token_stays_out_of_output(sandbox3: sb.Sandbox) -> None:
    async with coordination_api(sandbox3.kubeconfig, sandbox3.token_contexts[1]) as api:
        await api.create_namespaced_lease("default", lease("by-token-" + os.urandom(3).hex()))
    for args in (("sandbox", "status"), ("-o", "json", "sandbox", "status"), ("-o", "yaml", "sandbox", "status")):
        code, out, err = await cli(*args, "--dir", str(sandbox3.dir))
        assert code == 0, err
        assert sandbox3.token not in out + err
    assert sandbox3.token not in (sandbox3.dir / "sandbox.json").read_text()


@pytest.mark.anyio
async def test_minted_user_has_exactly_what_rbac_grants(sandbox3: sb.Sandbox, namespace: str) -> None:
    alice = sandbox3.mint_kubeconfig("alice", ["release-team"], clusters=[1, 3])
    assert alice.contexts == ("alice@sandbox-1", "alice@sandbox-3")
    async with coordination_api(alice.path, alice.context(3)) as api:
        with pytest.raises(ApiException) as denied:
            await api.create_namespaced_lease(namespace, lease("alice"))
        assert denied.value.status == 403

        rbac = "/apis/rbac.authorization.k8s.io/v1"
        admin = sandbox3.admin(3)
        admin.create(
            f"{rbac}/namespaces/{namespace}/roles",
            {
                "metadata": {"name": "leases"},
                "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get"]}],
            },
        )
        admin.create(
            f"{rbac}/namespaces/{namespace}/rolebindings",
            {
                "metadata": {"name": "release-team-leases"},
                "subjects": [{"kind": "Group", "name": "release-team", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "Role", "name": "leases", "apiGroup": "rbac.authorization.k8s.io"},
            },
        )
        # RBAC changes reach the authorizer through an informer: allow it a moment.
        with anyio.fail_after(10):
            while True:
                try:
                    await api.create_namespaced_lease(namespace, lease("alice", holder="alice"))
                    break
                except ApiException as err:
                    assert err.status == 403
                    await anyio.sleep(0.2)
        assert (await api.read_namespaced_lease("alice", namespace)).spec.holder_identity == "alice"
    # Granted on cluster 3 only: cluster 1 still refuses.
    async with coordination_api(alice.path, alice.context(1)) as api:
        with pytest.raises(ApiException) as denied:
            await api.create_namespaced_lease(namespace, lease("alice"))
        assert denied.value.status == 403


# --------------------------------------------------------------------------- fixtures


@pytest.mark.anyio
async def test_namespace_fixture_exists_on_every_cluster(sandbox3: sb.Sandbox, namespace: str) -> None:
    for context in sandbox3.contexts:
        async with core_api(sandbox3.kubeconfig, context) as api:
            assert (await api.read_namespace(namespace)).status.phase == "Active"


def test_fixture_can_break_clusters(sandbox3: sb.Sandbox) -> None:
    # Left broken on purpose: the next test checks that it was repaired in between.
    sandbox3.pause(2)
    sandbox3.kill(3)
    states = {c.index: (c.apiserver, c.up) for c in sandbox3.status().clusters}
    assert states == {1: ("running", True), 2: ("paused", False), 3: ("gone", False)}


def test_next_test_sees_every_cluster_up(sandbox3: sb.Sandbox) -> None:
    report = sandbox3.status()
    assert report.all_up, report.to_dict()


@pytest.mark.slow
def test_sandbox5_clusters_are_independent(sandbox5: sb.Sandbox) -> None:
    assert sandbox5.n == 5
    assert sandbox5.contexts == [f"sandbox-{i}" for i in range(1, 6)]
    uids = set()
    for index in range(1, 6):
        kube_system = sandbox5.admin(index).get("/api/v1/namespaces/kube-system")
        assert kube_system is not None
        uids.add(kube_system["metadata"]["uid"])
    assert len(uids) == 5, "each cluster must have its own identity"


# --------------------------------------------------------------------------- crash recovery


def _kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_up_refuses_a_running_sandbox_and_recovers_a_crashed_one(tmp_path: Path) -> None:
    directory = tmp_path / "sb"
    messages: list[str] = []
    try:
        first = sb.up(1, directory)
        with pytest.raises(UsageError, match="already running"):
            sb.up(1, directory)

        # Simulate a crash: every server dies and nobody runs `down`.
        old = recorded_processes(directory)
        _kill_all([pid for pid, _ in old])
        deadline = time.monotonic() + 10
        while not all(gone(pid, ticks) for pid, ticks in old) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.status().all_up is False

        again = sb.up(1, directory, on_progress=messages.append)
        assert any("earlier sandbox" in m for m in messages)
        assert again.status().all_up
        assert set(recorded_processes(directory)).isdisjoint(old)
    finally:
        sb.down(directory, grace=2.0)
    assert not (directory / "sandbox.json").exists()


def test_cluster_index_out_of_range_is_a_usage_error(sandbox3: sb.Sandbox) -> None:
    for bad in (0, 4):
        with pytest.raises(UsageError, match="there is no cluster"):
            sandbox3.pause(bad)


@pytest.mark.slow
def test_up_moves_to_fresh_ports_when_its_ports_get_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two listeners take ports between the moment they are chosen and the moment the
    # servers bind them: cluster 1's etcd client port and its kube-apiserver port.
    squatters = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    taken = [s.getsockname()[1] for s in squatters]
    real_pick = process.pick_ports

    def rigged(count: int, *, avoid: Sequence[int] = ()) -> list[int]:
        ports = real_pick(count, avoid=avoid)
        if count == 3:  # the first choice: etcd client, etcd peer, kube-apiserver
            ports[0], ports[2] = taken
        return ports

    monkeypatch.setattr(process, "pick_ports", rigged)
    messages: list[str] = []
    directory = tmp_path / "sb"
    try:
        handle = sb.up(1, directory, on_progress=messages.append)
        cluster = handle.record.clusters[0]
        assert cluster.etcd_client_port not in taken
        assert cluster.apiserver_port not in taken
        assert handle.status().all_up
        assert any("etcd lost its port" in m for m in messages), messages
        assert any("kube-apiserver lost its port" in m for m in messages), messages
    finally:
        for squatter in squatters:
            squatter.close()
        sb.down(directory, grace=2.0)


def test_interrupted_up_leaves_no_process_behind(tmp_path: Path) -> None:
    directory = tmp_path / "sb"

    def interrupt_once_etcd_runs(message: str) -> None:
        if "kube-apiserver" in message:  # every etcd is up by now, no API server yet
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sb.up(2, directory, on_progress=interrupt_once_etcd_runs)
    leftovers = process.find_by_markers([f"={directory.resolve()}/"], ["etcd", "kube-apiserver"])
    assert leftovers == []
    assert not (directory / "sandbox.json").exists()
    assert (directory / "logs" / "cluster-1-etcd.log").exists(), "logs are kept for diagnosis"
