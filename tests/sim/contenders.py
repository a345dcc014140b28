"""The simulator's contenders: tasks that call the product's API as the fault suite's
contender processes do (tests/faults/contenders.py), and report what they saw to the
fault suite's Recorder, with true virtual times (sim/simulate.py)."""

from __future__ import annotations

import random
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from coordinator import clock
from coordinator.rules.lease import remaining_validity
from sim.simulate import DEPLOYMENT, KEY, MAX_TTL_S, SeededChance, Sim, SimClock, SimProcess, now

if TYPE_CHECKING:
    from coordinator.engine.state import StateClient
    from coordinator.ops.api import Coordinator, HeldLock

# Enter, and start each step, only with this much validity left.
MARGIN_S = 0.5
# The exit codes each command may end with (README, *Exit codes*); any other is a problem.
ALLOWED = {
    "acquire": {0, 3, 4},
    "release": {0, 4, 6},
    "renew": {0, 4, 6},
    "write": {0, 3, 4, 6},
    "read": {0, 4},
    "sync": {0, 2, 4, 6},
    # a member change: 3 the lock is held, 4 too few answered (the change stops in a safe
    # state and a rerun finishes it), 6 the lock was lost or is not held by its --lock-id
    "change": {0, 3, 4, 6},
}


def stale_record(err: Exception) -> bool:
    """Exit 5 because a member change moved the deployment on: this contender's record is
    older than the set the members store (the `deployment import` hint), or it is the
    machine's record of a change that stopped half-way (the hint to finish it). Expected
    of the holders and readers while a changer runs; counted."""
    from coordinator.errors import MembershipError

    if not isinstance(err, MembershipError):
        return False
    # or the record is the machine's own change in progress, stopped half-way, whose joint
    # set not enough members store yet: finishing the change brings them along
    return "differs from this machine's record" in err.message or "stopped half-way" in err.message


def unseen_exit_5(err: Exception) -> bool:
    """Exit 5 from a member-set check that found no member agreeing, some silent (a
    tombstone, a deleted object) and the others unreachable: membership.check answers
    UNCONFIRMED there (a record naming clusters that were never members must get the
    import hint), where the README's "exit 4 when too few answered to tell" reads as if
    the unseen members could still confirm. Counted, not a violation (docs/simulator.md)."""
    from coordinator.errors import MembershipError

    return isinstance(err, MembershipError) and "could not be read" in err.message


class Contender:
    mode = "?"

    def __init__(self, sim: Sim, name: str, index: int) -> None:
        self.sim = sim
        self.name = name
        seed = sim.opts.seed
        self.rng = random.Random(f"{seed}:{name}")
        skew = sim.opts.rate_skew
        self.clock = SimClock(
            rate=1.0 + self.rng.uniform(-skew, skew),
            boot_offset=self.rng.uniform(0, 1e6),
            wall_offset=self.rng.uniform(-600, 600),
        )
        self.chance = SeededChance(random.Random(f"{seed}:{name}:chance"))
        # A generator of its own, so that the contender's other draws stay as they were.
        self.process = SimProcess(name, random.Random(f"{seed}:{name}:pid").randrange(2, 4_194_304))
        self.ttl = float(self.rng.choice((5, 8, 10, 15)))
        self.values = 0
        self.ops = 0

    # -- the history

    def emit(self, event: str, **fields: Any) -> None:
        self.sim.recorder.handle(self.name, {"ev": event, **fields})

    def problem(self, what: str, detail: str) -> None:
        self.sim.note(f"{self.name}: problem: {what}")
        self.emit("problem", what=what, detail=detail)

    def stat(self, name: str) -> None:
        self.emit("stat", name=f"{self.mode} {name}")

    def next_value(self) -> str:
        self.values += 1
        return f"{self.name}n{self.values}"

    def begin(self, kind: str, value: str | None) -> str:
        self.ops += 1
        op = f"{self.name}:{self.ops}"
        self.emit("invoke", op=op, kind=kind, value=value, t=now())
        return op

    def end(self, op: str, status: str, value: Any = None) -> None:
        self.emit("complete", op=op, status=status, value=value, t=now())

    def stopping(self) -> bool:
        return self.sim.stop.is_set()

    def true_until(self, boot_until: float) -> float:
        return self.clock.true_time(boot_until)

    async def command(self, what: str, call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
        """Run one call of the API as a command would: its exit code and its value; an
        exit code outside ``ALLOWED[what]`` or an unexpected exception is a problem."""
        from coordinator.errors import CoordinatorError

        try:
            return 0, await call()
        except CoordinatorError as err:
            rc = int(err.exit_code)
            if rc == 5 and unseen_exit_5(err):
                self.stat(f"{what} exit 5 with members unseen")
                return 4, err
            if rc == 5 and self.sim.opts.changers and stale_record(err):
                self.stat(f"{what} exit 5: the record is stale")
                return 4, err  # refused before anything was sent: as too few answers
            if rc not in ALLOWED[what]:
                self.problem(f"{what} exit {rc}", f"{type(err).__name__}: {err.message[:600]}")
            return rc, err
        except Exception as err:
            self.problem(f"{what} internal", f"{type(err).__name__}: {err}: {traceback.format_exc()[-1500:]}")
            return 1, err

    # -- the steps every holder has

    async def write(self, state: StateClient, lock: Any, token: int, *, apply: bool = False) -> None:
        value = self.next_value()
        op = self.begin("write", value)
        invoked = now()
        if apply:
            rc, _ = await self.command("write", lambda: state.apply({KEY: value}, lock=lock))
        else:
            rc, _ = await self.command("write", lambda: state.set({KEY: value}, lock=lock))
        status = "ok" if rc == 0 else "fail" if rc in (3, 6) else "unknown"
        self.end(op, status)
        if status == "ok":
            self.sim.writes.append({"process": self.name, "token": token, "invoke": invoked, "value": value})

    async def read(self, state: StateClient) -> None:
        op = self.begin("read", None)
        rc, data = await self.command("read", state.get)
        if rc != 0:
            self.end(op, "fail")
            return
        if not isinstance(data, dict):
            self.problem("bad value", f"state.get returned a {type(data).__name__}, not a mapping")
            self.end(op, "fail")
            return
        self.end(op, "ok", data.get(KEY))

    async def late_write(self, state: StateClient, lock_id: str, token: int) -> None:
        """Stopped (a GC pause, SIGSTOP) after checking its validity and before a write,
        for longer than the lock's TTL: nothing this contender sends leaves meanwhile, its
        renewals included; then the write goes out with the lock id, unchecked. Fencing
        must refuse it once another holder has the lock."""
        pause = self.ttl * self.rng.uniform(1.2, 3.0)
        self.sim.net.freeze(self.name)
        self.sim.note(f"{self.name} stops for {pause:.1f}s before a write")
        await anyio.sleep(pause)
        self.sim.net.thaw(self.name)
        await self.write(state, lock_id, token)

    async def run(self) -> None:
        with clock.using(self.clock, self.chance, self.process):
            self.emit("start", mode=self.mode)
            while not self.stopping():
                await self.iteration()
                await anyio.sleep(self.rng.uniform(0.2, 1.2))

    async def iteration(self) -> None:
        raise NotImplementedError


class ApiHolder(Contender):
    """``Coordinator.lock``: renewed in the background, released at the end of the block."""

    mode = "api"

    async def run(self) -> None:
        with clock.using(self.clock, self.chance, self.process):
            self.emit("start", mode=self.mode)
            while not self.stopping():
                async with self.sim.coordinator(self.name) as c:
                    for _ in range(self.rng.randint(1, 6)):
                        if self.stopping():
                            break
                        await self.iteration_with(c)
                        await anyio.sleep(self.rng.uniform(0.2, 1.2))

    async def iteration_with(self, c: Coordinator) -> None:
        from coordinator.errors import CoordinatorError, LockHeldError, NoQuorumError

        state = c.state(DEPLOYMENT)
        wait = self.rng.choice((0.0, 0.5, 2.0, 6.0))
        try:
            async with c.lock(DEPLOYMENT, ttl=self.ttl, wait=wait, holder=self.name, reason="sim") as held:
                self.stat("acquire exit 0")
                await self.critical(state, held)
        except LockHeldError:
            self.stat("acquire exit 3")
        except NoQuorumError:
            self.stat("acquire exit 4")
        except CoordinatorError as err:
            if unseen_exit_5(err):
                self.stat("acquire exit 5 with members unseen")
            elif self.sim.opts.changers and stale_record(err):
                self.stat("acquire exit 5: the record is stale")
            else:
                why = f"Coordinator.lock: {type(err).__name__}: {err.message[:600]}"
                self.problem(f"exit {int(err.exit_code)}", why)
        except Exception as err:
            self.problem("internal", f"Coordinator.lock raised {type(err).__name__}: {traceback.format_exc()[-1500:]}")
        if not self.stopping() and self.rng.random() < 0.15:
            await self.read(state)

    async def critical(self, state: StateClient, held: HeldLock) -> None:
        def until() -> float:
            return self.true_until(held.result.valid_until())

        entered = now()
        if not held.valid or entered >= until() - MARGIN_S:
            self.stat("validity gone before entry")
            return
        token = held.fencing_token
        self.sim.granted.append((entered, token))
        self.sim.entered[held.lock_id] = (self.name, self.mode, entered)
        self.emit("enter", t=entered, token=token, valid_until=until(), lock_id=held.lock_id)
        steps = self.rng.randint(1, 3) if self.rng.random() < self.sim.opts.state else 0
        try:
            for _ in range(steps):
                if self.stopping() or not held.valid or now() >= until() - MARGIN_S:
                    break
                action = self.rng.choices(("write", "burst", "read", "hold", "late"), weights=(4, 1, 2, 4, 1))[0]
                if action == "write":
                    await self.write(state, held, token)
                elif action == "burst":
                    async with anyio.create_task_group() as burst:
                        for _ in range(self.rng.randint(2, 3)):
                            burst.start_soon(self.write, state, held, token)
                elif action == "read":
                    await self.read(state)
                elif action == "hold":
                    await anyio.sleep(max(0.0, min(self.rng.uniform(0.05, 1.5), until() - now())))
                else:
                    self.exit_at(until())
                    await self.late_write(state, held.lock_id, token)
                    return
        finally:
            if self.name in self.sim.recorder.inside:
                self.exit_at(until())

    def exit_at(self, valid_until: float) -> None:
        left = now()
        self.emit("valid", valid_until=valid_until)
        self.emit("exit", t=min(left, valid_until), overstay=left > valid_until)


class CommandHolder(Contender):
    """One ``Coordinator`` per step, as the command line makes one per command:
    ``lock acquire``, ``lock renew``, ``state set``/``state apply --lock-id``, ``lock release``."""

    mode = "cmd"

    async def iteration(self) -> None:
        wait = self.rng.choice((0.0, 2.0, 5.0))
        asked = self.clock.boot()

        async def acquire() -> Any:
            async with self.sim.coordinator(self.name) as c:
                return await c.acquire(DEPLOYMENT, ttl=self.ttl, wait=wait, holder=self.name, reason="sim")

        rc, result = await self.command("acquire", acquire)
        self.stat(f"acquire exit {rc}")
        if rc != 0:
            await anyio.sleep(self.rng.uniform(0.5, 2.5))
            return
        lock_id, token = str(result.lock_id), int(result.fencing_token)
        boot_until = asked + remaining_validity(self.ttl, 0.0)
        try:
            await self.critical(lock_id, token, boot_until)
        finally:
            counted: list[str] = []

            async def release() -> Any:
                async with self.sim.coordinator(self.name) as c:
                    counted[:] = c.config.deployments[DEPLOYMENT].clusters  # the record it releases with
                    return await c.release(DEPLOYMENT, lock_id=lock_id, holder=self.name)

            rc, _ = await self.command("release", release)
            if rc == 0:
                self.check_released(lock_id, counted)
        if not self.stopping() and self.rng.random() < 0.3:
            async with self.sim.coordinator(self.name) as c:
                await self.read(c.state(DEPLOYMENT))

    def enter(self, lock_id: str, token: int, boot_until: float) -> bool:
        """Record the section's entry; False (counted) when too little validity is left."""
        entered = now()
        if entered >= self.true_until(boot_until) - MARGIN_S:
            self.stat("validity gone before entry")
            return False
        self.sim.granted.append((entered, token))
        self.sim.entered[lock_id] = (self.name, self.mode, entered)
        self.emit("enter", t=entered, token=token, valid_until=self.true_until(boot_until), lock_id=lock_id)
        return True

    async def critical(self, lock_id: str, token: int, boot_until: float) -> None:
        if not self.enter(lock_id, token, boot_until):
            return
        steps = self.rng.randint(1, 3) if self.rng.random() < self.sim.opts.state else 0
        try:
            for _ in range(steps):
                if self.stopping() or now() >= self.true_until(boot_until) - MARGIN_S:
                    break
                action = self.rng.choices(("write", "apply", "read", "renew", "hold", "late"),
                                          weights=(5, 1, 2, 2, 1, 1))[0]  # fmt: skip
                async with self.sim.coordinator(self.name) as c:
                    state = c.state(DEPLOYMENT)
                    if action in ("write", "apply"):
                        await self.write(state, lock_id, token, apply=action == "apply")
                    elif action == "read":
                        await self.read(state)
                    elif action == "renew":
                        asked = self.clock.boot()
                        rc, _ = await self.command("renew", lambda: c.renew(DEPLOYMENT, lock_id, holder=self.name))
                        self.stat(f"renew exit {rc}")
                        if rc != 0:
                            break  # lost, or not known to be held: leave
                        boot_until = max(boot_until, asked + remaining_validity(self.ttl, 0.0))
                        self.emit("valid", valid_until=self.true_until(boot_until))
                    elif action == "hold":
                        left = self.true_until(boot_until) - now()
                        if self.sim.opts.long_holds:
                            # Until its own clock says the validity is nearly over: where a
                            # clock that runs slow beyond the bound keeps it inside too long.
                            await anyio.sleep(max(0.0, left - MARGIN_S))
                        else:
                            await anyio.sleep(max(0.0, min(self.rng.uniform(0.1, 1.0), left)))
                    else:
                        self.exit_at(self.true_until(boot_until))
                        await self.late_write(state, lock_id, token)
                        return
        finally:
            if self.name in self.sim.recorder.inside:
                self.exit_at(self.true_until(boot_until))

    def exit_at(self, valid_until: float) -> None:
        left = now()
        self.emit("exit", t=min(left, valid_until), overstay=left > valid_until)

    def check_released(self, lock_id: str, members: list[str]) -> None:
        """A release that exits 0 has cleared its lock id from a majority of the members it
        counted with: what stays (on members it did not reach) is less than a majority.
        Read from the stores. A lease whose holder field no coordinator manager owns any
        more (managedFields stripped, or merged into another manager's entry) is no
        longer the holder's (docs/design.md, *Evidence has an owner*): it blocks as held
        by an unknown holder until it lapses, and a release leaves it."""
        from coordinator.rules.lease import lock_id_of
        from coordinator.rules.quorum import quorum_size

        still = [
            c
            for c in members
            if (obj := self.sim.world.clusters[c].store.objects.get(_lease_key())) is not None
            and lock_id_of((obj.get("spec") or {}).get("holderIdentity")) == lock_id
            and _holder_owned_by_coordinator(obj)
        ]
        if len(still) >= quorum_size(len(members)):
            self.problem("release exit 0", f"lock {lock_id} still held on {still} after its release exited 0")


def _holder_owned_by_coordinator(obj: dict[str, Any]) -> bool:
    """Whether a coordinator field manager's managedFields entry owns spec.holderIdentity."""
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        owned = ((entry.get("fieldsV1") or {}).get("f:spec") or {}) if isinstance(entry, dict) else {}
        if str(entry.get("manager", "")).startswith("coordinator") and "f:holderIdentity" in owned:
            return True
    return False


def _lease_key() -> tuple[str, str, str]:
    from coordinator.rules.resources import lease_name
    from sim.simulate import NAMESPACE

    return ("leases", NAMESPACE, lease_name(DEPLOYMENT))


class Reader(Contender):
    """Reads the state without the lock, and now and then runs ``state sync``."""

    mode = "read"

    def _sync(self, state: StateClient) -> Callable[[], Awaitable[Any]]:
        async def sync() -> Any:
            return await state.sync(self.sim.workdir / self.name / "sync")  # a directory of its own

        return sync

    async def run(self) -> None:
        with clock.using(self.clock, self.chance, self.process):
            self.emit("start", mode=self.mode)
            if self.sim.opts.changers:
                # one command at a time, each with the machine's record as it is then
                while not self.stopping():
                    async with self.sim.coordinator(self.name) as c:
                        await self.step(c)
                return
            async with self.sim.coordinator(self.name) as c:
                while not self.stopping():
                    await self.step(c)

    async def step(self, c: Coordinator) -> None:
        state = c.state(DEPLOYMENT)
        if self.rng.random() < 0.1:
            rc, _ = await self.command("sync", self._sync(state))
            self.stat(f"sync exit {rc}")
        else:
            await self.read(state)
        await anyio.sleep(self.rng.uniform(2.0, 6.0))


class Changer(CommandHolder):
    """A machine that adds and removes members (`deployment add-cluster`/`remove-cluster`):
    it adds the spare cluster, then removes any member, and so on. Half its changes run
    under a lock it took first (``--lock-id``: the section is recorded as a command
    holder's), half take the lock themselves (their sections are not recorded: the lock
    is taken inside the change). A change that stops is run again with the same target
    until it finishes, as its message asks (also once the workload ended). The machine's record is the one every other
    contender starts its next command from; a contender that kept an older one is refused
    (exit 5, counted)."""

    mode = "member"
    stopped: list[str] | None = None  # the target of a change that stopped: run it again

    def target(self) -> list[str]:
        record = self.sim.config.deployments[DEPLOYMENT]
        if record.joint is not None:
            return list(record.joint)  # finish the change in progress
        members = list(record.clusters)
        if self.stopped == members:
            # another machine's change reached this one's target meanwhile: it is done
            # (run again, it would be refused: nothing to change)
            self.stopped = None
        if self.stopped is not None:
            return list(self.stopped)  # "run the same command again to finish it"
        spare = [n for n in self.sim.world.clusters if n not in members]
        if len(members) > self.sim.opts.clusters or not spare:
            gone = self.rng.choice(members)
            return [m for m in members if m != gone]
        return [*members, self.rng.choice(spare)]

    async def change(self, target: list[str], lock_id: str | None = None, *, wait: float | None = None) -> int:
        from coordinator.ops.reconfig import change_members

        async def run() -> Any:
            async with self.sim.coordinator(self.name) as c:
                started = c.config.deployments[DEPLOYMENT]
                try:
                    return await change_members(
                        c, DEPLOYMENT, target, lock_id=lock_id, holder=self.name, ttl=self.ttl,
                        wait=self.rng.choice((0.0, 5.0)) if wait is None else wait,
                    )  # fmt: skip
                finally:
                    # What the change recorded, done or stopped (a joint record included),
                    # is this machine's record from now on, as a command saves it into the
                    # config file. A change that saved nothing leaves the record alone:
                    # another machine-mate's change may have moved it on meanwhile.
                    if c.config.deployments[DEPLOYMENT] != started:
                        self.sim.config.deployments[DEPLOYMENT] = c.config.deployments[DEPLOYMENT]

        before = self.sim.members
        rc, out = await self.command("change", run)
        self.stopped = None if rc in (0, 3) else list(target)
        self.stat(f"change exit {rc}")
        after = self.sim.config.deployments[DEPLOYMENT]
        why = f": {getattr(out, 'message', out)}"[:400] if rc else ""
        self.sim.note(f"{self.name}: change {before} -> {target}: exit {rc}, record epoch {after.epoch}"
                      + (f", joint {after.joint}" if after.joint else "") + why)  # fmt: skip
        return rc

    async def iteration(self) -> None:
        await anyio.sleep(self.rng.uniform(3.0, 12.0))
        if self.stopping():
            return
        if self.rng.random() < 0.5:
            await self.change(self.target())
            return
        await super().iteration()  # takes the lock; the change runs inside (critical)

    async def critical(self, lock_id: str, token: int, boot_until: float) -> None:
        if not self.enter(lock_id, token, boot_until):
            return
        try:
            await self.change(self.target(), lock_id)
        finally:
            if self.name in self.sim.recorder.inside:
                self.exit_at(self.true_until(boot_until))

    async def run(self) -> None:
        await super().run()
        with clock.using(self.clock, self.chance, self.process):
            # The run ends with no change in progress: finish one that stopped. Each run
            # waits as the message of a lock held by an unknown holder advises (a lease
            # whose managedFields were stripped lapses only when one command has seen it
            # unchanged for a maximum TTL; a command of 2 s never does).
            for _ in range(10):
                record = self.sim.config.deployments[DEPLOYMENT]
                if record.joint is None and self.stopped in (None, list(record.clusters)):
                    return
                await self.change(self.target(), wait=3 * MAX_TTL_S)
                await anyio.sleep(2.0)
            self.problem("change not finished", "a stopped change did not finish in 10 runs once the workload ended")


def contenders(sim: Sim) -> list[Contender]:
    players: list[Contender] = []
    o = sim.opts
    players += [ApiHolder(sim, f"api{i + 1}", i) for i in range(o.api)]
    players += [CommandHolder(sim, f"cmd{i + 1}", i) for i in range(o.cmd)]
    players += [Reader(sim, f"read{i + 1}", i) for i in range(o.readers)]
    players += [Changer(sim, f"change{i + 1}", i) for i in range(o.changers)]
    return players
