"""The local Kind setup: cluster configs, the up/down scripts, and the CI matrix example.

Kind cannot run here, so the configs are decoded with Kind's own config types by
scripts/kindcheck (a small Go program built from the Go module proxy, unknown fields
refused), the workflow is checked by parsing it, and the scripts run against stand-ins for
``kind``, ``docker`` and ``coordinator`` that record what they were asked to do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
KIND_CONFIGS = sorted((ROOT / "kind-configs").glob("cluster-*.yaml"))
WORKFLOW = ROOT / "examples" / "github-actions-matrix.yml"
KIND_UP = ROOT / "scripts" / "kind-up.sh"
KIND_DOWN = ROOT / "scripts" / "kind-down.sh"
KINDCHECK_BUILD = ROOT / "scripts" / "build-kindcheck.sh"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# --- Kind cluster configs ---------------------------------------------------------------


@pytest.fixture(scope="module")
def kindcheck() -> Path:
    """The kindcheck binary: $COORDINATOR_KINDCHECK (set by scripts/setup.sh), else built
    on demand by scripts/build-kindcheck.sh, which caches it under ~/.cache/coordinator."""
    given = os.environ.get("COORDINATOR_KINDCHECK")
    if given:
        return Path(given)
    built = subprocess.run(
        ["bash", str(KINDCHECK_BUILD)], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert built.returncode == 0, f"scripts/build-kindcheck.sh failed (it needs Go):\n{built.stderr}"
    return Path(built.stdout.splitlines()[-1])


def _kindcheck(binary: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *map(str, paths)], capture_output=True, text=True, timeout=60, check=False)


def test_configs_decode_strictly_with_kinds_own_types(kindcheck: Path) -> None:
    done = _kindcheck(kindcheck, *KIND_CONFIGS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{p}: ok" for p in KIND_CONFIGS]


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("apiServerPort:", "apiServerPrt:", "apiServerPrt"),  # a typo Kind would refuse
        ("  - role: control-plane", "  - role: control-plane\n    extraPortMapping: []", "extraPortMapping"),
        ("name: coordinator-1", "name: coordinator-1\nfeatureGate: {}", "featureGate"),
    ],
    ids=["networking", "node", "top-level"],
)
def test_kindcheck_refuses_an_unknown_field_naming_file_and_field(
    kindcheck: Path, tmp_path: Path, old: str, new: str, field: str
) -> None:
    text = KIND_CONFIGS[0].read_text()
    assert old in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(old, new, 1))
    done = _kindcheck(kindcheck, KIND_CONFIGS[1], bad)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [f"{KIND_CONFIGS[1]}: ok"]
    assert done.stderr.startswith(f"{bad}: ")
    assert f'unknown field "{field}"' in done.stderr


def test_kindcheck_refuses_another_kind_or_version(kindcheck: Path, tmp_path: Path) -> None:
    bad = tmp_path / "old.yaml"
    bad.write_text(KIND_CONFIGS[0].read_text().replace("kind.x-k8s.io/v1alpha4", "kind.x-k8s.io/v1alpha3"))
    done = _kindcheck(kindcheck, bad)
    assert done.returncode == 1
    assert "v1alpha3" in done.stderr and str(bad) in done.stderr


def test_there_are_three_cluster_configs() -> None:
    assert [p.name for p in KIND_CONFIGS] == ["cluster-1.yaml", "cluster-2.yaml", "cluster-3.yaml"]


@pytest.mark.parametrize("path", KIND_CONFIGS, ids=lambda p: p.name)
def test_config_is_a_kind_v1alpha4_cluster_with_one_control_plane(path: Path) -> None:
    config = _load(path)
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert config["nodes"] == [{"role": "control-plane"}]
    assert config["networking"]["apiServerAddress"] == "127.0.0.1"
    assert path.read_text().startswith("#"), "each config starts with a comment header"


@pytest.mark.parametrize("path", KIND_CONFIGS, ids=lambda p: p.name)
def test_config_name_matches_its_file_and_the_scripts_naming(path: Path) -> None:
    number = re.fullmatch(r"cluster-(\d)\.yaml", path.name)
    assert number is not None
    # kind-up.sh connects context kind-coordinator-N, which kind derives from this name.
    assert _load(path)["name"] == f"coordinator-{number.group(1)}"


def test_configs_have_distinct_names_and_api_server_ports() -> None:
    configs = [_load(p) for p in KIND_CONFIGS]
    names = [c["name"] for c in configs]
    ports = [c["networking"]["apiServerPort"] for c in configs]
    assert len(set(names)) == len(names) == 3
    assert len(set(ports)) == len(ports) == 3
    for port in ports:
        assert isinstance(port, int) and 1024 < port < 65536


# --- The CI matrix example ---------------------------------------------------------------


def _workflow_jobs() -> dict[str, Any]:
    workflow = _load(WORKFLOW)
    # PyYAML (YAML 1.1) reads the key `on` as True; either way the triggers are there.
    assert "on" in workflow or True in workflow
    jobs: dict[str, Any] = workflow["jobs"]
    return jobs


def _matrix_jobs() -> list[dict[str, Any]]:
    jobs = [job for job in _workflow_jobs().values() if "matrix" in job.get("strategy", {})]
    assert jobs, "the example has a matrix job"
    return jobs


def _locked_step(job: dict[str, Any]) -> dict[str, Any]:
    """The job's one step that runs through the action at the repository's root."""
    [step] = [s for s in job["steps"] if re.fullmatch(r"[\w.-]+/coordinator@\S+", s.get("uses", ""))]
    return step


def test_workflow_gives_every_matrix_job_its_own_holder() -> None:
    for job in _matrix_jobs():
        holder = _locked_step(job)["with"]["holder"]
        assert "${{ github.run_id }}" in holder
        used = set(re.findall(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", holder))
        assert used, "the holder names the matrix entry, so jobs of one run differ"
        assert used <= set(job["strategy"]["matrix"]), "the holder uses real matrix keys"


def test_workflow_runs_the_deploy_through_the_action_with_its_inputs() -> None:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    for job in _matrix_jobs():
        given = _locked_step(job)["with"]
        assert set(given) <= set(action["inputs"]), "only inputs the action has"
        required = {k for k, v in action["inputs"].items() if v.get("required")}
        assert required <= set(given)
        assert given["reason"] and given["wait"]
        assert "coordinator state set" in given["run"]


def test_workflow_connects_the_kind_clusters() -> None:
    for job in _matrix_jobs():
        pairs = _locked_step(job)["with"]["clusters"].split()
        assert [p.split("=")[1] for p in pairs] == [f"kind-coordinator-{i}" for i in (1, 2, 3)]


# --- scripts/kind-up.sh and scripts/kind-down.sh -----------------------------------------

_STUB_KIND = """
import os, pathlib, re, sys
state = pathlib.Path(os.environ["STUB_STATE"])
with open(state / "calls.log", "a") as log:
    log.write("kind " + " ".join(sys.argv[1:]) + "\\n")
store = state / "kind-clusters"
names = store.read_text().split() if store.exists() else []
args = sys.argv[1:]
if args[:2] == ["get", "clusters"]:
    if names:
        print("\\n".join(names))
    else:
        print("No kind clusters found.", file=sys.stderr)
elif args[:2] == ["create", "cluster"]:
    text = pathlib.Path(args[args.index("--config") + 1]).read_text()
    name = re.search(r"^name:\\s*(\\S+)", text, re.M).group(1)
    if name in names:
        sys.exit(f"ERROR: node(s) already exist for a cluster with the name {name!r}")
    names.append(name)
elif args[:2] == ["delete", "cluster"]:
    name = args[args.index("--name") + 1]
    names = [n for n in names if n != name]
else:
    sys.exit(f"unexpected kind call: {args}")
store.write_text("\\n".join(names))
"""

_STUB_DOCKER = """
import os, sys
sys.exit(int(os.environ.get("STUB_DOCKER_RC", "0")))
"""

_STUB_COORDINATOR = """
import json, os, pathlib, sys
state = pathlib.Path(os.environ["STUB_STATE"])
with open(state / "calls.log", "a") as log:
    log.write("coordinator " + " ".join(sys.argv[1:]) + "\\n")
store = state / "connected.json"
connected = json.loads(store.read_text()) if store.exists() else {}
args = sys.argv[1:]
if args == ["-o", "json", "cluster", "list"]:
    print(json.dumps([{"name": n, "context": c} for n, c in connected.items()]))
elif args[:2] == ["cluster", "connect"]:
    if args[2] in connected:
        sys.exit(f"Error: cluster {args[2]!r} is already connected")
    connected[args[2]] = args[args.index("--context") + 1]
elif args[:2] == ["cluster", "disconnect"]:
    if args[2] not in connected:
        sys.exit(f"Error: unknown cluster {args[2]!r}")
    del connected[args[2]]
else:
    sys.exit(f"unexpected coordinator call: {args}")
store.write_text(json.dumps(connected))
"""


class Stubs:
    """A PATH holding only bash, a few coreutils, and stand-ins that log their calls."""

    def __init__(self, root: Path, *, kind: bool = True, docker: bool = True) -> None:
        self.state = root / "state"
        self.bin = root / "bin"
        self.state.mkdir(parents=True)
        self.bin.mkdir()
        for tool in ("bash", "dirname", "grep"):
            found = shutil.which(tool)
            assert found, f"{tool} is needed to run the scripts"
            (self.bin / tool).symlink_to(found)
        stubs = {"coordinator": _STUB_COORDINATOR}
        if kind:
            stubs["kind"] = _STUB_KIND
        if docker:
            stubs["docker"] = _STUB_DOCKER
        for name, body in stubs.items():
            path = self.bin / name
            path.write_text(f"#!{sys.executable}\n{textwrap.dedent(body)}")
            path.chmod(0o755)

    def run(self, script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {
            "PATH": str(self.bin),
            "HOME": str(self.state),
            "STUB_STATE": str(self.state),
            "KUBECONFIG": str(self.state / "no-kubeconfig"),
            **env,
        }
        return subprocess.run(
            [str(self.bin / "bash"), str(script), *args],
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def calls(self) -> list[str]:
        log = self.state / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def clusters(self) -> list[str]:
        store = self.state / "kind-clusters"
        return store.read_text().split() if store.exists() else []

    def connected(self) -> dict[str, str]:
        store = self.state / "connected.json"
        found: dict[str, str] = json.loads(store.read_text()) if store.exists() else {}
        return found


def _changes(calls: list[str]) -> list[str]:
    return [c for c in calls if re.match(r"(kind (create|delete)|coordinator cluster (dis)?connect)", c)]


def test_kind_up_creates_and_connects_the_requested_clusters(tmp_path: Path) -> None:
    stubs = Stubs(tmp_path)
    done = stubs.run(KIND_UP, "2")
    assert done.returncode == 0, done.stderr
    assert stubs.clusters() == ["coordinator-1", "coordinator-2"]
    assert stubs.connected() == {"kind-1": "kind-coordinator-1", "kind-2": "kind-coordinator-2"}
    creates = [c for c in stubs.calls() if c.startswith("kind create")]
    assert str(ROOT / "kind-configs" / "cluster-1.yaml") in creates[0]


def test_kind_up_is_idempotent(tmp_path: Path) -> None:
    stubs = Stubs(tmp_path)
    assert stubs.run(KIND_UP, "3").returncode == 0
    before = len(stubs.calls())
    again = stubs.run(KIND_UP, "3")
    assert again.returncode == 0, again.stderr
    assert _changes(stubs.calls()[before:]) == []
    assert len(stubs.connected()) == 3


def test_kind_up_reconnects_a_cluster_it_had_to_recreate(tmp_path: Path) -> None:
    stubs = Stubs(tmp_path)
    assert stubs.run(KIND_UP, "1").returncode == 0
    (stubs.state / "kind-clusters").write_text("")  # deleted behind the tool's back
    before = len(stubs.calls())
    again = stubs.run(KIND_UP, "1")
    assert again.returncode == 0, again.stderr
    assert [c.split(" --")[0] for c in _changes(stubs.calls()[before:])] == [
        "kind create cluster",
        "coordinator cluster disconnect kind-1",
        "coordinator cluster connect kind-1",
    ]


@pytest.mark.parametrize("count", ["0", "4", "two", "1 2"])
def test_kind_up_rejects_a_bad_count(tmp_path: Path, count: str) -> None:
    stubs = Stubs(tmp_path)
    done = stubs.run(KIND_UP, *count.split())
    assert done.returncode == 2
    assert "usage" in done.stderr
    assert _changes(stubs.calls()) == []


def test_kind_up_says_when_kind_is_missing(tmp_path: Path) -> None:
    done = Stubs(tmp_path, kind=False).run(KIND_UP, "1")
    assert done.returncode == 1
    assert "kind is not installed" in done.stderr


def test_kind_up_says_when_docker_is_missing_or_down(tmp_path: Path) -> None:
    missing = Stubs(tmp_path / "missing", docker=False).run(KIND_UP, "1")
    assert missing.returncode == 1
    assert "docker is not installed" in missing.stderr
    down = Stubs(tmp_path / "down").run(KIND_UP, "1", STUB_DOCKER_RC="1")
    assert down.returncode == 1
    assert "Docker daemon" in down.stderr


def test_kind_down_disconnects_and_deletes_everything_and_can_run_again(tmp_path: Path) -> None:
    stubs = Stubs(tmp_path)
    assert stubs.run(KIND_UP, "3").returncode == 0
    down = stubs.run(KIND_DOWN)
    assert down.returncode == 0, down.stderr
    assert stubs.clusters() == []
    assert stubs.connected() == {}
    again = stubs.run(KIND_DOWN)
    assert again.returncode == 0, again.stderr


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is not installed (scripts/setup.sh installs it)"
)
def test_scripts_pass_shellcheck() -> None:
    scripts = sorted([*(ROOT / "scripts").glob("*.sh"), *(ROOT / "scripts" / "lib").glob("*.sh")])
    assert KIND_UP in scripts and KIND_DOWN in scripts
    # -x follows `source scripts/setup.sh`, so the sourced file is checked in context too.
    done = subprocess.run(
        ["shellcheck", "-x", *map(str, scripts)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout


def test_scripts_are_executable() -> None:
    for script in (KIND_UP, KIND_DOWN):
        assert os.access(script, os.X_OK), f"chmod +x {script.relative_to(ROOT)}"


def test_workflow_lock_run_takes_the_cancellation_signal_and_a_short_ttl() -> None:
    """A short ``ttl`` bounds how long a job nobody can clean up after blocks the others;
    the action's ``grace`` stays under GitHub's 10 s from cancellation to kill, so that a
    cancelled step's `lock run` stops its command and releases the lock itself."""
    from coordinator.rules.durations import parse_duration

    action = yaml.safe_load((ROOT / "action.yml").read_text())
    for job in _matrix_jobs():
        given = _locked_step(job)["with"]
        assert parse_duration(given["ttl"]) <= 60, given
        grace = given.get("grace", action["inputs"]["grace"]["default"])
        assert parse_duration(grace) < 10, grace
