"""The names of the fault kinds a torture run injects (:mod:`faults.schedule` injects them)."""

from __future__ import annotations

from collections.abc import Sequence

FAULT_KINDS = (
    "pause-minority",
    "pause-majority",
    "kill-apiserver",
    "latency",
    "cut-minority",
    "cut-majority",
    "lose-responses",
    "drop-requests",
    "sigkill-holder",
    "sigstop-holder",
    # Other clients of the Lease, while someone holds it.
    "annotate-lease",
    "apply-lease",
    "strip-managed-fields",
    "edit-lease-duration",
    # Another field manager writes any value into any field a rule reads (docs/evidence.md).
    "foreign-writes",
    # Objects deleted.
    "delete-lease-one",
    "delete-lease-all",
    "delete-state-one",
    "recreate-namespace",
    # Writes of the state rejected by an admission policy.
    "reject-writes-minority",
    "reject-writes-majority",
    # The operator and `lock run`.
    "break-holder",
    "sigkill-lock-run",
    # The member set changes (and comes back to its size) while contenders run.
    "add-member",
    "remove-member",
    "replace-member",
)


OTHER_CLIENT_FAULTS = ("annotate-lease", "apply-lease", "strip-managed-fields", "edit-lease-duration", "foreign-writes")
DELETION_FAULTS = ("delete-lease-one", "delete-lease-all", "delete-state-one", "recreate-namespace")
MEMBER_FAULTS = ("add-member", "remove-member", "replace-member")
# Targeted schedules, not in the default rounds (``--kinds`` names them).
# foreign-token: the foreign-writes kind held to one edit, the fencing token annotated lower
# on a majority of leases by a plain update (the edit the evidence issue reproduced).
TARGETED_KINDS = ("split-write", "foreign-token")


def check_kinds(kinds: Sequence[str]) -> None:
    unknown = sorted(set(kinds) - set(FAULT_KINDS) - set(TARGETED_KINDS))
    if unknown:
        known = ", ".join(FAULT_KINDS + TARGETED_KINDS)
        raise ValueError(f"unknown fault kinds: {', '.join(unknown)} (known: {known})")
