"""B2: acquire over 5 clusters with k black-holed vs healthy."""

from __future__ import annotations

import json
import random
import time

import anyio

from bench.measure import (
    ProcessRun,
    run_cli,
)
from bench.report import Report, Row
from bench.rig import HOLDER, LATENCY_MS, Rig
from bench.stats import median, ms
from coordinator.errors import LockHeldError, NoQuorumError


async def acquire_expect(r: Rig, dep: str, timeout: float, expect_fail: bool) -> tuple[float, float, str]:
    """(acquire call latency, whole command lifetime, outcome); released afterwards."""
    t_open = time.perf_counter()
    c = r.coordinator(timeout)
    outcome = "acquired"
    async with c:
        t0 = time.perf_counter()
        try:
            res = await c.acquire(dep, ttl=60, holder=HOLDER, reason="bench")
        except NoQuorumError:
            outcome = "no-quorum"
            elapsed = time.perf_counter() - t0
        except LockHeldError:
            outcome = "held"
            elapsed = time.perf_counter() - t0
        else:
            elapsed = time.perf_counter() - t0
            # release where it can reach (black-holed clusters never got the lease)
            with anyio.move_on_after(timeout + 1):
                await c.release(dep, res.lock_id)
    lifetime = time.perf_counter() - t_open
    if expect_fail != (outcome != "acquired"):
        raise RuntimeError(f"acquire outcome {outcome!r} was not expected")
    return elapsed, lifetime, outcome


def bench_b2(r: Rig, rep: Report, *, reps: int, warmup: int, fail_reps: int, cli_reps: int) -> None:
    timeout = 5.0
    print(f"B2: acquire over 5 clusters at +{LATENCY_MS} ms with k black-holed (per-cluster timeout {timeout:g}s)")
    dep = r.deployment("b2", r.names[:5])
    layouts: dict[str, list[int]] = {"healthy": [], "k1": [5], "k2": [4, 5]}

    def arrange(k: str) -> None:
        r.clear()
        r.latency(LATENCY_MS)
        r.blackhole(layouts[k])

    # the API: the acquire call itself, and the whole life of one Coordinator around it
    results: dict[str, list[tuple[float, float, str]]] = {k: [] for k in layouts}
    order = list(layouts)
    for i in range(warmup + reps):
        random.shuffle(order)
        for k in order:
            arrange(k)
            res = anyio.run(lambda: acquire_expect(r, dep, timeout, False))
            if i >= warmup:
                results[k].append(res)
    arrange("healthy")
    r.blackhole([3, 4, 5])
    results["k3"] = [anyio.run(lambda: acquire_expect(r, dep, timeout, True)) for _ in range(fail_reps)]

    # the command line: `lock acquire` as a whole process, released again in-process
    cli: dict[str, list[ProcessRun]] = {k: [] for k in (*layouts, "k3")}
    for _ in range(cli_reps):
        random.shuffle(order)
        for k in [*order, "k3"]:
            arrange(k if k != "k3" else "healthy")
            if k == "k3":
                r.blackhole([3, 4, 5])
            run = run_cli(r, "--timeout", f"{timeout:g}s", "-o", "json", "lock", "acquire", dep, "--ttl", "60s")
            cli[k].append(run)
            r.clear()
            if run.code == 0:
                lock_id = json.loads(run.stdout)["lock_id"]
                anyio.run(lambda lid=lock_id: release_in_process(r, dep, lid))  # type: ignore[misc]
    r.clear()
    rep.raw["B2"] = {
        k: {"call": [x[0] for x in v], "lifetime": [x[1] for x in v], "outcomes": [x[2] for x in v]}
        for k, v in results.items()
    } | {f"cli-{k}": [{"wall": x.wall, "code": x.code, "cpu": x.cpu} for x in v] for k, v in cli.items()}
    healthy = median([x[0] for x in results["healthy"]])
    for k in ("k1", "k2"):
        v = median([x[0] for x in results[k]])
        rep.add(
            Row(
                f"B2.{k}",
                f"acquire call with {k[1]} of 5 black-holed / healthy (API: returns at quorum)",
                f"{v / healthy:.2f} ({ms(v)} vs {ms(healthy)})",
                f"healthy {ms(healthy)}",
                v / healthy,
                "<= 1.5",
                v / healthy <= 1.5,
            )
        )
    k3 = max(x[0] for x in results["k3"])
    rep.add(
        Row(
            "B2.k3",
            "acquire call with 3 of 5 black-holed: NoQuorumError after (slowest run)",
            f"{k3:.2f} s ({', '.join(x[2] for x in results['k3'])})",
            f"per-cluster timeout {timeout:g} s",
            k3,
            f"<= {timeout * 1.1:.1f} s, no quorum",
            k3 <= timeout * 1.1 and all(x[2] == "no-quorum" for x in results["k3"]),
        )
    )
    life_h = median([x[1] for x in results["healthy"]])
    for k in ("k1", "k2"):
        life = median([x[1] for x in results[k]])
        rep.add(
            Row(
                f"B2.{k}life",
                f"{k[1]} of 5 black-holed: whole Coordinator life (open, acquire, release, close) / healthy",
                f"{life / life_h:.2f} ({ms(life)} vs {ms(life_h)})",
                f"healthy {ms(life_h)}",
                life / life_h,
                "-",
                None,
            )
        )
    w_h = median([x.wall for x in cli["healthy"]])
    for k in ("k1", "k2"):
        w = median([x.wall for x in cli[k]])
        codes = sorted({x.code for x in cli[k]})
        rep.add(
            Row(
                f"B2.{k}cli",
                f"`lock acquire` process wall with {k[1]} of 5 black-holed / healthy (exit {codes})",
                f"{w / w_h:.2f} ({w:.2f} s vs {w_h:.2f} s)",
                f"healthy {w_h:.2f} s",
                w / w_h,
                "<= 1.5",
                w / w_h <= 1.5 and codes == [0],
            )
        )
    codes = [x.code for x in cli["k3"]]
    w3 = median([x.wall for x in cli["k3"]])
    rep.add(
        Row(
            "B2.k3cli",
            "`lock acquire` with 3 of 5 black-holed: exit code (process wall; healthy process wall)",
            f"exit {codes} ({w3:.2f} s; healthy {w_h:.2f} s)",
            "",
            float(codes[0]),
            "exit 4",
            all(c == 4 for c in codes),
        )
    )


async def release_in_process(r: Rig, dep: str, lock_id: str) -> None:
    async with r.coordinator(5.0) as c:
        await c.release(dep, lock_id)
