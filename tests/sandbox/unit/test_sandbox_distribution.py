"""The sandbox is a distribution of its own (``sandbox/``, package ``coordinator_sandbox``).

Installing coordinator installs none of it: the package never imports it, and the CLI finds
``coordinator sandbox`` through the ``coordinator.commands`` entry point. Where the sandbox
is not installed, or cannot be imported, ``coordinator sandbox ...`` stops with one
paragraph that names the install command (exit 2, an environment the user can fix). Its
certificates need ``cryptography``, a dependency of the sandbox alone. Each case runs in a
fresh interpreter where the imports in question fail.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "coordinator"
SANDBOX = ROOT / "sandbox" / "coordinator_sandbox"
INSTALL = "pip install ./sandbox"


def _hiding(*modules: str) -> str:
    """Code run before the code under test: every import of these fails, as when they are
    not installed."""
    return f"""
import sys
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in {list(modules)!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Missing())
"""


# Run before the code under test: no distribution offers a `coordinator.commands` entry point.
NO_PLUGINS = """
import importlib.metadata as _md
_all = _md.entry_points
_md.entry_points = lambda **kw: [] if kw.get("group") == "coordinator.commands" else _all(**kw)
"""


def run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def _cli(*args: str) -> str:
    return f"import sys\nsys.argv = ['coordinator', *{list(args)!r}]\nfrom coordinator.cli import main\nmain()\n"


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(NO_PLUGINS, id="not-installed"),
        pytest.param(_hiding("coordinator_sandbox"), id="not-importable"),
        pytest.param(_hiding("cryptography"), id="without-cryptography"),
    ],
)
@pytest.mark.parametrize("args", [("sandbox", "status"), ("sandbox", "up", "--clusters", "1")])
def test_sandbox_commands_name_what_to_install(setting: str, args: tuple[str, ...], tmp_path: Path) -> None:
    done = run(setting + _cli(*args, "--dir", str(tmp_path / "sb")), tmp_path)
    assert done.returncode == 2, done.stderr
    assert INSTALL in done.stderr
    assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, "one paragraph"
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "sb").exists(), "nothing is started or written"


def test_an_unknown_command_is_still_a_usage_error_that_names_it(tmp_path: Path) -> None:
    done = run(_cli("sandbx", "status"), tmp_path)
    assert done.returncode == 2, done.stderr
    assert "sandbx" in done.stderr and "sandbox" in done.stderr, done.stderr  # the suggestion


def test_installed_the_sandbox_is_a_command_and_listed(tmp_path: Path) -> None:
    from importlib.metadata import entry_points

    if not [ep for ep in entry_points(group="coordinator.commands") if ep.name == "sandbox"]:
        # scripts/check-pythons.sh puts the checkout on PYTHONPATH, without the metadata.
        pytest.skip("the coordinator-sandbox distribution is not installed for this interpreter")
    done = run(_cli("--help"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sandbox" in done.stdout
    hidden = run(NO_PLUGINS + _cli("--help"), tmp_path)
    assert hidden.returncode == 0 and "sandbox" not in hidden.stdout, hidden.stdout


def test_the_package_works_without_the_sandbox_and_cryptography(tmp_path: Path) -> None:
    names = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in PACKAGE.rglob("*.py")
        if p.name != "__main__.py"
    )
    code = "import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names) + _cli("--help")
    done = run(_hiding("coordinator_sandbox", "cryptography") + code, tmp_path)
    assert done.returncode == 0, done.stderr


def test_cryptography_is_the_sandboxs_alone_and_only_pki_imports_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(d for ds in project["optional-dependencies"].values() for d in ds)]
    assert not [d for d in wanted if d.startswith(("cryptography", "coordinator-sandbox"))]
    sandbox = tomllib.loads((ROOT / "sandbox" / "pyproject.toml").read_text())["project"]
    assert [d for d in sandbox["dependencies"] if d.startswith("cryptography")]
    assert sandbox["entry-points"]["coordinator.commands"] == {"sandbox": "coordinator_sandbox.cli:sandbox"}
    importers = []
    for path in [*PACKAGE.rglob("*.py"), *SANDBOX.rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            if any(n == "cryptography" or n.startswith("cryptography.") for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["sandbox/coordinator_sandbox/pki.py"]


def test_the_readme_commands_install_the_sandbox() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'pip install -e ".[test,bench,docs]" -e ./sandbox' in setup
    for script in ("demo.sh", "test.sh"):
        assert "source scripts/setup.sh" in (ROOT / "scripts" / script).read_text(), script
