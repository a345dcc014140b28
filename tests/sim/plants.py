"""Planted bugs: patches that put back, one at a time, a bug this project fixed, so that
the simulator can show it finds each (docs/simulator.md has the table). Each is selected
by name (``python scripts/simulate.py --plant NAME``) and undone when the run ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Plant:
    name: str
    bug: str  # what it puts back
    fix: str  # the commit that fixed it
    patch: Callable[[ExitStack], None]
    options: dict[str, Any]  # simulator options that reach the bug (fault kinds, sizes)


PLANTS: dict[str, Plant] = {}


def _set(stack: ExitStack, owner: Any, name: str, value: Any) -> None:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, saved)


@contextmanager
def planted(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    plant = PLANTS.get(name)
    if plant is None:
        raise KeyError(f"no planted bug {name!r} (known: {', '.join(sorted(PLANTS))})")
    with ExitStack() as stack:
        plant.patch(stack)
        yield


# ------------------------------------------------------------------ the bugs


def _parse_then(change: Callable[[Any], Any]) -> Callable[[ExitStack], None]:
    """A plant that changes what LeaseView.parse makes of a lease."""

    def patch(stack: ExitStack) -> None:
        from coordinator.rules import lease

        original = lease.LeaseView.__dict__["parse"].__func__

        def parse(cls: Any, obj: Any, server_now: Any = None) -> Any:
            return change(original(cls, obj, server_now))

        _set(stack, lease.LeaseView, "parse", classmethod(parse))

    return patch


def _newest_of_any_manager(view: Any) -> Any:
    """The stamp of the lease's last write by any field manager but the claims'."""
    import dataclasses

    from coordinator.rules.lease import LINE_MANAGER
    from coordinator.rules.resources import parse_time

    if not view.exists:
        return view
    entries = (view.obj.get("metadata") or {}).get("managedFields") or []
    times = [parse_time(e.get("time")) for e in entries if isinstance(e, dict) and e.get("manager") != LINE_MANAGER]
    stamps = [t for t in times if t is not None]
    return dataclasses.replace(view, own_write=max(stamps)) if stamps else view


def _judged_by_date(last: Callable[[Any], Any]) -> Callable[[ExitStack], None]:
    """A plant that judges a lease another lock id holds lapsed by the response's Date
    against ``last(view)``, the old rule (no probe stamp needed)."""

    def patch(stack: ExitStack) -> None:
        from coordinator.engine.lock import core
        from coordinator.rules import lease

        standing = vars(core)["standing"]

        def old_rule(view: Any, lock_id: str, **kwargs: Any) -> Any:
            when = last(view) if view.exists and view.blocking and view.lock_id != lock_id else None
            if when is not None and view.server_now is not None:
                ttl = view.effective_ttl(kwargs["max_ttl_s"]) if hasattr(view, "effective_ttl") else view.ttl_s
                margin = lease.lapse_margin(float(ttl or kwargs["max_ttl_s"]), kwargs["max_server_skew_s"])
                elapsed = (view.server_now - when).total_seconds()
                return (
                    lease.Standing.LAPSED
                    if elapsed > float(ttl or kwargs["max_ttl_s"]) + margin
                    else lease.Standing.HELD
                )
            return standing(view, lock_id, **kwargs)

        _set(stack, core, "standing", old_rule)

    return patch


def _created_when_unstamped(view: Any) -> Any:
    """The stamp of our last write, else the creationTimestamp."""
    return view.own_write if view.own_write is not None else view.created


def _newest_stamp(view: Any) -> Any:
    return _newest_of_any_manager(view).own_write


def _token_of_anyone(view: Any) -> Any:
    """The token annotation believed whoever wrote it."""
    import dataclasses

    from coordinator.rules.evidence import Writer
    from coordinator.rules.lease import A_TOKEN

    raw = ((view.obj.get("metadata") or {}).get("annotations") or {}).get(A_TOKEN) if view.exists else None
    if raw is None or view.token_writer is not Writer.OTHER:
        return view
    try:
        token = int(raw)
    except ValueError:
        return dataclasses.replace(view, token_malformed=True, token_writer=Writer.OURS)
    return dataclasses.replace(view, token=max(token, 0), token_malformed=token < 0, token_writer=Writer.OURS)


def _missing_is_free(stack: ExitStack) -> None:
    """A missing lease is free, and the token is one above the highest read, whatever
    was read (no tombstone, no proof from the leases' history or the floors)."""
    from coordinator.engine.lock import core
    from coordinator.rules import lease

    standing = vars(core)["standing"]

    def free_when_missing(view: Any, *args: Any, **kwargs: Any) -> Any:
        return lease.Standing.FREE if not view.exists else standing(view, *args, **kwargs)

    def any_token(views: list[Any], state_tokens: list[int], *, proven: bool) -> int | None:
        return int(max([v.token for v in views if v.exists and not v.token_malformed] + [0])) + 1

    _set(stack, core, "standing", free_when_missing)
    _set(stack, core, "next_token", any_token)


def _renewal_retakes(stack: ExitStack) -> None:
    """A renewal that finds its lease free (released or broken) takes it again."""
    from coordinator.engine.lock import renew
    from coordinator.rules.lease import RenewVerdict

    verdict = vars(renew)["renew_verdict"]

    def retake(view: Any, lock_id: str) -> Any:
        found = verdict(view, lock_id)
        if found in (RenewVerdict.BROKEN, RenewVerdict.GONE) and view.exists:
            return RenewVerdict.RENEW
        return found

    _set(stack, renew, "renew_verdict", retake)


def _minority_release_ok(stack: ExitStack) -> None:
    """A release that reached fewer than a majority returns as if it had released."""
    from coordinator.engine.lock.release import Release
    from coordinator.errors import NoQuorumError

    release = Release.release

    async def quietly(self: Any, lock_id: str) -> Any:
        try:
            return await release(self, lock_id)
        except NoQuorumError as err:
            return err.payload

    _set(stack, Release, "release", quietly)


def _foreign_floor_believed(stack: ExitStack) -> None:
    from coordinator.engine.lock import floor

    _set(stack, floor, "floor_is_ours", lambda obj: True)


def _holder_removed_is_free(stack: ExitStack) -> None:
    from coordinator.rules import lease

    _set(stack, lease, "_holder_edited", lambda obj, claimed: False)


def _equal_token_taken(stack: ExitStack) -> None:
    """An attempt takes a lease that carries its own token under another lock id (two
    attempts that read the same leases draw the same token; the first frees its leases)."""
    from coordinator.engine.lock import acquire
    from coordinator.rules.evidence import Writer

    def only_higher(view: Any, lock_id: str, token: int) -> bool:
        return bool(view.lock_id != lock_id and view.token_writer is not Writer.OTHER and view.token > token)

    _set(stack, acquire, "token_taken", only_higher)


def _no_token_floor(stack: ExitStack) -> None:
    """An acquisition that does not record its token on the state objects: the token of a
    holder that writes no state lives on the leases alone, and deleting every lease forgets
    it (the design limit that the token floor closes)."""
    from coordinator.engine.lock.floor import TokenFloor

    async def nothing(self: Any, result: Any) -> None:
        return None

    _set(stack, TokenFloor, "record_token_floor", nothing)


def _unconfirmed_take(stack: ExitStack) -> None:
    """An acquisition that counts the leases it took without reading them again: a break
    that cleared one of them before the last take landed goes unseen."""
    from coordinator.engine.lock.acquire import Acquire

    async def trusted(self: Any, result: Any) -> None:
        return None

    _set(stack, Acquire, "_confirm_take", trusted)


def _no_skew_margin(stack: ExitStack) -> None:
    """The lapse margin leaves out --max-server-skew (API servers of one cluster that
    disagree on the time)."""
    from coordinator.rules import lease

    _set(stack, lease, "lapse_margin", lambda ttl_s, skew: lease.drift_allowance(ttl_s) + lease.TIMESTAMP_SLACK_S)


def _sync_over_newer_promise(stack: ExitStack) -> None:
    """`state sync` as it was before 3fc3182: it chooses its value from the replicas that
    answered, and overwrites every corrupt one with it, whatever stamp the corrupt one
    names. Three guards stand in the way today, each enough alone: the refusal of a
    corrupt replica naming a newer stamp (3fc3182), a majority of replicas that decode
    (6cf4d04), and a corrupt member's replica taking the value as a write judged against
    what it names (8345d4e); all three go, or no schedule reaches the bug."""
    import contextvars

    from coordinator.engine.register import Kind
    from coordinator.engine.state import sync
    from coordinator.engine.state.replicas import Replicas

    syncing: contextvars.ContextVar[bool] = contextvars.ContextVar("syncing", default=False)
    run_sync, need_decoded, cas = sync.Sync.sync, Replicas.need_decoded, Replicas.cas

    async def old_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        mark = syncing.set(True)  # the fan-outs' tasks inherit it
        try:
            return await run_sync(self, *args, **kwargs)
        finally:
            syncing.reset(mark)

    def decoded_or_not(self: Any, results: Any, what: str, *args: Any, **kwargs: Any) -> None:
        if what != "sync":
            need_decoded(self, results, what, *args, **kwargs)

    async def overwrite(self: Any, rep: Any, stamp: Any, kind: Any, text: Any, **kw: Any) -> Any:
        if syncing.get() and kind is Kind.WRITE and rep.corrupt:
            kind = Kind.OVERWRITE
        return await cas(self, rep, stamp, kind, text, **kw)

    _set(stack, sync, "corrupt_promised_newer", lambda reps, corrupt, stamp: [])
    _set(stack, sync.Sync, "sync", old_sync)
    _set(stack, Replicas, "need_decoded", decoded_or_not)
    _set(stack, Replicas, "cas", overwrite)


def _no_fencing(stack: ExitStack) -> None:
    """Writers do not fence: no check that the lock id holds a majority, no refusal of a
    newer holder's token (nor by the replicas' token floor), and a stamp that outranks
    whatever the replicas hold."""
    from coordinator.engine import register
    from coordinator.engine.state import writes
    from coordinator.engine.state.replicas import Replicas

    def holder_token(self: Any, seen: Any, lock_id: str, unheard: Any) -> int:
        tokens = [o.lease.token for o in seen.values() if o.lease is not None]
        return max(tokens, default=0)

    stamp = register.next_stamp

    def any_stamp(replicas: Any, token: int, evidence: Any, write_id: str) -> Any:
        reps = list(replicas)
        top = max((r.reserved.token for r in reps), default=0)
        return stamp(reps, max(token, top), evidence, write_id)

    _set(stack, writes.Writes, "_holder_token", holder_token)
    _set(stack, writes, "newer_token", lambda replicas, token, evidence: None)
    _set(stack, writes, "next_stamp", any_stamp)
    # (a staticmethod: saved and put back as the class holds it, not as getattr gives it)
    saved = vars(Replicas)["floor_fenced"]
    Replicas.floor_fenced = staticmethod(lambda rep, stamp: None)  # type: ignore[method-assign]
    stack.callback(setattr, Replicas, "floor_fenced", saved)


def _no_namespace_for_joining_members(stack: ExitStack) -> None:
    """A member change does not make the deployment's namespace on a joining member."""
    from coordinator.engine.fanout import ClusterResult
    from coordinator.ops import reconfig
    from coordinator.rules.outcome import Outcome

    async def nothing(clusters: Any, cluster: str, namespace: str) -> Any:
        return ClusterResult(cluster, Outcome.OK, "not made")

    _set(stack, reconfig, "ensure_namespace", nothing)


def _stand_in_needs_the_read_majority(stack: ExitStack) -> None:
    """A finishing run's stand-in rule asks for the old set's majority among the members
    read so far, so the member check is decided before a member that would confirm it
    has answered (exit 5, "could not be read")."""
    import dataclasses

    from coordinator.ops import reconfig
    from coordinator.rules.membership import Membership, Verdict
    from coordinator.rules.quorum import Majorities

    def early(result: Any, stored: Any, old: Any, new: Any, before: Any) -> Any:
        if result.verdict is not Verdict.UNCONFIRMED and result.verdict is not Verdict.UNOBSERVABLE:
            return result
        standing_in = [
            m for m in result.behind
            if m in new and isinstance(v := stored.get(m), Membership) and v.written_by_us
            and v.epoch < before.epoch and set(v.members).intersection(before.members)
        ]  # fmt: skip
        if not standing_in or not Majorities([old]).reached(result.agreeing):
            return result
        if Majorities([new]).reached([*result.agreeing, *standing_in]):
            return dataclasses.replace(result, verdict=Verdict.OK)
        return result

    _set(stack, reconfig, "behind_stand_in", early)


def _plant(name: str, bug: str, fix: str, patch: Callable[[ExitStack], None], **options: Any) -> None:
    PLANTS[name] = Plant(name, bug, fix, patch, options)


_plant("expiry-any-manager", "expiry from any manager's stamp, against the Date header", "2a1829c",
       _judged_by_date(_newest_stamp), kinds=("strip-managed-fields", "foreign-write"), server_skew=4.9)  # fmt: skip
_plant("creation-timestamp", "the creationTimestamp fallback for a lease without our stamp", "2a1829c",
       _judged_by_date(_created_when_unstamped), kinds=("strip-managed-fields",))  # fmt: skip
_plant("missing-free", "a missing lease counted as free, with token 0", "2a1829c",
       _missing_is_free, kinds=("delete-lease-one", "delete-lease-all", "recreate-namespace"))  # fmt: skip
_plant("renew-retakes", "a renewal that re-takes its lease after a break", "2a1829c",
       _renewal_retakes, kinds=("break-holder",))  # fmt: skip
_plant("minority-release", "a release that reached a minority exits 0", "2a1829c",
       _minority_release_ok, kinds=("cut-majority", "pause-majority"))  # fmt: skip
_plant("foreign-floor", "a token floor rewritten by another field manager believed", "8d7422d",
       _foreign_floor_believed, kinds=("foreign-write", "delete-lease-all"), fields=("token-floor",))  # fmt: skip
_plant("foreign-token", "a token annotation another client wrote believed (LeaseView.parse)", "7a70e69",
       _parse_then(_token_of_anyone), kinds=("foreign-write",),
       fields=("coordinator.io/fencing-token", "token-floor"))  # fmt: skip
_plant("holder-removed-free", "a holder field another client removed counted as free (_holder_edited)", "7a70e69",
       _holder_removed_is_free, kinds=("foreign-write",), fields=("spec.holderIdentity",))  # fmt: skip
_plant("equal-token-taken", "an equal token not counted as taken (token_taken)", "2a1829c",
       _equal_token_taken, kinds=("break-holder", "answer-loss", "delay"))  # fmt: skip
_plant("no-skew-margin", "the lapse margin without --max-server-skew (HA servers' offsets)", "2a1829c",
       _no_skew_margin, kinds=("delay",), server_skew=4.9)  # fmt: skip
_plant("no-token-floor", "an acquisition that does not record its token on the state objects", "fd4277a",
       _no_token_floor, kinds=("delete-lease-all",))  # fmt: skip
_plant("unconfirmed-take", "an acquisition that counts its takes without reading them again", "142a105",
       _unconfirmed_take, kinds=("break-holder", "delay"), clusters=5, faults=4.0)  # fmt: skip
_plant("sync-over-promise", "`state sync` overwriting a newer promise", "3fc3182",
       _sync_over_newer_promise, kinds=("foreign-write", "cut-minority"),
       fields=("coordinator.io/state-promise",), readers=3)  # fmt: skip
_plant("no-fencing", "writers that do not fence (paired runs)", "cb56914",
       _no_fencing, kinds=("freeze-holder",))  # fmt: skip
_plant("namespace-not-made", "a member change that does not make the namespace on a joining member", "f982f28",
       _no_namespace_for_joining_members, changers=1)  # fmt: skip
_plant("stand-in-early", "a finishing run's member check decided before the member that confirms it answered",
       "c319a6c", _stand_in_needs_the_read_majority, changers=1,
       kinds=("pause-minority", "delay", "cut-minority"))  # fmt: skip
