"""The sandbox's certificates need ``cryptography``, an extra: ``coordinator[sandbox]``.

Without it, the rest of the package imports and runs, and ``coordinator sandbox ...``
stops with one paragraph that names the install command (exit 2, an environment the
user can fix). Each case runs in a fresh interpreter where importing cryptography fails.
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
INSTALL = "pip install 'coordinator[sandbox]'"

# Run before the code under test: every import of cryptography fails, as when it is not installed.
WITHOUT_CRYPTOGRAPHY = """
import sys
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name == "cryptography" or name.startswith("cryptography."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Missing())
"""


def run_without_cryptography(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_CRYPTOGRAPHY + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _cli(*args: str) -> str:
    return f"sys.argv = ['coordinator', *{list(args)!r}]\nfrom coordinator.cli import main\nmain()\n"


@pytest.mark.parametrize("args", [("sandbox", "status"), ("sandbox", "up", "--clusters", "1")])
def test_sandbox_commands_name_the_extra_to_install(args: tuple[str, ...], tmp_path: Path) -> None:
    done = run_without_cryptography(_cli(*args, "--dir", str(tmp_path / "sb")), tmp_path)
    assert done.returncode == 2, done.stderr
    assert INSTALL in done.stderr
    assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, "one paragraph"
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "sb").exists(), "nothing is started or written"


def test_the_sandbox_import_itself_says_what_to_install(tmp_path: Path) -> None:
    done = run_without_cryptography(
        "from coordinator.errors import UsageError\n"
        "try:\n    import coordinator.sandbox\nexcept UsageError as err:\n    print(err.message)\n"
        "else:\n    print('imported')\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert INSTALL in done.stdout and "cryptography" in done.stdout


def test_everything_but_the_sandbox_works_without_cryptography(tmp_path: Path) -> None:
    names = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in PACKAGE.rglob("*.py")
        if "sandbox" not in p.relative_to(PACKAGE).parts and p.name != "__main__.py"
    )
    code = "import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names) + _cli("--help")
    done = run_without_cryptography(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sandbox" in done.stdout  # listed, though its group is not loaded


def test_cryptography_is_the_sandbox_extra_and_only_pki_imports_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("cryptography")]
    assert [d for d in project["optional-dependencies"]["sandbox"] if d.startswith("cryptography")]
    importers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            if any(n == "cryptography" or n.startswith("cryptography.") for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["coordinator/sandbox/pki.py"]


def test_the_readme_commands_install_the_sandbox_extra() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'pip install -e ".[test,sandbox,bench,docs]"' in setup
    for script in ("demo.sh", "test.sh"):
        assert "source scripts/setup.sh" in (ROOT / "scripts" / script).read_text(), script
