"""The replicas of one deployment's state: reading them with their leases, the compare-and-swap
of one replica, and the checks every read and write makes on what was read."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, assert_never

from coordinator import clock
from coordinator.config.models import STATE_SCHEMA, LockRecord
from coordinator.config.records import DeploymentRecord
from coordinator.engine import cas
from coordinator.engine.clusters import ClusterSet
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.engine.lock.core import checked, local_names, membership_error, recorded_membership
from coordinator.engine.lock.floor import envelope_evidence, has_floor, kept_set_speaks, set_on_state, token_floor
from coordinator.engine.register import (
    Choice,
    Kind,
    Replica,
    Stamp,
    build_object,
    choose,
    decode_replica,
    judge,
    lease_evidence,
    promise_after,
    text_after,
)
from coordinator.engine.state.results import Observed, _failed, _replicas
from coordinator.errors import IdentityMismatchError, NoQuorumError, StateConflictError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules import quorum
from coordinator.rules.evidence import with_records
from coordinator.rules.lease import LeaseView, history_known
from coordinator.rules.membership import Check, Stored, newer_set, says_nothing, stored_in_lease
from coordinator.rules.membership import check as check_membership
from coordinator.rules.outcome import Outcome
from coordinator.rules.resources import FIELD_MANAGER, lease_name, lease_path, state_name, state_paths

log = get_logger("coordinator.engine.state")  # one logger for the whole register


class Replicas:
    """The replicas of one deployment's state on its members."""

    def __init__(
        self,
        clusters: ClusterSet,
        deployment: DeploymentRecord,
        *,
        recorded_lock: Callable[[str], LockRecord | None] | None = None,
    ) -> None:
        self.clusters = clusters
        self.dep = deployment
        self.recorded_lock = recorded_lock
        self.members = list(deployment.clusters)
        self.n = len(self.members)
        self.q = quorum.quorum_size(self.n)
        # The member set this machine's record names, by identity, as the leases store it.
        self.membership = recorded_membership(clusters, deployment)
        self.name = state_name(deployment.name)
        self.storage = deployment.storage
        self.collection, self.path = state_paths(deployment.namespace, deployment.name, self.storage)

    async def read_one(self, cluster: str, *, with_lease: bool = True, lease_required: bool = True) -> Observed:
        """Identity check, replica read and lease read in one round trip. A reader that may
        not read the lease (``lease_required`` False) goes without its evidence."""
        client = self.clusters.client(cluster)
        out: dict[str, Any] = {}

        async def read_state() -> None:
            try:
                resp = await client.request("GET", self.path)
                out["obj"] = resp.body
            except KubeError as err:
                if err.kind != kube.NOT_FOUND:
                    raise
                out["obj"] = None

        async def read_lease() -> None:
            try:
                resp = await client.request("GET", lease_path(self.dep.namespace, lease_name(self.dep.name)))
                out["lease"] = LeaseView.parse(resp.body, resp.server_time)
            except KubeError as err:
                if err.kind == kube.FORBIDDEN and not lease_required:
                    return
                if err.kind != kube.NOT_FOUND:
                    raise
                out["lease"] = LeaseView(exists=False)

        await checked(self.clusters, cluster, read_state, *([read_lease] if with_lease else []))
        return Observed(
            decode_replica(cluster, out.get("obj"), self.storage, deployment=self.dep.name), out.get("lease")
        )

    async def put(self, rep: Replica, body: dict[str, Any]) -> Replica:
        client = self.clusters.client(rep.cluster)
        query = {"fieldManager": FIELD_MANAGER}
        if rep.exists:
            body = with_records(body, rep.obj, clock.token_hex(6))
            resp = await client.request("PUT", self.path, body=body, query=query)
        else:
            resp = await client.request("POST", self.collection, body=body, query=query)
        return decode_replica(rep.cluster, resp.body, self.storage, deployment=self.dep.name)

    async def cas(
        self,
        rep: Replica,
        stamp: Stamp,
        kind: Kind,
        text: str | Callable[[Replica], str | None] | None,
        *,
        holder: bool = False,
        unchanged: Stamp | None = None,
    ) -> ClusterResult[Replica]:
        """Give ``rep`` the promise (``text`` None) or the envelope ``text`` of ``stamp``,
        if the replica's rule lets it take it; compare-and-swap, re-judged on each retry.
        ``holder``: a lock holder's own write under its token (fenced by the token floor
        too, see floor_fenced); a repair or a sync writes a value with the stamp it was
        written under. ``unchanged``: the stamp the replica held when the value sent was
        chosen; a replica that holds another one since is not written over (a member
        change's copy: what landed there may be a write the copy did not see). ``text``
        may be made from the replica as it is at each try (a promise kept inside the
        envelope it holds)."""
        cluster = rep.cluster

        def decide(rep: Replica) -> cas.Put[dict[str, Any]] | cas.Keep[ClusterResult[Replica]]:
            fenced = self.fenced(rep) or (self.floor_fenced(rep, stamp) if holder else None)
            if fenced is None and unchanged is not None and rep.stamp not in (unchanged, stamp):
                fenced = f"refused: it holds {rep.stamp.short()} since the value was chosen (then {unchanged.short()})"
            if fenced is not None:
                return cas.Keep(ClusterResult(cluster, Outcome.CONFLICT, rep, detail=fenced))
            verdict = judge(rep, stamp, kind)
            if not verdict.accept:
                return cas.Keep(ClusterResult(cluster, Outcome.CONFLICT, rep, detail=verdict.reason))
            if verdict.done:
                return cas.Keep(ClusterResult(cluster, Outcome.OK, rep, detail=f"already holds {stamp.short()}"))
            return cas.Put(
                build_object(
                    rep,
                    name=self.name,
                    deployment=self.dep.name,
                    storage=self.storage,
                    promise=promise_after(rep, stamp, kind),
                    envelope_text=text_after(rep, stamp, kind, text(rep) if callable(text) else text),
                )
            )

        async def reread() -> Replica:
            return (await self.read_one(cluster, with_lease=False)).replica

        result = await cas.compare_and_swap(reread, decide, self.put, current=rep, reread_last=True)
        match result:
            case cas.Written(value=new):
                verb = "promised" if kind is Kind.PROMISE or text is None else "wrote"
                return ClusterResult(cluster, Outcome.OK, new, detail=f"{verb} version {stamp.version}")
            case cas.Decided(value=done):
                return done
            case cas.WriteFailed(error=err):
                return _failed(cluster, err)
            case cas.ReadFailed(error=err):
                return _failed(cluster, err, definite=True)  # the last write was refused (409)
            case cas.Raced(current=last):
                return ClusterResult(
                    cluster, Outcome.CONFLICT, last, detail="lost the compare-and-swap race repeatedly"
                )
        assert_never(result)

    def fenced(self, rep: Replica) -> str | None:
        """Why the object itself refuses this write, beyond the stamps' order: it notes a
        newer member set (written by coordinator) than this command counts with, so a
        member change began since this command read the members. A member change notes
        its joint set on the state objects of a majority of both sets before it copies the
        state, and every compare-and-swap is judged again on each retry: a write that
        lands after the note is refused, one that landed before is on a majority the
        copy reads."""
        noted = set_on_state(rep.obj) if rep.obj else None
        if noted is not None and noted.epoch > self.membership.epoch:
            return (
                f"refused: the members changed (member set epoch {noted.epoch} is noted here, this command "
                f"counts with epoch {self.membership.epoch})"
            )
        return None

    @staticmethod
    def floor_fenced(rep: Replica, stamp: Stamp) -> str | None:
        """Why the object refuses a lock holder's promise or write under ``stamp``: its
        token floor (coordinator's) is above the stamp's fencing token. The floor is
        raised before an acquisition counts, so a lock with a higher token was granted
        since this one: the holder of this stamp's lock lost it, whatever else was
        removed from the object (its member-set note, say)."""
        if not rep.obj or not has_floor(rep.obj):
            return None
        floor = token_floor(rep.obj)
        if floor <= stamp.token:
            return None
        return f"refused: a lock with a higher fencing token was granted since (token floor {floor} > {stamp.token})"

    async def read_all(
        self, *, early: bool = False, newer_ok: bool = False, writing: bool = False
    ) -> dict[str, ClusterResult[Observed]]:
        """Read every member with its lease (``early``: stop at a majority; ``writing``:
        the lease is needed, to check the lock). A replica written with a newer envelope
        schema stops the command, unless ``newer_ok``."""

        async def one(cluster: str) -> ClusterResult[Observed]:
            try:
                seen = await self.read_one(cluster, lease_required=writing)
            except KubeError as err:
                return _failed(cluster, err)
            return ClusterResult(cluster, Outcome.OK, seen)

        def enough(rs: Any) -> bool:
            return sum(1 for r in rs.values() if r.ok) >= self.q

        results = await fan_out(
            self.members,
            one,
            timeout=self.clusters.timeout,
            until=enough if early else None,
            silent=self.clusters.silent,
        )
        bad = {k: r for k, r in results.items() if r.outcome is Outcome.IDENTITY_MISMATCH}
        if bad:
            raise IdentityMismatchError(
                "Cluster identity mismatch — no state was read or written: "
                + "; ".join(f"cluster {k!r}: {r.detail}" for k, r in sorted(bad.items()))
                + ". Fix the kubeconfig context, or reconnect the cluster if it was really rebuilt."
            )
        newer = [rep for rep in _replicas(results).values() if rep.newer_schema]
        if newer and not newer_ok:
            raise StateConflictError(
                f"The state of {self.dep.name!r} on {', '.join(r.cluster for r in newer)} was written "
                f"with envelope schema {newer[0].newer_schema}, newer than this coordinator understands "
                f"({STATE_SCHEMA}). Upgrade coordinator; nothing was changed."
            )
        return results

    def judge(
        self, results: Mapping[str, ClusterResult[Observed]], *, q: int | None = None
    ) -> tuple[Choice, int | None]:
        # Only a lease coordinator wrote is evidence of the tokens granted: one planted or
        # copied (anyone allowed to create Leases can make one) could vouch for any token.
        evidence = lease_evidence(
            (
                r.value.lease.token
                for r in results.values()
                if r.ok and r.value and r.value.lease and history_known(r.value.lease)
            ),
            q or self.q,
        )
        return choose(_replicas(results), evidence), evidence

    def refuse_other_members(self, results: Mapping[str, ClusterResult[Observed]]) -> None:
        """Stop unless the members read confirm this machine's member set, as a lock
        acquisition checks it: a member storing another set under the same or a newer
        epoch means this machine's record is stale or divergent, and a majority counted
        over it is no majority (exit 5, with the `deployment import` hint); too few
        members confirming it is exit 5 too, or 4 when more answers could still confirm
        it. Where a lease says nothing (deleted, a tombstone, its set removed), the state
        object's own set speaks for the member, as it does for an acquisition."""
        verdict = self.members_verdict(results)
        if verdict.ok:
            return
        raise membership_error(verdict, self.dep.name, local_names(self.clusters, self.members))

    def members_verdict(self, results: Mapping[str, ClusterResult[Observed]]) -> Check:
        """The members' verdict on this machine's set, each member heard as an
        acquisition hears it (lock/acquire.py): a state object that keeps another set at
        the same or a newer epoch speaks against its member whatever the lease says (a
        lease can miss the steps of a change its state object saw), and where the lease
        says nothing the state object's set speaks for it."""
        stored: dict[str, Stored] = {}
        for k, r in results.items():
            if not (r.ok and r.value):
                continue
            found = stored_in_lease(r.value.lease) if r.value.lease is not None else None
            noted = newer_set(set_on_state(r.value.replica.obj), self.membership) if r.value.replica.obj else None
            if noted is not None:
                found = noted
            elif says_nothing(found, self.membership) and r.value.replica.obj:  # else no envelope to parse
                evidence = envelope_evidence(r.value.replica.obj, secret=self.storage == "secret")
                speaks = kept_set_speaks(found, evidence[1] if evidence is not None else None, self.membership)
                if speaks is not None:
                    found = speaks
            stored[k] = found
        return check_membership(self.membership, stored, self.members)

    def unheard(self, results: Mapping[str, ClusterResult[Any]]) -> list[str]:
        """The members that gave no answer: not asked, or failed (unreachable, refused)."""
        return sorted(k for k in self.members if k not in results or not results[k].ok)

    def need_quorum(self, results: Mapping[str, ClusterResult[Any]], what: str) -> None:
        seen = [k for k, r in results.items() if r.ok]
        if len(seen) < self.q:
            unseen = [f"{k} ({r.outcome}: {r.detail})" for k, r in sorted(results.items()) if not r.ok]
            unseen += [f"{k} (no answer)" for k in self.members if k not in results]
            raise NoQuorumError(
                f"Cannot {what} the state of {self.dep.name!r}: {len(seen)} of {self.n} clusters "
                f"answered, {self.q} are needed. Unobservable: {', '.join(unseen)}. An unobservable "
                "cluster is never taken as empty; retry when they are reachable."
            )

    def need_decoded(
        self, results: Mapping[str, ClusterResult[Observed]], what: str, q: int | None = None, *, read: bool = False
    ) -> None:
        """A value is chosen from replicas that decode: a corrupt replica may hide the newest
        confirmed write, and so may a missing object (deleted by anyone who may delete in
        the namespace, or never made there), so both count as unanswered — unless no
        member holds an object at all and every member said so (nothing was written, or
        nothing is left to lose). Fewer than a majority of replicas that decode is no
        majority: exit 4 while some member did not answer (its answer may make one), else
        exit 6 (the corrupt or missing replicas must be written first); a read, always 4."""
        q = q or self.q
        answered = _replicas(results)
        if nothing_anywhere(results):
            return  # no state was written, or none is left to lose
        decoded = sorted(k for k, rep in answered.items() if rep.answers)
        if len(decoded) >= q:
            return
        from coordinator.text import printable

        why = [f"{k}: corrupt ({printable(rep.corrupt or '')})" for k, rep in sorted(answered.items()) if rep.corrupt]
        why += [f"{k}: no state object (deleted?)" for k, rep in sorted(answered.items()) if not rep.exists]
        why += [
            f"{k}: an empty object made since the deployment was created (deleted before?)"
            for k, rep in sorted(answered.items())
            if rep.exists and rep.blank
        ]
        unanswered = [f"{k}: {r.outcome} ({r.detail})" for k, r in sorted(results.items()) if not r.ok]
        if q == self.q:
            unanswered += [f"{k}: not heard" for k in self.members if k not in results]
        name = self.dep.name
        head = (
            f"Cannot {what} the state of {name!r}: {len(decoded)} of {len(results)} clusters answered with a "
            f"replica that decodes ({', '.join(decoded) or 'none'}), {q} are needed to know the newest "
            f"confirmed state, and a corrupt replica counts as unanswered, as does a missing one "
            f"({'; '.join(why + unanswered)}). "
            "Nothing was changed."
        )
        recover = (
            f"`coordinator state diff {name}` shows every replica; `coordinator state sync {name} --from "
            f"CLUSTER` (a replica that decodes) or `coordinator state apply {name} -f FILE`, under the lock, "
            "writes a whole state over the corrupt and missing ones, saving the corrupt ones to files first."
        )
        if unanswered or read:
            # A read exits 4 whenever it cannot decide (README, exit codes).
            raise NoQuorumError(
                f"{head} Retry when more clusters are reachable. If the corrupt ones stay so, {recover}"
            )
        raise StateConflictError(f"{head} Look at the corrupt replicas: {recover}")

    def refuse_unreadable(self, results: Mapping[str, ClusterResult[Observed]], choice: Choice, what: str) -> None:
        """With no trusted replica, the state is empty only if a majority holds none at
        all: corrupt and suspect replicas are never taken as empty, any more than
        unobservable ones are. While members that did not answer could still make that
        majority, nothing is decided yet: exit 4, as for any read short of answers; exit
        6 only once every member answered."""
        answered = _replicas(results)
        absent = [k for k, rep in answered.items() if rep.envelope is None and not rep.corrupt]
        absent = [k for k in absent if k not in choice.suspect]
        if not (choice.corrupt or choice.suspect) or len(absent) >= self.q:
            return
        from coordinator.text import printable

        name = self.dep.name
        # The reasons quote what the replicas hold (keys of a planted envelope): one line
        # each, escaped, in a paragraph whose own lines are kept.
        why = [f"{k}: corrupt ({printable(r)})" for k, r in sorted(choice.corrupt.items())]
        why += [f"{k}: suspect ({printable(r)})" for k, r in sorted(choice.suspect.items())]
        head = (
            f"Cannot {what} the state of {name!r}: no trusted replica was found and the ones on "
            f"{', '.join(sorted([*choice.corrupt, *choice.suspect]))} are corrupt or suspect ("
            + "; ".join(why)
            + "), so it is not known to be empty."
        )
        recover = (
            f"`coordinator state diff {name}` shows every replica; `coordinator state sync {name} --from CLUSTER`, "
            f"`coordinator state restore {name} -f BACKUP` or `coordinator state apply {name} -f FILE` (under the "
            "lock) writes a whole valid state over them, saving the replicas it replaces to files first."
        )
        unheard = self.unheard(results)
        if len(absent) + len(unheard) >= self.q:
            raise NoQuorumError(
                f"{head} {', '.join(unheard)} did not answer, and {'its' if len(unheard) == 1 else 'their'} "
                "answer decides whether a majority holds no state. Nothing was changed. Retry when more "
                f"clusters are reachable. If the corrupt ones stay so, {recover}"
            )
        raise StateConflictError(f"{head} Nothing was changed. {recover}")

    def refuse_conflict(self, choice: Choice, what: str) -> None:
        if not choice.conflict:
            return
        name = self.dep.name
        raise StateConflictError(
            f"Cannot {what} the state of {name!r}: {', '.join(choice.conflict)} hold different data under "
            "the same stamp, which no write of coordinator produces (edited by hand?). Nothing was "
            f"changed. `coordinator state diff {name}` shows them; `coordinator state sync {name} --from "
            "CLUSTER` (under the lock) adopts one of them deliberately, as a new version."
        )

    def save_replica(self, rep: Replica, backup_dir: Path | None, reason: str) -> Path:
        import platformdirs

        from coordinator.config.files import write_private

        folder = backup_dir or Path(platformdirs.user_state_dir("coordinator")) / "corrupt-replicas"
        stamp = clock.wall_now().strftime("%Y%m%dT%H%M%S%fZ")
        # The replica may hold secret state: 0600 in a 0700 folder (the default one narrowed).
        path = write_private(
            folder / f"{self.dep.name}-{rep.cluster}-{stamp}.json",
            json.dumps({"cluster": rep.cluster, "reason": reason, "object": rep.obj}, indent=2),
            own_folder=backup_dir is None,
        )
        log.warning("saved a replica before overwriting it", cluster=rep.cluster, path=str(path))
        return path


def nothing_anywhere(results: Mapping[str, ClusterResult[Observed]]) -> bool:
    """Every replica asked answered, and none holds an object that answers (missing, or
    empty ones made since): no state was written there, or none is left to lose."""
    answered = _replicas(results)
    return len(answered) == len(results) and all(rep.blank for rep in answered.values())
