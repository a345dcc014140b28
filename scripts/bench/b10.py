"""B10: TCP connections per cluster opened by one command, counted at a forwarder."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.measure import (
    run_process,
)
from bench.report import TARGETS, Report, Row
from bench.rig import Rig


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
