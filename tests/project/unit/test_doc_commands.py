"""The commands the documentation shows are commands the tool takes.

Every command the tour shows (the README's and the one in docs/getting-started.md) is a
command scripts/demo.sh runs, and tests/sandbox/integration/test_demo.py runs the demo end
to end on a sandbox: a tour command the tool no longer takes fails there, and one the demo
does not run fails here. The on-call guide's sessions are replayed on a sandbox by
tests/lock/integration/test_on_call_guide.py. Every other `coordinator …` command line in
the README and docs/*.md (the examples of docs/cli.md, the guides' inline commands) must
parse: the command, its options and arguments exist. Pages mark what is only illustrative
(the GitLab job of the CI guide)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOURS = {
    "README.md": "## A short tour",
    "docs/getting-started.md": "## A five-minute tour",
}


def tour_commands(text: str, heading: str) -> list[str]:
    """The ``$ coordinator …`` lines of the code blocks under ``heading`` (up to the next
    heading of the same level), without the prompt."""
    level = heading.split(" ", 1)[0]
    lines = text.splitlines()
    start = lines.index(heading)
    found = []
    fenced = False
    for line in lines[start + 1 :]:
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced and line.startswith(level + " "):
            break
        if fenced and line.startswith("$ coordinator "):
            found.append(line[2:])
    return found


def demo_commands(script: str) -> list[list[str]]:
    """The commands scripts/demo.sh runs, through its ``run`` and ``expect_fail`` helpers or
    directly (a background ``&`` job), as words (backslash continuations joined; a ``${…}``
    expansion stays as written)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    commands = []
    for line in joined.splitlines():
        match = re.search(r"(?:^|;|\bdo)\s*(?:(?:run|expect_fail) )?(coordinator .*?)(?:; done| &)?$", line.strip())
        if match:
            commands.append(shlex.split(match.group(1), comments=True))
    return commands


def _word_matches(shown: str, run: str) -> bool:
    """A word of the tour against a word of the demo: ``...`` in the tour stands for what it
    abridges, ``${…}`` in the demo for what the shell expands."""
    if "..." in shown:
        pattern = ".*".join(re.escape(part) for part in shown.split("..."))
        return re.fullmatch(pattern, run, re.S) is not None
    pattern = re.sub(r"\\\$\\\{[^}]*\\\}", ".+", re.escape(run))
    return re.fullmatch(pattern, shown, re.S) is not None


def runs_in_demo(command: str, demo: list[list[str]]) -> bool:
    words = shlex.split(command, comments=True)
    return any(len(words) == len(run) and all(map(_word_matches, words, run)) for run in demo)


@pytest.mark.parametrize("page", sorted(TOURS))
def test_every_command_of_the_tour_is_one_the_demo_runs(page: str) -> None:
    demo = demo_commands((ROOT / "scripts" / "demo.sh").read_text())
    shown = tour_commands((ROOT / page).read_text(), TOURS[page])
    assert len(shown) >= 8, f"only {len(shown)} commands found in {page}'s tour: is the heading still {TOURS[page]!r}?"
    missing = [c for c in shown if not runs_in_demo(c, demo)]
    assert not missing, f"{page} shows commands scripts/demo.sh does not run:\n" + "\n".join(missing)


def test_a_command_the_demo_does_not_run_is_caught() -> None:
    demo = demo_commands(
        'for i in 1 2 3; do run coordinator cluster connect "eu-${i}" --context "sandbox-${i}"; done\n'
        'run coordinator lock acquire payments --holder alice --ttl 60s \\\n    --reason "release 1.2"\n'
        'run coordinator sandbox pause 1 --dir "${work}/sandbox"\n'
        "expect_fail coordinator lock acquire payments --holder bob\n"
        "coordinator lock status payments --watch --interval 0.5s &\n"
    )
    assert runs_in_demo("coordinator cluster connect eu-2 --context sandbox-2", demo)
    assert runs_in_demo('coordinator lock acquire payments --holder alice --ttl 60s --reason "release 1.2"', demo)
    assert runs_in_demo("coordinator sandbox pause 1 --dir ...", demo)
    assert runs_in_demo("coordinator lock acquire payments --holder bob   # refused", demo)
    assert not runs_in_demo("coordinator lock acquire payments --holder alice --ttl 90s --reason x", demo)
    assert not runs_in_demo("coordinator lock acquire payments --holder bob --wait 5m", demo)
    assert runs_in_demo("coordinator lock status payments --watch --interval 0.5s", demo)
    assert not runs_in_demo("coordinator lock status payments", demo)


# Pages whose inline `coordinator …` command lines must be ones the CLI takes (the
# generated reference is the CLI's help itself).
PAGES = ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]


def inline_commands(text: str) -> list[str]:
    """The ``coordinator …`` code spans of a page, each cut at a shell redirection or pipe."""
    spans = re.findall(r"`(coordinator [^`]+)`", text)
    return [re.split(r" [>|] ", span)[0] for span in spans]


def cli_problem(command: str) -> str | None:
    """Why the CLI would refuse ``command`` before running it (an unknown command or option,
    a missing argument, a bad choice), or None. A bare command name (`coordinator lock run`)
    is a mention of the command, not a command line, and passes."""
    import click

    from coordinator.cli import cli

    words = shlex.split(command)[1:]
    ctx: click.Context | None = None
    leaf_args: list[str] = []
    try:
        ctx = cli.make_context("coordinator", list(words))
        group: click.Command = cli
        while isinstance(group, click.Group):
            rest = [*ctx._protected_args, *ctx.args]
            if not rest:
                break
            name, sub, leaf_args = group.resolve_command(ctx, rest)
            assert name is not None and sub is not None
            ctx = sub.make_context(name, list(leaf_args), parent=ctx)  # click consumes the list it parses
            group = sub
    except click.exceptions.Exit:
        return None
    except (click.MissingParameter, click.exceptions.NoArgsIsHelpError) as err:
        return None if not leaf_args and not words[-1].startswith("-") else f"{command}: {err.format_message()}"
    except click.ClickException as err:
        return f"{command}: {err.format_message()}"
    return None


@pytest.mark.parametrize("page", PAGES)
def test_every_command_line_a_page_shows_is_one_the_cli_takes(page: str) -> None:
    problems = [p for c in inline_commands((ROOT / page).read_text()) if (p := cli_problem(c))]
    assert not problems, f"{page}:\n" + "\n".join(problems)


def test_a_command_line_the_cli_refuses_is_caught() -> None:
    assert cli_problem("coordinator lock acquire payments --wait 5m --reason 'release 1.2'") is None
    assert cli_problem("coordinator -o json lock status payments --timeout 10s") is None
    assert cli_problem("coordinator lock run") is None  # the command's name
    assert "No such option" in (cli_problem("coordinator lock acquire payments --wiat 5m") or "")
    assert "lokc" in (cli_problem("coordinator lokc status payments") or "")
    assert "Missing" in (cli_problem("coordinator rbac print --service-account payments:deployer") or "")
    assert inline_commands("see `coordinator completion fish > ~/x.fish` and `coordinator lock status`") == [
        "coordinator completion fish",
        "coordinator lock status",
    ]
