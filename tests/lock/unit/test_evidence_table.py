"""The evidence table in the docs is the one the rules use (coordinator/rules/evidence.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from coordinator.rules.evidence import EVIDENCE, Writer, owners, writer

ROOT = Path(__file__).resolve().parents[3]


def test_docs_evidence_md_is_generated_from_the_rules_table() -> None:
    spec = importlib.util.spec_from_file_location("evidence_table", ROOT / "scripts" / "evidence_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "evidence.md").read_text() == module.render(), (
        "docs/evidence.md is stale: python scripts/evidence_table.py > docs/evidence.md"
    )


def test_every_row_names_a_test_that_exists() -> None:
    for row in EVIDENCE:
        path = row.test.split("::")[0]
        found = [ROOT / path] if (ROOT / path).is_file() else []
        assert found, f"{row.field}: no test file {path}"
        if "::" in row.test:
            name = row.test.split("::")[1]
            assert any(f"def {name}(" in f.read_text() for f in found), f"{row.field}: no test {row.test}"


def _obj(*entries: tuple[str, dict[str, object]]) -> dict[str, object]:
    return {"metadata": {"managedFields": [{"manager": m, "fieldsV1": f} for m, f in entries]}}


def test_writer_of_a_field() -> None:
    holder = {"f:spec": {"f:holderIdentity": {}}}
    path = ("spec", "holderIdentity")
    assert writer(_obj(("coordinator-release", holder)), path) is Writer.OURS
    assert writer(_obj(("kubectl-edit", holder)), path) is Writer.OTHER
    # several owners (the same value applied by both): one of ours vouches for it
    assert writer(_obj(("kubectl", holder), ("coordinator", holder)), path) is Writer.OURS
    assert writer(_obj(("before-first-apply", holder)), path) is Writer.UNKNOWN  # names nobody
    # the server's merge of the oldest Update entries past ten managers: nobody can tell who
    assert writer(_obj(("ancient-changes", holder)), path) is Writer.UNKNOWN
    assert writer(_obj(("ancient-changes", holder), ("kubectl", holder)), path) is Writer.OTHER
    assert writer({"metadata": {}}, path) is Writer.UNKNOWN  # stripped
    assert writer(_obj(("coordinator", {"f:spec": {}})), path) is Writer.UNKNOWN  # nobody owns it
    assert writer(_obj(("coordinatorx", holder)), path) is Writer.OTHER  # not a coordinator manager
    assert owners({"metadata": {"managedFields": "garbage"}}, path) == ()


def test_with_records_restarts_the_records_of_a_stripped_object_and_claims_only_a_nonce() -> None:
    from coordinator.rules.evidence import A_RECORDS, with_records

    tracked = {"apiVersion": "v1", "metadata": {"managedFields": [{"manager": "coordinator", "fieldsV1": {}}]}}
    body = {"apiVersion": "v1", "metadata": {"annotations": {"a": "1"}}, "data": {"k": "v"}}
    assert with_records(body, tracked, "n") is body  # recorded already: unchanged
    stripped = {"apiVersion": "coordination.k8s.io/v1", "metadata": {}}
    out = with_records(body, stripped, "n1")
    assert out["metadata"]["annotations"] == {"a": "1", A_RECORDS: "n1"}
    (entry,) = out["metadata"]["managedFields"]
    assert entry["apiVersion"] == "coordination.k8s.io/v1" and entry["manager"].startswith("coordinator-")
    assert entry["fieldsV1"] == {"f:metadata": {"f:annotations": {"f:" + A_RECORDS: {}}}}
    assert body["metadata"] == {"annotations": {"a": "1"}}  # the caller's body is left alone
