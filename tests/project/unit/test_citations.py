"""Every test the README and docs/*.md cite exists: ``tests/…/test_x.py`` is a file and
``tests/…/test_x.py::name`` a test function in it (read with ``ast``, nothing imported).
A claim whose test was moved or renamed is caught here, not by a reader."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# A path under tests/ to a .py file, with an optional ::name; a bare test_x.py (no path)
# is caught as well, since a reader cannot find it.
CITATION = re.compile(r"(?<![\w/.])(tests/[\w/.-]+\.py)(?:::(\w+))?")
BARE = re.compile(r"(?<![\w/.])(test_\w+\.py)")


def cited_documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def functions_in(path: Path) -> set[str]:
    """The names of the functions and classes defined at the top level of ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def broken_citations(text: str, root: Path = ROOT) -> list[str]:
    """Each citation in ``text`` that names no file, or no test in the file it names."""
    broken = []
    cache: dict[Path, set[str]] = {}
    for match in CITATION.finditer(text):
        file, name = match.group(1), match.group(2)
        path = root / file
        if not path.is_file():
            broken.append(f"{match.group(0)}: no such file")
            continue
        if name is not None:
            if path not in cache:
                cache[path] = functions_in(path)
            if name not in cache[path]:
                broken.append(f"{match.group(0)}: no {name} in {file}")
    broken += [f"{m.group(1)}: cite it with its path under tests/" for m in BARE.finditer(text)]
    return broken


def test_every_test_the_docs_cite_exists() -> None:
    found = []
    cited = 0
    for doc in cited_documents():
        text = doc.read_text()
        cited += len(CITATION.findall(text))
        found += [f"{doc.relative_to(ROOT)}: {b}" for b in broken_citations(text)]
    assert cited > 100, f"only {cited} citations found: is the pattern still right?"
    assert not found, "\n".join(found)


def test_a_wrong_citation_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tests" / "lock" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "lock" / "unit" / "test_a.py").write_text("def test_real() -> None:\n    pass\n")
    text = (
        "(`tests/lock/unit/test_a.py::test_real`), `tests/lock/unit/test_a.py`, "
        "`tests/lock/unit/test_a.py::test_renamed`, `tests/lock/unit/test_gone.py::test_real`, "
        "`tests/lock/unit/test_gone.py`, and (`test_a.py::test_real`)"
    )
    assert broken_citations(text, tmp_path) == [
        "tests/lock/unit/test_a.py::test_renamed: no test_renamed in tests/lock/unit/test_a.py",
        "tests/lock/unit/test_gone.py::test_real: no such file",
        "tests/lock/unit/test_gone.py: no such file",
        "test_a.py: cite it with its path under tests/",
    ]
