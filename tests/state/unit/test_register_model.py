"""Any interleaving of writes (partial, rejected, with lost responses, abandoned) and reads
from any majority, over 3 and 5 simulated replicas, stays linearizable; no stamp ever
names two documents; a read never returns an older stamp than one returned or confirmed
before it began; and a write that starts after another one sent data is ordered after it.

No sandbox: the replicas are in memory (tests/register_model.py), the decisions are
coordinator.register's.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from faults.checkers import check_linearizable_register
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from register_model import DELIVER, DOWN, DROP, FATES, LOSE, REJECT, REJECTS_WRITES, UP, ReadOp, Sim, WriteOp

PROCESSES = ("p0", "p1", "p2")
DELIVERY_FATES = (*[DELIVER] * 12, LOSE, LOSE, DROP, REJECT)
MAX_OPS = 10


def check_history(sim: Sim) -> None:
    """Everything the model promises, on one finished history."""
    history = sim.history()
    result = check_linearizable_register(history, initial=None, max_states=200_000)
    assert result.ok, result.summary() + "\n" + "\n".join(o.describe() for o in history)
    reads = [op for op in sim.ops if op.kind == "read" and op.status == "ok"]
    writes = [op for op in sim.ops if op.kind == "write"]
    for a in [*reads, *(w for w in writes if w.status == "ok")]:
        for b in reads:
            if a.complete < b.invoke:
                assert b.stamp >= a.stamp, f"{b.process} read {b.stamp} after {a.kind} {a.stamp} completed"
    # Only writes that sent data are ordered: one that drew its stamp from a view where the
    # holders of an earlier promise were unanswered or suspect (a newer holder's promise,
    # above the lease tokens the writer had seen) may draw an older stamp, but the
    # majority that promised the earlier one refuses it, so it never sends data.
    for a in writes:
        if a.data_sent_at is None:
            continue
        for b in writes:
            if b.stamp is not None and b.data_sent_at is not None and a.data_sent_at < b.invoke:
                assert b.stamp > a.stamp, f"write {b.stamp} began after write {a.stamp} sent data, yet is older"


class RegisterMachine(RuleBasedStateMachine):
    n = 3

    @initialize()
    def setup(self) -> None:
        self.sim = Sim(self.n)
        self.tokens = dict.fromkeys(PROCESSES, 1)
        self.count = 0

    def idle(self) -> list[str]:
        if len(self.sim.ops) >= MAX_OPS:
            return []
        return [p for p in PROCESSES if p not in self.sim.running]

    @precondition(lambda self: bool(self.idle()))
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        process = data.draw(st.sampled_from(self.idle()), label="writer")
        # A real write id is 128 random bits; here it is drawn, so that Hypothesis can
        # replay and shrink a history and try every order of ids, and made unique by a
        # counter, as 128 random bits are.
        self.count += 1
        write_id = f"{data.draw(st.integers(0, 255), label='write id'):02x}{self.count:04x}"
        self.sim.start(WriteOp(self.sim, process, self.tokens[process], f"w{self.count}", write_id))

    @precondition(lambda self: bool(self.idle()))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        process = data.draw(st.sampled_from(self.idle()), label="reader")
        self.sim.start(ReadOp(self.sim, process))

    @precondition(lambda self: bool(self.idle()))
    @rule(data=st.data())
    def take_the_lock(self, data: st.DataObject) -> None:
        """A new holder: a higher fencing token; the others keep writing with theirs."""
        process = data.draw(st.sampled_from(self.idle()), label="new holder")
        self.sim.max_token += 1
        self.tokens[process] = self.sim.max_token

    @precondition(lambda self: bool(self.sim.running))
    @rule(data=st.data())
    def give_up(self, data: st.DataObject) -> None:
        process = data.draw(st.sampled_from(sorted(self.sim.running)), label="gives up")
        self.sim.running[process].abandon()

    @rule(server=st.integers(0, 4), mode=st.sampled_from((UP, UP, UP, REJECTS_WRITES, DOWN)))
    def server_mode(self, server: int, mode: str) -> None:
        self.sim.servers[server % self.n].mode = mode

    @precondition(lambda self: bool(self.sim.pending))
    @rule(steps=st.binary(min_size=1, max_size=32))
    def deliver(self, steps: bytes) -> None:
        """Deliver requests in flight, one per byte: which one (low nibble) and how (high
        nibble: mostly answered, else its answer lost, dropped, or rejected). One draw
        per batch keeps Hypothesis's own work per history small; zero bytes (what
        shrinking goes to) deliver the oldest request normally."""
        for byte in steps:
            if not self.sim.pending:
                return
            self.sim.deliver(byte & 0x0F, DELIVERY_FATES[byte >> 4])

    def teardown(self) -> None:
        if not hasattr(self, "sim"):
            return
        self.sim.drain()
        final = ReadOp(self.sim, "final")
        self.sim.start(final)
        self.sim.drain()
        assert final.status == "ok" and final.stamp is not None
        check_history(self.sim)


class RegisterOfFive(RegisterMachine):
    n = 5


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestRegisterOfThree = RegisterMachine.TestCase
TestRegisterOfThree.settings = SETTINGS
TestRegisterOfFive = RegisterOfFive.TestCase
TestRegisterOfFive.settings = SETTINGS


def random_history(n: int, rng: random.Random, steps: int = 80) -> Sim:
    """One history driven by ``rng``, as the state machine above drives one by Hypothesis."""
    sim = Sim(n)
    tokens = dict.fromkeys(PROCESSES, 1)
    count = 0
    for _ in range(steps):
        process = rng.choice(PROCESSES)
        idle = process not in sim.running and len(sim.ops) < MAX_OPS
        roll = rng.random()
        if roll < 0.12 and idle:
            count += 1
            sim.start(WriteOp(sim, process, tokens[process], f"w{count}", f"{rng.randrange(256):02x}{count:04x}"))
        elif roll < 0.24 and idle:
            sim.start(ReadOp(sim, process))
        elif roll < 0.26 and process not in sim.running:
            sim.max_token += 1
            tokens[process] = sim.max_token
        elif roll < 0.28 and process in sim.running:
            sim.running[process].abandon()
        elif roll < 0.32:
            sim.servers[rng.randrange(n)].mode = rng.choice((UP, UP, REJECTS_WRITES, DOWN))
        elif sim.pending:
            sim.deliver(rng.randrange(len(sim.pending)), rng.choice(FATES))
    sim.drain()
    final = ReadOp(sim, "final")
    sim.start(final)
    sim.drain()
    return sim


@pytest.mark.parametrize("n", [3, 5])
def test_hundreds_of_random_histories_a_second(n: int) -> None:
    """The same model under a seeded random schedule: a fixed number of histories (about a
    second's worth on two quiet cores: some 900 a second over 3 replicas, 500 over 5),
    which reaches the rarer interleavings that the Hypothesis machine above, at some 70
    histories a second with its own bookkeeping, takes long to find. A count, not a time
    budget: on a busy machine the test takes longer and checks as much."""
    rng = random.Random(f"register-{n}")
    for _ in range(900 if n == 3 else 500):
        check_history(random_history(n, rng))


# ------------------------------------------------------------------ scenarios, step by step


def _owner(request: Any) -> Any:
    return getattr(request.lane, "op", request.lane)


def step(sim: Sim, op: Any, *, server: int | None = None, method: str | None = None, fate: str = DELIVER) -> bool:
    """Deliver the oldest request of ``op`` (to ``server``, of ``method``), if any."""
    for i, r in enumerate(sim.pending):
        if _owner(r) is op and (server is None or r.server == server) and (method is None or r.method == method):
            sim.deliver(i, fate)
            return True
    return False


def settle(sim: Sim, op: Any) -> None:
    """Deliver everything ``op`` sends, servers behaving as their modes say."""
    while step(sim, op):
        pass


def run(sim: Sim, op: Any) -> Any:
    sim.start(op)
    settle(sim, op)
    assert op.done
    return op


@pytest.mark.parametrize("rejects", ["every update", "data only"])
def test_the_issue_in_the_model(rejects: str) -> None:
    """Version 1 everywhere; a write rejected on c2 and c3 (c1 takes it, or only its
    promise); with c1 away, a write confirmed on c2 and c3; c1 back. Whichever
    majority a read hears, it returns the confirmed write, and never flips."""
    sim = Sim(3)
    assert run(sim, WriteOp(sim, "p0", 1, "3")).status == "ok"
    four = WriteOp(sim, "p0", 1, "4")
    sim.start(four)
    if rejects == "every update":
        sim.servers[1].mode = sim.servers[2].mode = REJECTS_WRITES
    else:  # an admission policy that lets the promise through and turns the data away
        for server in (0, 1, 2):
            step(sim, four, server=server, method="GET")
        for server in (0, 1, 2):
            step(sim, four, server=server, method="PUT")
        sim.servers[1].mode = sim.servers[2].mode = REJECTS_WRITES
    settle(sim, four)
    assert four.status == ("fail" if rejects == "every update" else "unknown")
    sim.servers[1].mode = sim.servers[2].mode = UP
    sim.servers[0].mode = DOWN
    five = run(sim, WriteOp(sim, "p0", 1, "5"))
    assert five.status == "ok"
    if four.data_sent_at is not None:  # c2 and c3 hold the promise of 4: 5 is ordered after it
        assert four.stamp is not None and five.stamp is not None and five.stamp > four.stamp
        assert five.stamp.version == four.stamp.version + 1
    sim.servers[0].mode = UP
    for away in (0, None, 1, 2, 0, None):
        if away is not None:
            sim.servers[away].mode = DOWN
        read = run(sim, ReadOp(sim, "reader"))
        assert (read.status, read.value) == ("ok", "5"), away
        if away is not None:
            sim.servers[away].mode = UP
    check_history(sim)


def test_a_read_writes_back_before_returning() -> None:
    """A write in flight has reached c1 only. A read that hears c1 returns it and must
    put it on a majority first: a later read that hears only c2 and c3 returns it too."""
    sim = Sim(3)
    assert run(sim, WriteOp(sim, "p0", 1, "old")).status == "ok"
    new = WriteOp(sim, "p1", 1, "new")
    sim.start(new)
    for method in ("GET", "PUT"):
        for server in (0, 1, 2):
            step(sim, new, server=server, method=method)
    assert step(sim, new, server=0, method="PUT")  # the data, on c1 only; the rest in flight
    first = ReadOp(sim, "r1")
    sim.start(first)
    step(sim, first, server=0)
    step(sim, first, server=1)
    settle(sim, first)
    assert (first.status, first.value) == ("ok", "new")
    second = ReadOp(sim, "r2")
    sim.start(second)
    step(sim, second, server=1)
    step(sim, second, server=2)
    settle(sim, second)
    assert (second.status, second.value) == ("ok", "new")
    settle(sim, new)
    check_history(sim)


def test_a_stale_holder_is_fenced_even_where_it_cannot_see_the_new_one() -> None:
    """Holder 2 promised on c2 and c3; holder 1 (token 1) reads c1 and c2 and is refused."""
    sim = Sim(3)
    assert run(sim, WriteOp(sim, "p0", 1, "a")).status == "ok"
    sim.max_token = 2
    sim.servers[0].mode = DOWN
    assert run(sim, WriteOp(sim, "p1", 2, "b")).status == "ok"
    sim.servers[0].mode = UP
    sim.servers[2].mode = DOWN
    late = run(sim, WriteOp(sim, "p0", 1, "late"))
    assert late.status == "fail" and late.stamp is None
    sim.servers[2].mode = UP
    assert run(sim, ReadOp(sim, "r")).value == "b"
    check_history(sim)


def test_a_writer_that_sees_the_earlier_promise_only_as_suspect_sends_nothing() -> None:
    """Write a is on c2 and c3. With c2 down, holder 2 promises on c3; a token-1 writer
    that saw only token 1 in the leases reads c1 and c3, takes c3 as suspect and draws
    version 1 from c1 alone: older than a, but c3 refuses its promise, so no data goes out."""
    sim = Sim(3)
    sim.servers[0].mode = REJECTS_WRITES
    a = run(sim, WriteOp(sim, "p0", 1, "a", "b0"))
    assert a.status == "ok"
    sim.servers[0].mode = UP
    sim.servers[1].mode = DOWN
    late = WriteOp(sim, "p1", 1, "late", "a0")  # a lower write id than a's: the same version is older
    sim.start(late)
    sim.max_token = 2
    new = WriteOp(sim, "p2", 2, "new")
    sim.start(new)
    for server in (0, 1, 2):
        step(sim, new, server=server, method="GET")
    assert step(sim, new, server=2, method="PUT")  # its promise, on c3
    settle(sim, late)
    assert late.status == "fail" and late.data_sent_at is None
    assert late.stamp is not None and a.stamp is not None and late.stamp < a.stamp
    settle(sim, new)
    sim.drain()
    assert run(sim, ReadOp(sim, "r")).value == "new"
    check_history(sim)
