"""``coordinator rbac``: print the least RBAC the tool needs, for ``kubectl apply``."""

from __future__ import annotations

import json
import shlex
from typing import Any

import click
import yaml

from coordinator.cli.base import Group
from coordinator.errors import UsageError
from coordinator.ops import rbac as rbac_api


@click.group(name="rbac", cls=Group)
def rbac() -> None:
    """Print the minimal Kubernetes RBAC rules the tool needs on a member cluster."""


@rbac.command(
    name="print",
    epilog=(
        "Example (run once per member cluster):\n\n"
        "\b\n"
        "  coordinator rbac print --namespace payments --deployment payments \\\n"
        "    --group release-engineers | kubectl --context prod-eu apply -f -"
    ),
)
@click.option(
    "--namespace",
    "-n",
    "namespace",
    required=True,
    help="The deployment's namespace, where the locks and the state live.",
)
@click.option(
    "--deployment",
    "deployments",
    multiple=True,
    metavar="NAME",
    help="A deployment in the namespace to grant (repeatable); rights are on its own objects, by name.",
)
@click.option("--user", "user", metavar="USER", help="Grant to this user.")
@click.option("--group", "group", metavar="GROUP", help="Grant to this group.")
@click.option(
    "--service-account",
    "service_account",
    metavar="NS:NAME",
    help="Grant to the service account NAME in the namespace NS (e.g. a CI runner's).",
)
@click.option(
    "--storage",
    type=click.Choice(rbac_api.STORAGES),
    default="configmap",
    show_default=True,
    help="Where the deployment keeps its state: ConfigMaps, or Secrets (--storage secret).",
)
@click.option(
    "--create-namespace",
    is_flag=True,
    help="Also allow creating namespaces (for `deployment create`); cluster-wide, since "
    "Kubernetes cannot limit creation to one name.",
)
@click.option(
    "--fleet",
    is_flag=True,
    help="Also allow listing and watching Leases in every namespace (for `lock status` without a "
    "deployment, and its --watch); cluster-wide and read-only, since Kubernetes cannot limit a list "
    "or a watch by name.",
)
@click.option(
    "--drift",
    "drift",
    multiple=True,
    metavar="RESOURCE",
    help="Also allow reading this watched resource in the namespace, by name, for `coordinator drift` "
    "(KIND/NAME or GROUP/VERSION/KIND/NAME, as `drift record` takes it; repeatable).",
)
@click.pass_context
def print_rbac(
    ctx: click.Context,
    namespace: str,
    deployments: tuple[str, ...],
    user: str | None,
    group: str | None,
    service_account: str | None,
    storage: rbac_api.Storage,
    create_namespace: bool,
    fleet: bool,
    drift: tuple[str, ...],
) -> None:
    """Print a Role per deployment, the ClusterRole, and their bindings for one subject.

    The rights are on each deployment's own Lease and state object, by name; `create`,
    which Kubernetes cannot limit by name, is granted for Leases and ConfigMaps (and
    Secrets with --storage secret) in the namespace. The output is a multi-document YAML
    stream ready for `kubectl apply -f -`, with comments saying why each rule is there.
    Apply it on every member cluster of the deployment. With `-o json` it is a single
    `v1` List. Applying it again, for another subject or another deployment, never takes
    rights away from anyone.
    """
    rbac_api.validate_namespace(namespace)
    names = rbac_api.deployments_of(deployments)
    subject = _subject(user=user, group=group, service_account=service_account)
    from coordinator.rules.expectations import parse_resource

    watched = list(dict.fromkeys(parse_resource(r, namespace) for r in drift))
    objects = rbac_api.manifests(
        namespace, subject, names, storage=storage, create_namespace=create_namespace, fleet=fleet, drift=watched
    )
    output = getattr(ctx.find_root().obj, "output", "table")
    document = {"apiVersion": "v1", "kind": "List", "items": objects}
    if output == "json":
        click.echo(json.dumps(document, indent=2))
        return
    if output.startswith("jsonpath="):  # over the document -o json prints, as everywhere
        from coordinator.cli.output import render_document

        click.echo(render_document(document, output), nl=False)
        return
    command = _command_line(namespace, names, user, group, service_account, storage, create_namespace, fleet, drift)
    click.echo(render_yaml(objects, command=command, subject=subject, namespace=namespace, deployments=names), nl=False)


def render_yaml(
    objects: list[dict[str, Any]],
    *,
    command: str,
    subject: rbac_api.Subject,
    namespace: str,
    deployments: list[str],
) -> str:
    """A YAML stream: a comment saying what this is and how it was made, then the objects,
    each rule of a Role under a comment saying why it is there."""
    header = (
        f"# Minimal RBAC for coordinator in namespace {namespace}, deployment(s) "
        f"{', '.join(deployments)}, for {subject.describe()}.\n"
        "# Generated by (run it again to regenerate):\n"
        f"#   {command}\n"
        "# Apply on every member cluster: kubectl --context CONTEXT apply -f FILE\n"
        "# Every right is on the deployment's own objects, by name, except `create`: Kubernetes\n"
        "# cannot limit `create` by name (see the comments on those rules).\n"
    )
    if any(obj["metadata"]["name"].startswith(rbac_api.DRIFT_ROLE) for obj in objects):
        header += "# The watched resources of --drift are read (get) by name too.\n"
    return header + "".join(_document(obj) for obj in objects)


def _dump(value: Any) -> str:
    return str(yaml.safe_dump(value, sort_keys=False, default_flow_style=False))


def _document(obj: dict[str, Any]) -> str:
    if obj["kind"] != "Role":
        return "---\n" + _dump(obj)
    head = {k: v for k, v in obj.items() if k != "rules"}
    rules = "".join(_comment(rbac_api.rule_note(rule)) + _dump([rule]) for rule in obj["rules"])
    return "---\n" + _dump(head) + "rules:\n" + rules


def _comment(text: str, width: int = 88) -> str:
    """``text`` as ``#`` lines of at most ``width`` characters."""
    import textwrap

    return "".join(f"# {line}\n" for line in textwrap.wrap(text, width - 2))


def _subject(*, user: str | None, group: str | None, service_account: str | None) -> rbac_api.Subject:
    given = [flag for flag, value in _subject_flags(user, group, service_account) if value is not None]
    if len(given) != 1:
        what = "none was" if not given else f"{' and '.join(given)} were"
        raise UsageError(
            f"Name exactly one subject to grant the rules to with --user, --group or "
            f"--service-account NS:NAME ({what} given). Run the command once per subject; "
            "each gets its own bindings."
        )
    if user is not None:
        return rbac_api.Subject.user(user)
    if group is not None:
        return rbac_api.Subject.group(group)
    assert service_account is not None
    return rbac_api.parse_service_account(service_account)


def _subject_flags(user: str | None, group: str | None, service_account: str | None) -> list[tuple[str, str | None]]:
    return [("--user", user), ("--group", group), ("--service-account", service_account)]


def _command_line(
    namespace: str,
    deployments: list[str],
    user: str | None,
    group: str | None,
    service_account: str | None,
    storage: str,
    create_namespace: bool,
    fleet: bool,
    drift: tuple[str, ...] = (),
) -> str:
    """The canonical command that produces this output, to regenerate it later."""
    words = ["coordinator", "rbac", "print", "--namespace", namespace]
    for deployment in deployments:
        words += ["--deployment", deployment]
    for flag, value in _subject_flags(user, group, service_account):
        if value is not None:
            words += [flag, value]
    if storage != "configmap":
        words += ["--storage", storage]
    if create_namespace:
        words.append("--create-namespace")
    if fleet:
        words.append("--fleet")
    for resource in dict.fromkeys(drift):
        words += ["--drift", resource]
    return shlex.join(words)
