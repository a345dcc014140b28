"""ValidatingAdmissionPolicies that turn writes away, as a policy engine, a quota or a
webhook outage would: the fault suite's reject-writes kinds and the tests that refuse
writes of the state, or renewals of a lease, on some members put one on a sandbox
cluster (straight to its API server, not through a proxy) and take it off again.

A policy and its binding share one name. A policy takes effect a moment after it is
created or deleted: when it is in force is for the caller to find out (a probe write).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator_sandbox.adminclient import AdminClient

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAP_BINDING = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def add_policy(
    admin: AdminClient,
    name: str,
    expression: str,
    message: str,
    *,
    operations: Sequence[str] = ("CREATE", "UPDATE"),
    api_group: str = "",
    resource: str = "configmaps",
    exist_ok: bool = True,
) -> None:
    """Create the policy ``name`` (writes of ``resource`` for which the CEL ``expression``
    is false are denied with ``message``) and its binding, which puts it in force."""
    admin.create(
        VAP,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [api_group],
                            "apiVersions": ["v1"],
                            "operations": list(operations),
                            "resources": [resource],
                        }
                    ]
                },
                "validations": [{"expression": expression, "message": message}],
            },
        },
        exist_ok=exist_ok,
    )
    admin.create(
        VAP_BINDING,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
        exist_ok=exist_ok,
    )


def remove_policy(admin: AdminClient, name: str) -> None:
    """Delete the binding and the policy ``name`` (either one already gone is fine)."""
    admin.delete(f"{VAP_BINDING}/{name}")
    admin.delete(f"{VAP}/{name}")
