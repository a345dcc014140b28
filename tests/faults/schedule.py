"""A seeded schedule of fault episodes, and how each kind is injected and undone.

Longer than the other modules (about 750 lines) on purpose: it is one class,
:class:`Faults`, because every episode draws from the one seeded random generator in
turn (the seed reproduces the schedule), counts into the one tally and acts through the
one rig and set of contender processes. Cut into modules, the kinds would share all of
that through a base class without any of them reading more easily. The ``# --``
comments mark the kinds' sections.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.rules.quorum import quorum_size
from faults.admission import add_policy, remove_policy
from faults.clock import boot_to_machine, machine_clock
from faults.contenders import DEPLOYMENT, STATE_KEY, tail
from faults.kinds import DELETION_FAULTS, FAULT_KINDS, MEMBER_FAULTS, OTHER_CLIENT_FAULTS
from faults.kubectl import kubectl
from faults.rig import Progress, Rig, TortureOptions, Workers
from faults.tree import TREE_SCRIPT, TREE_TICK_S, alive

if TYPE_CHECKING:
    from coordinator.rules.membership import Membership
    from coordinator_sandbox import Sandbox
    from faults.toxiproxy import Proxy


OTHER_MANAGER = "torture-other-client"

# The fields of the evidence table (docs/evidence.md) another client writes in the
# foreign-writes kind. A well-formed member set another client wrote stops every command
# (exit 5, documented), so member sets get only values no set parses from.
LEASE_FIELDS = (
    "coordinator.io/fencing-token",
    "coordinator.io/vanished",
    "coordinator.io/uid",
    "coordinator.io/last-break",
    "coordinator.io/next",
    "coordinator.io/max-ttl",
    "coordinator.io/membership",
    "coordinator.io/holder",
    "spec.holderIdentity",
    "spec.leaseDurationSeconds",
    "spec.renewTime",
)
STATE_FIELDS = ("token-floor", "coordinator.io/membership")
# Kinds of value: numbers around what the field holds, zero, huge, nothing, text no rule
# can read, JSON of the shapes the rules parse, another lock's id.
FOREIGN_VALUES = ("zero", "lower", "same", "higher", "huge", "empty", "garbage", "break-note", "claim", "date", "lock")


@dataclass
class _ForeignPlan:
    on_state: bool
    field: str
    value: str
    force_apply: bool

    def describe(self) -> str:
        how = "server-side apply --force-conflicts" if self.force_apply else "update"
        return f"{'state object' if self.on_state else 'Lease'} {self.field} := {self.value}, by {how}"

    def render(self, current: str | None, rng: random.Random) -> str:
        number = int(current) if current is not None and current.isdigit() and len(current) < 18 else 0
        text = {
            "zero": "0",
            "lower": str(max(0, number - 1)),
            "same": str(number),
            "higher": str(number + 1000),
            "huge": "9" * 30,
            "empty": "",
            "garbage": rng.choice(["x", "-1", "1e3", "{", "\u0000"]),
            "break-note": '{"by":"torture","previous_lock_id":"' + (current or "").rsplit("/", 1)[-1] + '"}',
            "claim": '{"lock":"0000000000000000","holder":"torture","since":0}',
            "date": "2026-12-01T00:00:00Z",
            "lock": f"torture/{rng.getrandbits(64):016x}",
        }[self.value]
        if self.field == "coordinator.io/membership" and text.startswith("{"):
            return "x"
        return text


# Kinds that act on a holder inside its section (or on the Lease or objects it is using),
# or that take the lock themselves: injected while the lock is blocked they wait for a
# holder (up to 10-40 s) or find none. See Faults._pick.
LIVE_LOCK_KINDS = frozenset(
    {"lose-responses", "sigkill-holder", "sigstop-holder", "break-holder", "sigkill-lock-run"}
    | set(OTHER_CLIENT_FAULTS)
    | set(DELETION_FAULTS)
    | set(MEMBER_FAULTS)
)
# The lock counts as blocked when nobody entered it for this long.
LIVE_LOCK_S = 3.0


@dataclass
class _Held:
    """What the members hold now, for the deletion gate: the member set this machine's
    record names (``local``, its ``groups`` and member ``names``), and each member's Lease
    and state object (None where absent; a member that could not be read is left out)."""

    local: Membership
    groups: list[list[str]]
    names: list[str]
    objects: dict[int, tuple[dict[str, Any] | None, dict[str, Any] | None]]

    def has_what_goes(self, kind: str, index: int) -> bool:
        """Whether member ``index`` has the object ``kind`` deletes; a namespace it always has."""
        if kind == "recreate-namespace":
            return True
        lease, state = self.objects.get(index, (None, None))
        return (lease if kind == "delete-lease-one" else state) is not None


class NoMinority(Exception):
    """The members of the moment have no minority (two of them)."""


class Faults:
    """A seeded schedule of fault episodes; every episode undoes itself."""

    def __init__(self, rig: Rig, workers: Workers, rng: random.Random, say: Progress, opts: TortureOptions) -> None:
        self.rig = rig
        self.workers = workers
        self.rng = rng
        self.say = say
        self.gap = opts.fault_gap
        self.length = opts.fault_length
        self.kinds = tuple(opts.kinds) if opts.kinds else FAULT_KINDS
        self.min_each = opts.min_each
        self.long_stop = opts.long_stop
        self.collectors: list[threading.Thread] = []
        self.count: Counter[str] = Counter()
        self.serial = 0
        self._foreign_fields: list[tuple[bool, str]] = []  # the fields foreign-writes has yet to write
        self.episode_ended = 0.0  # when the last episode ended (machine clock)

    @property
    def sandbox(self) -> Sandbox:
        assert self.rig.sandbox is not None
        return self.rig.sandbox

    @property
    def n(self) -> int:
        """Members now (the membership faults change who, not how many, between episodes)."""
        return len(self.rig.members)

    @property
    def q(self) -> int:
        return quorum_size(self.n)

    def _clusters(self, k: int) -> list[int]:
        """``k`` of the current members, as cluster indices."""
        return sorted(self.rng.sample(self.rig.members, k))

    @property
    def has_minority(self) -> bool:
        return self.n - self.q >= 1

    def _minority(self) -> list[int]:
        if not self.has_minority:
            # Two members (a remove-member episode cut short by the end of the workload,
            # before its add): no minority to act on.
            raise NoMinority(f"{self.n} members have no minority")
        return self._clusters(self.rng.randint(1, self.n - self.q))

    def _majority(self) -> list[int]:
        return self._clusters(self.rng.randint(self.q, self.n))

    def _sleep(self, seconds: float) -> None:
        until = machine_clock() + seconds
        while True:
            left = until - machine_clock()
            if left <= 0:
                return
            time.sleep(min(left, 0.5))
            self.workers.check(replace=True)

    def short(self) -> list[str]:
        """Kinds injected fewer than ``min_each`` times so far."""
        return [k for k in self.kinds if self.count[k] < self.min_each]

    def run(self, end: float, overtime: float) -> None:
        """Episodes in shuffled rounds (every kind once per round) until ``end``; then
        on, up to ``overtime`` more seconds, until every kind ran ``min_each`` times
        (an episode that found nobody to act on does not count: it is tried again later
        in its round, once). While the lock is blocked (a tombstone, a dead holder's
        lease), kinds that act on a holder or need the lock wait their turn and the next
        kind of the round that needs neither goes first (:meth:`_pick`)."""
        bag: list[str] = []
        retried: Counter[str] = Counter()
        hard_end = end + overtime
        while True:
            now = machine_clock()
            if now >= hard_end or (now >= end and not self.short()):
                return
            if not bag:
                bag = list(self.kinds) if now < end else self.short()
                self.rng.shuffle(bag)
                retried.clear()
            kind = self._pick(bag)
            limit = end if now < end else hard_end
            room = max(1.0, limit - machine_clock())
            before = self.count[kind]
            try:
                self.episode(kind, room)
            except NoMinority as why:
                self.say(f"fault: {kind} skipped: {why}")
            self.episode_ended = machine_clock()
            if self.count[kind] == before and retried[kind] < 1 and kind in LIVE_LOCK_KINDS:
                retried[kind] += 1
                bag.insert(0, kind)
            self.workers.check(replace=True)
            self._sleep(min(self.rng.uniform(*self.gap), max(0.0, limit - machine_clock())))

    def _pick(self, bag: list[str]) -> str:
        """The next kind of the round. While nobody entered the lock for a while, the
        last kind in the bag that acts on no holder and takes no lock goes first (the
        schedule would otherwise sit waiting for a holder while the lock is blocked);
        once none is left, the next kind anyway (its episode waits as it always did).
        Only a section begun since the last episode ended counts: one begun before a
        holder (or `lock run`) was killed says nothing about the lock now."""
        recorder = self.workers.recorder
        if not recorder.entered_within(LIVE_LOCK_S, since=self.episode_ended) and not recorder.trees_running():
            for j in range(len(bag) - 1, -1, -1):
                if bag[j] not in LIVE_LOCK_KINDS:
                    return bag.pop(j)
        return bag.pop()

    def episode(self, kind: str, room: float) -> None:
        d = min(room, self.rng.uniform(*self.length))
        if kind in ("pause-minority", "pause-majority"):
            targets = self._minority() if kind == "pause-minority" else self._majority()
            self.say(f"fault: pause API servers {targets} for {d:.1f}s")
            self.count[kind] += 1
            paused: list[int] = []
            try:
                for i in targets:
                    self.sandbox.pause(i)
                    paused.append(i)
                self._sleep(d)
            finally:
                for i in paused:
                    self.sandbox.resume(i)
        elif kind == "kill-apiserver":
            targets = self._minority()
            self.say(f"fault: kill API servers {targets}, start them again after {d:.1f}s")
            self.count[kind] += 1
            try:
                for i in targets:
                    self.sandbox.kill(i)
                self._sleep(d)
            finally:
                for i in targets:
                    self.sandbox.start(i)
        elif kind == "latency":
            targets = self._clusters(self.rng.randint(1, self.n))
            ms = self.rng.randint(150, 1200)
            d = min(room, 2 * self.rng.uniform(*self.length))
            self.say(f"fault: {ms} ms latency to {targets} for {d:.1f}s")
            self.count[kind] += 1
            self._with_toxic(targets, d, lambda p: p.add_latency(ms, jitter_ms=ms // 4, name="torture-latency"))
        elif kind in ("cut-minority", "cut-majority"):
            targets = self._minority() if kind == "cut-minority" else self._majority()
            self.say(f"fault: cut connections to {targets} for {d:.1f}s")
            self.count[kind] += 1
            proxies = [self.rig.proxies[i - 1] for i in targets]
            try:
                for p in proxies:
                    p.disable()
                self._sleep(d)
            finally:
                for p in proxies:
                    p.enable()
        elif kind == "lose-responses":
            # Requests arrive and are applied; the answers never come back. Started while
            # someone is inside, so that a write's outcome is likely to be unknown.
            self.workers.holder_inside(self.rng, within=min(room, 8.0))
            targets = self._minority() if self.rng.random() < 0.5 and self.has_minority else self._majority()
            self.say(f"fault: answers from {targets} are lost for {d:.1f}s")
            self.count[kind] += 1
            self._with_toxic(targets, d, lambda p: p.add_timeout(0, stream="downstream", name="torture-lose"))
        elif kind == "drop-requests":
            targets = self._minority() if self.rng.random() < 0.5 and self.has_minority else self._majority()
            self.say(f"fault: requests to {targets} are dropped (connection closed after 1s) for {d:.1f}s")
            self.count[kind] += 1
            self._with_toxic(targets, d, lambda p: p.add_timeout(1000, stream="upstream", name="torture-drop"))
        elif kind == "sigkill-holder":
            worker = self.workers.holder_inside(self.rng, within=min(room, 15.0))
            if worker is None:
                self.say("fault: no holder inside its critical section to SIGKILL")
                return
            self.say(f"fault: SIGKILL {worker.instance} inside its critical section")
            self.count[kind] += 1
            self.workers.kill(worker)
            self.workers.replace(worker)
        elif kind == "sigstop-holder":
            worker = self.workers.holder_inside(self.rng, within=min(room, 15.0))
            if worker is None:
                self.say("fault: no holder inside its critical section to SIGSTOP")
                return
            # Short: it wakes up still valid. Long: its leases expire meanwhile and others
            # take over; it must notice before acting, and fencing must refuse its writes.
            d = self.rng.uniform(0.5, 2.5) if self.rng.random() < 0.4 else worker.spec.ttl + 3.0
            if d > self.long_stop:
                d = self.rng.uniform(0.5, 2.5)
            self.say(f"fault: SIGSTOP {worker.instance} inside its critical section for {d:.1f}s")
            self.count[kind] += 1
            self.workers.pause(worker)
            try:
                self._sleep(d)
            finally:
                self.workers.resume(worker)
        elif kind in OTHER_CLIENT_FAULTS or kind == "foreign-token":
            self._other_client(kind, d, room)
        elif kind in DELETION_FAULTS:
            self._delete(kind, room)
        elif kind in ("reject-writes-minority", "reject-writes-majority"):
            self._reject_writes(kind, d)
        elif kind == "break-holder":
            self._break_holder(room)
        elif kind == "sigkill-lock-run":
            self._sigkill_lock_run(room)
        elif kind in MEMBER_FAULTS:
            self._change_members(kind, room)
        elif kind == "split-write":
            self._split_write()
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    # -- other clients of the Lease ------------------------------------------------

    def _kubectl(self, index: int, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """The real kubectl, straight to the API server (not through the proxy)."""
        return kubectl(
            self.sandbox.kubeconfig, index, self.rig.namespace, "--request-timeout=10s", *args, stdin=stdin, timeout=60
        )

    def _lease(self) -> str:
        from coordinator.rules.resources import lease_name

        return lease_name(DEPLOYMENT)

    def _held(self, within: float) -> bool:
        """Wait up to ``within`` for someone to hold the lock (inside its section)."""
        until = machine_clock() + within
        while machine_clock() < until:
            if self.workers.recorder.holders_inside() or self.workers.recorder.trees_running():
                return True
            time.sleep(0.05)
        return False

    def _other_client(self, kind: str, d: float, room: float) -> None:
        """Another client edits the Lease of a live holder, again and again for ``d``
        seconds: annotations and labels under its own field manager, a server-side apply
        of a label, managedFields stripped, or leaseDurationSeconds cut to 1 s."""
        if shutil.which("kubectl") is None:
            self.say(f"fault: {kind} needs kubectl, which is not installed")
            return
        self._held(min(room, 10.0))
        majority = ("strip-managed-fields", "edit-lease-duration", "foreign-writes", "foreign-token")
        targets = self._majority() if kind in majority else self._minority()
        if self.rng.random() < 0.5:
            targets = self._clusters(self.rng.randint(1, self.n))
        lease = self._lease()
        plan = self._foreign_plan(kind) if kind in ("foreign-writes", "foreign-token") else None
        what = f" ({plan.describe()})" if plan is not None else ""
        self.say(f"fault: {kind} on the Lease of {targets} for {d:.1f}s{what}")
        self.count[kind] += 1
        until = machine_clock() + d
        problems: list[str] = []
        while True:
            for i in targets:
                self.serial += 1
                n = str(self.serial)
                if kind == "annotate-lease":
                    runs = [
                        self._kubectl(i, "annotate", "lease", lease, f"torture.example/seen={n}", "--overwrite",
                                      f"--field-manager={OTHER_MANAGER}"),
                        self._kubectl(i, "label", "lease", lease, f"torture.example/round={n}", "--overwrite",
                                      f"--field-manager={OTHER_MANAGER}"),
                    ]  # fmt: skip
                elif kind == "apply-lease":
                    manifest = json.dumps(
                        {
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {"name": lease, "labels": {"torture.example/applied": n}},
                        }
                    )
                    runs = [self._kubectl(i, "apply", "--server-side", "--field-manager=torture-apply", "-f", "-",
                                          stdin=manifest)]  # fmt: skip
                elif plan is not None:
                    runs = [self._foreign_write(i, lease, plan)]
                elif kind == "strip-managed-fields":
                    runs = [self._kubectl(i, "patch", "lease", lease, "--type=merge",
                                          "-p", '{"metadata":{"managedFields":[{}]}}',
                                          f"--field-manager={OTHER_MANAGER}")]  # fmt: skip
                else:
                    runs = [self._kubectl(i, "patch", "lease", lease, "--type=merge",
                                          "-p", '{"spec":{"leaseDurationSeconds":1}}',
                                          f"--field-manager={OTHER_MANAGER}")]  # fmt: skip
                # A missing Lease (deleted, or a namespace being recreated) is not a problem here.
                problems += [tail(r.stderr, 2) for r in runs if r.returncode != 0 and "NotFound" not in r.stderr]
            if machine_clock() >= until:
                break
            self._sleep(min(0.5, max(0.0, until - machine_clock())))
        if problems:
            self.say(f"fault: {kind}: kubectl failed {len(problems)} times, e.g. {problems[0]}")

    def _foreign_plan(self, kind: str) -> _ForeignPlan:
        """One episode of foreign writes: one field of the evidence table (docs/evidence.md),
        one kind of value, one way of writing, on every target alike, so that a majority
        of members sees the same edit. The fields come round in a shuffled cycle, so that
        each is written within every 13 episodes."""
        from coordinator.rules.resources import A_TOKEN_FLOOR

        if kind == "foreign-token":
            return _ForeignPlan(False, "coordinator.io/fencing-token", self.rng.choice(("zero", "lower")), False)
        if not self._foreign_fields:
            self._foreign_fields = [(False, f) for f in LEASE_FIELDS] + [(True, f) for f in STATE_FIELDS]
            self.rng.shuffle(self._foreign_fields)
        on_state, field = self._foreign_fields.pop()
        numeric = field in ("coordinator.io/fencing-token", "token-floor", "coordinator.io/max-ttl")
        values = ("zero", "lower", "same", "higher", "huge", "empty", "garbage") if numeric else FOREIGN_VALUES
        return _ForeignPlan(
            on_state=on_state,
            field=A_TOKEN_FLOOR if field == "token-floor" else field,
            value=self.rng.choice(values),
            force_apply=self.rng.random() < 0.5,
        )

    def _foreign_write(self, index: int, lease: str, plan: _ForeignPlan | None) -> subprocess.CompletedProcess[str]:
        """One write of another field manager, as ``plan`` says, on member ``index``: a
        plain update (kubectl patch) or a server-side apply that forces the field over."""
        from coordinator.rules.resources import state_name

        assert plan is not None
        kind, name = ("configmap", state_name(DEPLOYMENT)) if plan.on_state else ("lease", lease)
        obj = self.sandbox.admin(index).get(self._state_path() if plan.on_state else self._lease_path()) or {}
        where, key = ("spec", plan.field[5:]) if plan.field.startswith("spec.") else ("annotation", plan.field)
        found = ((obj.get("metadata") or {}).get("annotations") or {}) if where == "annotation" else obj.get("spec")
        current = (found or {}).get(key)
        value = plan.render(str(current) if current is not None else None, self.rng)
        if where == "annotation":
            patch: dict[str, Any] = {"metadata": {"annotations": {key: value}}}
        elif key == "leaseDurationSeconds":
            patch = {"spec": {key: int(value) if value.isdigit() and 0 < len(value) < 9 and int(value) > 0 else 1}}
        elif key == "renewTime":
            patch = {"spec": {key: "2026-12-01T00:00:00.000000Z"}}
        else:
            patch = {"spec": {key: value or None}}
        if not plan.force_apply:
            return self._kubectl(index, "patch", kind, name, "--type=merge", "-p", json.dumps(patch),
                                 "--field-manager=torture-update")  # fmt: skip
        api = "coordination.k8s.io/v1" if kind == "lease" else "v1"
        manifest: dict[str, Any] = {"apiVersion": api, "kind": "Lease" if kind == "lease" else "ConfigMap",
                                    "metadata": {"name": name, **patch.get("metadata", {})}}  # fmt: skip
        if "spec" in patch:
            manifest["spec"] = {k: v for k, v in patch["spec"].items() if v is not None}
        return self._kubectl(index, "apply", "--server-side", "--force-conflicts", "--field-manager=torture-force",
                             "-f", "-", stdin=json.dumps(manifest))  # fmt: skip

    # -- deletions -------------------------------------------------------------------

    def _delete(self, kind: str, room: float) -> None:
        self._held(min(room, 10.0))
        ns = self.rig.namespace
        if kind == "delete-lease-all":
            targets = list(self.rig.members)
        else:
            targets = self._clusters(1)
        held = self._held_now()
        lost = self._records_lost(held, kind, targets)
        if lost is not None:
            # Outside the fault model: the documented price (docs/design.md) for a majority whose leases and
            # state objects were all wiped (at once or one after the other) is exit 5 for
            # good, so the schedule never takes the member set's last records from a
            # majority; it tries another member (one that has what goes: a deletion must
            # delete something), or the kind again later.
            others = [i for i in self.rig.members if i not in targets] if kind != "delete-lease-all" else []
            self.rng.shuffle(others)
            for other in others:
                if held.has_what_goes(kind, other) and self._records_lost(held, kind, [other]) is None:
                    self.say(f"fault: {kind} on [{other}] instead of {targets}: there {lost}")
                    targets = [other]
                    break
            else:
                self.say(f"fault: {kind} on {targets} skipped: {lost}")
                return
        if kind in ("delete-lease-one", "delete-lease-all"):
            self.say(f"fault: delete the Lease on {targets}")
            self.count[kind] += 1
            for i in targets:
                self.sandbox.admin(i).delete(self._lease_path())
        elif kind == "delete-state-one":
            self.say(f"fault: delete the state object on {targets}")
            self.count[kind] += 1
            for i in targets:
                self.sandbox.admin(i).delete(self._state_path())
        else:
            (i,) = targets
            self.say(f"fault: delete namespace {ns} on cluster {i} and create it again, empty")
            self.count[kind] += 1
            self._recreate_namespace(i)

    def _lease_path(self) -> str:
        from coordinator.rules.resources import lease_path

        return lease_path(self.rig.namespace, self._lease())

    def _state_path(self) -> str:
        from coordinator.rules.resources import state_paths

        return state_paths(self.rig.namespace, DEPLOYMENT, "configmap")[1]

    def _held_now(self) -> _Held:
        """The record's member set, and every member's Lease and state object, read now."""
        from coordinator.config.store import ConfigStore
        from coordinator.rules.membership import Membership
        from coordinator_sandbox.adminclient import AdminRequestError

        cfg = ConfigStore(self.rig.config).load()
        rec = cfg.deployments[DEPLOYMENT]

        def identity(name: str) -> str:
            return cfg.clusters[name].identity

        joint = list(rec.joint) if rec.joint is not None else None
        local = Membership.of(
            (identity(m) for m in rec.clusters), rec.epoch, [identity(m) for m in joint or []] or None
        )
        groups = [list(rec.clusters), *([joint] if joint else [])]
        names = sorted({m for g in groups for m in g})
        objects = {}
        for name in names:
            i = int(name[1:])
            try:
                admin = self.sandbox.admin(i, timeout=2.0)
                objects[i] = (admin.get(self._lease_path()), admin.get(self._state_path()))
            except (AdminRequestError, OSError):  # paused or killed by another episode
                continue
        return _Held(local, groups, names, objects)

    @staticmethod
    def _records_lost(held: _Held, kind: str, targets: list[int]) -> str | None:
        """Why deleting what ``kind`` deletes on ``targets`` would leave the members
        unable to confirm the member set, or None when they still could. Judged as the
        product judges it (coordinator/rules/membership.py ``check``, with a state object's set
        speaking where the lease says nothing, as an acquisition and a state read count
        it), against the record in the local config the changes are made with, on what
        the members hold (``held``) minus what the deletion removes. A member that could
        not be read counts as confirming nothing."""
        from coordinator.engine.lock.floor import kept_set_speaks, set_on_state
        from coordinator.rules.lease import LeaseView
        from coordinator.rules.membership import Stored, check, says_nothing, stored_in_lease

        stored: dict[str, Stored] = {}
        for name in held.names:
            i = int(name[1:])
            if i not in held.objects:
                continue
            lease, state = held.objects[i]
            deleted = i in targets
            if deleted and kind in ("delete-lease-one", "delete-lease-all", "recreate-namespace"):
                lease = None
            if deleted and kind in ("delete-state-one", "recreate-namespace"):
                state = None
            found = stored_in_lease(LeaseView.parse(lease)) if lease is not None else None
            if says_nothing(found, held.local) and state is not None:
                speaks = kept_set_speaks(found, set_on_state(state), held.local)
                if speaks is not None:
                    found = speaks
            stored[name] = found
        verdict = check(held.local, stored, held.names, held.groups)
        if verdict.ok:
            return None
        return (
            f"the members would then not confirm the member set ({verdict.verdict}: "
            f"{', '.join(verdict.agreeing) or 'none'} agreeing)"
        )

    def _recreate_namespace(self, index: int) -> None:
        """Delete the namespace and create it again, empty. The sandbox runs no
        controller-manager, so nothing would empty and finalize a deleted namespace:
        do its work here. Deleting first makes the namespace Terminating, which turns
        away creations in it; then its objects go, then the finalizer, then it is gone."""
        from coordinator.rules.resources import configmaps_path, leases_path, namespace_path, secrets_path

        admin = self.sandbox.admin(index, timeout=15)
        ns = self.rig.namespace
        admin.delete(namespace_path(ns))
        for collection in (
            leases_path(ns),
            configmaps_path(ns),
            secrets_path(ns),
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        ):
            reply = admin.request("DELETE", collection)
            if reply.status not in (200, 404):
                self.workers.recorder.problem(f"recreate-namespace: DELETE {collection} answered {reply.status}")
        obj = admin.get(namespace_path(ns))
        if obj is not None:
            obj.setdefault("spec", {})["finalizers"] = []
            reply = admin.request("PUT", f"{namespace_path(ns)}/finalize", obj)
            if reply.status != 200:
                self.workers.recorder.problem(f"recreate-namespace: finalize answered {reply.status}")
        until = machine_clock() + 30
        while admin.get(namespace_path(ns)) is not None and machine_clock() < until:
            time.sleep(0.1)
        admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # -- admission -------------------------------------------------------------------

    def _reject_writes(self, kind: str, d: float) -> None:
        """A ValidatingAdmissionPolicy turns away every CREATE and UPDATE of the state
        object (and of a probe, to see when it is in force) on a minority or a majority,
        as a policy engine, a quota or a webhook outage would; then it is removed."""
        from coordinator.rules.resources import state_name

        targets = self._minority() if kind == "reject-writes-minority" else self._majority()
        # All writes, or only those that change the data (the rest of a write, e.g. a
        # promise in the metadata, goes through): partial writes either way.
        data_only = self.rng.random() < 0.5
        what = "data changes of the state" if data_only else "state writes"
        self.say(f"fault: an admission policy rejects {what} on {targets} for {d:.1f}s")
        self.count[kind] += 1
        added: list[int] = []
        try:
            for i in targets:
                self._policy(i, state_name(DEPLOYMENT), create=True, data_only=data_only)
                added.append(i)
            for i in added:
                self._probe(i, rejected=True)
            self._sleep(d)
        finally:
            for i in added:
                self._policy(i, state_name(DEPLOYMENT), create=False)
            for i in added:
                self._probe(i, rejected=False)
        rest = [i for i in self.rig.members if i not in targets]
        if kind == "reject-writes-majority" and rest:
            # The members that took the rejected writes now miss the next ones: their
            # replicas differ from the majority's, which reads must never return.
            self.say(f"fault: then pause API servers {rest} for {d:.1f}s")
            paused: list[int] = []
            try:
                for i in rest:
                    self.sandbox.pause(i)
                    paused.append(i)
                self._sleep(d)
            finally:
                for i in paused:
                    self.sandbox.resume(i)

    def _policy_name(self) -> str:
        return f"{self.rig.namespace}-reject-state"

    def _policy(self, index: int, target: str, *, create: bool, data_only: bool = False) -> None:
        admin = self.sandbox.admin(index, timeout=15)
        name = self._policy_name()
        if not create:
            remove_policy(admin, name)
            return
        ns = self.rig.namespace
        allowed = f"object.metadata.namespace != '{ns}' || !(object.metadata.name in ['{target}', '{name}'])"
        if data_only:
            allowed += (
                " || (oldObject != null && (has(object.data) ? (has(oldObject.data) && object.data == oldObject.data)"
                " : !has(oldObject.data)))"
            )
        add_policy(admin, name, allowed, "state writes rejected by the fault suite")

    def _probe(self, index: int, *, rejected: bool) -> None:
        """Policies take effect a moment after they change: write a probe ConfigMap
        (which the policy also rejects) until the answer says it is (no longer) in force."""
        from coordinator.rules.resources import configmaps_path

        admin = self.sandbox.admin(index, timeout=15)
        name = self._policy_name()
        path = f"{configmaps_path(self.rig.namespace)}/{name}"
        until = machine_clock() + 20
        status = 0
        while machine_clock() < until:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name},
                "data": {"n": str(time.time())},
            }
            reply = admin.request("PUT", path, body)
            if reply.status == 404:
                reply = admin.request("POST", configmaps_path(self.rig.namespace), body)
            status = reply.status
            if (status >= 400) == rejected and status not in (404, 409):
                return
            time.sleep(0.2)
        self.say(f"fault: the admission policy on cluster {index} did not {'take' if rejected else 'stop taking'} "
                 f"effect within 20 s (last answer {status})")  # fmt: skip

    # -- a targeted schedule -----------------------------------------------------------

    def _split_write(self) -> None:
        """One holder (the harness, on the lock like anyone) writes twice under one token:
        first while an admission policy rejects state writes on member A and member B is
        paused, so the write can land on the third, C, alone (its outcome failed or
        unknown); then, C paused first, A and B back, a write that succeeds on A and B.
        C comes back, and the holder reads with A paused, then with B paused: each read
        sees C's replica next to one holding the confirmed write. C is the middle member
        by name, so whichever way a tie between equal stamps were broken by name, one of
        the reads meets it. Every step is recorded like a contender's."""
        import anyio

        from coordinator.errors import CoordinatorError, LockHeldError, NoQuorumError, StateConflictError
        from coordinator.ops.api import Coordinator
        from coordinator.rules.resources import state_name

        if self.n != 3:
            self.say("fault: split-write needs exactly 3 members")
            return
        a, c, b = self.rig.members
        if self.rng.random() < 0.5:
            a, b = b, a
        self.serial += 1
        instance = f"split{self.serial}"
        recorder = self.workers.recorder
        recorder.handle(instance, {"ev": "start", "mode": "api"})
        self.count["split-write"] += 1
        self.say(f"fault: split-write: reject state writes on c{a}, pause c{b}, write; then pause c{c}, write")
        ops = 0

        def record(event: str, **fields: Any) -> None:
            recorder.handle(instance, {"ev": event, **fields})

        async def write(state: Any, held: Any, value: str) -> None:
            nonlocal ops
            ops += 1
            op = f"{instance}:{ops}"
            record("invoke", op=op, kind="write", value=value, t=machine_clock())
            status = "unknown"
            try:
                with anyio.fail_after(60):
                    await state.set({STATE_KEY: value}, lock=held)
                status = "ok"
            except NoQuorumError:
                status = "unknown"
            except (StateConflictError, LockHeldError):
                status = "fail"
            except (CoordinatorError, TimeoutError) as err:
                self.say(f"fault: split-write: the write of {value} raised {type(err).__name__}")
            record("complete", op=op, status=status, t=machine_clock())
            self.say(f"fault: split-write: write {value}: {status}")

        async def read(state: Any) -> None:
            nonlocal ops
            ops += 1
            op = f"{instance}:{ops}"
            record("invoke", op=op, kind="read", value=None, t=machine_clock())
            try:
                with anyio.fail_after(60):
                    data = await state.get()
            except (CoordinatorError, TimeoutError):
                record("complete", op=op, status="fail", t=machine_clock())
                return
            value = data.get(STATE_KEY) if isinstance(data, dict) else None
            record("complete", op=op, status="ok", value=value, t=machine_clock())
            self.say(f"fault: split-write: read {STATE_KEY}={value!r}")

        def blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

        async def scenario() -> None:
            async with Coordinator.from_config(str(self.rig.config), timeout=2.0) as coord:
                state = coord.state(DEPLOYMENT)
                async with coord.lock(DEPLOYMENT, ttl=self.rig.max_ttl, wait=60, holder=instance) as held:
                    until = boot_to_machine(held.result.valid_until())
                    record("enter", t=machine_clock(), token=held.fencing_token, valid_until=until)
                    try:
                        await blocking(self._policy, a, state_name(DEPLOYMENT), create=True)
                        await blocking(self._probe, a, rejected=True)
                        await blocking(self.sandbox.pause, b)
                        try:
                            await write(state, held, f"{instance}x")
                        finally:
                            # C goes quiet before A and B are back, so that no reader
                            # copies what C took onto them in between.
                            await blocking(self.sandbox.pause, c)
                            await blocking(self._policy, a, state_name(DEPLOYMENT), create=False)
                            await blocking(self.sandbox.resume, b)
                        try:
                            await blocking(self._probe, a, rejected=False)
                            await write(state, held, f"{instance}y")
                        finally:
                            await blocking(self.sandbox.resume, c)
                        for quiet in (a, b):
                            await blocking(self.sandbox.pause, quiet)
                            try:
                                await read(state)
                            finally:
                                await blocking(self.sandbox.resume, quiet)
                    finally:
                        left = machine_clock()
                        until = boot_to_machine(held.result.valid_until())
                        record("exit", t=min(left, until), overstay=left > until)

        try:
            anyio.run(scenario)
        except CoordinatorError as err:
            self.say(f"fault: split-write: {type(err).__name__}: {err.message[:300]}")
        finally:
            recorder.gone(instance, machine_clock(), "vanished")

    # -- membership ------------------------------------------------------------------

    def _change_members(self, kind: str, room: float) -> None:
        """The operator changes the member set while the contenders run, with the CLI
        (``deployment add-cluster/remove-cluster/replace-cluster --wait``, which takes
        the lock like any contender), and brings it back to its size: add a spare, then
        remove a member; remove a member, then add a spare; replace a member by a spare.
        A removed member becomes a spare (its old Lease and state stay, an older set of
        ours, which a later add takes over). The checks judge the histories as always."""
        spares = [i for i in range(1, self.rig.n + self.rig.spares + 1) if i not in self.rig.members]
        if not spares:
            self.say(f"fault: {kind} needs a spare cluster, and there is none (--spares)")
            return
        spare = self.rng.choice(spares)
        member = self.rng.choice(self.rig.members)
        self.count[kind] += 1
        if kind == "add-member":
            self._member_command("add-cluster", f"c{spare}", room=room)
            left = [i for i in self.rig.members if i != spare]
            if spare in self.rig.members and left:
                self._member_command("remove-cluster", f"c{self.rng.choice(left)}", room=room)
        elif kind == "remove-member":
            self._member_command("remove-cluster", f"c{member}", room=room)
            if member not in self.rig.members:
                self._member_command("add-cluster", f"c{spare}", room=room)
        else:
            self._member_command("replace-cluster", f"c{member}", f"c{spare}", room=room)

    def _member_command(self, verb: str, *clusters: str, room: float) -> None:
        """Run one change to its end: again when it could not finish (the lock stayed
        held, or no quorum; a change in progress is finished by running it again)."""
        home = self.rig.workdir / "operator"
        home.mkdir(parents=True, exist_ok=True)
        env = self.workers._environ("operator", self.workers.config_for(home))
        from coordinator.rules.lease import DEFAULT_MAX_SERVER_SKEW_S, lapse_margin

        # What may block the lock when a change starts, and lapses only once this very
        # process has watched it unchanged for a maximum TTL plus margin (every run counts
        # afresh): a stripped or duration-edited Lease, a Lease deleted with its namespace.
        # A quick run saw 22.7 s of such blocking for a 17 s lapse; one wait covers two.
        # With one lapse plus 10 s per run, and the contenders let go between runs, CI's
        # loaded machine ran out of a change's two runs (the seed 20261130 quick run).
        blocked = self.rig.max_ttl + lapse_margin(self.rig.max_ttl, DEFAULT_MAX_SERVER_SKEW_S)
        wait = max(2.0 * blocked + 10.0, min(room, 60.0))
        runs = 3
        give_up = machine_clock() + max(runs * wait, min(room, 120.0))
        attempt = 0
        answers: list[str] = []
        # Contenders already waiting for the lock wait on (and follow the change); new
        # attempts hold off, or the change could wait behind them for minutes. Held off
        # until the change is over, not only while one run of it goes: between two runs
        # a fresh contender would take the lock the change had waited for.
        self.workers.hold_off_file.touch()
        try:
            while True:
                attempt += 1
                before = list(self.rig.members)
                self.say(
                    f"fault: deployment {verb} {' '.join(clusters)} (members {self._names(before)}), attempt {attempt}"
                )
                invoked = machine_clock()
                proc = subprocess.run(
                    [sys.executable, "-m", "coordinator", "deployment", verb, DEPLOYMENT, *clusters,
                     "--wait", f"{wait:g}s", "--ttl", f"{self.rig.max_ttl:g}s", "--holder", "member-change"],
                    capture_output=True, text=True, env=env, cwd=home, stdin=subprocess.DEVNULL, timeout=wait + 300,
                )  # fmt: skip
                took = machine_clock() - invoked
                members, joint = self.rig.read_members()
                self.rig.members = members
                with (self.rig.workdir / "logs" / "member-changes.log").open("a") as log:
                    log.write(f"$ deployment {verb} {' '.join(clusters)}: exit {proc.returncode} after {took:.1f}s\n")
                    log.write(proc.stdout + proc.stderr + "\n")
                why = f" ({tail(proc.stderr, 2)})" if proc.returncode != 0 else ""
                answers.append(f"run {attempt}: exit {proc.returncode} after {took:.0f}s{why}")
                progress = f", change to {self._names(joint)} in progress" if joint else ""
                self.say(
                    f"fault: `deployment {verb}` exit {proc.returncode}{why} after {took:.1f}s; "
                    f"members {self._names(members)}{progress}"
                )
                if proc.returncode == 0 and joint is None:
                    return
                if proc.returncode not in (0, 3, 4):
                    shown = f"deployment {verb} {' '.join(clusters)}"
                    self.workers.recorder.problem(f"operator: `{shown}` exit {proc.returncode}: {tail(proc.stderr)}")
                    return
                if attempt >= runs and machine_clock() >= give_up:
                    break
                self._sleep(self.rng.uniform(0.5, 2.0))
        finally:
            self.workers.hold_off_file.unlink(missing_ok=True)
        self.workers.recorder.problem(
            f"operator: `deployment {verb} {' '.join(clusters)}` did not finish in {attempt} runs of up to "
            f"{wait:g}s each ({'; '.join(answers)}; see {self.rig.workdir / 'logs' / 'member-changes.log'})"
        )

    @staticmethod
    def _names(indices: Sequence[int] | None) -> str:
        return ", ".join(f"c{i}" for i in indices or ())

    # -- the operator and `lock run` ---------------------------------------------------

    def _break_holder(self, room: float) -> None:
        """An operator breaks the lock of a live holder (``lock break --yes``). From then
        on the holder no longer holds it: its section ends there for the check
        (checkers.apply_breaks), and fencing must refuse whatever it writes later."""
        if not self._held(min(room, 15.0)):
            self.say("fault: nobody holds the lock to break")
            return
        home = self.rig.workdir / "operator"
        home.mkdir(parents=True, exist_ok=True)
        env = self.workers._environ("operator", self.workers.config_for(home))
        self.say("fault: an operator breaks the lock of its live holder")
        self.count["break-holder"] += 1
        invoked = machine_clock()
        proc = subprocess.run(
            [sys.executable, "-m", "coordinator", "lock", "break", DEPLOYMENT, "--yes", "--reason", "torture operator"],
            capture_output=True, text=True, env=env, cwd=home, stdin=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        completed = machine_clock()
        self.say(f"fault: `lock break` exit {proc.returncode} after {completed - invoked:.1f}s")
        if proc.returncode == 0:
            self.workers.recorder.add_break(invoked, completed)
        elif proc.returncode == 4:
            # Not known to have reached a majority: it may still have cleared some leases.
            self.workers.recorder.add_break(invoked, completed)
            self.say("fault: the break did not reach a majority")
        else:
            self.workers.recorder.problem(f"operator: `lock break` exit {proc.returncode}: {tail(proc.stderr)}")

    def _sigkill_lock_run(self, room: float) -> None:
        """An operator's ``lock run`` of a long process tree; once the tree runs,
        ``lock run`` itself (not its child) is SIGKILLed. What it started must still be
        stopped before the lock can pass on: the tree's marks are judged like any other
        section (collected in the background once its last process is gone)."""
        self.serial += 1
        instance = f"killedrun{self.serial}"
        home = self.rig.workdir / "killed-runs"
        home.mkdir(parents=True, exist_ok=True)
        script = home / "tree.sh"
        script.write_text(TREE_SCRIPT)
        config = self.workers.config_for(home)
        marks = home / f"marks-{self.serial}.txt"
        marks.write_text("")
        ticks = 50
        wait = max(5.0, min(room, 40.0))
        command = [
            sys.executable, "-m", "coordinator", "lock", "run", DEPLOYMENT, "--ttl", "6s", "--wait", f"{wait:g}s",
            "--holder", instance, "--reason", "torture", "--grace", "1s",
            "--", "sh", str(script), str(marks), str(ticks),
        ]  # fmt: skip
        with (self.rig.workdir / "logs" / f"{instance}.log").open("w") as err:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=self.workers._environ(instance, config),
                cwd=home,
                start_new_session=True,
            )
        until = machine_clock() + wait + 30
        started = False
        while machine_clock() < until and proc.poll() is None:
            if " start " in marks.read_text():
                started = True
                break
            time.sleep(0.05)
        if started:
            self.say(f"fault: SIGKILL `lock run` (pid {proc.pid}) while its tree runs")
            self.count["sigkill-lock-run"] += 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        else:
            self.say("fault: the `lock run` to SIGKILL did not get the lock")
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        collector = threading.Thread(
            target=self._collect_tree, args=(instance, marks, ticks), name=f"tree-{instance}", daemon=True
        )
        collector.start()
        self.collectors.append(collector)

    def _collect_tree(self, instance: str, marks: Path, ticks: int) -> None:
        from faults.checkers import section_from_marks

        until = machine_clock() + ticks * TREE_TICK_S * 3 + 60
        pids: set[int] = set()
        while machine_clock() < until:
            pids = {int(p) for p, *_ in (line.split() for line in marks.read_text().splitlines()) if p.isdigit()}
            if not any(alive(pid) for pid in pids):
                break
            time.sleep(0.1)
        recorder = self.workers.recorder
        if any(alive(pid) for pid in pids):
            recorder.problem(f"{instance}: processes of its tree still ran long after `lock run` was killed")
        tree = section_from_marks(marks.read_text().splitlines())
        if tree is None:
            return
        if tree.token is None:
            recorder.problem(f"{instance}: the child of `lock run` had no COORDINATOR_FENCING_TOKEN")
            return
        event = {"ev": "tree", "token": tree.token, "enter": tree.enter, "exit": tree.exit}
        recorder.handle(instance, {**event, "processes": tree.processes})

    def wait_collectors(self, timeout: float) -> None:
        until = machine_clock() + timeout
        for collector in self.collectors:
            collector.join(timeout=max(0.0, until - machine_clock()))
            if collector.is_alive():
                self.workers.recorder.problem(f"{collector.name}: the tree was not collected in time")

    def _with_toxic(self, targets: list[int], seconds: float, add: Callable[[Proxy], str]) -> None:
        added: list[tuple[Proxy, str]] = []
        try:
            for i in targets:
                proxy = self.rig.proxies[i - 1]
                added.append((proxy, add(proxy)))
            self._sleep(seconds)
        finally:
            for proxy, name in added:
                proxy.remove_toxic(name)
