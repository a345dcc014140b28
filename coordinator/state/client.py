"""The state register's client: its parts put together."""

from __future__ import annotations

from coordinator.state.reads import Reads
from coordinator.state.sync import Sync
from coordinator.state.writes import Writes


class StateClient(Reads, Writes, Sync):
    """The state of one deployment (``Coordinator.state(name)``).

    Its parts, one module each: replicas (reading replicas with their leases, one
    replica's compare-and-swap, the checks on what was read), reads, writes, sync.
    """
