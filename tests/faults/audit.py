"""What the API servers say was written: the sandbox's audit logs, read when a check fails.

The torture's sandbox runs with ``up(audit=True)``: every kube-apiserver logs each write
of a Lease with the object it answered, and each write of a ConfigMap (the state
objects) by who and when. When the lock check finds an overlap, the report lists the
writes around it, cluster by cluster, next to the faults and the sections of that time,
so that a failure seen once in CI can be explained from its output alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_PREFIX = "coordinator.io/"
_LOG_NAME = re.compile(r"cluster-(\d+)-(apiserver(?:-\d+)?)-audit\.log$")


@dataclass(frozen=True)
class Write:
    """One write an API server answered (the audit event's ResponseComplete stage)."""

    at: float  # wall clock, seconds since the epoch (the server's stage time stamp)
    cluster: int
    server: str
    verb: str
    resource: str
    namespace: str
    name: str
    code: int
    manager: str
    agent: str
    holder: str = ""  # spec.holderIdentity of the Lease as answered
    who: str = ""  # the holder annotation
    token: str = ""
    marks: str = ""  # other notable annotations: vanished, released-at, a break

    def describe(self) -> str:
        what = f"{self.resource}/{self.name}"
        parts = [f"c{self.cluster} {self.verb} {what} -> {self.code}"]
        if self.resource == "leases" and self.code < 300:
            parts.append(f"holder={self.holder or '-'}")
            if self.who:
                parts.append(f"({self.who})")
            parts.append(f"token={self.token or '-'}")
            if self.marks:
                parts.append(self.marks)
        parts.append(f"by {self.manager or '?'}")
        return " ".join(parts)


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _event(line: str, cluster: int, server: str) -> Write | None:
    try:
        e = json.loads(line)
    except ValueError:
        return None  # a line cut short by a kill
    if e.get("stage") != "ResponseComplete" or not isinstance(e.get("objectRef"), dict):
        return None
    ref = e["objectRef"]
    query = parse_qs(urlsplit(str(e.get("requestURI", ""))).query)
    obj = _mapping(e.get("responseObject"))
    meta = _mapping(obj.get("metadata"))
    ann = _mapping(meta.get("annotations"))
    spec = _mapping(obj.get("spec"))
    marks = [k.removeprefix(_PREFIX) for k in ("vanished", "released-at", "last-break") if _PREFIX + k in ann]
    try:
        at = _stamp(str(e.get("stageTimestamp") or e.get("requestReceivedTimestamp")))
    except ValueError:
        return None
    return Write(
        at=at,
        cluster=cluster,
        server=server,
        verb=str(e.get("verb", "")),
        resource=str(ref.get("resource", "")),
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int((e.get("responseStatus") or {}).get("code", 0)),
        manager=(query.get("fieldManager") or [""])[0],
        agent=str(e.get("userAgent", "")),
        holder=str(spec.get("holderIdentity") or ""),
        who=str(ann.get(_PREFIX + "holder", "")),
        token=str(ann.get(_PREFIX + "fencing-token", "")),
        marks=" ".join(marks),
    )


def read_writes(logs: Path, skip_namespaces: Iterable[str] = ("kube-system",)) -> list[Write]:
    """Every write in the audit logs under ``logs``, oldest first (the servers' own
    leases and config in kube-system left out)."""
    skip = set(skip_namespaces)
    found: list[Write] = []
    for path in sorted(logs.glob("cluster-*-audit.log")):
        m = _LOG_NAME.search(path.name)
        if m is None:
            continue
        with path.open(errors="replace") as fh:
            for line in fh:
                w = _event(line, int(m.group(1)), m.group(2))
                if w is not None and w.namespace not in skip:
                    found.append(w)
    found.sort(key=lambda w: w.at)
    return found


def between(writes: Iterable[Write], start: float, end: float) -> Iterator[Write]:
    return (w for w in writes if start <= w.at <= end)
