"""The max-ttl note on a lease: believed only within a day and when coordinator wrote it; import takes the largest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.cli import run_cli

integration = pytest.mark.integration


def _noted(note: str | None, duration: int | None = 60) -> Any:
    """A lease as coordinator leaves it: its max-TTL note and its duration under the
    coordinator field manager."""
    from coordinator.rules.lease import LeaseView

    fields: dict[str, Any] = {"f:spec": {"f:leaseDurationSeconds": {}}}
    annotations = {}
    if note is not None:
        annotations["coordinator.io/max-ttl"] = note
        fields["f:metadata"] = {"f:annotations": {"f:coordinator.io/max-ttl": {}}}
    obj = {
        "metadata": {
            "name": "coordinator-lock-web",
            "annotations": annotations,
            "managedFields": [{"manager": "coordinator", "operation": "Update", "fieldsV1": fields}],
        },
        "spec": {"leaseDurationSeconds": duration} if duration else {},
    }
    return LeaseView.parse(obj)


def test_a_max_ttl_note_longer_than_a_day_is_not_believed_even_under_the_coordinator_manager() -> None:
    from coordinator.rules.lease import MAX_MAX_TTL_S, effective_ttl

    assert _noted(str(MAX_MAX_TTL_S)).max_ttl_note == MAX_MAX_TTL_S
    for note in (str(MAX_MAX_TTL_S + 1), "100000000"):
        view = _noted(note, duration=None)
        assert view.max_ttl_note is None
        assert effective_ttl(view, 6) == 6


def test_a_deployment_cannot_be_made_with_a_max_ttl_no_lease_note_would_be_believed_for(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "deployment", "create", "web", "-n", "ns", "--cluster", "c1", "--max-ttl", "25h")
    assert proc.returncode == 2 and "at most 24h" in proc.stderr, proc.stderr


def test_import_takes_the_largest_note_and_never_less_than_the_default_unless_all_agree() -> None:
    from coordinator.ops.importer import imported_max_ttl
    from coordinator.rules.lease import DEFAULT_MAX_TTL_S

    # Every member stores the same short maximum, and no lease is held for longer: taken.
    assert imported_max_ttl({"c1": _noted("15", 10), "c2": _noted("15", 15), "c3": _noted("15", None)}) == (15, None)
    # A note planted on one member is outvoted, either way: the largest, never below the default.
    low, why = imported_max_ttl({"c1": _noted("1"), "c2": _noted("120"), "c3": _noted("120")})
    assert low == DEFAULT_MAX_TTL_S and why and "c1: 1s" in why
    high, why = imported_max_ttl({"c1": _noted("3600"), "c2": _noted("120"), "c3": None})
    assert high == 3600 and why and "c3: none" in why
    # All lowered alike, but a live lease is held for longer than the note says: planted.
    planted, why = imported_max_ttl({"c1": _noted("1", 60), "c2": _noted("1", 60), "c3": _noted("1", 60)})
    assert planted == DEFAULT_MAX_TTL_S and why and "held for longer" in why
    # A member that could not be read is no agreement; no note anywhere: the default.
    assert imported_max_ttl({"c1": _noted("15", 10), "c2": _noted("15", 10), "c3": None})[0] == DEFAULT_MAX_TTL_S
    assert imported_max_ttl({"c1": _noted(None), "c2": None}) == (DEFAULT_MAX_TTL_S, None)
