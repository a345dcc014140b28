"""`coordinator deployment ...`: create, list, show, delete, import."""

from __future__ import annotations

import click
from click.core import ParameterSource

from coordinator.cli.base import Group, prints_names
from coordinator.cli.output import app_of, emit, run, say, table


def _store(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.config.store import ConfigStore

    return ConfigStore(app_of(ctx).config_path)


@click.group(cls=Group)
def deployment() -> None:
    """Define which clusters a deployment spans, and in which namespace."""


@deployment.command("create")
@click.argument("name")
@click.option("--namespace", "-n", required=True, help="Namespace of the deployment on every member.")
@click.option("--cluster", "members", multiple=True, required=True, help="Member cluster (repeat for each).")
@click.option(
    "--storage",
    type=click.Choice(["configmap", "secret"]),
    default="configmap",
    show_default=True,
    help="Kind of object that holds the state.",
)
@click.option(
    "--max-ttl",
    default="10m",
    show_default=True,
    help="Longest lease TTL allowed (at most 24h); a lease found deleted counts as held by an unknown "
    "holder this long.",
)
@click.pass_context
def create(ctx: click.Context, name: str, namespace: str, members: tuple[str, ...], storage: str, max_ttl: str) -> None:
    """Create a deployment spanning the given clusters (creates the namespace where allowed).

    Example: coordinator deployment create payments -n payments --cluster eu-1 --cluster eu-2 --cluster us-1
    """
    from coordinator.engine.clusters import ClusterSet
    from coordinator.ops.admin import create_deployment
    from coordinator.rules.durations import parse_duration

    app = app_of(ctx)
    max_ttl_s = parse_duration(max_ttl, what="--max-ttl")
    store = _store(ctx)
    cfg = store.load()

    async def go():  # type: ignore[no-untyped-def]
        cs = ClusterSet(cfg, timeout=app.timeout, config_path=store.path)
        try:
            return await create_deployment(store, cs, name, namespace, list(members), storage, max_ttl_s)
        finally:
            await cs.aclose()

    rec, results = run(go)
    doc = {
        "name": rec.name,
        "namespace": rec.namespace,
        "clusters": rec.clusters,
        "quorum": rec.quorum,
        "storage": rec.storage,
        "max_ttl_s": rec.max_ttl_s,
        "namespace_on_clusters": [
            {"name": k, "outcome": str(results[k].outcome), "detail": results[k].detail}
            for k in rec.clusters
            if k in results
        ],
    }

    def text() -> None:
        say(
            f"Created deployment {rec.name} in namespace {rec.namespace} on {len(rec.clusters)} clusters "
            f"(quorum {rec.quorum})."
        )
        table(["cluster", "namespace"], [[k, f"{r.outcome}: {r.detail}"] for k, r in sorted(results.items())])

    emit(ctx, doc, text)


@deployment.command("list")
@click.pass_context
@prints_names
def list_(ctx: click.Context) -> None:
    """List deployments.

    Example: coordinator deployment list
    """
    cfg = _store(ctx).load()
    docs = [
        {"name": d.name, "namespace": d.namespace, "clusters": d.clusters, "quorum": d.quorum, "storage": d.storage}
        for d in cfg.deployments.values()
    ]

    def text(wide: bool = False) -> None:
        if not docs:
            say("No deployments. Create one with `coordinator deployment create NAME -n NS --cluster A ...`.")
            return
        more = ["storage"] if wide else []  # the clusters stay last: the longest cell
        table(
            ["name", "namespace", "quorum", *more, "clusters"],
            [
                [
                    d["name"],
                    d["namespace"],
                    f"{d['quorum']}/{len(d['clusters'])}",
                    *([d["storage"]] if wide else []),
                    ",".join(d["clusters"]),
                ]
                for d in docs
            ],
        )

    emit(ctx, docs, text, names=lambda: [f"deployment/{d['name']}" for d in docs], wide=lambda: text(wide=True))


@deployment.command("show")
@click.argument("name")
@click.pass_context
@prints_names
def show(ctx: click.Context, name: str) -> None:
    """Show one deployment.

    Example: coordinator deployment show payments -o yaml
    """
    from coordinator.ops.admin import deployment_document
    from coordinator.ops.api import Coordinator

    store = _store(ctx)
    cfg = store.load()
    app = app_of(ctx)
    c = Coordinator(cfg, timeout=app.timeout)
    dep = c.deployment(name)
    doc = deployment_document(cfg, dep)

    async def stored() -> dict[str, str]:
        async with c:
            return await c.lock_engine(name).stored_sets()

    # What the members store (the member set that counts), beside this machine's record.
    doc["stored_member_sets"] = run(stored)
    emit(
        ctx,
        doc,
        lambda: table(
            ["field", "value"],
            [
                [
                    k,
                    "; ".join(f"{m}: {t}" for m, t in v.items())
                    if isinstance(v, dict)
                    else (",".join(v) if isinstance(v, list) else v),
                ]
                for k, v in doc.items()
            ],
        ),
        names=lambda: [f"deployment/{name}"],
    )


@deployment.command("delete")
@click.argument("name")
@click.option(
    "--purge", is_flag=True, help="Also delete the tool's lease and state objects from the clusters (under the lock)."
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation with --purge.")
@click.pass_context
def delete(ctx: click.Context, name: str, purge: bool, yes: bool) -> None:
    """Delete the local record of a deployment (with --purge, its in-cluster objects too).

    Example: coordinator deployment delete payments
    """
    from coordinator.ops.admin import delete_deployment_record

    store = _store(ctx)
    purged: dict[str, str] = {}
    if purge:
        from coordinator.ops.purge import purge_deployment

        if not yes:
            click.confirm(f"Delete the lease and state of {name!r} from every member cluster?", abort=True)
        app = app_of(ctx)
        purged = run(lambda: purge_deployment(store, name, timeout=app.timeout))
    delete_deployment_record(store, name)

    def text() -> None:
        if not purge:
            say(f"Deleted deployment {name} (local record only; nothing in the clusters changed).")
            return
        say(f"Deleted deployment {name} and its lease and state objects on {len(purged)} cluster(s).")
        table(["cluster", "outcome"], [[k, v] for k, v in purged.items()])

    emit(ctx, {"deleted": name, "purged": purged}, text)


@deployment.command("import")
@click.argument("name")
@click.option("--cluster", "source", required=True, help="A connected member cluster to read the deployment from.")
@click.option("--namespace", "-n", default=None, help="Namespace to look in [default: search every namespace].")
@click.pass_context
def import_(ctx: click.Context, name: str, source: str, namespace: str | None) -> None:
    """Rebuild the local record of a deployment from what is stored in a member cluster.

    Example: coordinator deployment import payments --cluster eu-1
    """
    from coordinator.ops.importer import import_deployment

    app = app_of(ctx)
    rec, origin = run(lambda: import_deployment(_store(ctx), name, source, namespace, timeout=app.timeout))
    emit(
        ctx,
        {
            "name": rec.name,
            "namespace": rec.namespace,
            "clusters": rec.clusters,
            "source": origin,
            "max_ttl_s": rec.max_ttl_s,
        },
        lambda: say(
            f"Imported deployment {rec.name} (namespace {rec.namespace}, clusters "
            f"{', '.join(rec.clusters)}, max TTL {rec.max_ttl_s:g}s) from the {origin} on {source}."
        ),
    )


def _change(
    ctx: click.Context,
    name: str,
    *,
    add: str | None = None,
    remove: str | None = None,
    lock_id: str | None,
    holder: str | None,
    ttl: str,
    wait: str = "0s",
    force_dead: bool = False,
) -> None:
    from coordinator.ops.api import Coordinator
    from coordinator.ops.reconfig import change_members, new_members
    from coordinator.rules.durations import TTL_MIN, parse_duration

    app = app_of(ctx)
    ttl_s = parse_duration(ttl, what="--ttl", at_least=TTL_MIN[0], why=TTL_MIN[1])
    wait_s = parse_duration(wait, what="--wait")
    c = Coordinator.from_config(app.config_path, timeout=app.timeout)
    rec = c.deployment(name)
    if ctx.get_parameter_source("ttl") is ParameterSource.DEFAULT:
        ttl_s = min(ttl_s, rec.max_ttl_s)  # a deployment made with a short --max-ttl
    if rec.joint is not None:
        target = list(rec.joint)
        say(f"Finishing the change of {name} to {', '.join(target)} that is in progress.")
    else:
        target = new_members(rec, add=add, remove=remove)

    async def go():  # type: ignore[no-untyped-def]
        async with c:
            return await change_members(
                c,
                name,
                target,
                lock_id=lock_id,
                holder=holder,
                ttl=ttl_s,
                wait=wait_s,
                force_dead=[remove] if force_dead and remove else None,
            )

    report = run(go)

    def text() -> None:
        say(
            f"Deployment {name} now spans {', '.join(report.new)} (was {', '.join(report.old)}); "
            f"configuration epoch {report.epoch}."
        )
        for step in report.steps:
            say(f"  - {step}")
        say("Other machines must run `coordinator deployment import` to adopt it (they are refused until then).")

    emit(ctx, report.document(), text)


_change_lock_id = click.option(
    "--lock-id",
    envvar="COORDINATOR_LOCK_ID",
    default=None,
    help="Run under this lock (held by you) instead of taking it.",
)
_change_holder = click.option("--holder", envvar="COORDINATOR_HOLDER", default=None, help="Who takes the lock.")
_change_ttl = click.option(
    "--ttl",
    default="60s",
    help="TTL of the lock held during the change [default: 60s, or the deployment's --max-ttl if shorter].",
)
_change_wait = click.option(
    "--wait", default="0s", show_default=True, help="Wait this long for the lock if it is held."
)


@deployment.command("add-cluster")
@click.argument("name")
@click.argument("cluster")
@_change_lock_id
@_change_holder
@_change_ttl
@_change_wait
@click.pass_context
def add_cluster(
    ctx: click.Context, name: str, cluster: str, lock_id: str | None, holder: str | None, ttl: str, wait: str
) -> None:
    """Add a member, through a joint configuration, under the lock (resumable).

    Example: coordinator deployment add-cluster payments us-2
    """
    _change(ctx, name, add=cluster, lock_id=lock_id, holder=holder, ttl=ttl, wait=wait)


@deployment.command("remove-cluster")
@click.argument("name")
@click.argument("cluster")
@click.option(
    "--force-dead",
    is_flag=True,
    help="The cluster is gone for good: remove it without asking it (the rest must hold a majority of the new set).",
)
@_change_lock_id
@_change_holder
@_change_ttl
@_change_wait
@click.pass_context
def remove_cluster(
    ctx: click.Context,
    name: str,
    cluster: str,
    force_dead: bool,
    lock_id: str | None,
    holder: str | None,
    ttl: str,
    wait: str,
) -> None:
    """Remove a member, through a joint configuration, under the lock (resumable).

    Example: coordinator deployment remove-cluster payments eu-3 --force-dead
    """
    _change(ctx, name, remove=cluster, lock_id=lock_id, holder=holder, ttl=ttl, wait=wait, force_dead=force_dead)


@deployment.command("replace-cluster")
@click.argument("name")
@click.argument("old")
@click.argument("new")
@_change_lock_id
@_change_holder
@_change_ttl
@_change_wait
@click.pass_context
def replace_cluster(
    ctx: click.Context, name: str, old: str, new: str, lock_id: str | None, holder: str | None, ttl: str, wait: str
) -> None:
    """Replace a member (e.g. a rebuilt cluster connected under a new name), through a joint
    configuration, under the lock (resumable).

    Example: coordinator deployment replace-cluster payments eu-3 eu-3b
    """
    _change(ctx, name, add=new, remove=old, lock_id=lock_id, holder=holder, ttl=ttl, wait=wait)
