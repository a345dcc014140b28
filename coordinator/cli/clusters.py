"""`coordinator cluster ...`: connect, list, info, disconnect, restored."""

from __future__ import annotations

from typing import Any

import click

from coordinator.cli.base import Group, prints_names
from coordinator.cli.output import app_of, emit, run, say, table, utc_text


def _store(ctx: click.Context):  # type: ignore[no-untyped-def]
    from coordinator.config.store import ConfigStore

    return ConfigStore(app_of(ctx).config_path)


@click.group(cls=Group)
def cluster() -> None:
    """Connect clusters and inspect them (identity, reachability, permissions)."""


@cluster.command("connect")
@click.argument("name")
@click.option("--context", default=None, help="kubeconfig context that leads to the cluster.")
@click.option(
    "--kubeconfig", default=None, help="kubeconfig path(s), ':'-separated [default: KUBECONFIG or ~/.kube/config]."
)
@click.option(
    "--in-cluster",
    is_flag=True,
    help="Use this pod's ServiceAccount (KUBERNETES_SERVICE_HOST/PORT, its token and CA) instead of a context.",
)
@click.option(
    "--serviceaccount-dir",
    default=None,
    help="With --in-cluster: where token and ca.crt are [env COORDINATOR_SERVICEACCOUNT_DIR; "
    "default /var/run/secrets/kubernetes.io/serviceaccount].",
)
@click.option(
    "--identity-namespace",
    default="default",
    show_default=True,
    help="Where to keep the UUID ConfigMap if kube-system cannot be read.",
)
@click.pass_context
def connect(
    ctx: click.Context,
    name: str,
    context: str | None,
    kubeconfig: str | None,
    in_cluster: bool,
    serviceaccount_dir: str | None,
    identity_namespace: str,
) -> None:
    """Record a cluster under NAME after proving its identity.

    Example: coordinator cluster connect eu-1 --context kind-eu-1

    In a pod (a CI job on Kubernetes), the cluster it runs in:

    Example: coordinator cluster connect home --in-cluster
    """
    from coordinator.errors import UsageError
    from coordinator.kube.kubeconfig import IN_CLUSTER_CONTEXT, service_account_dir
    from coordinator.ops.admin import connect_cluster

    if in_cluster == (context is not None):
        raise UsageError("Give either --context CONTEXT or --in-cluster (one of them).")
    if not in_cluster and serviceaccount_dir is not None:
        raise UsageError("--serviceaccount-dir goes with --in-cluster.")
    if in_cluster and kubeconfig is not None:
        raise UsageError("--kubeconfig goes with --context, not with --in-cluster.")
    sa_dir = service_account_dir(serviceaccount_dir) if in_cluster else None
    app = app_of(ctx)
    rec, version = run(
        lambda: connect_cluster(
            _store(ctx),
            name,
            context or IN_CLUSTER_CONTEXT,
            kubeconfig,
            identity_namespace=identity_namespace,
            timeout=app.timeout,
            in_cluster=sa_dir,
        )
    )
    doc = rec.model_dump(mode="json") | {"version": version}

    def text() -> None:
        from coordinator.kube.identity import KUBE_SYSTEM_UID, describe_identity

        src = describe_identity(rec.identity_source, rec.identity_namespace)
        if rec.identity_source != KUBE_SYSTEM_UID:
            src += " (kube-system is not readable)"
        say(f"Connected {rec.name}: {rec.server} (Kubernetes {version}), context {rec.context}.")
        say(f"Identity {rec.identity}, from the {src}.")

    emit(ctx, doc, text)


@cluster.command("list")
@click.pass_context
@prints_names
def list_(ctx: click.Context) -> None:
    """List connected clusters.

    Example: coordinator cluster list -o json
    """
    cfg = _store(ctx).load()
    docs = [c.model_dump(mode="json") for c in cfg.clusters.values()]

    def text(wide: bool = False) -> None:
        if not docs:
            say("No clusters connected. Connect one with `coordinator cluster connect NAME --context CTX`.")
            return
        if wide:
            # The whole identity and where it comes from, the kubeconfig, since when.
            table(
                ["name", "context", "server", "identity", "identity from", "kubeconfig", "connected"],
                [
                    [
                        c.name,
                        c.context,
                        c.server,
                        c.identity,
                        c.identity_source,
                        c.in_cluster or c.kubeconfig or "-",
                        utc_text(c.connected_at, "%Y-%m-%d %H:%M:%SZ"),
                    ]
                    for c in cfg.clusters.values()
                ],
            )
            return
        table(
            ["name", "context", "server", "identity"],
            [
                [
                    c.name,
                    c.context,
                    c.server,
                    c.identity[:13] + ("" if c.identity_source == "kube-system-uid" else " (cm)"),
                ]
                for c in cfg.clusters.values()
            ],
        )

    emit(
        ctx,
        docs,
        text,
        names=lambda: [f"cluster/{c.name}" for c in cfg.clusters.values()],
        wide=lambda: text(wide=True),
    )


@cluster.command("info")
@click.argument("name")
@click.option(
    "--namespace",
    "-n",
    default=None,
    help="Namespace whose permissions to check [default: of its deployments, else 'default'].",
)
@click.option(
    "--storage",
    type=click.Choice(["configmap", "secret"]),
    default=None,
    help="State storage whose rights to check [default: that of its deployments in the namespace, else configmap].",
)
@click.option(
    "--deployment",
    "deployments",
    multiple=True,
    metavar="NAME",
    help="Deployment whose objects' rights to check (repeatable) [default: its deployments in the namespace].",
)
@click.pass_context
def info(
    ctx: click.Context, name: str, namespace: str | None, storage: str | None, deployments: tuple[str, ...]
) -> None:
    """Show server, version, identity, reachability, latency and permissions.

    Example: coordinator cluster info eu-1 --namespace payments
    """
    from coordinator.engine.clusters import ClusterSet
    from coordinator.ops.admin import cluster_info, deployments_without

    app = app_of(ctx)
    cfg = _store(ctx).load()
    if namespace is None:
        namespaces = [d.namespace for d in cfg.deployments.values() if name in d.clusters]
        namespace = namespaces[0] if namespaces else "default"
    if storage is not None:
        storages = [storage]
    else:
        used = {d.storage for d in cfg.deployments.values() if name in d.clusters and d.namespace == namespace}
        storages = sorted(used) or ["configmap"]
    if deployments:
        from coordinator.ops.rbac import deployments_of

        names = deployments_of(deployments)
    else:
        names = sorted(d.name for d in cfg.deployments.values() if name in d.clusters and d.namespace == namespace)

    async def go():  # type: ignore[no-untyped-def]
        cs = ClusterSet(cfg, timeout=app.timeout, config_path=_store(ctx).path)
        try:
            got = await cluster_info(cs, name, namespace, storages, names)
            # Unreachable: what that means for each deployment it is a member of.
            return got, (await deployments_without(cs, cfg, name) if not got.reachable else None)
        finally:
            await cs.aclose()

    inf, member_of = run(go)
    doc = {
        "name": inf.name,
        "context": inf.context,
        "server": inf.server,
        "version": inf.version,
        "identity": inf.identity,
        "identity_source": inf.identity_source,
        "identity_ok": inf.identity_ok,
        "reachable": inf.reachable,
        "latency_ms": inf.latency_ms,
        "error": inf.error,
        "namespace": inf.namespace,
        "storage": inf.storage,
        "deployments": inf.deployments,
        "permissions": inf.permissions,
        "missing_permissions": inf.missing,
        # only when it did not answer: its deployments, and whether the others still make a majority
        "member_of": None
        if member_of is None
        else [
            {
                "deployment": m.deployment,
                "namespace": m.namespace,
                "members": m.members,
                "quorum": m.quorum,
                "answering": m.answering,
                "majority_without": m.majority_without,
            }
            for m in member_of
        ],
    }

    def text() -> None:
        rows = [
            ["server", inf.server],
            ["context", inf.context],
            ["version", inf.version or "-"],
            ["identity", f"{inf.identity} ({inf.identity_source})"],
            ["identity check", {True: "ok", False: "MISMATCH", None: "not checked"}[inf.identity_ok]],
            ["reachable", f"yes, {inf.latency_ms} ms" if inf.reachable else f"no ({inf.error})"],
        ]
        for res, verbs in inf.permissions.items():
            shown = " ".join(f"{v}:{'yes' if ok else ('no' if ok is False else '?')}" for v, ok in verbs.items())
            rows.append([f"{res} in {inf.namespace}", shown])
        objects = f"deployment(s) {', '.join(inf.deployments)}" if inf.deployments else "any deployment"
        rows.append(["checked for", f"{objects}, {' and '.join(inf.storage)} storage"])
        if inf.error and inf.reachable:
            rows.append(["error", inf.error])
        table(["", inf.name], rows)
        if inf.missing:
            say(
                f"Missing permissions in namespace {inf.namespace}: {', '.join(inf.missing)}. "
                f"`coordinator rbac print --namespace {inf.namespace}"
                + "".join(f" --deployment {d}" for d in inf.deployments or ["DEPLOYMENT"])
                + "".join(f" --storage {st}" for st in inf.storage if st != "configmap")
                + " --user USER` prints the rules the tool needs."
            )
        if member_of is not None:
            _without_text(inf.name, member_of)

    emit(ctx, doc, text)
    if inf.identity_ok is False:
        from coordinator.errors import IdentityMismatchError

        raise IdentityMismatchError(f"Cluster {name!r}: {inf.error}")


def _without_text(name: str, member_of: list[Any]) -> None:
    """What an unreachable cluster means for each deployment it is a member of."""
    if not member_of:
        say(f"{name} does not answer; it is a member of no deployment known here.")
        return
    lost = [m.deployment for m in member_of if not m.majority_without]
    say(
        f"{name} does not answer. "
        + (
            f"Without it, {', '.join(lost)} cannot reach a majority: lock and state commands there exit 4 "
            f"until {name} or another member answers."
            if lost
            else "Each of its deployments still has a majority of members that answer: locks and state work without it."
        )
    )
    table(
        ["deployment", "namespace", "quorum", "others answering", f"majority without {name}"],
        [
            [
                m.deployment,
                m.namespace,
                m.quorum,
                ", ".join(m.answering) or "none",
                "yes" if m.majority_without else "NO",
            ]
            for m in member_of
        ],
    )


@cluster.command("disconnect")
@click.argument("name")
@click.option("--force", is_flag=True, help="Disconnect even if deployments use it.")
@click.pass_context
def disconnect(ctx: click.Context, name: str, force: bool) -> None:
    """Forget a connected cluster (nothing in the cluster changes).

    Example: coordinator cluster disconnect eu-1
    """
    from coordinator.ops.admin import disconnect_cluster

    users = disconnect_cluster(_store(ctx), name, force=force)
    emit(
        ctx,
        {"disconnected": name, "deployments_affected": users},
        lambda: say(f"Disconnected {name}." + (f" Deployments still listing it: {', '.join(users)}." if users else "")),
    )


@cluster.command("restored")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def restored(ctx: click.Context, name: str, yes: bool) -> None:
    """Tell coordinator that NAME's etcd was restored from a backup.

    A restored member's leases come back with older holders and tokens, and nothing in them
    says so. This makes every coordinator lease on NAME a tombstone: held by an unknown
    holder for one maximum TTL, keeping no token history, so that no lock that was live
    when the member was restored can be taken over, and the next fencing token is proven
    by the other members. The member-set note of every coordinator state object on NAME
    is removed too (the backup's would speak for an old member set). Run it as soon as
    the member answers again, before anyone acquires. Exits 4 when NAME cannot be listed
    or an object could not be marked.

    Example: coordinator cluster restored eu-1 --yes
    """
    import sys

    from coordinator.engine.clusters import ClusterSet
    from coordinator.errors import NoQuorumError, UsageError
    from coordinator.ops.restored import tombstone_member

    app = app_of(ctx)
    cfg = _store(ctx).load()
    if name not in cfg.clusters:
        from coordinator.errors import unknown_cluster

        raise unknown_cluster(name, cfg.clusters, _store(ctx).path)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(
                f"Marking {name!r} restored needs confirmation, and standard input is not a terminal to ask "
                "on; use --yes."
            )
        click.confirm(
            f"Every coordinator lock on {name!r} will count as held by an unknown holder for one maximum "
            "TTL. Continue?",
            abort=True,
        )

    async def go() -> Any:
        clusters = ClusterSet(cfg, timeout=app.timeout)
        try:
            known = [(d.namespace, d.name) for d in cfg.deployments.values() if name in (*d.clusters, *(d.joint or ()))]
            return await tombstone_member(clusters, name, known)
        finally:
            await clusters.aclose()

    done, error = run(go)
    if error is not None:
        raise NoQuorumError(
            f"Could not list the leases on {name!r} ({error.kind}: {error.detail}); nothing was changed. Run "
            "this again when it answers, before anyone acquires a lock of its deployments."
        )
    leases = [t for t in done if t.object == "lease"]
    states = [t for t in done if t.object == "state"]

    def rows_of(items: list[Any]) -> list[dict[str, str]]:
        return [{"namespace": t.namespace, "deployment": t.deployment, "outcome": t.outcome, "detail": t.detail}
                for t in items]  # fmt: skip

    def text() -> None:
        ok = sum(1 for t in leases if t.outcome == "ok")
        say(f"Marked {ok} of {len(leases)} lease(s) on {name} as held by an unknown holder for one maximum TTL.")
        noted = sum(1 for t in states if t.outcome == "ok")
        say(f"Removed the member-set note of {noted} of {len(states)} state object(s) on {name}.")
        if done:
            table(
                ["object", "namespace", "deployment", "outcome", "detail"],
                [[t.object, t.namespace, t.deployment, t.outcome, t.detail] for t in done],
            )

    emit(ctx, {"cluster": name, "leases": rows_of(leases), "state_objects": rows_of(states)}, text)
    failed = [t for t in done if t.outcome != "ok"]
    if failed:
        which = ", ".join(f"{t.object} {t.namespace}/{t.deployment}: {t.outcome}" for t in failed)
        raise NoQuorumError(f"{len(failed)} object(s) on {name!r} could not be marked ({which}); run this again.")
