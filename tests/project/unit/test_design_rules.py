"""Rules of the package's design that review asked for and a test now holds: parts are
composed, not inherited from several of the project's own classes; a member change runs
one engine per command (its configurations are values, not engines of their own)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "coordinator"


def _classes(root: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """Class name -> (module path, base names) for every class under ``root``."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                found.setdefault(node.name, []).append((str(path.relative_to(root.parent)), bases))
    return found


def own_bases(classes: dict[str, list[tuple[str, list[str]]]]) -> dict[str, list[str]]:
    """Classes with more than one base defined in the package (``click.Group`` is
    click's, however the package names its own classes)."""
    many: dict[str, list[str]] = {}
    for name, where in classes.items():
        for path, bases in where:
            mine = [b for b in bases if "." not in b and b in classes]
            if len(mine) > 1:
                many[f"{path}:{name}"] = mine
    return many


def test_no_class_is_built_from_more_than_one_of_the_projects_own() -> None:
    assert own_bases(_classes(PACKAGE)) == {}


def test_the_check_sees_a_class_of_two_own_bases(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    source = "import click\nclass A: ...\nclass B: ...\nclass C(A, B): ...\nclass D(A, click.Group): ...\n"
    (pkg / "a.py").write_text(source)
    assert own_bases(_classes(pkg)) == {"pkg/a.py:C": ["A", "B"]}


def constructions(path: Path, names: tuple[str, ...] = ("LockEngine", "StateClient", "EngineCore")) -> list[str]:
    """Where ``path`` calls one of ``names`` (an engine made there)."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            callee = ast.unparse(node.func).split(".")[-1]
            if callee in names:
                calls.append(f"{path.name}:{node.lineno} {callee}")
    return calls


def test_a_member_change_makes_no_engine_of_its_own() -> None:
    # The command's engine (Coordinator.lock_engine) under each configuration of the
    # change (LockEngine.under), and the command's state client likewise.
    assert constructions(PACKAGE / "ops" / "reconfig.py") == []


def test_the_construction_check_sees_an_engine_made(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from x import LockEngine\nengine = LockEngine(a, b)\nother = engine.under(c)\n")
    assert constructions(module) == ["m.py:2 LockEngine"]
