"""Every test the README and docs/*.md cite exists: ``tests/…/test_x.py`` is a file and
``tests/…/test_x.py::name`` a test function in it (read with ``ast``, nothing imported).
A claim whose test was moved or renamed is caught here, not by a reader.

The regression ledger (docs/regressions.md) is held to more: every row of its table of
fixed breaks names what broke, how it was found, a commit of this repository that fixed
it, and one test that exists."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

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


LEDGER = ROOT / "docs" / "regressions.md"
LEDGER_TABLE = "## Breaks fixed"
LEDGER_COLUMNS = ["#", "What broke", "How found", "Fix", "Regression test"]
SHORT_HASH = re.compile(r"`([0-9a-f]{7,40})`")


@dataclass(frozen=True)
class LedgerRow:
    line: int
    what: str
    how: str
    commit: str
    test: str


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row; ``\\|`` inside a cell is text, not a border."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def ledger_rows(text: str) -> tuple[list[LedgerRow], list[str]]:
    """The rows of the ledger's table of fixed breaks, and each way the table is malformed."""
    lines = text.splitlines()
    try:
        start = lines.index(LEDGER_TABLE)
    except ValueError:
        return [], [f"no {LEDGER_TABLE!r} section"]
    rows: list[LedgerRow] = []
    problems: list[str] = []
    header: list[str] | None = None
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if header is not None and rows:
                break
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            if header != LEDGER_COLUMNS:
                problems.append(f"line {number}: columns {header}, expected {LEDGER_COLUMNS}")
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        if len(cells) != len(LEDGER_COLUMNS):
            problems.append(f"line {number}: {len(cells)} cells, expected {len(LEDGER_COLUMNS)}")
            continue
        _, what, how, fix, test = cells
        commit = SHORT_HASH.fullmatch(fix)
        cited = CITATION.fullmatch(test.strip("`"))
        for name, value in (("what broke", what), ("how found", how), ("fix", fix), ("test", test)):
            if not value:
                problems.append(f"line {number}: empty {name}")
        if fix and commit is None:
            problems.append(f"line {number}: fix {fix!r} is not a short commit hash in backticks")
        if test and (cited is None or cited.group(2) is None):
            problems.append(f"line {number}: test {test!r} is not one `tests/...py::name`")
        rows.append(LedgerRow(number, what, how, commit.group(1) if commit else "", test.strip("`")))
    if header is None:
        problems.append("the table of fixed breaks has no rows")
    return rows, problems


def missing_commits(hashes: set[str], root: Path = ROOT) -> list[str]:
    """The hashes that name no commit of the repository at ``root``."""
    missing = []
    for short in sorted(hashes):
        found = subprocess.run(
            ["git", "rev-parse", "--quiet", "--verify", f"{short}^{{commit}}"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
        if found.returncode != 0:
            missing.append(short)
    return missing


def ledger_problems(text: str, root: Path = ROOT) -> list[str]:
    """Every row of the ledger with an empty column, a malformed hash or a test that does not exist."""
    rows, problems = ledger_rows(text)
    for row in rows:
        problems += [f"line {row.line}: {b}" for b in broken_citations(f"`{row.test}`", root) if row.test]
    return problems


def _in_git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    inside = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return inside.returncode == 0 and inside.stdout.strip() == "true"


def test_every_ledger_row_names_what_how_a_fix_and_a_test_that_exists() -> None:
    rows, _ = ledger_rows(LEDGER.read_text())
    assert len(rows) > 100, f"only {len(rows)} ledger rows found: is the parser still right?"
    problems = ledger_problems(LEDGER.read_text())
    assert not problems, "\n".join(problems)


def test_every_ledger_fix_is_a_commit_of_this_repository() -> None:
    if not _in_git_checkout():
        pytest.skip("not a git checkout (an sdist or a copied tree): the ledger's commit hashes cannot be looked up")
    rows, _ = ledger_rows(LEDGER.read_text())
    missing = missing_commits({row.commit for row in rows if row.commit})
    assert not missing, f"docs/regressions.md names commits this repository does not have: {missing}"


def test_a_wrong_ledger_row_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tests" / "lock" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "lock" / "unit" / "test_a.py").write_text("def test_real() -> None:\n    pass\n")
    text = "\n".join(
        [
            "# Ledger",
            "",
            LEDGER_TABLE,
            "",
            "| # | What broke | How found | Fix | Regression test |",
            "| --- | --- | --- | --- | --- |",
            "| 1 | a lock taken twice | round 1 | `abc1234` | `tests/lock/unit/test_a.py::test_real` |",
            "| 2 | `a \\| b` piped | round 2 | `abc1234` | `tests/lock/unit/test_a.py::test_renamed` |",
            "| 3 |  | round 3 | `abc1234` | `tests/lock/unit/test_a.py::test_real` |",
            "| 4 | a break | round 4 | 1234567 | `tests/lock/unit/test_a.py` |",
            "| 5 | a break | round 5 | `abc1234` |",
            "",
            "## Open limits",
            "",
            "| Test | What it shows | Documented in |",
            "| --- | --- | --- |",
            "| `tests/lock/unit/test_a.py::test_gone` | not a ledger row | README |",
        ]
    )
    rows, _ = ledger_rows(text)
    assert [(r.line, r.what, r.commit) for r in rows] == [
        (7, "a lock taken twice", "abc1234"),
        (8, "`a | b` piped", "abc1234"),
        (9, "", "abc1234"),
        (10, "a break", ""),
    ]
    assert ledger_problems(text, tmp_path) == [
        "line 9: empty what broke",
        "line 10: fix '1234567' is not a short commit hash in backticks",
        "line 10: test '`tests/lock/unit/test_a.py`' is not one `tests/...py::name`",
        "line 11: 4 cells, expected 5",
        "line 8: tests/lock/unit/test_a.py::test_renamed: no test_renamed in tests/lock/unit/test_a.py",
    ]


def test_a_ledger_hash_that_is_no_commit_is_caught() -> None:
    if not _in_git_checkout():
        pytest.skip("not a git checkout (an sdist or a copied tree): no commit can be looked up")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert missing_commits({head.stdout.strip(), "0000000"}) == ["0000000"]
