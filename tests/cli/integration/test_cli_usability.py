"""The command line as on-call and CI use it: flags where kubectl users put them, refusals
a script can act on, a closed pipe as a normal ending, honest diagnoses in an outage, and
JSON with the fields a script needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from faults.kubectl import kubectl

from coordinator.cli import cli

pytestmark = pytest.mark.integration


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def _every_command_path(group: click.Group, ctx: click.Context, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += _every_command_path(command, ctx, (*prefix, name))
    return paths


# ------------------------------------------------------------------ global options


def test_every_command_lists_the_global_options_in_its_help() -> None:
    runner = CliRunner()
    paths = _every_command_path(cli, click.Context(cli))
    assert ("lock", "status") in paths and ("rbac", "print") in paths and len(paths) > 30
    for path in paths:
        out = runner.invoke(cli, [*path, "--help"], prog_name="coordinator")
        assert out.exit_code == 0, (path, out.output)
        assert "Global options" in out.output, path
        section = out.output.split("Global options", 1)[1]
        for flag in ("-o, --output", "--config", "-v, --verbose", "--log-format"):
            assert flag in section, (path, flag)
        if path != ("sandbox", "up"):  # its own --timeout is the wait for the clusters
            assert "--timeout" in section, path


def test_a_command_keeps_its_own_option_of_the_same_spelling() -> None:
    out = CliRunner().invoke(cli, ["sandbox", "up", "--help"], prog_name="coordinator")
    own, global_ = out.output.split("Global options", 1)
    assert "How long to wait for every cluster to be ready" in own
    assert "--timeout" not in global_


def test_lock_run_takes_global_options_only_before_its_name() -> None:
    """After `lock run`, -o or -v belong to the child's command line (curl -o, tar -v)."""
    out = CliRunner().invoke(cli, ["lock", "run", "--help"], prog_name="coordinator")
    assert "Global options (only before `run`" in out.output


def test_rbac_print_takes_n_for_the_namespace() -> None:
    out = CliRunner().invoke(
        cli, ["rbac", "print", "-n", "payments", "--deployment", "payments", "--user", "bob"], prog_name="coordinator"
    )
    assert out.exit_code == 0, out.output
    assert "namespace: payments" in out.output


def test_global_options_after_the_subcommand(dep3: Any) -> None:
    # The tool's own example in `lock status --help`.
    after = dep3.cli("lock", "status", "web", "-o", "json")
    assert after.returncode == 0, after.stderr
    assert _json(after)["deployment"] == "web"

    # Given on both sides: the one after the subcommand wins.
    both = dep3.cli("-o", "yaml", "lock", "status", "web", "-o", "json", "--timeout", "4s")
    assert both.returncode == 0, both.stderr
    assert _json(both)["quorum"] == 2

    # --config after the subcommand replaces the one from the environment.
    cfg = str(dep3.config)
    moved = dep3.cli(
        "deployment", "list", "-o", "json", "--config", cfg, env={"COORDINATOR_CONFIG": "/nonexistent/c.yaml"}
    )
    assert moved.returncode == 0, moved.stderr
    assert "web" in moved.stdout

    # -v and --log-format after the subcommand reach the logging.
    loud = dep3.cli("lock", "status", "web", "-v", "--log-format", "json")
    assert loud.returncode == 0, loud.stderr
    lines = [json.loads(line) for line in loud.stderr.splitlines() if line.startswith("{")]
    assert any(line.get("event") == "cluster outcome" for line in lines), loud.stderr

    bad = dep3.cli("lock", "status", "web", "--timeout", "soon")
    assert bad.returncode == 2 and "--timeout" in bad.stderr


# ------------------------------------------------------------------ lock break off a terminal


def test_lock_break_without_yes_off_a_terminal_refuses_with_exit_2(dep3: Any) -> None:
    took = dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice")
    assert took.returncode == 0, took.stderr
    cmd = [sys.executable, "-m", "coordinator", "lock", "break", "web"]
    proc = subprocess.run(cmd, env=dep3.environ(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "use --yes" in proc.stderr and "Aborted" not in proc.stderr
    still = _json(dep3.cli("lock", "status", "web", "-o", "json"))
    assert still["held_by_majority"] and still["holder"] == "alice"


# ------------------------------------------------------------------ a closed stdout


def _with_closed_stdout(env: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with a stdout whose reader is already gone (as after `| head -1`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "coordinator", *args],
            env=env.environ(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)


def test_a_closed_stdout_is_a_normal_ending(dep3: Any) -> None:
    for args in (
        ("lock", "status", "web"),
        ("lock", "status", "web", "-o", "json"),
        ("deployment", "list"),
        ("lock", "status", "--help"),
        ("--help",),
    ):
        proc = _with_closed_stdout(dep3, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert proc.stderr == "", (args, proc.stderr)

    # As people meet it: the first line, and the pipeline's status is the reader's and ours.
    shell = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -m coordinator lock status web | head -1"],
        env=dep3.environ(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shell.returncode == 0, shell.stderr
    assert "web is not held" in shell.stdout and shell.stderr == ""


# ------------------------------------------------------------------ the CI example


def test_the_ci_example_cleans_up_with_release_if_held() -> None:
    """The matrix example runs its step through the action, and the action's last step
    releases what a killed step left, whatever became of the steps before it."""
    import yaml

    root = Path(__file__).resolve().parents[3]
    workflow = yaml.safe_load((root / "examples" / "github-actions-matrix.yml").read_text())
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    assert any(str(s.get("uses", "")).endswith("/coordinator@v0.1.0") for s in steps), steps
    action = yaml.safe_load((root / "action.yml").read_text())
    cleanup = [s for s in action["runs"]["steps"] if "lock release" in s.get("run", "")]
    assert cleanup, "the action releases the lock in a cleanup step"
    assert all(s.get("if") == "always()" and "--if-held" in s["run"] for s in cleanup)


# ------------------------------------------------------------------ diagnoses in an outage


def test_two_of_three_paused_the_healthy_member_is_not_called_unreachable(dep3: Any) -> None:
    dep3.sandbox.pause(2)
    dep3.sandbox.pause(3)
    bad = dep3.cli("-o", "json", "--timeout", "2s", "lock", "acquire", "web", "--holder", "dave")
    assert bad.returncode == 4, bad.stderr
    rows = {c["name"]: c for c in _json(bad)["clusters"]}
    assert rows["c2"]["outcome"] == "unreachable" and rows["c3"]["outcome"] == "unreachable"
    # c1 answered: whatever became of the attempt there, it is not "unreachable".
    assert rows["c1"]["outcome"] != "unreachable", rows["c1"]
    assert "answered" in rows["c1"]["detail"] or rows["c1"]["outcome"] == "not-waited-for", rows["c1"]
    c1_line = next(line for line in bad.stderr.splitlines() if line.strip().startswith("c1:"))
    assert "unreachable" not in c1_line and "no answer within" not in c1_line, bad.stderr
    # The advice names only the silent clusters as unobservable.
    assert "Could not observe c2, c3;" in bad.stderr, bad.stderr


def test_a_deadline_tells_silence_from_waiting_on_others() -> None:
    """fan_out at its deadline: a cluster that answered every request it was sent is
    'answered ... waiting on the other clusters'; one that went silent on a request is
    unreachable; one nobody waited for is absent (rendered as not waited for)."""
    import anyio

    from coordinator.engine.fanout import ClusterResult, fan_out
    from coordinator.kube.client import request_events
    from coordinator.rules.outcome import Outcome

    async def operation(name: str) -> ClusterResult[None]:
        tell = request_events.get()
        assert tell is not None
        if name == "fast":
            return ClusterResult(name, Outcome.OK)
        tell("sent")
        if name in ("answered", "waiter"):
            tell("answered")
        if name == "then-silent":
            tell("answered")
            tell("sent")
        await anyio.sleep(10)
        return ClusterResult(name, Outcome.OK)

    async def go() -> None:
        out = await fan_out(["answered", "silent", "then-silent"], operation, timeout=0.3)
        assert out["answered"].outcome is Outcome.ERROR
        assert "answered in" in out["answered"].detail and "waiting on the other clusters" in out["answered"].detail
        assert out["silent"].outcome is Outcome.UNREACHABLE and out["silent"].detail == "no answer within 0.3s"
        assert out["then-silent"].outcome is Outcome.UNREACHABLE
        assert "then gave no answer to a later request" in out["then-silent"].detail

        decided = await fan_out(["fast", "waiter"], operation, timeout=5, until=lambda r: "fast" in r)
        assert set(decided) == {"fast"}  # the caller renders "waiter" as not waited for

    anyio.run(go)


def test_not_waited_for_is_rendered_as_such() -> None:
    from coordinator.cli.lock import acquire_document
    from coordinator.engine.fanout import NOT_WAITED_FOR, ClusterResult
    from coordinator.engine.lock.reports import acquire_report
    from coordinator.engine.lock.results import AcquireResult
    from coordinator.rules.outcome import Outcome

    result = AcquireResult(
        deployment="web",
        namespace="ns",
        lock_id="abc",
        holder="dave",
        fencing_token=None,
        acquired=False,
        quorum=2,
        results={"c1": ClusterResult("c1", Outcome.UNREACHABLE, detail="no answer within 2s")},
        members=["c1", "c2", "c3"],
        ttl_s=60,
    )
    rows = {c["name"]: c for c in acquire_document(result)["clusters"]}
    assert rows["c2"] == {"name": "c2", "outcome": "not-waited-for", "detail": NOT_WAITED_FOR}
    report = acquire_report(result)
    assert f"c2, c3: {NOT_WAITED_FOR}" in report and "c2: unreachable" not in report


# ------------------------------------------------------------------ JSON for scripts


def test_refusal_and_status_json_name_the_holder_in_fields(dep3: Any) -> None:
    import time

    took = dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice", "--reason", "release 1.2")
    assert took.returncode == 0, took.stderr
    alice_id = _json(took)["lock_id"]
    waiter = dep3.popen(
        "lock", "acquire", "web", "--holder", "carol", "--wait", "90s",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            st = _json(dep3.cli("lock", "status", "web", "-o", "json"))
            if st["next_in_line"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        # lock status: the documented keys, and the added ones
        for key in ("deployment", "namespace", "quorum", "holder", "lock_id", "fencing_token",
                    "held_by_majority", "expires_in_s", "clusters"):  # fmt: skip
            assert key in st, key
        assert st["holder"] == "alice" and st["reason"] == "release 1.2"
        assert st["host"] and isinstance(st["pid"], int)
        assert st["next_in_line"]["holder"] == "carol" and st["next_in_line"]["waiting_since"].endswith("Z")
        row = st["clusters"][0]
        assert row["reason"] == "release 1.2" and isinstance(row["pid"], int) and row["expires_in_s"] > 0

        refused = dep3.cli("lock", "acquire", "web", "--holder", "bob", "-o", "json")
        assert refused.returncode == 3, refused.stderr
        doc = _json(refused)
        assert doc["acquired"] is False and doc["holder"] == "bob"
        for c in doc["clusters"]:
            assert c["outcome"] == "held-by-other", c
            assert c["holder"] == "alice" and c["lock_id"] == alice_id, c
            assert c["reason"] == "release 1.2" and c["host"] == st["host"] and c["pid"] == st["pid"], c
            assert c["expires_in_s"] is not None and c["expires_in_s"] > 0, c
            assert c["next_in_line"] is not None and c["next_in_line"]["holder"] == "carol", c
            assert "alice" in c["detail"]  # the prose stays
    finally:
        waiter.terminate()
        waiter.wait(timeout=30)


# ------------------------------------------------------------------ readable to kubectl users


def _kubectl(env: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return kubectl(env.kubeconfig, 1, env.namespace, *args)


def test_kubectl_users_see_who_holds_the_lock_and_what_not_to_edit(dep3: Any) -> None:
    """`kubectl get lease` names the holder (not only an opaque id), a lease taken again
    carries no stale released-at stamp, and the state object says to use coordinator."""
    took = _json(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice@laptop"))
    shown = _kubectl(dep3, "get", "lease", "coordinator-lock-web")
    assert shown.returncode == 0, shown.stderr
    assert f"alice@laptop/{took['lock_id']}" in shown.stdout, shown.stdout
    assert dep3.cli("lock", "release", "web", "--holder", "alice@laptop").returncode == 0
    lease = json.loads(_kubectl(dep3, "get", "lease", "coordinator-lock-web", "-o", "json").stdout)
    assert "coordinator.io/released-at" in lease["metadata"]["annotations"]
    again = _json(dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob"))
    lease = json.loads(_kubectl(dep3, "get", "lease", "coordinator-lock-web", "-o", "json").stdout)
    assert "coordinator.io/released-at" not in lease["metadata"]["annotations"], lease["metadata"]["annotations"]
    assert lease["spec"]["holderIdentity"] == f"bob/{again['lock_id']}"
    state = json.loads(_kubectl(dep3, "get", "configmap", "coordinator-state-web", "-o", "json").stdout)
    note = state["metadata"]["annotations"]["coordinator.io/note"]
    assert "coordinator state" in note and "do not edit" in note.lower(), note
