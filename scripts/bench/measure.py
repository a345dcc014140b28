"""How the rows measure: operations in-process (fresh clients, or an open Coordinator),
interleaved; whole processes, with their peak RSS and CPU time.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.rig import HOLDER, Rig
from coordinator.ops.api import Coordinator

TIME_BIN = shutil.which("time", path="/usr/bin:/bin")


async def parallel_acquire_on(c: Coordinator, dep: str) -> float:
    """One ``acquire`` through the API (the fan-out); returns its latency. The lock is
    released afterwards, outside the timed part."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    res = await c.acquire(dep, ttl=60, holder=HOLDER, reason="bench")
    elapsed = time.perf_counter() - t0
    LAST_CPU[0] = time.process_time() - cpu0
    await c.release(dep, res.lock_id)
    return elapsed


AcquireOn = Callable[[Coordinator, str], Awaitable[float]]


def cold(r: Rig, fn: AcquireOn, dep: str) -> Callable[[], float]:
    """As one command does it: a fresh Coordinator (own clients, identity checks, new
    TLS connections), in its own event loop."""

    async def go() -> float:
        async with r.coordinator(5.0) as c:
            return await fn(c, dep)

    return lambda: anyio.run(go)


def warm_series(r: Rig, variants: dict[str, tuple[AcquireOn, str]], reps: int, warmup: int) -> dict[str, list[float]]:
    """As a long-lived library user does it: one open Coordinator per deployment
    (identities proven, connections pooled), variants interleaved in one event loop."""

    async def go() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {k: [] for k in variants}
        async with contextlib.AsyncExitStack() as stack:
            coords = {dep: await stack.enter_async_context(r.coordinator(5.0)) for _, dep in variants.values()}
            names = list(variants)
            for i in range(warmup + reps):
                random.shuffle(names)
                for k in names:
                    fn, dep = variants[k]
                    t = await fn(coords[dep], dep)
                    if i >= warmup:
                        out[k].append(t)
        return out

    return anyio.run(go)


# CPU time (this process) of the last timed operation, set by the operations above.
LAST_CPU = [math.nan]


def interleaved(
    variants: dict[str, Callable[[], float]], reps: int, warmup: int, cpu: dict[str, list[float]] | None = None
) -> dict[str, list[float]]:
    """Run every variant ``warmup`` + ``reps`` times, round robin in a shuffled order each
    round, so that a noisy neighbour hits all variants alike. Wall times are returned;
    CPU times go to ``cpu`` if given."""
    out: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for i in range(warmup + reps):
        random.shuffle(names)
        for k in names:
            LAST_CPU[0] = math.nan
            t = variants[k]()
            if i >= warmup:
                out[k].append(t)
                if cpu is not None:
                    cpu.setdefault(k, []).append(LAST_CPU[0])
    return out


@dataclass
class ProcessRun:
    wall: float  # seconds
    code: int
    rss_kib: int  # peak resident set
    cpu: float  # user + system seconds
    stdout: str
    stderr: str


def run_cli(r: Rig, *args: str, timeout: float = 120) -> ProcessRun:
    """Run ``coordinator ARGS`` as a whole process."""
    return run_process([sys.executable, "-m", "coordinator", *args], r.environ(), timeout=timeout)


def run_process(cmd: list[str], env: dict[str, str], *, timeout: float = 120) -> ProcessRun:
    """Run ``cmd`` to the end, measuring wall time, peak RSS and CPU time.

    Peak RSS and CPU come from GNU time, a small C parent: a child forked from this
    (large) Python process would report this process's RSS as its own high-water mark.
    """
    with tempfile.NamedTemporaryFile(prefix="rss-", suffix=".txt") as usage:
        timed = [TIME_BIN, "-q", "-f", "%M %U %S", "-o", usage.name, *cmd] if TIME_BIN else cmd
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(timed, env=env, capture_output=True, cwd="/", timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"{cmd} did not finish in {timeout:g}s") from err
        wall = time.perf_counter() - t0
        fields = (Path(usage.name).read_text().strip().splitlines() or [""])[-1].split()
    try:
        rss, cpu = int(fields[0]), float(fields[1]) + float(fields[2])
    except (IndexError, ValueError):
        rss, cpu = -1, math.nan
    return ProcessRun(
        wall, proc.returncode, rss, cpu, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    )
