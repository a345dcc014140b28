"""How big, how long, how random a run is; the sandbox clusters behind toxiproxy; the
contender processes, started, watched, frozen, killed, replaced and stopped.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from faults.clock import machine_clock
from faults.contenders import DEPLOYMENT, ContenderSpec, default_contenders
from faults.kinds import FAULT_KINDS, MEMBER_FAULTS
from faults.recorder import Recorder

if TYPE_CHECKING:
    from coordinator_sandbox import Sandbox
    from faults.toxiproxy import Proxy, ToxiproxyServer


# Where this harness lives (tests/, holding the package ``faults``): contender processes
# import it from there, since it is not part of the installed tool.
TESTS_DIR = str(Path(__file__).resolve().parent.parent)
Progress = Callable[[str], None]


# --------------------------------------------------------------------------- options


@dataclass
class TortureOptions:
    """How big, how long, how random."""

    clusters: int = 3
    seconds: float = 100.0
    seed: int = 1
    contenders: list[ContenderSpec] = field(default_factory=default_contenders)
    request_timeout: float = 2.0
    # The longest wait of an API contender (one wait in four). Longer than the maximum TTL
    # plus margin (10 s + 1 % + 2 s + 5 s): a lease that carries no stamp of ours (its
    # managedFields stripped) lapses only once one process watched it that long unchanged,
    # so without such a waiter a stripped tombstone on a majority stops every section.
    wait: float = 30.0
    workdir: Path | None = None  # kept afterwards; default: a temporary directory, removed
    # Quiet time between fault episodes, s. Short: most episodes leave the lock blocked
    # for a while after they end anyway (a tombstone, a dead holder's lease lapsing).
    fault_gap: tuple[float, float] = (0.5, 2.0)
    fault_length: tuple[float, float] = (2.0, 6.0)  # how long most faults last, s
    progress: Progress | None = None
    kinds: Sequence[str] | None = None  # fault kinds to inject (default: every one, FAULT_KINDS)
    min_each: int = 1  # the run goes on past ``seconds`` until every kind ran this often...
    overtime: float = 300.0  # ...for at most this long
    max_ttl: float = 10.0  # the deployment's --max-ttl: how long a deleted Lease blocks
    long_stop: float = 60.0  # the longest SIGSTOP of a holder (a long one is its TTL + 3 s)
    # kube-apiservers per cluster: 2 starts the HA sandbox (two on one etcd behind a front
    # proxy, toxiproxy in front of that), one of which answers ``date_offset`` seconds off.
    apiservers: int = 1
    date_offset: float = 0.0
    # Clusters started besides the members, for the membership faults to add (default:
    # one when a membership kind is in the schedule, else none).
    spares: int | None = None

    @property
    def member_changes(self) -> bool:
        return any(k in MEMBER_FAULTS for k in (self.kinds or FAULT_KINDS))

    @property
    def spare_clusters(self) -> int:
        if self.spares is not None:
            return self.spares
        return 1 if self.member_changes else 0


# ------------------------------------------------------------------------------ rig


class Rig:
    """Sandbox clusters behind toxiproxy, and a local config that reaches them."""

    def __init__(
        self,
        workdir: Path,
        n: int,
        say: Progress,
        max_ttl: float = 10.0,
        *,
        spares: int = 0,
        apiservers: int = 1,
        date_offset: float = 0.0,
    ) -> None:
        self.workdir = workdir
        self.n = n
        self.spares = spares
        self.apiservers = apiservers
        self.date_offset = date_offset
        # Cluster indices (1-based) of the deployment's members now; the membership
        # faults change it. Every other cluster started is a spare.
        self.members = list(range(1, n + 1))
        self.max_ttl = max_ttl
        self.say = say
        self.sandbox: Sandbox | None = None
        self.toxiproxy: ToxiproxyServer | None = None
        self.proxies: list[Proxy] = []
        self.kubeconfig = workdir / "kubeconfig"
        self.config = workdir / "config" / "config.yaml"
        self.namespace = "torture-" + secrets.token_hex(3)

    def start(self) -> None:
        import coordinator_sandbox as sb
        from faults.toxiproxy import ToxiproxyServer

        sandbox_dir = self.workdir / "sandbox"
        self.sandbox = sb.Sandbox(sandbox_dir)  # known before start-up, to be stopped even if it fails
        total = self.n + self.spares
        ha = (
            f", {self.apiservers} kube-apiservers each (date offset {self.date_offset:g}s)"
            if self.apiservers > 1
            else ""
        )
        self.say(f"starting {total} sandbox clusters ({self.spares} spare){ha} in {sandbox_dir}")
        ha_args: dict[str, Any] = {"apiservers": self.apiservers, "date_offset": self.date_offset}
        # Every Lease write goes to an audit log, read when a check fails (faults.audit);
        # a sandbox of an older commit has no audit switch.
        audit: dict[str, Any] = {"audit": True} if "audit" in inspect.signature(sb.up).parameters else {}
        sb.up(
            total,
            sandbox_dir,
            on_progress=lambda msg: self.say(f"sandbox: {msg}"),
            **(ha_args if self.apiservers > 1 else {}),  # (older sandboxes start one kube-apiserver only)
            **audit,
        )
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.toxiproxy = ToxiproxyServer.start(log_path=self.workdir / "logs" / "toxiproxy.log")
        for c in self.sandbox.record.clusters:
            self.proxies.append(self.toxiproxy.create_proxy(f"apiserver-{c.index}", ("127.0.0.1", c.apiserver_port)))
        self._write_kubeconfig()
        self._connect()

    def _write_kubeconfig(self) -> None:
        import yaml

        assert self.sandbox is not None
        doc = yaml.safe_load(self.sandbox.kubeconfig.read_text())
        ports = {f"sandbox-{i}": proxy.port for i, proxy in enumerate(self.proxies, start=1)}
        for entry in doc["clusters"]:
            entry["cluster"]["server"] = f"https://127.0.0.1:{ports[entry['name']]}"
        fd = os.open(self.kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(doc, fh, sort_keys=False)

    def _connect(self) -> None:
        import anyio

        from coordinator.config.store import ConfigStore
        from coordinator.engine.clusters import ClusterSet
        from coordinator.ops.admin import connect_cluster, create_deployment

        store = ConfigStore(self.config)
        names = [f"c{i}" for i in range(1, self.n + 1)]
        spares = [f"c{i}" for i in range(self.n + 1, self.n + self.spares + 1)]

        extra: dict[str, Any] = {}
        if "max_ttl_s" in inspect.signature(create_deployment).parameters:
            extra["max_ttl_s"] = self.max_ttl  # how long a vanished Lease blocks the lock

        async def setup() -> None:
            for i, name in enumerate(names + spares, start=1):
                await connect_cluster(store, name, f"sandbox-{i}", str(self.kubeconfig), timeout=15)
            cs = ClusterSet(store.load(), timeout=15)
            try:
                await create_deployment(store, cs, DEPLOYMENT, self.namespace, names, "configmap", **extra)
            finally:
                await cs.aclose()

        anyio.run(setup)
        # A spare is prepared as an operator would before adding it: the namespace exists.
        assert self.sandbox is not None
        for i in range(self.n + 1, self.n + self.spares + 1):
            self.sandbox.admin(i, timeout=15).create(
                "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
            )
        extra_text = f"; spares {', '.join(spares)}" if spares else ""
        where = f"on {', '.join(names)}{extra_text}"
        self.say(f"deployment {DEPLOYMENT} in namespace {self.namespace} {where} (through toxiproxy)")

    def read_members(self) -> tuple[list[int], list[int] | None]:
        """The members (and the joint target, if a change is in progress) that the local
        config records, as cluster indices."""
        from coordinator.config.store import ConfigStore

        rec = ConfigStore(self.config).load().deployments[DEPLOYMENT]
        members = sorted(int(name[1:]) for name in rec.clusters)
        joint = sorted(int(name[1:]) for name in rec.joint) if rec.joint is not None else None
        return members, joint

    def ha_summary(self) -> str:
        """For HA clusters: the requests each kube-apiserver served through the front
        proxy, and how many time stamps the skewed one's answers had shifted."""
        if self.apiservers < 2 or self.sandbox is None:
            return ""
        served, shifted = [], 0
        for i in range(1, self.n + self.spares + 1):
            try:
                stats = self.sandbox.proxy_stats(i)
            except Exception as err:  # the report says so; the run itself is judged elsewhere
                served.append(f"c{i} unknown ({type(err).__name__})")
                continue
            served.append(f"c{i} " + "/".join(str(b["requests"]) for b in stats["backends"]))
            shifted += int(stats.get("stamps_rewritten", 0))
        return (
            f"HA: {self.apiservers} kube-apiservers per cluster, one {self.date_offset:+g}s off; requests served "
            f"{', '.join(served)}; {shifted} time stamps shifted"
        )

    def heal(self) -> None:
        if self.toxiproxy is not None and self.toxiproxy.running:
            self.toxiproxy.reset()
        if self.sandbox is not None and self.sandbox.exists:
            self.sandbox.heal()

    def stop(self) -> None:
        try:
            if self.toxiproxy is not None:
                self.toxiproxy.stop()
        finally:
            if self.sandbox is not None:
                self.sandbox.down(grace=5.0)


# ------------------------------------------------------------------------ processes


@dataclass
class Worker:
    spec: ContenderSpec
    generation: int
    proc: subprocess.Popen[str]
    log: IO[bytes]
    reader: threading.Thread | None = None
    killed: bool = False
    paused: bool = False
    done: bool = False
    reaped: bool = False

    @property
    def instance(self) -> str:
        return f"{self.spec.name}g{self.generation}"


class Workers:
    """The contender processes: started, watched, frozen, killed, replaced, stopped."""

    def __init__(self, opts: TortureOptions, rig: Rig, recorder: Recorder, deadline: float, say: Progress) -> None:
        self.opts = opts
        self.rig = rig
        self.recorder = recorder
        self.deadline = deadline
        self.say = say
        self.stop_file = rig.workdir / "stop"
        self.hold_off_file = rig.workdir / "hold-off"
        self.all: list[Worker] = []
        self.live: dict[str, Worker] = {}  # spec name -> current worker
        self.faketime = shutil.which("faketime")

    def _environ(self, instance: str, config: Path) -> dict[str, str]:
        import coordinator

        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("COORDINATOR_LOCK_ID", "COORDINATOR_HOLDER", "COORDINATOR_CONFIG", "COORDINATOR_TIMEOUT")
            and not k.startswith(("FAKETIME", "LD_PRELOAD"))
        }
        root = str(Path(coordinator.__file__).resolve().parent.parent)
        env.update(
            {
                "COORDINATOR_CONFIG": str(config),
                "KUBECONFIG": str(self.rig.kubeconfig),
                "COORDINATOR_TIMEOUT": f"{self.opts.request_timeout:g}s",
                "XDG_STATE_HOME": str(config.parent / "state"),
                "NO_COLOR": "1",
                "PYTHONUNBUFFERED": "1",
                # the package, and this harness (tests/faults) for the contender processes
                "PYTHONPATH": os.pathsep.join(p for p in (root, TESTS_DIR, os.environ.get("PYTHONPATH")) if p),
            }
        )
        return env

    def config_for(self, home: Path) -> Path:
        """The config file a process living in ``home`` uses."""
        if self.opts.member_changes:
            return self.rig.config
        config = home / "config.yaml"
        if not config.exists():
            shutil.copyfile(self.rig.config, config)
        return config

    def spawn(self, spec: ContenderSpec, generation: int = 0) -> Worker:
        instance = f"{spec.name}g{generation}"
        home = self.rig.workdir / "contenders" / instance
        home.mkdir(parents=True, exist_ok=True)
        # Each contender is its own machine: its own copy of the config and lock records.
        # While members change, all of them are one machine, the one that makes the
        # changes: they share its config, which each change updates (a waiting acquire
        # follows it; the others read it again when told their record is out of date).
        config = self.config_for(home)
        prefix: list[str] = []
        if spec.faketime:
            if self.faketime is None:
                self.say(f"faketime is not installed: {instance} runs on the real clock")
            else:
                prefix = [self.faketime, "-f", spec.faketime]
        command = [
            *prefix, sys.executable, "-m", "faults.contenders", "worker",
            "--name", spec.name, "--generation", str(generation), "--mode", spec.mode,
            "--ttl", f"{spec.ttl:g}", "--wait", f"{self.opts.wait:g}", "--deployment", DEPLOYMENT,
            "--stop-file", str(self.stop_file), "--deadline", f"{self.deadline:.3f}",
            "--seed", str(self.opts.seed), "--timeout", f"{self.opts.request_timeout:g}",
            *(["--member-changes", "--hold-off-file", str(self.hold_off_file)] if self.opts.member_changes else []),
        ]  # fmt: skip
        log = (self.rig.workdir / "logs" / f"{instance}.log").open("ab")
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self._environ(instance, config),
            cwd=home,
            start_new_session=True,  # its own process group: it and its commands are signalled together
        )
        worker = Worker(spec, generation, proc, log)
        worker.reader = threading.Thread(target=self._read, args=(worker,), name=f"events-{instance}", daemon=True)
        self.all.append(worker)
        self.live[spec.name] = worker
        worker.reader.start()
        clock = f", faketime {spec.faketime}" if prefix else ""
        self.say(f"started {spec.mode} contender {instance} (ttl {spec.ttl:g}s{clock})")
        return worker

    def _read(self, worker: Worker) -> None:
        assert worker.proc.stdout is not None
        for line in worker.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("ev") == "done":
                worker.done = True
            self.recorder.handle(worker.instance, event)

    def _signal(self, worker: Worker, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.proc.pid, sig)

    def _reap(self, worker: Worker, how: str, when: float | None = None) -> None:
        worker.proc.wait(timeout=30)
        stamp = machine_clock() if when is None else when
        if worker.reader is not None:
            worker.reader.join(timeout=15)
        worker.log.close()
        worker.reaped = True
        self.recorder.gone(worker.instance, stamp, how)

    def start_all(self) -> None:
        for spec in self.opts.contenders:
            self.spawn(spec)

    def holder_inside(self, rng: random.Random, within: float) -> Worker | None:
        """A contender inside its critical section right now (waiting up to ``within``)."""
        until = machine_clock() + within
        while True:
            inside = set(self.recorder.holders_inside())
            candidates = [
                w for w in self.live.values() if w.instance in inside and not w.paused and w.proc.poll() is None
            ]
            if candidates:
                return rng.choice(candidates)
            if machine_clock() >= until:
                return None
            time.sleep(0.05)

    def kill(self, worker: Worker) -> None:
        worker.killed = True
        self._signal(worker, signal.SIGKILL)
        worker.proc.wait(timeout=30)
        self._reap(worker, "killed", machine_clock())

    def replace(self, worker: Worker) -> Worker:
        return self.spawn(worker.spec, worker.generation + 1)

    def pause(self, worker: Worker) -> None:
        worker.paused = True
        self._signal(worker, signal.SIGSTOP)

    def resume(self, worker: Worker) -> None:
        self._signal(worker, signal.SIGCONT)
        worker.paused = False

    def check(self, replace: bool) -> None:
        """Notice contenders that ended on their own; a crash is a problem (and replaced)."""
        for worker in list(self.live.values()):
            if worker.reaped or worker.proc.poll() is None:
                continue
            self._reap(worker, "vanished")
            if not worker.done:
                self.recorder.problem(
                    f"{worker.instance}: the contender process ended unexpectedly (exit "
                    f"{worker.proc.returncode}); see {self.rig.workdir / 'logs' / (worker.instance + '.log')}"
                )
                if replace:
                    self.replace(worker)

    def stop_all(self, grace: float) -> None:
        self.stop_file.touch()
        for worker in self.live.values():
            if worker.paused:
                self.resume(worker)
        until = machine_clock() + grace
        while machine_clock() < until and any(w.proc.poll() is None for w in self.live.values()):
            time.sleep(0.2)
        for worker in self.live.values():
            if worker.reaped:
                continue
            if worker.proc.poll() is None:
                self.say(f"{worker.instance} did not stop within {grace:g}s: SIGKILL")
                self.kill(worker)
            else:
                self._reap(worker, "vanished")
                if not worker.done:
                    self.recorder.problem(
                        f"{worker.instance}: the contender process ended without finishing (exit "
                        f"{worker.proc.returncode}); see its log in {self.rig.workdir / 'logs'}"
                    )

    def kill_everything(self) -> None:
        """Last resort on the way out: no contender outlives the harness."""
        for worker in self.all:
            if worker.proc.poll() is None:
                self._signal(worker, signal.SIGCONT)
                self._signal(worker, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(timeout=10)
            with contextlib.suppress(Exception):
                worker.log.close()
