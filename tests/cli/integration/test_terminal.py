"""What a person sees on an 80-column terminal (tmux): plain columns cut at the width,
prose wrapped at word boundaries, one live `--wait` line, a refusal grouped by holder.

Each command runs in a tmux pane of 80 x 40 on a server of the test's own (``tmux -L``),
and the pane is read back with ``capture-pane -p``: the rows as the terminal shows them,
folds included."""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from coord_fixtures import Env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/setup.sh installs it as root)"),
]

WIDTH = 80
BOXES = set("┏┓┗┛┃━│─┡┩╇┳┻╋┼")
REASON = "release 1.2 of the payments service, canary in eu-1 first"


class Pane:
    """One tmux pane of WIDTH columns running commands with the test's environment."""

    def __init__(self, env: Env, tmp: Path) -> None:
        self.socket = "coordinator-test-" + secrets.token_hex(4)
        self.env = env
        rc = tmp / "rc.sh"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.environ().items() if k.isidentifier())
        command = shlex.join([sys.executable, "-m", "coordinator"])
        rc.write_text(exports + f"unset COLUMNS LINES NO_COLOR\nPS1='$ '\nc() {{ {command} \"$@\"; }}\n")
        self._tmux("new-session", "-d", "-x", str(WIDTH), "-y", "40", f"bash --noprofile --rcfile {rc} -i")

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def rows(self) -> list[str]:
        """The pane's rows, history included, as the terminal shows them (not joined)."""
        return self._tmux("capture-pane", "-p", "-S", "-500").rstrip("\n").split("\n")

    def run(self, *args: str, limit: float = 120, sample: float | None = None) -> tuple[list[str], list[list[str]]]:
        """Run ``coordinator ARGS`` in the pane; the rows it printed, and with ``sample``
        the rows below its start as seen every ``sample`` seconds while it ran."""
        token = secrets.token_hex(3)
        begin, end_ = f"begin-{token}", f"end-{token}"
        # printf's arguments, not the markers themselves: the typed line never shows them.
        line = f"printf '%s-%s\\n' begin {token}; {shlex.join(['c', *args])}; printf '%s-%s\\n' end {token}"
        self._tmux("clear-history")
        self._tmux("send-keys", line, "Enter")
        samples: list[list[str]] = []
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            rows = self.rows()
            start = rows.index(begin) + 1 if begin in rows else None
            if start is not None and end_ in rows:
                return rows[start : rows.index(end_)], samples
            if sample is not None and start is not None:
                samples.append(rows[start:])
            time.sleep(sample or 0.2)
        raise AssertionError(f"no end of {line} within {limit}s: {self.rows()[-10:]}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def pane(dep3: Env, tmp_path: Path) -> Iterator[Pane]:
    p = Pane(dep3, tmp_path)
    try:
        yield p
    finally:
        p.close()


def _words(text: str) -> list[str]:
    """The words of ``text``, numbers blurred (times move between two runs)."""
    return re.sub(r"\d+(\.\d+)?", "0", text).split()


def _hold(env: Env) -> None:
    proc = env.cli("lock", "acquire", "web", "--holder", "alice", "--ttl", "120s", "--reason", REASON)
    assert proc.returncode == 0, proc.stderr


def test_the_fleet_view_is_plain_columns_cut_at_the_terminal_width(dep3: Env, pane: Pane) -> None:
    long_name = "orders-service-production"
    members = [a for c in dep3.clusters for a in ("--cluster", c)]
    made = dep3.cli("deployment", "create", long_name, "-n", dep3.namespace, *members)
    assert made.returncode == 0, made.stderr
    _hold(dep3)
    # This test's namespace only: other tests' deployments on the shared sandbox may be
    # in any state.
    rows, _ = pane.run("lock", "status", "-n", dep3.namespace)
    assert rows and rows[0].endswith("locked."), rows
    assert not BOXES & set("".join(rows)), "\n".join(rows)
    assert all(len(r) <= WIDTH for r in rows), "\n".join(rows)
    assert rows[1].split()[:3] == ["DEPLOYMENT", "NAMESPACE", "STATUS"], rows[1]
    # One row per deployment, its cells whole: name and namespace are never folded.
    ours = {r.split()[0]: r.split() for r in rows[2:] if dep3.namespace in r}
    assert ours[long_name][:3] == [long_name, dep3.namespace, "free"], ours
    assert ours["web"][:4] == ["web", dep3.namespace, "held", "alice"], ours
    # In a pipe the same lines are whole, with the reason at the end.
    piped = dep3.cli("lock", "status", "-n", dep3.namespace).stdout
    line = next(x for x in piped.splitlines() if x.split()[:2] == ["web", dep3.namespace])
    assert line.endswith(REASON) and len(line) > WIDTH, line


def test_a_refusal_is_grouped_by_holder_and_wrapped_at_word_boundaries(dep3: Env, pane: Pane) -> None:
    # A refusal is decided once a majority refused: a busy machine may print the third
    # member as "not waited for" in one run and not the other; and a take that reached the
    # members in two different seconds shows two "since" times, two lines. Compare two runs
    # that both heard all three, of a take stamped in one second.
    for _ in range(5):
        _hold(dep3)
        rows, _ = pane.run("lock", "acquire", "web", "--holder", "bob")
        piped = dep3.cli("lock", "acquire", "web", "--holder", "bob")
        if "not waited for" not in " ".join(rows) + piped.stderr and piped.stderr.count("held by alice (") == 1:
            break
        assert dep3.cli("lock", "release", "web", "--holder", "alice").returncode == 0
    assert all(len(r) <= WIDTH for r in rows), "\n".join(rows)
    assert piped.returncode == 3, piped.stderr
    # The same words in the same order: wrapped between words, never inside one.
    assert _words(" ".join(rows)) == _words(piped.stderr), "\n".join(rows) + "\n---\n" + piped.stderr
    assert rows[0].startswith("Error: Could not lock deployment 'web'"), rows
    # The three clusters name one holder: one line for all three (continued, indented).
    assert piped.stderr.count("held by alice (") == 1, piped.stderr
    assert "  c1, c2, c3: held by alice (host " in piped.stderr, piped.stderr
    held = next(i for i, r in enumerate(rows) if r.startswith("  c1, c2, c3: held by alice"))
    assert rows[held + 1].startswith("    ") and not rows[held + 1].startswith("     "), rows


def test_the_wait_line_is_one_row_rewritten_in_place(dep3: Env, pane: Pane) -> None:
    _hold(dep3)
    rows, samples = pane.run("lock", "acquire", "web", "--holder", "bob", "--wait", "6s", sample=0.5)
    waiting = [[r for r in s if r.startswith("waiting for web")] for s in samples]
    assert sum(1 for w in waiting if w) >= 3, samples[-1:]  # the line was seen, several times
    # One row at any moment, however many updates: no stale rows, no fold.
    assert all(len(w) <= 1 for w in waiting), max(waiting, key=len)
    assert all(len(r) < WIDTH for w in waiting for r in w), waiting
    assert [r for r in rows if r.startswith("waiting for web")] == [rows[0]], rows
    assert "held by alice" in rows[0] and "giving up in" in rows[0], rows[0]
    assert rows[1].startswith("Error: Could not lock deployment 'web'"), rows
