"""The deterministic simulator: the real lock and state engines, many contenders at once,
on in-memory API servers (sim/apiserver.py), on a virtual clock, under a fault schedule
drawn from one seed; every run judged by the fault suite's checkers (faults/checkers.py).

    result = run(Options(seed=7))          # one run; result.passed, result.summary()
    python scripts/simulate.py --seed 7    # the same from the command line

What runs
---------
One trio event loop (anyio's trio backend) with ``trio.testing.MockClock(autojump_threshold
=0)``: whenever every task waits, the clock jumps to the next deadline, so a 180 s TTL
costs nothing and the run is as fast as the CPU. Trio's scheduler is made deterministic
(its batch order drawn from a generator seeded from the run's seed), the API servers'
uids and the network's choices come from seeded generators, and every contender reads
its clocks and draws its lock ids, write ids and jitter through coordinator/clock.py
from its own seeded clock and chance. So a seed (with the options) is a run: the same
seed gives the same history, and a failing seed prints the command that fails again.

The contenders are tasks that call the product's own API (``Coordinator``), each with
its own ``Coordinator``, its own clock (an offset and a rate within ``rate_skew`` of the
true one) and its own links to the clusters (sim/network.py):

- ``api`` holders: ``Coordinator.lock`` (renewed in the background), waiting or not,
  writing (one write, or several at once), reading and holding inside their section;
- ``cmd`` holders: one ``Coordinator`` per step, as the command line makes one per
  command: ``acquire``, ``renew``, ``state set`` / ``state apply`` with ``--lock-id``,
  ``release``;
- ``read`` contenders: ``state get`` without the lock, and now and then ``state sync``.

A section is a holder's time from its acquisition returning to its release or the end
of its validity (counted on its own clock, converted to the true virtual time), as the
fault suite counts it (tests/faults/contenders.py). A holder ``late`` to its write (a
GC pause, a stopped process) writes once with its lock id after its validity ended, as
a holder that does not check its validity would: fencing must refuse it once another
holder has the lock.

The faults (``KINDS``; sim/schedule.py draws and applies them): per-link delays, lost
requests, lost answers (one-way cuts: the write lands, the answer is lost), duplicated
requests; cut links to a minority or a majority; majorities-ring partitions (each
contender reaches a different majority); API servers paused, killed and started again;
throttling; watch history compacted; a member restored to an earlier snapshot followed
by ``cluster restored``'s tombstoning; deletions of Leases, state objects and namespaces
(inside the fault model: never the member set's last records on a majority, as the fault
suite's gate judges it); other field managers writing any field of the evidence table
(docs/evidence.md), stripping managedFields, cutting the lease duration; admission
rejecting state writes on a minority or a majority; holders frozen past their validity;
operators breaking the lock. Client clock rates within ``rate_skew`` and API server
offsets within ``server_skew`` are options: within the documented bounds (1 %,
``--max-server-skew``) a run must pass, beyond them the checkers must catch it.

Judged: mutual exclusion over the sections (after operators' breaks), rising tokens,
linearizability of the register, no lost confirmed write (a final read once every fault
is undone), no stale write accepted (a write of a holder whose token is below that
of a lock granted before the write began: fencing must refuse it), and breaks that stick
(no renewal that began after a `lock break` exited 0 renews the broken lock id on a lease
the break cleared: ``_broken_renewed``). Contenders report
anything the product's documented exit codes do not allow as a problem.
"""

from __future__ import annotations

import copy
import functools
import gc
import random
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import trio
from faults.checkers import (
    CheckResult,
    Violation,
    apply_breaks,
    check_linearizable_register,
    check_mutual_exclusion,
    check_no_lost_writes,
)
from faults.recorder import Recorder

from coordinator import clock
from sim.apiserver import World
from sim.network import Network

EPOCH = datetime(2027, 3, 1, tzinfo=UTC)
DEPLOYMENT = "sim"
NAMESPACE = "apps"
KEY = "v"
MAX_TTL_S = 20
# The real-server soak's lock sections per hour of CPU: `scripts/torture.py --minutes 5 --seed
# 20261206` on this machine (2 cores, quiet), 165 sections for 249.8 CPU seconds of the soak and
# the sandbox it runs (user + system, as /usr/bin/time counts the process and the children it
# reaps; the whole machine's busy time over a 2-minute soak was 10 % above that count).
# The simulator's summary sets its own rate beside it (docs/simulator.md, *Throughput*).
SOAK_SECTIONS_PER_CPU_HOUR = 2378.0


# ------------------------------------------------------------------ options and results


@dataclass
class Options:
    seed: int
    clusters: int = 3
    api: int = 2  # holders through Coordinator.lock
    cmd: int = 1  # holders one command at a time
    readers: int = 1
    changers: int = 0  # machines running member changes (a spare cluster is connected)
    state: float = 0.5  # the share of sections with steps inside (writes, reads, holds)
    seconds: float = 300.0  # of virtual time for the workload
    timeout: float = 2.0  # each contender's per-cluster timeout
    rate_skew: float = 0.009  # client clock rates within this of the true rate (1 %: the bound)
    long_holds: bool = False  # command holders' holds last to the end of their validity
    server_skew: float = 0.0  # HA clusters: one API server off by up to this (5 s: the bound)
    kinds: tuple[str, ...] = ()  # fault kinds to draw from (all when empty)
    fields: tuple[str, ...] = ()  # the evidence fields foreign writes edit (all when empty)
    faults: float = 1.0  # fault episodes per 10 s of workload
    keep: tuple[int, ...] | None = None  # schedule indices to keep (a shrunk schedule)
    plant: str | None = None  # a planted bug (sim/plants.py)

    def argv(self) -> list[str]:
        """The command line that runs exactly this (a replay)."""
        out = ["--seed", str(self.seed)]
        defaults = Options(seed=self.seed)
        for name, flag in (
            ("clusters", "--clusters"),
            ("api", "--api"),
            ("cmd", "--cmd"),
            ("readers", "--readers"),
            ("changers", "--changers"),
            ("state", "--state"),
            ("seconds", "--seconds"),
            ("timeout", "--timeout"),
            ("rate_skew", "--rate-skew"),
            ("server_skew", "--server-skew"),
            ("faults", "--faults"),
        ):
            value = getattr(self, name)
            if value != getattr(defaults, name):
                out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        if self.kinds:
            out += ["--kinds", ",".join(self.kinds)]
        if self.fields:
            out += ["--fields", ",".join(self.fields)]
        if self.keep is not None:
            out += ["--keep", ",".join(map(str, self.keep)) or "none"]
        if self.plant:
            out += ["--plant", self.plant]
        if self.long_holds:
            out.append("--long-holds")
        return out

    def command(self) -> str:
        return "python scripts/simulate.py " + " ".join(self.argv())


@dataclass
class Result:
    options: Options
    sections: list[dict[str, Any]]
    operations: list[dict[str, Any]]
    checks: list[CheckResult]
    problems: list[str]
    faults: Counter[str]
    schedule: list[Any]
    stats: Counter[str]
    cpu_s: float = 0.0
    virtual_s: float = 0.0
    requests: int = 0
    stale_accepted: int = 0
    digest: str = ""
    notes: list[str] = field(default_factory=list)  # the faults as they were applied

    @property
    def violations(self) -> list[str]:
        return [v.message for c in self.checks for v in c.violations] + self.problems

    @property
    def undecided(self) -> list[str]:
        return [f"{c.check}: {c.undecided}" for c in self.checks if c.undecided]

    @property
    def passed(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return (
            f"seed {self.options.seed}: {len(self.sections)} lock sections, {len(self.operations)} state ops, "
            f"{sum(self.faults.values())} faults ({kinds}), {len(self.violations)} violations, "
            f"{self.virtual_s:.0f}s virtual in {self.cpu_s:.2f}s CPU, history {self.digest}"
        )


# ------------------------------------------------------------------ clocks and chance


def now() -> float:
    """True virtual seconds since the run began (the simulator runs on trio: its clock
    read directly, as anyio's trio backend reads it)."""
    return trio.current_time() - _T0[0]


_T0 = [0.0]


class SimClock(clock.Clock):
    """A contender's clocks: its boot and monotonic clocks at ``boot_offset + rate * t``,
    its wall clock ``wall_offset`` off the true time, at the same rate."""

    def __init__(self, rate: float, boot_offset: float, wall_offset: float) -> None:
        self.rate = rate
        self.boot_offset = boot_offset
        self.wall_offset = wall_offset

    def boot(self) -> float:
        return self.boot_offset + self.rate * now()

    def monotonic(self) -> float:
        return self.boot()

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.wall_offset + self.rate * now())

    def true_time(self, boot: float) -> float:
        """The true virtual time at which this clock reads ``boot``."""
        return (boot - self.boot_offset) / self.rate


class SeededChance(clock.Chance):
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def token_hex(self, nbytes: int) -> str:
        return self.rng.getrandbits(nbytes * 8).to_bytes(nbytes, "big").hex()

    def fraction(self) -> float:
        return self.rng.random()


class SimProcess(clock.Process):
    """A contender's process: a host of its own, a pid drawn from the seed, no environment,
    as each contender of a real deployment is a process of its own, on a machine of its own."""

    def __init__(self, name: str, pid: int) -> None:
        self.name = name
        self._pid = pid

    def host(self) -> str:
        return f"{self.name}.sim"

    def pid(self) -> int:
        return self._pid

    def user(self) -> str:
        return "sim"

    def environ(self) -> dict[str, str]:
        return {}

    def argv(self) -> list[str]:
        return [self.name]


def server_time() -> datetime:
    return EPOCH + timedelta(seconds=now())


# ------------------------------------------------------------------ the run


class LeaseTruth:
    """When each lock id first held a majority of the clusters' leases, read from the
    stores as they change: what the servers held, not what any contender said.

    An acquisition that returns after an operator's break may have held its majority
    before the break cleared it (its command still finishing): the break is then ordered
    after the take, and the check gives the section up from the break on
    (:func:`faults.checkers.apply_breaks`, ``held_from``). An attempt that never held a
    majority at one instant gets no such excuse. Counted against every cluster of the
    world (a majority of members and spares alike), and only leases whose holder a
    coordinator manager owns, so the excuse is never wider than the members' truth."""

    def __init__(self, world: World) -> None:
        from coordinator.rules.quorum import quorum_size
        from sim.contenders import _lease_key

        self.key = _lease_key()
        self.needed = quorum_size(len(world.clusters))
        self.holding: dict[str, str | None] = {}
        self.held_from: dict[str, float] = {}
        for name, cluster in world.clusters.items():
            cluster.store.observers.append(functools.partial(self._changed, name))

    def _changed(self, cluster: str, change: Any) -> None:
        from coordinator.rules.lease import lock_id_of
        from sim.contenders import _holder_owned_by_coordinator

        if change.key != self.key:
            return
        obj = change.obj
        holder = None
        if change.type != "DELETED" and _holder_owned_by_coordinator(obj):
            holder = lock_id_of((obj.get("spec") or {}).get("holderIdentity")) or None
        self.holding[cluster] = holder
        if holder is not None and holder not in self.held_from:
            if sum(1 for held in self.holding.values() if held == holder) >= self.needed:
                self.held_from[holder] = now()


@dataclass
class Sim:
    """What one run shares: the world, the network, the history, the contenders' state."""

    opts: Options
    world: World
    net: Network
    recorder: Recorder
    config: Any  # the LocalConfig every contender starts from
    workdir: Path
    stop: anyio.Event = field(default_factory=anyio.Event)
    granted: list[tuple[float, int]] = field(default_factory=list)  # (acquisition returned, token)
    writes: list[dict[str, Any]] = field(default_factory=list)  # accepted writes: token, invoke
    holders: dict[str, Any] = field(default_factory=dict)  # contender -> its live HeldLock or token
    # For the check that a break sticks (_broken_renewed): operators' breaks with what each
    # member answered, every renewal the engines ran, and when each lock id's section began.
    breaks: list[dict[str, Any]] = field(default_factory=list)
    renewals: list[dict[str, Any]] = field(default_factory=list)
    entered: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # lock id -> (process, mode, t)
    faults: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    truth: LeaseTruth = field(init=False)  # told every change of the world's stores

    def __post_init__(self) -> None:
        self.truth = LeaseTruth(self.world)

    @property
    def members(self) -> list[str]:
        return list(self.config.deployments[DEPLOYMENT].clusters)

    def note(self, text: str) -> None:
        self.notes.append(f"[{now():8.2f}s] {text}")

    def coordinator(self, who: str) -> Any:
        from coordinator.ops.api import Coordinator

        factory = self.net.factory(who, self.world.clusters)
        return Coordinator(
            copy.deepcopy(self.config),
            store=None,
            timeout=self.opts.timeout,
            transport_factory=factory,
            lease_events=False,
        )


async def _setup(world: World, workdir: Path, names: list[str], members: list[str]) -> Any:
    from coordinator.config.store import ConfigStore
    from coordinator.engine.clusters import ClusterSet
    from coordinator.ops.admin import connect_cluster, create_deployment

    store = ConfigStore(str(workdir / "config.yaml"))
    for name in names:
        await connect_cluster(store, name, name, None, transport_factory=world.transport_factory)
    clusters = ClusterSet(store.load(), timeout=5, transport_factory=world.transport_factory)
    try:
        await create_deployment(store, clusters, DEPLOYMENT, NAMESPACE, members, "configmap", max_ttl_s=MAX_TTL_S)
    finally:
        await clusters.aclose()
    return store.load()


@contextmanager
def _deterministic(seed: int) -> Iterator[Any]:
    """Trio's scheduler in seeded order, and its MockClock (whose start it draws)."""
    import trio._core._run as trio_run
    from trio.testing import MockClock

    saved = (trio_run._ALLOW_DETERMINISTIC_SCHEDULING, trio_run._r.getstate())
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(seed)
    mock = MockClock(autojump_threshold=0)

    def current_time() -> float:
        # The run loop and every task read the time, hundreds of thousands of times a run;
        # a clock that only jumps (rate 0) reads its base, as MockClock computes it
        # (base + 0.0 * elapsed), without reading the real clock.
        return mock._virtual_base if mock._rate == 0.0 else MockClock.current_time(mock)

    mock.current_time = current_time  # type: ignore[method-assign]  # (MockClock is final)
    try:
        yield mock
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved[0]  # type: ignore[misc]
        trio_run._r.setstate(saved[1])


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """The cyclic garbage collector's youngest generation collected every 10,000
    allocations, not every 700: a run allocates millions of short-lived objects, and
    about 5% of its CPU went to collections (hundreds a run). Nothing in a run depends on
    when garbage is collected (a seed gives the same run in a fresh process and in one
    that ran others before: test_a_seed_is_a_run_in_this_process_and_in_another)."""
    saved = gc.get_threshold()
    gc.set_threshold(10_000, *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def lease_uid(view: Any) -> str | None:
    """The server's uid of the Lease object a view was read or written as (metadata.uid)."""
    meta = (getattr(view, "obj", None) or {}).get("metadata") or {}
    uid = meta.get("uid")
    return str(uid) if uid else None


@contextmanager
def _recording_renewals(into: list[dict[str, Any]]) -> Iterator[None]:
    """Every renewal the engines run (``Renew.renew``: ``Coordinator.lock``'s background
    renewals and ``lock renew`` alike), recorded with the true virtual times it began and
    returned and the members where it renewed the lease. The wrapper adds no await of its
    own, so runs stay what they were (the same history fingerprints)."""
    from coordinator.engine.lock.renew import Renew

    original = Renew.renew

    async def renew(
        self: Any, lock_id: str, token: int, ttl_s: float, holder: str | None = None, *, _followed: bool = False
    ) -> Any:
        if _followed:  # the same renewal, counted again over the members a change moved to
            return await original(self, lock_id, token, ttl_s, holder, _followed=True)
        invoked = now()
        result = await original(self, lock_id, token, ttl_s, holder)
        renewed = {
            c: lease_uid(r.value.view)
            for c, r in sorted(result.results.items())
            if r.ok and r.value is not None and r.value.action == "renewed"
        }
        into.append(
            {"lock_id": lock_id, "holder": holder, "invoked": invoked, "complete": now(), "renewed": renewed,
             "acquired": bool(result.acquired), "lost": result.lost}
        )  # fmt: skip
        return result

    Renew.renew = renew  # type: ignore[method-assign]
    try:
        yield
    finally:
        Renew.renew = original  # type: ignore[method-assign]


@contextmanager
def _harness_patches() -> Iterator[None]:
    """What the simulator replaces around the product: replicas saved before they are
    overwritten are kept in memory, not written to the user's state directory; the
    engines' log lines (warnings of unreachable members, ...) are not written."""
    import logging

    from coordinator import logs
    from coordinator.engine.state.replicas import Replicas

    level = logs._level
    logs._level = logging.CRITICAL + 1

    saved = Replicas.save_replica

    def keep(self: Any, rep: Any, backup_dir: Path | None, reason: str) -> Path:
        return Path(f"/sim/corrupt-replicas/{self.dep.name}-{rep.cluster}.json")

    Replicas.save_replica = keep  # type: ignore[method-assign]
    try:
        yield
    finally:
        Replicas.save_replica = saved  # type: ignore[method-assign]
        logs._level = level


def run(opts: Options) -> Result:
    """One run of the simulator, from the seed; never raises for what the run found."""
    from sim import plants
    from sim.schedule import draw

    schedule = draw(opts)
    if opts.keep is not None:
        schedule = [f for f in schedule if f.index in opts.keep]
    started = time.process_time()
    with (
        tempfile.TemporaryDirectory(prefix="sim-") as tmp,
        _harness_patches(),
        plants.planted(opts.plant),
        _fewer_collections(),
    ):
        with _deterministic(opts.seed) as mock:
            result = anyio.run(_run, opts, schedule, Path(tmp), backend="trio", backend_options={"clock": mock})
    result.cpu_s = time.process_time() - started
    return result


async def _run(opts: Options, schedule: list[Any], workdir: Path) -> Result:

    _T0[0] = anyio.current_time()
    harness = (SimClock(1.0, 0.0, 0.0), SeededChance(random.Random(f"{opts.seed}:harness")), SimProcess("harness", 1))
    with clock.using(*harness):
        return await _run_in(opts, schedule, workdir)


async def _run_in(opts: Options, schedule: list[Any], workdir: Path) -> Result:
    from sim.contenders import contenders
    from sim.schedule import Injector

    rng = random.Random(f"{opts.seed}:world")
    world = World(clock=server_time, rng=random.Random(f"{opts.seed}:servers"))
    # With member changes, one cluster more is connected: the one a change adds.
    names = [f"c{i + 1}" for i in range(opts.clusters + (1 if opts.changers else 0))]
    for name in names:
        cluster = world.cluster(name, apiservers=2 if opts.server_skew else 1)
        if opts.server_skew:
            skew = rng.uniform(-opts.server_skew, opts.server_skew)
            cluster.servers[1].offset = timedelta(seconds=skew)
    net = Network(random.Random(f"{opts.seed}:network"))
    config = await _setup(world, workdir, names, names[: opts.clusters])
    sim = Sim(opts, world, net, Recorder(), config, workdir)
    injector = Injector(sim, schedule)
    players = contenders(sim)
    with _recording_renewals(sim.renewals):
        async with anyio.create_task_group() as tg:
            net.background = tg
            done = [anyio.Event() for _ in players]
            for player, event in zip(players, done, strict=True):
                tg.start_soon(_play, player.run, event)
            tg.start_soon(injector.run)
            await anyio.sleep(opts.seconds)
            sim.stop.set()
            with anyio.move_on_after(10 * MAX_TTL_S):
                for event in done:
                    await event.wait()
            await injector.heal()
            tg.cancel_scope.cancel()
    net.background = None
    await injector.heal()
    await _final_read(sim)
    return _judge(sim, schedule)


async def _play(body: Callable[[], Awaitable[None]], done: anyio.Event) -> None:
    try:
        await body()
    finally:
        done.set()


async def _final_read(sim: Sim) -> None:
    """Once every fault is undone and every contender stopped: the value that stayed."""
    from coordinator.errors import CoordinatorError

    last = ""
    for _ in range(10):
        invoked = now()
        try:
            async with sim.coordinator("final-read") as c:
                data = await c.state(DEPLOYMENT).get()
        except CoordinatorError as err:
            last = err.message
            await anyio.sleep(5)
            continue
        value = data.get(KEY) if isinstance(data, dict) else data
        sim.recorder.add_op(
            {"process": "final-read", "kind": "read", "value": value, "invoke": invoked, "complete": now(),
             "status": "ok"}
        )  # fmt: skip
        return
    sim.recorder.problem(f"final read: the state could not be read after every fault was undone: {last}")


def _stale_writes(sim: Sim) -> list[Violation]:
    """Writes accepted although a lock with a higher token was granted before they began."""
    found = []
    for w in sim.writes:
        newer = [(t, tok) for t, tok in sim.granted if tok > w["token"] and t < w["invoke"]]
        if newer:
            t, tok = newer[0]
            found.append(
                Violation(
                    kind="stale-write",
                    message=(
                        f"stale write accepted: {w['process']} wrote {w['value']!r} with token {w['token']} "
                        f"at {w['invoke']:.3f}, after token {tok} was granted at {t:.3f}"
                    ),
                    window=(t, w["invoke"]),
                )
            )
    return found


def _broken_renewed(sim: Sim) -> list[Violation]:
    """A break sticks (docs/design.md, *Renewing, losing, releasing*: a renewal never
    re-takes a lease, since that is how a `lock break` would be undone).

    For each `lock break` that exited 0 (a majority of the members answered with their
    lease cleared or free, as the command judges it) and each lock id X it cleared by its
    own write: no renewal of X that began after the break returned may renew X on a member
    where the break cleared it, on the same Lease object (uid). A renewal that reports the
    lock renewed on a majority of the same members after such a break renewed one of them
    (two majorities share a member), so that is caught too.

    Correct code cannot fail it. The break's write is a compare-and-swap that leaves the
    lease with no holder; every later write to that object is a compare-and-swap over a
    version read after it (a request delayed or duplicated from before the break is
    refused: the resourceVersion it names is gone). A renewal writes only over a version
    that names its own lock id, a restored lease comes back tombstoned (no holder), and
    other clients never write one of our lock ids. So only a take could put X back there,
    and takes are ruled out: judged are the lock ids of ``api`` and ``cmd`` holders whose
    section began before the break was invoked (their acquisition had returned; an attempt
    still under way may take a lease the break freed, and count it), and no member change
    runs under those locks (a change takes leases of joining members for its lock).
    Members the break did not write (not reached, already free, absent) and Leases made
    again since (another uid) are not judged: a write sent before the break may land there."""
    found = []
    judged = 0
    for b in sim.breaks:
        if b["exit"] != 0:
            continue
        for lock_id, cleared in sorted(b["cleared"].items()):
            began = sim.entered.get(lock_id)
            if began is None or began[1] not in ("api", "cmd") or began[2] >= b["invoked"]:
                continue
            for r in sim.renewals:
                if r["lock_id"] != lock_id or r["invoked"] <= b["complete"]:
                    continue
                judged += 1
                again = sorted(c for c, uid in r["renewed"].items() if uid is not None and cleared.get(c) == uid)
                if not again:
                    continue
                reported = "; it reported the lock renewed" if r["acquired"] else ""
                found.append(
                    Violation(
                        kind="break-undone",
                        message=(
                            f"a break did not stick: lock {lock_id} of {began[0]} was broken from {b['invoked']:.3f} "
                            f"to {b['complete']:.3f} (exit 0, cleared on {', '.join(cleared)}); a renewal begun at "
                            f"{r['invoked']:.3f} renewed it again on {', '.join(again)}{reported}"
                        ),
                        window=(b["invoked"], r["complete"]),
                    )
                )
    if judged:
        sim.recorder.stats["renewals judged after a break of their lock"] += judged
    return found


def _judge(sim: Sim, schedule: list[Any]) -> Result:
    rec = sim.recorder
    recorded: list[dict[str, Any]] = [
        {"process": s.process, "mode": s.mode, "token": s.token, "enter": s.enter, "exit": s.exit, "how": s.how}
        for s in rec.sections
        if s.exit is not None
    ]
    lock_ids = {(process, t): lock_id for lock_id, (process, _, t) in sim.entered.items()}
    for s in recorded:
        lock_id = lock_ids.get((s["process"], s["enter"]))
        if lock_id is not None and lock_id in sim.truth.held_from:
            s["held_from"] = sim.truth.held_from[lock_id]
    sections = apply_breaks(recorded, rec.breaks)
    ops = list(rec.ops.values())
    checks = [
        check_mutual_exclusion(
            [{k: s[k] for k in ("process", "token", "enter", "exit", "unordered") if k in s} for s in sections]
        ),
        check_linearizable_register(ops, initial=None, max_states=500_000),
    ]
    reads = [o for o in ops if o["kind"] == "read" and o["status"] == "ok"]
    if reads and max(reads, key=lambda r: r["invoke"])["process"] == "final-read":
        checks.append(check_no_lost_writes(ops, initial=None))
    checks.append(CheckResult(check="breaks stick", violations=tuple(_broken_renewed(sim))))
    checks.append(CheckResult(check="fencing", violations=tuple(_stale_writes(sim))))
    result = Result(
        sim.opts,
        sections,
        ops,
        checks,
        list(rec.problems),
        sim.faults,
        schedule,
        rec.stats,
        virtual_s=now(),
        requests=sim.net.requests,
        stale_accepted=len(checks[-1].violations),
        notes=list(sim.notes),
    )
    result.digest = _digest(result, sim.world)
    return result


def _digest(result: Result, world: World) -> str:
    """A fingerprint of the history and of every object the API servers hold at the end
    (leases, state objects, the lock history, with what each contender wrote into them):
    equal for equal runs (the replay check)."""
    import hashlib
    import json

    stores = {
        name: sorted((repr(key), json.dumps(obj, sort_keys=True, default=str)) for key, obj in c.store.objects.items())
        for name, c in sorted(world.clusters.items())
    }
    text = repr(
        (
            [(s["process"], s["token"], round(s["enter"], 6), round(s["exit"], 6)) for s in result.sections],
            [(o["process"], o["kind"], o["value"], o["status"], round(o["invoke"], 6)) for o in result.operations],
            sorted(result.faults.items()),
            stores,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------ shrinking and many runs


def shrink(opts: Options, fails: Callable[[Result], bool], *, budget_s: float = 300.0) -> Options:
    """Delta debugging (ddmin) over the schedule's faults: the smallest set of fault
    indices found, within ``budget_s`` CPU seconds, with which the run still fails."""
    from sim.schedule import draw

    indices = [f.index for f in draw(opts) if opts.keep is None or f.index in opts.keep]
    began = time.process_time()
    n = 2

    def still_fails(keep: Sequence[int]) -> bool:
        return fails(run(Options(**{**vars(opts), "keep": tuple(keep)})))

    if still_fails([]):
        return Options(**{**vars(opts), "keep": ()})
    while len(indices) >= 2 and time.process_time() - began < budget_s:
        chunk = max(1, len(indices) // n)
        parts = [indices[i : i + chunk] for i in range(0, len(indices), chunk)]
        reduced = False
        for part in parts:
            rest = [i for i in indices if i not in part]
            if time.process_time() - began >= budget_s:
                break
            if still_fails(part):
                indices, n, reduced = part, 2, True
                break
            if len(parts) > 2 and still_fails(rest):
                indices, n, reduced = rest, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(indices):
                break
            n = min(len(indices), n * 2)
    return Options(**{**vars(opts), "keep": tuple(indices)})


# ------------------------------------------------------------------ the command


def parse(argv: Sequence[str]) -> tuple[Options, Any]:
    import argparse

    p = argparse.ArgumentParser(prog="simulate.py", description="The deterministic simulator (tests/sim/simulate.py).")
    p.add_argument("--seed", type=int, default=None, help="the first seed (default: a fresh one)")
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="how many seeds, from --seed on (default 1; with --until-found, no limit)",
    )
    p.add_argument("--sections", type=int, default=0, help="run seeds until this many lock sections")
    p.add_argument("--cpu-minutes", type=float, default=0.0, help="stop starting runs after this much CPU")
    p.add_argument("--until-found", action="store_true", help="stop at the first failing seed")
    p.add_argument("--shrink", action="store_true", help="shrink a failing seed's schedule")
    p.add_argument("--clusters", type=int, default=3)
    p.add_argument("--api", type=int, default=2)
    p.add_argument("--cmd", type=int, default=1)
    p.add_argument("--readers", type=int, default=1)
    p.add_argument(
        "--changers", type=int, default=0, help="contenders that add and remove members (a spare cluster is connected)"
    )
    p.add_argument("--state", type=float, default=0.5, help="the share of sections that do anything inside")
    p.add_argument("--seconds", type=float, default=300.0, help="virtual seconds of workload per run")
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--rate-skew", type=float, default=0.009)
    p.add_argument("--server-skew", type=float, default=0.0)
    p.add_argument(
        "--long-holds",
        action="store_true",
        help="command holders hold to the end of their validity, as their own clock counts it, without renewing",
    )
    p.add_argument("--faults", type=float, default=1.0, help="fault episodes per 10 virtual seconds")
    p.add_argument("--kinds", default="", help="fault kinds, comma-separated (default: all)")
    p.add_argument("--fields", default="", help="the evidence fields foreign writes edit (default: all)")
    p.add_argument("--keep", default=None, help="schedule indices to keep (a shrunk schedule), or none")
    p.add_argument("--plant", default=None, help="a planted bug (sim/plants.py)")
    p.add_argument(
        "--paired",
        action="store_true",
        help="run each seed twice, with the writers' fencing and without it (the no-fencing plant)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print each run's faults and violations")
    ns = p.parse_args(list(argv))
    keep = None
    if ns.keep is not None:
        keep = () if ns.keep == "none" else tuple(int(x) for x in ns.keep.split(",") if x)
    seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(1, 10**9)
    if ns.plant:
        # What reaches the planted bug (its fault kinds, fields, server skew), unless given.
        from sim.plants import PLANTS

        given = {"kinds": ns.kinds, "fields": ns.fields, "server_skew": ns.server_skew}
        for key, value in PLANTS[ns.plant].options.items():
            if not given.get(key):
                setattr(ns, key, ",".join(value) if isinstance(value, tuple) else value)
    opts = Options(
        seed=seed,
        clusters=ns.clusters,
        api=ns.api,
        cmd=ns.cmd,
        readers=ns.readers,
        changers=ns.changers,
        state=ns.state,
        seconds=ns.seconds,
        timeout=ns.timeout,
        rate_skew=ns.rate_skew,
        long_holds=ns.long_holds,
        server_skew=ns.server_skew,
        kinds=tuple(k for k in ns.kinds.split(",") if k),
        fields=tuple(f for f in ns.fields.split(",") if f),
        faults=ns.faults,
        keep=keep,
        plant=ns.plant,
    )
    return opts, ns


def report(result: Result, *, verbose: bool = False) -> list[str]:
    lines = [result.summary()]
    if verbose or not result.passed:
        lines += [f"  {v}" for v in result.violations[:10]]
        if len(result.violations) > 10:
            lines.append(f"  ... {len(result.violations) - 10} more")
    if not result.passed:
        lines.append(f"  replay: {result.options.command()}")
    return lines


def paired(opts: Options, runs: int) -> int:
    """The same schedules with fencing on and off: stale writes accepted in each."""
    totals = {"on": 0, "off": 0}
    writes = {"on": 0, "off": 0}
    for seed in range(opts.seed, opts.seed + runs):
        line = [f"seed {seed}:"]
        for mode, plant in (("on", None), ("off", "no-fencing")):
            result = run(Options(**{**vars(opts), "seed": seed, "plant": plant}))
            totals[mode] += result.stale_accepted
            ok = sum(1 for o in result.operations if o["kind"] == "write" and o["status"] == "ok")
            writes[mode] += ok
            line.append(f"fencing {mode}: {result.stale_accepted} stale writes accepted of {ok} accepted writes;")
        print(" ".join(line), flush=True)
    print(
        f"{runs} paired runs: fencing on {totals['on']} stale writes accepted (of {writes['on']}), "
        f"fencing off {totals['off']} (of {writes['off']})",
        flush=True,
    )
    return 1 if totals["on"] else 0


def main(argv: Sequence[str]) -> int:
    opts, ns = parse(argv)
    if ns.paired:
        return paired(opts, ns.runs or 1)
    # Without a limit, --until-found tries seeds until one fails.
    limit = ns.runs if ns.runs is not None else (0 if ns.until_found or ns.sections or ns.cpu_minutes else 1)
    sections = cpu = 0.0
    failed: list[Result] = []
    runs = 0
    seed = opts.seed
    while True:
        one = Options(**{**vars(opts), "seed": seed})
        result = run(one)
        runs += 1
        sections += len(result.sections)
        cpu += result.cpu_s
        for line in report(result, verbose=ns.verbose):
            print(line, flush=True)
        if not result.passed:
            failed.append(result)
            if ns.shrink:
                small = shrink(one, lambda r: not r.passed)
                print(f"  shrunk to faults {list(small.keep or ())}: {small.command()}", flush=True)
            if ns.until_found:
                break
        seed += 1
        if ns.sections and sections >= ns.sections:
            break
        if ns.cpu_minutes and cpu >= ns.cpu_minutes * 60:
            break
        if limit and runs >= limit:
            break
    rate = sections / cpu * 3600 if cpu else 0.0
    print(
        f"{runs} runs (seeds {opts.seed}..{seed if failed and ns.until_found else seed - 1}), "
        f"{int(sections)} lock sections in {cpu:.1f}s CPU: {rate:,.0f} sections per CPU-hour, "
        f"{rate / SOAK_SECTIONS_PER_CPU_HOUR:,.0f}x the real-server soak's {SOAK_SECTIONS_PER_CPU_HOUR:,.0f}; "
        f"{len(failed)} failing seeds",
        flush=True,
    )
    return 1 if failed else 0
