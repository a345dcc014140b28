"""`lock run` children's process trees, found in /proc by a marker, and `lock run` processes started on them."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from coordinator.rules.lease import lock_id_of
from helpers.web import lease

# The environment variable that marks every process of a child's tree.
MARK_VAR = "LOCKRUN_TEST_MARK"


def proc_stat(pid: str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None for a gone process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].decode().split()


class Tree:
    """One child's process tree, found in /proc by its marker."""

    def __init__(self) -> None:
        self.marker = "lockrun-mark-" + secrets.token_hex(6)
        self.last_alive = 0.0  # wall-clock time the tree was last seen alive
        self.scans = 0  # how many times the follower looked
        self.errors: list[str] = []  # what a look raised
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def command(self, *, ignore_term: bool = False, then: str = "sleep 299; wait") -> list[str]:
        trap = "trap '' TERM; " if ignore_term else ""
        script = f"{trap}sh -c 'sleep 300; :' {self.marker} & {then}"
        return ["env", f"{MARK_VAR}={self.marker}", "sh", "-c", script]

    def processes(self) -> dict[int, str]:
        """Live (not zombie) processes of the tree: pid -> state letter."""
        found = {}
        needle_env = f"{MARK_VAR}={self.marker}".encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            # By the environment: `lock run` itself has the marker in its command line.
            if needle_env in environ.split(b"\0"):
                stat = proc_stat(pid)
                if stat is not None and stat[0] not in ("Z", "X"):
                    found[int(pid)] = stat[0]
        return found

    def grandchild_alive(self) -> bool:
        for pid in self.processes():
            try:
                if self.marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def wait_started(self, timeout: float = 120) -> None:  # a condition: a second suite beside this one took > 40 s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.grandchild_alive() and len(self.processes()) >= 4:
                return
            time.sleep(0.1)
        pytest.fail(f"the child's tree never started: {self.processes()}")

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.processes():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def assert_gone(self) -> None:
        left = self.processes()
        assert not left, f"processes of the child's tree still alive: {left}"

    def _look(self) -> None:
        """Stamp ``last_alive`` if any process of the tree is alive. Stamped before the
        scan: a process seen alive was alive at some moment after this, so the stamp never
        claims a later life than the real one."""
        before = time.time()
        self.scans += 1
        if self.processes():
            self.last_alive = before

    def follow(self) -> Tree:
        """Record, in the background, the last time any process of the tree was alive."""

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self._look()
                except Exception as err:  # kept for the assertion's message; the loop goes on
                    self.errors.append(repr(err))
                time.sleep(0.02)

        # One look now, before the background's first: on a loaded machine a look over
        # every process can take seconds, and the tree may be gone by the time it ends.
        self._look()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop_following(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def kill(self) -> None:
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def tree() -> Any:
    """A fresh Tree, killed after the test whatever it left behind."""
    t = Tree()
    yield t
    t.stop_following()
    t.kill()  # whatever a failed test left behind


def json_of(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON document a command printed on stdout."""
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def lock_status(env: Any) -> Any:
    """`lock status web -o json`."""
    return json_of(env.cli("-o", "json", "lock", "status", "web"))


def watchdogs(pid: int) -> list[int]:
    """The watchdog processes of the `lock run` process ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        stat = proc_stat(entry)
        if b"--watchdog" in args and str(pid).encode() in args and stat and stat[0] != "Z":
            found.append(int(entry))
    return found


def start_run(
    env: Any, tree: Tree, *args: str, ignore_term: bool = False, then: str = "sleep 299; wait", holder: str = "runner"
) -> subprocess.Popen[str]:
    """Start `lock run web` on ``tree``'s command and wait until the tree runs under the lock."""
    proc: subprocess.Popen[str] = env.popen(
        "lock",
        "run",
        "web",
        "--holder",
        holder,
        *args,
        "--",
        *tree.command(ignore_term=ignore_term, then=then),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    tree.wait_started()
    st = lock_status(env)
    assert st["holder"] == holder and st["held_by_majority"], st
    assert watchdogs(proc.pid), "no watchdog runs beside `lock run`"
    return proc


def finish_run(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    """Wait for a `lock run` to exit (killed past ``timeout``): its exit status and stderr."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not watchdogs(proc.pid), "the watchdog outlived `lock run`"
    return proc.returncode, err


def _acquired_at(env: Any, lock_id: str) -> float:
    """Wall-clock time at which ``lock_id`` took its leases (their acquireTime)."""
    rows = [r for r in lock_status(env)["clusters"] if r["lock_id"] == lock_id and r["acquired_at"]]
    assert rows, f"lock {lock_id} holds no lease"
    return min(datetime.fromisoformat(r["acquired_at"]).timestamp() for r in rows)


def start_contender(env: Any, wait: str = "60s", *extra: str) -> subprocess.Popen[str]:
    """Start `lock acquire web --wait` as holder `next` (stdout and stderr piped), with ``extra`` options."""
    started: subprocess.Popen[str] = env.popen(
        "-o",
        "json",
        "lock",
        "acquire",
        "web",
        "--holder",
        "next",
        "--ttl",
        "30s",
        "--wait",
        wait,
        *extra,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return started


def wait_renewed(env: Any, lock_id: str, times: int, *, not_before: float = 0.0, timeout: float = 90) -> None:
    """Wait until a majority of `web`'s leases show ``times`` renewals of ``lock_id`` (new
    ``renewTime`` values under it, counted from the first one seen), and until
    ``time.monotonic()`` is past ``not_before``. A condition rather than a sleep: a child
    that runs until then has outlived what it must, however slow the machine."""
    seen: dict[int, set[str]] = {1: set(), 2: set(), 3: set()}
    deadline = time.monotonic() + timeout
    while True:
        for i, times_seen in seen.items():
            spec = (lease(env, i) or {}).get("spec") or {}
            if lock_id_of(spec.get("holderIdentity")) == lock_id and spec.get("renewTime"):
                times_seen.add(spec["renewTime"])
        renewals = sorted((len(s) - 1 for s in seen.values()), reverse=True)[1]  # on two of three
        if renewals >= times and time.monotonic() > not_before:
            return
        assert time.monotonic() < deadline, f"{lock_id} was renewed {renewals} of {times} times: {seen}"
        time.sleep(0.3)


def took_after_tree(env: Any, tree: Tree, contender: subprocess.Popen[str], timeout: float = 90) -> None:
    """Assert the contender took the lock only after the last process of ``tree`` was gone."""
    out, err = contender.communicate(timeout=timeout)
    assert contender.returncode == 0, err
    tree.stop_following()
    tree.assert_gone()
    taken = _acquired_at(env, json.loads(out)["lock_id"])
    assert tree.last_alive > 0, f"the tree was never seen alive in {tree.scans} looks; errors: {tree.errors[:3]}"
    assert taken > tree.last_alive, f"the contender took the lock {tree.last_alive - taken:.3f}s before the tree died"
