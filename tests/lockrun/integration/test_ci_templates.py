"""The GitHub composite action (action.yml) and the GitLab CI/CD component
(templates/coordinator.yml), run here as the CI systems run them: each file is read with a
YAML parser and its steps (its script) run in order, in bash, with the environment GitHub
or GitLab gives a job (GITHUB_*/CI_* variables, $GITHUB_STEP_SUMMARY, $GITHUB_ENV,
$GITHUB_PATH, $GITHUB_OUTPUT), against the sandbox. Two jobs at once; one GitHub job is
cancelled as GitHub cancels (SIGINT to the step, SIGTERM 7.5 s later, then the process tree
killed 2.5 s after that)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from coord_fixtures import UNHURRIED, Env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent  # .venv/bin: coordinator, for a job that does not install it
WAIT_S = 600  # for a condition, never a pause: a job's pip install beside another full run took over 180 s


def _until(what: str, check: Any, jobs: Any = (), timeout: float = WAIT_S) -> None:
    """Wait for ``check()``; fail at once, with its log, if one of ``jobs`` ended meanwhile."""
    deadline = time.monotonic() + timeout
    while not check():
        for job in jobs:
            assert job.thread.is_alive(), f"{job.name} ended early:\n{job.text()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it by parent, as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def _job_environ(env: Env, extra: dict[str, str]) -> dict[str, str]:
    """The runner's environment: no config of the test's (the job makes its own), the
    sandbox's kubeconfig only through the job's input, coordinator not on PATH."""
    base = env.environ(**UNHURRIED)
    for name in ("COORDINATOR_CONFIG", "KUBECONFIG", "COORDINATOR_HOLDER", "COORDINATOR_LOCK_ID"):
        base.pop(name, None)
    base["PATH"] = os.pathsep.join(p for p in base.get("PATH", "").split(os.pathsep) if Path(p) != BIN)
    base.update(extra)
    return base


# ------------------------------------------------------------------ GitHub Actions


_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class GitHubJob:
    """One job whose only step is `uses: ./` (this repository's action.yml), run as the
    runner runs a composite action's steps: one bash per step (`bash --noprofile --norc
    -eo pipefail FILE`), GITHUB_ENV and GITHUB_PATH carried to the next steps, a step
    without `if:` skipped after a failure or cancellation, `always()` run anyway."""

    name: str
    env: Env
    work: Path
    inputs: dict[str, str]
    github: dict[str, str]
    path_first: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    current: subprocess.Popen[str] | None = None
    cancelled: bool = False
    log: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        action = yaml.safe_load((ROOT / "action.yml").read_text())
        assert action["runs"]["using"] == "composite"
        self.steps: list[dict[str, Any]] = action["runs"]["steps"]
        given = {k: str(v.get("default", "")) for k, v in action["inputs"].items()}
        unknown = set(self.inputs) - set(given)
        assert not unknown, f"not inputs of action.yml: {unknown}"
        missing = [k for k, v in action["inputs"].items() if v.get("required") and k not in self.inputs]
        assert not missing, f"required inputs not given: {missing}"
        self.values = {**given, **self.inputs}
        self.temp = self.work / "runner-temp"
        self.temp.mkdir(parents=True)
        self.files = {n: self.work / n for n in ("summary.md", "github_env", "github_path")}
        for f in self.files.values():
            f.touch()

    def expression(self, text: str) -> str:
        """What GitHub makes of the expressions the action uses (any other fails the test)."""

        def one(m: re.Match[str]) -> str:
            expr = m.group(1)
            if expr.startswith("inputs."):
                return self.values[expr.removeprefix("inputs.")]
            if (s := re.fullmatch(r"steps\.([\w-]+)\.outcome", expr)) is not None:
                return self.outcomes.get(s.group(1), "")
            raise AssertionError(f"an expression this test does not know: {expr}")

        return _EXPR.sub(one, text)

    def wanted(self, step: dict[str, Any], failed: bool) -> bool:
        cond = step.get("if")
        if cond is None:
            return not failed and not self.cancelled
        if cond == "always()":
            return True
        if (m := re.fullmatch(r"inputs\.([\w-]+) == '([^']*)'", cond)) is not None:
            return not failed and not self.cancelled and self.values[m.group(1)] == m.group(2)
        raise AssertionError(f"an if: this test does not know: {cond}")

    def environ(self, step: dict[str, Any], output: Path) -> dict[str, str]:
        environ = _job_environ(
            self.env,
            {
                "CI": "true",
                "GITHUB_ACTIONS": "true",
                "GITHUB_ACTION_PATH": str(ROOT),
                "GITHUB_WORKSPACE": str(self.work),
                "GITHUB_SERVER_URL": "https://github.com",
                "GITHUB_WORKFLOW": "deploy",
                "RUNNER_TEMP": str(self.temp),
                "GITHUB_STEP_SUMMARY": str(self.files["summary.md"]),
                "GITHUB_ENV": str(self.files["github_env"]),
                "GITHUB_PATH": str(self.files["github_path"]),
                "GITHUB_OUTPUT": str(output),
                **self.github,
            },
        )
        # What earlier steps wrote to GITHUB_ENV (NAME=value lines) and GITHUB_PATH.
        for line in self.files["github_env"].read_text().splitlines():
            name, _, value = line.partition("=")
            environ[name] = value
        paths = [*reversed(self.files["github_path"].read_text().splitlines()), *self.path_first]
        environ["PATH"] = os.pathsep.join([*paths, environ["PATH"]])
        environ.update({k: self.expression(str(v)) for k, v in (step.get("env") or {}).items()})
        return environ

    def run(self) -> None:
        failed = False
        for i, step in enumerate(self.steps):
            sid = step.get("id", f"step{i}")
            if not self.wanted(step, failed):
                self.outcomes[sid] = "skipped"
                continue
            assert step["shell"] == "bash"
            script = self.work / f"step{i}.sh"
            script.write_text(self.expression(step["run"]))
            output = self.work / f"output{i}"
            output.touch()
            with open(self.work / f"step{i}.log", "w") as log:
                self.current = subprocess.Popen(
                    ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                    env=self.environ(step, output),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                    cwd=self.work,
                )
                code = self.current.wait()
            self.log.append(f"{step['name']}: exit {code}")
            if self.cancelled and code != 0:
                self.outcomes[sid] = "cancelled"
            else:
                self.outcomes[sid] = "success" if code == 0 else "failure"
            failed = failed or code != 0
            for line in output.read_text().splitlines():
                k, _, v = line.partition("=")
                self.outputs[k] = v

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), f"{self.name} did not end: {self.log}"

    def step_log(self, index: int) -> str:
        path = self.work / f"step{index}.log"
        return path.read_text() if path.exists() else ""

    def cancel(self) -> subprocess.Popen[str]:
        """As GitHub cancels a running step: SIGINT to its process; SIGTERM 7.5 s later if it
        still runs; 2.5 s after that, SIGKILL to its process tree. Returns the step's process
        (the job goes on to its always() steps meanwhile)."""
        proc = self.current
        assert proc is not None and proc.poll() is None
        self.cancelled = True
        proc.send_signal(signal.SIGINT)
        for sig, after in ((signal.SIGTERM, 7.5), (signal.SIGKILL, 2.5)):
            try:
                proc.wait(after)
                return proc
            except subprocess.TimeoutExpired:
                pass
            targets = [proc.pid] if sig == signal.SIGTERM else _descendants(proc.pid)
            for pid in targets:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        proc.wait(WAIT_S)  # killed: gone once the kernel has ended it
        return proc

    def summary(self) -> str:
        return self.files["summary.md"].read_text()

    def text(self) -> str:
        return "\n".join(f"{line}\n{self.step_log(i)}" for i, line in enumerate([*self.log, "(running)"]))


def _row(summary: str, name: str) -> str:
    m = re.search(rf"^\| {re.escape(name)} \| (.*) \|$", summary, re.M)
    assert m is not None, f"no {name!r} row in the summary:\n{summary}"
    return m.group(1)


def _github_job(env: Env, work: Path, run_id: str, run: str, **inputs: str) -> GitHubJob:
    """A job of run ``run_id`` of acme/payments on runner ``runner-RUN_ID``, through the action."""
    clusters = "\n".join(f"{name}=sandbox-{i}" for i, name in enumerate(env.clusters, start=1))
    return GitHubJob(
        run_id,
        env,
        work / run_id,
        inputs={
            "deployment": "web",
            "namespace": env.namespace,
            "clusters": clusters,
            "kubeconfig": Path(env.kubeconfig).read_text(),
            "run": run,
            **inputs,
        },
        github={
            "GITHUB_REPOSITORY": "acme/payments",
            "GITHUB_RUN_ID": run_id,
            "GITHUB_RUN_ATTEMPT": "1",
            "GITHUB_JOB": "deploy",
            "RUNNER_NAME": f"runner-{run_id}",
        },
        path_first=[] if inputs.get("install", "true") == "true" else [str(BIN)],
    )


def test_github_action_a_cancelled_step_stops_its_command_and_releases(dep3: Env, tmp_path: Path) -> None:
    """With the action's own grace (under GitHub's 10 s), SIGINT reaches the command's group
    through the step's shell, `lock run` releases the lock, and the summary says so."""
    marks = tmp_path / "marks"
    marks.mkdir()
    a = _github_job(
        dep3,
        tmp_path,
        "2001",
        # Notes the SIGINT, then dies of it, as a command that does not handle it would.
        f"trap 'touch {marks}/a-got-int; trap - INT; kill -INT $$' INT\n"
        f"touch {marks}/a-inside\nwhile :; do sleep 0.2; done\n",
        install="false",
    )
    b = _github_job(dep3, tmp_path, "2002", f'echo "$COORDINATOR_FENCING_TOKEN" > {marks}/b-token\n', install="false")
    c = _github_job(dep3, tmp_path, "2003", f"touch {marks}/c-inside\n", install="false")
    a.start()
    _until("job a inside", lambda: (marks / "a-inside").exists(), [a])
    b.start()
    c.start()
    _until("jobs b and c waiting", lambda: all("waiting for web" in j.step_log(2) for j in (b, c)), [a, b, c])
    # Cancelled while it waits in line: it never enters, and says so.
    c.cancel()
    c.join()
    assert not (marks / "c-inside").exists()
    assert _row(c.summary(), "Outcome") == "stopped by signal 2 while waiting for the lock (exit 130)", c.text()
    assert _row(c.summary(), "Fencing token") == "-"
    a.cancel()
    a.join()
    b.join()
    assert (marks / "a-got-int").exists(), a.text()
    assert a.outcomes["run"] == "cancelled" and a.outputs["exit-code"] == "130", a.text()
    assert _row(a.summary(), "Outcome") == "stopped by signal 2 (exit 130); the lock was released"
    assert _row(a.summary(), "Holder") == "acme/payments run:2001.1 job:deploy runner:runner-2001"
    assert int((marks / "b-token").read_text()) > int(_row(a.summary(), "Fencing token"))
    assert _row(b.summary(), "Outcome") == "succeeded (exit 0)"


def test_github_action_two_jobs_one_cancelled_as_github_cancels(dep3: Env, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    kubeconfig = Path(dep3.kubeconfig).read_text()
    clusters = "\n".join(f"{name}=sandbox-{i}" for i, name in enumerate(dep3.clusters, start=1))
    # Job A's step: a deploy that takes no notice of SIGINT or SIGTERM, and a rollback it
    # started that has left the process tree (its parent exited) but not the process group,
    # and runs until the test lets it end: only the group tells that it is still there.
    a_run = (
        f'echo "$COORDINATOR_FENCING_TOKEN" > {marks}/a-token\n'
        "trap '' INT TERM\n"
        f"( ( trap '' INT TERM; touch {marks}/rollback-running\n"
        f"    while [ ! -e {marks}/rollback-may-end ]; do sleep 0.1; done\n"
        f"    touch {marks}/rollback-done ) & )\n"
        f"touch {marks}/a-inside\n"
        "while :; do sleep 0.2; done\n"
    )
    a = GitHubJob(
        "a",
        dep3,
        tmp_path / "a",
        inputs={
            "deployment": "web",
            "namespace": dep3.namespace,
            "clusters": clusters,
            "kubeconfig": kubeconfig,
            "run": a_run,
            "grace": "30s",  # longer than GitHub's 10 s: the runner's SIGKILL comes first
            "reason": "job a",
        },
        github={
            "GITHUB_REPOSITORY": "acme/payments",
            "GITHUB_RUN_ID": "1001",
            "GITHUB_RUN_ATTEMPT": "1",
            "GITHUB_JOB": "deploy",
            "RUNNER_NAME": "runner-a",
        },
    )
    b_run = (
        f'echo "$COORDINATOR_FENCING_TOKEN" > {marks}/b-token\n'
        f"if [ -e {marks}/rollback-done ]; then echo after > {marks}/b-saw; else echo during > {marks}/b-saw; fi\n"
    )
    b = GitHubJob(
        "b",
        dep3,
        tmp_path / "b",
        inputs={
            "deployment": "web",
            "namespace": dep3.namespace,
            "clusters": clusters,
            "kubeconfig": kubeconfig,
            "run": b_run,
            "install": "false",  # the runner has it: one install (job a's) is enough to test
        },
        github={
            "GITHUB_REPOSITORY": "acme/payments",
            "GITHUB_RUN_ID": "1002",
            "GITHUB_RUN_ATTEMPT": "2",
            "GITHUB_JOB": "deploy",
            "RUNNER_NAME": "runner-b",
        },
        path_first=[str(BIN)],
    )
    a.start()
    _until("job a inside", lambda: (marks / "a-inside").exists() and (marks / "rollback-running").exists(), [a])
    b.start()
    # b waits in line: its step says so while a holds the lock.
    _until("job b waiting for the lock", lambda: "waiting for web" in b.step_log(2), [a, b])
    assert not (marks / "b-token").exists()

    step = a.cancel()  # SIGINT, SIGTERM, then the tree: job a's step process is gone
    assert step.poll() is not None
    # The step is gone, its rollback still runs in the group, and job a's cleanup waits
    # for it; then b enters, and sees that the rollback had ended.
    _until("job a's cleanup step", lambda: len(a.log) == 3)
    assert not (marks / "b-token").exists(), "job b entered while job a's process group still ran"
    (marks / "rollback-may-end").touch()
    a.join()
    b.join()

    assert (marks / "b-saw").read_text().strip() == "after", "job b entered before job a's group was gone"
    a_token, b_token = int((marks / "a-token").read_text()), int((marks / "b-token").read_text())
    assert b_token > a_token

    # Job a: cancelled in its step; its cleanup released the lock once the group had ended.
    assert a.outcomes["run"] == "cancelled" and a.outcomes["summary"] == "success", a.log
    summary_a = a.summary()
    holder_a = "acme/payments run:1001.1 job:deploy runner:runner-a"
    assert _row(summary_a, "Holder") == holder_a
    assert _row(summary_a, "Fencing token") == str(a_token)
    assert "released after the command's processes ended" in _row(summary_a, "Outcome")
    assert float(_row(summary_a, "Waited for the lock").removesuffix(" s")) >= 0
    # Job b: waited in line, then ran.
    assert b.outcomes["run"] == "success" and b.outcomes.get("step0") == "skipped", b.log
    summary_b = b.summary()
    assert _row(summary_b, "Holder") == "acme/payments run:1002.2 job:deploy runner:runner-b"
    assert _row(summary_b, "Fencing token") == str(b_token)
    assert _row(summary_b, "Outcome") == "succeeded (exit 0)"
    assert float(_row(summary_b, "Waited for the lock").removesuffix(" s")) > 1
    assert b.outputs["fencing-token"] == str(b_token) and b.outputs["exit-code"] == "0"
    assert dep3.cli("lock", "status", "web").stdout.startswith("web is not held")


# ------------------------------------------------------------------ GitLab CI/CD


_INPUT = re.compile(r"\$\[\[\s*inputs\.([\w-]+)\s*\]\]")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _interpolate(node: Any, inputs: dict[str, str]) -> Any:
    """``$[[ inputs.NAME ]]`` replaced in every string of the loaded document, as GitLab
    interpolates a component's inputs (an unknown name fails the test)."""
    if isinstance(node, dict):
        return {_interpolate(k, inputs): _interpolate(v, inputs) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, inputs) for v in node]
    if isinstance(node, str):
        return _INPUT.sub(lambda m: inputs[m.group(1)], node)
    return node


@dataclass
class GitLabJob:
    """The job the component adds (`include: component:` with ``inputs``), run as a shell
    runner runs it: its variables expanded (unless ``expand: false``), before_script and
    script in one bash (`set -eo pipefail`), then after_script in another."""

    env: Env
    work: Path
    inputs: dict[str, str]
    ci: dict[str, str]
    log: Path = field(init=False)
    code: int | None = None
    after_code: int | None = None
    thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        header, body = yaml.safe_load_all((ROOT / "templates" / "coordinator.yml").read_text())
        spec = header["spec"]["inputs"]
        unknown = set(self.inputs) - set(spec)
        assert not unknown, f"not inputs of the component: {unknown}"
        missing = [k for k, v in spec.items() if "default" not in v and k not in self.inputs]
        assert not missing, f"inputs without a default not given: {missing}"
        values = {k: str(v.get("default", "")) for k, v in spec.items()} | self.inputs
        ((self.name, self.job),) = _interpolate(body, values).items()
        self.work.mkdir(parents=True)
        self.log = self.work / "job.log"

    def environ(self) -> dict[str, str]:
        environ = _job_environ(
            self.env,
            {"CI": "true", "GITLAB_CI": "true", "CI_PROJECT_DIR": str(self.work), "PATH": f"{BIN}{os.pathsep}"}
            | self.ci,
        )
        environ["PATH"] += os.environ.get("PATH", "")
        for name, value in self.job.get("variables", {}).items():
            if isinstance(value, dict):
                text, expand = str(value["value"]), value.get("expand", True)
            else:
                text, expand = str(value), True
            environ[name] = _VAR.sub(lambda m: environ.get(m.group(1) or m.group(2), ""), text) if expand else text
        return environ

    def _bash(self, lines: list[str], log: Any) -> int:
        script = "set -eo pipefail\n" + "\n".join(lines) + "\n"
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", script],
            env=self.environ(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.work,
            check=False,
        ).returncode

    def run(self) -> None:
        with open(self.log, "w") as log:
            self.code = self._bash([*self.job["before_script"], *self.job["script"]], log)
        with open(self.work / "after.log", "w") as log:
            self.after_code = self._bash(self.job["after_script"], log)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), f"{self.name} did not end"

    def text(self) -> str:
        after = self.work / "after.log"
        return self.log.read_text() + (after.read_text() if after.exists() else "")


def test_gitlab_component_two_jobs_take_turns(dep3: Env, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    kubeconfig = tmp_path / "kubeconfig-file"  # a CI/CD variable of type File: its path
    kubeconfig.write_text(Path(dep3.kubeconfig).read_text())
    clusters = " ".join(f"{name}=sandbox-{i}" for i, name in enumerate(dep3.clusters, start=1))
    # Inside the lock: a directory only one job can make; each leaves once the test lets it.
    step = (
        f'mkdir {marks}/inside && echo "$COORDINATOR_HOLDER" > {marks}/in-$CI_JOB_ID\n'
        f"while [ ! -e {marks}/go-$CI_JOB_ID ]; do sleep 0.1; done\n"
        f"rmdir {marks}/inside\n"
    )
    jobs = {
        job_id: GitLabJob(
            dep3,
            tmp_path / job_id,
            inputs={
                "deployment": "web",
                "namespace": dep3.namespace,
                "clusters": clusters,
                "kubeconfig": "$KUBECONFIG_FILE",
                "run": step,
                "job-name": "deploy",
                # One job installs from the repository (the component's project), as a pip
                # requirement; the other's image has coordinator.
                "source": str(ROOT) if job_id == "7001" else "",
            },
            ci={
                "CI_JOB_ID": job_id,
                "CI_PROJECT_PATH": "acme/payments",
                "CI_PIPELINE_URL": f"https://gitlab.example.com/acme/payments/-/pipelines/{job_id}",
                "KUBECONFIG_FILE": str(kubeconfig),
            },
        )
        for job_id in ("7001", "7002")
    }
    assert {j.name for j in jobs.values()} == {"deploy"}
    for job in jobs.values():
        job.start()
    _until("a job inside", lambda: any((marks / f"in-{i}").exists() for i in jobs), jobs.values())
    first = next(i for i in jobs if (marks / f"in-{i}").exists())
    second = next(i for i in jobs if i != first)
    _until("the other job waiting", lambda: "waiting for web" in jobs[second].log.read_text(), jobs.values())
    assert not (marks / f"in-{second}").exists()
    (marks / f"go-{first}").touch()
    _until("the second job inside", lambda: (marks / f"in-{second}").exists(), [jobs[second]])
    (marks / f"go-{second}").touch()
    for job in jobs.values():
        job.join()
        assert job.code == 0, job.log.read_text()
        assert job.after_code == 0, (job.work / "after.log").read_text()
    # Each job held the lock as itself (the holder from CI_JOB_ID), and never both at once
    # (`mkdir inside` would have failed the second).
    for i in jobs:
        assert (marks / f"in-{i}").read_text().strip() == f"acme/payments ci-job:{i}"
    assert (jobs["7001"].work / ".coordinator" / "venv" / "bin" / "coordinator").exists()
    assert dep3.cli("lock", "status", "web").stdout.startswith("web is not held")
