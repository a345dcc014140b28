"""A violation the fault suite finds is explained from the run's output alone: the faults,
the sections and the API servers' audit log of Lease writes around it, in one time line."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from faults.audit import read_writes
from faults.checkers import check_mutual_exclusion
from faults.recorder import Report

WALL = 1_800_000_000.0  # wall clock at machine-clock reading 0 in these histories


def _stamp(machine: float) -> str:
    return datetime.fromtimestamp(WALL + machine, UTC).isoformat().replace("+00:00", "Z")


def _event(machine: float, verb: str, name: str, *, holder: str = "", token: str = "", ns: str = "torture") -> str:
    annotations = {"coordinator.io/fencing-token": token, "coordinator.io/holder": "x"}
    obj = {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"holderIdentity": holder},
    }
    return json.dumps(
        {
            "stage": "ResponseComplete",
            "verb": verb,
            "requestURI": f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}?fieldManager=coordinator",
            "objectRef": {"resource": "leases", "namespace": ns, "name": name},
            "responseStatus": {"code": 200},
            "responseObject": obj,
            "stageTimestamp": _stamp(machine),
        }
    )


def _logs(tmp: Path) -> Path:
    logs = tmp / "logs"
    logs.mkdir()
    (logs / "cluster-1-apiserver-audit.log").write_text(
        "\n".join(
            [
                _event(99.0, "update", "coordinator-lock-torture", holder="lock-a", token="19"),
                _event(99.5, "update", "apiserver-xyz", holder="kube", ns="kube-system"),
                '{"stage": "ResponseComplete", "verb": "upd',  # cut short by a kill
                _event(100.2, "update", "coordinator-lock-torture", holder="lock-b", token="20"),
                _event(200.0, "update", "coordinator-lock-torture", holder="lock-c", token="21"),
            ]
        )
        + "\n"
    )
    (logs / "cluster-2-apiserver-2-audit.log").write_text(
        _event(100.1, "update", "coordinator-lock-torture", holder="lock-b", token="20") + "\n"
    )
    return logs


def test_audit_writes_are_read_in_time_order_without_the_servers_own(tmp_path: Path) -> None:
    writes = read_writes(_logs(tmp_path))
    assert [(w.cluster, w.server, w.holder, w.token) for w in writes] == [
        (1, "apiserver", "lock-a", "19"),
        (2, "apiserver-2", "lock-b", "20"),
        (1, "apiserver", "lock-b", "20"),
        (1, "apiserver", "lock-c", "21"),
    ]
    assert writes[0].describe() == (
        "c1 update leases/coordinator-lock-torture -> 200 holder=lock-a (x) token=19 by coordinator"
    )


def test_an_overlap_is_explained_with_faults_sections_and_lease_writes_around_it(tmp_path: Path) -> None:
    sections = [
        {"process": "api1", "mode": "api", "token": 19, "enter": 100.0, "exit": 100.7, "how": "left"},
        {"process": "run1", "mode": "run", "token": 20, "enter": 100.4, "exit": 102.0, "how": "tree"},
    ]
    check = check_mutual_exclusion(sections)
    assert check.kinds == ["overlap"] and check.violations[0].window == (100.0, 100.4)
    report = Report(
        sections=sections,
        operations=[],
        faults=Counter(),
        checks=[check],
        problems=[],
        stats=Counter(),
        notes=[(95.0, "fault: delete the Lease on [1]"), (50.0, "fault: long before"), (99.0, "not a fault")],
        started=90.0,
        wall_offset=WALL,
        audit_logs=_logs(tmp_path),
    )
    lines = report.explain()
    assert lines == [
        "around 10.00s-10.40s:",
        "  [    5.00s] fault: delete the Lease on [1]",
        "  [    9.00s] c1 update leases/coordinator-lock-torture -> 200 holder=lock-a (x) token=19 by coordinator",
        "  [   10.00s] api1 enters its section, token 19",
        "  [   10.10s] c2 update leases/coordinator-lock-torture -> 200 holder=lock-b (x) token=20 by coordinator",
        "  [   10.20s] c1 update leases/coordinator-lock-torture -> 200 holder=lock-b (x) token=20 by coordinator",
        "  [   10.40s] run1 enters its section, token 20",
        "  [   10.70s] api1 leaves its section, token 19 (left)",
    ]
    assert "\n".join(lines) in report.render()


def test_without_an_audit_log_the_time_line_says_so(tmp_path: Path) -> None:
    sections = [
        {"process": "a", "mode": "api", "token": 1, "enter": 1.0, "exit": 3.0, "how": "left"},
        {"process": "b", "mode": "api", "token": 2, "enter": 2.0, "exit": 4.0, "how": "left"},
    ]
    report = Report(
        sections=sections,
        operations=[],
        faults=Counter(),
        checks=[check_mutual_exclusion(sections)],
        problems=[],
        stats=Counter(),
        audit_logs=tmp_path / "missing",
    )
    assert report.explain()[0] == "around 1.00s-2.00s (no audit log):"
    passing = Report(sections=sections[:1], operations=[], faults=Counter(), checks=[], problems=[], stats=Counter())
    assert passing.explain() == []
