"""`kubectl coordinator ...`: the CLI as a kubectl plugin, run through the real kubectl
against the sandbox, with kubectl's own flags as the plugin reads them (see
coordinator/cli/kubectl.py): --kubeconfig and --context MEMBER=CONTEXT say how the members
are reached for one command, -n checks a deployment's namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from coord_fixtures import Env

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent  # .venv/bin: the package's executables
LAUNCHER = Path(__file__).resolve().parents[3] / "deploy" / "krew" / "kubectl-coordinator"


def kubectl(env: Env, *args: str, path: Path = BIN) -> subprocess.CompletedProcess[str]:
    """kubectl, finding its plugins on a PATH that starts with ``path``."""
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.fail("kubectl is missing: scripts/setup.sh installs Debian's kubernetes-client")
    if not (path / "kubectl-coordinator").exists():
        pytest.fail(f"{path}/kubectl-coordinator is missing: run `source scripts/setup.sh` (pip install -e .)")
    environ = env.environ(PATH=f"{path}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="80")
    return subprocess.run([exe, *args], env=environ, capture_output=True, text=True, timeout=120, check=False)


def _one_paragraph(stderr: str) -> str:
    assert stderr.startswith("Error: ") and "Traceback" not in stderr, stderr
    return " ".join(stderr.split())


def test_kubectl_runs_the_plugin_with_kubectls_namespace_flag(dep3: Env) -> None:
    done = kubectl(dep3, "coordinator", "lock", "status", "web", "-n", dep3.namespace, "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["namespace"] == dep3.namespace
    both = kubectl(dep3, "coordinator", "lock", "status", "web", f"--namespace={dep3.namespace}")
    assert both.returncode == 0, both.stderr
    assert both.stdout.startswith("web is not held")

    # Where kubectl users put it: before the command (lock status's own -n, moved after it).
    before = kubectl(dep3, "coordinator", f"-n={dep3.namespace}", "lock", "status", "web")
    assert before.returncode == 0, before.stderr
    # An option's value is never taken for kubectl's flag.
    reason = kubectl(dep3, "coordinator", "lock", "acquire", "web", "--reason", "-nightly", "-o", "json")
    assert reason.returncode == 0, reason.stderr
    assert kubectl(dep3, "coordinator", "lock", "release", "web").returncode == 0

    elsewhere = kubectl(dep3, "coordinator", "state", "get", "web", "-n", "other")
    assert elsewhere.returncode == 2
    assert f"Deployment 'web' is in namespace '{dep3.namespace}', not 'other'" in _one_paragraph(elsewhere.stderr)
    unnamespaced = kubectl(dep3, "coordinator", "cluster", "list", "-n", dep3.namespace)
    assert unnamespaced.returncode == 2
    assert "does not apply to `cluster list`" in _one_paragraph(unnamespaced.stderr)
    # The plugin's usage lines name it as kubectl users type it.
    helped = kubectl(dep3, "coordinator", "lock", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: kubectl coordinator lock ")


def test_lock_run_through_kubectl_takes_kubectls_flags_before_the_double_dash(dep3: Env) -> None:
    script = 'echo "$COORDINATOR_HOLDER $COORDINATOR_CLUSTERS -n $1"'
    done = kubectl(
        dep3, "coordinator", "lock", "run", "web", "-n", dep3.namespace, "--holder", "kc",
        "--", "sh", "-c", script, "sh", "kept",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["kc c1,c2,c3 -n kept"]


def test_context_names_a_member_and_its_context_and_is_proven(dep3: Env) -> None:
    # c1 through another context of the same cluster (a bearer token): the same answers.
    other = kubectl(dep3, "coordinator", "lock", "status", "web", "--context", "c1=sandbox-1-token", "-o", "json")
    assert other.returncode == 0, other.stderr
    assert [c["status"] for c in json.loads(other.stdout)["clusters"]] == ["free"] * 3
    # c1 through a context that leads to another cluster: refused, never used.
    wrong = kubectl(dep3, "coordinator", "lock", "acquire", "web", "--context=c1=sandbox-2", "--holder", "x")
    assert wrong.returncode == 5, wrong.stderr
    assert "context 'sandbox-2' now leads to a cluster" in _one_paragraph(wrong.stderr)
    # One context for a command on every member makes no sense: said so.
    bare = kubectl(dep3, "coordinator", "lock", "status", "web", "--context", "sandbox-1")
    assert bare.returncode == 2
    assert "give --context MEMBER=CONTEXT" in _one_paragraph(bare.stderr)
    unknown = kubectl(dep3, "coordinator", "lock", "status", "web", "--context", "c9=sandbox-1")
    assert unknown.returncode == 2
    assert "Unknown cluster 'c9'" in _one_paragraph(unknown.stderr)


def test_kubeconfig_reaches_every_member_through_another_file(dep3: Env, tmp_path: Path) -> None:
    config = yaml.safe_load(Path(dep3.kubeconfig).read_text())
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(config))
    done = kubectl(dep3, "coordinator", "lock", "status", "web", "--kubeconfig", str(same), "-o", "json")
    assert done.returncode == 0, done.stderr
    # The file is really what is read: in this one, context sandbox-2 leads to cluster 1.
    contexts = {c["name"]: c for c in config["contexts"]}
    contexts["sandbox-2"]["context"] = dict(contexts["sandbox-1"]["context"])
    swapped = tmp_path / "swapped.yaml"
    swapped.write_text(yaml.safe_dump(config))
    refused = kubectl(dep3, "coordinator", "lock", "acquire", "web", f"--kubeconfig={swapped}", "--holder", "x")
    assert refused.returncode == 5, refused.stderr
    assert "'c2'" in refused.stderr
    missing = kubectl(dep3, "coordinator", "lock", "status", "web", "--kubeconfig", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert "no such file" in _one_paragraph(missing.stderr)
    # cluster connect has --context and --kubeconfig of its own: they are its (it reached
    # sandbox-3 through the file, and found it connected already as c3).
    connected = kubectl(
        dep3, "coordinator", "cluster", "connect", "again", "--context", "sandbox-3", "--kubeconfig", str(same)
    )
    assert connected.returncode == 2
    assert "Context 'sandbox-3' leads to the same cluster as 'c3'" in _one_paragraph(connected.stderr)


def test_the_krew_launcher_runs_the_plugin_it_installed(dep3: Env, tmp_path: Path) -> None:
    """deploy/krew/kubectl-coordinator as krew links it into ~/.krew/bin: through the link,
    it runs the virtualenv beside its real path (made here as its first run would)."""
    store = tmp_path / "store" / "coordinator" / "v0.1.0"
    (store / "venv" / "bin").mkdir(parents=True)
    shutil.copy2(LAUNCHER, store / "kubectl-coordinator")
    (store / "venv" / "bin" / "kubectl-coordinator").symlink_to(BIN / "kubectl-coordinator")
    (store / "venv" / ".installed").touch()
    linked = tmp_path / "krew-bin"
    linked.mkdir()
    (linked / "kubectl-coordinator").symlink_to(store / "kubectl-coordinator")
    done = kubectl(dep3, "coordinator", "lock", "status", "web", "-n", dep3.namespace, path=linked)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("web is not held")
