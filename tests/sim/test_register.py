"""Any interleaving of writes (partial, rejected, with lost answers, abandoned), reads and
new lock holders, over 3 and 5 clusters, stays linearizable; no stamp ever names two
documents; a read never returns an older value than one returned or confirmed before it
began; a write that begins after another one sent data is ordered after it.

The engine is coordinator's own (``StateClient`` through ``Coordinator``) on in-memory
API servers; each request to a state object is delivered one at a time, in an order and
with a fate the test draws (sim/registers.py, sim/stepped.py).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.registers import Chooser, Registers, simulate
from sim.stepped import DOWN, REJECTS_WRITES, UP

pytestmark = pytest.mark.unit


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), n=st.sampled_from([3, 5]))
def test_any_history_hypothesis_draws(data: st.DataObject, n: int) -> None:
    """Hypothesis draws every choice, so that a failing history shrinks to a short one.
    Sixty examples find less than the seeded histories below (neither planted bug named
    there was found in 200); what this adds is the shrinking, once one fails."""

    def draw(k: int, label: str) -> int:
        return data.draw(st.integers(0, k - 1), label=label)

    simulate(n, 0, Chooser(draw).history).check()


@pytest.mark.parametrize(("n", "count"), [(3, 100), (5, 40)])
def test_seeded_random_histories(n: int, count: int) -> None:
    """The same histories under a seeded random schedule: a fixed number (a count, not a
    time budget: on a busy machine the test takes longer and checks as much), which
    reaches interleavings Hypothesis's few examples take long to find. Two bugs put back
    by hand fail here: a read that returns a value without repairing it onto a majority
    (linearizability, seed 15 over 3 clusters), and data sent after a promise that
    reached no majority (a write ordered below one whose data went out before it began:
    seed 18 over 3 clusters, 52 over 5)."""
    for seed in range(count):
        regs = simulate(n, seed, Chooser.seeded(random.Random(f"register-{n}-{seed}")).history)
        try:
            regs.check()
        except AssertionError as err:
            raise AssertionError(f"seed {seed}: {err}") from None


# ------------------------------------------------------------------ scenarios, step by step


@pytest.mark.parametrize("rejects", ["every update", "data only"])
def test_a_write_rejected_on_a_majority_never_flips_a_read(rejects: str) -> None:
    """Version 1 everywhere; a write rejected on c2 and c3 (c1 takes it, or only its
    promise); with c1 away, a write confirmed on c2 and c3; c1 back. Whichever majority
    a read hears, it returns the confirmed write, and never flips."""

    async def body(h: Registers) -> None:
        assert (await h.run(h.write("p0", "3"))).status == "ok"
        four = h.write("p0", "4")
        if rejects == "every update":
            h.net.modes["c2"] = h.net.modes["c3"] = REJECTS_WRITES
        else:  # an admission policy that lets the promise through and turns the data away
            for server in (0, 1, 2):
                assert await h.step(four, server=server, method="GET")
            for server in (0, 1, 2):
                assert await h.step(four, server=server, method="PUT")
            h.net.modes["c2"] = h.net.modes["c3"] = REJECTS_WRITES
        await h.settle(four)
        assert four.status == ("fail" if rejects == "every update" else "unknown"), four.error
        h.net.modes["c2"] = h.net.modes["c3"] = UP
        h.net.modes["c1"] = DOWN
        five = await h.run(h.write("p0", "5"))
        assert five.status == "ok", five.error
        if four.data_sent_at is not None:  # c2 and c3 hold the promise of 4: 5 is ordered after it
            assert four.stamp is not None and five.stamp is not None and five.stamp > four.stamp
            assert five.stamp.version == four.stamp.version + 1
        h.net.modes["c1"] = UP
        for away in ("c1", None, "c2", "c3", "c1", None):
            if away is not None:
                h.net.modes[away] = DOWN
            read = await h.run(h.read("reader"))
            assert (read.status, read.value) == ("ok", "5"), (away, read.error)
            if away is not None:
                h.net.modes[away] = UP

    simulate(3, 0, body).check()


def test_a_read_writes_back_before_returning() -> None:
    """A write in flight has reached c1 only. A read that hears c1 returns it and must
    put it on a majority first: a later read that hears only c2 and c3 returns it too."""

    async def body(h: Registers) -> None:
        assert (await h.run(h.write("p0", "old"))).status == "ok"
        new = h.write("p1", "new")
        for method in ("GET", "PUT"):  # its reads, then its promises, everywhere
            for server in (0, 1, 2):
                assert await h.step(new, server=server, method=method)
        assert await h.step(new, server=0, method="PUT")  # the data, on c1 only; the rest in flight
        assert new.data_sent_at is not None
        first = h.read("r1")
        assert await h.step(first, server=0)
        assert await h.step(first, server=1)
        await h.settle(first)
        assert (first.status, first.value) == ("ok", "new"), first.error
        second = h.read("r2")
        h.net.modes["c1"] = DOWN  # it hears only c2 and c3
        await h.settle(second)
        assert (second.status, second.value) == ("ok", "new"), second.error
        h.net.modes["c1"] = UP
        await h.settle(new)

    simulate(3, 0, body).check()


def test_a_stale_holder_is_fenced_even_where_it_cannot_see_the_new_one() -> None:
    """Holder 2 took the lock and wrote with c1 down (its token is on c2 and c3); holder 1
    (token 1) then reads c1 and c2 and is refused: nothing of its write is sent."""

    async def body(h: Registers) -> None:
        assert (await h.run(h.write("p0", "a"))).status == "ok"
        h.net.modes["c1"] = DOWN
        took = await h.run(h.take_the_lock("p1"))
        assert took.status == "ok" and took.token == 2, took.error
        assert (await h.run(h.write("p1", "b"))).status == "ok"
        h.net.modes["c1"] = UP
        h.net.modes["c3"] = DOWN
        late = await h.run(h.write("p0", "late"))
        assert late.token == 1 and late.status == "fail" and late.drawn is None, late.error
        h.net.modes["c3"] = UP
        assert (await h.run(h.read("r"))).value == "b"

    simulate(3, 0, body).check()


def test_a_writer_that_read_the_leases_before_a_new_holder_sends_no_data() -> None:
    """Write a is on c2 and c3. A token-1 writer reads the leases (token 1) and sends its
    reads of the state; meanwhile holder 2 takes the lock (its token floor on c2 and c3,
    c1 turning writes away) and promises on c3. With c2 down, the token-1 writer hears c1
    (which never took a, nor the floor) and c3: it promises on both, c3 refuses (its
    promise is token 2's), and with one promise of the two it needs, no data goes out.
    (Which refusal comes first depends on the interleaving of its reads with holder 2's
    promise and lease: it may stop at its read already, c3's promise being above every
    token it saw, or a newer holder's; either way no data goes out.)"""

    async def body(h: Registers) -> None:
        h.net.modes["c1"] = REJECTS_WRITES
        a = await h.run(h.write("p0", "a"))
        assert a.status == "ok", a.error
        late = h.write("p1", "late")
        await h.step()  # its leases read (token 1), its reads of the state on the wire
        took = await h.run(h.take_the_lock("p2"))
        assert took.status == "ok" and took.token == 2, took.error
        new = h.write("p2", "new")
        for server in (0, 1, 2):
            assert await h.step(new, server=server, method="GET")
        assert await h.step(new, server=2, method="PUT")  # its promise, on c3
        h.net.modes["c1"] = UP
        h.net.modes["c2"] = DOWN
        await h.settle(late)
        assert late.status == "fail" and late.data_sent_at is None, late.error
        if late.drawn is not None:
            # it drew its stamp, promised on c1 and c3, and c3 refused (token 2's promise)
            assert new.drawn is not None and late.drawn < new.drawn, late.error
            assert late.error.startswith("exit 6:") and "c3: conflict" in late.error, late.error
        else:
            # or it stopped at its read: c3's promise names token 2, above every token
            # the leases it read have seen, and c1's seeded object alone is no majority;
            # or, where its lease reads heard token 2, c3's promise is a newer holder's
            suspect = late.error.startswith("exit 4:") and "c3: suspect" in late.error
            newer = (
                late.error.startswith("exit 6:") and "fencing token 2, higher than this lock's token 1" in late.error
            )
            assert suspect or newer, late.error
        await h.settle(new)
        assert new.status == "ok", new.error
        h.net.modes["c2"] = UP
        assert (await h.run(h.read("r"))).value == "new"

    simulate(3, 0, body).check()
