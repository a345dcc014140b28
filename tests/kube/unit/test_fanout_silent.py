"""A fan-out and the clusters that gave no answer earlier in the same command: asked all
the same, but once every other cluster has answered they get a short wait, not the whole
deadline again (one member down costs a command one deadline, not one per step)."""

from __future__ import annotations

import anyio

from coordinator.engine.fanout import ClusterResult, fan_out, silent_wait
from coordinator.kube.client import request_events
from coordinator.rules.outcome import Outcome


def _fan_out(
    names: list[str], answers_after: dict[str, float], *, timeout: float, silent: set[str]
) -> dict[str, ClusterResult[str]]:
    """fan_out over ``names``, each answering its one request after ``answers_after``
    seconds (at once if not named)."""

    async def operation(name: str) -> ClusterResult[str]:
        tell = request_events.get()
        assert tell is not None
        tell("sent")
        await anyio.sleep(answers_after.get(name, 0.0))
        tell("answered")
        return ClusterResult(name, Outcome.OK, name)

    async def go() -> dict[str, ClusterResult[str]]:
        return await fan_out(names, operation, timeout=timeout, silent=silent)

    return anyio.run(go)


def test_the_silent_wait_is_a_quarter_of_the_deadline_at_least_a_second_at_most_the_deadline() -> None:
    assert silent_wait(5) == 1.25
    assert silent_wait(3) == 1.0
    assert silent_wait(0.5) == 0.5
    assert silent_wait(40) == 10.0


def test_a_cluster_silent_earlier_is_given_up_on_after_the_short_wait() -> None:
    silent = {"c2"}
    # c2 never answers; with the whole deadline the detail would say 8s.
    out = _fan_out(["c1", "c2", "c3"], {"c2": 3600}, timeout=8, silent=silent)
    assert out["c1"].ok and out["c3"].ok
    assert out["c2"].outcome is Outcome.UNREACHABLE
    assert out["c2"].detail == (
        "no answer within 2s of the others' answers, after none within the 8s deadline earlier in this command"
    )
    assert silent == {"c2"}


def test_a_silent_cluster_that_answers_in_the_short_wait_counts_and_is_silent_no_more() -> None:
    silent = {"c2"}
    out = _fan_out(["c1", "c2", "c3"], {"c2": 0.05}, timeout=60, silent=silent)
    assert all(r.ok for r in out.values()), out
    assert silent == set()


def test_a_cluster_that_is_not_silent_gets_the_whole_deadline() -> None:
    # c2 answers after 2.5 s, past the 1 s a silent cluster would get: it is waited for.
    out = _fan_out(["c1", "c2", "c3"], {"c2": 2.5}, timeout=4, silent={"c3"})
    assert out["c2"].ok, out


def test_with_every_cluster_silent_each_gets_the_whole_deadline() -> None:
    out = _fan_out(["c1", "c2"], {"c1": 3600, "c2": 3600}, timeout=0.3, silent={"c1", "c2"})
    assert {k: r.detail for k, r in out.items()} == {"c1": "no answer within 0.3s", "c2": "no answer within 0.3s"}


def test_a_cluster_that_answered_then_went_silent_is_named_so_and_leaves_the_silent_set() -> None:
    silent = {"c2"}

    async def operation(name: str) -> ClusterResult[str]:
        tell = request_events.get()
        assert tell is not None
        tell("sent")
        tell("answered")
        if name == "c2":
            tell("sent")
            await anyio.sleep(3600)
        return ClusterResult(name, Outcome.OK, name)

    async def go() -> dict[str, ClusterResult[str]]:
        return await fan_out(["c1", "c2"], operation, timeout=4, silent=silent)

    out = anyio.run(go)
    assert out["c2"].outcome is Outcome.UNREACHABLE
    assert out["c2"].detail.startswith("answered, then gave no answer to a later request within 1s"), out["c2"]
    assert silent == set()
