"""The ``target`` of the conformance tests: the in-memory API server (``sim``, marked
unit) or the first cluster of the session's real sandbox (``real``, marked integration),
each with a fresh namespace (see targets.py)."""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from coordinator.kube.client import KubeClient
from sim.apiserver import World
from sim.targets import Target


@pytest.fixture(
    params=[pytest.param("sim", marks=pytest.mark.unit), pytest.param("real", marks=pytest.mark.integration)]
)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    namespace = "conf-" + secrets.token_hex(4)
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    if request.param == "sim":
        world = World(clock=lambda: datetime.now(UTC), rng=random.Random(4))
        cluster = world.cluster("c1")
        made = Target("sim", namespace, cluster=cluster)
    else:
        sandbox = request.getfixturevalue("sandbox3")
        made = Target("real", namespace, sandbox=sandbox)

    async def create(client: KubeClient) -> None:
        await client.request("POST", "/api/v1/namespaces", body=body)

    made.run(create)
    try:
        yield made
    finally:
        made.remove_policies()
