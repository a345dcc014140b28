"""The state register's client: its parts put together."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.config.records import DeploymentRecord
from coordinator.engine.clusters import ClusterSet
from coordinator.engine.state.reads import Reads
from coordinator.engine.state.replicas import Replicas
from coordinator.engine.state.results import LockArg, ReadReport, WriteReport
from coordinator.engine.state.sync import Sync
from coordinator.engine.state.writes import Writes

if TYPE_CHECKING:
    from coordinator.config.models import AuditEntry, LockRecord, StateEnvelope


class StateClient:
    """The state of one deployment (``Coordinator.state(name)``).

    It holds the deployment's :class:`Replicas` (reading replicas with their leases, one
    replica's compare-and-swap, the checks on what was read) and one part per job, each
    holding the replicas: reads, writes, sync.
    """

    def __init__(
        self,
        clusters: ClusterSet,
        deployment: DeploymentRecord,
        *,
        recorded_lock: Callable[[str], LockRecord | None] | None = None,
    ) -> None:
        self.replicas = Replicas(clusters, deployment, recorded_lock=recorded_lock)
        self._reads = Reads(self.replicas)
        self._writes = Writes(self.replicas)
        self._sync = Sync(self.replicas)

    def under(self, deployment: DeploymentRecord) -> StateClient:
        """The same state over the members of ``deployment`` (a member change copies it
        to the union of the old and the new set): the same clusters and lock records."""
        return StateClient(self.replicas.clusters, deployment, recorded_lock=self.replicas.recorded_lock)

    @property
    def dep(self) -> DeploymentRecord:
        return self.replicas.dep

    @property
    def members(self) -> list[str]:
        return self.replicas.members

    async def read(self, *, repair: bool = True) -> ReadReport:
        """Read a majority; the newest trusted replica wins; replicas behind it are
        repaired before the value is returned (``repair=False`` only reports them)."""
        return await self._reads.read(repair=repair)

    async def get(self, key: str | None = None) -> Any:
        """The state's data, or the value at ``key`` (a dotted path), as a read returns it."""
        return await self._reads.get(key)

    async def history(self) -> list[AuditEntry]:
        """The audit entries the state's envelope keeps, oldest first."""
        return await self._reads.history()

    async def backup(self, path: Path) -> StateEnvelope:
        """Write the envelope a read returns to ``path`` (atomically) and return it."""
        return await self._reads.backup(path)

    async def write(
        self,
        change: Callable[[dict[str, Any]], Any],
        *,
        lock: LockArg = None,
        command: str = "api",
        note: str | None = None,
        replaces: bool = False,
        adopt_from: str | None = None,
        backup_dir: Path | None = None,
        _token: int | None = None,
    ) -> WriteReport:
        """Apply ``change(data) -> new data`` as a new version on every member, under the
        lock (see :meth:`Writes.write`)."""
        return await self._writes.write(
            change,
            lock=lock,
            command=command,
            note=note,
            replaces=replaces,
            adopt_from=adopt_from,
            backup_dir=backup_dir,
            _token=_token,
        )

    async def set(self, values: dict[str, Any], *, lock: LockArg = None, command: str = "state set") -> WriteReport:
        """Set each dotted path in ``values`` to its value, as one new version, under the lock."""
        return await self._writes.set(values, lock=lock, command=command)

    async def apply(
        self,
        document: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        *,
        lock: LockArg = None,
        command: str = "state apply",
    ) -> WriteReport:
        """Replace the data with ``document`` as one new version, under the lock; a
        callable is called only once the lock is known to be held."""
        return await self._writes.apply(document, lock=lock, command=command)

    async def adopt(self, source: str, *, lock: LockArg = None, backup_dir: Path | None = None) -> WriteReport:
        """Write member ``source``'s data as a new version everywhere, overwriting suspect
        replicas (saved to files first), under the lock: `state sync --from`."""
        return await self._writes.adopt(source, lock=lock, backup_dir=backup_dir)

    async def restore(self, path: Path, *, lock: LockArg = None, envelope: StateEnvelope | None = None) -> WriteReport:
        """Write the backup at ``path`` (or ``envelope``, already read from it) as a new
        version, under the lock."""
        return await self._writes.restore(path, lock=lock, envelope=envelope)

    async def diff(self) -> list[dict[str, Any]]:
        """Every member's stamp, checksum and standing against the value a read returns."""
        return await self._sync.diff()

    async def sync(self, backup_dir: Path | None = None) -> dict[str, Any]:
        """Bring every reachable replica to the value a read returns, saving corrupt ones
        to ``backup_dir`` first; suspect replicas are left alone and listed (see
        :meth:`Sync.sync`)."""
        return await self._sync.sync(backup_dir)

    async def carry(
        self, token: int, sources: list[str], joint: Mapping[str, Any], *, who: str, note: str
    ) -> dict[str, Any]:
        """A member change's copy: the old members' value written again on every member
        under the change's token (see :meth:`Sync.carry`)."""
        return await self._sync.carry(token, sources, joint, who=who, note=note)
