"""A sandbox of n clusters, each behind a toxiproxy proxy, connected as c1..cN; what the
rows share on it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import yaml

from coordinator.config.models import LocalConfig
from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet
from coordinator.ops.admin import connect_cluster, create_deployment
from coordinator.ops.api import Coordinator

LATENCY_MS = 100
HOLDER = "bench@local"


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

    @contextlib.contextmanager
    def only_first(self, k: int) -> Iterator[None]:
        """For a row that uses clusters 1..k only: the other clusters' kube-apiservers are
        paused (SIGSTOP) meanwhile, so that their idle work (nine control planes on two
        cores) does not weigh on a latency measured on k of them; continued afterwards."""
        rest = list(range(k + 1, len(self.names) + 1))
        paused: list[int] = []
        try:
            for i in rest:
                self.sandbox.pause(i)
                paused.append(i)
            yield
        finally:
            for i in paused:
                self.sandbox.resume(i)

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

    import coordinator_sandbox as sb

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


def fleet_deployments(r: Rig, count: int, clusters: int) -> list[str]:
    if "fleet" not in r.cache:
        r.cache["fleet"] = [r.deployment(f"f{i:02d}", r.names[:clusters]) for i in range(count)]
    return list(r.cache["fleet"])
