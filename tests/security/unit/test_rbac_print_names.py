"""`rbac print` with odd subject names: refused where YAML or a terminal would misread them, exact otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.cli import run_cli
from helpers.hostile import clean

integration = pytest.mark.integration


@pytest.mark.parametrize("name", ["a\u2028kind: Secret", "a\x85b", "a\u202eb", "a\x1b[2Jb", "a\u200bb"])
def test_rbac_print_refuses_subject_names_that_could_break_its_yaml(tmp_path: Path, name: str) -> None:
    """Held: a subject name goes into a YAML comment line of the header; anything that
    YAML or a terminal takes for a line break or a control is refused (exit 2)."""
    for flag in ("--user", "--group"):
        proc = run_cli(tmp_path, "rbac", "print", "-n", "ns", "--deployment", "web", flag, name)
        assert proc.returncode == 2, proc.stdout
        clean(proc.stdout)


@pytest.mark.parametrize("name", ["a: b # c", "- kind: Secret", "'x'", "system:serviceaccount:ns:sa", "É"])
def test_rbac_print_of_odd_printable_names_is_exactly_the_objects(tmp_path: Path, name: str) -> None:
    """Held: printable but YAML-looking names are quoted, and the stream parses to the
    objects of `-o json`, every rule by name as for a plain name."""
    args = ["rbac", "print", "-n", "ns", "--deployment", "web", "--user", name, "--fleet"]
    text = run_cli(tmp_path, *args)
    assert text.returncode == 0, text.stderr
    as_json = run_cli(tmp_path, "-o", "json", *args)
    objects = [o for o in yaml.safe_load_all(text.stdout) if o]
    assert objects == json.loads(as_json.stdout)["items"]
    for binding in (o for o in objects if o["kind"].endswith("Binding")):
        assert binding["subjects"] == [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name}]
