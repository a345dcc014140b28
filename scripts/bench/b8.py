"""B8: the fleet view, `lock status --all`, vs `lock status` of one deployment; its requests counted."""

from __future__ import annotations

import json
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

import anyio

from bench.measure import (
    ProcessRun,
    run_process,
)
from bench.report import TARGETS, Report, Row
from bench.rig import Rig, fleet_deployments
from bench.stats import median, summary

# Runs a coordinator command with every request to the API servers counted (method,
# path, cluster): the counts go, as JSON, to the file named by BENCH_REQUEST_LOG.
COUNTING_MAIN = r"""
import atexit, json, os, sys
from coordinator.kube import client as kc
seen = []
_send, _watch = kc.KubeClient._send, kc.KubeClient.watch
async def send(self, method, path, *args, **kwargs):
    seen.append([self.endpoint.name, method, path])
    return await _send(self, method, path, *args, **kwargs)
def watch(self, path, **kwargs):
    seen.append([self.endpoint.name, "WATCH", path])
    return _watch(self, path, **kwargs)
kc.KubeClient._send, kc.KubeClient.watch = send, watch
def dump():
    with open(os.environ["BENCH_REQUEST_LOG"], "w") as f:
        json.dump(seen, f)
atexit.register(dump)
from coordinator.cli import main
sys.argv = ["coordinator", *sys.argv[1:]]
main()
"""


def counted_requests(r: Rig, *args: str, env: dict[str, str] | None = None) -> tuple[ProcessRun, list[list[str]]]:
    """Run ``coordinator ARGS`` with its requests counted; returns the run and the
    requests as [cluster, method, path]."""
    with tempfile.NamedTemporaryFile(prefix="requests-", suffix=".json") as log:
        run = run_process(
            [sys.executable, "-c", COUNTING_MAIN, *args], (env or r.environ()) | {"BENCH_REQUEST_LOG": log.name}
        )
        text = Path(log.name).read_text()
    return run, json.loads(text) if text else []


FLEET_LIST = "/apis/coordination.k8s.io/v1/leases"  # leases across namespaces


def bench_b8(r: Rig, rep: Report, *, deployments: int, clusters: int, reps: int, warmup: int) -> None:
    print(f"B8: `lock status --all` over {deployments} deployments x {clusters} clusters vs `lock status` of one")
    deps = fleet_deployments(r, deployments, clusters)
    r.clear()
    # a few of them held, so that the view has holders to show
    held: list[tuple[str, str]] = []

    async def hold() -> None:
        async with r.coordinator(10.0) as c:
            for dep in deps[: max(1, deployments // 4)]:
                res = await c.acquire(dep, ttl=600, holder="bench-fleet", reason="b8")
                held.append((dep, res.lock_id))

    anyio.run(hold)
    try:
        env = r.environ()
        cmds = {
            "all": [sys.executable, "-m", "coordinator", "lock", "status", "--all", "-o", "json"],
            "one": [sys.executable, "-m", "coordinator", "lock", "status", deps[0], "-o", "json"],
        }
        runs: dict[str, list[ProcessRun]] = {k: [] for k in cmds}
        order = list(cmds)
        for i in range(warmup + reps):
            random.shuffle(order)
            for k in order:
                run = run_process(cmds[k], env)
                if run.code != 0:
                    raise RuntimeError(f"{cmds[k]} exited {run.code}: {run.stderr}")
                if i >= warmup:
                    runs[k].append(run)
        doc = json.loads(runs["all"][-1].stdout)
        shown = {d["deployment"] for d in doc.get("deployments", [])}
        missing = [d for d in deps if d not in shown]
        if missing:
            raise RuntimeError(f"the fleet view did not show {missing}")
        _, requests = counted_requests(r, "lock", "status", "--all", "-o", "json")
        _, requests_one = counted_requests(r, "lock", "status", deps[0], "-o", "json")
    finally:

        async def release() -> None:
            async with r.coordinator(10.0) as c:
                for dep, lock_id in held:
                    await c.release(dep, lock_id)

        anyio.run(release)
    lists = Counter(
        c for c, m, p in requests if p.startswith("/apis/coordination.k8s.io/v1/leases") and m in ("GET", "WATCH")
    )
    per_cluster = Counter(c for c, _, _ in requests)
    names = r.names[:clusters]
    wa, wo = median([x.wall for x in runs["all"]]), median([x.wall for x in runs["one"]])
    ca, co = median([x.cpu for x in runs["all"]]), median([x.cpu for x in runs["one"]])
    rep.raw["B8"] = {
        k: {"wall": [x.wall for x in v], "cpu": [x.cpu for x in v], **summary([x.wall for x in v])}
        for k, v in runs.items()
    }
    rep.raw["B8"]["requests"] = {"all": requests, "one": requests_one, "deployments": len(shown)}
    rep.add(
        Row(
            "B8a",
            f"`lock status --all` ({len(shown)} deployments x {clusters} clusters) wall / `lock status` of one",
            f"{wa / wo:.2f} ({wa:.2f} s vs {wo:.2f} s; CPU {ca:.2f} s vs {co:.2f} s)",
            f"one deployment {wo:.2f} s",
            wa / wo,
            f"<= {TARGETS['B8']:g}",
            wa / wo <= TARGETS["B8"],
        )
    )
    rep.add(
        Row(
            "B8b",
            "fleet view: LISTs (or watches) of leases per cluster; all requests per cluster",
            f"{'/'.join(str(lists[n]) for n in names)}; {'/'.join(str(per_cluster[n]) for n in names)} "
            f"(one deployment: {len(requests_one) / clusters:.0f} per cluster)",
            "",
            float(max(lists[n] for n in names)),
            "exactly 1 LIST per cluster",
            all(lists[n] == 1 for n in names),
        )
    )
