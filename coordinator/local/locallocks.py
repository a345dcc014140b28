"""The lock records of this machine, and which process each lock belongs to.

The lock book beside the local config (``config.locks.yaml``) records the locks this
machine's holders took, so that ``lock release``, ``lock renew`` and ``state set`` find
them without ``--lock-id``. A lock taken by ``lock acquire``, which has exited, is offered
to the holder's later commands. A lock held by a ``lock run`` is not: the run marks the
record with a :class:`~coordinator.config.models.RunClaim` naming itself and then its command's
process group (coordinator/local/owners.py tells whether they are alive), and while either
lives the lock is theirs:

- no other process uses it through the record (its own processes get its id in
  ``COORDINATOR_LOCK_ID``);
- a release on this machine, by the record or by the lock id, waits for the command's
  group to end (the ``lock run`` may be gone already, its watchdog stopping the group),
  and refuses if it does not, unless forced; from inside the group it refuses at once.

"This machine" is the config directory: commands that use another config (another
``COORDINATOR_CONFIG``) do not see the claims, as they do not see the records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from coordinator.engine.lock.results import default_holder
from coordinator.errors import LockHeldError, StateConflictError
from coordinator.local.owners import busy, in_group, is_self, owner_alive, start_time

if TYPE_CHECKING:
    from coordinator.config.models import LockRecord, RunClaim
    from coordinator.config.store import ConfigStore
    from coordinator.engine.lock.results import AcquireResult

# How much longer than a `lock run`'s --grace a release waits by default for its command's
# group: the watchdog of a killed `lock run` starts counting its grace when it sees it die,
# a moment before a release started after the kill can look.
RELEASE_ALLOWANCE_S = 2.0


class LocalLocks:
    """The lock book of one config, as the commands of this process use it."""

    def __init__(self, store: ConfigStore | None) -> None:
        self.store = store

    def remember(self, result: AcquireResult, run: RunClaim | None = None) -> None:
        if self.store is None:
            return
        from coordinator.config.models import LockRecord  # pydantic: only commands that take a lock

        with self.store.edit_locks() as book:
            # The holder's earlier record is replaced, unless a live `lock run` holds it
            # (another job of the same holder on this machine).
            book.locks = [
                r
                for r in book.locks
                if not (r.deployment == result.deployment and r.holder == result.holder) or _in_use(r)
            ]
            book.locks.append(
                LockRecord(
                    deployment=result.deployment,
                    lock_id=result.lock_id,
                    fencing_token=result.fencing_token or 0,
                    holder=result.holder,
                    ttl_s=result.ttl_s,
                    runs=[run] if run is not None else [],
                )
            )

    def forget(self, deployment: str, lock_id: str) -> None:
        if self.store is None:
            return
        with self.store.edit_locks() as book:
            book.locks = [r for r in book.locks if not (r.deployment == deployment and r.lock_id == lock_id)]

    def records(self) -> list[LockRecord]:
        return list(self.store.load_locks().locks) if self.store is not None else []

    def usable(self, deployment: str, holder: str | None = None) -> LockRecord | None:
        """The lock this holder took on this machine that this process may use: the
        latest record of ``deployment`` and the holder, leaving out locks that a live
        ``lock run`` holds (while it or its command's process group runs, the lock is
        theirs; their own processes get its id from the environment). A lock taken by
        ``lock acquire``, which has exited, is offered to the holder's later commands."""
        who = holder or default_holder()
        for rec in reversed(self.records()):
            if rec.deployment == deployment and rec.holder == who and not _in_use(rec, for_this_process=True):
                return rec
        return None

    def to_release(self, deployment: str, holder: str | None) -> LockRecord | None:
        """The lock a release without a lock id frees: the holder's latest record whose
        ``lock run``, if any, is gone (its command's group may still be stopping: the
        release waits for it)."""
        who = holder or default_holder()
        for rec in reversed(self.records()):
            if rec.deployment != deployment or rec.holder != who:
                continue
            if not any(owner_alive(c) and not is_self(c) for c in rec.runs):
                return rec
        return None

    def no_record(self, deployment: str, holder: str | None) -> StateConflictError:
        who = holder or default_holder()
        running = next(
            (
                (rec, c)
                for rec in reversed(self.records())
                if rec.deployment == deployment and rec.holder == who
                for c in rec.runs
                if owner_alive(c)
            ),
            None,
        )
        also = ""
        if running is not None:
            rec, claim = running
            also = (
                f" (Lock {rec.lock_id} of this holder is held by `lock run` (pid {claim.pid}) on this machine: it "
                "belongs to that process and its command, which get its id in COORDINATOR_LOCK_ID, and is "
                "released when the command ends.)"
            )
        return StateConflictError(
            f"No lock of deployment {deployment!r} is recorded for holder {who!r} on this machine.{also} Pass "
            "--lock-id ID (or set COORDINATOR_LOCK_ID), or take the lock with `coordinator lock acquire`."
        )

    # -- `lock run`'s claims

    def claim_for_run(self, held: AcquireResult, claim: RunClaim) -> None:
        """Note that the ``lock run`` of ``claim`` runs under ``held``, a lock it was given
        by id: from now on the lock is not offered through the record to other processes
        (a record is made for it if this machine has none). Refused (LockHeldError) when
        another live ``lock run`` of this machine holds it, unless this process runs in
        that one's command group (a ``lock run`` nested in another's command)."""
        if self.store is None:
            return
        from coordinator.config.models import LockRecord

        with self.store.edit_locks() as book:
            same = [r for r in book.locks if r.deployment == held.deployment and r.lock_id == held.lock_id]
            for rec in same:
                for other in rec.runs:
                    if owner_alive(other) and not is_self(other) and not in_group(other):
                        raise LockHeldError(
                            f"Lock {held.lock_id} of {held.deployment!r} is held by another `lock run` (pid "
                            f"{other.pid}) on this machine; a second command does not run under it. Wait for it "
                            "to end, or take a lock of your own."
                        )
            if not same:
                claim.made_record = True
                book.locks.append(
                    LockRecord(
                        deployment=held.deployment,
                        lock_id=held.lock_id,
                        fencing_token=held.fencing_token or 0,
                        holder=held.holder,
                        ttl_s=held.ttl_s,
                        runs=[claim],
                    )
                )
            for rec in same:
                rec.runs = [c for c in rec.runs if busy(c) and not _same_claim(c, claim)] + [claim]

    def note_group(self, deployment: str, lock_id: str, claim: RunClaim, pgid: int) -> None:
        """Add the command's process group to the claim: while the group lives, even after
        its ``lock run`` died, a release of the lock on this machine waits for it."""
        claim.pgid = pgid
        claim.group_started = start_time(pgid)
        if self.store is None:
            return
        with self.store.edit_locks() as book:
            for rec in book.locks:
                if rec.deployment == deployment and rec.lock_id == lock_id:
                    rec.runs = [claim if _same_claim(c, claim) else c for c in rec.runs]

    def drop_claim(self, deployment: str, lock_id: str, claim: RunClaim) -> None:
        """The ``lock run`` of ``claim`` is over: its claim goes (and the record, if it was
        made for that run alone); a lock it leaves held is offered through the record again."""
        if self.store is None:
            return
        with self.store.edit_locks() as book:
            kept = []
            for rec in book.locks:
                if rec.deployment == deployment and rec.lock_id == lock_id:
                    made = any(c.made_record for c in rec.runs if _same_claim(c, claim))
                    rec.runs = [c for c in rec.runs if not _same_claim(c, claim) and busy(c)]
                    if made and not rec.runs:
                        continue
                kept.append(rec)
            book.locks = kept

    def runs_holding(self, deployment: str, lock_id: str) -> list[RunClaim]:
        """The live ``lock run`` claims on ``lock_id`` other than this process's own."""
        return [
            c
            for rec in self.records()
            if rec.deployment == deployment and rec.lock_id == lock_id
            for c in rec.runs
            if not is_self(c) and busy(c)
        ]

    async def wait_for_runs(
        self,
        deployment: str,
        lock_id: str,
        *,
        force: bool,
        grace: float | None,
        on_wait: Callable[[str], None] | None,
    ) -> None:
        """Before a release: wait for the command groups of ``lock run`` processes of this
        machine that hold ``lock_id`` to end; refuse (LockHeldError) if they do not."""
        claims = self.runs_holding(deployment, lock_id)
        if not claims:
            return
        say = on_wait or (lambda _text: None)
        inside = next((c for c in claims if in_group(c)), None)
        if inside is not None:
            if force:
                say(f"releasing lock {lock_id} of {deployment} from inside its own `lock run`'s group (--force)")
                return
            raise LockHeldError(
                f"This command runs inside the process group of `lock run` (pid {inside.pid}), which holds lock "
                f"{lock_id} of {deployment!r} for that group: the lock is not released from inside its own process "
                "group, which is what it protects. End the command and `lock run` releases the lock, or pass "
                "--force to release it now (`lock run` then stops its whole group, this command included, at its "
                "next renewal, and exits 7). Nothing was released."
            )
        wait_s = grace if grace is not None else max(c.grace_s for c in claims) + RELEASE_ALLOWANCE_S
        say(f"lock {lock_id} of {deployment} is in use by {_describe_run(claims[0])}; waiting up to {wait_s:g}s for it")
        with anyio.move_on_after(wait_s):
            while claims:
                await anyio.sleep(0.1)
                claims = [c for c in claims if busy(c)]
        claims = [c for c in claims if busy(c)]
        if not claims:
            return
        if force:
            say(f"still in use by {_describe_run(claims[0])}: releasing lock {lock_id} anyway (--force)")
            return
        raise LockHeldError(
            f"Lock {lock_id} of {deployment!r} is in use on this machine by {_describe_run(claims[0])}, still "
            f"running after {wait_s:g}s. Releasing it now would let the next holder in while that command runs. "
            "Let the command end (`lock run` then releases the lock itself), stop it (SIGTERM to `lock run`), or "
            "pass --force to release the lock anyway (a `lock run` still alive then stops its command's group "
            "and exits 7). Nothing was released."
        )


def _in_use(rec: LockRecord, *, for_this_process: bool = False) -> bool:
    """Is ``rec`` held by a live ``lock run`` (its process or its command's group)?
    ``for_this_process``: not when that is this process or its group holds this one."""
    for claim in rec.runs:
        if not busy(claim):
            continue
        if for_this_process and (is_self(claim) or in_group(claim)):
            continue
        return True
    return False


def _same_claim(a: RunClaim, b: RunClaim) -> bool:
    return (a.pid, a.started, a.boot) == (b.pid, b.started, b.boot)


def _describe_run(claim: RunClaim) -> str:
    if owner_alive(claim):
        group = f" and its command's process group {claim.pgid}" if claim.pgid is not None else ""
        return f"`lock run` (pid {claim.pid}){group}"
    return (
        f"the command's process group {claim.pgid} of a `lock run` (pid {claim.pid}) that is gone "
        "(its watchdog is stopping the group)"
    )
