"""The replicated state register of a deployment: reading and writing the objects.

One object per member cluster (ConfigMap, or Secret on request) named
``coordinator-state-<deployment>`` holds an envelope ``{schema, version, token,
write_id, checksum, written_by, written_at, members, data, history}`` and the newest
stamp it has promised. The rules — stamps and their order, what a replica takes, which
value a read returns, which replicas are suspect — are pure functions in
:mod:`coordinator.engine.register`; this package does the I/O around them:

* **Write** (needs the lock): read the lease and the replica on every member at once;
  the lock must be held on a majority; draw a stamp above every version held or
  promised; promise it to a majority (compare-and-swap); only then send the data
  (compare-and-swap) and succeed when q replicas confirm. A write that reached some
  replicas but not q is reported as "outcome unknown"; one that cannot have reached any
  as "nothing was written".
* **Read**: a majority answers; the newest trusted stamp wins; replicas behind it are
  repaired (written back) before the value is returned, so the value returned is on a
  majority and no later read can return an older one.
* **Corrupt replicas** (not JSON, wrong checksum, missing fields, fields coordinator does
  not own) and **suspect** ones (a token no lease of a majority has seen) never win;
  ``diff`` names them, ``sync`` overwrites corrupt ones after saving them to a file,
  ``sync --from`` adopts or overwrites suspect ones under the lock. A corrupt replica
  counts as unanswered where a value is chosen, and the stamp it names is a bound no
  older promise, write or sync goes below.

The client is :class:`StateClient` (``client``): the deployment's ``replicas`` (reading
replicas with their leases, one replica's compare-and-swap, the checks on what was read)
and one part per job, each holding them: ``reads`` (quorum reads with repair, backup),
``writes`` (fenced writes, restore), ``sync`` (diff and sync); ``data`` and ``results``
hold the plain values.
This package re-exports the names other modules use.
"""

from __future__ import annotations

from coordinator.engine.register import (
    DATA_KEY,
    ENVELOPE_LIMIT,
    OBJECT_LIMIT,
    Replica,
    check_size,
    checksum,
    decode_replica,
    encode_envelope,
)
from coordinator.engine.state.client import StateClient
from coordinator.engine.state.data import changed_keys, get_path, plain_data_problem, set_path
from coordinator.engine.state.results import LockArg, LockHandle, Observed, ReadReport, WriteReport
from coordinator.engine.state.writes import load_backup

__all__ = [
    "DATA_KEY",
    "ENVELOPE_LIMIT",
    "OBJECT_LIMIT",
    "LockArg",
    "LockHandle",
    "Observed",
    "ReadReport",
    "Replica",
    "StateClient",
    "WriteReport",
    "changed_keys",
    "check_size",
    "checksum",
    "decode_replica",
    "encode_envelope",
    "get_path",
    "load_backup",
    "plain_data_problem",
    "set_path",
]
