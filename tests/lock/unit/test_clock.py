"""coordinator/clock.py: the engines read the time and draw chance from what a caller set,
and from the system's otherwise."""

from __future__ import annotations

import os
import random
import socket
from datetime import UTC, datetime

import anyio

from coordinator import clock
from coordinator.engine.lock.results import current_command, default_holder, new_lock_id, utc_now
from coordinator.engine.register import new_write_id
from coordinator.rules.lease import boot_clock


class FixedClock(clock.Clock):
    def wall(self) -> datetime:
        return datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

    def monotonic(self) -> float:
        return 42.0

    def boot(self) -> float:
        return 7.0


class Seeded(clock.Chance):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def token_hex(self, nbytes: int) -> str:
        return self.rng.randbytes(nbytes).hex()

    def fraction(self) -> float:
        return self.rng.random()


def test_the_engines_read_the_clock_and_chance_that_was_set() -> None:
    with clock.using(FixedClock(), Seeded(3)):
        assert boot_clock() == 7.0 and clock.monotonic() == 42.0
        assert utc_now() == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
        ids = (new_lock_id(), new_write_id())
    with clock.using(chance=Seeded(3)):
        assert (new_lock_id(), new_write_id()) == ids  # one seed, the same choices
        assert boot_clock() != 7.0  # the clock was not set here: the system's
    assert abs((utc_now() - datetime.now(UTC)).total_seconds()) < 60
    assert new_lock_id() != ids[0]


def test_tasks_started_inside_the_block_inherit_the_clock() -> None:
    seen: list[float] = []

    async def child() -> None:
        seen.append(boot_clock())

    async def main() -> None:
        with clock.using(FixedClock()):
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
        seen.append(boot_clock())

    anyio.run(main)
    assert seen[0] == 7.0 and seen[1] != 7.0


class Elsewhere(clock.Process):
    def host(self) -> str:
        return "box7"

    def pid(self) -> int:
        return 4242

    def user(self) -> str:
        return "ana"

    def environ(self) -> dict[str, str]:
        return {"CI_JOB_ID": "9"}

    def argv(self) -> list[str]:
        return ["/usr/bin/coordinator", "lock", "acquire", "web"]


def test_the_engines_name_the_process_that_was_set() -> None:
    """What a holder records of itself (the default holder name, the command, host and
    pid) comes from the process set, as the time does: a simulated contender is a
    process of its own, not the one that runs the simulator."""
    with clock.using(process=Elsewhere()):
        assert default_holder() == "ana@box7 ci-job:9"
        assert current_command() == "coordinator lock acquire web"
        assert (clock.host(), clock.pid()) == ("box7", 4242)
    assert clock.pid() == os.getpid() and clock.host() == socket.gethostname()


class AsModule(Elsewhere):
    def argv(self) -> list[str]:
        return ["/opt/venv/lib/python3.11/site-packages/coordinator/__main__.py", "lock", "status", "web"]


def test_a_command_run_as_python_m_coordinator_is_named_coordinator() -> None:
    """`python -m coordinator lock ...` records the command as `coordinator lock ...`, not
    as the package's __main__.py, which `lock status` would show."""
    with clock.using(process=AsModule()):
        assert current_command() == "coordinator lock status web"
