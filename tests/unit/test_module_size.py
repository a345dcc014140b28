"""No module of the package is longer than a reader takes in, unless it says why.

A module over 600 lines must begin with a docstring that says "Longer than 600 lines
because ..." — one reason, in words, for whoever next wants to split it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "coordinator"
LIMIT = 600
EXCUSE = "Longer than 600 lines because"


def too_long() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines <= LIMIT:
            continue
        doc = ast.get_docstring(ast.parse(text, str(path))) or ""
        if EXCUSE not in doc:
            out.append(f"{path.relative_to(ROOT)}: {lines} lines")
    return out


def test_no_module_is_over_600_lines_without_saying_why() -> None:
    found = too_long()
    assert not found, (
        f"modules over {LIMIT} lines whose first docstring does not say {EXCUSE!r}:\n" + "\n".join(found)
    )


def test_the_excuse_must_be_in_the_modules_own_docstring() -> None:
    # a comment or a later string does not count: only the first docstring does
    long = "\n" * LIMIT
    excused = ast.get_docstring(ast.parse(f'"""{EXCUSE} it is one table."""\n{long}')) or ""
    assert EXCUSE in excused
    comment = ast.get_docstring(ast.parse(f'# {EXCUSE} ...\n"""Something else."""\n{long}')) or ""
    assert EXCUSE not in comment
