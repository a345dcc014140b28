"""The lock engine of one deployment: its parts put together."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from anyio.abc import TaskGroup

from coordinator.config.records import DeploymentRecord
from coordinator.engine.clusters import ClusterSet
from coordinator.engine.fanout import ClusterResult
from coordinator.engine.lock.core import Configuration, DeferredHistory, EngineCore, Observations
from coordinator.engine.lock.results import AcquireResult, ClusterLease, LockStatus
from coordinator.rules.lease import DEFAULT_MAX_SERVER_SKEW_S
from coordinator.rules.membership import Check, Membership, Stored
from coordinator.rules.quorum import Majorities

if TYPE_CHECKING:
    from coordinator.engine.history import HistoryStore
    from coordinator.engine.lock.acquire import Acquire
    from coordinator.engine.lock.floor import TokenFloor
    from coordinator.engine.lock.kubeevents import LeaseEvents
    from coordinator.engine.lock.members import Members
    from coordinator.engine.lock.release import Release
    from coordinator.engine.lock.renew import Renew
    from coordinator.engine.lock.status import Status
    from coordinator.engine.lock.turns import Turns


class LockEngine:
    """The lock of one deployment over its member clusters.

    It holds one :class:`EngineCore` (the configuration it counts with and one lease's
    I/O) and the parts that act on it, one module each: members (the stored member set),
    release (release, break), floor (the token floor on the state objects), turns (claims
    and watches of waiters), acquire, renew, status. A part is made on first use, so a
    command that only reads the lock (`lock status`) never imports the write side.

    It counts with one :class:`Configuration` (a value); :meth:`under` gives the same
    lock counted under another one, as a member change counts its joint and final sets.
    """

    def __init__(
        self,
        clusters: ClusterSet,
        config: Configuration | DeploymentRecord,
        *,
        background: TaskGroup | None = None,
        max_server_skew_s: float = DEFAULT_MAX_SERVER_SKEW_S,
        deferred: DeferredHistory | None = None,
        lease_events: LeaseEvents | None = None,
        observations: Observations | None = None,
    ) -> None:
        if isinstance(config, DeploymentRecord):
            config = Configuration(config)
        self.core = EngineCore(
            clusters,
            config,
            background=background,
            max_server_skew_s=max_server_skew_s,
            deferred=deferred,
            lease_events=lease_events,
            observations=observations,
        )

    def under(self, config: Configuration | DeploymentRecord) -> LockEngine:
        """The same lock counted under ``config``: the same clusters, task group, skew
        bound, history queue and Events writer, and what has been observed of the leases
        (a lease seen without evidence of ours, a cluster whose Date is not trusted is
        the same lease and cluster under any member set)."""
        core = self.core
        return LockEngine(
            core.clusters,
            config,
            background=core.background,
            max_server_skew_s=core.max_server_skew_s,
            deferred=core.deferred,
            lease_events=core.lease_events,
            observations=core.observations,
        )

    @property
    def config(self) -> Configuration:
        return self.core.config

    # The configuration it counts with now (a record followed since may have moved it).

    @property
    def clusters(self) -> ClusterSet:
        return self.core.clusters

    @property
    def dep(self) -> DeploymentRecord:
        return self.core.dep

    @property
    def members(self) -> list[str]:
        return self.core.members

    @property
    def membership(self) -> Membership:
        return self.core.membership

    @property
    def majorities(self) -> Majorities:
        return self.core.majorities

    @property
    def n(self) -> int:
        return self.core.n

    @property
    def q(self) -> int:
        return self.core.q

    @property
    def max_ttl_s(self) -> float:
        return self.core.max_ttl_s

    @property
    def timeout(self) -> float:
        return self.core.timeout

    @property
    def history(self) -> HistoryStore:
        return self.core.history

    # The parts, each made on first use.

    @cached_property
    def _members(self) -> Members:
        from coordinator.engine.lock.members import Members

        return Members(self.core, self._floor)

    @cached_property
    def _release(self) -> Release:
        from coordinator.engine.lock.release import Release

        return Release(self.core)

    @cached_property
    def _floor(self) -> TokenFloor:
        from coordinator.engine.lock.floor import TokenFloor

        return TokenFloor(self.core, self._release)

    @cached_property
    def _turns(self) -> Turns:
        from coordinator.engine.lock.turns import Turns

        return Turns(self.core)

    @cached_property
    def _acquire(self) -> Acquire:
        from coordinator.engine.lock.acquire import Acquire

        return Acquire(self.core, self._floor, self._turns, self._release)

    @cached_property
    def _renew(self) -> Renew:
        from coordinator.engine.lock.renew import Renew

        return Renew(self.core)

    @cached_property
    def _status(self) -> Status:
        from coordinator.engine.lock.status import Status

        return Status(self.core)

    # What callers use.

    async def acquire(
        self,
        *,
        ttl_s: float,
        holder: str,
        reason: str = "",
        command: str = "",
        wait_s: float = 0.0,
        lock_id: str | None = None,
        on_wait: Callable[[AcquireResult, float], Awaitable[None] | None] | None = None,
    ) -> AcquireResult:
        return await self._acquire.acquire(
            ttl_s=ttl_s, holder=holder, reason=reason, command=command, wait_s=wait_s, lock_id=lock_id, on_wait=on_wait
        )

    async def renew(self, lock_id: str, token: int, ttl_s: float, holder: str | None = None) -> AcquireResult:
        return await self._renew.renew(lock_id, token, ttl_s, holder)

    async def release(self, lock_id: str) -> dict[str, ClusterResult[ClusterLease]]:
        return await self._release.release(lock_id)

    async def break_lock(
        self, *, by: str, reason: str = "", lock_id: str | None = None
    ) -> dict[str, ClusterResult[ClusterLease]]:
        return await self._release.break_lock(by=by, reason=reason, lock_id=lock_id)

    async def status(self) -> LockStatus:
        return await self._status.status()

    async def create_leases(self) -> dict[str, ClusterResult[ClusterLease]]:
        return await self._members.create_leases()

    async def stored_sets(self) -> dict[str, str]:
        return await self._members.stored_sets()

    async def adopt_membership(
        self, lock_id: str, token: int, ttl_s: float, holder: str, *, seed: Iterable[str] = ()
    ) -> dict[str, ClusterResult[ClusterLease]]:
        return await self._members.adopt_membership(lock_id, token, ttl_s, holder, seed=seed)

    async def raise_token_floor(self, token: int, lock_id: str, *, payload: Any = None) -> None:
        await self._floor.raise_token_floor(token, lock_id, payload=payload)

    async def store_set_on_state(self, token: int) -> dict[str, ClusterResult[int]]:
        return await self._floor.store_set_on_state(token)

    async def state_one(self, cluster: str) -> ClusterResult[tuple[int, Stored]]:
        """What ``cluster``'s state object records: its token and the member set a
        coordinator field manager noted there (see TokenFloor.state_one)."""
        return await self._floor.state_one(cluster)

    def check_members(self, stored: Mapping[str, Stored]) -> Check:
        return self.core.check_members(stored)
