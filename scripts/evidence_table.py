"""Print the evidence table (docs/evidence.md) from coordinator/rules/evidence.py's EVIDENCE.

    python scripts/evidence_table.py > docs/evidence.md

tests/lock/unit/test_evidence_table.py fails when the file and the list disagree.
"""

from __future__ import annotations

from coordinator.rules.evidence import EVIDENCE

HEAD = """# Evidence: every field a rule reads, and who may write it

A rule of the lock or of the state register reads a field only as far as coordinator wrote
it: a coordinator field manager (`coordinator`, `coordinator-…`) must own the field in the
object's `metadata.managedFields`. Anyone who may edit the object can write any field, and
the API server then hands the field to that writer's manager. Where the record of the
writer is gone, the field has no known writer and is not coordinator's word either:
managedFields stripped, a field owned by `before-first-apply`, or one owned by
`ancient-changes` (the API server keeps at most ten Update entries and merges the oldest,
coordinator's among them, into that one when more field managers update the object, as
another client adding annotations under eleven managers of its own does). What the rules
do then is in the fourth column: they ignore the field, count the object as missing, or
block; an edit by another client never frees a lock and never lowers a fencing token. It
keeps a dead lock no longer than its own TTL plus margin, except where the record of
coordinator's writes is gone (stripped, or merged into `ancient-changes`): then one
maximum TTL of local observation, which further edits of fields the lock rules do not read
never restart. Writes under a manager named `coordinator` are taken as coordinator's own,
whoever makes them (see [What is assumed](assumptions.md)).

This table is generated from `coordinator/rules/evidence.py` (`python scripts/evidence_table.py`),
the module every rule asks; a unit test keeps the two equal.

| field | read by | who may write it | when another client wrote it, or it is missing | test |
| --- | --- | --- | --- | --- |
"""


def render() -> str:
    rows = [f"| {e.field} | {e.read_by} | {e.writers} | {e.otherwise} | `{e.test}` |" for e in EVIDENCE]
    return HEAD + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render(), end="")
