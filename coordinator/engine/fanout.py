"""Run one coroutine per member cluster at once, with a deadline, and gather outcomes.

This is the one fan-out helper every multi-cluster operation uses. The caller may say
when the answer is decided (``until``); the helper then returns at once. Unfinished
cluster tasks are either cancelled or, when the caller owns a longer-lived task group,
left running there so that they can clean up after themselves (for example release a
lease that landed after the attempt was already lost).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
from anyio.abc import TaskGroup

from coordinator import clock
from coordinator.kube.client import request_events
from coordinator.logs import get_logger
from coordinator.rules.outcome import Outcome

T = TypeVar("T")
log = get_logger(__name__)


@dataclass
class ClusterResult(Generic[T]):
    """What one cluster answered to one operation."""

    cluster: str
    outcome: Outcome
    value: T | None = None
    detail: str = ""
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def __repr__(self) -> str:
        # Short: the value (a lease or replica as read) can be kilobytes of an API object.
        value = f", value=<{type(self.value).__name__}>" if self.value is not None else ""
        return f"ClusterResult({self.cluster!r}, {self.outcome}, {short_text(self.detail)!r}{value})"


def short_text(text: str, limit: int = 100) -> str:
    """``text`` cut to ``limit`` characters (for reprs)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def outcomes(results: Mapping[str, ClusterResult[Any]]) -> dict[str, str]:
    """Each cluster's outcome, by name (for reprs)."""
    return {name: str(r.outcome) for name, r in sorted(results.items())}


Results = Mapping[str, ClusterResult[T]]


def silent_wait(timeout: float) -> float:
    """How long a fan-out waits for a cluster that gave no answer earlier in this
    command, once every other cluster has answered: a quarter of the deadline, at least
    a second (a server back from a pause answers in milliseconds), at most the deadline."""
    return min(timeout, max(1.0, timeout / 4))


# How a cluster absent from a decided fan-out's results is reported: it may well have
# answered, later; nobody waited to see.
NOT_WAITED_FOR = "not waited for: the attempt was already decided"
# Set in ``ClusterResult.extra`` when a cluster answered but its operation did not finish:
# not something to check for reachability.
ANSWERED = "answered"


@dataclass
class _Traffic:
    """The requests one cluster's operation sent and had answered, to tell at a deadline
    a silent cluster from one that answered while the operation waited on others."""

    started: float
    sent: int = 0
    answered: int = 0
    first_answer_s: float | None = None

    def tell(self, event: str) -> None:
        if event == "sent":
            self.sent += 1
        elif event == "answered":
            self.answered += 1
            if self.first_answer_s is None:
                self.first_answer_s = clock.monotonic() - self.started

    def timed_out(self, cluster: str, timeout: float) -> ClusterResult[Any]:
        if self.answered == 0:
            return ClusterResult(cluster, Outcome.UNREACHABLE, detail=f"no answer within {timeout:g}s")
        first = f"answered in {self.first_answer_s or 0:.2f}s"
        if self.sent > self.answered:
            # It answered, then went silent on a later request: unreachable since then.
            return ClusterResult(
                cluster,
                Outcome.UNREACHABLE,
                detail=f"{first}, then gave no answer to a later request within the {timeout:g}s deadline",
            )
        # Every request was answered: the operation was waiting on the other clusters.
        return ClusterResult(
            cluster,
            Outcome.ERROR,
            detail=f"{first}, but not finished within the {timeout:g}s deadline: "
            "it was waiting on the other clusters' answers",
            extra={ANSWERED: True},
        )

    def given_up(self, cluster: str, wait: float, timeout: float) -> ClusterResult[Any]:
        """A cluster silent earlier in the command, still unanswered ``wait`` seconds after
        the others' answers (see fan_out's ``silent``)."""
        if self.answered:
            detail = f"answered, then gave no answer to a later request within {wait:g}s of the others' answers"
        else:
            detail = (
                f"no answer within {wait:g}s of the others' answers, after none within the {timeout:g}s "
                "deadline earlier in this command"
            )
        return ClusterResult(cluster, Outcome.UNREACHABLE, detail=detail, elapsed_s=clock.monotonic() - self.started)


async def fan_out(
    clusters: Iterable[str],
    operation: Callable[[str], Awaitable[ClusterResult[T]]],
    *,
    timeout: float,
    until: Callable[[Results[T]], bool] | None = None,
    background: TaskGroup | None = None,
    grace_factor: float = 0.25,
    leave_running: Callable[[], bool] | None = None,
    silent: set[str] | None = None,
    finish_on_cancel: Callable[[], None] | None = None,
) -> dict[str, ClusterResult[T]]:
    """Run ``operation(cluster)`` for every cluster at once; each gets ``timeout`` seconds.

    Returns when every cluster has answered or timed out, or as soon as ``until`` says
    the question is decided, plus a short grace (``grace_factor`` times the time taken so
    far) so that healthy clusters answering together are all reported. Clusters that had
    not answered by then are absent from the result (report them as :data:`NOT_WAITED_FOR`).
    A cluster whose operation reaches ``timeout`` is reported unreachable only if it
    left a request unanswered; one that answered everything it was asked while the
    operation waited on the other clusters says so (outcome ``error``). They are cancelled, unless
    ``background`` is given and ``leave_running()`` (if given) says so: then they go on
    there (still bounded by ``timeout``), to clean up after themselves, and their
    results are dropped.

    ``silent``: the clusters known to have left a request unanswered earlier in this
    command (a :class:`~coordinator.engine.clusters.ClusterSet` keeps them). They are asked all
    the same, and their answers count while the question is open; but once it is
    decided the grace does not wait for them, and once every other cluster has answered
    they get :func:`silent_wait` more, not the whole ``timeout`` again: one member down
    costs a command one deadline, not one per step. A silent cluster still unanswered
    then is reported unreachable, like one that reached its deadline (its operation is
    dropped as a straggler: a write it sent may land, as after any timeout). This call
    adds the clusters it gave up on that never answered it (reached ``timeout`` with a
    request unanswered, or dropped without a single answer), and takes out those that
    answered. With no cluster outside ``silent`` there is nothing to measure them
    against, and each gets the whole ``timeout``.

    ``finish_on_cancel``: for operations that write. When the caller is cancelled while
    it waits (Ctrl-C), a write already sent lands on the server all the same, and
    cancelling the operation would only hide its outcome. So each cluster's operation is
    then shielded from the caller's cancellation (never from its own ``timeout``, nor
    from being dropped once decided); on cancellation this hook is called at once (to
    tell the operations that their answer is no longer wanted), the operations still
    running are waited for, and only then does the cancellation go on: whoever undoes
    the operation afterwards finds every write that got an answer in place.
    """
    names = list(dict.fromkeys(clusters))
    results: dict[str, ClusterResult[T]] = {}
    scopes: dict[str, anyio.CancelScope] = {}
    decided = anyio.Event()
    waited_for = anyio.Event()  # every cluster not known silent has answered
    closed = False
    begun = clock.monotonic()
    traffics: dict[str, _Traffic] = {}
    running = len(names)
    all_finished = anyio.Event()
    if not names:
        return results

    def check_waited_for() -> None:
        if all(n in results or (silent is not None and n in silent) for n in names):
            waited_for.set()

    async def run_one(name: str) -> None:
        nonlocal running
        try:
            await one(name)
        finally:
            running -= 1
            if running == 0:
                all_finished.set()

    async def one(name: str) -> None:
        started = clock.monotonic()
        traffic = traffics[name] = _Traffic(started)
        request_events.set(traffic.tell)  # this task's context (and its children's) only
        with anyio.CancelScope() as scope:
            # Shielded (finish_on_cancel), the operation's own scope is the one a decided
            # fan-out cancels; its deadline is the timeout all the same.
            limit = anyio.CancelScope(deadline=anyio.current_time() + timeout, shield=finish_on_cancel is not None)
            scopes[name] = limit if finish_on_cancel is not None else scope
            result: ClusterResult[T]
            with limit:
                try:
                    result = await operation(name)
                except Exception as err:  # a bug in an operation must not sink the others
                    log.exception("cluster operation failed unexpectedly", cluster=name)
                    result = ClusterResult(name, Outcome.ERROR, detail=f"{type(err).__name__}: {err}")
            if limit.cancelled_caught and closed and anyio.current_time() < limit.deadline:
                return  # dropped once decided (shielded): a straggler, as below
            if limit.cancelled_caught:
                result = traffic.timed_out(name, timeout)
            result.elapsed_s = clock.monotonic() - started
            if silent is not None:
                if limit.cancelled_caught and traffic.sent > traffic.answered:
                    silent.add(name)
                elif traffic.answered:
                    silent.discard(name)
            if closed:
                return  # a straggler: the caller has moved on
            results[name] = result
            check_waited_for()
            log.info(
                "cluster outcome",
                cluster=name,
                outcome=str(result.outcome),
                detail=result.detail,
                ms=round(result.elapsed_s * 1000, 1),
            )
            if len(results) == len(names) or (until is not None and until(results)):
                decided.set()

    # Silent clusters get a shorter wait only beside at least one that is not.
    asked_silent = set(names) & silent if silent is not None else set()
    short = bool(asked_silent) and len(asked_silent) < len(names)
    gave_up: dict[str, ClusterResult[T]] = {}

    async def wait_decided() -> None:
        if not short:
            await decided.wait()
            return
        wait = silent_wait(timeout)
        async with anyio.create_task_group() as waits:

            async def cap() -> None:
                await waited_for.wait()
                await anyio.sleep(wait)
                waits.cancel_scope.cancel()

            waits.start_soon(cap)
            await decided.wait()
            waits.cancel_scope.cancel()
        if decided.is_set():
            return
        for name in names:
            if name not in results:
                traffic = traffics.get(name) or _Traffic(begun)
                gave_up[name] = traffic.given_up(name, wait, timeout)
                if traffic.answered and silent is not None:
                    silent.discard(name)

    async with anyio.create_task_group() as local:
        owner = background if background is not None else local
        for name in names:
            owner.start_soon(run_one, name)
        try:
            await wait_decided()
            check_waited_for()
            if not waited_for.is_set():
                # The grace is a wait like the one above: a cancellation landing in it
                # finds writes on the wire all the same.
                with anyio.move_on_after(grace_factor * (clock.monotonic() - begun) + 0.01):
                    await waited_for.wait()
        except anyio.get_cancelled_exc_class():
            if finish_on_cancel is not None:
                finish_on_cancel()
                with anyio.CancelScope(shield=True), anyio.move_on_after(timeout + 1):
                    await all_finished.wait()
            raise
        closed = True
        if silent is not None:
            for name in names:
                t = traffics.get(name)
                if name not in results and t is not None and t.sent and not t.answered:
                    silent.add(name)
        if background is None or (leave_running is not None and not leave_running()):
            for name, scope in scopes.items():
                if name not in results:
                    scope.cancel()
    for name, result in gave_up.items():
        log.info("cluster outcome", cluster=name, outcome=str(result.outcome), detail=result.detail)
    return dict(results) | gave_up
