"""The lock's life as Kubernetes Events about its Lease, for `kubectl describe lease` and
`kubectl get events`.

Each moment the history records (coordinator/engine/history.py: acquired, released, broken,
expired, lost) is also written as one ``events.k8s.io/v1`` Event regarding the deployment's
Lease, on every member the moment touched. The Events are built from the history events
themselves, so both tell the same story.

Best effort and off the decision path: the engine hands them over after the decision, with
the history (see EngineCore.remember); each request is bounded by a short timeout, and a
failure (403 where the user's RBAC grants no Events, 404, a timeout) is logged at debug
level and dropped. A command's result and exit code never depend on them.

The note carries text another client may have written (holder, reason): it is escaped with
:func:`coordinator.text.printable` and cut to the 1 kB an Event note may hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from coordinator import clock
from coordinator.engine.clusters import ClusterSet
from coordinator.kube.client import KubeError
from coordinator.logs import get_logger
from coordinator.rules.lease import LeaseView
from coordinator.rules.resources import micro_time
from coordinator.text import printable

log = get_logger(__name__)

API_VERSION = "events.k8s.io/v1"
REPORTING_CONTROLLER = "coordinator.io/coordinator"
MAX_NOTE_BYTES = 1024  # what the API server accepts in an Event's note
MAX_INSTANCE = 128  # reportingInstance's limit
# Each Event request gives up after this long (or the per-cluster timeout, if shorter):
# they wait for nothing, but a closing command waits for its background writes.
EVENT_TIMEOUT_S = 2.0

# history event (coordinator/engine/history.py's EVENTS) -> (reason, action, type). Spelled out
# rather than imported: a Coordinator makes its writer for every lock engine, and a command
# that only looks (`lock status`) does not import the history.
LOST = "lost"
REASONS: dict[str, tuple[str, str, str]] = {
    "acquired": ("Acquired", "Acquire", "Normal"),
    "released": ("Released", "Release", "Normal"),
    "broken": ("Broken", "Break", "Warning"),
    "expired": ("TakenOver", "TakeOver", "Warning"),
    LOST: ("Lost", "Renew", "Warning"),
}


def events_path(namespace: str) -> str:
    return f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"


@dataclass(frozen=True)
class Touched:
    """One member's lease as a decision found it (``before``) and left it (``after``)."""

    before: LeaseView | None = None
    after: LeaseView | None = None

    @property
    def uid(self) -> str | None:
        return (self.after and self.after.uid) or (self.before and self.before.uid) or None

    def about(self, lock_id: str) -> bool:
        return any(v is not None and v.lock_id == lock_id for v in (self.before, self.after))


def cut_bytes(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, never inside a character."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."


def note(e: Mapping[str, Any]) -> str:
    """An Event's note for one history event: holder, lock id, token and reason, then who
    acted and what they saw. Every field is escaped (other clients may have written it)."""
    parts = [
        f"holder {e.get('holder') or '-'}",
        f"lock id {e['lock_id']}",
        f"fencing token {e['token'] if e.get('token') is not None else '-'}",
        f"reason {e.get('reason') or '-'}",
    ]
    if e.get("by") and e.get("by") != e.get("holder"):
        parts.append(f"by {e['by']}")
    if e.get("note"):
        parts.append(str(e["note"]))
    return cut_bytes(printable("; ".join(str(p) for p in parts)), MAX_NOTE_BYTES)


def event_body(
    e: Mapping[str, Any], *, namespace: str, lease: str, uid: str | None, instance: str | None = None
) -> dict[str, Any]:
    """The ``events.k8s.io/v1`` Event for history event ``e`` regarding ``lease``."""
    reason, action, kind = REASONS[e["event"]]
    regarding: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "namespace": namespace,
        "name": lease,
    }
    if uid:
        regarding["uid"] = uid
    return {
        "apiVersion": API_VERSION,
        "kind": "Event",
        # Named as Kubernetes names its own Events: the object's name and a unique suffix
        # (an Event's generateName may not end in the dot).
        "metadata": {"name": f"{lease}.{clock.token_hex(8)}", "namespace": namespace},
        "eventTime": micro_time(clock.wall_now()),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": cut_bytes(printable(instance or clock.host()), MAX_INSTANCE) or "unknown",
        "action": action,
        "reason": reason,
        "type": kind,
        "note": note(e),
        "regarding": regarding,
    }


def plan(
    events: list[dict[str, Any]], touched: Mapping[str, Touched], *, namespace: str, lease: str
) -> list[tuple[str, dict[str, Any]]]:
    """Which Event goes to which member: an event about a lock id on each member whose
    lease the decision found or left with that lock id; a loss on every member the renewal
    read (its leases there are what it lost)."""
    found: list[tuple[str, dict[str, Any]]] = []
    for e in events:
        if e.get("event") not in REASONS:
            continue
        for cluster, t in sorted(touched.items()):
            if e["event"] == LOST or t.about(e["lock_id"]):
                found.append((cluster, event_body(e, namespace=namespace, lease=lease, uid=t.uid)))
    return found


class LeaseEvents:
    """Writes the Events of :func:`plan` (the collaborator a Coordinator gives its lock
    engines; the simulator's Coordinators have none, so their requests stay the lock's)."""

    def __init__(self, *, timeout_s: float = EVENT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    async def post(
        self,
        clusters: ClusterSet,
        events: list[dict[str, Any]],
        touched: Mapping[str, Touched],
        *,
        namespace: str,
        lease: str,
        timeout: float,
    ) -> None:
        bodies = plan(events, touched, namespace=namespace, lease=lease)
        if not bodies:
            return
        limit = min(timeout, self.timeout_s)
        async with anyio.create_task_group() as tg:
            for cluster, body in bodies:
                tg.start_soon(self._one, clusters, cluster, body, namespace, limit)

    async def _one(
        self, clusters: ClusterSet, cluster: str, body: dict[str, Any], namespace: str, limit: float
    ) -> None:
        with anyio.move_on_after(limit + 0.5) as scope:
            try:
                await clusters.client(cluster).request("POST", events_path(namespace), body=body, timeout=limit)
            except KubeError as err:  # refused (403), gone (404), unreachable, timed out
                log.debug("lease event not written", cluster=cluster, reason=body["reason"], error=str(err))
            except Exception as err:  # anything else: still never the command's failure
                log.debug("lease event not written", cluster=cluster, reason=body["reason"], error=repr(err))
        if scope.cancelled_caught:
            log.debug("lease event not written", cluster=cluster, reason=body["reason"], error="timed out")
