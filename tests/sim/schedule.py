"""The simulator's fault schedule: drawn from the seed (``draw``), applied and undone on
the virtual clock (``Injector``). Each episode draws its targets from a generator of its
own (seed and index), when it starts, so that a schedule with some episodes left out (a
shrunk one) does the same in the episodes it keeps."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

import anyio

from coordinator.kube.transport import Request
from coordinator.rules.quorum import quorum_size
from coordinator.rules.resources import lease_name, lease_path, state_paths
from sim.simulate import DEPLOYMENT, NAMESPACE, Options, Sim, lease_uid, now

LINK_KINDS = ("delay", "loss", "answer-loss", "duplicate")
KINDS = (
    *LINK_KINDS,
    "cut-minority",
    "cut-majority",
    "ring",
    "pause-minority",
    "pause-majority",
    "kill",
    "throttle",
    "compact",
    "restore",
    "delete-lease-one",
    "delete-lease-all",
    "delete-state-one",
    "recreate-namespace",
    "foreign-write",
    "strip-managed-fields",
    "edit-lease-duration",
    "annotate-lease",
    "reject-minority",
    "reject-majority",
    "freeze-holder",
    "break-holder",
)
# Kinds done at once (no episode to undo).
INSTANT = frozenset({"compact", "delete-lease-one", "delete-lease-all", "delete-state-one", "recreate-namespace"})
OTHER_MANAGER = "sim-other-client"
# Fields of the evidence table on the state object that foreign writes edit besides the
# fault suite's: the promise (rewritten by another client the replica is corrupt).
STATE_EVIDENCE = ("coordinator.io/state-promise",)


@dataclass(frozen=True)
class Fault:
    index: int
    at: float
    duration: float
    kind: str

    def describe(self) -> str:
        return f"#{self.index} {self.kind} at {self.at:.1f}s for {self.duration:.1f}s"


def draw(opts: Options) -> list[Fault]:
    """The schedule of a run: ``opts.faults`` episodes per 10 s of workload, kinds drawn
    evenly from ``opts.kinds`` (every kind when empty)."""
    rng = random.Random(f"{opts.seed}:schedule")
    kinds = list(opts.kinds or KINDS)
    count = max(1, round(opts.seconds / 10 * opts.faults)) if kinds else 0
    times = sorted(rng.uniform(2.0, max(3.0, opts.seconds - 2.0)) for _ in range(count))
    out = []
    for i, at in enumerate(times):
        kind = rng.choice(kinds)
        out.append(Fault(i, at, 0.0 if kind in INSTANT else rng.uniform(1.0, 30.0), kind))
    return out


class Injector:
    """Applies the schedule's episodes at their times and undoes each at its end."""

    def __init__(self, sim: Sim, schedule: list[Fault]) -> None:
        self.sim = sim
        self.schedule = schedule
        self.policies: dict[str, list[str]] = {}  # cluster -> admission policies in force
        self.episodes = 0
        self._judge: Any = None  # an engine to judge the members' records with (confirmed)

    @property
    def clusters(self) -> list[str]:
        return self.sim.members

    def minority(self, rng: random.Random) -> list[str]:
        members = self.clusters
        return rng.sample(members, rng.randint(1, len(members) - quorum_size(len(members))))

    def majority(self, rng: random.Random) -> list[str]:
        members = self.clusters
        return rng.sample(members, rng.randint(quorum_size(len(members)), len(members)))

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for fault in self.schedule:
                await anyio.sleep(max(0.0, fault.at - now()))
                if self.sim.stop.is_set():
                    return
                tg.start_soon(self.episode, fault)

    async def episode(self, fault: Fault) -> None:
        rng = random.Random(f"{self.sim.opts.seed}:fault:{fault.index}")
        undo = await self.apply(fault, rng)
        if undo is None:
            return
        self.sim.faults[fault.kind] += 1
        try:
            await anyio.sleep(fault.duration)
        finally:
            with anyio.CancelScope(shield=True):
                await undo()

    async def heal(self) -> None:
        """Undo everything still in force: links, frozen contenders, servers, policies."""
        net = self.sim.net
        for state in net.links.values():
            state.delay = state.loss = state.answer_loss = state.duplicate = 0.0
            state.cut = state.hang = False
        for name in list(net.frozen):
            net.thaw(name)
        for cluster in self.sim.world.clusters.values():
            for server in cluster.servers:
                server.start()
                server.resume()
                server.unthrottle()
                server.lose_answers(0)
                for policy in list(server.policies):
                    server.allow(policy)

    # ---------------------------------------------------------------- the kinds

    async def apply(self, fault: Fault, rng: random.Random) -> Any:
        """Start ``fault``; return the coroutine function that undoes it (None: nothing
        to undo, or the episode was skipped)."""
        kind = fault.kind
        sim = self.sim
        world = sim.world
        players = [p for p in self._contenders()]
        if kind in LINK_KINDS:
            who = rng.sample(players, rng.randint(1, len(players)))
            where = rng.sample(self.clusters, rng.randint(1, len(self.clusters)))
            setting = {
                "delay": ("delay", rng.uniform(0.05, 3.0)),
                "loss": ("loss", rng.uniform(0.05, 0.5)),
                "answer-loss": ("answer_loss", rng.uniform(0.05, 0.5)),
                "duplicate": ("duplicate", rng.uniform(0.1, 0.6)),
            }[kind]
            links = [sim.net.link(p, c) for p in who for c in where]
            for link in links:
                setattr(link, setting[0], setting[1])
            sim.note(f"{fault.describe()}: {setting[0]}={setting[1]:.2f} on {who} x {where}")

            async def undo_links() -> None:
                for link in links:
                    setattr(link, setting[0], 0.0)

            return undo_links
        if kind in ("cut-minority", "cut-majority", "ring"):
            hang = rng.random() < 0.5
            cut: list[Any] = []
            if kind == "ring":
                members = self.clusters
                q = quorum_size(len(members))
                for i, p in enumerate(players):
                    reach = {members[(i + j) % len(members)] for j in range(q)}
                    cut += [sim.net.link(p, c) for c in members if c not in reach]
            else:
                where = self.minority(rng) if kind == "cut-minority" else self.majority(rng)
                cut = [sim.net.link(p, c) for p in players for c in where]
            for link in cut:
                link.cut, link.hang = True, hang
            sim.note(f"{fault.describe()}: {len(cut)} links cut ({'hanging' if hang else 'refused'})")

            async def undo_cut() -> None:
                for link in cut:
                    link.cut = link.hang = False

            return undo_cut
        if kind in ("pause-minority", "pause-majority", "kill", "throttle"):
            where = self.majority(rng) if kind == "pause-majority" else self.minority(rng)
            servers = [s for c in where for s in world.clusters[c].servers]
            retry = str(rng.randint(1, 3))
            for s in servers:
                if kind == "kill":
                    s.stop()
                elif kind == "throttle":
                    s.throttle(retry)
                else:
                    s.pause()
            sim.note(f"{fault.describe()}: {where}")

            async def undo_servers() -> None:
                for s in servers:
                    if kind == "kill":
                        s.start()
                    elif kind == "throttle":
                        s.unthrottle()
                    else:
                        s.resume()

            return undo_servers
        if kind == "compact":
            for c in self.clusters:
                world.clusters[c].store.compact()
            sim.faults[kind] += 1
            return None
        if kind == "restore":
            return self._restore(fault, rng)
        if kind in ("delete-lease-one", "delete-lease-all", "delete-state-one", "recreate-namespace"):
            self._delete(fault, rng)
            return None
        if kind in ("foreign-write", "strip-managed-fields", "edit-lease-duration", "annotate-lease"):
            return await self._other_client(fault, rng)
        if kind in ("reject-minority", "reject-majority"):
            where = self.minority(rng) if kind == "reject-minority" else self.majority(rng)
            name = f"sim-reject-{fault.index}"
            state = state_paths(NAMESPACE, DEPLOYMENT, "configmap")[1].rsplit("/", 1)[1]

            def rejects(op: str, k: Any, obj: Any, old: Any) -> bool:
                meta = obj.get("metadata") or {}
                return (
                    op in ("CREATE", "UPDATE")
                    and k.resource == "configmaps"
                    and meta.get("namespace") == NAMESPACE
                    and meta.get("name") == state
                )

            for c in where:
                for s in world.clusters[c].servers:
                    s.reject(name, rejects, "denied by the simulator's admission policy")
            sim.note(f"{fault.describe()}: {where}")

            async def undo_reject() -> None:
                for c in where:
                    for s in world.clusters[c].servers:
                        s.allow(name)

            return undo_reject
        if kind == "freeze-holder":
            inside = sorted(sim.recorder.inside)
            stopped = rng.choice(inside) if inside else rng.choice(players)
            sim.net.freeze(stopped)
            sim.note(f"{fault.describe()}: {stopped} frozen")

            async def undo_freeze() -> None:
                sim.net.thaw(stopped)

            return undo_freeze
        if kind == "break-holder":
            await self._break(fault)
            return None
        raise ValueError(f"unknown fault kind {kind!r}")

    def _contenders(self) -> list[str]:
        o = self.sim.opts
        return (
            [f"api{i + 1}" for i in range(o.api)]
            + [f"cmd{i + 1}" for i in range(o.cmd)]
            + [f"read{i + 1}" for i in range(o.readers)]
        )

    # -- what an operator or another client does, straight to a server

    def _server_request(self, cluster: str, method: str, path: str, *, body: Any = None,
                        query: dict[str, str] | None = None, ctype: str = "application/json",
                        force: bool = False) -> tuple[int, Any]:  # fmt: skip
        """One request to ``cluster``'s API server, answered at once (kubectl of another
        client); (0, None) when the server cannot answer (paused, stopped). ``force``: an
        operator's step that the fault model makes at once (after a restore, recreating a
        namespace), answered whatever the server's state, never throttled."""
        server = self.sim.world.clusters[cluster].pick()
        if (server.stopped or server.paused) and not force:
            return 0, None
        throttled = server._throttled
        if force:
            server._throttled = None
        request = Request(
            method,
            path,
            tuple((query or {}).items()),
            {"Content-Type": ctype, "User-Agent": "kubectl/v1.34.4"},
            json.dumps(body).encode() if body is not None else None,
        )
        try:
            answer = server.handle(request)
        finally:
            server._throttled = throttled
        return answer.status, json.loads(answer.body) if answer.body else None

    def _lease_path(self) -> str:
        return lease_path(NAMESPACE, lease_name(DEPLOYMENT))

    def _state_path(self) -> str:
        return state_paths(NAMESPACE, DEPLOYMENT, "configmap")[1]

    def _key(self, path: str) -> tuple[str, str, str]:
        resource = "leases" if "/leases/" in path else "configmaps"
        return (resource, NAMESPACE, path.rsplit("/", 1)[1])

    def _delete(self, fault: Fault, rng: random.Random) -> None:
        """Delete the Lease (on one member or all), the state object, or the namespace
        (made again, empty), unless that leaves the members unable to confirm the member
        set: then on another member, or not at all (as the fault suite's gate does)."""
        kind = fault.kind
        members = self.clusters
        if kind == "delete-lease-all":
            choices = [list(members)]
        else:
            first = rng.choice(members)
            others = [m for m in members if m != first]
            rng.shuffle(others)
            choices = [[first]] + [[m] for m in others]
        for targets in choices:
            if self._guarded(fault.describe(), lambda t=targets: self._delete_on(kind, t)):
                self.sim.faults[kind] += 1
                self.sim.note(f"{fault.describe()}: on {targets}")
                return
        self.sim.note(f"{fault.describe()}: skipped, on every member outside the fault model")

    def _delete_on(self, kind: str, targets: list[str]) -> None:
        for name in targets:
            store = self.sim.world.clusters[name].store
            if kind in ("delete-lease-one", "delete-lease-all"):
                key = self._key(self._lease_path())
                if key in store.objects:
                    store.delete(key)
            elif kind == "delete-state-one":
                key = self._key(self._state_path())
                if key in store.objects:
                    store.delete(key)
            else:
                for key in sorted(k for k in store.objects if k[1] == NAMESPACE):
                    store.delete(key)
                if ("namespaces", "", NAMESPACE) in store.objects:
                    store.delete(("namespaces", "", NAMESPACE))
                namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
                self._server_request(name, "POST", "/api/v1/namespaces", body=namespace, force=True)

    def _guarded(self, what: str, act: Any) -> bool:
        """Do ``act`` (at once: no other task runs meanwhile) unless it leaves the members
        unable to confirm the member set where they could before; then put back what it
        changed and say so. That is outside the fault model (docs/design.md, *The member set
        lives in the clusters*: with the leases and the state objects of a majority
        wiped, every command stops for good), for deletions, foreign writes, stripped
        managedFields and restores alike. Judged as an acquisition judges it
        (``confirmed``)."""
        keys = (self._key(self._lease_path()), self._key(self._state_path()))
        ns_key = ("namespaces", "", NAMESPACE)
        stores = {c: self.sim.world.clusters[c].store for c in self.clusters}
        before = {(c, k): stores[c].objects.get(k) for c in stores for k in (*keys, ns_key)}
        could = self.confirmed(), self.readable()
        act()
        if (not could[0] or self.confirmed()) and (not could[1] or self.readable()):
            return True
        for (c, k), old in sorted(before.items(), key=lambda item: item[0][1] != ns_key):
            if stores[c].objects.get(k) is old:
                continue
            if old is None:
                stores[c].delete(k)
            else:
                stores[c].put(k, old)
        self.sim.note(f"{what}: undone at once: the members would no longer confirm the member set or hold a state")
        return False

    def readable(self) -> bool:
        """Whether a majority of the members hold a state object that answers
        (coordinator/engine/register.py's ``Replica.answers``: it decodes, its envelope and promise
        are coordinator's, and it is not an empty one made since the deployment was
        created). The register keeps a confirmed write while a minority of its replicas
        is lost (README, *The state register*): a deletion, foreign write or strip that
        leaves fewer than a majority that answer is outside the fault model, as one that
        leaves the member set unconfirmed is. Corrupt replicas stop every read (exit 6)
        until a write replaces them; missing and later-made empty ones are no answer, and
        deleting the state of a majority before a write repairs it loses what it held."""
        from coordinator.engine.register import _decode

        members = self._engine().members
        answering = 0
        for c in members:
            obj = self.sim.world.clusters[c].store.objects.get(self._key(self._state_path()))
            answering += _decode(c, obj, "configmap", deployment=DEPLOYMENT, from_file=False).answers
        return answering >= quorum_size(len(members))

    def confirmed(self) -> bool:
        """Whether an acquisition that reads every member now finds that they confirm its
        member set: the engine's own check (lock/acquire.py), on the leases, with the
        state objects speaking for members whose lease says nothing when a majority of
        them carry a token floor of coordinator's."""
        from coordinator.engine.fanout import ClusterResult
        from coordinator.engine.lock.floor import ABSENT, NO_FLOOR, envelope_evidence, has_floor, kept_set_speaks
        from coordinator.rules.lease import LeaseView
        from coordinator.rules.membership import Verdict
        from coordinator.rules.outcome import Outcome

        engine = self._engine()
        reads: dict[str, Any] = {}
        states: dict[str, Any] = {}
        for c in engine.members:
            store = self.sim.world.clusters[c].store
            lease = store.objects.get(self._key(self._lease_path()))
            reads[c] = LeaseView.parse(lease, None) if lease is not None else LeaseView(exists=False)
            obj = store.objects.get(self._key(self._state_path()))
            if obj is None:
                states[c] = ClusterResult(c, Outcome.OK, (0, None), detail=ABSENT)
            elif (found := envelope_evidence(obj, secret=False)) is None:
                states[c] = ClusterResult(c, Outcome.ERROR, detail="unreadable state envelope")
            else:
                states[c] = ClusterResult(c, Outcome.OK, found, detail="" if has_floor(obj) else NO_FLOOR)
        stored = engine.core.hear_state_objects({c: engine.core.stored_membership(v) for c, v in reads.items()}, states)
        verdict = engine.check_members(stored)
        evidence = engine._floor.judge_state(states)
        if verdict.verdict in (Verdict.UNOBSERVABLE, Verdict.UNCONFIRMED) and evidence:
            for c, (_, kept) in evidence.items():
                speaks = kept_set_speaks(stored.get(c), kept, engine.membership)
                if speaks is not None:
                    stored[c] = speaks
            verdict = engine.check_members(stored)
        return bool(verdict.ok)

    def _engine(self) -> Any:
        cfg = self.sim.config
        record = cfg.deployments[DEPLOYMENT]
        if self._judge is None or self._judge.dep != record:  # a member change moved the record on
            from coordinator.engine.clusters import ClusterSet
            from coordinator.engine.lock.engine import LockEngine
            from coordinator.ops.reconfig import finishing_configuration

            # It sends nothing; the world's transports spare it the HTTPS client's imports.
            clusters = ClusterSet(cfg, timeout=1.0, transport_factory=self.sim.world.transport_factory)
            # A change in progress is judged as a run that finishes it counts: the set
            # before it, its joint set or its commit agrees. Judged by the plain engine,
            # members storing the set before the change would not count, and a deletion
            # that leaves the change unable to finish for good would pass as harmless.
            config = record if record.joint is None else finishing_configuration(clusters, record)
            self._judge = LockEngine(clusters, config)
        return self._judge

    def _restore(self, fault: Fault, rng: random.Random) -> Any:
        """A member's etcd snapshot taken now, restored at the episode's end, and at once
        `cluster restored NAME`'s tombstoning (docs/design.md's procedure after a restore).
        The state object comes back only where its envelope and promise are those of the
        snapshot (a restored state object that loses a write confirmed by a bare majority
        with it is the documented price until `state sync`: docs/design.md, *A member restored
        from a backup*); its annotations (token floor, member set) go back."""
        sim = self.sim
        name = rng.choice(self.clusters)
        store = sim.world.clusters[name].store
        lease_key, state_key = self._key(self._lease_path()), self._key(self._state_path())
        snapshot = {k: copy.deepcopy(store.objects.get(k)) for k in (lease_key, state_key)}
        sim.note(f"{fault.describe()}: snapshot of {name}")

        async def restore() -> None:
            self._guarded(fault.describe(), put_back)

        def put_back() -> None:
            from coordinator.engine.register import DATA_KEY, PROMISE_ANNOTATION
            from coordinator.ops.restored import silenced_state_body, tombstone_body
            from coordinator.rules.resources import FIELD_MANAGER, micro_time

            def same_state(a: Any, b: Any) -> bool:
                if a is None or b is None:
                    return a is b
                ann_a = (a["metadata"].get("annotations") or {}).get(PROMISE_ANNOTATION)
                ann_b = (b["metadata"].get("annotations") or {}).get(PROMISE_ANNOTATION)
                return bool((a.get("data") or {}).get(DATA_KEY) == (b.get("data") or {}).get(DATA_KEY)) and (
                    ann_a == ann_b
                )

            for key, old in snapshot.items():
                cur = store.objects.get(key)
                if old is None or (key == state_key and not same_state(old, cur)):
                    continue
                back = copy.deepcopy(old)
                back["metadata"].pop("resourceVersion", None)
                store.put(key, back)
            store.compact()
            # `coordinator cluster restored NAME --yes`, before anyone reads the member.
            lease = store.objects.get(lease_key)
            if lease is not None:
                body = tombstone_body(copy.deepcopy(lease), micro_time(sim.world.clusters[name].server.now()))
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                status, _ = self._server_request(name, "PUT", self._lease_path(), body=body,
                                                 query={"fieldManager": FIELD_MANAGER}, force=True)  # fmt: skip
                if status != 200:
                    sim.recorder.problem(f"restore of {name}: the tombstoning write answered {status}")
            # ... which also removes the state object's member-set note of the snapshot.
            state = store.objects.get(state_key)
            silenced = silenced_state_body(copy.deepcopy(state)) if state is not None else None
            if silenced is not None:
                status, _ = self._server_request(name, "PUT", self._state_path(), body=silenced,
                                                 query={"fieldManager": FIELD_MANAGER}, force=True)  # fmt: skip
                if status != 200:
                    sim.recorder.problem(f"restore of {name}: removing the state object's note answered {status}")
            sim.note(f"restored {name} from the snapshot of {fault.at:.1f}s and tombstoned its lease")

        return restore

    async def _other_client(self, fault: Fault, rng: random.Random) -> Any:
        """Another client edits the Lease (or, for foreign writes, maybe the state object)
        again and again for the episode: one field of the evidence table, an annotation and
        a label, stripped managedFields, or a duration of 1 s."""
        from faults.schedule import FOREIGN_VALUES, LEASE_FIELDS, STATE_FIELDS, _ForeignPlan

        from coordinator.rules.resources import A_TOKEN_FLOOR

        sim = self.sim
        kind = fault.kind
        targets = self.majority(rng) if rng.random() < 0.5 else self.minority(rng)
        plan: _ForeignPlan | None = None
        if kind == "foreign-write":
            fields = [(False, f) for f in LEASE_FIELDS] + [(True, f) for f in (*STATE_FIELDS, *STATE_EVIDENCE)]
            if sim.opts.fields:
                fields = [(on, f) for on, f in fields if f in sim.opts.fields]
            on_state, name = rng.choice(fields)
            numeric = name in ("coordinator.io/fencing-token", "token-floor", "coordinator.io/max-ttl")
            values = ("zero", "lower", "same", "higher", "huge", "empty", "garbage") if numeric else FOREIGN_VALUES
            plan = _ForeignPlan(on_state, A_TOKEN_FLOOR if name == "token-floor" else name, rng.choice(values),
                                rng.random() < 0.5)  # fmt: skip
        sim.note(f"{fault.describe()}: on {targets}" + (f" ({plan.describe()})" if plan else ""))
        done = anyio.Event()
        serial = [0]

        def once() -> None:
            for c in targets:
                serial[0] += 1
                self._guarded(fault.describe(), lambda c=c: self._edit(c, kind, plan, rng, serial[0]))

        async def repeat() -> None:
            with anyio.move_on_after(fault.duration):
                while True:
                    once()
                    await anyio.sleep(rng.uniform(1.0, 3.0))
            done.set()

        once()
        assert sim.recorder is not None
        # The episode's own task repeats the edits; undoing waits for it to stop.
        tg_task = self._spawn(repeat)

        async def undo() -> None:
            tg_task.cancel()
            done.set()

        return undo

    def _spawn(self, body: Any) -> anyio.CancelScope:
        scope = anyio.CancelScope()

        async def wrapped() -> None:
            with scope:
                await body()

        assert self.sim.net.background is not None
        self.sim.net.background.start_soon(wrapped)
        return scope

    def _edit(self, cluster: str, kind: str, plan: Any, rng: random.Random, serial: int) -> None:
        path = self._state_path() if plan is not None and plan.on_state else self._lease_path()
        merge = "application/merge-patch+json"
        if kind == "strip-managed-fields":
            self._server_request(cluster, "PATCH", path, body={"metadata": {"managedFields": [{}]}}, ctype=merge,
                                 query={"fieldManager": OTHER_MANAGER})  # fmt: skip
            return
        if kind == "edit-lease-duration":
            self._server_request(cluster, "PATCH", path, body={"spec": {"leaseDurationSeconds": 1}}, ctype=merge,
                                 query={"fieldManager": OTHER_MANAGER})  # fmt: skip
            return
        if kind == "annotate-lease":
            body = {"metadata": {"annotations": {"sim.example/seen": str(serial)},
                                 "labels": {"sim.example/round": str(serial)}}}  # fmt: skip
            self._server_request(cluster, "PATCH", path, body=body, ctype=merge, query={"fieldManager": OTHER_MANAGER})
            return
        status, obj = self._server_request(cluster, "GET", path)
        if status != 200 or not isinstance(obj, dict):
            return
        where, key = ("spec", plan.field[5:]) if plan.field.startswith("spec.") else ("annotation", plan.field)
        found = ((obj.get("metadata") or {}).get("annotations") or {}) if where == "annotation" else obj.get("spec")
        current = (found or {}).get(key)
        value = plan.render(str(current) if current is not None else None, rng)
        if plan.field in STATE_EVIDENCE and current is not None and rng.random() < 0.7:
            value = str(current)  # the same text, now another client's
        if where == "annotation":
            patch: dict[str, Any] = {"metadata": {"annotations": {key: value}}}
        elif key == "leaseDurationSeconds":
            patch = {"spec": {key: int(value) if value.isdigit() and 0 < len(value) < 9 and int(value) > 0 else 1}}
        elif key == "renewTime":
            patch = {"spec": {key: "2026-12-01T00:00:00.000000Z"}}
        else:
            patch = {"spec": {key: value or None}}
        if not plan.force_apply:
            self._server_request(cluster, "PATCH", path, body=patch, ctype=merge, query={"fieldManager": "sim-update"})
            return
        lease = not plan.on_state
        manifest: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1" if lease else "v1",
            "kind": "Lease" if lease else "ConfigMap",
            "metadata": {"name": path.rsplit("/", 1)[1], **patch.get("metadata", {})},
        }
        if "spec" in patch:
            manifest["spec"] = {k: v for k, v in patch["spec"].items() if v is not None}
        self._server_request(cluster, "PATCH", path, body=manifest, ctype="application/apply-patch+yaml",
                             query={"fieldManager": "sim-force", "force": "true"})  # fmt: skip

    async def _break(self, fault: Fault) -> None:
        """An operator's `lock break --yes`; a break that succeeded ends the broken
        holder's section for the check, within the break's own window."""
        from coordinator.errors import CoordinatorError

        sim = self.sim
        invoked = now()
        try:
            async with sim.coordinator("operator") as c:
                with anyio.fail_after(30):
                    results = await c.break_lock(DEPLOYMENT, by="operator", reason="sim")
        except (CoordinatorError, TimeoutError) as err:
            sim.note(f"{fault.describe()}: break failed: {err}")
            return
        complete = now()
        sim.recorder.add_break(invoked, complete)
        sim.breaks.append(_break_record(invoked, complete, results))
        sim.faults[fault.kind] += 1
        sim.note(f"{fault.describe()}: broken")


def _break_record(invoked: float, complete: float, results: dict[str, Any]) -> dict[str, Any]:
    """What a `lock break` did, for the check that it sticks (sim/simulate.py,
    ``_broken_renewed``): its exit code as the command reports it (0 once a majority of the
    members answered that their lease is clear) and, per lock id it cleared, the members
    where its own write cleared it."""
    from coordinator.ops.verdicts import break_verdict

    problem = break_verdict(DEPLOYMENT, results).problem()
    cleared: dict[str, dict[str, str | None]] = {}
    for cluster, r in sorted(results.items()):
        lease = r.value if r.ok else None
        if lease is not None and lease.action == "broken" and lease.previous is not None and lease.previous.lock_id:
            cleared.setdefault(str(lease.previous.lock_id), {})[cluster] = lease_uid(lease.view)
    return {
        "invoked": invoked,
        "complete": complete,
        "exit": 0 if problem is None else int(problem.exit_code),
        "cleared": cleared,
    }
