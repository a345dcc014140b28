"""The state register, run by the real engine (``StateClient``) on in-memory API servers,
one request at a time in an order the test picks.

Three processes write (``state write`` with a fencing token, as a holder whose lease may
have been taken over since: the lease check is skipped, the replicas' promises and the
leases' tokens still fence), read (``state get``, which repairs before it returns) and
take the lock (``lock break`` then ``lock acquire``: a higher token in the leases, and
the token floor written to the state objects). Every request to a state object waits on
the wire (sim/stepped.py) until the test delivers it, loses its answer, drops it or has
it rejected; clusters go down and come back, turn writes away; a process gives up in the
middle of an operation, leaving its writes on the wire.

What every history must show (:meth:`Registers.check`): it is linearizable; no stamp
ever names two documents; a read never returns a value older than one returned or
confirmed before it began; a write that begins after another one sent data is ordered
after it.
"""

from __future__ import annotations

import copy
import random
import tempfile
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import trio
from faults.checkers import Operation, check_linearizable_register
from served import served

from coordinator import clock
from coordinator.engine.register import NO_STAMP, Stamp, decode_replica
from coordinator.errors import CoordinatorError
from coordinator.rules.resources import state_name
from sim.apiserver import World
from sim.simulate import (
    DEPLOYMENT,
    KEY,
    MAX_TTL_S,
    NAMESPACE,
    SeededChance,
    SimClock,
    SimProcess,
    _deterministic,
    _harness_patches,
    _setup,
    server_time,
)
from sim.stepped import DELIVER, DOWN, DROP, LOSE, REJECT, REJECTS_WRITES, UP, Parked, Stepped, quiet

PROCESSES = ("p0", "p1", "p2")
STORAGE = "configmap"
MAX_OPS = 10


@dataclass(eq=False)
class Op:
    """One operation of one process, as the history records it."""

    process: str
    kind: str  # write, read, lock
    invoke: int
    token: int = 0
    written: str | None = None  # what a write writes
    value: Any = None  # what a read returned
    status: str = "running"  # then ok, fail or unknown
    complete: int | None = None
    drawn: Stamp | None = None  # the stamp a write promised (its first write request)
    data_sent_at: int | None = None  # when a write's first data left
    stamp: Stamp | None = None  # the stamp of a write's data
    error: str = ""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def done(self) -> bool:
        return self.status != "running"

    def record(self) -> Operation:
        value = self.written if self.kind == "write" else self.value
        complete = self.complete if self.status == "ok" else None
        return Operation(self.process, self.kind, value, self.invoke, complete, self.status)  # type: ignore[arg-type]


class Registers:
    """``n`` clusters holding one deployment's state, three processes, and the history."""

    def __init__(self, n: int, seed: int, nursery: trio.Nursery, workdir: Path) -> None:
        self.n = n
        self.seed = seed
        self.nursery = nursery
        self.workdir = workdir
        self.world = World(clock=server_time, rng=random.Random(f"{seed}:servers"))
        self.names = [f"c{i + 1}" for i in range(n)]
        for name in self.names:
            self.world.cluster(name)
        self.net = Stepped(self.world, state_name(DEPLOYMENT))
        self.net.on_park = self._parked
        self.net.on_deliver = self._delivered
        self.clock = 0
        self.ops: list[Op] = []
        self.running: dict[str, Op] = {}
        self.tokens = dict.fromkeys(PROCESSES, 1)
        self.documents: dict[Stamp, str] = {}  # every envelope ever stored, by stamp
        self.values: dict[Any, Stamp] = {}  # the stamp each written value was stored under
        self.problems: list[str] = []
        self.config: Any = None
        self._count = 0
        self._pids: dict[str, int] = {}

    async def setup(self) -> None:
        """The deployment on every member, and p0's lock (token 1), before anything waits."""
        from coordinator.ops.api import Coordinator

        self.config = await _setup(self.world, self.workdir, self.names, self.names)
        with clock.using(*self._clocks("p0")):
            async with Coordinator(
                copy.deepcopy(self.config),
                store=None,
                timeout=5,
                transport_factory=self.world.transport_factory,
                lease_events=False,
            ) as c:
                held = await c.acquire(DEPLOYMENT, ttl=MAX_TTL_S, holder="p0")
        assert held.acquired and held.fencing_token == 1, held
        for name in self.names:
            self._look(name)

    def _clocks(self, process: str) -> tuple[Any, ...]:
        self._count += 1
        chance = SeededChance(random.Random(f"{self.seed}:{process}:{self._count}"))
        pid = self._pids.setdefault(process, 100 + len(self._pids))
        return SimClock(1.0, 0.0, 0.0), chance, SimProcess(process, pid)

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    # ---------------------------------------------------------------- operations

    def write(self, process: str, value: str, token: int | None = None) -> Op:
        op = Op(process, "write", self.tick(), token=self.tokens[process] if token is None else token, written=value)

        async def body(c: Any) -> None:
            # The lock id is not checked with a token given (``_token``): the lock may have
            # been taken over since, as it may have been from a holder stopped before a write.
            await c.state(DEPLOYMENT).write(lambda _old: {KEY: value}, lock=f"{process}-lock", _token=op.token)

        return self._start(op, body)

    def read(self, process: str) -> Op:
        op = Op(process, "read", self.tick())

        async def body(c: Any) -> None:
            data = await c.state(DEPLOYMENT).get()
            op.value = data.get(KEY) if isinstance(data, dict) else data

        return self._start(op, body)

    def take_the_lock(self, process: str) -> Op:
        """A new holder: the lock broken and taken, a higher token in the leases; the
        other processes keep writing with the tokens they had."""
        op = Op(process, "lock", self.tick())

        async def body(c: Any) -> None:
            await c.break_lock(DEPLOYMENT, by=process)
            held = await c.acquire(DEPLOYMENT, ttl=MAX_TTL_S, holder=process)
            op.token = self.tokens[process] = int(held.fencing_token)

        return self._start(op, body)

    def abandon(self, process: str) -> None:
        """The process gives up (killed, timed out): its reads leave the wire, its writes
        stay on it."""
        self.running[process].scope.cancel()

    def _start(self, op: Op, body: Callable[[Any], Awaitable[None]]) -> Op:
        assert op.process not in self.running, f"{op.process} is busy"
        self.ops.append(op)
        self.running[op.process] = op
        self.nursery.start_soon(self._run, op, body, self._clocks(op.process))
        return op

    async def _run(self, op: Op, body: Callable[[Any], Awaitable[None]], clocks: tuple[Any, ...]) -> None:
        from coordinator.ops.api import Coordinator

        ok = False
        with clock.using(*clocks), op.scope:
            try:
                async with Coordinator(
                    copy.deepcopy(self.config),
                    store=None,
                    timeout=5,
                    transport_factory=self.net.factory(op.process),
                    lease_events=False,
                ) as c:
                    await body(c)
                ok = True
            except CoordinatorError as err:
                op.error = f"exit {int(err.exit_code)}: {err.message}"
            except Exception as err:
                op.error = f"{type(err).__name__}: {err}"
                self.problems.append(f"{op.process} {op.kind} raised {op.error}\n{traceback.format_exc()}")
        if op.scope.cancelled_caught:
            op.error = "gave up"
        op.complete = self.tick()
        if op.kind == "write":
            # A write whose data never left cannot take effect; one whose data left may have.
            op.status = "ok" if ok else "fail" if op.data_sent_at is None else "unknown"
        else:
            op.status = "ok" if ok else "fail"
        if self.running.get(op.process) is op:
            del self.running[op.process]
        self.net.moved()

    # ---------------------------------------------------------------- the wire

    def _parked(self, item: Parked) -> None:
        self.tick()
        op = self.running.get(item.process)
        if op is None or op.kind != "write" or item.method == "GET" or op.data_sent_at is not None:
            return
        rep = decode_replica(item.cluster, served(item.body), STORAGE, deployment=DEPLOYMENT)
        if op.drawn is None:  # a write's first write request is its promise
            op.drawn = rep.promise
        if rep.envelope is not None and rep.envelope.data.get(KEY) == op.written:
            op.data_sent_at, op.stamp = self.clock, rep.stamp

    def _delivered(self, item: Parked, fate: str) -> None:
        self.tick()
        if item.method != "GET" and fate in (DELIVER, LOSE):
            self._look(item.cluster)

    def _look(self, cluster: str) -> None:
        """What the cluster stores now: no stamp may ever name two documents."""
        obj = self.world.clusters[cluster].store.objects.get(("configmaps", NAMESPACE, state_name(DEPLOYMENT)))
        rep = decode_replica(cluster, obj, STORAGE, deployment=DEPLOYMENT)
        if rep.corrupt is not None:
            self.problems.append(f"{cluster} stores a corrupt replica: {rep.corrupt}")
            return
        if rep.envelope is None:
            return
        seen = self.documents.setdefault(rep.stamp, rep.envelope.checksum)
        if seen != rep.envelope.checksum:
            self.problems.append(f"two documents under stamp {rep.stamp}")
        self.values.setdefault(rep.envelope.data.get(KEY), rep.stamp)

    # ---------------------------------------------------------------- driving

    async def step(
        self, op: Op | None = None, *, server: int | None = None, method: str | None = None, fate: str = DELIVER
    ) -> bool:
        """Once nothing else can move: deliver the oldest request of ``op`` (to cluster
        ``server``, 0-based, of ``method``), if there is one."""
        await quiet()
        for i, item in enumerate(self.net.pending):
            if op is not None and (item.process != op.process or item.orphan):
                continue
            if server is not None and item.cluster != self.names[server]:
                continue
            if method is not None and item.method != method:
                continue
            self.net.deliver(i, fate)
            return True
        return False

    async def settle(self, op: Op) -> None:
        """Deliver what ``op`` sends, the clusters behaving as their modes say, until it ends."""
        while not op.done:
            if not await self.step(op):
                await self.net.until_moved()

    async def run(self, op: Op) -> Op:
        await self.settle(op)
        return op

    async def drain(self) -> None:
        """Every cluster up; everything on the wire delivered; every operation ended."""
        for name in self.names:
            self.net.modes[name] = UP
        while True:
            await quiet()
            if self.net.pending:
                self.net.deliver(0)
            elif self.running:
                await self.net.until_moved()
            else:
                return

    async def finish(self) -> Op:
        """Drain, then a final read, which must return."""
        await self.drain()
        final = await self.run(self.read("p0"))
        if final.status != "ok":
            self.problems.append(f"the final read failed: {final.error}")
        return final

    # ---------------------------------------------------------------- judging

    def stamp_read(self, op: Op) -> Stamp:
        return NO_STAMP if op.value is None else self.values.get(op.value, NO_STAMP)

    def check(self) -> None:
        assert not self.problems, "\n".join(self.problems)
        registers = [op for op in self.ops if op.kind != "lock"]
        history = [op.record() for op in registers]
        result = check_linearizable_register(history, initial=None, max_states=200_000)
        assert result.ok, result.summary() + "\n" + self.describe()
        reads = [op for op in registers if op.kind == "read" and op.status == "ok"]
        writes = [op for op in registers if op.kind == "write"]
        confirmed = [(w, w.stamp) for w in writes if w.status == "ok"] + [(r, self.stamp_read(r)) for r in reads]
        for a, a_stamp in confirmed:
            for b in reads:
                if a.complete is not None and a.complete < b.invoke:
                    assert a_stamp is not None and self.stamp_read(b) >= a_stamp, (
                        f"{b.process} read {b.value!r} after {a.kind} {a.written or a.value!r} ({a_stamp}) ended\n"
                        + self.describe()
                    )
        # Only writes that sent data are ordered: one that drew its stamp from a view where
        # the holders of an earlier promise were unanswered or suspect may draw an older
        # stamp, but the majority that promised the earlier one refuses it, so it never
        # sends data.
        for a in writes:
            if a.data_sent_at is None:
                continue
            for b in writes:
                if b.data_sent_at is not None and a.data_sent_at < b.invoke:
                    assert a.stamp is not None and b.stamp is not None and b.stamp > a.stamp, (
                        f"write {b.written} began after write {a.written} sent data, yet is older\n" + self.describe()
                    )

    def describe(self) -> str:
        return "\n".join(
            f"  {op.process} {op.kind} {op.written or ''}{'' if op.value is None else ' -> ' + repr(op.value)} "
            f"[{op.invoke}, {op.complete}] {op.status} stamp={op.stamp} sent={op.data_sent_at} {op.error[:160]}"
            for op in self.ops
        )


def simulate(n: int, seed: int, body: Callable[[Registers], Awaitable[None]]) -> Registers:
    """One history: ``body`` drives it; the returned registers hold what happened."""
    out: list[Registers] = []

    async def main(workdir: Path) -> None:
        harness = (SimClock(1.0, 0.0, 0.0), SeededChance(random.Random(f"{seed}:harness")), SimProcess("harness", 1))
        with clock.using(*harness):
            async with trio.open_nursery() as nursery:
                regs = Registers(n, seed, nursery, workdir)
                out.append(regs)
                await regs.setup()
                await body(regs)
                await regs.finish()
                nursery.cancel_scope.cancel()

    with tempfile.TemporaryDirectory(prefix="registers-") as tmp, _harness_patches(), _deterministic(seed) as mock:
        anyio.run(main, Path(tmp), backend="trio", backend_options={"clock": mock})
    return out[0]


class Chooser:
    """Where a random history's choices come from: a seeded ``random.Random``, or a
    Hypothesis ``data`` object (so that it can replay and shrink a history)."""

    def __init__(self, draw: Callable[[int, str], int]) -> None:
        self.draw = draw  # draw(k, label) -> an integer in [0, k)

    @classmethod
    def seeded(cls, rng: random.Random) -> Chooser:
        return cls(lambda k, _label: rng.randrange(k))

    async def history(self, regs: Registers) -> None:
        """A random history with these choices (:func:`random_history`)."""
        await random_history(regs, self)

    def pick(self, options: tuple[Any, ...] | list[Any], label: str) -> Any:
        return options[self.draw(len(options), label)]


FATES = (*[DELIVER] * 12, LOSE, LOSE, DROP, REJECT)
MODES = (UP, UP, UP, REJECTS_WRITES, DOWN)


async def random_history(regs: Registers, choose: Chooser, steps: int = 100) -> None:
    """Operations started, requests delivered, clusters changing mode and processes
    giving up, in an order drawn from ``choose``."""
    count = 0
    for _ in range(steps):
        await quiet()
        process = choose.pick(PROCESSES, "process")
        idle = process not in regs.running and len(regs.ops) < MAX_OPS
        roll = choose.draw(200, "action")
        if roll < 24 and idle:
            count += 1
            regs.write(process, f"w{count}")
        elif roll < 48 and idle:
            regs.read(process)
        elif roll < 52 and idle:
            regs.take_the_lock(process)
        elif 52 <= roll < 54 and process in regs.running:
            regs.abandon(process)
        elif 54 <= roll < 62:
            regs.net.modes[choose.pick(regs.names, "cluster")] = choose.pick(MODES, "mode")
        elif regs.net.pending:
            regs.net.deliver(choose.draw(len(regs.net.pending), "request"), choose.pick(FATES, "fate"))
        elif regs.running:
            await regs.net.until_moved()  # waiting on a sleep: let virtual time pass
