"""The on-call guide (docs/on-call.md) replayed on a sandbox: every command it shows is run
here, in a world arranged as the page describes, and what it prints is held to the page.

The page's sessions were captured on `coordinator sandbox up -n 3` with clusters eu-1..3;
here the clusters are c1..c3 (``eu-N`` on the page is ``cN``). Ids, times, durations, pids
and host names differ per run and are compared as placeholders; the first line of each
output (the verdict), each table's header and each ``Error:`` paragraph must match, and the
exit status must be the one the page implies. A command added to the page without a place
in this story fails the test, as does a command or a message of the page the tool no
longer has.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from coord_fixtures import Env, make_env

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "on-call.md"
WAIT_S = 120  # generous: every wait below is for a condition, never a fixed time


@dataclass
class Session:
    command: str  # as the page shows it, eu-N mapped to cN
    output: list[str]


def sessions(text: str) -> list[Session]:
    """The ``$ coordinator …`` commands of the page's code blocks, each with the lines it
    printed (up to the next command or the end of the block; ``...`` marks a cut)."""
    found: list[Session] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        line = line.replace("eu-", "c").replace("EU-", "C")
        if line.startswith("$ coordinator "):
            found.append(Session(line[2:], []))
        elif found:
            found[-1].output.append(line)
    return found


_PLACEHOLDERS = [
    (re.compile(r"\b[0-9a-f]{16}\b"), "ID"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?Z"), "TIME"),
    (re.compile(r"\b[\w.-]+@[\w.-]+\b"), "USER@HOST"),
    (re.compile(r"\bhost [\w.-]+"), "host HOST"),
    (re.compile(r"\b\d+(?:\.\d+)?(?:h|m|s)(?:\d+(?:\.\d+)?s)?\b"), "DUR"),
    (re.compile(r"\d+"), "N"),
    (re.compile(r"\s+"), " "),
]


def normal(line: str, namespace: str) -> str:
    line = re.sub(rf"\b{re.escape(namespace)}\b", "payments", line)
    for pattern, placeholder in _PLACEHOLDERS:
        line = pattern.sub(placeholder, line)
    return line.strip()


def _is_header(line: str) -> bool:
    return re.fullmatch(r"[A-Z][A-Z0-9 -]*", line.strip()) is not None and "  " in line.strip()


def check(session: Session, proc: subprocess.CompletedProcess[str], exit_code: int, namespace: str) -> None:
    """The verdict line, the table headers and the error paragraphs of the page are what
    the command printed, and it exited as the page implies."""
    shown = [line for line in session.output if line.strip() and line.strip() != "..."]
    assert proc.returncode == exit_code, (session.command, proc.returncode, proc.stdout, proc.stderr)
    out = [normal(line, namespace) for line in proc.stdout.splitlines() if line.strip()]
    err = [normal(line, namespace) for line in proc.stderr.splitlines() if line.strip()]
    first = normal(shown[0], namespace)
    assert (out or err)[0] == first, f"{session.command}\npage: {first}\nreal: {(out or err)[0]}"
    for line in shown:
        if _is_header(line):
            assert normal(line, namespace) in out, f"{session.command}: no header {line.strip()!r} in\n{proc.stdout}"
        elif line.startswith("Error: "):
            assert normal(line, namespace) in err, f"{session.command}: no {line!r} in\n{proc.stderr}"


@contextmanager
def paused(env: Env, index: int) -> Iterator[None]:
    env.sandbox.pause(index)
    try:
        yield
    finally:
        env.sandbox.resume(index)


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"not within {WAIT_S}s: {what}"
        time.sleep(0.5)


@pytest.fixture
def payments(sandbox3: Any, tmp_path: Path) -> Env:
    return make_env(sandbox3, tmp_path, deployment="payments")


@pytest.mark.slow
def test_every_session_of_the_on_call_guide_prints_what_the_page_shows(payments: Env, tmp_path: Path) -> None:
    env = payments
    shown = sessions(GUIDE.read_text())
    played: set[int] = set()

    def play(command: str, exit_code: int, verdict: str = "", **ids: str) -> None:
        """Run the page's session of ``command`` (the one whose output begins with
        ``verdict``, where the page runs it more than once), with ``ids`` in place of the
        page's words (this run's lock ids, the namespace), and hold its output to the page."""
        found = [i for i, s in enumerate(shown) if s.command == command and s.output[0].startswith(verdict)]
        assert len(found) == 1, f"docs/on-call.md shows {command!r} (output {verdict!r}...) {len(found)} times"
        session = shown[found[0]]
        words = [ids.get(w, w) for w in shlex.split(session.command)[1:]]
        check(session, env.cli(*words), exit_code, env.namespace)
        played.add(found[0])

    def status() -> Any:
        return _json(env.cli("-o", "json", "lock", "status", "payments"))

    # Alice takes the lock by hand: the fleet shows it held.
    alice = env.cli("lock", "acquire", "payments", "--holder", "alice", "--ttl", "5s", "--reason", "release 1.2")
    assert alice.returncode == 0, alice.stderr
    play("coordinator lock status -n payments", 0, payments=env.namespace)

    # Nobody renews it: after its TTL every lease shows expired and the lock free.
    _until("alice's leases expired", lambda: {c["status"] for c in status()["clusters"]} == {"expired"})
    play("coordinator lock status payments", 0, "payments is not held")

    # Bob's `lock run` takes the lapsed lease over and holds it while his command runs.
    go = tmp_path / "go"
    bob = env.popen(
        "lock", "run", "payments", "--holder", "bob", "--ttl", "30s", "--wait", f"{WAIT_S}s", "--reason", "deploy 1.3",
        "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.2; done",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _until("bob holds the lock", lambda: status()["holder"] == "bob")
        play("coordinator lock status payments", 0, "payments is LOCKED by bob")
    finally:
        go.touch()
        _, bob_err = bob.communicate(timeout=WAIT_S)
    assert bob.returncode == 0, bob_err

    # Dave takes it by hand and is gone: a break by another lock id breaks nothing, by his
    # own it clears his leases.
    dave = _json(env.cli("-o", "json", "lock", "acquire", "payments", "--holder", "dave", "--ttl", "120s",
                         "--reason", "hotfix"))["lock_id"]  # fmt: skip
    play('coordinator lock break payments --lock-id 0000000000000000 --yes --reason "runner died"', 3)
    play(
        'coordinator lock break payments --lock-id b02f623f89efc75b --yes --reason "dave\'s laptop is gone"',
        0,
        b02f623f89efc75b=dave,
    )
    play("coordinator lock history payments", 0)
    history = _json(env.cli("-o", "json", "lock", "history", "payments"))["tenures"]
    assert [(t["holder"], t["ended"]) for t in history] == [
        ("alice", "expired"),
        ("bob", "released"),
        ("dave", "broken"),
    ], history

    # Erin takes c2 and c3 while c1 is down; then c2 stops answering: unknown, never free.
    with paused(env, 1):
        erin = env.cli(
            "--timeout", "2s", "lock", "acquire", "payments",
            "--holder", "erin", "--ttl", "90s", "--reason", "migrate db",
        )  # fmt: skip
        assert erin.returncode == 0, erin.stderr
    with paused(env, 2):
        play("coordinator --timeout 2s lock status payments", 4)
        play("coordinator --timeout 2s cluster info c2", 0)
    assert env.cli("lock", "release", "payments", "--holder", "erin").returncode == 0

    unplayed = [s.command for i, s in enumerate(shown) if i not in played]
    assert not unplayed, f"docs/on-call.md shows commands this story does not run: {unplayed}"


def test_a_page_that_drifts_from_the_tool_is_caught() -> None:
    session = Session(
        "coordinator lock status payments", ["payments is not held by a majority of 2.", "CLUSTER  STATUS"]
    )
    free = subprocess.CompletedProcess[str]([], 0, "payments is not held by a majority of 2.\nCLUSTER  STATUS\n", "")
    check(session, free, 0, "t-1234")
    with pytest.raises(AssertionError):
        check(session, free, 4, "t-1234")  # another exit status
    drifted = subprocess.CompletedProcess[str]([], 0, "payments is FREE.\nCLUSTER  STATUS\n", "")
    with pytest.raises(AssertionError):
        check(session, drifted, 0, "t-1234")  # another verdict
    no_header = subprocess.CompletedProcess[str]([], 0, "payments is not held by a majority of 2.\nNAME  STATUS\n", "")
    with pytest.raises(AssertionError):
        check(session, no_header, 0, "t-1234")  # another table
    assert normal("LOCKED by bob (lock 99f284faf8bbfc84, token 2, host vm, pid 12309); 24s more", "t-1") == (
        "LOCKED by bob (lock ID, token N, host HOST, pid N); DUR more"
    )
