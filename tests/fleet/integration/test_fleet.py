"""The fleet view (`lock status` without a deployment): every deployment's lock over the
connected clusters, from one LIST of leases per cluster, whatever the number of deployments."""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet
from coordinator.kube.client import KubeClient, KubeError
from coordinator.ops.admin import connect_cluster, create_deployment
from coordinator.ops.fleet import ALL_LEASES, FleetWatch, survey

pytestmark = pytest.mark.integration


def _create(config: Path, deployments: list[tuple[str, str, list[str]]], *, connect: int | None = None) -> None:
    store = ConfigStore(config)

    async def go() -> None:
        if connect is not None:
            for i in range(1, connect + 1):
                await connect_cluster(store, f"c{i}", f"sandbox-{i}", _kubeconfig[0])
        cs = ClusterSet(store.load(), timeout=5)
        try:
            for name, namespace, members in deployments:
                await create_deployment(store, cs, name, namespace, members, "configmap", None)
        finally:
            await cs.aclose()

    anyio.run(go)


_kubeconfig: list[str] = [""]


@pytest.fixture
def fleet20(dep5: Any, tmp_path: Path) -> Any:
    """20 deployments known here over the 5 clusters (in 3 namespaces, some on 3 members),
    3 of them locked, and one deployment made by another machine (not imported here)."""
    _kubeconfig[0] = dep5.kubeconfig
    spaces = [dep5.namespace, "t-" + secrets.token_hex(4), "t-" + secrets.token_hex(4)]
    every = dep5.clusters
    more = [
        (f"app{i:02d}", spaces[i % 3], every if i % 2 else ["c1", "c2", "c3"] if i % 4 else ["c3", "c4", "c5"])
        for i in range(1, 20)
    ]
    _create(dep5.config, more)
    dep5.spaces = spaces

    async def lock_some() -> None:
        # A loaded machine can make one cluster miss a 3 s timeout: wait for each lock,
        # and say so here rather than as a wrong status later.
        async with dep5.api(timeout=10) as c:
            for name, who, why in (("web", "alice", "release 1.2"), ("app01", "bob", "hotfix"), ("app02", "carol", "")):
                got = await c.acquire(name, ttl=120, wait=30, holder=who, reason=why)
                assert got.acquired, (name, got.results)

    anyio.run(lock_some)
    # Another machine's deployment: on the clusters, not in this machine's config.
    _create(tmp_path / "other" / "config.yaml", [("stranger", spaces[1], ["c2", "c3", "c4"])], connect=5)
    return dep5


def _ours(doc: dict[str, Any], env: Any) -> dict[str, dict[str, Any]]:
    # The sandbox is shared by the session: other tests' deployments are there too.
    return {d["deployment"]: d for d in doc["deployments"] if d["namespace"] in env.spaces}


def test_fleet_of_20_deployments_is_one_list_per_cluster(fleet20: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = fleet20
    sent: Counter[tuple[str, str, str]] = Counter()
    original = KubeClient.request

    async def counting(self: KubeClient, method: str, path: str, **kw: Any) -> Any:
        sent[(self.endpoint.name, method, path)] += 1
        return await original(self, method, path, **kw)

    monkeypatch.setattr(KubeClient, "request", counting)

    async def go() -> Any:
        async with env.api() as c:
            return await survey(c.config, c.clusters)

    fleet = anyio.run(go)
    lists = {k: n for k, n in sent.items() if k[1] == "GET" and k[2] == ALL_LEASES}
    assert lists == {(c, "GET", ALL_LEASES): 1 for c in env.clusters}, sent
    # Nothing per deployment: besides the LIST, only the identity check (one per cluster).
    assert sum(sent.values()) <= 2 * len(env.clusters), sent
    assert not [k for k in sent if "/leases/" in k[2] or ("/configmaps/" in k[2] and "identity" not in k[2])], sent

    names = {e.deployment for e in fleet.deployments if e.namespace in env.spaces}
    assert len(names - {"stranger"}) == 20 and "stranger" in names
    web = next(e for e in fleet.deployments if e.deployment == "web" and e.namespace == env.namespace)
    assert web.status == "held" and web.holder == "alice" and web.reason == "release 1.2"
    assert web.unseen == [] and web.expires_in_s is not None and web.expires_in_s > 0


def test_fleet_cli_json_and_text(fleet20: Any) -> None:
    env = fleet20
    proc = env.cli("lock", "status", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    ours = _ours(doc, env)
    assert len(ours) == 21
    web, bob, carol = ours["web"], ours["app01"], ours["app02"]
    assert (web["status"], web["holder"], web["reason"]) == ("held", "alice", "release 1.2")
    assert isinstance(web["pid"], int) and web["host"] and web["since"].endswith("Z") and web["lock_id"]
    assert (bob["status"], bob["holder"]) == ("held", "bob") and carol["holder"] == "carol"
    assert carol["members"] == ["c1", "c2", "c3"] and carol["quorum"] == 2
    assert all(ours[f"app{i:02d}"]["status"] == "free" for i in range(3, 20))
    assert all(d["imported"] and d["import_command"] is None for n, d in ours.items() if n != "stranger")
    stranger = ours["stranger"]
    assert stranger["imported"] is False and stranger["status"] == "free"
    # Its members come from the member set stored on its leases, by identity.
    assert stranger["members"] == ["c2", "c3", "c4"]
    assert stranger["import_command"] == f"coordinator deployment import stranger --cluster c2 -n {env.spaces[1]}"
    assert doc["unseen_clusters"] == []

    same = env.cli("lock", "status", "--all", "-o", "json")
    assert same.returncode == 0 and len(_ours(json.loads(same.stdout), env)) == 21

    text = env.cli("lock", "status")
    assert text.returncode == 0, text.stderr
    # The sandbox is shared by the session: other tests have a "web" in other namespaces.
    line = next(x for x in text.stdout.splitlines() if x.split()[:2] == ["web", env.namespace])
    assert "held" in line and "alice" in line and "release 1.2" in line
    assert "stranger *" in text.stdout
    assert f"not imported: `coordinator deployment import stranger --cluster c2 -n {env.spaces[1]}`" in text.stdout

    both = env.cli("lock", "status", "web", "--all")
    assert both.returncode == 2


def test_fleet_names_the_clusters_it_could_not_see(fleet20: Any) -> None:
    env = fleet20
    env.sandbox.pause(4)
    env.sandbox.pause(5)
    proc = env.cli("--timeout", "2s", "lock", "status", "-o", "json")
    # Deployments a holder may hold with the unseen members are unknown: exit 4, named.
    assert proc.returncode == 4, proc.stderr
    assert "Who holds the lock of app04 (" in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["unseen_clusters"] == ["c4", "c5"]
    ours = _ours(doc, env)
    # web: 3 of 5 still seen, and alice holds all three: held.
    assert ours["web"]["status"] == "held" and ours["web"]["unseen"] == ["c4", "c5"]
    # on c3, c4, c5: only one member seen, so nobody is said to hold it or not.
    app04 = ours["app04"]
    assert app04["members"] == ["c3", "c4", "c5"] and app04["status"] == "unknown"
    rows = {r["name"]: r for r in app04["clusters"]}
    assert rows["c4"]["status"] == "unseen" and "unreachable" in rows["c4"]["detail"]

    text = env.cli("--timeout", "2s", "lock", "status")
    assert "Could not list: c4 (unreachable" in text.stdout


# --- --watch: one LIST, then one watch per cluster --------------------------------------------


class _Traffic:
    """Requests and watches sent by the clients of one ClusterSet, counted per cluster."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: Counter[tuple[str, str, str]] = Counter()
        self.watches: Counter[str] = Counter()
        self.clients: set[int] = set()  # ids of the clients counted (the watcher's own)
        self.faults: dict[str, list[str]] = {}  # cluster -> faults for its next watches
        request, watch = KubeClient.request, KubeClient.watch
        traffic = self

        async def counting(self: KubeClient, method: str, path: str, **kw: Any) -> Any:
            if id(self) in traffic.clients:
                traffic.sent[(self.endpoint.name, method, path)] += 1
            return await request(self, method, path, **kw)

        async def watching(self: KubeClient, path: str, **kw: Any) -> Any:
            name = self.endpoint.name
            if id(self) in traffic.clients:
                traffic.watches[name] += 1
            fault = traffic.faults.get(name, [None]).pop(0) if traffic.faults.get(name) else None
            if fault == "broken":
                raise KubeError("unreachable", "watch broke: connection reset (injected)")
            if fault == "gone-event":
                # how the API server refuses a resourceVersion compacted away: a 410 Status event
                status = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}
                yield {"type": "ERROR", "object": {**status, "message": "too old resource version"}}
                return
            if fault == "gone-http":  # the same, as the response's status
                raise KubeError("error", "HTTP 410: too old resource version", status=410)
            async for event in watch(self, path, **kw):
                yield event

        monkeypatch.setattr(KubeClient, "request", counting)
        monkeypatch.setattr(KubeClient, "watch", watching)

    def lists(self) -> dict[str, int]:
        return {k[0]: n for k, n in self.sent.items() if k[1] == "GET" and k[2] == ALL_LEASES}


async def _until(watch: FleetWatch, ok: Callable[[Any], bool], what: str) -> Any:
    """The fleet as soon as ``ok`` says so; waits on the watches' events (a deadline of
    60 s only guards the test against hanging)."""
    with anyio.fail_after(60):
        while True:
            changed = watch.changed
            fleet = watch.fleet()
            if ok(fleet):
                return fleet
            await changed.wait()
    raise AssertionError(what)  # pragma: no cover


def _entry(fleet: Any, name: str, env: Any) -> Any:
    # The sandbox is shared by the session: other tests' deployments are there too.
    return next(e for e in fleet.deployments if e.deployment == name and e.namespace in env.spaces)


def _watch_scenario(env: Any, traffic: _Traffic, lists: dict[str, int] | None = None) -> Any:
    """``lists``: LISTs per cluster to wait for before the watch stops (a faulted watch
    lists again on its own time; on a loaded machine after the last change shows)."""

    async def go() -> Any:
        async with env.api() as watcher, env.api() as actor:
            for name in env.clusters:
                traffic.clients.add(id(watcher.clusters.client(name)))
            watch = FleetWatch(watcher.config, watcher.clusters, watch_s=600)
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch.run)
                await watch.ready.wait()
                first = watch.fleet()
                assert _entry(first, "web", env).holder == "alice" and first.unseen_clusters == []
                # Changes made by another client arrive as watch events.
                await actor.release("web", None, "alice")
                await _until(watch, lambda f: _entry(f, "web", env).status == "free", "web released")
                taken = await actor.acquire("app05", ttl=120, holder="dave", reason="canary")
                fleet = await _until(watch, lambda f: _entry(f, "app05", env).holder == "dave", "app05 taken")
                if lists is not None:
                    with anyio.move_on_after(20):
                        for _ in range(400):  # the relists counted by the test below
                            if traffic.lists() == lists:
                                break
                            await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
            return taken, fleet

    return anyio.run(go)


def test_fleet_watch_is_one_list_and_one_watch_per_cluster(fleet20: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = fleet20
    traffic = _Traffic(monkeypatch)
    taken, fleet = _watch_scenario(env, traffic)
    app05 = _entry(fleet, "app05", env)
    assert (app05.status, app05.lock_id, app05.reason) == ("held", taken.lock_id, "canary")
    assert app05.expires_in_s is not None and app05.expires_in_s > 0  # judged by the server's time
    assert _entry(fleet, "web", env).status == "free" and _entry(fleet, "app01", env).holder == "bob"
    assert traffic.lists() == {c: 1 for c in env.clusters}, traffic.sent
    assert traffic.watches == {c: 1 for c in env.clusters}, traffic.watches
    # Nothing per deployment: besides the LIST, only the identity check (one per cluster).
    assert sum(traffic.sent.values()) <= 2 * len(env.clusters), traffic.sent


def test_fleet_watch_lists_again_after_410_gone_or_a_broken_watch(
    fleet20: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = fleet20
    traffic = _Traffic(monkeypatch)
    traffic.faults = {"c1": ["gone-event"], "c2": ["broken"], "c3": ["gone-http"]}
    taken, fleet = _watch_scenario(env, traffic, lists={"c1": 2, "c2": 2, "c3": 2, "c4": 1, "c5": 1})
    assert _entry(fleet, "app05", env).lock_id == taken.lock_id and _entry(fleet, "web", env).status == "free"
    assert fleet.unseen_clusters == []
    # c1's and c3's watches were answered 410 Gone, c2's broke: each listed once more, then
    # watched again from the new LIST; the others were never listed again.
    assert traffic.lists() == {"c1": 2, "c2": 2, "c3": 2, "c4": 1, "c5": 1}, traffic.sent
    assert traffic.watches == {"c1": 2, "c2": 2, "c3": 2, "c4": 1, "c5": 1}, traffic.watches


def test_fleet_watch_cli_prints_changes_and_ends_on_sigterm(fleet20: Any) -> None:
    import signal
    import subprocess

    env = fleet20
    proc = env.popen("lock", "status", "--all", "--watch", "-o", "json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert _ours(first, env)["web"]["holder"] == "alice"
        released = env.cli("lock", "release", "web", "--holder", "alice")
        assert released.returncode == 0, released.stderr
        while True:  # rounds are printed when something changes; the release is one
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            if _ours(json.loads(line), env)["web"]["status"] == "free":
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fleet_watch_marks_a_paused_cluster_unseen_within_about_the_timeout(dep3: Any) -> None:
    """A paused API server keeps its watch connection open and says nothing: the watch
    notices within about --timeout (twice it at most, plus the machine's delay), as the
    one-shot view does, not only when the watch request's minute runs out."""
    import subprocess
    import threading
    import time

    env = dep3
    proc = env.popen(
        "--timeout",
        "2s",
        "lock",
        "status",
        "--all",
        "--watch",
        "-o",
        "json",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    lines: list[tuple[float, dict[str, Any]]] = []
    arrived = threading.Condition()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with arrived:
                lines.append((time.monotonic(), json.loads(line)))
                arrived.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def first(
        ok: Callable[[dict[str, Any]], bool], limit: float, after: float = 0.0
    ) -> tuple[float, dict[str, Any]] | None:
        """The first round after ``after`` that ``ok`` accepts, and when it arrived (None:
        none within ``limit``)."""
        end = time.monotonic() + limit
        with arrived:
            while True:
                hit = next(((t, doc) for t, doc in lines if t > after and ok(doc)), None)
                if hit is not None or time.monotonic() >= end:
                    return hit
                arrived.wait(timeout=max(0.1, end - time.monotonic()))

    try:
        assert first(lambda d: d["unseen_clusters"] == [], 60) is not None, proc.stderr
        # The watches are open (a round is printed after the first LIST); let them settle.
        time.sleep(3)
        paused_at = time.monotonic()
        env.sandbox.pause(2)
        # 2 s of --timeout: unseen within 2 x 2 s and the machine's delay; 30 s is generous
        # on a loaded machine and far below the minute a watch request runs.
        unseen = first(lambda d: d["unseen_clusters"] == ["c2"], 30, after=paused_at)
        assert unseen is not None, f"c2 still shown as seen 30 s after its API server was paused: {lines[-1][1]}"
        seen_at, doc = unseen
        web = next(d for d in doc["deployments"] if (d["deployment"], d["namespace"]) == ("web", env.namespace))
        assert web["unseen"] == ["c2"] and web["status"] == "free", web
        env.sandbox.resume(2)
        back = first(lambda d: d["unseen_clusters"] == [], 60, after=seen_at)
        assert back is not None, f"c2 not seen again after resuming: {lines[-1][1]}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
