"""How one cluster answered: the classification every multi-cluster operation reports."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    HELD_BY_OTHER = "held-by-other"
    CONFLICT = "conflict"
    UNREACHABLE = "unreachable"
    FORBIDDEN = "forbidden"
    # The API server refused the request for load (HTTP 429, API Priority and Fairness or
    # an admission webhook) and it could not be retried in time: nothing was done, and
    # nothing was seen.
    THROTTLED = "throttled"
    IDENTITY_MISMATCH = "identity-mismatch"
    ERROR = "error"

    @property
    def observable(self) -> bool:
        """False when we could not see the cluster: never treat that as free or empty."""
        return self not in (Outcome.UNREACHABLE, Outcome.FORBIDDEN, Outcome.THROTTLED, Outcome.ERROR)
