"""What the wheel holds: the coordinator package, its type marker, and no test tools.

Read from pyproject.toml's package discovery and the source tree, so no wheel is built (the
build backend pyproject.toml asks for is not necessarily installed where the unit tests
run; scripts/check-wheel.sh builds one). Which module may import which (layers, circles,
the HTTP door, test tools) is import-linter's to check: the contracts in pyproject.toml,
run as `lint-imports` by scripts/test.sh. And the test suite's own shape: no test module
imports another.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "coordinator"


def _setuptools_config() -> dict[str, object]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    config = doc.get("tool", {}).get("setuptools", {})
    assert isinstance(config, dict)
    return config


def wheel_packages() -> list[str]:
    """The packages setuptools puts in the wheel, found as pyproject.toml tells it to."""
    setuptools = pytest.importorskip("setuptools")
    config = _setuptools_config()
    packages = config.get("packages")
    if isinstance(packages, list):
        return [str(p) for p in packages]
    find = packages.get("find", {}) if isinstance(packages, dict) else {}
    assert isinstance(find, dict), "[tool.setuptools] packages must be a list or a find table"
    where = find.get("where", ["."])
    finder = setuptools.find_namespace_packages if find.get("namespaces", True) else setuptools.find_packages
    found: list[str] = []
    for base in where:
        found += finder(str(ROOT / base), include=find.get("include", ["*"]), exclude=find.get("exclude", []))
    return found


def test_the_wheel_holds_the_coordinator_package_and_nothing_else() -> None:
    packages = wheel_packages()
    assert "coordinator" in packages and "coordinator.kube" in packages
    outside = [p for p in packages if p != "coordinator" and not p.startswith("coordinator.")]
    assert not outside, f"packages outside coordinator/ would be in the wheel: {outside}"
    tools = [p for p in packages if p.split(".")[-1] in {"testing", "tests", "faults", "bench"}]
    assert not tools, f"test tools would be in the wheel: {tools}"


def test_no_test_tools_ride_along_as_modules_or_data() -> None:
    config = _setuptools_config()
    for key in ("py-modules", "data-files", "script-files"):
        assert key not in config, f"[tool.setuptools] {key} puts files outside coordinator/ in the wheel"
    package_data = config.get("package-data") or {}
    assert isinstance(package_data, dict)
    for patterns in package_data.values():
        assert not any("test" in p or "script" in p or ".." in p for p in patterns), patterns
    assert not (ROOT / "MANIFEST.in").exists() or "tests" not in (ROOT / "MANIFEST.in").read_text()
    assert not (ROOT / "setup.py").exists() and not (ROOT / "setup.cfg").exists(), "one build config only"


def test_the_package_has_no_test_tools_in_it() -> None:
    assert not (PACKAGE / "testing").exists(), "coordinator/testing would be installed with the package"


def test_the_wheel_carries_py_typed() -> None:
    """PEP 561: users' `mypy --strict` reads the package's own hints only if the marker
    is installed with it, which takes package data (setuptools packs no other file)."""
    assert (PACKAGE / "py.typed").is_file()
    package_data = _setuptools_config().get("package-data") or {}
    assert isinstance(package_data, dict) and "py.typed" in package_data.get("coordinator", []), package_data


# ------------------------------------------------------------------ the test suite's own shape

TESTS = ROOT / "tests"


def imported_test_modules(path: Path) -> list[str]:
    """The test modules ``path`` imports (at any level of the file), as written: a module
    whose dotted name has a part ``test_*``, or a ``test_*`` name taken from a package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if any(p.startswith("test_") for p in a.name.split("."))]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if any(p.startswith("test_") for p in (node.module or "").split(".")):
                found.append(module)
            else:
                joint = "" if module.endswith(".") or not module else "."
                found += [f"{module}{joint}{a.name}" for a in node.names if a.name.startswith("test_")]
    return found


def test_no_test_module_imports_another() -> None:
    """What more than one test module needs lives in tests/helpers/ (or a fixture module):
    a test module's private helpers are its own."""
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50, files
    found = [f"{p.relative_to(ROOT)} imports {m}" for p in files for m in imported_test_modules(p)]
    assert not found, "\n".join(found)


def test_no_two_test_modules_share_a_name() -> None:
    """pytest imports a test module under its file name, prefixed by the packages it is in
    (most test folders are not packages): a second module of the same name (a unit and
    an integration half of one topic) fails to be collected."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        parts, folder = [path.stem], path.parent
        while (folder / "__init__.py").exists():
            parts.insert(0, folder.name)
            folder = folder.parent
        by_name.setdefault(".".join(parts), []).append(str(path.relative_to(ROOT)))
    same = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not same, same


def test_the_import_check_sees_every_spelling_of_a_test_module(tmp_path: Path) -> None:
    src = tmp_path / "test_x.py"
    src.write_text(
        "import json\nfrom helpers.rbac import grant\nfrom coordinator import testing_aid\n"
        "def f():\n    from test_lock import acquire\n"
        "import tests.unit.test_quorum as q\nfrom . import test_state\nfrom .test_fleet import x\n"
    )
    found = sorted(imported_test_modules(src))
    assert found == [".test_fleet", ".test_state", "test_lock", "tests.unit.test_quorum"], found
