"""The history checkers used by the fault-injection suite must pass correct
histories and catch broken ones; each test pins the exact verdict."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

import pytest
from faults.checkers import (
    CheckResult,
    CriticalSection,
    Operation,
    apply_breaks,
    check_linearizable_register,
    check_mutual_exclusion,
    check_no_lost_writes,
    history_stats,
    section_from_marks,
)


def sec(process: str, token: int, enter: float, exit: float | None, **extra: Any) -> dict[str, Any]:
    return {"process": process, "token": token, "enter": enter, "exit": exit, **extra}


def w(process: str, value: Any, invoke: float, complete: float | None, status: str = "ok") -> Operation:
    return Operation(process, "write", value, invoke, complete, status)  # type: ignore[arg-type]


def r(process: str, value: Any, invoke: float, complete: float | None, status: str = "ok") -> Operation:
    return Operation(process, "read", value, invoke, complete, status)  # type: ignore[arg-type]


# ------------------------------------------------------------------ mutual exclusion


def test_sequential_sections_with_rising_tokens_pass() -> None:
    result = check_mutual_exclusion([sec("a", 1, 0.0, 1.0), sec("b", 2, 1.5, 3.0), sec("a", 5, 3.0, 4.0)])
    assert result.ok, result.summary()
    assert result.violations == ()


def test_records_may_come_in_any_order_and_as_dataclasses() -> None:
    result = check_mutual_exclusion([CriticalSection("b", 2, 2.0, 3.0), CriticalSection("a", 1, 0.0, 1.0)])
    assert result.ok, result.summary()


def test_overlapping_sections_are_reported() -> None:
    result = check_mutual_exclusion([sec("a", 1, 0.0, 2.0), sec("b", 2, 1.0, 3.0)])
    assert not result.ok
    assert result.kinds == ["overlap"]
    assert "b (token 2, [1, 3]) entered at 1 while a (token 1, [0, 2])" in result.messages[0]


def test_every_overlapping_pair_is_reported() -> None:
    result = check_mutual_exclusion([sec("a", 1, 0.0, 10.0), sec("b", 2, 1.0, 2.0), sec("c", 3, 3.0, 4.0)])
    assert result.kinds == ["overlap", "overlap"]


def test_section_starting_at_the_reading_another_ended_does_not_overlap() -> None:
    result = check_mutual_exclusion([sec("a", 1, 0.0, 1.0), sec("b", 2, 1.0, 2.0)])
    assert result.ok, result.summary()


def test_falling_token_is_reported() -> None:
    result = check_mutual_exclusion([sec("a", 7, 0.0, 1.0), sec("b", 3, 2.0, 3.0)])
    assert result.kinds == ["token-not-rising"]
    assert "fencing token went down: b (token 3" in result.messages[0]


def test_equal_token_is_reported_as_reused() -> None:
    result = check_mutual_exclusion([sec("a", 4, 0.0, 1.0), sec("b", 4, 2.0, 3.0)])
    assert result.kinds == ["token-reused"]
    assert "fencing token 4 was reused" in result.messages[0]


def test_token_must_beat_the_highest_so_far_not_just_the_previous_one() -> None:
    result = check_mutual_exclusion([sec("a", 5, 0.0, 1.0), sec("b", 2, 2.0, 3.0), sec("c", 3, 4.0, 5.0)])
    assert result.kinds == ["token-not-rising", "token-not-rising"]


def test_killed_holder_without_ttl_holds_until_the_end_of_the_history() -> None:
    result = check_mutual_exclusion([sec("a", 1, 0.0, None), sec("b", 2, 1000.0, 1001.0)])
    assert result.kinds == ["overlap"]
    assert "never exited" in result.messages[0]


def test_killed_holder_with_ttl_frees_the_lock_once_its_lease_expired() -> None:
    history = [sec("a", 1, 0.0, None, last_alive=5.0), sec("b", 2, 16.0, 17.0)]
    assert check_mutual_exclusion(history, ttl=10.0).ok


def test_taking_over_before_a_killed_holders_lease_expired_is_an_overlap() -> None:
    history = [sec("a", 1, 0.0, None, last_alive=5.0), sec("b", 2, 12.0, 13.0)]
    result = check_mutual_exclusion(history, ttl=10.0)
    assert result.kinds == ["overlap"]
    assert "lease ran until 15" in result.messages[0]


def test_killed_holder_without_last_alive_is_counted_from_its_entry() -> None:
    history = [sec("a", 1, 0.0, None), sec("b", 2, 9.0, 10.0)]
    assert check_mutual_exclusion(history, ttl=10.0).kinds == ["overlap"]
    assert check_mutual_exclusion(history, ttl=8.0).ok


def test_malformed_sections_are_rejected() -> None:
    with pytest.raises(ValueError, match="exits before it enters"):
        check_mutual_exclusion([sec("a", 1, 2.0, 1.0)])
    with pytest.raises(ValueError, match="lacks 'token'"):
        check_mutual_exclusion([{"process": "a", "enter": 0.0, "exit": 1.0}])


def test_empty_lock_history_passes() -> None:
    assert check_mutual_exclusion([]).ok


# -------------------------------------------------------------------- linearizability


def test_sequential_history_is_linearizable() -> None:
    history = [w("a", 1, 0, 1), r("b", 1, 2, 3), w("b", 2, 4, 5), r("a", 2, 6, 7)]
    result = check_linearizable_register(history)
    assert result.ok, result.summary()


def test_initial_value_is_a_parameter() -> None:
    assert check_linearizable_register([r("a", "v0", 0, 1)], initial="v0").ok
    assert check_linearizable_register([r("a", None, 0, 1)]).ok
    assert check_linearizable_register([r("a", None, 0, 1)], initial="v0").kinds == ["read-of-unwritten-value"]


def test_stale_read_is_not_linearizable() -> None:
    history = [w("a", 1, 0, 1), w("a", 2, 2, 3), r("b", 1, 4, 5)]
    result = check_linearizable_register(history)
    assert result.decided
    assert result.kinds == ["not-linearizable"]
    assert "read 1 by b [4, 5]" in result.messages[0]


def test_stale_read_after_another_client_saw_the_new_value() -> None:
    # b saw 2, then c (starting later) saw 1 again: 2 can't be undone.
    history = [w("a", 1, 0, 1), w("a", 2, 2, 10), r("b", 2, 3, 4), r("c", 1, 5, 6)]
    assert check_linearizable_register(history).kinds == ["not-linearizable"]


def test_read_of_a_value_never_written() -> None:
    history = [w("a", 1, 0, 1), r("b", 42, 2, 3)]
    result = check_linearizable_register(history)
    assert result.kinds == ["read-of-unwritten-value"]
    assert "read 42 by b" in result.messages[0]


def test_read_of_a_value_only_a_failed_write_wrote() -> None:
    history = [w("a", 1, 0, 1, status="fail"), r("b", 1, 2, 3)]
    assert check_linearizable_register(history).kinds == ["read-of-failed-write"]


def test_read_of_a_value_written_only_after_the_read_completed() -> None:
    history = [r("b", 1, 0, 1), w("a", 1, 2, 3)]
    assert check_linearizable_register(history).kinds == ["read-from-the-future"]


@pytest.mark.parametrize("seen", [None, 1])
def test_read_concurrent_with_a_write_may_see_either_value(seen: int | None) -> None:
    history = [w("a", 1, 0, 10), r("b", seen, 2, 3)]
    assert check_linearizable_register(history).ok


def test_concurrent_reads_must_agree_on_one_order() -> None:
    # While w(1) is in flight, b sees 1 and then (strictly later) c sees None:
    # the write can't be linearized both before and after.
    history = [w("a", 1, 0, 10), r("b", 1, 2, 3), r("c", None, 4, 5)]
    assert check_linearizable_register(history).kinds == ["not-linearizable"]
    # Overlapping reads may each see one side.
    history = [w("a", 1, 0, 10), r("b", 1, 2, 5), r("c", None, 4, 6)]
    assert check_linearizable_register(history).ok


def test_equal_readings_count_as_concurrent() -> None:
    # The read's invoke equals the write's completion: the clock can't order them.
    assert check_linearizable_register([w("a", 1, 0, 2), r("b", None, 2, 3)]).ok
    assert check_linearizable_register([w("a", 1, 0, 2), r("b", None, 2.5, 3)]).kinds == ["not-linearizable"]


@pytest.mark.parametrize("seen", [None, 1])
def test_unknown_write_may_or_may_not_have_happened(seen: int | None) -> None:
    history = [w("a", 1, 0, None, status="unknown"), r("b", seen, 5, 6), r("b", seen, 7, 8)]
    assert check_linearizable_register(history).ok


def test_unknown_write_cannot_be_seen_then_unseen() -> None:
    history = [w("a", 1, 0, None, status="unknown"), r("b", 1, 5, 6), r("b", None, 7, 8)]
    assert check_linearizable_register(history).kinds == ["not-linearizable"]


def test_unknown_write_can_land_long_after_its_client_gave_up() -> None:
    history = [
        w("a", 1, 0, 1, status="unknown"),
        w("b", 2, 3, 4),
        r("c", 2, 5, 6),
        r("c", 1, 7, 8),  # the delayed write finally landed
    ]
    assert check_linearizable_register(history).ok


def test_unknown_write_takes_effect_at_most_once() -> None:
    history = [
        w("a", 1, 0, 1, status="unknown"),
        w("b", 2, 3, 4),
        r("c", 2, 5, 6),
        r("c", 1, 7, 8),
        w("b", 3, 9, 10),
        r("c", 1, 11, 12),  # would need the unknown write to land a second time
    ]
    assert check_linearizable_register(history).kinds == ["not-linearizable"]


def test_unknown_write_whose_value_was_seen_elsewhere_may_still_be_left_out() -> None:
    history = [
        w("a", 1, 0, 1),
        r("b", 1, 0.5, 5),  # sees a's write, and is still running when c's starts
        w("a", 2, 1.5, 2),
        w("c", 1, 3, None, status="unknown"),
        r("b", 2, 6, 7),  # c's write never landed
    ]
    assert check_linearizable_register(history).ok


def test_unknown_write_may_land_after_an_earlier_read_of_the_same_value() -> None:
    history = [
        w("a", 1, 0, None, status="unknown"),
        r("b", 1, 2, 3),  # the initial value
        w("c", 2, 4, 5),
        r("b", 2, 6, 7),
        r("b", 1, 8, 9),  # a's write landed late
    ]
    assert check_linearizable_register(history, initial=1).ok
    without_it = history[1:]
    assert check_linearizable_register(without_it, initial=1).kinds == ["not-linearizable"]


def test_failed_operations_are_dropped() -> None:
    history = [w("a", 1, 0, 1), w("b", 2, 2, 3, status="fail"), r("c", 1, 4, 5)]
    assert check_linearizable_register(history).ok
    # Reads that failed or timed out returned nothing to check.
    history = [w("a", 1, 0, 1), r("c", 99, 2, 3, status="fail"), r("c", 7, 4, None, "unknown")]
    assert check_linearizable_register(history).ok


def test_dict_values_are_compared_by_content() -> None:
    history = [w("a", {"replicas": 3, "v": [1, 2]}, 0, 1), r("b", {"v": [1, 2], "replicas": 3}, 2, 3)]
    assert check_linearizable_register(history).ok


def test_mapping_records_are_accepted() -> None:
    history: list[dict[str, Any]] = [
        {"process": "a", "kind": "write", "value": 1, "invoke": 0, "complete": 1, "status": "ok"},
        {"process": "b", "kind": "read", "value": 1, "invoke": 2, "complete": 3},
    ]
    assert check_linearizable_register(history).ok


def test_malformed_operations_are_rejected() -> None:
    with pytest.raises(ValueError, match="no completion time"):
        check_linearizable_register([w("a", 1, 0, None)])
    with pytest.raises(ValueError, match="completes before it is invoked"):
        check_linearizable_register([w("a", 1, 5, 1)])
    with pytest.raises(ValueError, match="kind must be"):
        check_linearizable_register([{"process": "a", "kind": "cas", "value": 1, "invoke": 0, "complete": 1}])


def test_history_is_split_at_quiescence_and_values_carry_across() -> None:
    history = [
        w("a", 1, 0, 3),
        w("b", 2, 1, 4),
        # quiescent: either 1 or 2 may be the value now
        r("c", 1, 5, 6),
        r("c", 1, 7, 8),
    ]
    result = check_linearizable_register(history)
    assert result.ok, result.summary()
    assert result.segments == 3
    history[2] = r("c", 2, 5, 6)
    assert check_linearizable_register(history).kinds == ["not-linearizable"]


def _simulated_history(seed: int, n_ops: int, n_procs: int = 4) -> list[Operation]:
    """A history of a real (atomic) register: every op takes effect at a random
    instant inside its interval, so the history is linearizable by construction."""
    rng = random.Random(seed)
    clock = [0.0] * n_procs
    planned: list[tuple[float, int, str, float, float]] = []
    for i in range(n_ops):
        p = i % n_procs
        invoke = clock[p] + rng.random()
        complete = invoke + rng.random() * 3
        clock[p] = complete
        kind = "write" if rng.random() < 0.5 else "read"
        planned.append((rng.uniform(invoke, complete), i, kind, invoke, complete))
    ops: list[Operation] = []
    value: Any = None
    for _, i, kind, invoke, complete in sorted(planned):
        if kind == "write":
            value = f"v{i}"
            ops.append(w(f"p{i % n_procs}", value, invoke, complete))
        else:
            ops.append(r(f"p{i % n_procs}", value, invoke, complete))
    return ops


def test_long_simulated_history_is_linearizable() -> None:
    history = _simulated_history(seed=7, n_ops=400)
    result = check_linearizable_register(history)
    assert result.ok, result.summary()
    assert result.segments > 1


def test_long_history_with_one_stale_read_is_caught() -> None:
    history = _simulated_history(seed=11, n_ops=300)
    # Make the last read return the value of the first write: stale by now.
    first_write = next(op for op in history if op.kind == "write")
    last_read = max((op for op in history if op.kind == "read"), key=lambda op: op.invoke)
    later_writes = [
        op
        for op in history
        if op.kind == "write" and op.complete < last_read.invoke  # type: ignore[operator]
    ]
    assert len(later_writes) > 1  # the first write was surely overwritten
    broken = [r(op.process, first_write.value, op.invoke, op.complete) if op is last_read else op for op in history]
    result = check_linearizable_register(broken)
    assert result.kinds == ["not-linearizable"]


def test_search_gives_up_clearly_when_over_budget() -> None:
    # Twelve concurrent writes and reads: many orders to try.
    history = [w(f"p{i}", i, 0, 100) for i in range(12)] + [r("q", i, 1 + i, 1.5 + i) for i in (3, 1, 4, 1, 5, 9, 2, 6)]
    result = check_linearizable_register(history, max_states=50)
    assert not result.decided
    assert not result.ok
    assert result.violations == ()
    assert result.undecided is not None and "more than 50 states" in result.undecided
    assert "raise max_states" in result.undecided


def _brute_force(history: Sequence[Operation], initial: Any = None) -> bool:
    """Try every total order (and every choice of unknown writes to keep)."""
    ops = [op for op in history if op.status != "fail" and not (op.kind == "read" and op.status != "ok")]
    unknown = [op for op in ops if op.status == "unknown"]
    known = [op for op in ops if op.status == "ok"]

    def end(op: Operation) -> float:
        return float("inf") if op.status == "unknown" else op.complete  # type: ignore[return-value]

    for keep in itertools.product([False, True], repeat=len(unknown)):
        chosen = known + [op for op, k in zip(unknown, keep, strict=True) if k]
        for order in itertools.permutations(chosen):
            if any(end(later) < earlier.invoke for i, earlier in enumerate(order) for later in order[i + 1 :]):
                continue
            value = initial
            for op in order:
                if op.kind == "write":
                    value = op.value
                elif op.value != value:
                    break
            else:
                return True
    return False


def _random_small_history(rng: random.Random) -> list[Operation]:
    # Integer times make equal readings common; few values make duplicates common.
    ops: list[Operation] = []
    for i in range(rng.randint(1, 7)):
        invoke = float(rng.randint(0, 10))
        complete = invoke + rng.randint(0, 5)
        status = rng.choice(["ok", "ok", "ok", "fail", "unknown", "unknown"])
        kind = rng.choice(["write", "read"])
        value = rng.choice([None, 1, 2]) if kind == "read" else rng.choice([1, 2, 3])
        ops.append(Operation(f"p{i}", kind, value, invoke, complete, status))  # type: ignore[arg-type]
    return ops


def test_search_agrees_with_brute_force_on_random_small_histories() -> None:
    rng = random.Random(2024)
    verdicts = {True: 0, False: 0}
    for _ in range(1500):
        history = _random_small_history(rng)
        initial = rng.choice([None, 1])
        expected = _brute_force(history, initial)
        result = check_linearizable_register(history, initial=initial)
        assert result.decided
        assert result.ok == expected, (history, initial, result.summary())
        verdicts[expected] += 1
    # The sample exercises both verdicts plenty.
    assert verdicts[True] > 300 and verdicts[False] > 300, verdicts


# ------------------------------------------------------------------------ lost writes


def _ok(result: CheckResult) -> bool:
    return result.ok


def test_acknowledged_writes_followed_by_the_final_read_pass() -> None:
    history = [w("a", 1, 0, 1), w("b", 2, 2, 3), r("c", 2, 4, 5)]
    assert _ok(check_no_lost_writes(history))


def test_overwritten_acknowledged_write_is_not_lost() -> None:
    history = [w("a", 1, 0, 1), w("b", 2, 2, 3)]
    assert check_no_lost_writes(history, final_value=2).ok


def test_last_acknowledged_write_missing_from_the_final_value_is_lost() -> None:
    history = [w("a", 1, 0, 1), w("b", 2, 2, 3), r("c", 1, 4, 5)]
    result = check_no_lost_writes(history)
    assert result.kinds == ["lost-write"]
    assert "acknowledged write 2 by b [2, 3] was lost" in result.messages[0]


def test_concurrent_writes_may_end_in_either_order() -> None:
    history = [w("a", 1, 0, 5), w("b", 2, 1, 3)]
    assert check_no_lost_writes(history, final_value=1).ok
    assert check_no_lost_writes(history, final_value=2).ok


def test_unknown_write_may_overwrite_an_acknowledged_one() -> None:
    history = [w("a", 1, 5, 6), w("b", 2, 0, 1, status="unknown")]
    assert check_no_lost_writes(history, final_value=2).ok


def test_failed_write_cannot_excuse_a_lost_write_nor_be_the_final_value() -> None:
    history = [w("a", 1, 0, 1), w("b", 2, 2, 3, status="fail")]
    result = check_no_lost_writes(history, final_value=2)
    assert sorted(result.kinds) == ["final-value-unwritten", "lost-write"]


def test_final_value_from_a_read_that_does_not_follow_all_writes_is_refused() -> None:
    history = [w("a", 1, 0, 10), r("c", None, 4, 5)]
    with pytest.raises(ValueError, match="pass final_value explicitly"):
        check_no_lost_writes(history)
    # Equal readings are concurrent: the read need not have seen the write.
    with pytest.raises(ValueError, match="pass final_value explicitly"):
        check_no_lost_writes([w("a", 1, 0, 4), r("c", None, 4, 5)])
    with pytest.raises(ValueError, match="no successful read"):
        check_no_lost_writes([w("a", 1, 0, 1)])


def test_a_final_value_acknowledged_before_a_later_write_is_a_lost_write_despite_unknown_writes() -> None:
    # The final read returns 1, acknowledged before 2 was even sent: 2 is lost. The old
    # rule let the unknown write 3 excuse it, although 3 is not the final value.
    history = [w("a", 1, 0, 1), w("b", 2, 2, 3), w("c", 3, 4, 5, status="unknown"), r("d", 1, 6, 7)]
    result = check_no_lost_writes(history)
    assert result.kinds == ["lost-write"]
    assert "acknowledged write 2 by b [2, 3] was lost" in result.messages[0]


def test_an_unknown_write_of_the_final_value_may_have_landed_last() -> None:
    history = [w("a", 1, 0, 1), w("b", 2, 2, 3), w("c", 3, 0.5, 0.8, status="unknown"), r("d", 3, 6, 7)]
    assert check_no_lost_writes(history).ok


def test_final_initial_value_loses_every_acknowledged_write() -> None:
    history = [w("a", 1, 0, 1), w("c", 3, 4, 5, status="unknown"), r("d", None, 6, 7)]
    assert check_no_lost_writes(history).kinds == ["lost-write"]


# ------------------------------------------------------------------ history measures


def test_history_stats_count_concurrency_overlaps_and_observed_unknown_writes() -> None:
    history = [
        w("a", 1, 0, 4),
        r("b", None, 1, 2),  # overlaps the write of 1
        r("c", 1, 3, 5),  # overlaps it too; three in flight at 3
        w("d", 2, 6, 7, status="unknown"),
        w("e", 3, 8, None, status="unknown"),  # never completed: never read
        r("f", 2, 9, 10),  # overlaps the unknown write 3, which may still land; reads 2
        r("g", 1, 11, 12, status="fail"),
    ]
    stats = history_stats(history)
    assert stats.max_in_flight == 2
    assert stats.reads_overlapping_writes == 3
    assert (stats.unknown_writes, stats.unknown_writes_observed) == (2, 1)
    busier = history_stats([*history, r("h", 1, 1.5, 3.5)])
    assert busier.max_in_flight == 3


# --------------------------------------------------------- breaks and process trees


def test_a_break_ends_the_broken_holders_section_for_the_check() -> None:
    sections = [sec("a", 1, 0, 10), sec("b", 2, 6, 8)]
    assert check_mutual_exclusion(sections).kinds == ["overlap"]
    cut = apply_breaks(sections, [(5.0, 5.5)])
    assert cut[0]["exit"] == 5.0 and cut[0]["how"] == "broken"
    assert check_mutual_exclusion(cut).ok


def test_a_break_does_not_excuse_an_overlap_before_it_nor_after_it_completed() -> None:
    before = apply_breaks([sec("a", 1, 0, 10), sec("b", 2, 3, 4)], [(5.0, 5.5)])
    assert check_mutual_exclusion(before).kinds == ["overlap"]
    # c entered after the break completed and d after c: d overlaps c.
    after = apply_breaks([sec("a", 1, 0, 10), sec("c", 2, 6, 9), sec("d", 3, 7, 8)], [(5.0, 5.5)])
    assert check_mutual_exclusion(after).kinds == ["overlap"]
    # A break that ended before a section entered does not touch it.
    untouched = apply_breaks([sec("c", 2, 6, 9)], [(5.0, 5.5)])
    assert untouched[0]["exit"] == 9 and "how" not in untouched[0]


def test_a_holder_entering_during_a_break_is_left_out_of_the_token_order_only() -> None:
    # A 10 s break: c got token 3 and was broken before its (slow) command returned, d and
    # e took the lock with 4 and 5 meanwhile, and c entered last, believing it held it.
    during = [sec("d", 4, 13.0, 13.2), sec("e", 5, 13.5, 13.8), sec("c", 3, 13.6, 19.0)]
    assert "token-not-rising" in check_mutual_exclusion(during).kinds
    cut = apply_breaks(during, [(10.0, 20.0)])
    assert all(s["unordered"] for s in cut)
    assert check_mutual_exclusion(cut).ok
    # ...but not out of the reuse check, and sections after the break are ordered again.
    reused = apply_breaks([sec("d", 4, 13.0, 13.2), sec("c", 4, 13.6, 19.0)], [(10.0, 20.0)])
    assert check_mutual_exclusion(reused).kinds == ["token-reused", "token-reused"]
    after = apply_breaks([sec("d", 4, 13.0, 13.2), sec("f", 6, 21.0, 22.0), sec("g", 5, 23.0, 24.0)], [(10.0, 20.0)])
    assert check_mutual_exclusion(after).kinds == ["token-not-rising"]


def test_a_lock_held_by_a_majority_before_the_break_completed_counts_as_entered_then() -> None:
    # c's take held a majority at 5.2, during the break (5.0-5.5); its command returned at
    # 5.6, and d took the lock at 6. The break may be ordered after c's take: c is cut.
    held = [{**sec("c", 3, 5.6, 9), "held_from": 5.2}, sec("d", 4, 6, 8)]
    assert check_mutual_exclusion(apply_breaks(held, [(5.0, 5.5)])).ok
    # Without that evidence, or with a majority first held after the break completed
    # (an attempt whose takes straddled it), c entered after the break and overlaps d.
    assert check_mutual_exclusion(apply_breaks([sec("c", 3, 5.6, 9), sec("d", 4, 6, 8)], [(5.0, 5.5)])).kinds == [
        "overlap"
    ]
    late = [{**sec("c", 3, 5.6, 9), "held_from": 5.55}, sec("d", 4, 6, 8)]
    assert check_mutual_exclusion(apply_breaks(late, [(5.0, 5.5)])).kinds == ["overlap"]
    # c counts as inside from 5.2 to the break: e, inside until 5.25, overlaps it.
    before = [{**sec("c", 3, 5.6, 9), "held_from": 5.2}, sec("e", 2, 4, 5.25)]
    assert check_mutual_exclusion(apply_breaks(before, [(5.3, 5.5)])).kinds == ["overlap"]


def test_a_process_tree_lasts_until_its_last_mark() -> None:
    marks = [
        "100 token 7",
        "100 start 10.00",
        "101 start 10.05",
        "100 end 11.00",
        "102 start 10.10",
        "102 tick 14.20",  # a grandchild the shell did not wait for
        "101 end 10.50",
        "102 ti",  # cut short by SIGKILL
    ]
    tree = section_from_marks(marks)
    assert tree is not None
    assert (tree.token, tree.enter, tree.exit, tree.processes) == (7, 10.0, pytest.approx(14.21), 3)
    # The grandchild's last mark is what overlaps the next holder, not the shell's end.
    sections = [sec("tree", 7, tree.enter, tree.exit), sec("next", 8, 12.0, 13.0)]
    assert check_mutual_exclusion(sections).kinds == ["overlap"]
    assert section_from_marks(["100 token 7", "garbage"]) is None
