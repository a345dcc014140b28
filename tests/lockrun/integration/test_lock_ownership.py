"""A lock belongs to the process that holds it, on real API servers.

`lock run`'s lock is its own and its child's: another process of the same holder on the
same machine (a second CI job on the runner, a second terminal) gets nothing of it
through the local record; a release made on this machine while its group runs waits for
the group and refuses unless forced; a release made anywhere else is noticed by the next
renewal, which stops the group (exit 7); and the cleanup step after a killed `lock run`
frees the lock only once the child's group, still being stopped by the watchdog, is gone.

The children are the process trees of tests/lockrun/integration/test_lockrun.py (``Tree``): every process of the
tree carries a marker in its environment, so the test sees when the last one died.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from coord_fixtures import Env
from helpers.lockrun import (
    MARK_VAR,
    Tree,
    finish_run,
    lock_status,
    start_contender,
    start_run,
    took_after_tree,
    watchdogs,
)
from helpers.lockrun import tree as tree  # the fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEP = "web"


def _other_machine(env: Env, tmp_path: Path) -> dict[str, str]:
    """The environment of another machine: the same clusters and deployment, its own
    config directory (so none of this machine's lock records)."""
    other = tmp_path / "other-machine" / "config.yaml"
    other.parent.mkdir(parents=True)
    shutil.copy(env.config, other)
    return {"COORDINATOR_CONFIG": str(other), "XDG_STATE_HOME": str(other.parent / "state")}


def _held_by(env: Env) -> str | None:
    st = lock_status(env)
    return st["lock_id"] if st["held_by_majority"] else None


def _rollback_tree(tree: Tree, rollback_s: int) -> list[str]:
    """A child that, on SIGTERM, runs a rollback of ``rollback_s`` seconds before it exits
    (its grandchild and sleeps die of the SIGTERM at once)."""
    script = f"trap 'sleep {rollback_s}; exit 1' TERM; sh -c 'sleep 300; :' {tree.marker} & while :; do sleep 1; done"
    return ["env", f"{MARK_VAR}={tree.marker}", "sh", "-c", script]


# ------------------------------------------------------------------ item 2: two jobs, one holder


def test_a_second_job_of_the_same_holder_gets_nothing_of_a_running_lock_run(dep3: Env, tree: Tree) -> None:
    """Two CI jobs on one runner share HOME and the holder: job 1 runs `lock run`; job 2's
    acquisition is refused, and neither its `state set` nor its cleanup release may pick
    up job 1's lock from the record. A third job elsewhere stays out."""
    job1 = start_run(dep3, tree, "--ttl", "60s", "--grace", "2s", holder="ci")
    lock_id = _held_by(dep3)
    assert lock_id is not None
    job2 = {"COORDINATOR_HOLDER": "ci"}
    refused = dep3.cli("lock", "run", DEP, "--", "true", env=job2)
    assert refused.returncode == 3, refused.stderr
    assert f"--lock-id {lock_id}" not in refused.stderr, f"job 2 was offered job 1's lock: {refused.stderr}"
    wrote = dep3.cli("state", "set", DEP, "job=2", env=job2)
    assert wrote.returncode == 6, f"job 2 wrote the state under job 1's lock: {wrote.stdout}{wrote.stderr}"
    assert "no lock is held" in wrote.stderr, wrote.stderr
    cleanup = dep3.cli("lock", "release", DEP, "--if-held", env=job2)
    assert cleanup.returncode == 0, cleanup.stderr
    assert "holds no lock" in cleanup.stdout, cleanup.stdout
    assert _held_by(dep3) == lock_id, "job 2's cleanup released job 1's lock"
    third = dep3.cli("lock", "acquire", DEP, "--holder", "job3")
    assert third.returncode == 3, third.stderr
    assert tree.processes(), "job 1's child did not survive job 2"
    job1.send_signal(signal.SIGTERM)
    code, err = finish_run(job1)
    assert code == 128 + signal.SIGTERM, err
    assert f"released lock {lock_id}" in err, err


def test_the_default_holder_names_the_ci_job(dep3: Env) -> None:
    """Without COORDINATOR_HOLDER, two jobs of one runner are two holders: the job's
    identity from the CI's environment is part of the default holder, so one job's
    cleanup never finds the lock another job took with `lock acquire`."""
    gha = {"GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "2", "GITHUB_JOB": "deploy"}
    taken = dep3.cli("-o", "json", "lock", "acquire", DEP, env={**gha, "RUNNER_NAME": "runner-a"})
    assert taken.returncode == 0, taken.stderr
    doc = json.loads(taken.stdout)
    assert "4242" in doc["holder"] and "deploy" in doc["holder"] and "runner-a" in doc["holder"], doc
    other = dep3.cli("lock", "release", DEP, "--if-held", env={**gha, "RUNNER_NAME": "runner-b"})
    assert other.returncode == 0, other.stderr
    assert _held_by(dep3) == doc["lock_id"], "another job's cleanup released the lock"
    gitlab = dep3.cli("lock", "release", DEP, "--if-held", env={"GITLAB_CI": "true", "CI_JOB_ID": "77"})
    assert gitlab.returncode == 0 and _held_by(dep3) == doc["lock_id"], gitlab.stderr
    own = dep3.cli("lock", "release", DEP, "--if-held", env={**gha, "RUNNER_NAME": "runner-a"})
    assert own.returncode == 0 and "Released" in own.stdout, own.stdout + own.stderr
    assert _held_by(dep3) is None


# ------------------------------------------------------------------ item 3: a release is noticed


def test_lock_run_notices_a_release_from_elsewhere_and_stops_its_group(dep3: Env, tree: Tree, tmp_path: Path) -> None:
    """An operator on another machine releases the lock of a running `lock run`: the next
    renewal (every ~19 s here) finds its leases free, which is a loss: the group is
    stopped and `lock run` exits 7, long before the lock's validity (60 s) would end."""
    proc = start_run(dep3, tree, "--ttl", "60s", "--grace", "2s")
    lock_id = _held_by(dep3)
    assert lock_id is not None
    released = dep3.cli("lock", "release", DEP, "--lock-id", lock_id, env=_other_machine(dep3, tmp_path))
    assert released.returncode == 0, released.stderr
    assert tree.wait_gone(45), "the child ran on after its lock was released"
    code, err = finish_run(proc)
    assert code == 7, err
    assert "LOCK LOST on web" in err and "released" in err, err
    assert "before its validity ended" not in err, err


def test_a_release_on_this_machine_waits_for_the_group_and_refuses_unless_forced(dep3: Env, tree: Tree) -> None:
    """A second terminal of the same user releases the lock by its id while the group
    runs: it waits for the group (the `lock run`'s --grace and a little), then refuses
    (exit 3), the lock and the child untouched. --force releases it; `lock run` notices
    at its next renewal and stops the group (exit 7)."""
    proc = start_run(dep3, tree, "--ttl", "60s", "--grace", "2s")
    lock_id = _held_by(dep3)
    assert lock_id is not None
    refused = dep3.cli("lock", "release", DEP, "--lock-id", lock_id)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert f"pid {proc.pid}" in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert _held_by(dep3) == lock_id
    assert tree.grandchild_alive()
    forced = dep3.cli("lock", "release", DEP, "--lock-id", lock_id, "--force", "--grace", "1s")
    assert forced.returncode == 0, forced.stderr
    assert tree.wait_gone(45), "the child ran on after its lock was released"
    code, err = finish_run(proc)
    assert code == 7, err
    assert "LOCK LOST on web" in err, err


def test_the_child_cannot_release_its_own_lock_from_under_lock_run(dep3: Env, tmp_path: Path) -> None:
    """The child itself runs `coordinator lock release` (its lock id comes from the
    environment): refused at once, exit 3, since its own group is what still runs."""
    out, rc = tmp_path / "release.out", tmp_path / "release.rc"
    release = f"{sys.executable} -m coordinator lock release {DEP} > {out} 2>&1"
    script = f"{release}; echo $? > {rc}.tmp; mv {rc}.tmp {rc}; sleep 300"
    proc = dep3.popen(
        "lock", "run", DEP, "--ttl", "60s", "--", "sh", "-c", script, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not rc.exists():
        assert time.monotonic() < deadline, "the child's release never ended"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    said = out.read_text()
    assert rc.read_text().strip() == "3", said
    assert "its own process group" in said, said
    st = lock_status(dep3)
    assert st["held_by_majority"], st
    proc.send_signal(signal.SIGTERM)
    code, err = finish_run(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "released lock" in err, err


def test_a_lease_freed_on_a_minority_is_not_a_loss(dep3: Env, tree: Tree) -> None:
    """Only a majority that can no longer be ours is a loss: with the lease freed on one
    member of three, `lock run` keeps renewing the other two and its child runs on."""
    proc = start_run(dep3, tree, "--ttl", "9s", "--grace", "1s")
    lock_id = _held_by(dep3)
    assert lock_id is not None

    async def free_c1() -> None:
        api = dep3.api()
        async with api:
            await api.lock_engine(DEP)._release.release_one("c1", lock_id)

    anyio.run(free_c1)
    rows = {r["name"]: r for r in lock_status(dep3)["clusters"]}
    assert rows["c1"]["lock_id"] is None, rows
    renewed = {r["name"]: r["renewed_at"] for r in rows.values()}
    # Three renewal rounds at least (every ~2.7 s with this TTL): past the first that saw c1 free.
    for _ in range(3):
        deadline = time.monotonic() + 60
        while True:
            now = {r["name"]: r["renewed_at"] for r in lock_status(dep3)["clusters"]}
            if now["c2"] != renewed["c2"] or now["c3"] != renewed["c3"]:
                renewed = now
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no renewal came"
            time.sleep(0.2)
    assert proc.poll() is None and tree.grandchild_alive()
    proc.send_signal(signal.SIGTERM)
    code, err = finish_run(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "LOCK LOST" not in err, err


# ------------------------------------------------------------------ item 4: the cleanup after a kill


def test_the_cleanup_after_a_killed_lock_run_waits_for_the_childs_rollback(dep3: Env, tree: Tree) -> None:
    """The CI runner SIGKILLs `lock run`; its watchdog sends the group SIGTERM and the
    child rolls back for a few seconds. The job's cleanup `lock release --if-held` (same
    holder) waits for the group to end before it frees the lock, so the next job, waiting
    already, deploys only after the rollback."""
    proc = env_popen_run(dep3, tree, _rollback_tree(tree, 6), "--ttl", "60s", "--grace", "30s")
    tree.follow()
    lock_id = _held_by(dep3)
    assert lock_id is not None
    contender = start_contender(dep3, wait="120s")
    time.sleep(1)  # the contender is waiting
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cleanup = dep3.cli("lock", "release", DEP, "--if-held", env={"COORDINATOR_HOLDER": "runner"})
    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
    assert f"Released lock {lock_id}" in cleanup.stdout, cleanup.stdout + cleanup.stderr
    took_after_tree(dep3, tree, contender)
    finish_run(proc)
    assert not watchdogs(proc.pid)


def env_popen_run(env: Env, tree: Tree, command: list[str], *args: str) -> subprocess.Popen[str]:
    """`lock run` of ``command`` as holder ``runner``, once its tree has started."""
    proc = env.popen(
        "lock", "run", DEP, "--holder", "runner", *args, "--", *command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 40
    while not (tree.grandchild_alive() and lock_status(env)["held_by_majority"]):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the child's tree never started"
        time.sleep(0.1)
    return proc
