"""`coordinator drift ...`: record the watched resources, and check them against the record."""

from __future__ import annotations

import json
from typing import Any

import click

from coordinator.cli.base import Group
from coordinator.cli.output import app_of, emit, run, say, table


class DriftGroup(Group):
    """`coordinator drift DEPLOYMENT` is `coordinator drift check DEPLOYMENT`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        asks_help = any(a in ("--help", "-h") for a in args)
        if args and not any(a in self.commands for a in args) and not (asks_help and len(args) == 1):
            args = ["check", *args]
        return super().parse_args(ctx, args)


def _coordinator(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.ops.api import Coordinator

    app = app_of(ctx)
    return Coordinator.from_config(app.config_path, timeout=app.timeout)


@click.group(cls=DriftGroup)
def drift() -> None:
    """Compare what each member runs with what the deployment's state recorded.

    `coordinator drift DEPLOYMENT` is `coordinator drift check DEPLOYMENT`.
    """


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _detail(f: Any) -> str:
    from coordinator.rules.expectations import Status

    if f.status is Status.DRIFTED:
        return ", ".join(d.path for d in f.fields)
    return str(f.detail)


@drift.command("check")
@click.argument("deployment")
@click.pass_context
def check(ctx: click.Context, deployment: str) -> None:
    """Read every watched resource on every member at once and compare it with the record.

    Per cluster and resource: match; drifted (a recorded field differs: both values, and
    who changed it last per the object's managedFields); gone (not found, with its
    namespace there); unobservable (no answer, forbidden, throttled, kind not served) -
    never taken as gone. Needs no lock.

    Exit status: 0 if everything observed matches; 8 if drift is confirmed anywhere; 4
    if, for some resource, fewer than a majority of its clusters could be read; 5 if a
    member's context leads to another cluster (nothing is compared).

    Example: coordinator drift check payments
    """
    from coordinator.ops.drift import check as check_drift
    from coordinator.rules.expectations import Status

    c = _coordinator(ctx)

    async def go() -> Any:
        async with c:
            return await check_drift(c, deployment)

    report = run(go)
    v = report.verdict
    doc = {
        "deployment": deployment,
        "state_version": report.version,
        "drifted": v.confirmed,
        "unsure": v.unsure,
        "findings": [f.to_doc() for f in report.findings],
    }

    def text() -> None:
        if not report.expectations:
            say(
                f"Nothing is watched for drift in {deployment}: record resources first with "
                f"`coordinator drift record {deployment} KIND/NAME ...` under the lock."
            )
            return
        table(
            ["cluster", "resource", "status", "detail"],
            [[f.cluster, f.ref.label, str(f.status), _detail(f)] for f in report.findings],
        )
        for f in v.drifted:
            if f.status is Status.GONE:
                say(f"{f.cluster}: {f.ref.label} is gone ({f.detail}).")
                continue
            for d in f.fields:
                by = d.changed_by.text() if d.changed_by else "no writer recorded"
                say(
                    f"{f.cluster}: {f.ref.label} {d.path} is {_value(d.actual)}, recorded {_value(d.recorded)}; "
                    f"changed by {by}."
                )
        if v.unobservable:
            names = sorted({f.cluster for f in v.unobservable})
            say(f"Not observed: {', '.join(names)}; what they hold is not known (never taken as gone).")
        if not v.confirmed and not v.unsure:
            seen = sum(1 for f in report.findings if f.status is Status.MATCH)
            say(f"No drift: {seen} of {len(report.findings)} resource reads match the record.")

    emit(ctx, doc, text)
    if (problem := report.problem()) is not None:
        raise problem


@drift.command("record")
@click.argument("deployment")
@click.argument("resources", nargs=-1, required=True)
@click.option(
    "--field",
    "fields",
    multiple=True,
    metavar="PATH",
    help="A field to watch, as a JSONPath like kubectl's (.spec.replicas, "
    ".spec.template.spec.containers[*].image); repeat for more [default: per kind, e.g. a "
    "Deployment's replicas and images, a ConfigMap's data, otherwise .spec].",
)
@click.option("--namespace", "-n", default=None, help="The resources' namespace [default: the deployment's namespace].")
@click.option("--cluster", default=None, help="Watch the resources on this member only [default: every member].")
@click.option(
    "--lock-id",
    envvar="COORDINATOR_LOCK_ID",
    default=None,
    help="Lock id [env COORDINATOR_LOCK_ID; default: the one recorded for this holder].",
)
@click.pass_context
def record(
    ctx: click.Context,
    deployment: str,
    resources: tuple[str, ...],
    fields: tuple[str, ...],
    namespace: str | None,
    cluster: str | None,
    lock_id: str | None,
) -> None:
    """Record what the RESOURCES are now on every member, as a new state version, under the lock.

    RESOURCE is KIND/NAME for Deployment, StatefulSet, DaemonSet, ConfigMap, Service or
    CronJob, otherwise GROUP/VERSION/KIND/NAME (VERSION/KIND/NAME in the core group).
    Each must be readable on every member it is watched on. Recording a resource again
    replaces its record; other resources' records stay.

    Example: coordinator drift record payments deployment/api configmap/api-settings
    """
    from coordinator.cli.state import write_doc, write_text
    from coordinator.ops.drift import record as record_drift
    from coordinator.ops.rbac import validate_namespace
    from coordinator.rules.expectations import parse_resource
    from coordinator.rules.fieldpaths import parse_field

    c = _coordinator(ctx)
    dep = c.deployment(deployment)
    if namespace is not None:
        validate_namespace(namespace)
    paths = [parse_field(f) for f in fields]
    refs = list(dict.fromkeys(parse_resource(r, namespace or dep.namespace, cluster) for r in resources))
    command = "drift record " + " ".join(resources)

    async def go() -> Any:
        async with c:
            return await record_drift(c, deployment, refs, paths, lock=lock_id, command=command[:200])

    report, recorded = run(go)
    doc = write_doc(report) | {"recorded": [e.to_doc() for e in recorded]}

    def text() -> None:
        write_text(report)
        for e in recorded:
            parts = []
            for f in e.fields:
                differs = ", ".join(f"{k}: {_value(v)}" for k, v in sorted(f.clusters.items()))
                parts.append(f"{f.path} = {_value(f.value)}" + (f" ({differs})" if differs else ""))
            say(f"Recorded {e.ref.label}: {'; '.join(parts)}.")

    emit(ctx, doc, text)
