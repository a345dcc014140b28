"""A command's requests to one cluster share one connection: counted at a TCP forwarder
put between the client and each sandbox API server (TLS passes through it untouched)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from coord_fixtures import UNHURRIED, Env

pytestmark = pytest.mark.integration


class Forwarder:
    """One listening port per upstream; counts the connections it accepts."""

    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        self.upstreams = upstreams
        self.accepted = [0] * len(upstreams)
        self.ports: list[int] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def start() -> None:
            for i in range(len(upstreams)):
                server = await asyncio.start_server(lambda r, w, i=i: self._pipe(i, r, w), "127.0.0.1", 0)
                self.ports.append(server.sockets[0].getsockname()[1])
            ready.set()

        def run() -> None:
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    async def _pipe(self, i: int, reader: Any, writer: Any) -> None:
        self.accepted[i] += 1
        up_reader, up_writer = await asyncio.open_connection(*self.upstreams[i])

        async def copy(src: Any, dst: Any) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_each_command_opens_one_connection_per_cluster(dep3: Env, tmp_path: Path) -> None:
    kubeconfig = yaml.safe_load(Path(dep3.kubeconfig).read_text())
    servers = [dep3.sandbox.server(i) for i in range(1, 4)]
    fw = Forwarder([(s.removeprefix("https://").rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])) for s in servers])
    try:
        for entry in kubeconfig["clusters"]:
            if entry["cluster"]["server"] in servers:
                port = fw.ports[servers.index(entry["cluster"]["server"])]
                entry["cluster"]["server"] = f"https://127.0.0.1:{port}"  # the serving cert has SAN 127.0.0.1
        forwarded = tmp_path / "kubeconfig"
        forwarded.write_text(yaml.safe_dump(kubeconfig))
        config = yaml.safe_load(dep3.config.read_text())
        for record in config["clusters"].values():
            record["kubeconfig"] = str(forwarded)  # same contexts, reached through the forwarder
        config_path = tmp_path / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        seen = {}
        for args in (
            ("lock", "acquire", dep3.deployment, "--ttl", "60"),
            ("state", "set", dep3.deployment, "replicas:=3"),
            ("lock", "status", dep3.deployment),
            ("lock", "release", dep3.deployment),
        ):
            fw.accepted = [0, 0, 0]
            # a request that times out under a loaded machine closes its connection, and
            # the next one opens another: give every answer the time it needs
            proc = dep3.cli(*args, env={**UNHURRIED, "COORDINATOR_CONFIG": str(config_path)})
            assert proc.returncode == 0, f"{args}: {proc.stderr}"
            seen[args[:2]] = list(fw.accepted)
    finally:
        fw.stop()
    assert seen == {k: [1, 1, 1] for k in seen}, seen  # {command: connections accepted per cluster}
