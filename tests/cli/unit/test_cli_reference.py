"""The command reference in the docs (docs/reference/commands.md) is the CLI's own help."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "reference" / "commands.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_command_reference_is_generated_from_the_cli_help() -> None:
    assert PAGE.read_text() == _generator().render(), (
        "docs/reference/commands.md is stale: python scripts/cli_reference.py > docs/reference/commands.md"
    )


def test_the_reference_has_every_command_with_its_help() -> None:
    text = _generator().render()
    for path in ("coordinator", "coordinator lock run", "coordinator state set", "coordinator sandbox up"):
        assert f"\n## {path}\n\n```text\nUsage: {path} [OPTIONS]" in text, path
    assert "Global options (before or after the command):" in text
