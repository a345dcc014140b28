"""`lock run` owns its child's whole process tree, against real API servers.

Every child here starts a tree: ``env MARK=… sh -c '…'`` (the child, leader of its
group), a grandchild ``sh -c 'sleep 300; :' <marker>`` that carries a unique marker in
its command line, and sleeps under both. Every process of the tree inherits the marker in
its environment (and only they: `lock run` has it in its command line, not there), so the
process table tells which of them are still alive, wherever they were reparented. Each
test checks that none is left, and, where another contender takes the lock afterwards,
that it took it only after the last of them was gone.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from faults.admission import add_policy, remove_policy
from helpers.cli import StreamReader
from helpers.lockrun import (
    Tree,
    finish_run,
    json_of,
    lock_status,
    proc_stat,
    start_contender,
    start_run,
    took_after_tree,
    wait_renewed,
    watchdogs,
)
from helpers.lockrun import tree as tree  # the fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# ------------------------------------------------------------------ signals to `lock run`


def test_sigterm_stops_the_whole_tree_before_the_lock_is_released(dep3: Any, tree: Tree) -> None:
    proc = start_run(dep3, tree, "--ttl", "8s")
    tree.follow()
    contender = start_contender(dep3)
    time.sleep(1)  # the contender is waiting
    proc.send_signal(signal.SIGTERM)
    code, err = finish_run(proc)
    assert code == 128 + signal.SIGTERM, err  # the child (sh) died of the forwarded SIGTERM
    tree.assert_gone()
    assert "interrupted by SIGTERM: stopped the child" in err and "released lock" in err, err
    took_after_tree(dep3, tree, contender)


def test_sigint_stops_even_what_ignores_it(dep3: Any, tree: Tree) -> None:
    # A non-interactive sh starts its background jobs with SIGINT ignored: the grandchild
    # survives the forwarded SIGINT, and must be stopped before the lock is released.
    proc = start_run(dep3, tree, "--ttl", "8s")
    proc.send_signal(signal.SIGINT)
    code, err = finish_run(proc)
    assert code == 128 + signal.SIGINT, err
    tree.assert_gone()
    assert "interrupted by SIGINT" in err and "it left in its group" in err and "released lock" in err, err
    assert lock_status(dep3)["holder"] is None


# ------------------------------------------------------------------ losing the lock


def test_lost_lock_stops_the_tree_and_exits_7(dep3: Any, tree: Tree) -> None:
    # The loss is the test's doing (two of three members paused), not the machine's: a 12 s
    # TTL leaves each renewal before the pause ~4 s to reach a majority (with 6 s it was
    # ~2 s, which a loaded machine can miss, losing the lock before the test looks).
    proc = start_run(dep3, tree, "--ttl", "12s", "--grace", "5s")
    tree.follow()
    dep3.sandbox.pause(1)
    dep3.sandbox.pause(2)
    assert tree.wait_gone(30), "the tree outlived the lock"
    code, err = finish_run(proc)
    assert code == 7, err
    assert "LOCK LOST on web" in err and "lost the lock on web" in err and "stopped the child (SIGTERM)" in err, err
    dep3.sandbox.resume(1)
    dep3.sandbox.resume(2)
    # No server skew allowed: the contender takes the lock as early as the lapse allows,
    # which is when a tree outliving the lock would show.
    took_after_tree(dep3, tree, start_contender(dep3, "60s", "--max-server-skew", "0s"))


def test_break_by_another_holder_stops_the_tree_and_exits_7(dep3: Any, tree: Tree) -> None:
    proc = start_run(dep3, tree, "--ttl", "6s", "--grace", "5s")
    broken = dep3.cli("lock", "break", "web", "--yes", "--reason", "test")
    assert broken.returncode == 0, broken.stderr
    assert tree.wait_gone(15), "the tree outlived the break"
    code, err = finish_run(proc)
    assert code == 7, err
    assert "lost the lock on web" in err, err


def test_child_ignoring_sigterm_is_killed_after_the_grace(dep3: Any, tree: Tree) -> None:
    proc = start_run(dep3, tree, "--ttl", "6s", "--grace", "3s", ignore_term=True)
    dep3.sandbox.pause(1)
    dep3.sandbox.pause(2)
    code, err = finish_run(proc)
    tree.assert_gone()
    assert code == 7, err
    assert "stopped the child (SIGTERM, then SIGKILL after 3s)" in err, err


def test_dead_lock_run_is_followed_by_its_tree(dep3: Any, tree: Tree) -> None:
    proc = start_run(dep3, tree, "--ttl", "6s", "--grace", "3s")
    tree.follow()
    contender = start_contender(dep3)
    time.sleep(1)
    proc.send_signal(signal.SIGKILL)
    assert tree.wait_gone(10), "the tree outlived `lock run`"
    _, err = finish_run(proc)
    assert "watchdog" in err and "is gone" in err, err
    took_after_tree(dep3, tree, contender)


# ------------------------------------------------------------------ Ctrl-Z


def _states(tree: Tree) -> set[str]:
    return set(tree.processes().values())


def test_ctrl_z_stops_the_tree_and_checks_the_lock_before_it_continues(dep3: Any, tree: Tree) -> None:
    proc = start_run(dep3, tree, "--ttl", "8s")
    proc.send_signal(signal.SIGTSTP)
    deadline = time.monotonic() + 10
    while _states(tree) != {"T"} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _states(tree) == {"T"}, tree.processes()
    assert proc_stat(str(proc.pid))[0] == "T"  # type: ignore[index]
    time.sleep(1.5)
    proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 10
    while "T" in _states(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "T" not in _states(tree), tree.processes()
    assert lock_status(dep3)["holder"] == "runner"
    proc.send_signal(signal.SIGTERM)
    code, err = finish_run(proc)
    assert code == 128 + signal.SIGTERM, err
    tree.assert_gone()


def test_ctrl_z_past_the_ttl_loses_the_lock(dep3: Any, tree: Tree) -> None:
    proc = start_run(dep3, tree, "--ttl", "6s", "--grace", "3s")
    tree.follow()
    contender = start_contender(dep3)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTSTP)
    # Stopped past the validity: the watchdog stops the group, then the lease expires.
    assert tree.wait_gone(20), "a stopped tree outlived the lock's validity"
    took_after_tree(dep3, tree, contender)
    assert proc_stat(str(proc.pid))[0] == "T"  # type: ignore[index]
    proc.send_signal(signal.SIGCONT)
    code, err = finish_run(proc)
    assert code == 7, err
    assert "lost the lock on web" in err and "SIGTSTP" in err, err


# ------------------------------------------------------------------ endings and exit codes


def test_exit_codes_like_env(dep3: Any, tmp_path: Path) -> None:
    for command, code in [(["/nonexistent/deploy.sh"], 127), (["no-such-command-3f2a"], 127)]:
        proc = dep3.cli("lock", "run", "web", "--", *command)
        assert proc.returncode == code, proc.stderr
        assert "the lock was not taken" in proc.stderr
    script = tmp_path / "deploy.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    proc = dep3.cli("lock", "run", "web", "--", str(script))
    assert proc.returncode == 126, proc.stderr
    proc = dep3.cli("lock", "run", "web", "--", "sh", "-c", "exit 17")
    assert proc.returncode == 17, proc.stderr
    assert "released lock" in proc.stderr and "after the child exited 17" in proc.stderr, proc.stderr
    proc = dep3.cli("lock", "run", "web", "--", "sh", "-c", "kill -KILL $$")
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert "was killed by SIGKILL (exit 137)" in proc.stderr, proc.stderr
    assert lock_status(dep3)["holder"] is None


def test_renewed_for_as_long_as_the_child_runs_and_leftovers_stopped(dep3: Any, tree: Tree, tmp_path: Path) -> None:
    # The child runs until the leases were renewed twice and past the end of the validity the
    # lock was taken with (a run that renewed the leases but kept counting on its first
    # validity would have declared the lock lost by then), then exits 0 leaving its
    # grandchild behind. A 12 s TTL leaves each renewal ~5 s to reach a majority, which a
    # loaded machine's API servers make (with 6 s it was ~2.5 s, which they can miss).
    ttl, grace = 12, 3
    go = tmp_path / "go"
    proc = start_run(dep3, tree, "--ttl", f"{ttl}s", "--grace", f"{grace}s",
                     then=f"while [ ! -e {go} ]; do sleep 0.1; done; exit 0")  # fmt: skip
    # The lock was taken before start_run returned; its validity, less the lead of a grace
    # (at most a third of the TTL) at which a loss is declared, ends before this.
    wait_renewed(dep3, lock_status(dep3)["lock_id"], 2, not_before=time.monotonic() + ttl - min(grace, ttl / 3))
    go.touch()
    code, err = finish_run(proc)
    assert code == 0, err
    tree.assert_gone()
    assert "released lock" in err and "after the child exited 0" in err and "it left in its group" in err, err
    assert lock_status(dep3)["holder"] is None


def test_runs_under_a_lock_taken_before(dep3: Any, tree: Tree, tmp_path: Path) -> None:
    # A 12 s TTL (the run renews with the lease's own): each renewal has ~5 s to reach a
    # majority, which a loaded machine's API servers make (with 6 s it was ~2.5 s, which they
    # can miss).
    ttl = 12
    taken = json_of(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice", "--ttl", f"{ttl}s"))
    lock_id = taken["lock_id"]
    refused = dep3.cli("lock", "run", "web", "--holder", "alice", "--", "true")
    assert refused.returncode == 3
    assert f"--lock-id {lock_id}" in refused.stderr, refused.stderr
    # Renewed while the child runs (until two renewals were seen, and past the validity the
    # run started with: a condition, not a sleep), and still held afterwards.
    go = tmp_path / "go"
    started = tmp_path / "started"
    run = dep3.popen(
        "lock",
        "run",
        "web",
        "--holder",
        "alice",
        "--lock-id",
        lock_id,
        "--",
        "sh",
        "-c",
        'test "$COORDINATOR_LOCK_ID" = "$0" && touch "$2" && while [ ! -e "$1" ]; do sleep 0.1; done',
        lock_id,
        str(go),
        str(started),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert run.poll() is None and time.monotonic() < deadline, run.returncode
            time.sleep(0.1)
        # The run renewed the lock before it started the child; the validity it got then
        # ends, less the lead at which a loss is declared (a third of the TTL here), before
        # this: a run that kept counting on it would have lost the lock by then.
        wait_renewed(dep3, lock_id, 2, not_before=time.monotonic() + ttl - ttl / 3)
        go.touch()
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err
    assert f"lock {lock_id} of web stays held" in err, err
    st = lock_status(dep3)
    assert st["lock_id"] == lock_id and st["held_by_majority"], st
    # The same through the environment, and released this time.
    proc = dep3.cli(
        "lock", "run", "web", "--holder", "alice", "--release", "--", "true", env={"COORDINATOR_LOCK_ID": lock_id}
    )
    assert proc.returncode == 0, proc.stderr
    assert f"released lock {lock_id} of web after the child exited 0" in proc.stderr, proc.stderr
    assert lock_status(dep3)["holder"] is None


def test_wait_reports_progress(dep3: Any) -> None:
    taken = json_of(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice", "--ttl", "30s"))
    proc = dep3.popen(
        "lock",
        "run",
        "web",
        "--holder",
        "bob",
        "--wait",
        "60s",
        "--",
        "true",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # Released once bob says he waits (a fixed pause is shorter than a busy machine's start-up).
    reader = StreamReader(proc.stderr, "waiting for web")
    try:
        assert reader.wait_marker(60), reader.text()
        assert dep3.cli("lock", "release", "web", "--lock-id", taken["lock_id"]).returncode == 0
        assert proc.wait(60) == 0, reader.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = reader.text(join=10)
    assert not watchdogs(proc.pid), "the watchdog outlived `lock run`"
    assert "waiting for web: held by alice" in err, err
    assert "released lock" in err, err


# ------------------------------------------------------------------ the grace never outlives the lock


def _refuse_renewals_of(env: Any, index: int, holder: str) -> None:
    """A ValidatingAdmissionPolicy on cluster ``index`` that rejects every update of a
    lease still held by ``holder`` (its renewals), while others may take it over."""
    add_policy(
        env.sandbox.admin(index),
        f"no-renewal-{holder}",
        f"!(has(object.spec.holderIdentity) && object.spec.holderIdentity.startsWith('{holder}/'))",
        "renewals refused for this test",
        operations=["UPDATE"],
        api_group="coordination.k8s.io",
        resource="leases",
    )


def _allow_renewals_of(env: Any, index: int, holder: str) -> None:
    remove_policy(env.sandbox.admin(index), f"no-renewal-{holder}")


def test_a_slow_cleanup_is_cut_short_before_the_lock_can_pass_on(dep3: Any, tree: Tree) -> None:
    """The child ignores SIGTERM (a long cleanup) and --grace is longer than the margin a
    contender waits after the lock's validity. The loss is declared ahead of the validity's
    end and SIGKILL comes no later than that end, so the waiting contender never takes the
    lock while the tree runs."""
    proc = start_run(dep3, tree, "--ttl", "9s", "--grace", "20s", ignore_term=True)
    tree.follow()
    try:
        for i in (1, 2):
            _refuse_renewals_of(dep3, i, "runner")
        contender = start_contender(dep3)
        code, err = finish_run(proc)
        assert code == 7, err
        took_after_tree(dep3, tree, contender)
    finally:
        for i in (1, 2):
            _allow_renewals_of(dep3, i, "runner")


def test_a_broken_stderr_neither_ends_lock_run_nor_abandons_the_lock(dep3: Any, tmp_path: Path) -> None:
    """`lock run ... 2>&1 | head -1`: once the reader is gone, writes to stderr fail with
    EPIPE. That must not end `lock run` (it used to exit 0 at once, its command never run,
    the lock left held) nor its watchdog."""
    done = tmp_path / "done"
    proc = dep3.popen(
        "lock",
        "run",
        "web",
        "--holder",
        "piped",
        "--ttl",
        "9s",
        "--",
        "sh",
        "-c",
        f"sleep 3; echo ran > {done}",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    proc.stderr.close()  # the reader is gone before `lock run` says anything
    assert proc.wait(timeout=60) == 0
    assert done.read_text().strip() == "ran"
    assert not lock_status(dep3)["held_by_majority"]
