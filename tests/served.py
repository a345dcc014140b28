"""Objects as an API server returns them after coordinator wrote them: with managedFields.

The pure rules trust a field only where a coordinator field manager owns it
(coordinator/rules/evidence.py); an object made up in a test has no managedFields at all, which
reads as "no recorded writer". ``served`` adds the entry the server would have recorded.
"""

from __future__ import annotations

import copy
from typing import Any


def served(obj: dict[str, Any] | None, manager: str = "coordinator") -> dict[str, Any] | None:
    """``obj`` with ``manager`` owning every data key, annotation and spec field it has."""
    if obj is None:
        return None
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    fields: dict[str, Any] = {}
    if meta.get("annotations"):
        fields["f:metadata"] = {"f:annotations": {"f:" + k: {} for k in meta["annotations"]}}
    if isinstance(out.get("data"), dict) and out["data"]:
        fields["f:data"] = {"f:" + k: {} for k in out["data"]}
    if isinstance(out.get("spec"), dict) and out["spec"]:
        fields["f:spec"] = {"f:" + k: {} for k in out["spec"]}
    meta["managedFields"] = [
        {"manager": manager, "operation": "Update", "time": "2026-12-01T12:00:00Z", "fieldsV1": fields}
    ]
    return out
