"""The package's shape: no import circles between its modules, and no test tools in the wheel.

Read from the source tree with ``ast`` and from pyproject.toml's package discovery, so no
module is imported and no wheel is built (the build backend pyproject.toml asks for is not
necessarily installed where the unit tests run).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "coordinator"

# What a user's install must not carry: the test suite's helpers and the benchmarks.
TEST_TOOLS = {
    "pytest",
    "hypothesis",
    "faults",
    "bench",
    "coord_fixtures",
    "cliserver",
    "served",
    "helpers",
    "dateproxy",
    "register_model",
    "tests",
    "scripts",
    "sim",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top level, and the branches of
    top-level ``if``/``try``/``with`` blocks, but not ``if TYPE_CHECKING:`` blocks and not
    function or class bodies."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from module_level(node.body)
            yield from module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from module_level(block)
        elif isinstance(node, ast.With):
            yield from module_level(node.body)


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports at module level. ``from pkg import sub``
    is an import of the submodule ``pkg.sub`` (not of ``pkg/__init__``) when ``sub`` is one."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in module_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base)
        else:
            source = node.module or ""
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if sub in known:
                out.add(sub)
            elif source in known:
                out.add(source)
    out.discard(name)  # ``from coordinator.kube import client`` inside kube/__init__ is no circle
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (as a path that ends where it starts) per strongly connected group of
    modules, found with Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return [_path_within(graph, set(g), g[0]) for g in groups]


def _path_within(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest path from ``start`` back to itself inside ``group`` (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no circle of {sorted(group)}")


# ------------------------------------------------------------------ the checks themselves


def test_no_import_circles_between_the_packages_modules() -> None:
    found = cycles(import_graph())
    assert not found, "import circles (at module level, TYPE_CHECKING imports aside):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_the_circle_finder_finds_a_circle_and_its_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]  # a module importing itself is no circle
    assert cycles({"a": {"b"}, "b": set()}) == []
    two = cycles({"x": {"y"}, "y": {"x"}, "p": {"q"}, "q": {"r"}, "r": {"q"}})
    assert sorted(two) == [["q", "r", "q"], ["x", "y", "x"]]


def test_the_graph_reads_imports_the_way_python_runs_them(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import coordinator.quorum\n"
        "from coordinator.kube import client\n"
        "from coordinator.kube.resources import FIELD_MANAGER\n"
        "from . import lease\n"
        "from .sandbox import pki\n"
        "try:\n    from coordinator import text\nexcept ImportError:\n    pass\n"
        "if TYPE_CHECKING:\n    from coordinator import api\n"
        "def later():\n    from coordinator import state\n"
    )
    known = {
        "coordinator",
        "coordinator.quorum",
        "coordinator.kube",
        "coordinator.kube.client",
        "coordinator.kube.resources",
        "coordinator.lease",
        "coordinator.sandbox",
        "coordinator.sandbox.pki",
        "coordinator.text",
        "coordinator.api",
        "coordinator.state",
    }
    assert imported("coordinator.m", src, known) == {
        "coordinator.quorum",
        "coordinator.kube.client",
        "coordinator.kube.resources",
        "coordinator.lease",
        "coordinator.sandbox.pki",
        "coordinator.text",
    }
    init = tmp_path / "__init__.py"
    init.write_text("from .handle import Sandbox\nfrom .. import errors\n")
    assert imported("coordinator.sandbox", init, {"coordinator.sandbox.handle", "coordinator.errors"}) == {
        "coordinator.sandbox.handle",
        "coordinator.errors",
    }


def test_the_graph_covers_the_whole_package() -> None:
    graph = import_graph()
    assert {"coordinator", "coordinator.lease", "coordinator.kube.client", "coordinator.cli"} <= set(graph)
    assert "coordinator.membership" in graph["coordinator.lease"]  # a known import is seen


# ------------------------------------------------------------------ what the wheel holds


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
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not tops & TEST_TOOLS, f"{name} (line {node.lineno}) imports test tools: {sorted(tops & TEST_TOOLS)}"


# ------------------------------------------------------------------ the door

# Where aiohttp may be imported: the default transport (and kubeconfig.preload, which
# imports it ahead of any deadline), and the sandbox's own HTTP proxy process. Everything
# else reaches an API server through coordinator/kube/transport.py's protocol.
AIOHTTP_ALLOWED = {"coordinator.kube.wire", "coordinator.kube.kubeconfig", "coordinator.sandbox.frontproxy"}


def test_only_the_transport_imports_aiohttp() -> None:
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = {(node.module or "").split(".")[0]}
            else:
                continue
            if "aiohttp" in tops and name not in AIOHTTP_ALLOWED:
                found.append(f"{name} (line {node.lineno})")
    assert not found, "modules that import aiohttp besides the transport: " + ", ".join(found)


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


def test_the_import_check_sees_every_spelling_of_a_test_module(tmp_path: Path) -> None:
    src = tmp_path / "test_x.py"
    src.write_text(
        "import json\nfrom helpers.rbac import grant\nfrom coordinator import testing_aid\n"
        "def f():\n    from test_lock import acquire\n"
        "import tests.unit.test_quorum as q\nfrom . import test_state\nfrom .test_fleet import x\n"
    )
    found = sorted(imported_test_modules(src))
    assert found == [".test_fleet", ".test_state", "test_lock", "tests.unit.test_quorum"], found
