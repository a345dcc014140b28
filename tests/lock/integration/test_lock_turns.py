"""Waiters take turns: the one that has waited longest gets the lock next.

Against real API servers: the claims live in the leases' annotations, so every
contender, in any process, sees the same line.
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

from coordinator.errors import LockHeldError
from coordinator.rules.lease import A_NEXT, lock_id_of
from coordinator.rules.resources import lease_path

pytestmark = pytest.mark.integration


async def _claims(env: Any) -> list[dict[str, Any] | None]:
    """The next-turn claim on every member's lease (None where there is none)."""
    out: list[dict[str, Any] | None] = []
    for i in range(1, len(env.clusters) + 1):
        lease = await env.raw(i, "GET", lease_path(env.namespace, f"coordinator-lock-{env.deployment}"))
        raw = (lease["metadata"].get("annotations") or {}).get(A_NEXT)
        out.append(json.loads(raw) if raw else None)
    return out


async def _lock_id_on(env: Any, index: int) -> str | None:
    lease = await env.raw(index, "GET", lease_path(env.namespace, f"coordinator-lock-{env.deployment}"))
    return lock_id_of(lease["spec"].get("holderIdentity"))


async def _until_claimed_by(env: Any, holder: str, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while True:
            claims = await _claims(env)
            if all(c is not None and c["holder"] == holder for c in claims):
                return
            await anyio.sleep(0.1)


def test_waiters_get_the_lock_in_the_order_they_began_waiting(dep3: Any) -> None:
    """The holder releases and at once tries again: the lock goes to the oldest waiter,
    then to the next one, never back to the one that just let it go."""
    order: list[str] = []

    async def scenario() -> list[str]:
        async with dep3.api() as c:
            held = await c.acquire("web", ttl=30, holder="first")

            done = {"early": anyio.Event(), "late": anyio.Event()}
            got = {"early": anyio.Event(), "late": anyio.Event()}

            async def waiter(name: str) -> None:
                res = await c.acquire("web", ttl=30, holder=name, wait=40)
                order.append(name)
                got[name].set()
                await done[name].wait()
                await c.release("web", res.lock_id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter, "early")
                await _until_claimed_by(dep3, "early")
                await anyio.sleep(1.2)  # the servers' clocks tick in whole seconds
                tg.start_soon(waiter, "late")
                await anyio.sleep(1.0)
                # The line is recorded on every cluster, and a later waiter does not jump it.
                claims = await _claims(dep3)
                assert [x["holder"] if x else None for x in claims] == ["early"] * 3, claims
                await c.release("web", held.lock_id)
                # Back at once, without waiting: the lock is reserved or already handed on.
                with pytest.raises(LockHeldError) as err:
                    await c.acquire("web", ttl=30, holder="first")
                assert "early" in str(err.value), str(err.value)
                done["early"].set()
                with anyio.fail_after(20):
                    await got["late"].wait()
                done["late"].set()
        return order

    assert anyio.run(scenario) == ["early", "late"]


def test_claim_of_a_vanished_waiter_lapses(dep3: Any) -> None:
    """A waiter killed in line holds the next turn only for the grace period."""

    async def arrange() -> str:
        async with dep3.api() as c:
            return (await c.acquire("web", ttl=30, holder="holder")).lock_id

    lock_id = anyio.run(arrange)
    waiter = dep3.popen(
        "lock", "acquire", "web", "--holder", "doomed", "--wait", "60s",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        anyio.run(_until_claimed_by, dep3, "doomed")
        time.sleep(1.2)  # whoever waits next has begun waiting clearly later (whole-second stamps)
    finally:
        os.killpg(waiter.pid, signal.SIGKILL)
        waiter.wait()

    async def scenario() -> tuple[str, float, list[dict[str, Any] | None]]:
        async with dep3.api() as c:
            await c.release("web", lock_id)
            with pytest.raises(LockHeldError) as err:
                await c.acquire("web", ttl=30, holder="next")
            started = time.monotonic()
            res = await c.acquire("web", ttl=30, holder="next", wait=30)
            waited = time.monotonic() - started
            claims = await _claims(dep3)
            held = [await _lock_id_on(dep3, i) == res.lock_id for i in (1, 2, 3)]
            await c.release("web", res.lock_id)
            return str(err.value), waited, list(zip(held, claims, strict=True))

    report, waited, seen = anyio.run(scenario)
    assert "next turn is doomed's" in report, report
    assert waited < 10, waited  # the grace (2 s, whole-second stamps), not the whole --wait
    # The taker cleared the stale claim wherever it took the lease: a majority at least. A
    # member whose take came too late (a straggler under load) keeps the claim, which lapses
    # by itself after the grace.
    assert sum(held for held, _ in seen) >= 2, seen
    assert all(claim is None for held, claim in seen if held), seen


def test_waiter_that_gives_up_withdraws_its_claim(dep3: Any) -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        async with dep3.api() as c:
            held = await c.acquire("web", ttl=30, holder="holder")
            async with anyio.create_task_group() as tg:

                async def impatient() -> None:
                    with pytest.raises(LockHeldError):
                        await c.acquire("web", ttl=30, holder="impatient", wait=12)  # seen in line even under load

                tg.start_soon(impatient)
                await _until_claimed_by(dep3, "impatient")
                during = await _claims(dep3)
        # the Coordinator has closed: background withdrawals are done
        after = await _claims(dep3)
        async with dep3.api() as c:
            await c.release("web", held.lock_id)
        return during, after

    during, after = anyio.run(scenario)
    assert all(x and x["holder"] == "impatient" for x in during), during
    assert after == [None, None, None], after
