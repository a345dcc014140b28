#!/usr/bin/env python3
"""Benchmarks of coordinator against local control planes, each figure a ratio against
a baseline measured side by side in the same run.

The harness starts its own sandbox (etcd + kube-apiserver per cluster) in a temporary
directory, puts one toxiproxy proxy in front of each API server, and connects the
clusters through the proxies, so latency and black holes can be injected per cluster.
Everything it started is stopped at the end, also on Ctrl-C or SIGTERM.

    python scripts/bench.py --quick
    python scripts/bench.py --json bench-results/full.json --plot bench-results/bench.png

Figures (see the table printed at the end; each row is PASS or FAIL, or "info"):

B1  lock acquire over N = 1, 3, 5, 7 clusters at +100 ms, parallel fan-out vs the same
    per-cluster steps done cluster after cluster (a sequential loop, as naive scripts
    and Redlock's reference algorithm do).
B2  acquire over 5 clusters with k black-holed (connections accepted, never answered)
    vs healthy acquire over 5.
B3  handoff: holder releases -> a waiting contender holds the lock, vs a waiter that
    polls every 2 s.
B4  `coordinator lock status` over 5 clusters as a whole process vs
    `python -c "import kubernetes_asyncio.client"`: wall time and peak RSS.
B5  `state set` / `state get` over 5 clusters at +100 ms vs over 1 cluster.
B6  8 contender processes cycling acquire/release on 3 clusters: cycles/s, fairness.
B7  state document size 1 KiB -> 512 KiB: write and read latency growth.

Round two (targets in TARGETS; ``--target ID=VALUE`` overrides one):

B3' B3 with 100 handoffs: median and p99.
B4' B4 with tighter targets (1.3x the import, 100 MB).
B8  fleet view: `lock status --all` over 20 deployments x 5 clusters vs `lock status` of
    one deployment; the fleet view's requests counted per cluster.
B9  acquire over 9 vs 3 clusters at +50 ms per cluster, fresh clients; client CPU per
    extra cluster.
B10 TCP connections per cluster opened by `lock acquire`, `state set`, `lock status`,
    counted at a small forwarder in front of each cluster's proxy.
B11 `lock status --all --watch` over 20 x 5 while a lock changes hands every 2 s: RSS
    growth after the first minute, and how long after each change it is shown.

Protocol figures use the ``coordinator`` API in-process, one fresh ``Coordinator`` per
operation (as one CLI command has: own clients, own identity checks, cold connections);
CLI figures run whole processes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import itertools
import json
import math
import os
import platform
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))  # the fault harness's toxiproxy controller: tests/faults

from coordinator import quorum  # noqa: E402
from coordinator.admin import connect_cluster, create_deployment  # noqa: E402
from coordinator.api import Coordinator  # noqa: E402
from coordinator.clusters import ClusterSet  # noqa: E402
from coordinator.config import ConfigStore  # noqa: E402
from coordinator.errors import LockHeldError, NoQuorumError  # noqa: E402
from coordinator.lock import new_lock_id  # noqa: E402
from coordinator.models import LocalConfig  # noqa: E402

LATENCY_MS = 100
# Targets of the rows added in round two (``--target ID=VALUE`` overrides one, e.g. to
# see a row fail): B10 connections per cluster; B8, B9 ratios; B3' median and p99 in
# seconds; B4' ratio and peak RSS in MB; B11 RSS growth in MB and worst lag in seconds.
TARGETS: dict[str, float] = {
    "B10": 1,
    "B8": 1.5,
    "B9": 1.3,
    "B3median": 0.100,
    "B3p99": 0.250,
    "B4": 1.3,
    "B4rss": 100,
    "B11rss": 5,
    "B11lag": 0.5,
}
TIME_BIN = shutil.which("time", path="/usr/bin:/bin")
HOLDER = "bench@local"

# ---------------------------------------------------------------------------- statistics


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile, ``p`` in [0, 100]."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "median": median(xs),
        "p25": percentile(xs, 25),
        "p75": percentile(xs, 75),
        "p95": percentile(xs, 95),
        "min": min(xs) if xs else math.nan,
        "max": max(xs) if xs else math.nan,
    }


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


# ---------------------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the report: a target (PASS/FAIL) or a figure for information."""

    id: str
    what: str
    measured: str
    baseline: str
    value: float | None
    target: str
    passed: bool | None  # None: information only

    @property
    def verdict(self) -> str:
        return "info" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  {row.id:<6} {row.verdict:<4} {row.what}: {row.measured} (target {row.target})", flush=True)


# ---------------------------------------------------------------------------- the rig


class Interrupted(BaseException):
    """SIGTERM, turned into an exception so that clean-up runs."""


@dataclass
class Rig:
    """A sandbox of n clusters, each behind a toxiproxy proxy, connected as c1..cN."""

    root: Path
    sandbox: Any
    toxiproxy: Any
    proxies: list[Any]
    kubeconfig: Path
    config_path: Path
    names: list[str]
    config: LocalConfig | None = None
    cache: dict[str, Any] = field(default_factory=dict)  # what rows share (B8's deployments)

    # -- faults

    def clear(self) -> None:
        self.toxiproxy.reset()

    def latency(self, ms_: int, indices: Sequence[int] | None = None) -> None:
        """+``ms_`` on every answer (server -> client) of the given clusters (1-based)."""
        for i in indices or range(1, len(self.proxies) + 1):
            self.proxies[i - 1].add_latency(ms_, name="bench_latency")

    def blackhole(self, indices: Sequence[int]) -> None:
        """Connections to these clusters are accepted and never answered (nor closed)."""
        for i in indices:
            # upstream: requests never reach the server, so nothing lands there either
            self.proxies[i - 1].add_timeout(0, stream="upstream", name="bench_blackhole")

    # -- coordinator objects

    def load(self) -> LocalConfig:
        if self.config is None:
            self.config = ConfigStore(self.config_path).load()
        return self.config

    def coordinator(self, timeout: float = 5.0) -> Coordinator:
        self.config = None  # deployments may have been added
        return Coordinator(self.load(), store=None, timeout=timeout)

    def deployment(self, name: str, members: Sequence[str]) -> str:
        namespace = f"bench-{name}-{secrets.token_hex(3)}"
        store = ConfigStore(self.config_path)

        async def go() -> None:
            cs = ClusterSet(store.load(), timeout=10)
            try:
                await create_deployment(store, cs, name, namespace, list(members), "configmap")
            finally:
                await cs.aclose()

        anyio.run(go)
        self.config = None
        return name

    def environ(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        for k in ("COORDINATOR_LOCK_ID", "COORDINATOR_TIMEOUT", "KUBECONFIG"):
            env.pop(k, None)
        env.update(
            {
                "COORDINATOR_CONFIG": str(self.config_path),
                "COORDINATOR_HOLDER": HOLDER,
                "XDG_CONFIG_HOME": str(self.root / "xdg-config"),
                "XDG_STATE_HOME": str(self.root / "xdg-state"),
                "NO_COLOR": "1",
            }
        )
        env.update(extra)
        return env


def proxied_kubeconfig(source: Path, dest: Path, servers: dict[str, str]) -> None:
    """A copy of ``source`` whose clusters' ``server:`` point at the proxies.

    TLS still verifies: the sandbox's serving certificate has SAN IP 127.0.0.1, and the
    proxies listen on 127.0.0.1 too.
    """
    doc = yaml.safe_load(source.read_text())
    for entry in doc.get("clusters") or []:
        if entry["name"] in servers:
            entry["cluster"]["server"] = servers[entry["name"]]
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    dest.chmod(0o600)


def check_serving_san(sandbox_dir: Path) -> str:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((sandbox_dir / "pki" / "serving.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    if "127.0.0.1" not in ips:
        raise SystemExit(f"the sandbox serving certificate has no SAN 127.0.0.1 (IPs: {ips}); cannot proxy")
    return ", ".join(ips)


@contextlib.contextmanager
def rig(n: int, *, sandbox_dir: Path | None = None) -> Iterator[Rig]:
    """Start everything; stop everything on the way out, whatever happens."""
    from faults.toxiproxy import ToxiproxyServer

    from coordinator import sandbox as sb

    root = Path(tempfile.mkdtemp(prefix="coordinator-bench-"))
    sandbox: Any = None
    toxi: Any = None
    own_sandbox = sandbox_dir is None
    stopped = False
    try:
        t0 = time.monotonic()
        if sandbox_dir is None:
            print(f"starting a sandbox of {n} clusters in {root / 'sandbox'} ...", flush=True)
            sandbox = sb.Sandbox(root / "sandbox")  # handle first: an interrupted start is stopped below
            sandbox = sb.up(n, root / "sandbox")
        else:
            sandbox = sb.Sandbox(sandbox_dir)
            if sandbox.n < n:
                raise SystemExit(f"--sandbox-dir {sandbox_dir} has {sandbox.n} clusters, {n} needed")
        print(f"  sandbox ready in {time.monotonic() - t0:.0f}s", flush=True)
        sans = check_serving_san(Path(sandbox.dir))
        toxi = ToxiproxyServer.start(log_path=root / "toxiproxy.log", log_level="warn")
        proxies = []
        servers: dict[str, str] = {}
        for i in range(1, n + 1):
            upstream = sandbox.server(i).removeprefix("https://")
            p = toxi.create_proxy(f"cluster-{i}", upstream)
            proxies.append(p)
            servers[sandbox.context(i)] = f"https://{p.host}:{p.port}"
        kubeconfig = root / "kubeconfig"
        proxied_kubeconfig(Path(sandbox.kubeconfig), kubeconfig, servers)
        config_path = root / "config" / "config.yaml"
        store = ConfigStore(config_path)
        names = [f"c{i}" for i in range(1, n + 1)]

        async def connect() -> None:
            for i, name in enumerate(names, start=1):
                await connect_cluster(store, name, sandbox.context(i), str(kubeconfig), timeout=10)

        anyio.run(connect)
        print(f"  {n} clusters connected through toxiproxy {toxi.url} (serving cert SAN IPs: {sans})", flush=True)
        yield Rig(root, sandbox, toxi, proxies, kubeconfig, config_path, names)
    finally:
        print("tearing down ...", flush=True)
        with _no_interrupts():
            if toxi is not None:
                try:
                    toxi.stop()
                except Exception as err:
                    print(f"  toxiproxy stop failed: {err} (pid {toxi.pid})")
            stopped = own_sandbox and sandbox is not None
            if stopped:
                try:
                    sandbox.down(grace=5.0)
                except Exception as err:  # say so, and keep the directory for a manual `sandbox down`
                    print(f"  sandbox down failed: {err}; run `coordinator sandbox down --dir {sandbox.dir}`")
                    stopped = False
            if stopped or not own_sandbox:
                shutil.rmtree(root, ignore_errors=True)
        print("  done: toxiproxy stopped" + (", sandbox down" if stopped else ""), flush=True)


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Let clean-up finish even if Ctrl-C is pressed again."""
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


# ---------------------------------------------------------------------------- helpers


async def parallel_acquire_on(c: Coordinator, dep: str) -> float:
    """One ``acquire`` through the API (the fan-out); returns its latency. The lock is
    released afterwards, outside the timed part."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    res = await c.acquire(dep, ttl=60, holder=HOLDER, reason="bench")
    elapsed = time.perf_counter() - t0
    LAST_CPU[0] = time.process_time() - cpu0
    await c.release(dep, res.lock_id)
    return elapsed


async def sequential_acquire_on(c: Coordinator, dep: str) -> float:
    """The baseline: the same per-cluster steps, one cluster after the other.

    Per cluster: the identity-checked read of the lease; then, with the token chosen
    from those reads, the per-cluster take (compare-and-swap write). Like a naive
    script or Redlock's reference loop, it visits every cluster in turn.
    """
    engine = c.lock_engine(dep)
    lock_id = new_lock_id()
    t0, cpu0 = time.perf_counter(), time.process_time()
    views = {}
    for name in engine.members:
        views[name] = await engine._checked_read(name)
    token = quorum.next_fencing_token(v.token for v in views.values())
    over = {"lost": False, "won": False, "mismatch": False}
    won = 0
    for name in engine.members:
        res = await engine._take_one(name, views[name], lock_id, token, 60, HOLDER, "bench", "bench", over)
        won += res.ok
    elapsed = time.perf_counter() - t0
    LAST_CPU[0] = time.process_time() - cpu0
    if won < engine.q:
        raise RuntimeError(f"sequential baseline got only {won} of {engine.n} clusters")
    await engine.release(lock_id)
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


# ---------------------------------------------------------------------------- B1


def bench_b1(r: Rig, rep: Report, *, sizes: Sequence[int], reps: int, warmup: int) -> None:
    print(f"B1: acquire over N = {list(sizes)} clusters at +{LATENCY_MS} ms, parallel vs sequential", flush=True)
    deps = {n: r.deployment(f"b1-n{n}", r.names[:n]) for n in sizes}
    r.clear()
    r.latency(LATENCY_MS)
    variants: dict[str, Callable[[], float]] = {}
    for n, dep in deps.items():
        variants[f"parallel-{n}"] = cold(r, parallel_acquire_on, dep)
        variants[f"sequential-{n}"] = cold(r, sequential_acquire_on, dep)
    cpu: dict[str, list[float]] = {}
    samples = interleaved(variants, reps, warmup, cpu)
    warm_variants: dict[str, tuple[AcquireOn, str]] = {}
    for n, dep in deps.items():
        warm_variants[f"parallel-{n}"] = (parallel_acquire_on, dep)
        warm_variants[f"sequential-{n}"] = (sequential_acquire_on, dep)
    warm = warm_series(r, warm_variants, reps, warmup)
    r.clear()
    rep.raw["B1"] = {k: {"samples": v, "cpu": cpu.get(k, []), **summary(v)} for k, v in samples.items()}
    rep.raw["B1-warm"] = {k: {"samples": v, **summary(v)} for k, v in warm.items()}
    for n in sizes:
        p, s = median(samples[f"parallel-{n}"]), median(samples[f"sequential-{n}"])
        rep.add(
            Row(
                f"B1.n{n}",
                f"acquire over {n} at +{LATENCY_MS} ms: parallel / sequential median",
                f"{ms(p)} / {ms(s)}",
                "",
                p,
                "-",
                None,
            )
        )
    p1, p5, s5 = (median(samples[k]) for k in ("parallel-1", "parallel-5", "sequential-5"))
    rep.add(
        Row(
            "B1a",
            "acquire parallel(5) / parallel(1), one command's work (fresh clients)",
            f"{p5 / p1:.2f} ({ms(p5)} vs {ms(p1)})",
            f"parallel(1) {ms(p1)}",
            p5 / p1,
            "<= 1.3",
            p5 / p1 <= 1.3,
        )
    )
    rep.add(
        Row(
            "B1b",
            "acquire sequential(5) / parallel(5), one command's work (fresh clients)",
            f"{s5 / p5:.2f} ({ms(s5)} vs {ms(p5)})",
            f"parallel(5) {ms(p5)}",
            s5 / p5,
            ">= 3",
            s5 / p5 >= 3,
        )
    )
    c1, c5 = median(cpu["parallel-1"]), median(cpu["parallel-5"])
    rep.add(
        Row(
            "B1.cpu",
            "client CPU time of one acquire (fresh clients), parallel(5) vs parallel(1)",
            f"{ms(c5)} vs {ms(c1)} (+{(c5 - c1) * 1000 / 4:.0f} ms per extra cluster)",
            "",
            c5 - c1,
            "-",
            None,
        )
    )
    w1, w5, ws5 = (median(warm[k]) for k in ("parallel-1", "parallel-5", "sequential-5"))
    rep.add(
        Row(
            "B1.warm",
            "same, open Coordinator (connections and identities established): p(5)/p(1); s(5)/p(5)",
            f"{w5 / w1:.2f} ({ms(w5)} vs {ms(w1)}); {ws5 / w5:.2f} ({ms(ws5)} vs {ms(w5)})",
            "",
            w5 / w1,
            "-",
            None,
        )
    )


# ---------------------------------------------------------------------------- B2


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


# ---------------------------------------------------------------------------- B3


async def wait_for_lock(
    c: Coordinator, dep: str, holder: str, got: dict[str, Any], done: anyio.Event, polling: bool, poll_every: float
) -> None:
    """The contender: ``acquire --wait`` (woken by lease watches), or a loop that tries
    and sleeps ``poll_every`` seconds between tries (the baseline)."""
    if polling:
        while True:
            try:
                got["res"] = await c.acquire(dep, ttl=60, holder=holder)
                break
            except LockHeldError:
                await anyio.sleep(poll_every)
    else:
        got["res"] = await c.acquire(dep, ttl=60, holder=holder, wait=60)
    got["t"] = time.perf_counter()
    done.set()


async def handoffs(r: Rig, dep: str, count: int, *, polling: bool, poll_every: float = 2.0) -> list[float]:
    """Alternate the lock between two holders in one process; return the handoff times:
    from the moment the holder starts releasing to the moment the waiter holds it."""
    out: list[float] = []
    a, b = r.coordinator(5.0), r.coordinator(5.0)
    names = {id(a): "bench-a", id(b): "bench-b"}
    async with a, b:
        holder_c, waiter_c = a, b
        held = await holder_c.acquire(dep, ttl=60, holder=names[id(a)])
        for _ in range(count):
            got: dict[str, Any] = {}
            done = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_lock, waiter_c, dep, names[id(waiter_c)], got, done, polling, poll_every)
                # the release lands at a random phase of the waiter's cycle
                await anyio.sleep(random.uniform(0.6, 2.6))
                t0 = time.perf_counter()
                await holder_c.release(dep, held.lock_id)
                with anyio.fail_after(30):
                    await done.wait()
            out.append(got["t"] - t0)
            held = got["res"]
            holder_c, waiter_c = waiter_c, holder_c
        await holder_c.release(dep, held.lock_id)
    return out


def bench_b3(r: Rig, rep: Report, *, count: int) -> None:
    print(f"B3: handoff on 3 clusters, {count} handoffs each: watch-woken waiter vs polling every 2 s", flush=True)
    dep = r.deployment("b3", r.names[:3])
    r.clear()
    samples: dict[str, list[float]] = {"wait": [], "poll": []}
    # interleave in blocks so that both see the same background load
    block = max(1, count // 3)
    done = 0
    while done < count:
        k = min(block, count - done)
        samples["wait"] += anyio.run(lambda k=k: handoffs(r, dep, k, polling=False))  # type: ignore[misc]
        samples["poll"] += anyio.run(lambda k=k: handoffs(r, dep, k, polling=True))  # type: ignore[misc]
        done += k
    rep.raw["B3"] = {k: {"samples": v, **summary(v)} for k, v in samples.items()}
    w, p = samples["wait"], samples["poll"]
    rep.add(
        Row(
            "B3.p95",
            "handoff with --wait: p95 (info); polling p95",
            f"{ms(percentile(w, 95))}; polling {ms(percentile(p, 95))}",
            "",
            percentile(w, 95),
            "-",
            None,
        )
    )
    rep.add(
        Row(
            "B3'a",
            f"handoff with --wait: median over {len(w)}",
            ms(median(w)),
            "",
            median(w),
            f"<= {TARGETS['B3median'] * 1000:.0f} ms",
            median(w) <= TARGETS["B3median"],
        )
    )
    rep.add(
        Row(
            "B3'b",
            f"handoff with --wait: p99 over {len(w)} (max {ms(max(w))})",
            ms(percentile(w, 99)),
            "",
            percentile(w, 99),
            f"<= {TARGETS['B3p99'] * 1000:.0f} ms",
            percentile(w, 99) <= TARGETS["B3p99"],
        )
    )
    rep.add(
        Row(
            "B3b",
            "handoff median, --wait / polling every 2 s",
            f"{median(w) / median(p):.3f} ({ms(median(w))} vs {ms(median(p))})",
            f"polling {ms(median(p))}",
            median(w) / median(p),
            "<= 1/3",
            median(w) / median(p) <= 1 / 3,
        )
    )


# ---------------------------------------------------------------------------- B4


def bench_b4(r: Rig, rep: Report, *, reps: int, warmup: int) -> None:
    print("B4: `coordinator lock status` over 5 clusters as a whole process vs importing kubernetes_asyncio.client")
    dep = r.deployment("b4", r.names[:5])
    r.clear()
    env = r.environ()
    cmds = {
        "status": [sys.executable, "-m", "coordinator", "lock", "status", dep],
        "import": [sys.executable, "-c", "import kubernetes_asyncio.client"],
        "python": [sys.executable, "-c", "pass"],
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
    rep.raw["B4"] = {
        k: {
            "wall": [x.wall for x in v],
            "cpu": [x.cpu for x in v],
            "rss_kib": [x.rss_kib for x in v],
            **summary([x.wall for x in v]),
        }
        for k, v in runs.items()
    }
    ws, wi, wp = (median([x.wall for x in runs[k]]) for k in ("status", "import", "python"))
    cs, ci = (median([x.cpu for x in runs[k]]) for k in ("status", "import"))
    peak = max(x.rss_kib for x in runs["status"]) / 1024
    rep.add(
        Row(
            "B4'a",
            "`lock status` (5 clusters) wall / `import kubernetes_asyncio.client` wall",
            f"{ws / wi:.2f} ({ws:.2f} s vs {wi:.2f} s; bare python {wp:.2f} s)",
            f"import {wi:.2f} s",
            ws / wi,
            f"<= {TARGETS['B4']:g}",
            ws / wi <= TARGETS["B4"],
        )
    )
    rep.add(
        Row(
            "B4'.cpu",
            "same, CPU time (user+sys) ratio, less sensitive to a busy machine",
            f"{cs / ci:.2f} ({cs:.2f} s vs {ci:.2f} s)",
            f"import {ci:.2f} s",
            cs / ci,
            "-",
            None,
        )
    )
    rep.add(
        Row(
            "B4'b",
            "`lock status` peak RSS (max of runs)",
            f"{peak:.0f} MiB (import alone {max(x.rss_kib for x in runs['import']) / 1024:.0f} MiB)",
            "",
            peak,
            f"<= {TARGETS['B4rss']:g} MB",
            peak * 2**20 <= TARGETS["B4rss"] * 1e6,
        )
    )


# ---------------------------------------------------------------------------- B5


async def state_op_on(c: Coordinator, dep: str, op: str, lock_id: str, i: int) -> float:
    s = c.state(dep)
    t0, cpu0 = time.perf_counter(), time.process_time()
    if op == "set":
        await s.set({"replicas": i, "app.version": f"1.{i}.0"}, lock=lock_id, command="bench")
    else:
        await s.get()
    LAST_CPU[0] = time.process_time() - cpu0
    return time.perf_counter() - t0


def bench_b5(r: Rig, rep: Report, *, reps: int, warmup: int) -> None:
    print(f"B5: state set / get over 5 clusters vs 1 cluster, all at +{LATENCY_MS} ms", flush=True)
    deps = {1: r.deployment("b5-n1", r.names[:1]), 5: r.deployment("b5-n5", r.names[:5])}
    r.clear()
    locks: dict[int, str] = {}

    async def take() -> None:
        async with r.coordinator(5.0) as c:
            for n, dep in deps.items():
                locks[n] = (await c.acquire(dep, ttl=600, holder=HOLDER)).lock_id
                await c.state(dep).set({"replicas": 0}, lock=locks[n])

    anyio.run(take)
    r.latency(LATENCY_MS)
    counter = itertools.count(1)

    def one(n: int, op: str) -> Callable[[Coordinator, str], Awaitable[float]]:
        return lambda c, dep: state_op_on(c, dep, op, locks[n], next(counter))

    variants: dict[str, Callable[[], float]] = {}
    warm_variants: dict[str, tuple[AcquireOn, str]] = {}
    for n, dep in deps.items():
        for op in ("set", "get"):
            variants[f"{op}-{n}"] = cold(r, one(n, op), dep)
            warm_variants[f"{op}-{n}"] = (one(n, op), dep)
    cpu: dict[str, list[float]] = {}
    samples = interleaved(variants, reps, warmup, cpu)
    warm = warm_series(r, warm_variants, reps, warmup)
    r.clear()

    async def give_back() -> None:
        async with r.coordinator(5.0) as c:
            for n, dep in deps.items():
                await c.release(dep, locks[n])

    anyio.run(give_back)
    rep.raw["B5"] = {k: {"samples": v, "cpu": cpu.get(k, []), **summary(v)} for k, v in samples.items()}
    rep.raw["B5-warm"] = {k: {"samples": v, **summary(v)} for k, v in warm.items()}
    for op in ("set", "get"):
        a, b = median(samples[f"{op}-5"]), median(samples[f"{op}-1"])
        rep.add(
            Row(
                f"B5.{op}",
                f"state {op}: 5 clusters / 1 cluster at +{LATENCY_MS} ms, one command's work (fresh clients)",
                f"{a / b:.2f} ({ms(a)} vs {ms(b)})",
                f"1 cluster {ms(b)}",
                a / b,
                "<= 1.3",
                a / b <= 1.3,
            )
        )
    cm = {k: median(v) for k, v in cpu.items()}
    rep.add(
        Row(
            "B5.cpu",
            "client CPU time (fresh clients): set 5 vs 1; get 5 vs 1",
            f"{ms(cm['set-5'])} vs {ms(cm['set-1'])}; {ms(cm['get-5'])} vs {ms(cm['get-1'])}",
            "",
            cm["set-5"] - cm["set-1"],
            "-",
            None,
        )
    )
    wa = {k: median(v) for k, v in warm.items()}
    rep.add(
        Row(
            "B5.warm",
            "same, open Coordinator: set 5/1; get 5/1",
            f"{wa['set-5'] / wa['set-1']:.2f} ({ms(wa['set-5'])} vs {ms(wa['set-1'])}); "
            f"{wa['get-5'] / wa['get-1']:.2f} ({ms(wa['get-5'])} vs {ms(wa['get-1'])})",
            "",
            wa["set-5"] / wa["set-1"],
            "-",
            None,
        )
    )


# ---------------------------------------------------------------------------- B6


async def contender_main(config: str, deployment: str, holder: str, duration: float, hold: float) -> None:
    """One contender process: cycle acquire(wait) / release for ``duration`` seconds after
    the parent says go; print the wins (and how the failed attempts failed) as one JSON line.

    Times are ``time.monotonic()``, one clock for every process of the machine.
    """
    store = ConfigStore(config)
    cfg = store.load()
    wins: list[float] = []
    released: list[float] = []
    errors: list[str] = []
    attempts = {"won": 0, "split": 0, "held": 0}
    c = Coordinator(cfg, store=None, timeout=5.0)

    def on_wait(result: Any, left: float) -> None:
        got = sum(1 for r in result.results.values() if r.ok)
        attempts["split" if got else "held"] += 1

    async with c:
        await c.status(deployment)  # connections up and identities proven before the start
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        start = time.monotonic()
        end = start + duration
        with anyio.move_on_after(duration):
            while True:
                try:
                    left = max(0.1, end - time.monotonic())
                    res = await c.acquire(deployment, ttl=30, holder=holder, wait=left, on_wait=on_wait)
                except LockHeldError:
                    continue
                except Exception as err:  # reported, not fatal
                    errors.append(f"{type(err).__name__}: {err}"[:200])
                    await anyio.sleep(0.2)
                    continue
                wins.append(time.monotonic())
                attempts["won"] += 1
                try:
                    if hold > 0:
                        await anyio.sleep(hold)
                finally:
                    with anyio.CancelScope(shield=True):
                        await c.release(deployment, res.lock_id)
                        released.append(time.monotonic())
    doc = {
        "holder": holder,
        "start": start,
        "wins": wins,
        "released": released,
        "attempts": attempts,
        "errors": errors[:5],
        "n_errors": len(errors),
    }
    print(json.dumps(doc), flush=True)


def bench_b6(r: Rig, rep: Report, *, duration: float, contenders: int = 8, hold: float = 0.0) -> None:
    print(f"B6: {contenders} contender processes on 3 clusters for {duration:g}s", flush=True)
    dep = r.deployment("b6", r.names[:3])
    r.clear()
    env = r.environ()
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in range(contenders):
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--contender",
                json.dumps(
                    {
                        "config": str(r.config_path),
                        "deployment": dep,
                        "holder": f"contender-{i + 1}",
                        "duration": duration,
                        "hold": hold,
                    }
                ),
            ]
            procs.append(
                subprocess.Popen(
                    cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"contender did not start: {line!r} {p.stderr.read() if p.stderr else ''}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=duration + 60)
            lines = [x for x in out.splitlines() if x.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"contender failed ({p.returncode}): {err[-2000:]}")
            results.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    t0 = min(x["start"] for x in results)
    wins = {x["holder"]: [w - t0 for w in x["wins"]] for x in results}
    counts = [len(v) for v in wins.values()]
    total = sum(counts)
    gaps = []
    for v in wins.values():
        marks = [0.0, *v, duration]
        gaps.append(max(b - a for a, b in itertools.pairwise(marks)))
    worst_gap = max(gaps)
    # the lock idle between a release and the next win (by anyone)
    events = sorted(
        [(w, "win") for x in results for w in x["wins"]] + [(t, "rel") for x in results for t in x["released"]]
    )
    idle = [b[0] - a[0] for a, b in itertools.pairwise(events) if a[1] == "rel" and b[1] == "win"]
    tries = {k: sum(x["attempts"][k] for x in results) for k in ("won", "split", "held")}
    order = sorted((w, x["holder"]) for x in results for w in x["wins"])
    again = sum(1 for a, b in itertools.pairwise(order) if a[1] == b[1])
    rep.raw["B6"] = {
        "duration": duration,
        "results": results,
        "max_gap_s": gaps,
        "idle_s": idle,
        "attempts": tries,
        "same_holder_again": again,
    }
    errs = sum(x["n_errors"] for x in results)
    rep.add(
        Row(
            "B6.rate",
            f"{contenders} contenders on 3 clusters: cycles/s; wins min/max per contender",
            f"{total / duration:.1f} cycles/s; wins min {min(counts)} / max {max(counts)}; errors {errs}",
            "",
            total / duration,
            "-",
            None,
        )
    )
    rep.add(
        Row(
            "B6.idle",
            "lock idle from a release to the next win: median / p95; failed attempts per win",
            f"{ms(median(idle))} / {ms(percentile(idle, 95))}; {(tries['split'] + tries['held']) / max(1, total):.1f} "
            f"(split votes {tries['split']}, found held {tries['held']}, wins {tries['won']}); "
            f"{again} of {max(0, total - 1)} wins went to the previous holder again",
            "",
            median(idle),
            "-",
            None,
        )
    )
    rep.add(
        Row(
            "B6a",
            "longest time a contender went without a win",
            f"{worst_gap:.1f} s (min wins {min(counts)})",
            "",
            worst_gap,
            "<= 30 s, every contender wins",
            worst_gap <= 30 and min(counts) > 0,
        )
    )


# ---------------------------------------------------------------------------- B7


def payload(size: int) -> dict[str, Any]:
    """A state document of about ``size`` bytes of JSON: parts of 1 KiB under one key."""
    parts = max(1, size // 1024)
    body = "x" * (1024 - 24)
    return {"blob": {f"part-{i:05d}": body for i in range(parts)}, "rev": 0}


async def size_series(r: Rig, dep: str, size: int, lock_id: str, reps: int, warmup: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"write": [], "read": []}
    c = r.coordinator(10.0)
    async with c:
        s = c.state(dep)
        await s.apply(payload(size), lock=lock_id, command="bench")
        for i in range(warmup + reps):
            t0 = time.perf_counter()
            await s.set({"rev": i + 1}, lock=lock_id, command="bench")
            t1 = time.perf_counter()
            await s.get()
            t2 = time.perf_counter()
            if i >= warmup:
                out["write"].append(t1 - t0)
                out["read"].append(t2 - t1)
    return out


def bench_b7(r: Rig, rep: Report, *, sizes_kib: Sequence[int], reps: int, warmup: int) -> None:
    print(f"B7: state size {list(sizes_kib)} KiB on 3 clusters: write and read latency", flush=True)
    dep = r.deployment("b7", r.names[:3])
    r.clear()
    lock: dict[str, str] = {}

    async def take() -> None:
        c = r.coordinator(5.0)
        async with c:
            lock["id"] = (await c.acquire(dep, ttl=600, holder=HOLDER)).lock_id

    anyio.run(take)
    series: dict[int, dict[str, list[float]]] = {}
    for kib in sizes_kib:
        series[kib] = anyio.run(lambda k=kib: size_series(r, dep, k * 1024, lock["id"], reps, warmup))  # type: ignore[misc]

    async def give_back() -> None:
        c = r.coordinator(5.0)
        async with c:
            await c.release(dep, lock["id"])

    anyio.run(give_back)
    rep.raw["B7"] = {str(k): {op: {"samples": v, **summary(v)} for op, v in s.items()} for k, s in series.items()}
    base = sizes_kib[0]
    for op in ("write", "read"):
        meds = {k: median(series[k][op]) for k in sizes_kib}
        # local growth exponent between consecutive sizes: 1 = linear, > 1 = worse than linear
        exps = [math.log(meds[b] / meds[a]) / math.log(b / a) for a, b in itertools.pairwise(sizes_kib)]
        worst = max(exps)
        top = sizes_kib[-1]
        rep.add(
            Row(
                f"B7.{op}",
                f"state {op} latency {base} KiB -> {top} KiB (x{top // base} size)",
                f"{ms(meds[base])} -> {ms(meds[top])} (x{meds[top] / meds[base]:.1f}); worst growth exponent "
                f"{worst:.2f}",
                f"{base} KiB {ms(meds[base])}",
                worst,
                "exponent <= 1.1 (linear)",
                worst <= 1.1,
            )
        )


# ---------------------------------------------------------------------------- B10 (and request counts)


class CountingForwarders:
    """A tiny TCP forwarder in front of each cluster's proxy, in a thread of its own,
    that counts the connections accepted per cluster (TLS passes through untouched, so
    what is counted is what the client opened)."""

    def __init__(self, upstreams: Sequence[tuple[str, int]]) -> None:
        import asyncio
        import threading

        self.upstreams = list(upstreams)
        self.counts = [0] * len(self.upstreams)
        self.ports: list[int] = []
        self._loop = asyncio.new_event_loop()
        self._servers: list[Any] = []
        ready = threading.Event()

        async def start() -> None:
            for i in range(len(self.upstreams)):
                server = await asyncio.start_server(functools.partial(self._pipe, i), "127.0.0.1", 0)
                self._servers.append(server)
                self.ports.append(server.sockets[0].getsockname()[1])
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(start())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="forwarders", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the counting forwarders did not start")

    async def _pipe(self, i: int, reader: Any, writer: Any) -> None:
        import asyncio

        self.counts[i] += 1
        host, port = self.upstreams[i]
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def copy(src: Any, dst: Any) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def reset(self) -> None:
        self.counts = [0] * len(self.upstreams)

    def stop(self) -> None:
        async def close() -> None:
            for s in self._servers:
                s.close()

        import asyncio

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def forwarded_config(r: Rig, fw: CountingForwarders, dest: Path) -> Path:
    """A copy of the rig's kubeconfig and local config whose clusters are reached
    through the forwarders (same contexts, so identities still match)."""
    doc = yaml.safe_load(r.kubeconfig.read_text())
    by_port = {p.port: port for p, port in zip(r.proxies, fw.ports, strict=False)}
    for entry in doc.get("clusters") or []:
        server = entry["cluster"]["server"]
        port = int(server.rsplit(":", 1)[1])
        if port in by_port:
            entry["cluster"]["server"] = f"https://127.0.0.1:{by_port[port]}"
    dest.mkdir(parents=True, exist_ok=True)
    kubeconfig = dest / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc, sort_keys=False))
    kubeconfig.chmod(0o600)
    config = yaml.safe_load(r.config_path.read_text())
    for rec in (config.get("clusters") or {}).values():
        rec["kubeconfig"] = str(kubeconfig)
    path = dest / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


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


def bench_b10(r: Rig, rep: Report, *, clusters: int = 5) -> None:
    print(f"B10: connections per cluster per command over {clusters} clusters, counted at a TCP forwarder", flush=True)
    dep = r.deployment("b10", r.names[:clusters])
    r.clear()
    fw = CountingForwarders([(p.host, p.port) for p in r.proxies[:clusters]])
    try:
        env = r.environ(COORDINATOR_CONFIG=str(forwarded_config(r, fw, r.root / "b10")))
        counts: dict[str, list[int]] = {}
        commands = {
            "lock acquire": ["lock", "acquire", dep, "--ttl", "60"],
            "state set": ["state", "set", dep, "replicas:=3"],
            "lock status": ["lock", "status", dep],
            "lock release": ["lock", "release", dep],
        }
        for label, args in commands.items():
            fw.reset()
            run = run_process([sys.executable, "-m", "coordinator", *args], env)
            if run.code != 0:
                raise RuntimeError(f"coordinator {' '.join(args)} exited {run.code}: {run.stderr}")
            counts[label] = list(fw.counts)
    finally:
        fw.stop()
    rep.raw["B10"] = counts
    target = TARGETS["B10"]
    for label in ("lock acquire", "state set", "lock status"):
        per = counts[label]
        rep.add(
            Row(
                f"B10.{label.split()[1]}",
                f"`{label}`: TCP connections per cluster ({clusters} clusters)",
                f"{'/'.join(str(x) for x in per)}",
                "",
                float(max(per)),
                f"exactly {target:g} each",
                all(x == target for x in per),
            )
        )
    rep.add(
        Row(
            "B10.rel",
            "`lock release`: connections per cluster (info)",
            "/".join(str(x) for x in counts["lock release"]),
            "",
            float(max(counts["lock release"])),
            "-",
            None,
        )
    )


# ---------------------------------------------------------------------------- B8


def fleet_deployments(r: Rig, count: int, clusters: int) -> list[str]:
    if "fleet" not in r.cache:
        r.cache["fleet"] = [r.deployment(f"f{i:02d}", r.names[:clusters]) for i in range(count)]
    return list(r.cache["fleet"])


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


# ---------------------------------------------------------------------------- B9


def bench_b9(r: Rig, rep: Report, *, reps: int, warmup: int, latency_ms: int = 50) -> None:
    print(f"B9: acquire over 9 vs 3 clusters at +{latency_ms} ms per cluster, fresh clients", flush=True)
    if len(r.names) < 9:
        raise RuntimeError(f"B9 needs 9 clusters, the rig has {len(r.names)}")
    deps = {n: r.deployment(f"b9-n{n}", r.names[:n]) for n in (3, 9)}
    r.clear()
    r.latency(latency_ms)
    try:
        cpu: dict[str, list[float]] = {}
        samples = interleaved(
            {f"n{n}": cold(r, parallel_acquire_on, dep) for n, dep in deps.items()}, reps, warmup, cpu
        )
    finally:
        r.clear()
    rep.raw["B9"] = {k: {"samples": v, "cpu": cpu.get(k, []), **summary(v)} for k, v in samples.items()}
    w3, w9 = median(samples["n3"]), median(samples["n9"])
    c3, c9 = median(cpu["n3"]), median(cpu["n9"])
    per_extra = (c9 - c3) / 6
    rep.add(
        Row(
            "B9",
            f"`lock acquire` over 9 / over 3 clusters at +{latency_ms} ms, fresh clients",
            f"{w9 / w3:.2f} ({ms(w9)} vs {ms(w3)})",
            f"3 clusters {ms(w3)}",
            w9 / w3,
            f"<= {TARGETS['B9']:g}",
            w9 / w3 <= TARGETS["B9"],
        )
    )
    rep.add(
        Row(
            "B9.cpu",
            "client CPU per extra cluster (acquire, fresh clients)",
            f"{per_extra * 1000:.1f} ms ({c9 * 1000:.0f} ms over 9 vs {c3 * 1000:.0f} ms over 3)",
            "",
            per_extra,
            "-",
            None,
        )
    )


# ---------------------------------------------------------------------------- B11


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def bench_b11(r: Rig, rep: Report, *, deployments: int, clusters: int, duration: float, warmup: float) -> None:
    import threading

    print(
        f"B11: `lock status --all --watch` over {deployments} x {clusters} for {duration:g}s, "
        "a lock changing hands every 2 s",
        flush=True,
    )
    deps = fleet_deployments(r, deployments, clusters)
    dep = deps[-1]
    r.clear()
    cmd = [sys.executable, "-m", "coordinator", "lock", "status", "--all", "--watch", "-o", "json"]
    proc = subprocess.Popen(
        cmd, env=r.environ(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", text=True
    )
    shown: list[tuple[float, str | None]] = []  # (when read, lock id of dep)
    rss: list[tuple[float, int]] = []
    stop = threading.Event()
    t_start = time.monotonic()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            t = time.monotonic()
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            for d in doc.get("deployments", []):
                if d.get("deployment") == dep:
                    shown.append((t, d.get("lock_id") if d.get("status") == "held" else None))

    def sample() -> None:
        while not stop.wait(1.0):
            kib = _rss_kib(proc.pid)
            if kib is not None:
                rss.append((time.monotonic() - t_start, kib))

    threads = [threading.Thread(target=read, daemon=True), threading.Thread(target=sample, daemon=True)]
    for t in threads:
        t.start()
    changes: list[tuple[float, float, str]] = []  # (acquire started, acquire done, lock id)

    async def drive() -> None:
        async with r.coordinator(5.0) as a, r.coordinator(5.0) as b:
            await anyio.sleep(3.0)  # the watcher's first view
            who = [(a, "bench-a"), (b, "bench-b")]
            held: tuple[Coordinator, str] | None = None
            i = 0
            while time.monotonic() - t_start < duration:
                if proc.poll() is not None:
                    raise RuntimeError(f"the watcher exited {proc.returncode}")
                c, name = who[i % 2]
                if held is not None:
                    await held[0].release(dep, held[1])
                t0 = time.monotonic()
                res = await c.acquire(dep, ttl=30, holder=name, reason="b11")
                changes.append((t0, time.monotonic(), res.lock_id))
                held = (c, res.lock_id)
                i += 1
                await anyio.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))
            await anyio.sleep(2.0)  # time for the last change to show
            if held is not None:
                await held[0].release(dep, held[1])

    try:
        anyio.run(drive)
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for t in threads:
            t.join(5)
    lags: list[float] = []
    for started, done, lock_id in changes:
        seen = next((t for t, lid in shown if t >= started and lid == lock_id), None)
        lags.append(math.inf if seen is None else max(0.0, seen - done))
    after = [kib for t, kib in rss if t >= warmup]
    growth_mb = (max(after) - after[0]) * 1024 / 1e6 if after else math.nan
    missed = sum(1 for x in lags if x == math.inf)
    missed_at = [round(c[0] - t_start) for c, lag in zip(changes, lags, strict=True) if lag == math.inf]
    finite = [x for x in lags if x != math.inf]
    rep.raw["B11"] = {
        "lags": lags,
        "rss": rss,
        "changes": len(changes),
        "never_shown_at_s": missed_at,
        "duration": duration,
        "warmup": warmup,
    }
    rep.add(
        Row(
            "B11a",
            f"`lock status --all --watch` ({deployments}x{clusters}, {duration:g} s): RSS growth after {warmup:g} s",
            f"{growth_mb:.1f} MB ({after[0] / 1024:.0f} -> {max(after) / 1024:.0f} MiB)" if after else "no samples",
            "",
            growth_mb,
            f"<= {TARGETS['B11rss']:g} MB",
            bool(after) and growth_mb <= TARGETS["B11rss"],
        )
    )
    worst = max(lags) if lags else math.nan
    rep.add(
        Row(
            "B11b",
            f"each change shown after it happened: worst of {len(changes)} (median, never shown)",
            f"{ms(worst) if worst != math.inf else 'never'} (median {ms(median(finite)) if finite else '-'}; "
            f"{missed} never shown{': at ' + ', '.join(f'{x} s' for x in missed_at[:8]) if missed_at else ''})",
            "",
            worst,
            f"<= {TARGETS['B11lag'] * 1000:.0f} ms",
            bool(lags) and worst <= TARGETS["B11lag"],
        )
    )


# ---------------------------------------------------------------------------- output


def environment() -> dict[str, Any]:
    free = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "free_g": free,
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def markdown(rep: Report, env: dict[str, Any], mode: str) -> str:
    lines = [
        f"Benchmarks ({mode}) — {env['date']}, nproc {env['nproc']}, load {env['loadavg'][0]:.1f}",
        "",
        "```",
        env["free_g"],
        "```",
        "",
        "| id | figure | measured | baseline | target | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rep.rows:
        lines.append(
            f"| {row.id} | {row.what} | {row.measured} | {row.baseline or '-'} | {row.target} | {row.verdict} |"
        )
    return "\n".join(lines)


def plot(rep: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(17, 10))
    axes = list(grid[0]) + list(grid[1])
    b1 = rep.raw.get("B1")
    ax = axes[0]
    if b1:
        for kind, style in (("parallel", "o-"), ("sequential", "s--")):
            ns = sorted(int(k.split("-")[1]) for k in b1 if k.startswith(kind))
            med = [b1[f"{kind}-{n}"]["median"] * 1000 for n in ns]
            lo = [m - b1[f"{kind}-{n}"]["p25"] * 1000 for n, m in zip(ns, med, strict=False)]
            hi = [b1[f"{kind}-{n}"]["p75"] * 1000 - m for n, m in zip(ns, med, strict=False)]
            ax.errorbar(ns, med, yerr=[lo, hi], fmt=style, capsize=4, label=f"{kind}, fresh clients per command")
        warm = rep.raw.get("B1-warm") or {}
        for kind, style in (("parallel", "^:"), ("sequential", "v:")):
            ns = sorted(int(k.split("-")[1]) for k in warm if k.startswith(kind))
            if ns:
                ax.plot(
                    ns, [warm[f"{kind}-{n}"]["median"] * 1000 for n in ns], style, label=f"{kind}, open Coordinator"
                )
        ax.set_xlabel("clusters (each +100 ms)")
        ax.set_ylabel("acquire latency, ms (median, p25-p75)")
        ax.set_title("B1: lock acquire vs number of clusters")
        ax.legend()
        ax.grid(alpha=0.3)
    b3 = rep.raw.get("B3")
    ax = axes[1]
    if b3:
        for kind, label in (("wait", "--wait (watch-woken)"), ("poll", "polling every 2 s")):
            xs = sorted(v * 1000 for v in b3[kind]["samples"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f"{label}, median {median(xs):.0f} ms")
        ax.set_xscale("log")
        ax.set_xlabel("handoff latency, ms (log)")
        ax.set_ylabel("fraction of handoffs (CDF)")
        ax.set_title("B3: handoff latency distribution (3 clusters)")
        ax.legend()
        ax.grid(alpha=0.3)
    b7 = rep.raw.get("B7")
    ax = axes[2]
    if b7:
        sizes = sorted(int(k) for k in b7)
        for op, style in (("write", "o-"), ("read", "s-")):
            ax.plot(sizes, [b7[str(k)][op]["median"] * 1000 for k in sizes], style, label=op)
        ref0 = b7[str(sizes[0])]["write"]["median"] * 1000
        ax.plot(sizes, [ref0 * k / sizes[0] for k in sizes], ":", color="grey", label="linear from 1 KiB write")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("state document size, KiB")
        ax.set_ylabel("latency, ms (median)")
        ax.set_title("B7: state latency vs document size (3 clusters)")
        ax.legend()
        ax.grid(alpha=0.3)
    ax = axes[3]
    shown = ("B1a", "B4'a", "B5.set", "B5.get", "B8a", "B9")
    ratios = [(row.id, row.value, row.passed) for row in rep.rows if row.id in shown]
    if ratios:
        ax.bar(
            [r_[0] for r_ in ratios],
            [r_[1] or 0 for r_ in ratios],
            color=["tab:green" if r_[2] else "tab:red" for r_ in ratios],
        )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("ratio to the baseline measured beside it")
        ax.set_title("side-by-side ratios (green: target met)")
        ax.grid(alpha=0.3, axis="y")
    b9 = rep.raw.get("B9")
    ax = axes[4]
    if b9:
        ax.boxplot([[x * 1000 for x in b9[k]["samples"]] for k in ("n3", "n9")])
        ax.set_xticks([1, 2], ["3 clusters", "9 clusters"])
        ax.set_ylabel("acquire latency, ms (fresh clients, +50 ms each)")
        ax.set_title("B9: acquire over 3 vs 9 clusters")
        ax.grid(alpha=0.3)
    b11 = rep.raw.get("B11")
    ax = axes[5]
    if b11 and b11.get("rss"):
        ts, kib = zip(*b11["rss"], strict=True)
        ax.plot(ts, [k / 1024 for k in kib], label="RSS of the watcher")
        ax.axvline(b11["warmup"], color="grey", ls=":", label="end of warm-up")
        ax.set_xlabel("seconds")
        ax.set_ylabel("MiB")
        finite = [x * 1000 for x in b11["lags"] if x != math.inf]
        worst = f"{max(finite):.0f} ms" if finite else "-"
        ax.set_title(f"B11: lock status --all --watch (worst delay shown {worst})")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------- main


def guarded(fig: str, fn: Callable[..., None], r: Rig, rep: Report, *args: Any, **kwargs: Any) -> None:
    """Run one figure; if it raises, say so as a failed row and go on with the others."""
    try:
        fn(r, rep, *args, **kwargs)
    except Exception as err:
        import traceback

        traceback.print_exc()
        r.clear()
        rep.add(
            Row(f"{fig}.error", f"{fig} could not be measured", f"{type(err).__name__}: {err}", "", None, "runs", False)
        )


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and clusters (a few minutes)")
    ap.add_argument("--json", type=Path, help="write every figure, its target and PASS/FAIL here")
    ap.add_argument("--plot", type=Path, help="write the plots (PNG) here")
    ap.add_argument("--only", default="", help="comma-separated figures to run, e.g. B1,B4")
    ap.add_argument("--sandbox-dir", type=Path, help="use this running sandbox instead of starting one")
    ap.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="ID=VALUE",
        help=f"override a round-two target, e.g. B10=0 to see the row fail ({', '.join(TARGETS)})",
    )
    ap.add_argument("--contender", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for item in args.target:
        key, _, value = item.partition("=")
        if key not in TARGETS:
            ap.error(f"--target {item}: unknown target {key!r}")
        TARGETS[key] = float(value)
    if args.contender:
        spec = json.loads(args.contender)
        anyio.run(
            lambda: contender_main(spec["config"], spec["deployment"], spec["holder"], spec["duration"], spec["hold"])
        )
        return 0

    quick = args.quick
    only = {x.strip().upper() for x in args.only.split(",") if x.strip()}

    def wanted(fig: str) -> bool:
        return not only or fig in only

    sizes = [1, 3, 5] if quick else [1, 3, 5, 7]
    n = 9 if wanted("B9") else max(sizes) if wanted("B1") else 5
    signal.signal(signal.SIGTERM, _on_sigterm)
    rep = Report()
    env = environment()
    mode = "quick" if quick else "full"
    t_start = time.monotonic()
    try:
        with rig(n, sandbox_dir=args.sandbox_dir) as r:
            # the fleet rows first: the fleet view shows every deployment on the clusters
            if wanted("B8"):
                guarded("B8", bench_b8, r, rep, deployments=20, clusters=5, reps=4 if quick else 12, warmup=1)
            if wanted("B11"):
                guarded(
                    "B11",
                    bench_b11,
                    r,
                    rep,
                    deployments=20,
                    clusters=5,
                    duration=45 if quick else 600,
                    warmup=15 if quick else 60,
                )
            if wanted("B10"):
                bench_b10(r, rep)
            if wanted("B4"):
                guarded("B4", bench_b4, r, rep, reps=6 if quick else 15, warmup=1 if quick else 2)
            if wanted("B1"):
                guarded("B1", bench_b1, r, rep, sizes=sizes, reps=5 if quick else 15, warmup=1 if quick else 2)
            if wanted("B5"):
                guarded("B5", bench_b5, r, rep, reps=5 if quick else 15, warmup=1 if quick else 2)
            if wanted("B2"):
                guarded(
                    "B2",
                    bench_b2,
                    r,
                    rep,
                    reps=4 if quick else 10,
                    warmup=1,
                    fail_reps=1 if quick else 3,
                    cli_reps=2 if quick else 4,
                )
            if wanted("B9"):
                guarded("B9", bench_b9, r, rep, reps=4 if quick else 15, warmup=1 if quick else 2)
            if wanted("B3"):
                guarded("B3", bench_b3, r, rep, count=10 if quick else 100)
            if wanted("B7"):
                sizes_kib = [1, 16, 128, 512] if quick else [1, 4, 16, 64, 128, 256, 512]
                guarded("B7", bench_b7, r, rep, sizes_kib=sizes_kib, reps=3 if quick else 7, warmup=1)
            if wanted("B6"):
                guarded("B6", bench_b6, r, rep, duration=40 if quick else 120)
    except (KeyboardInterrupt, Interrupted):
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    env["loadavg_end"] = os.getloadavg()
    env["elapsed_s"] = round(time.monotonic() - t_start, 1)
    table = markdown(rep, env, mode)
    print()
    print(table)
    failed = [row.id for row in rep.rows if row.passed is False]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "environment": env,
            "mode": mode,
            "rows": [asdict(row) | {"result": row.verdict} for row in rep.rows],
            "raw": rep.raw,
            "failed": failed,
        }
        args.json.write_text(json.dumps(doc, indent=2, default=str))
        print(f"\nJSON: {args.json}")
    if args.plot:
        plot(rep, args.plot)
        print(f"plot: {args.plot}")
    print(f"\n{len(rep.rows)} rows, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
