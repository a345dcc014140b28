"""Text from the clusters never reaches a terminal raw; JSON and YAML carry it exact.

Holder, reason, host and command are annotations anyone who may write a Lease in the
namespace can set (a contender with the printed Role sets its own, by `--holder` and
`--reason`); server error texts come from the API server, an admission webhook, or
whatever sits in between. Each is tried here with a window-title escape (OSC), a
one-byte CSI (C1), a carriage return, a forged line, a bell and a bidirectional
override, on real API servers.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import time
from pathlib import Path

import anyio
import pytest
import yaml
from coord_fixtures import UNHURRIED, Env, put_lease
from helpers.cli import StreamReader

from coordinator.cli import output
from coordinator.rules.resources import lease_path
from coordinator.text import printable

pytestmark = pytest.mark.integration

# What a hostile writer puts in: set the window title, colour by a one-byte CSI, return to
# the start of the line and overwrite it, forge a line of output, ring the bell, and flip
# the text direction.
TITLE = "\x1b]0;pwned\x07"
HOLDER = f"mallory{TITLE}\x9b31m"
REASON = "routine\rOK: nothing to see\nc9       free   -  forged line\u202e"
HOST = "\x1b[2J\x1b[Hhost"
COMMAND = "deploy\x08\x08\x08\x08\x08\x08rm -rf /"
RAW = ("\x1b", "\x9b", "\r", "\x07", "\x08", "\u202e")


def _clean(text: str) -> None:
    """Nothing in ``text`` acts on a terminal, and no line is forged."""
    for ch in RAW:
        assert ch not in text, (ch, text)
    for line in text.splitlines():
        assert not line.lstrip().startswith(("c9 ", "OK: nothing")), line


def _hostile_lease(env: Env) -> None:
    """Take the lock as a hostile contender, then let someone with write access to the
    namespace edit the holder annotations on c1 as well."""
    proc = env.cli("lock", "acquire", "web", "--ttl", "120s", "--holder", HOLDER, "--reason", REASON)
    assert proc.returncode == 0, proc.stderr

    async def edit() -> None:
        lease = await env.raw(1, "GET", lease_path(env.namespace, "coordinator-lock-web"))
        lease["metadata"]["annotations"].update({"coordinator.io/host": HOST, "coordinator.io/command": COMMAND})
        await put_lease(env, 1, lease)

    anyio.run(edit)


def test_printable_escapes_controls_and_keeps_unicode() -> None:
    assert printable("plain café 東京 ✓") == "plain café 東京 ✓"
    assert printable(TITLE) == "\\x1b]0;pwned\\x07"
    assert printable("a\rb\nc\td\x7f\x9b\u202e\u200b\u2028") == "a\\rb\\nc\\td\\x7f\\x9b\\u202e\\u200b\\u2028"
    assert printable("one\ntwo\r", keep_newlines=True) == "one\ntwo\\r"
    assert printable("\U000e0001") == "\\U000e0001"  # an unassigned-in-use tag character


def test_lock_status_escapes_what_the_clusters_say_and_json_keeps_it_exact(dep3: Env) -> None:
    _hostile_lease(dep3)
    # Every member's row is checked: under load a member answering after the default
    # timeout would be a row without a holder, which is not what this test is about.
    text = dep3.cli("lock", "status", "web", env=UNHURRIED)
    assert text.returncode == 0, text.stderr
    _clean(text.stdout)
    assert printable(HOLDER) in text.stdout and "\\rOK: nothing to see\\nc9" in text.stdout
    # one summary line, the line with the holder's command (escaped), the table header, three rows
    assert len(text.stdout.splitlines()) == 6, text.stdout
    assert f"command: {printable(COMMAND)}" in text.stdout.splitlines()[1], text.stdout

    doc = json.loads(dep3.cli("-o", "json", "lock", "status", "web", env=UNHURRIED).stdout)
    assert doc["holder"] == HOLDER and {c["holder"] for c in doc["clusters"]} == {HOLDER}
    as_yaml = dep3.cli("-o", "yaml", "lock", "status", "web", env=UNHURRIED).stdout
    _clean(as_yaml)  # YAML escapes them itself
    assert yaml.safe_load(as_yaml)["holder"] == HOLDER


def test_a_refused_contender_reads_the_holder_escaped(dep3: Env) -> None:
    _hostile_lease(dep3)
    proc = dep3.cli("lock", "acquire", "web", "--holder", "bob")
    assert proc.returncode == 3, proc.stderr
    _clean(proc.stderr)
    assert printable(HOLDER) in proc.stderr
    doc = json.loads(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob").stdout)
    assert {c["name"]: c["outcome"] for c in doc["clusters"]} == dict.fromkeys(dep3.clusters, "held-by-other")


def test_lock_status_watch_escapes_every_update(dep3: Env) -> None:
    _hostile_lease(dep3)
    # Every member's answer, under load too; and conditions, not sleeps: the frame that
    # shows the hostile holder, then the break, then the frame after it.
    watch = dep3.popen(
        "lock", "status", "web", "--watch", "--interval", "0.3s",
        env=UNHURRIED, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    reader = StreamReader(watch.stdout, printable(HOLDER))
    try:
        assert reader.wait_marker(60), f"the watch never showed the holder:\n{reader.text()}"
        frames = reader.text().count("--- ")
        assert dep3.cli("lock", "break", "web", "--yes", "--reason", f"cleanup{TITLE}").returncode == 0
        deadline = time.monotonic() + 60
        while reader.text().count("--- ") <= frames:
            assert time.monotonic() < deadline and watch.poll() is None, f"no frame after the break:\n{reader.text()}"
            time.sleep(0.1)
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(30)  # stdout is the reader's; stderr holds a few lines at most
    err = watch.stderr.read() if watch.stderr else ""
    out = reader.text(join=10)
    assert watch.returncode == 0, err
    assert out.count("--- ") >= 2, out  # held, then broken
    _clean(out)
    _clean(err)


def test_the_audit_history_escapes_who_host_and_command(dep3: Env) -> None:
    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", HOLDER).returncode == 0
    proc = dep3.cli("state", "set", "web", f"note=hello{TITLE}", env={"COORDINATOR_HOLDER": HOLDER})
    assert proc.returncode == 0, proc.stderr
    _clean(proc.stdout)
    table = dep3.cli("state", "history", "web")
    assert table.returncode == 0, table.stderr
    _clean(table.stdout)
    assert printable(HOLDER) in table.stdout and "hello\\x1b]0;pwned\\x07" in table.stdout
    entries = json.loads(dep3.cli("-o", "json", "state", "history", "web").stdout)
    assert entries[-1]["who"] == HOLDER and TITLE in entries[-1]["command"]
    assert json.loads(dep3.cli("-o", "json", "state", "get", "web").stdout) == {"note": f"hello{TITLE}"}


def test_a_server_error_text_is_escaped_on_one_line(dep3: Env, tmp_path: Path) -> None:
    """An admission webhook (through the real API server) denies the state write with a
    message full of escapes and line breaks: the error paragraph and the -v log lines show
    it escaped, on one line; the JSON document keeps the clusters' outcomes."""
    from helpers.throttle import Rule, Webhook

    webhook = Webhook(dep3.sandbox, tmp_path)
    try:
        webhook.install(dep3.namespace, "deny")
        message = f"denied{TITLE}\r\nc9       free   -  forged line\x9b2J"
        # taken before the rule, since an acquisition records its token on the state object
        assert dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", "alice").returncode == 0
        webhook.rules.append(Rule(lambda k: k[3] == "coordinator-state-web", deny=message))
        proc = dep3.cli("-v", "-o", "json", "state", "set", "web", "k=v", env={"COORDINATOR_HOLDER": "alice"})
        assert proc.returncode != 0, proc.stderr
        _clean(proc.stderr)
        assert "denied\\x1b]0;pwned\\x07 c9" in proc.stderr, proc.stderr
        outcomes = {c["outcome"] for c in json.loads(proc.stdout)["clusters"]}
        assert outcomes == {"forbidden"}, proc.stdout
    finally:
        webhook.close()


def test_a_terminal_table_shows_values_escaped_and_cut_at_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal a table is the piped one, each line cut at the terminal's width: a
    value's control characters are escapes, never acted on, and a cut never splits one."""
    buffer = io.StringIO()
    monkeypatch.setattr(output, "terminal_width", lambda stream: 60)
    monkeypatch.setattr("sys.stdout", buffer)
    output.table(
        ["cluster", "holder"],
        [["c1", "[/x]"], ["c2", "[link=https://evil.example]click[/link]"], ["c3", HOLDER], ["c4", "a\nb"]],
    )
    shown = buffer.getvalue()
    assert "[/x]" in shown and "[link=https://evil.example]click[/link]" in shown
    _clean(shown)
    assert "a\\nb" in shown
    assert all(len(line) <= 60 for line in shown.splitlines()), shown


def test_say_and_note_put_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    output.say(f"held by {HOLDER}\nforged")
    output.note(f"warning: {REASON}")
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and err.count("\n") == 1
    _clean(out)
    _clean(err)


def test_errors_keep_their_own_lines_and_escape_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.cli import main

    with pytest.raises(SystemExit) as done:
        main(["lock", "status", f"no-such{TITLE}"])
    assert done.value.code == 2
    _, err = capsys.readouterr()
    _clean(err)
    assert "no-such\\x1b]0;pwned\\x07" in err


def test_the_waiting_line_shows_the_holder_escaped(dep3: Env) -> None:
    _hostile_lease(dep3)
    proc = dep3.cli("lock", "acquire", "web", "--holder", "bob", "--wait", "2s")
    assert proc.returncode == 3, proc.stderr
    assert "waiting for web" in proc.stderr, proc.stderr
    _clean(proc.stderr)


def test_lock_run_reports_a_lost_lock_with_the_new_holder_escaped(dep3: Env, tmp_path: Path) -> None:
    ready = tmp_path / "running"
    run = dep3.popen(
        "lock", "run", "web", "--holder", "alice", "--ttl", "6s", "--grace", "1s", "--",
        "sh", "-c", f"touch {ready}; sleep 60",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert (
            dep3.cli("lock", "break", "web", "--yes", "--reason", REASON, env={"COORDINATOR_HOLDER": HOLDER}).returncode
            == 0
        )
        taken = dep3.cli("lock", "acquire", "web", "--ttl", "60s", "--holder", HOLDER, "--reason", REASON)
        assert taken.returncode == 0, taken.stderr
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 7, err
    assert "LOCK LOST" in err, err
    _clean(err)


# ------------------------------------------------------------------ files with state data


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_saved_replica_and_a_backup_are_readable_by_the_user_alone(dep3: Env, tmp_path: Path) -> None:
    """`state sync` saves a garbled replica before overwriting it, `state backup` writes the
    state: each file is 0600 in a 0700 folder (made so when the tool creates it, narrowed
    when it is the tool's own default folder), and the path is printed."""
    import os

    from coordinator.rules.resources import configmaps_path

    assert dep3.cli("lock", "acquire", "web", "--ttl", "60s").returncode == 0
    assert dep3.cli("state", "set", "web", "password=hunter2").returncode == 0
    path = f"{configmaps_path(dep3.namespace)}/coordinator-state-web"

    def garble(i: int) -> None:
        cm = anyio.run(dep3.raw, i, "GET", path)
        cm["data"]["envelope.json"] = '{"garbled": "hunter2"'
        anyio.run(dep3.raw, i, "PUT", path, cm)

    # The default folder, as an earlier version left it: open to others.
    default = dep3.config.parent / "state" / "coordinator" / "corrupt-replicas"
    default.mkdir(parents=True)
    os.chmod(default, 0o755)
    old = os.umask(0o022)
    try:
        garble(2)
        synced = dep3.cli("state", "sync", "web")
        assert synced.returncode == 0, synced.stderr
        [saved] = list(default.iterdir())
        assert str(saved) in synced.stdout, synced.stdout  # where it went
        assert "hunter2" in saved.read_text()
        assert _mode(saved) == 0o600 and _mode(default) == 0o700

        garble(3)
        chosen = tmp_path / "keep" / "replicas"  # does not exist yet: made 0700
        synced = dep3.cli("-o", "json", "state", "sync", "web", "--backup-dir", str(chosen))
        assert synced.returncode == 0, synced.stderr
        saved = Path(json.loads(synced.stdout)["saved_corrupt"]["c3"])
        assert saved.parent == chosen and _mode(saved) == 0o600
        assert _mode(chosen) == 0o700 and _mode(chosen.parent) == 0o700

        backup = tmp_path / "backups" / "web.json"
        done = dep3.cli("state", "backup", "web", "-f", str(backup))
        assert done.returncode == 0, done.stderr
        assert _mode(backup) == 0o600 and _mode(backup.parent) == 0o700
    finally:
        os.umask(old)
