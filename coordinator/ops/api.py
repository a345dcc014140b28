"""The importable async API; the CLI is a thin layer over it.

async with Coordinator.from_config() as c:
    async with c.lock("payments", ttl=180, wait=60, reason="release 1.2") as held:
        await c.state("payments").set({"replicas": 3}, lock=held)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from coordinator import clock
from coordinator.config.records import DeploymentRecord, LocalConfig
from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import ClusterSet
from coordinator.engine.lock.results import AcquireResult, LockStatus, current_command, default_holder, new_lock_id
from coordinator.errors import (
    CoordinatorError,
    LockLostError,
    MembershipError,
    NoQuorumError,
    StateConflictError,
    UsageError,
    unknown_deployment,
)
from coordinator.local.locallocks import LocalLocks
from coordinator.rules.lease import DEFAULT_MAX_SERVER_SKEW_S

if TYPE_CHECKING:
    from coordinator.config.models import LockRecord, RunClaim
    from coordinator.engine.history import Tenure
    from coordinator.engine.lock.core import DeferredHistory
    from coordinator.engine.lock.engine import LockEngine
    from coordinator.engine.lock.kubeevents import LeaseEvents
    from coordinator.engine.state import StateClient
    from coordinator.kube.transport import TransportFactory

DEFAULT_TTL_S = 180.0


def check_ttl(ttl: float, engine: LockEngine) -> None:
    """A TTL must be at least 1 s and at most the deployment's maximum TTL: contenders
    wait out the maximum for leases whose holder cannot be known (deleted leases)."""
    if ttl < 1:
        raise UsageError(f"--ttl must be at least 1s, not {ttl:g}s.")
    if ttl > engine.max_ttl_s:
        raise UsageError(
            f"--ttl {ttl:g}s is above the maximum TTL of deployment {engine.dep.name!r} "
            f"({engine.max_ttl_s:g}s). Use a shorter TTL (`lock run` renews it for as long as the command "
            "runs), or recreate the deployment with a larger --max-ttl."
        )


@dataclass
class HeldLock:
    """A lock held by this process (yielded by :meth:`Coordinator.lock`)."""

    deployment: str
    lock_id: str
    fencing_token: int
    result: AcquireResult
    lost: anyio.Event

    @property
    def valid(self) -> bool:
        return not self.lost.is_set() and self.result.expires_in() > 0

    def expires_in(self) -> float:
        return self.result.expires_in()

    def __repr__(self) -> str:
        return (
            f"HeldLock(deployment={self.deployment!r}, lock_id={self.lock_id!r}, fencing_token={self.fencing_token}, "
            f"valid={self.valid}, expires_in={self.expires_in():.1f})"
        )


class Coordinator:
    """Entry point of the library: clusters, deployments, locks and state."""

    def __init__(
        self,
        config: LocalConfig,
        *,
        store: ConfigStore | None = None,
        timeout: float = 5.0,
        transport_factory: TransportFactory | None = None,
        lease_events: LeaseEvents | bool = True,
    ) -> None:
        self.config = config
        # What writes the lock's moments as Kubernetes Events about its Lease
        # (coordinator/engine/lock/kubeevents.py): True for the default writer, False for none
        # (the simulator's Coordinators: its request histories stay the lock's alone).
        self._lease_events_choice = lease_events
        self._lease_events: LeaseEvents | None = None
        self.store = store
        self.timeout = timeout
        # How the clusters are reached (coordinator/kube/transport.py); HTTPS by default.
        self.clusters = ClusterSet(
            config,
            timeout=timeout,
            transport_factory=transport_factory,
            config_path=store.path if store is not None else None,
        )
        # Bound on clock offsets between the API servers of one cluster (HA control planes).
        self.max_server_skew_s = DEFAULT_MAX_SERVER_SKEW_S
        self._tg: TaskGroup | None = None
        self._deferred: DeferredHistory | None = None  # history writes waiting (lock/core.py)
        self._stack: contextlib.AsyncExitStack | None = None
        self.locks = LocalLocks(store)

    @classmethod
    def from_config(
        cls,
        path: str | None = None,
        *,
        timeout: float = 5.0,
        transport_factory: TransportFactory | None = None,
        lease_events: LeaseEvents | bool = True,
    ) -> Coordinator:
        store = ConfigStore(path)
        return cls(
            store.load(), store=store, timeout=timeout, transport_factory=transport_factory, lease_events=lease_events
        )

    async def __aenter__(self) -> Coordinator:
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        stack.push_async_callback(self.clusters.aclose)
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        from coordinator.engine.lock.core import DeferredHistory

        self._deferred = DeferredHistory()
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> bool | None:
        # The task group waits for stragglers of lost attempts to release what they got
        # (each bounded by the per-cluster timeout); then the clients are closed.
        # The body's own exception is not fed to the task group (it would come back
        # wrapped in an ExceptionGroup); it propagates unchanged after the clean-up.
        stack, self._stack, self._tg = self._stack, None, None
        if self._deferred is not None:
            self._deferred.closing.set()  # deferred history writes go now
            self._deferred = None
        if stack is not None:
            await stack.__aexit__(None, None, None)
        return None

    # ------------------------------------------------------------------ lookups

    def deployment(self, name: str) -> DeploymentRecord:
        try:
            return self.config.deployments[name]
        except KeyError:
            path = self.store.path if self.store is not None else None
            raise unknown_deployment(name, self.config.deployments, path) from None

    def lock_engine(self, deployment: str) -> LockEngine:
        from coordinator.engine.lock.core import Configuration
        from coordinator.engine.lock.engine import LockEngine

        dep = self.deployment(deployment)
        for c in dep.clusters:
            self.clusters.record(c)
        return LockEngine(
            self.clusters,
            Configuration(dep, follow=lambda: self.current_record(deployment)),
            background=self._tg,
            max_server_skew_s=self.max_server_skew_s,
            deferred=self._deferred,
            lease_events=self.lease_events(),
        )

    def lease_events(self) -> LeaseEvents | None:
        """The Events writer this Coordinator's lock engines get (None: off)."""
        choice = self._lease_events_choice
        if choice is False:
            return None
        if choice is True:
            if self._lease_events is None:
                from coordinator.engine.lock.kubeevents import LeaseEvents

                self._lease_events = LeaseEvents()
            return self._lease_events
        return choice

    def current_record(self, deployment: str) -> DeploymentRecord | None:
        """This machine's record of ``deployment`` as the local config has it now (another
        command here, e.g. a member change run by the child of `lock run`, may have
        changed it since this process read it)."""
        used = self.config.deployments.get(deployment)
        if used is not None:
            self._reload_record(deployment, used)
        return self.config.deployments.get(deployment)

    def state(self, deployment: str) -> StateClient:
        # state.py never imports this module: it gets what it needs as arguments.
        from coordinator.engine.state import StateClient

        dep = self.deployment(deployment)
        for c in dep.clusters:
            self.clusters.record(c)
        return StateClient(self.clusters, dep, recorded_lock=self.recorded_lock)

    # ------------------------------------------------------------------ lock

    async def acquire(
        self,
        deployment: str,
        *,
        ttl: float = DEFAULT_TTL_S,
        wait: float = 0.0,
        reason: str = "",
        holder: str | None = None,
        on_wait: Callable[[AcquireResult, float], Awaitable[None] | None] | None = None,
        lock_id: str | None = None,
        run: RunClaim | None = None,
    ) -> AcquireResult:
        """Take the lock. Cancelled half-way (Ctrl-C), the acquisition may have written
        leases already (they come before the token floor): they are given back here,
        unless the caller chose ``lock_id`` itself, which makes undoing them its own
        business (``lock run`` reports what it gave back). ``run``: the ``lock run`` the
        lock is taken for; its record names it, so that no other process of this machine
        uses the lock through the record while it lives (see :meth:`recorded_lock`)."""
        undo_here = lock_id is None
        lock_id = lock_id or new_lock_id()
        engine = self.lock_engine(deployment)
        check_ttl(ttl, engine)
        who = holder or default_holder()
        # The local record must be writable before any lease is taken: a lock taken and
        # then not recorded would be left behind, held until its TTL.
        self._check_record_writable()
        deadline = clock.monotonic() + wait
        while True:
            try:
                result = await engine.acquire(
                    ttl_s=ttl,
                    holder=who,
                    reason=reason,
                    command=current_command(),
                    wait_s=max(0.0, deadline - clock.monotonic()),
                    on_wait=on_wait,
                    lock_id=lock_id,
                )
                break
            except (anyio.get_cancelled_exc_class(), KeyboardInterrupt):
                if undo_here:
                    await self._give_back_interrupted(engine, lock_id)
                raise
            except MembershipError:
                # While this call waited, the member set changed (a change runs under
                # the lock, so it is one of the holders waited for). When this machine
                # made it, its record was updated: wait on under the new set, which the
                # next attempt checks against the clusters again. Otherwise the error
                # stands (the record is stale: `deployment import`).
                if not await self._record_follows(deployment, engine.dep, deadline):
                    raise
                engine = self.lock_engine(deployment)
        try:
            self._remember(result, run)
        except Exception as err:
            with anyio.CancelScope(shield=True):
                try:
                    await engine.release(result.lock_id)
                    undone = "The leases were released again."
                except Exception as rel:  # reported with the original failure
                    undone = f"Releasing the leases failed too ({rel}); they expire after {ttl:g}s."
            raise StateConflictError(
                f"Took lock {result.lock_id} of {deployment!r} (token {result.fencing_token}), but could not "
                f"record it on this machine: {err}. {undone} Fix the lock record file (see --config) and "
                "try again.",
                payload=result,
            ) from err
        return result

    async def _give_back_interrupted(self, engine: LockEngine, lock_id: str) -> None:
        """Release what a cancelled acquisition under ``lock_id`` wrote; best effort,
        bounded by one request timeout (what is left expires after its TTL)."""
        from coordinator.logs import get_logger

        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeout):
            try:
                await engine.release(lock_id)
                get_logger(__name__).info("gave back the leases of an interrupted acquisition", lock_id=lock_id)
            except CoordinatorError:
                pass  # nothing of it was held

    async def _record_follows(self, deployment: str, used: DeploymentRecord, deadline: float) -> bool:
        """Whether this machine's record of ``deployment`` moves on from ``used`` before
        ``deadline``, the end of the caller's wait: a change made here stores its joint
        set first and writes its record when it has committed, which can take a while
        (copying the state, members that answer late); a waiter that saw the joint set
        waits for that within its own wait, as it would have waited for the lock."""
        while True:
            if self._reload_record(deployment, used):
                return True
            if clock.monotonic() >= deadline:
                return False
            await anyio.sleep(0.25)

    def _reload_record(self, deployment: str, used: DeploymentRecord) -> bool:
        """Take up this machine's record of ``deployment`` again if it changed since
        ``used`` was read (another command here changed the member set); True if so."""
        if self.store is None:
            return False
        fresh = self.store.load()
        now = fresh.deployments.get(deployment)
        if now is None or (now.epoch, now.clusters, now.joint) == (used.epoch, used.clusters, used.joint):
            return False
        for name in now.clusters + (now.joint or []):
            if name not in self.config.clusters and name in fresh.clusters:
                self.config.clusters[name] = fresh.clusters[name]
        self.config.deployments[deployment] = now
        from coordinator.logs import get_logger

        get_logger(__name__).info(
            "this machine's record of the members changed", deployment=deployment, epoch=now.epoch
        )
        return True

    def _check_record_writable(self) -> None:
        if self.store is None:
            return
        try:
            with self.store.edit_locks():
                pass
            self.store.check_writable()
        except CoordinatorError:
            raise
        except OSError as err:
            raise UsageError(
                f"Cannot write the local lock record ({err.filename or err}): {err.strerror or err}. "
                "Nothing was locked. Make the configuration directory writable, or point --config / "
                "COORDINATOR_CONFIG at a writable place."
            ) from err

    def _remember(self, result: AcquireResult, run: RunClaim | None = None) -> None:
        self.locks.remember(result, run)

    def _forget(self, deployment: str, lock_id: str) -> None:
        self.locks.forget(deployment, lock_id)

    def recorded_lock(self, deployment: str, holder: str | None = None) -> LockRecord | None:
        """The lock this holder took on this machine that this process may use (never one
        a live ``lock run`` holds: see coordinator/local/locallocks.py)."""
        return self.locks.usable(deployment, holder)

    def resolve_lock_id(self, deployment: str, lock_id: str | None, holder: str | None = None) -> str:
        if lock_id:
            return lock_id
        rec = self.recorded_lock(deployment, holder)
        if rec is None:
            raise self.locks.no_record(deployment, holder)
        return rec.lock_id

    # ``lock run``'s claims on its lock's record (coordinator/local/locallocks.py)

    def claim_for_run(self, held: AcquireResult, claim: RunClaim) -> None:
        self.locks.claim_for_run(held, claim)

    def note_run_group(self, deployment: str, lock_id: str, claim: RunClaim, pgid: int) -> None:
        self.locks.note_group(deployment, lock_id, claim, pgid)

    def drop_run_claim(self, deployment: str, lock_id: str, claim: RunClaim) -> None:
        self.locks.drop_claim(deployment, lock_id, claim)

    async def release(
        self,
        deployment: str,
        lock_id: str | None = None,
        holder: str | None = None,
        *,
        if_held: bool = False,
        force: bool = False,
        grace: float | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Release the lock; ``if_held``: holding nothing is not an error (returns
        ``{"lock_id": None}`` or the id with ``held: False``). A release that reached
        fewer than a majority raises NoQuorumError and keeps the local record.

        Without ``lock_id``, the holder's record on this machine names the lock, never
        one that a live ``lock run`` holds. A lock that a ``lock run`` of this machine
        holds is released only once its command's process group has ended (its
        ``lock run`` may be gone: its watchdog is stopping the group): the release waits
        up to ``grace`` seconds (default: that run's --grace and ``RELEASE_ALLOWANCE_S``),
        telling ``on_wait``, then raises LockHeldError unless ``force``. From inside that
        group it is refused at once (coordinator/local/locallocks.py)."""
        if lock_id:
            lid = lock_id
        else:
            rec = self.locks.to_release(deployment, holder)
            if rec is None:
                if if_held:
                    return {"lock_id": None, "held": False, "results": {}}
                raise self.locks.no_record(deployment, holder)
            lid = rec.lock_id
        await self.locks.wait_for_runs(deployment, lid, force=force, grace=grace, on_wait=on_wait)
        engine = self.lock_engine(deployment)
        try:
            results = await engine.release(lid)
        except StateConflictError:
            self._forget(deployment, lid)
            if if_held:
                return {"lock_id": lid, "held": False, "results": {}}
            raise
        self._forget(deployment, lid)
        return {"lock_id": lid, "held": True, "results": results}

    async def renew(
        self, deployment: str, lock_id: str | None = None, *, ttl: float | None = None, holder: str | None = None
    ) -> AcquireResult:
        lid = self.resolve_lock_id(deployment, lock_id, holder)
        engine = self.lock_engine(deployment)
        status = await engine.status()
        token = None
        named = None  # the holder recorded on the leases
        lease_ttl = None  # the lease's own duration: kept unless --ttl is given
        for row in status.clusters:
            if row.lock_id == lid and row.token is not None:
                token = max(token or 0, row.token)
                named = named or row.holder
                lease_ttl = lease_ttl or row.ttl_s
        rec = self.recorded_lock(deployment, holder)
        if token is None:
            observable = [r for r in status.clusters if r.status in ("held", "free", "expired")]
            if len(observable) < engine.q:
                raise NoQuorumError(
                    f"Cannot renew lock {lid} of {deployment!r}: only {len(observable)} of "
                    f"{engine.n} clusters could be read."
                )
            raise StateConflictError(
                f"Lock id {lid} no longer holds deployment {deployment!r} on any cluster that "
                f"answered; it expired or was released. Take it again with `coordinator lock acquire {deployment}`."
            )
        if ttl is not None:
            check_ttl(ttl, engine)
        ttl_s = ttl or lease_ttl or (rec.ttl_s if rec and rec.lock_id == lid else DEFAULT_TTL_S)
        result = await engine.renew(lid, token, ttl_s, named or holder)
        if result.lost:
            raise StateConflictError(
                f"Lock {lid} of {deployment!r} is lost: {result.lost}. Nothing was renewed; take it again "
                f"with `coordinator lock acquire {deployment}`.",
                payload=result,
            )
        if not result.acquired:
            from coordinator.engine.lock.reports import summarize

            seen = [r for r in result.results.values() if r.outcome.observable]
            msg = (
                f"Could not renew lock {lid} of {deployment!r} on a majority of "
                f"{engine.q} of {engine.n} clusters ({summarize(result.results)})."
            )
            if len(seen) < engine.q:
                raise NoQuorumError(msg + " Too few clusters answered; the lock may be lost.", payload=result)
            raise StateConflictError(msg + " The lock is lost; take it again.", payload=result)
        return result

    async def status(self, deployment: str) -> LockStatus:
        # The engine makes its parts on first use: the write side (acquire, renew, release,
        # the token floor) and the history are never imported by a command that only looks.
        return await self.lock_engine(deployment).status()

    async def break_lock(
        self, deployment: str, *, by: str | None = None, reason: str = "", lock_id: str | None = None
    ) -> dict[str, Any]:
        """Clear the lock whatever its holder; with ``lock_id``, only the leases that lock
        holds (others are answered ``held-by-other``; see :func:`coordinator.ops.verdicts.break_verdict`)."""
        engine = self.lock_engine(deployment)
        results = await engine.break_lock(by=by or default_holder(), reason=reason, lock_id=lock_id)
        return dict(results)

    async def lock_history(self, deployment: str) -> tuple[list[Tenure], dict[str, Any]]:
        """Who held the lock of ``deployment``, from when to when, how it ended: one
        :class:`~coordinator.engine.history.Tenure` per lock id, oldest first, merged from every
        member whose copy could be read; and each member's outcome (coordinator/engine/history.py)."""
        from coordinator.engine.history import tenures

        engine = self.lock_engine(deployment)
        events, results = await engine.history.read(timeout=self.timeout)
        return tenures(events), dict(results)

    @contextlib.asynccontextmanager
    async def lock(
        self,
        deployment: str,
        *,
        ttl: float = DEFAULT_TTL_S,
        wait: float = 0.0,
        reason: str = "",
        holder: str | None = None,
    ) -> AsyncIterator[HeldLock]:
        """Hold the lock for the block: renewed in the background, released at the end.

        ``held.lost`` is set if a majority could not be renewed in time; check
        ``held.valid`` before each critical step.
        """
        engine = self.lock_engine(deployment)
        who = holder or default_holder()
        check_ttl(ttl, engine)
        lock_id = new_lock_id()
        try:
            result = await engine.acquire(
                ttl_s=ttl, holder=who, reason=reason, command=current_command(), wait_s=wait, lock_id=lock_id
            )
        except (anyio.get_cancelled_exc_class(), KeyboardInterrupt):
            await self._give_back_interrupted(engine, lock_id)
            raise
        try:
            from coordinator.engine.lock.renew import keep_renewed

            async with keep_renewed(engine, result) as lost:
                yield HeldLock(deployment, result.lock_id, result.fencing_token or 0, result, lost)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await engine.release(result.lock_id)
                except (StateConflictError, LockLostError):
                    pass
                except Exception as err:  # release failures are reported, never masked
                    from coordinator.logs import get_logger

                    get_logger(__name__).warning("release failed", error=str(err))
