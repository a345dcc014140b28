"""The shell of the GitHub action (action.yml) and of the GitLab component
(templates/coordinator.yml) passes shellcheck, each step as the CI system runs it (bash).
tests/lockrun/integration/test_ci_templates.py runs them on a sandbox."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def _shellcheck(tmp_path: Path, name: str, script: str) -> None:
    path = tmp_path / f"{name}.sh"
    path.write_text("#!/usr/bin/env bash\n" + script)
    done = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{name}:\n{done.stdout}"


def test_every_step_of_the_action_passes_shellcheck(tmp_path: Path) -> None:
    steps = yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"]
    assert steps
    for i, step in enumerate(steps):
        assert step["shell"] == "bash"
        # ${{ … }} is GitHub's, replaced before bash sees the script: a word here.
        _shellcheck(tmp_path, f"step{i}", re.sub(r"\$\{\{[^}]*\}\}", "x", step["run"]))


def test_the_component_scripts_pass_shellcheck(tmp_path: Path) -> None:
    _, body = yaml.safe_load_all((ROOT / "templates" / "coordinator.yml").read_text())
    ((_, job),) = body.items()
    declared = "".join(f"{name}=${{{name}:-}}; export {name}\n" for name in job["variables"])

    def text(lines: list[str]) -> str:
        # $[[ inputs.… ]] is GitLab's, replaced before the shell sees the script.
        return declared + "\n".join(re.sub(r"\$\[\[[^\]]*\]\]", "x", line) for line in lines) + "\n"

    _shellcheck(tmp_path, "script", text([*job["before_script"], *job["script"]]))
    _shellcheck(tmp_path, "after_script", text(job["after_script"]))
