"""-o name, wide and jsonpath=TEMPLATE: kubectl's template syntax (coordinator/cli/jsonpath.py)
checked against the examples of https://kubernetes.io/docs/reference/kubectl/jsonpath/, and
how -o is chosen and refused (coordinator/cli/base.py). On the sandbox:
tests/cli/integration/test_output_formats.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from coordinator.cli import main
from coordinator.cli.base import OutputFormat, is_document
from coordinator.cli.jsonpath import TemplateError, parse
from coordinator.cli.output import render_document

# The shape of the document kubectl's page works on (a List of two nodes, and users).
DOC: dict[str, Any] = {
    "kind": "List",
    "items": [
        {
            "kind": "None",
            "metadata": {"name": "127.0.0.1", "labels": {"kubernetes.io/hostname": "127.0.0.1"}},
            "status": {"capacity": {"cpu": "4"}, "addresses": [{"type": "LegacyHostIP", "address": "127.0.0.1"}]},
        },
        {
            "kind": "None",
            "metadata": {"name": "127.0.0.2"},
            "status": {
                "capacity": {"cpu": "8"},
                "addresses": [
                    {"type": "LegacyHostIP", "address": "127.0.0.2"},
                    {"type": "another", "address": "127.0.0.3"},
                ],
            },
        },
    ],
    "users": [
        {"name": "myself", "user": {}},
        {"name": "e2e", "user": {"username": "admin", "password": "secret"}},
    ],
}


@pytest.mark.parametrize(
    ("template", "printed"),
    [
        ("{.kind}", "List"),
        ("{$.kind}", "List"),  # the root named
        ("{['kind']}", "List"),  # a key in brackets
        ("{..name}", "127.0.0.1 127.0.0.2 myself e2e"),  # recursive descent
        ("{.items[*].metadata.name}", "127.0.0.1 127.0.0.2"),  # every element, space-separated
        ('{.users[?(@.name=="e2e")].user.password}', "secret"),  # a filter
        ("{.items[0].metadata.name}", "127.0.0.1"),
        ("{.items[-1:].metadata.name}", "127.0.0.2"),  # a slice
        ("{.items[0].status.capacity}", '{"cpu":"4"}'),  # an object: compact JSON
        ("{.items[0].metadata.labels['kubernetes.io/hostname']}", "127.0.0.1"),
        (
            "{range .items[*]}[{.metadata.name}, {.status.capacity}] {end}",
            '[127.0.0.1, {"cpu":"4"}] [127.0.0.2, {"cpu":"8"}] ',
        ),
        ('{range .items[*]}{.metadata.name}{"\\t"}{end}', "127.0.0.1\t127.0.0.2\t"),
        # Nested ranges; @ is the element a range is at, $ still the document.
        (
            '{range .items[*]}{range .status.addresses[*]}{.address}{"\\n"}{end}{end}',
            "127.0.0.1\n127.0.0.2\n127.0.0.3\n",
        ),
        ("{range .users[*]}{@.name}/{$.kind} {end}", "myself/List e2e/List "),
        ("name: {.kind}", "name: List"),  # literal text kept
        ("{.missing}", ""),  # nothing found: nothing printed, as kubectl's get does
        ('{"}"}', "}"),  # a brace inside a quoted string
        ('{.items[1].status.addresses[?(@.type=="another")].address}', "127.0.0.3"),
    ],
)
def test_kubectls_documented_templates(template: str, printed: str) -> None:
    assert parse(template).render(DOC) == printed


def test_values_print_as_kubectl_prints_them() -> None:
    doc = {"s": "text", "n": 3, "f": 1.5, "t": True, "null": None, "list": [1, "a"]}
    assert parse("{.s}|{.n}|{.f}|{.t}|{.null}|{.list}").render(doc) == 'text|3|1.5|true||[1,"a"]'
    # The document of a list command is a list: [*] and a range over it.
    assert parse("{[*].name}").render([{"name": "a"}, {"name": "b"}]) == "a b"
    assert parse("{range [*]}{.name};{end}").render([{"name": "a"}, {"name": "b"}]) == "a;b;"


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{.kind", "not closed"),
        ("{.a{.b}}", "inside the action"),
        ("{end}", "{end} without a {range"),
        ("{range .items[*]}{.x}", "not closed by an {end}"),
        ("{range}", "needs a path"),
        ("{}", "empty action"),
        ("{kind}", "neither a path"),
        ("{.items[}", "no JSONPath"),
        ('{"\\q"}', "no quoted string"),
    ],
)
def test_a_template_that_does_not_parse_says_why(template: str, said: str) -> None:
    with pytest.raises(TemplateError, match=None) as caught:
        parse(template)
    assert said in str(caught.value)


# ------------------------------------------------------------------ choosing the format


@pytest.mark.parametrize(
    ("given", "taken"),
    [
        ("table", "table"),
        ("wide", "wide"),
        ("json", "json"),
        ("yaml", "yaml"),
        ("name", "name"),
        ("jsonpath={.holder}", "jsonpath={.holder}"),
        ("=json", "json"),  # -o=json: click keeps the "=" of a short option
        ("=jsonpath={.holder}", "jsonpath={.holder}"),
    ],
)
def test_the_formats_taken(given: str, taken: str) -> None:
    assert OutputFormat().convert(given, None, None) == taken


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("xml", "'xml' is not one of table, wide, json, yaml, name, jsonpath=TEMPLATE"),
        ("jsonpath=", "jsonpath= needs a template"),
        ("jsonpath", "'jsonpath' is not one of"),
        ("jsonpath={.a", "cannot read the jsonpath template '{.a'"),
        ("custom-columns=A:.a", "is not one of"),
    ],
)
def test_a_format_not_taken_says_which_are(given: str, said: str) -> None:
    with pytest.raises(click.BadParameter) as caught:
        OutputFormat().convert(given, None, None)
    assert said in caught.value.format_message()


def test_jsonpath_reads_the_document_json_prints() -> None:
    from datetime import UTC, datetime

    doc = {"at": datetime(2026, 12, 6, 8, 0, tzinfo=UTC), "n": [1, 2]}
    assert render_document(doc, "jsonpath={.at} {.n[1]}") == "2026-12-06T08:00:00Z 2"
    assert is_document("jsonpath={.a}") and is_document("json") and not is_document("wide")
    assert not is_document("name")


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(args)
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err


@pytest.fixture
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COORDINATOR_CONFIG", str(tmp_path / "absent.yaml"))


@pytest.mark.usefixtures("no_config")
@pytest.mark.parametrize(
    "args",
    [
        ["-o", "xml", "deployment", "list"],
        ["deployment", "list", "-o", "jsonpath={.a"],
        ["deployment", "list", "-o", "jsonpath={end}"],
    ],
)
def test_a_bad_format_is_a_usage_error_in_one_paragraph(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(args, capsys)
    assert code == 2 and out == ""
    assert err.startswith("Error: Invalid value for '-o' / '--output'") and err.count("\n") == 1, err


@pytest.mark.usefixtures("no_config")
@pytest.mark.parametrize(
    "args",
    [
        ["state", "get", "web", "-o", "name"],
        ["-o", "name", "lock", "acquire", "web"],  # refused before it takes anything
        ["-o", "name", "lock", "run", "web", "--", "true"],
        ["completion", "bash", "-o", "name"],
    ],
)
def test_name_is_refused_by_commands_that_print_no_objects(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(args, capsys)
    assert code == 2 and out == ""
    assert "prints no objects to name" in err, err


@pytest.mark.usefixtures("no_config")
def test_the_listing_commands_name_their_objects(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing connected: no object, no line (kubectl's -o name prints nothing either).
    assert run(["deployment", "list", "-o", "name"], capsys) == (0, "", "")
    assert run(["cluster", "list", "-o", "name"], capsys) == (0, "", "")
    assert run(["cluster", "list", "-o", "jsonpath={[*].name}"], capsys) == (0, "", "")


@pytest.mark.usefixtures("no_config")
def test_completion_prints_its_script_whatever_the_document_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["completion", "bash", "-o", "jsonpath={.a}"], capsys)
    assert code == 0 and "complete" in out
    assert run(["completion", "bash", "-o", "wide"], capsys)[1] == out
