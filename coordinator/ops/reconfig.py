"""Changing a deployment's member set safely: add, remove or replace a cluster.

A change moves through a *joint configuration* (Raft's joint consensus): for as long as
it lasts, a decision needs a majority of the old set **and** a majority of the new one,
so a majority of the old set and a majority of the new set can never decide apart —
before, during or after the change. Step by step, all under the deployment's lock:

1. take the lock with the current configuration (or use ``--lock-id``);
2. write the joint configuration (epoch + 1, old and new sets) on the members' leases,
   seeding each new member's lease with the lock and its fencing token; it counts once
   majorities of both sets store it and hold the lock; this machine's record follows;
3. copy the state to the new members (a sync under the joint configuration);
4. commit the new set (epoch + 2) on majorities of both sets; the record follows;
5. release the lock (unless it was given with ``--lock-id``).

An interrupted change leaves the joint configuration stored, which is safe: running the
same command again finishes it, also when the run was killed after the members stored
the joint set (or the commit) and before this machine's record followed — the members
then store this very change (the joint set of this record's set and the target, or the
commit that follows it), which the run recognises, on a lease or on a state object (a
step notes its set on a member's state object before it writes the lease, and can fail
in between). Machines whose record predates the change are refused (the members store a
newer epoch) for every other command; running the same change brings their record along
too (and finishes the change if it is still in progress), as does ``deployment import``
once the leases store the set.

A new member whose lease stores another member set (another deployment of the same name
and namespace lives there, or someone planted one) is not taken over: the change stops
before writing anything.

``--force-dead`` removes members that are gone for good without asking them (one that
answers is refused): the lock is taken under the configuration in force on a majority of
the remaining members, then the new set is committed there (epoch + 2). A lock or a
state write that reached the dead members and fewer than a majority of the others can
be lost; the report says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from coordinator.config.records import DeploymentRecord
from coordinator.engine.clusters import ClusterSet, failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.history import HistoryStore
from coordinator.engine.lock.core import Configuration, of_this_change_on, recorded_membership
from coordinator.engine.lock.engine import LockEngine
from coordinator.engine.lock.renew import keep_renewed
from coordinator.engine.lock.results import AcquireResult, ClusterLease, current_command, default_holder
from coordinator.errors import MembershipError, NoQuorumError, StateConflictError, UsageError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.ops.admin import ensure_namespace, seed_state
from coordinator.ops.api import Coordinator, check_ttl
from coordinator.rules.lease import LeaseView, Standing
from coordinator.rules.membership import Membership, Stored, foreign_set
from coordinator.rules.outcome import Outcome
from coordinator.rules.quorum import Majorities
from coordinator.text import printable

log = get_logger("coordinator.ops.reconfig")


@dataclass
class ChangeReport:
    deployment: str
    old: list[str]
    new: list[str]
    epoch: int
    steps: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "old_members": self.old,
            "new_members": self.new,
            "epoch": self.epoch,
            "steps": self.steps,
        }


def _confirm(engine: LockEngine, results: dict[str, ClusterResult[ClusterLease]], what: str) -> None:
    ok = [k for k, r in results.items() if r.ok]
    if engine.majorities.reached(ok):
        return
    # Details quote the leases (holders, lock ids): escaped, the message keeps its line breaks.
    per = "; ".join(f"{k}: {r.outcome} ({printable(str(r.detail))})" for k, r in sorted(results.items()))
    raise NoQuorumError(
        f"Could not {what} on {engine.majorities.describe()}: done on {', '.join(sorted(ok)) or 'none'} ({per}). "
        "The change stopped in a safe state; run the same command again to finish it."
    )


async def change_members(
    c: Coordinator,
    name: str,
    target: list[str],
    *,
    lock_id: str | None = None,
    holder: str | None = None,
    ttl: float = 60.0,
    wait: float = 0.0,
    force_dead: list[str] | None = None,
) -> ChangeReport:
    """Move deployment ``name`` to the member set ``target`` (see the module doc)."""
    rec = c.deployment(name)
    dead = list(dict.fromkeys(force_dead or []))
    if rec.joint is not None and list(rec.joint) != list(target):
        raise UsageError(
            f"A change of deployment {name!r} to {', '.join(rec.joint)} is already in progress; run that "
            "change again to finish it before starting another."
        )
    if len(set(target)) != len(target) or not target:
        raise UsageError("The new member set must name each cluster once and at least one cluster.")
    for member in target:
        c.clusters.record(member)
    if list(target) == list(rec.clusters) and rec.joint is None:
        raise UsageError(f"Deployment {name!r} already has exactly these members; nothing to change.")
    engine = c.lock_engine(name)
    check_ttl(ttl, engine)
    report = ChangeReport(name, list(rec.clusters), list(target), rec.epoch)
    who = holder or default_holder()

    if dead:
        return await _remove_dead(c, engine, target, dead, who, ttl, report)

    # The members may already store this very change (the joint configuration, or its
    # commit) while this machine's record was not updated: a change killed between
    # writing the leases and saving the record. Recognise it and carry on from there.
    before = rec if rec.joint is None else rec.model_copy(update={"epoch": rec.epoch - 1, "joint": None})
    resumed = await _own_change(c, engine, before, target, report)
    if resumed is not None and resumed.joint is None:
        return report  # committed already: the record has caught up
    if resumed is not None:
        rec = resumed
    if rec.joint is not None:
        # A change in progress, whether found on the members now or recorded here by the
        # run that was interrupted: members storing the set before it, its joint set or its
        # commit all agree. (Leases deleted since then store none of it; the state objects
        # may still carry the set from before the change.)
        engine = engine.under(finishing_configuration(c.clusters, rec, engine.config.follow))
    held: AcquireResult
    if lock_id:
        token, held_ttl = await _token_of(engine, lock_id)
        # The lock is its holder's (`lock run`, another runner): it counts its validity
        # from the TTL it renews with, so the change renews and rewrites its leases with
        # that TTL, never a shorter one; its own --ttl may only lengthen them. Never past
        # the deployment's maximum TTL (a duration another client wrote may say more).
        ttl = min(max(ttl, float(held_ttl or 0)), engine.max_ttl_s)
        held = AcquireResult(
            deployment=name,
            namespace=rec.namespace,
            lock_id=lock_id,
            holder=who,
            fencing_token=token,
            acquired=True,
            quorum=engine.q,
            results={},
            members=engine.members,
            ttl_s=ttl,
        )
        renewed = await engine.renew(lock_id, token, ttl, who)
        if not renewed.acquired:
            raise StateConflictError(
                f"Lock {lock_id} does not hold deployment {name!r} on {engine.majorities.describe()}"
                + (f": {renewed.lost}" if renewed.lost else "")
                + ". Take the lock, or leave out --lock-id and the change takes it."
            )
        held = renewed
        report.steps.append(f"using lock {lock_id} (token {token})")
    else:
        held = await engine.acquire(
            ttl_s=ttl,
            holder=who,
            reason=f"member change to {', '.join(target)}",
            command=current_command(),
            wait_s=wait,
        )
        report.steps.append(f"took the lock {held.lock_id} (token {held.fencing_token})")
    token = held.fencing_token or 0
    try:
        async with keep_renewed(engine, held) as lost:
            joint_rec = (
                rec if rec.joint is not None else rec.model_copy(update={"epoch": rec.epoch + 1, "joint": list(target)})
            )
            joint = engine.under(joint_rec)
            seed = [m for m in target if m not in rec.clusters]
            # A joining member needs the namespace, as `deployment create` makes it: without
            # it every write there fails, and an old set of three reaches the new set's
            # majority without it, leaving a member that holds nothing (its lease then
            # counts as deleted, held by an unknown holder). Where it cannot be made, the
            # joint step reports that member's failure.
            await fan_out(seed, lambda m: ensure_namespace(c.clusters, m, rec.namespace), timeout=c.clusters.timeout)
            await _refuse_foreign(joint, seed, engine.core.finishing or ())
            await _until_new_set_takeable(joint, held.lock_id, seed, wait, lost)
            _confirm(
                joint,
                await joint.adopt_membership(held.lock_id, token, ttl, who, seed=seed),
                "store the joint configuration",
            )
            _save(c, joint_rec)
            report.epoch = joint_rec.epoch
            report.steps.append(
                f"joint configuration (epoch {joint_rec.epoch}) stored on {joint.majorities.describe()}"
            )
            if seed:
                # The new members' lock history too, empty, as `deployment create` makes it:
                # its name is taken before anyone can plant a copy full of forged events.
                book = HistoryStore(c.clusters, name, rec.namespace, seed)
                await fan_out(seed, book.create_empty, timeout=c.clusters.timeout)
                # And their state objects, seeded as `deployment create` seeds them: while
                # nothing is written, a joining member answers reads as the others do (an
                # empty object made later, where one may have been deleted, answers
                # nothing, and a new member set with one member short of answers would
                # lose the state's reads to one more unreachable member). The floor raised
                # next notes this change's token on them; the copy then writes the value.
                stored = joint.membership.document()
                await fan_out(seed, lambda m: seed_state(c.clusters, joint_rec, m, stored), timeout=c.clusters.timeout)
            if lost.is_set():
                raise StateConflictError("The lock was lost during the change; run the same command again.")
            # The joint set and the token floor are noted on the state objects of
            # majorities of both sets first. From then on a state write that read the
            # members before the change is refused wherever it lands (it counts with an
            # older epoch); one that landed before is on a majority of the old set, which
            # the copy reads. The floor: tokens granted before the change were recorded
            # on old majorities only, and the new set must remember them without its
            # leases (the change's own token is above all of them).
            await joint.raise_token_floor(token, held.lock_id)
            # The copy takes the value from the old members (a majority of them meets the
            # majority that confirmed the last write; what a joining member holds is not
            # this deployment's state yet) and writes it on every member as a new version
            # under this change's token: a write of an older lock still on its way is
            # refused by the stamp itself wherever the copy landed.
            # It counts with the epoch of this change's commit: a run that finishes the
            # change may find the commit noted on the state objects already (a note-first
            # step of the run before it), which is no newer change.
            union = joint_rec.model_copy(
                update={"clusters": _union(rec, joint_rec), "joint": None, "epoch": joint_rec.epoch + 1}
            )
            synced = (
                await c.state(name)
                .under(union)
                .carry(
                    token,
                    list(rec.clusters),
                    joint.membership.document(),
                    who=who,
                    note=f"member change to {', '.join(target)}",
                )
            )
            _confirm_copy(synced, rec, target)
            what = (
                "the empty state (none written yet)" if synced.get("empty") else f"state version {synced.get('copied')}"
            )
            report.steps.append(
                f"{what} written as version {synced.get('version')} under this change's token {token} on "
                f"{', '.join(synced.get('holding') or []) or 'none'}"
            )
            final_rec = joint_rec.model_copy(
                update={"epoch": joint_rec.epoch + 1, "clusters": list(target), "joint": None}
            )
            final = engine.under(final_rec)
            # The commit is written on the old members too, so that a stale machine finds
            # the newer epoch wherever it looks; it counts on majorities of both sets.
            committing = engine.under(Configuration(joint_rec, membership=final.membership))
            _confirm(
                joint,
                await committing.adopt_membership(held.lock_id, token, ttl, who),
                "commit the new member set",
            )
            _save(c, final_rec)
            report.epoch = final_rec.epoch
            report.steps.append(f"new member set committed (epoch {final_rec.epoch})")
            # The state objects carry the committed set too: with every lease deleted
            # (their tombstones prove nothing) the members still confirm it.
            noted = await final.store_set_on_state(token)
            missed = sorted(k for k in final.members if k not in noted or not noted[k].ok)
            if missed:
                report.steps.append(
                    f"the new member set could not be noted on the state objects of {', '.join(missed)} "
                    "(the next acquisition notes it)"
                )
    finally:
        if not lock_id:
            with anyio.CancelScope(shield=True):
                try:
                    current = c.deployment(name)
                    union = current.model_copy(update={"joint": None, "clusters": _union(rec, current)})
                    # release on every member, old and new, writing the set in force
                    in_force = recorded_membership(c.clusters, current)
                    releaser = engine.under(Configuration(union, membership=in_force))
                    await releaser.release(held.lock_id)
                    report.steps.append("released the lock")
                except Exception as err:  # reported; the lock expires by itself
                    report.steps.append(f"release failed: {err}")
    return report


async def _until_new_set_takeable(
    joint: LockEngine, lock_id: str, seed: list[str], wait: float, lost: anyio.Event
) -> None:
    """Before the joint step, for up to ``wait`` seconds: wait while members of the new
    set hold leases of another lock id, so many that the joint step could not reach the
    new set's majority. The take reached a majority of the old set without them — e.g.
    a killed holder's lease still live on one of them — and such a lease lapses by itself
    (its holder does not hold the lock: this change does, on a majority of the old set).
    Nothing of ours is written before the wait is over, so the lock's renewals under the
    set in force go on as before. A lease's lapse is judged by the very rule the joint
    step takes it by, a probe's server stamp included: judged by the Date hint alone, a
    lease at the edge of lapsing (or read through an API server whose clock runs ahead)
    passed this wait and then stopped the joint step half-written."""
    new = joint.majorities.groups[-1]
    deadline = anyio.current_time() + max(0.0, wait)

    async def one(cluster: str) -> ClusterResult[bool]:
        try:
            view = await joint.core.checked_read(cluster)
            if view.lock_id == lock_id or not view.held:
                return ClusterResult(cluster, Outcome.OK, True)
            view, stamp = await joint.core.probed(cluster, view, lock_id)  # a nonce on that lease, not ours
            stand = joint.core.stand(cluster, view, lock_id, stamp)
        except KubeError as err:
            if err.kind == kube.CONFLICT:
                return ClusterResult(cluster, Outcome.OK, False)  # written meanwhile: look again
            return failed(cluster, err)  # type: ignore[return-value]
        return ClusterResult(cluster, Outcome.OK, stand is Standing.LAPSED)

    others = [m for m in new if m not in seed]
    new_set = Majorities([new])
    while others and not lost.is_set():
        results = await fan_out(others, one, timeout=joint.timeout, silent=joint.clusters.silent)
        takeable = [*seed, *(k for k, r in results.items() if r.ok and r.value)]
        left = deadline - anyio.current_time()
        if new_set.reached(takeable) or left <= 0:
            return
        log.info("the joint step waits for leases of another lock id to lapse", left_s=round(left, 1))
        await anyio.sleep(min(1.0, left))


def _confirm_copy(synced: Mapping[str, Any], rec: DeploymentRecord, target: list[str]) -> None:
    """Before the new set is committed, the state's newest value must be on a majority of
    it (and of the old set): a majority of the new set decides alone after the commit, and
    must meet the value wherever it looks. A joining member that already holds another
    state of this deployment's name stops the change too (not copied over, not adopted)."""
    other = list(synced.get("holds_other") or [])
    if other:
        raise StateConflictError(
            f"Cannot add {', '.join(other)} to deployment {rec.name!r}: its state object "
            f"coordinator-state-{rec.name} in namespace {rec.namespace!r} already holds a state that is newer "
            "than, or differs from, the one the members hold, so it is not this deployment's (left over from "
            "another deployment of this name, or planted). Nothing was copied and the new member set was not "
            "committed (the joint configuration stays: safe). Look at that object, delete it if it is not "
            "yours, and run the same command again."
        )
    holding = set(synced.get("holding") or [])
    short = [
        names for names in (list(rec.clusters), list(target)) if len(holding.intersection(names)) < len(names) // 2 + 1
    ]
    if short:
        failed_on = "; ".join(f"{k}: {printable(str(why))}" for k, why in sorted((synced.get("failed") or {}).items()))
        unreachable = ", ".join(synced.get("unreachable") or [])
        raise NoQuorumError(
            f"Could not copy the state of {rec.name!r} (version {synced.get('version')}) to a majority of "
            f"{', '.join(short[-1])}: it is on {', '.join(sorted(holding)) or 'none'}"
            + (f"; refused on {failed_on}" if failed_on else "")
            + (f"; unreachable: {unreachable}" if unreachable else "")
            + ". The new member set was not committed (the joint configuration stays: safe); run the same "
            "command again when the members take the copy."
        )


def _configs(
    clusters: ClusterSet, rec: DeploymentRecord, target: list[str]
) -> tuple[Membership, Membership, Membership]:
    """The member sets a change of ``rec`` to ``target`` stores, by identity: before it
    (epoch E), the joint configuration (E + 1) and the committed new set (E + 2)."""
    before = recorded_membership(clusters, rec)
    joint = Membership.of(before.members, rec.epoch + 1, (clusters.record(m).identity for m in target))
    final = Membership.of((clusters.record(m).identity for m in target), rec.epoch + 2)
    return before, joint, final


def finishing_configuration(
    clusters: ClusterSet,
    joint_rec: DeploymentRecord,
    follow: Callable[[], DeploymentRecord | None] | None = None,
) -> Configuration:
    """What the lock counts with while the change ``joint_rec`` records is finished: a
    member storing the set from before the change, its joint configuration or its
    commit agrees (EngineCore's ``finishing``)."""
    before = joint_rec.model_copy(update={"epoch": joint_rec.epoch - 1, "joint": None})
    old, _, final = _configs(clusters, before, list(joint_rec.joint or []))
    return Configuration(joint_rec, finishing=(old, recorded_membership(clusters, joint_rec), final), follow=follow)


async def _own_change(
    c: Coordinator, engine: LockEngine, rec: DeploymentRecord, target: list[str], report: ChangeReport
) -> DeploymentRecord | None:
    """When members store the joint configuration or the commit of the change from
    ``rec`` to ``target`` (written by coordinator), bring the local record there: the
    committed record when a majority of both sets store the commit on their leases, the
    joint one otherwise (the change then continues). None when the members store no
    trace of it.

    The state objects are read too: a step notes its set on a member's state object
    before it writes that member's lease, so a step that failed on the leases (refused,
    or the leases deleted since) can have left its set on state objects alone. Every
    machine whose record predates the change is refused there (the note is newer than
    its record); this rerun is the way on."""
    _, joint_m, final_m = _configs(c.clusters, rec, target)
    union = rec.model_copy(update={"clusters": list(dict.fromkeys([*rec.clusters, *target])), "joint": None})
    reader = engine.under(union)

    async def one(cluster: str) -> ClusterResult[tuple[LeaseView, Stored]]:
        on_state: list[ClusterResult[tuple[int, Stored]]] = []

        async def read_state() -> None:
            on_state.append(await reader.state_one(cluster))  # its own failure is its result

        try:
            view = await reader.core.checked_read(cluster, read_state)
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]
        noted = on_state[0].value[1] if on_state and on_state[0].ok and on_state[0].value is not None else None
        return ClusterResult(cluster, Outcome.OK, (view, noted))

    results = await fan_out(reader.members, one, timeout=reader.timeout, silent=reader.clusters.silent)
    reader.core.raise_on_mismatch(results)  # type: ignore[arg-type]
    views = {k: r.value[0] for k, r in results.items() if r.ok and r.value is not None}
    stored = {k: reader.core.stored_membership(v) for k, v in views.items()}
    ours = {k: v for k, v in stored.items() if of_this_change_on(v, views[k])}
    noted = {k: r.value[1] for k, r in results.items() if r.ok and r.value is not None}
    groups = [list(rec.clusters), list(target)]
    step = step_of_change(joint_m, final_m, groups, ours, noted)
    if step is None:
        return None
    if step == final_m:
        final_rec = rec.model_copy(update={"epoch": final_m.epoch, "clusters": list(target), "joint": None})
        _save(c, final_rec)
        report.epoch = final_rec.epoch
        report.steps.append(
            f"the members already store this change committed (epoch {final_rec.epoch}): an earlier run was "
            "interrupted before this machine's record followed; the record now has it (the state was copied "
            "before the commit)"
        )
        return final_rec
    joint_rec = rec.model_copy(update={"epoch": joint_m.epoch, "joint": list(target)})
    if c.deployment(rec.name) != joint_rec:
        _save(c, joint_rec)
        on_leases = sorted(k for k, v in ours.items() if v in (joint_m, final_m))
        where = (
            f"on the leases of {', '.join(on_leases)}"
            if on_leases
            else f"on the state objects of {', '.join(sorted(k for k, v in noted.items() if v in (joint_m, final_m)))} "
            "only (its lease writes did not land, or the leases were deleted since)"
        )
        report.steps.append(
            f"the members store this change in progress (epoch {joint_rec.epoch}, {where}): an earlier run "
            "stopped before this machine's record followed; finishing it"
        )
    report.epoch = joint_rec.epoch
    return joint_rec


def step_of_change(
    joint: Membership,
    final: Membership,
    groups: list[list[str]],
    on_leases: Mapping[str, Membership],
    on_states: Mapping[str, Stored],
) -> Membership | None:
    """Which step of a change the members store: ``final`` when a majority of each of
    ``groups`` (the old set and the new) store the commit on their leases, ``joint``
    when any lease or state object stores either step, None when none does.
    ``on_leases``: the sets on leases that may be this change's (of_this_change_on);
    ``on_states``: the notes on state objects. Only a note a coordinator field manager
    wrote counts (one another client wrote, or whose writer is unknown, could have been
    put there by anyone allowed to annotate the object). A commit noted on state objects
    alone resumes the change at its joint step: the commit is noted there before it is
    written on the leases, so such a note does not prove it was confirmed, and finishing
    writes it on the leases."""

    def ours_on_state(value: Stored) -> bool:
        return isinstance(value, Membership) and value.writers is not None and value.written_by_us

    if all(sum(1 for m in g if on_leases.get(m) == final) >= len(g) // 2 + 1 for g in groups):
        return final
    if any(v in (joint, final) for v in on_leases.values()):
        return joint
    if any(ours_on_state(v) and v in (joint, final) for v in on_states.values()):
        return joint
    return None


async def _refuse_foreign(engine: LockEngine, seed: list[str], allow: tuple[Membership, ...] = ()) -> None:
    """Before anything is written: a new member whose lease stores another member set
    (another deployment of this name and namespace lives there, or one was planted) is
    not taken over."""
    if not seed:
        return

    views: dict[str, LeaseView] = {}

    async def one(cluster: str) -> ClusterResult[Stored]:
        try:
            view = await engine.core.checked_read(cluster)
        except KubeError as err:
            return failed(cluster, err)  # type: ignore[return-value]
        views[cluster] = view
        return ClusterResult(cluster, Outcome.OK, engine.core.stored_membership(view))

    def allowed(cluster: str, value: Stored) -> bool:
        return of_this_change_on(value, views.get(cluster)) and value in allow

    results = await fan_out(seed, one, timeout=engine.timeout, silent=engine.clusters.silent)
    engine.core.raise_on_mismatch(results)  # type: ignore[arg-type]
    names = {m.identity: m.name for m in engine.clusters.config.clusters.values()}
    foreign: dict[str, Stored] = {
        k: r.value
        for k, r in results.items()
        if r.ok and foreign_set(r.value, engine.membership) and not allowed(k, r.value)
    }
    # A lease that coordinator did not write for itself (it does not name its own uid):
    # made by another client — anyone allowed to create Leases in the namespace — or
    # restored from a copy. It is no lease of this deployment, and its token and the state
    # object beside it vouch for nothing.
    unowned = sorted(
        k
        for k, r in results.items()
        if r.ok and k not in foreign and (v := views.get(k)) is not None and v.exists and not v.vanished
        and not v.names_itself and not allowed(k, r.value)
    )  # fmt: skip
    if not foreign and not unowned:
        return
    told = []
    for cluster, value in sorted(foreign.items()):
        assert isinstance(value, Membership)
        members = ", ".join(names.get(i, f"identity {printable(i)}") for i in value.members)
        who = "" if value.written_by_us else f", not written by coordinator ({value.writer_text()})"
        told.append(f"{cluster} stores epoch {value.epoch}: {members}{who}")
    for cluster in unowned:
        told.append(f"{cluster} has a lease coordinator did not write (made by another client, or a restored copy)")
    foreign.update({k: None for k in unowned})
    raise MembershipError(
        f"Cannot add {', '.join(sorted(foreign))} to deployment {engine.dep.name!r}: its lease "
        f"coordinator-lock-{engine.dep.name} in namespace {engine.dep.namespace!r} is not this deployment's "
        f"({'; '.join(told)}) — another deployment of this name and namespace lives there, or the objects were "
        "planted. Nothing was changed. Use another cluster, or remove that deployment's lease and state object "
        "from it first."
    )


async def _token_of(engine: LockEngine, lock_id: str) -> tuple[int, int | None]:
    """The token of ``lock_id`` and the longest TTL its leases carry."""
    status = await engine.status()
    rows = [row for row in status.clusters if row.lock_id == lock_id and row.token is not None]
    if not rows:
        raise StateConflictError(f"Lock {lock_id} holds nothing on deployment {engine.dep.name!r}.")
    ttls = [row.ttl_s for row in rows if row.ttl_s]
    return max(row.token or 0 for row in rows), max(ttls) if ttls else None


async def _remove_dead(
    c: Coordinator,
    engine: LockEngine,
    target: list[str],
    dead: list[str],
    who: str,
    ttl: float,
    report: ChangeReport,
) -> ChangeReport:
    """Drop members that are gone for good: the new set decides alone (no joint step)."""
    rec = engine.dep
    unknown = [d for d in dead if d not in rec.clusters]
    if unknown or any(d in target for d in dead):
        raise UsageError(f"--force-dead names clusters that are not being removed: {', '.join(unknown or dead)}.")
    # The lock is taken under the configuration in force (this record's set and epoch,
    # which the remaining members store), counting a majority of the remaining members
    # only: the dead ones cannot answer.
    remaining = engine.under(
        Configuration(
            rec.model_copy(update={"clusters": list(target), "joint": None}),
            membership=recorded_membership(c.clusters, rec),
        )
    )
    await _refuse_if_alive(engine, dead)
    held = await remaining.acquire(ttl_s=ttl, holder=who, reason="remove dead members", command=current_command())
    report.steps.append(
        f"took the lock {held.lock_id} on a majority of the remaining members (token {held.fencing_token})"
    )
    final_rec = rec.model_copy(update={"epoch": rec.epoch + 2, "clusters": list(target), "joint": None})
    final = engine.under(final_rec)
    released_by = remaining
    try:
        _confirm(
            final,
            await final.adopt_membership(held.lock_id, held.fencing_token or 0, ttl, who),
            "commit the new member set",
        )
        _save(c, final_rec)
        released_by = final
        report.epoch = final_rec.epoch
        report.steps.append(
            f"removed {', '.join(dead)} without asking them (epoch {final_rec.epoch}). What this gives up: a lock "
            f"or state write that reached {', '.join(dead)} and fewer than a majority of the others is lost, and "
            f"if {', '.join(dead)} comes back with the old member set it must not be used by this deployment "
            "again before it is wiped (remove its lease and state) and added anew"
        )
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await released_by.release(held.lock_id)
                report.steps.append("released the lock")
            except Exception as err:
                report.steps.append(f"release failed: {err}")
    return report


async def _refuse_if_alive(engine: LockEngine, dead: list[str]) -> None:
    """--force-dead is for members that are gone: one that answers is removed with the
    joint configuration instead (which asks it)."""
    only_dead = engine.under(engine.dep.model_copy(update={"clusters": list(dead), "joint": None}))
    results = await only_dead.core.read_everywhere()
    alive = sorted(k for k, r in results.items() if r.ok)
    if alive:
        raise UsageError(
            f"--force-dead: {', '.join(alive)} answered, so it is not dead. Nothing was changed. Remove it "
            "without --force-dead (the change then goes through the joint configuration and gives up nothing)."
        )


def _union(a: DeploymentRecord, b: DeploymentRecord) -> list[str]:
    return list(dict.fromkeys([*a.clusters, *(a.joint or []), *b.clusters, *(b.joint or [])]))


def _save(c: Coordinator, rec: DeploymentRecord) -> None:
    c.config.deployments[rec.name] = rec
    if c.store is None:
        return
    with c.store.edit() as cfg:
        cfg.deployments[rec.name] = rec


def new_members(rec: DeploymentRecord, *, add: str | None = None, remove: str | None = None) -> list[str]:
    """The member set after adding and/or removing one cluster (a replace does both)."""
    members = list(rec.clusters)
    if add is not None:
        if add in members:
            raise UsageError(f"Cluster {add!r} is already a member of deployment {rec.name!r}.")
        members.append(add)
    if remove is not None:
        if remove not in members:
            raise UsageError(f"Cluster {remove!r} is not a member of deployment {rec.name!r}.")
        members.remove(remove)
    return members
