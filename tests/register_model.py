"""A simulated register: the write and read protocol of coordinator.state, step by step,
over in-memory replicas that behave like API servers (compare-and-swap on
resourceVersion), with every decision taken by the pure rules of coordinator.register.

Requests are delivered one at a time in an order the test chooses, and each one may be
delivered, lose its response (applied, the client times out), be dropped (not applied,
the client times out) or be rejected (not applied, a 422 answer, as an admission policy
gives). Clients may also give up in the middle of an operation. The history of what the
clients saw goes to the project's linearizability checker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from faults.checkers import Operation
from served import served

from coordinator import register as reg
from coordinator.register import Delivery, Kind, Replica, Stamp

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NAME, DEPLOYMENT, STORAGE = "coordinator-state-sim", "sim", "configmap"

DELIVER, LOSE, DROP, REJECT = "deliver", "lose", "drop", "reject"
FATES = (*[DELIVER] * 7, LOSE, DROP, REJECT)  # mostly delivered, so that operations complete
# What a server does with the requests delivered to it: answer them; turn writes away
# (an admission policy); or not answer at all (paused, partitioned).
UP, REJECTS_WRITES, DOWN = "up", "rejects-writes", "down"


class Server:
    """One cluster's object store: GET, PUT (compare-and-swap), POST (create)."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.mode = UP

    def apply(self, method: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any] | None]:
        if method == "GET":
            return 200, self.obj
        assert body is not None
        if method == "POST":
            if self.obj is not None:
                return 409, None
        else:
            if self.obj is None:
                return 404, None
            if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
                return 409, None
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.obj = body
        self.sim.stored(body)
        return 200, body


@dataclass
class Request:
    lane: Any  # the Lane or read step waiting for it
    server: int
    method: str
    body: dict[str, Any] | None = None


class Lane:
    """One replica's compare-and-swap loop within one phase of one operation."""

    def __init__(self, op: Op, index: int, rep: Replica, stamp: Stamp, kind: Kind, text: str | None) -> None:
        self.op, self.index, self.rep = op, index, rep
        self.stamp, self.kind, self.text = stamp, kind, text
        self.attempts = 0
        self.result: Delivery | None = None

    def start(self) -> None:
        verdict = reg.judge(self.rep, self.stamp, self.kind)
        if not verdict.accept:
            return self.finish(Delivery.REFUSED)
        if verdict.done:
            return self.finish(Delivery.CONFIRMED)
        if self.attempts >= 4:
            return self.finish(Delivery.REFUSED)
        self.attempts += 1
        body = reg.build_object(
            self.rep,
            name=NAME,
            deployment=DEPLOYMENT,
            storage=STORAGE,
            promise=reg.promise_after(self.rep, self.stamp, self.kind),
            envelope_text=self.text,
        )
        self.op.send(Request(self, self.index, "PUT" if self.rep.exists else "POST", body))

    def respond(self, request: Request, status: int | None, obj: dict[str, Any] | None) -> None:
        if request.method == "GET":
            if status is None:
                return self.finish(Delivery.REFUSED)  # the write before it was refused (409)
            self.rep = reg.decode_replica(str(self.index), served(obj), STORAGE)
            return self.start()
        if status is None:
            return self.finish(Delivery.UNANSWERED)
        if status == 200:
            self.rep = reg.decode_replica(str(self.index), served(obj), STORAGE)
            return self.finish(Delivery.CONFIRMED)
        if status == 409:
            return self.op.send(Request(self, self.index, "GET"))
        return self.finish(Delivery.REFUSED)

    def finish(self, result: Delivery) -> None:
        self.result = result
        self.op.lane_done()


class Op:
    """One client operation."""

    kind = "op"

    def __init__(self, sim: Sim, process: str) -> None:
        self.sim, self.process = sim, process
        self.invoke = sim.tick()
        self.evidence = sim.max_token  # the leases a majority has seen, as of now
        self.done = False
        self.abandoned = False
        self.status = "unknown"
        self.value: Any = None
        self.stamp: Stamp | None = None
        self.lanes: list[Lane] = []
        self.answers: dict[int, Replica | None] = {}
        self.reading = True

    def send(self, request: Request) -> None:
        if not self.abandoned:
            self.sim.pending.append(request)

    def start_reads(self) -> None:
        for i in range(self.sim.n):
            self.send(Request(self, i, "GET"))

    def respond(self, request: Request, status: int | None, obj: dict[str, Any] | None) -> None:
        if not self.reading or self.abandoned:
            return
        self.answers[request.server] = reg.decode_replica(str(request.server), served(obj), STORAGE) if status else None
        self.read_answer()

    def read_answer(self) -> None:
        raise NotImplementedError

    def answered(self) -> dict[str, Replica]:
        return {str(k): v for k, v in self.answers.items() if v is not None}

    def run_lanes(self, lanes: list[Lane]) -> None:
        self.lanes = lanes
        if not lanes:
            self.phase_done()
            return
        for lane in lanes:
            lane.start()

    def lane_done(self) -> None:
        if not self.abandoned and all(lane.result is not None for lane in self.lanes):
            self.phase_done()

    def phase_done(self) -> None:
        raise NotImplementedError

    def finish(self, status: str, value: Any = None) -> None:
        if self.done:
            return
        self.done, self.status, self.value = True, status, value
        self.complete = self.sim.tick()
        self.sim.finished(self)

    def abandon(self) -> None:
        """The client gives up (killed, timed out): no more requests, outcome unknown.
        Writes already sent may still arrive."""
        self.abandoned = True
        self.sim.forget_reads(self)
        self.finish("unknown" if self.kind == "write" else "fail")

    def record(self) -> Operation:
        return Operation(
            self.process,
            "write" if self.kind == "write" else "read",
            self.value,
            self.invoke,
            self.complete if self.status == "ok" else None,
            self.status,  # type: ignore[arg-type]
        )


class WriteOp(Op):
    kind = "write"

    def __init__(self, sim: Sim, process: str, token: int, value: str, write_id: str | None = None) -> None:
        super().__init__(sim, process)
        self.token, self.written = token, value
        self.write_id = write_id or reg.new_write_id()
        self.phase = "read"
        self.data_sent_at: int | None = None
        self.start_reads()

    def read_answer(self) -> None:
        if len(self.answers) < self.sim.n:
            return  # a writer hears every member (or its timeout)
        self.reading = False
        reps = self.answered()
        if len(reps) < self.sim.q:
            return self.finish("fail")
        choice = reg.choose(reps, self.evidence)
        if choice.conflict or reg.newer_token(reps.values(), self.token, self.evidence) is not None:
            return self.finish("fail")
        base = choice.winner.envelope if choice.winner else None
        self.stamp = reg.next_stamp(reps.values(), self.token, self.evidence, self.write_id)
        _env, self.text = reg.build_envelope(
            base,
            {"v": self.written},
            self.stamp,
            who=self.process,
            host="sim",
            command="sim",
            now=NOW,
            members=[],
            member_ids={},
            namespace=None,
            storage=None,
            keys=["v"],
        )
        self.reps = reps
        self.phase = "promise"
        self.run_lanes([Lane(self, int(k), r, self.stamp, Kind.PROMISE, None) for k, r in reps.items()])

    def phase_done(self) -> None:
        assert self.stamp is not None
        if self.phase == "promise":
            promised = [lane for lane in self.lanes if lane.result is Delivery.CONFIRMED]
            if len(promised) < self.sim.q:
                return self.finish("fail")  # no data was sent anywhere
            latest = dict(self.reps)
            for lane in promised:
                latest[str(lane.index)] = lane.rep
            self.phase = "data"
            self.data_sent_at = self.sim.clock
            self.run_lanes([Lane(self, int(k), r, self.stamp, Kind.WRITE, self.text) for k, r in latest.items()])
            return
        outcome = reg.write_outcome({str(lane.index): lane.result for lane in self.lanes}, self.sim.q)  # type: ignore[misc]
        self.finish({"ok": "ok", "nothing": "fail", "unknown": "unknown"}[outcome])

    def finish(self, status: str, value: Any = None) -> None:
        super().finish(status, self.written)


class ReadOp(Op):
    kind = "read"

    def __init__(self, sim: Sim, process: str) -> None:
        super().__init__(sim, process)
        self.start_reads()

    def read_answer(self) -> None:
        reps = self.answered()
        unanswered = len(self.answers) - len(reps)
        if len(reps) < self.sim.q:
            if self.sim.n - unanswered < self.sim.q:
                self.reading = False
                self.finish("fail")
            return
        self.reading = False  # a reader stops at a majority
        self.sim.forget_reads(self)
        choice = reg.choose(reps, self.evidence)
        if choice.conflict:
            return self.finish("fail")
        if choice.winner is None:
            absent = [k for k, r in reps.items() if r.envelope is None and k not in choice.suspect]
            if choice.suspect and len(absent) < self.sim.q:
                return self.finish("fail")
            self.stamp = reg.NO_STAMP
            return self.finish("ok", None)
        self.choice = choice
        self.stamp = choice.top
        env = choice.winner.envelope
        assert env is not None
        text = reg.encode_envelope(env)
        self.run_lanes([Lane(self, int(k), reps[k], self.stamp, Kind.REPAIR, text) for k in choice.stale])

    def phase_done(self) -> None:
        current = len(self.choice.current) + sum(1 for lane in self.lanes if lane.result is Delivery.CONFIRMED)
        if current < self.sim.q:
            return self.finish("fail")
        env = self.choice.winner.envelope  # type: ignore[union-attr]
        self.finish("ok", env.data["v"] if env else None)


@dataclass
class Sim:
    n: int
    q: int = 0
    clock: int = 0
    max_token: int = 1
    pending: list[Request] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    running: dict[str, Op] = field(default_factory=dict)
    documents: dict[Stamp, str] = field(default_factory=dict)  # every envelope ever stored

    def __post_init__(self) -> None:
        self.q = self.n // 2 + 1
        self.servers = [Server(self) for _ in range(self.n)]

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def stored(self, obj: dict[str, Any]) -> None:
        rep = reg.decode_replica("x", served(obj), STORAGE)
        assert rep.corrupt is None, rep.corrupt
        if rep.envelope is not None:
            seen = self.documents.setdefault(rep.stamp, rep.envelope.checksum)
            assert seen == rep.envelope.checksum, f"two documents under stamp {rep.stamp}"

    def finished(self, op: Op) -> None:
        if self.running.get(op.process) is op:
            del self.running[op.process]

    def start(self, op: Op) -> None:
        self.ops.append(op)
        if not op.done:
            self.running[op.process] = op

    def deliver(self, index: int, fate: str) -> None:
        request = self.pending.pop(index % len(self.pending))
        self.tick()
        server = self.servers[request.server]
        if server.mode == DOWN:
            fate = DROP
        elif server.mode == REJECTS_WRITES and request.method != "GET":
            fate = REJECT
        if request.method == "GET" and fate == REJECT:
            fate = DROP
        if fate == DROP:
            status, obj = None, None
        elif fate == REJECT:
            status, obj = 422, None
        else:
            status, obj = server.apply(request.method, request.body)
            if fate == LOSE:
                status, obj = None, None
        op = request.lane.op if isinstance(request.lane, Lane) else request.lane
        if op.abandoned:
            return
        request.lane.respond(request, status, obj)

    def forget_reads(self, op: Op) -> None:
        """GETs nobody waits for any more change nothing: take them off the wire."""
        self.pending = [
            r for r in self.pending if not (r.method == "GET" and (r.lane is op or getattr(r.lane, "op", None) is op))
        ]

    def drain(self) -> None:
        for server in self.servers:
            server.mode = UP
        while self.pending:
            self.deliver(0, DELIVER)

    def history(self) -> list[Operation]:
        return [op.record() for op in self.ops]
