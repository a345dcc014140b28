"""The commands the documentation shows are commands the tool takes.

Every command the tour shows (the README's and the one in docs/getting-started.md) is a
command scripts/demo.sh runs, and tests/sandbox/integration/test_demo.py runs the demo end
to end on a sandbox: a tour command the tool no longer takes fails there, and one the demo
does not run fails here. The on-call guide's sessions are replayed on a sandbox by
tests/lock/integration/test_on_call_guide.py. Every other `coordinator …` command line in
the README and docs/*.md (the examples of docs/cli.md, the guides' inline commands, the
synopses with their placeholders) must parse: the command, its options and arguments
exist; and it must be run on a sandbox, by tests/project/integration/test_doc_commands_run.py
or by a test named here, unless the page marks its block as illustrative (the CI guide's
GitHub workflow and GitLab job: they need a CI system and Kind)."""

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


# Every other `coordinator …` command line of the pages is run against a sandbox: by
# tests/project/integration/test_doc_commands_run.py (each line it runs is the first
# argument of a ``play("coordinator …", …)`` call there) or, for the few a test of their own
# already runs, by the test RUN_ELSEWHERE names. A command line a page adds, or changes, is
# in neither list and fails here until it is run or marked illustrative: the paragraph
# before its code block says "Illustrative (not run by the tests…" with the reason.
RUN_TEST = ROOT / "tests" / "project" / "integration" / "test_doc_commands_run.py"
RUN_ELSEWHERE = {  # the command line: the test that runs it, and how it spells it there
    "coordinator sandbox up -n 3": (  # a sandbox of its own, `-n` spelled out, in a test directory
        "tests/sandbox/integration/test_sandbox.py",
        '"sandbox", "up", "--clusters", "3"',
    ),
    "coordinator deployment replace-cluster payments eu-3 eu-3b": (  # a fourth cluster: on five
        "tests/members/integration/test_change_state_copy.py",
        '"deployment", "replace-cluster", DEP, "c3", "c4"',
    ),
}
ILLUSTRATIVE = "Illustrative (not run by the tests"
_FENCE = re.compile(r"^(\s*)```(\S*)")
_SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
# Where a code block that is a script or a CI file runs a command: at the start of a line
# or a list item, after `exec`, `run:`, `do`, `;`, `&&`, `||` or inside `$(…)`.
_IN_SCRIPT = re.compile(r"(?:^|^-\s+|\bexec\s+|\brun:\s+|\bdo\s+|[;&|]\s*|\$\()(coordinator\s+[a-z][^)]*)")


def _normal(command: str) -> str:
    """One space between words, cut at a redirection, a pipe, a shell comment or the end
    of a shell command (`;`, `&&`)."""
    return " ".join(re.split(r" [>|#] |; | && ", " ".join(command.split()) + " ")[0].split())


def _is_mention(command: str) -> bool:
    """A command's name (`coordinator lock run`, `coordinator sandbox`) rather than a line
    to run: only command names, and the command would still need an argument."""
    import click

    from coordinator.cli import cli

    command_: click.Command | None = cli
    for word in command.split()[1:]:
        if not isinstance(command_, click.Group):
            return False
        command_ = command_.get_command(click.Context(command_), word)
        if command_ is None:
            return False
    assert command_ is not None
    return isinstance(command_, click.Group) or any(p.required for p in command_.params)


def _sections(text: str, page: str) -> list[tuple[str, list[str]]]:
    """The page's paragraphs and code blocks, in order: ("paragraph", lines) or (language, lines)
    for a fenced block (a `--8<--` include replaced by the file's lines), each block
    marked "illustrative" when the paragraph before it says so, "tour" in the tour and
    "session" for the on-call guide's replayed sessions."""
    lines = text.splitlines()
    tour_heading = TOURS.get(page)
    out: list[tuple[str, list[str]]] = []
    paragraph: list[str] = []
    block: list[str] | None = None
    language = ""
    in_tour = False
    for line in lines:
        fence = _FENCE.match(line)
        if block is None and fence:
            out.append(("paragraph", paragraph))
            block, language, paragraph = [], fence.group(2) or "text", []
            continue
        if block is not None:
            if fence:
                before = " ".join(next(ls for k, ls in reversed(out) if k == "paragraph" and ls))
                kind = language
                if ILLUSTRATIVE in before:
                    kind = "illustrative"
                elif in_tour:
                    kind = "tour"
                elif page == "docs/on-call.md" and any(b.startswith("$ coordinator ") for b in block):
                    kind = "session"
                out.append((kind, block))
                block = None
                continue
            snippet = _SNIPPET.match(line)
            block.extend((ROOT / snippet.group(1)).read_text().splitlines() if snippet else [line])
            continue
        if line.startswith("#"):
            level = line.split(" ", 1)[0]
            if line == tour_heading:
                in_tour = True
            elif tour_heading and level == tour_heading.split(" ", 1)[0]:
                in_tour = False
        if not line.strip():
            out.append(("paragraph", paragraph))
            paragraph = []
        else:
            paragraph.append(line)
    out.append(("paragraph", paragraph))
    return out


def doc_commands(text: str, page: str) -> list[str]:
    """The `coordinator …` command lines ``page`` shows outside the tour, the on-call
    sessions and illustrative blocks, whitespace normalised and cut at a redirection or
    pipe: inline code, ``$ coordinator …`` lines of text blocks and the commands a script
    or CI file block runs. Names of commands are left out."""
    found: list[str] = []
    for kind, lines in _sections(text, page):
        if kind in ("illustrative", "tour", "session"):
            continue
        if kind == "paragraph":
            for span in re.findall(r"`([^`]+)`", " ".join(lines)):
                match = re.match(r"(coordinator [^`]+)", span) or re.search(r"\$\((coordinator [^)]+)\)", span)
                if match:
                    found.append(match.group(1))
        elif kind in ("text", "console"):
            found += [line[2:] for line in lines if line.startswith("$ coordinator ")]
        else:
            script = re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines()
            found += [m.group(1) for line in script if (m := _IN_SCRIPT.search(line.strip()))]
    commands = [_normal(c) for c in found]
    return list(dict.fromkeys(c for c in commands if not _is_mention(c)))


def played_commands(source: str) -> list[str]:
    """The first arguments of the ``play("coordinator …", …)`` calls of a test module."""
    import ast

    return [
        _normal(node.args[0].value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "play"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]


def _all_doc_commands() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for command in doc_commands((ROOT / page).read_text(), page):
            found.setdefault(command, []).append(page)
    return found


def test_every_command_line_the_docs_show_is_run_on_a_sandbox_or_marked_illustrative() -> None:
    played = set(played_commands(RUN_TEST.read_text()))
    shown = _all_doc_commands()
    assert len(shown) >= 30, f"only {len(shown)} command lines found in the docs: is the extraction broken?"
    missing = [
        f"{c}   ({', '.join(pages)})" for c, pages in shown.items() if c not in played and c not in RUN_ELSEWHERE
    ]
    assert not missing, (
        "the docs show command lines that no test runs: play them in "
        f"{RUN_TEST.relative_to(ROOT)}, or mark their block {ILLUSTRATIVE}: why)\n" + "\n".join(missing)
    )


def test_every_command_line_the_tests_run_is_one_the_docs_show() -> None:
    shown = _all_doc_commands()
    stale = [c for c in [*played_commands(RUN_TEST.read_text()), *RUN_ELSEWHERE] if c not in shown]
    assert not stale, "run as the docs' command lines, but no page shows them (any more):\n" + "\n".join(stale)
    for command, (test, telltale) in RUN_ELSEWHERE.items():
        assert telltale in (ROOT / test).read_text(), f"{test} no longer runs {command!r} ({telltale!r})"


def test_a_command_line_no_test_runs_is_caught() -> None:
    page = (
        "Connect with `coordinator cluster connect NAME --context CTX`, then `coordinator\n"
        "lock status` (see `coordinator lock run`, `coordinator sandbox`, `coordinator/x.py`).\n"
        'Completion: `eval "$(coordinator completion bash)"`, `coordinator completion fish > f`.\n'
        "\n"
        "```sh\n"
        "coordinator lock acquire payments   # take it\n"
        "exec coordinator lock run payments -- \\\n"
        "    ./deploy.sh\n"
        "```\n"
        "\n"
        "```text\n"
        "$ coordinator lock status payments\n"
        "coordinator: released lock 1 of payments; see `coordinator lock history payments`\n"
        "```\n"
        "\n"
        "Illustrative (not run by the tests: it needs a GitLab runner):\n"
        "\n"
        "```yaml\n"
        "script:\n"
        "  - coordinator lock release payments --if-held\n"
        "```\n"
    )
    assert doc_commands(page, "docs/example.md") == [
        "coordinator cluster connect NAME --context CTX",
        "coordinator lock status",
        "coordinator completion bash",
        "coordinator completion fish",
        "coordinator lock acquire payments",
        "coordinator lock run payments -- ./deploy.sh",
        "coordinator lock status payments",
    ]
    assert played_commands('play("coordinator lock status", 0)\nplay(x)\nsetup("lock", "status")') == [
        "coordinator lock status"
    ]
