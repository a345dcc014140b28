"""Turns survive a dead waiter: the line keeps the order of the live waiters.

Against real API servers. The live waiters run in this process (the Python API, each
started clearly later than the one before, so that the servers' whole-second clocks order
them); the waiters that die are `lock acquire --wait` processes of their own, SIGKILLed
while they wait, so that nothing of theirs is withdrawn or released.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import anyio
import pytest
from coord_fixtures import COMMIT_TIMEOUT_S
from helpers.cli import StreamReader

from coordinator.engine.lock.core import EngineCore
from coordinator.ops.api import Coordinator
from coordinator.rules.lease import A_NEXT, LINE_MANAGER, TurnClaim, lock_id_of
from coordinator.rules.resources import lease_path

pytestmark = pytest.mark.integration

HOLD_TTL = 120  # longer than any of these scenarios: no lease lapses by itself


class Line:
    """Waiters in this process, started one by one; each holds the lock, once it has it,
    until the test lets it go."""

    def __init__(self, c: Coordinator, tg: Any) -> None:
        self.c = c
        self.tg = tg
        self.got_send, self.got = anyio.create_memory_object_stream[str](16)
        self.go: dict[str, anyio.Event] = {}

    async def join(self, name: str) -> None:
        """Start waiter ``name`` and return once it has begun waiting (its place in line
        is the servers' time of its first read), plus a second and a bit, so that whoever
        joins next began waiting in a later second."""
        waiting = anyio.Event()
        self.go[name] = anyio.Event()

        def on_wait(_: Any, __: float) -> None:
            waiting.set()

        async def run() -> None:
            res = await self.c.acquire("web", ttl=HOLD_TTL, holder=name, wait=150, on_wait=on_wait)
            await self.got_send.send(name)
            await self.go[name].wait()
            await self.c.release("web", res.lock_id)

        self.tg.start_soon(run)
        with anyio.fail_after(30):
            await waiting.wait()
        await anyio.sleep(1.2)

    async def next_holder(self, so_far: list[str], timeout: float = 40) -> str:
        """The next of these waiters to get the lock; fails saying who holds it instead."""
        with anyio.move_on_after(timeout):
            return await self.got.receive()
        st = await self.c.status("web")
        raise AssertionError(f"after {so_far}, no waiter of this process got the lock: it is held by {st.holder}")


def _start_doomed(env: Any, name: str) -> subprocess.Popen[str]:
    """A waiter in a process of its own; returns once it has begun waiting (its first
    report on stderr), plus a second and a bit, as :meth:`Line.join`."""
    proc = env.popen(
        "lock", "acquire", "web", "--holder", name, "--ttl", str(HOLD_TTL), "--wait", "150s",
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    reader = StreamReader(proc.stderr, "waiting for web")
    assert reader.wait_marker(60), f"{name} did not begin waiting: {reader.text()!r}"
    time.sleep(1.2)
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


async def _until_next_in_line(c: Coordinator, name: str, timeout: float = 60) -> None:
    """Until `lock status` names ``name`` as next in line."""
    seen = None
    with anyio.fail_after(timeout):
        while True:
            st = await c.status("web")
            seen = st.next_in_line.holder if st.next_in_line is not None else None
            if seen == name:
                return
            await anyio.sleep(0.3)


@pytest.mark.parametrize("dead", [1, 2])
def test_the_oldest_live_waiter_goes_next_when_the_heads_of_the_line_died(dep3: Any, dead: int) -> None:
    """Line: ``dead`` doomed waiters, then w1, w2, w3, w4. The doomed ones are killed while
    the holder still holds (the first of them is what `lock status` names as next in line)
    and the holder releases at once: the live waiters get the lock in the order they began
    waiting."""
    doomed: list[subprocess.Popen[str]] = []

    async def scenario() -> list[str]:
        order: list[str] = []
        async with dep3.api() as c:
            held = await c.acquire("web", ttl=HOLD_TTL, holder="holder")
            async with anyio.create_task_group() as tg:
                line = Line(c, tg)
                for i in range(1, dead + 1):
                    doomed.append(await anyio.to_thread.run_sync(_start_doomed, dep3, f"doomed{i}"))
                live = ["w1", "w2", "w3", "w4"]
                for name in live:
                    await line.join(name)
                await _until_next_in_line(c, "doomed1")
                for proc in doomed:
                    _kill(proc)
                await c.release("web", held.lock_id)
                for _ in live:
                    name = await line.next_holder(order)
                    order.append(name)
                    line.go[name].set()
        return order

    try:
        order = anyio.run(scenario)
    finally:
        for proc in doomed:
            _kill(proc)
    assert order == ["w1", "w2", "w3", "w4"], order


def test_a_head_that_dies_later_in_the_line_is_skipped_too(dep3: Any) -> None:
    """Line: doomed1, w1, w2, doomed2, w3, w4. doomed1 dies before the first release;
    doomed2 once it is next in line behind w2, who then holds the lock. Both times the
    oldest live waiter goes next."""
    doomed: list[subprocess.Popen[str]] = []

    async def scenario() -> list[str]:
        order: list[str] = []
        async with dep3.api() as c:
            held = await c.acquire("web", ttl=HOLD_TTL, holder="holder")
            async with anyio.create_task_group() as tg:
                line = Line(c, tg)
                doomed.append(await anyio.to_thread.run_sync(_start_doomed, dep3, "doomed1"))
                await line.join("w1")
                await line.join("w2")
                doomed.append(await anyio.to_thread.run_sync(_start_doomed, dep3, "doomed2"))
                await line.join("w3")
                await line.join("w4")
                await _until_next_in_line(c, "doomed1")
                _kill(doomed[0])
                await c.release("web", held.lock_id)
                for _ in range(4):
                    name = await line.next_holder(order)
                    order.append(name)
                    if name == "w2":
                        await _until_next_in_line(c, "doomed2")
                        _kill(doomed[1])
                    line.go[name].set()
        return order

    try:
        order = anyio.run(scenario)
    finally:
        for proc in doomed:
            _kill(proc)
    assert order == ["w1", "w2", "w3", "w4"], order


def test_status_names_the_live_next_waiter_once_the_dead_ones_claim_lapsed(dep3: Any) -> None:
    """doomed, then w1 and w2 wait; doomed is killed. `lock status -o json` names w1 as
    next in line once doomed's claim has gone unrefreshed too long, and w1 then w2 get
    the lock."""
    doomed: list[subprocess.Popen[str]] = []

    def next_in_line() -> Any:
        out = dep3.cli("lock", "status", "web", "-o", "json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["next_in_line"]

    async def scenario() -> tuple[Any, Any, list[str]]:
        order: list[str] = []
        async with dep3.api() as c:
            held = await c.acquire("web", ttl=HOLD_TTL, holder="holder")
            async with anyio.create_task_group() as tg:
                line = Line(c, tg)
                doomed.append(await anyio.to_thread.run_sync(_start_doomed, dep3, "doomed"))
                await line.join("w1")
                await line.join("w2")
                before = await anyio.to_thread.run_sync(next_in_line)
                _kill(doomed[0])
                after = None
                with anyio.move_on_after(60):
                    while after is None or after.get("holder") != "w1":
                        await anyio.sleep(0.5)
                        after = await anyio.to_thread.run_sync(next_in_line)
                await c.release("web", held.lock_id)
                for _ in range(2):
                    name = await line.next_holder(order)
                    order.append(name)
                    line.go[name].set()
        return before, after, order

    try:
        before, after, order = anyio.run(scenario)
    finally:
        for proc in doomed:
            _kill(proc)
    assert before is not None and before["holder"] == "doomed", before
    assert after is not None and after["holder"] == "w1", after
    assert order == ["w1", "w2"], order


def test_claims_written_during_a_release_do_not_make_it_fail(dep3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six times in a row, a waiter's claim lands on one member's lease between the
    holder's read of it and the release decided on that read, so that six release writes
    lose their race: the release still frees the lease (a race lost to the line alone
    costs no attempt)."""
    path = lease_path(dep3.namespace, f"coordinator-lock-{dep3.deployment}")
    claimed: list[str] = []
    target: list[str] = []  # the member whose release is raced: the first one read as ours
    real_read = EngineCore.read
    lock: dict[str, str] = {}

    async def read_then_claim(self: EngineCore, cluster: str) -> Any:
        view = await real_read(self, cluster)
        if not target and view.lock_id == lock["id"]:
            target.append(cluster)
        if target == [cluster] and view.lock_id == lock["id"] and len(claimed) < 6:
            name = f"w{len(claimed) + 1}"
            claimed.append(name)
            client = dep3.client(int(cluster.removeprefix("c")))
            try:
                lease = (await client.request("GET", path)).body
                ann = lease["metadata"].setdefault("annotations", {})
                since = int(time.time()) - 10 + len(claimed)
                ann[A_NEXT] = TurnClaim(since, f"lock-{name}", name, since).dump()
                await client.request("PUT", path, body=lease, query={"fieldManager": LINE_MANAGER})
            finally:
                await client.close()
        return view

    async def scenario() -> tuple[Any, str | None, list[str]]:
        # Six raced rounds on one member (each a claim over a connection of its own) in one
        # release: more than the suite's 3 s on a machine running a second suite.
        async with dep3.api(timeout=COMMIT_TIMEOUT_S) as c:
            held = await c.acquire("web", ttl=HOLD_TTL, holder="holder")
            lock["id"] = held.lock_id
            monkeypatch.setattr(EngineCore, "read", read_then_claim)
            try:
                out = await c.release("web", held.lock_id)
            finally:
                monkeypatch.setattr(EngineCore, "read", real_read)
            assert target, out
            lease = await dep3.raw(int(target[0].removeprefix("c")), "GET", path)
            return out["results"][target[0]], lock_id_of(lease["spec"].get("holderIdentity")), claimed

    raced, holder, seen = anyio.run(scenario)
    assert raced.ok and raced.extra.get("ours"), (raced.outcome, raced.detail, seen)
    assert holder is None
    assert seen == ["w1", "w2", "w3", "w4", "w5", "w6"], seen
