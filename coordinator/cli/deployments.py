"""`coordinator deployment ...`: create, list, show, delete, import."""

from __future__ import annotations

import click

from coordinator.cli.output import app_of, emit, run, say, table


def _store(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.config import ConfigStore

    return ConfigStore(app_of(ctx).config_path)


@click.group()
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
    help="Longest lease TTL allowed; a lease found deleted counts as held by an unknown holder this long.",
)
@click.pass_context
def create(ctx: click.Context, name: str, namespace: str, members: tuple[str, ...], storage: str, max_ttl: str) -> None:
    """Create a deployment spanning the given clusters (creates the namespace where allowed).

    Example: coordinator deployment create payments -n payments --cluster eu-1 --cluster eu-2 --cluster us-1
    """
    from coordinator.admin import create_deployment
    from coordinator.clusters import ClusterSet
    from coordinator.durations import parse_duration

    app = app_of(ctx)
    max_ttl_s = parse_duration(max_ttl, what="--max-ttl")
    store = _store(ctx)
    cfg = store.load()

    async def go():  # type: ignore[no-untyped-def]
        cs = ClusterSet(cfg, timeout=app.timeout)
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
def list_(ctx: click.Context) -> None:
    """List deployments.

    Example: coordinator deployment list
    """
    cfg = _store(ctx).load()
    docs = [
        {"name": d.name, "namespace": d.namespace, "clusters": d.clusters, "quorum": d.quorum, "storage": d.storage}
        for d in cfg.deployments.values()
    ]

    def text() -> None:
        if not docs:
            say("No deployments. Create one with `coordinator deployment create NAME -n NS --cluster A ...`.")
            return
        table(
            ["name", "namespace", "quorum", "clusters"],
            [[d["name"], d["namespace"], f"{d['quorum']}/{len(d['clusters'])}", ",".join(d["clusters"])] for d in docs],
        )

    emit(ctx, docs, text)


@deployment.command("show")
@click.argument("name")
@click.pass_context
def show(ctx: click.Context, name: str) -> None:
    """Show one deployment.

    Example: coordinator deployment show payments -o yaml
    """
    from coordinator.admin import deployment_document
    from coordinator.api import Coordinator

    store = _store(ctx)
    cfg = store.load()
    dep = Coordinator(cfg).deployment(name)
    doc = deployment_document(cfg, dep)
    emit(
        ctx,
        doc,
        lambda: table(["field", "value"], [[k, ",".join(v) if isinstance(v, list) else v] for k, v in doc.items()]),
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
    from coordinator.admin import delete_deployment_record

    store = _store(ctx)
    purged: dict[str, str] = {}
    if purge:
        from coordinator.purge import purge_deployment

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
    from coordinator.importer import import_deployment

    app = app_of(ctx)
    rec, origin = run(lambda: import_deployment(_store(ctx), name, source, namespace, timeout=app.timeout))
    emit(
        ctx,
        {"name": rec.name, "namespace": rec.namespace, "clusters": rec.clusters, "source": origin},
        lambda: say(
            f"Imported deployment {rec.name} (namespace {rec.namespace}, clusters "
            f"{', '.join(rec.clusters)}) from the {origin} on {source}."
        ),
    )
