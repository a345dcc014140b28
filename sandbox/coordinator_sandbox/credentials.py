"""Who may talk to a sandbox, and as whom: its certificates, token, kubeconfigs and RBAC.

Written once by ``sandbox up`` into ``DIR/pki/`` and ``DIR/kubeconfig``:

- the cluster CA (shared by every cluster of the sandbox), the kube-apiservers' serving
  certificate, and client certificates for the cluster-admin user and the restricted
  user; a bearer token for a second cluster-admin; the service-account signing key;
- etcd's own CA, serving and client certificates (the CA's key is not kept);
- HA sandboxes only: the front-proxy CA and the proxy's client certificate.

:func:`mint_kubeconfig` issues more users later, from the cluster CA kept on disk.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

from coordinator.errors import UsageError
from coordinator_sandbox import frontproxy, kubeconfig, pki
from coordinator_sandbox.adminclient import AdminClient
from coordinator_sandbox.records import (
    ClusterRecord,
    Layout,
    SandboxRecord,
    UserKubeconfig,
    cluster_of,
    require_record,
)

RESTRICTED_USER = "sandbox-restricted"
RESTRICTED_NAMESPACE = "sandbox-restricted"
ADMIN_USER = "sandbox-admin"
TOKEN_USER = "sandbox-token-admin"

# etcd serves its clients and its peer port over TLS, and only to a client certificate of
# its own CA (the kube-apiserver's): on plain HTTP any local user could read every Secret
# and ConfigMap, or write leases, past RBAC.
ETCD_CA = "etcd-ca.crt"
ETCD_SERVER = ("etcd-server.crt", "etcd-server.key")
ETCD_CLIENT = ("etcd-client.crt", "etcd-client.key")


def etcd_tls(layout: Layout) -> bool:
    """Does this sandbox's etcd speak TLS? (One made by an older version does not: its
    servers are restarted with the arguments they were first given.)"""
    return (layout.pki / ETCD_CA).is_file()


def admin_client(layout: Layout, port: int, timeout: float = 5.0) -> AdminClient:
    """A cluster-admin client (the admin user's certificate) for the server on ``port``."""
    return AdminClient(
        port,
        ca_file=layout.pki / "ca.crt",
        cert_file=layout.pki / "admin.crt",
        key_file=layout.pki / "admin.key",
        timeout=timeout,
    )


def make_pki(layout: Layout) -> str:
    """Create the CA, certificates, service-account keys and token file; return the token."""
    d = layout.pki
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca = pki.new_ca()
    ca.write(d / "ca.crt", d / "ca.key")
    pki.issue(
        ca,
        "kube-apiserver",
        dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        ip_addresses=("127.0.0.1", "10.0.0.1"),
        server=True,
    ).write(d / "serving.crt", d / "serving.key")
    pki.issue(ca, ADMIN_USER, organizations=("system:masters",)).write(d / "admin.crt", d / "admin.key")
    pki.issue(ca, RESTRICTED_USER).write(d / "restricted.crt", d / "restricted.key")
    etcd_ca = pki.new_ca("coordinator-sandbox-etcd-ca")
    pki.issue(
        etcd_ca, "etcd", dns_names=("localhost",), ip_addresses=("127.0.0.1",), server=True, client_too=True
    ).write(*(d / name for name in ETCD_SERVER))
    pki.issue(etcd_ca, "kube-apiserver-etcd-client").write(*(d / name for name in ETCD_CLIENT))
    # The CA's key is not kept: nothing is issued later, and no one may mint an etcd client.
    pki.write_private(d / ETCD_CA, etcd_ca.cert_pem, mode=0o644)
    sa_private, sa_public = pki.new_signing_key()
    pki.write_private(d / "sa.key", sa_private)
    pki.write_private(d / "sa.pub", sa_public, mode=0o644)
    token = secrets.token_urlsafe(32)
    pki.write_private(d / "tokens.csv", f'{token},{TOKEN_USER},{TOKEN_USER},"system:masters"\n'.encode())
    return token


def make_front_proxy_pki(layout: Layout) -> None:
    """A CA of its own for the proxy's client certificate: the servers take user names
    from headers only on connections with that certificate, and the sandbox CA never
    signs one a user could present."""
    d = layout.pki
    ca = pki.new_ca("coordinator-sandbox-front-proxy-ca")
    ca.write(d / "front-proxy-ca.crt", d / "front-proxy-ca.key")
    pki.issue(ca, frontproxy.FRONT_PROXY_USER).write(d / "front-proxy-client.crt", d / "front-proxy-client.key")


def read_token(layout: Layout) -> str:
    line = (layout.pki / "tokens.csv").read_text().splitlines()[0]
    return line.split(",", 1)[0]


def write_kubeconfig(layout: Layout, record: SandboxRecord) -> None:
    d = layout.pki
    servers = [(c.name, c.server) for c in record.clusters]
    users = [
        kubeconfig.KubeUser(
            ADMIN_USER, cert_pem=(d / "admin.crt").read_bytes(), key_pem=(d / "admin.key").read_bytes()
        ),
        kubeconfig.KubeUser(
            RESTRICTED_USER,
            cert_pem=(d / "restricted.crt").read_bytes(),
            key_pem=(d / "restricted.key").read_bytes(),
        ),
        kubeconfig.KubeUser(TOKEN_USER, token=read_token(layout)),
    ]
    contexts: list[kubeconfig.KubeContext] = []
    for c in record.clusters:
        contexts.append(kubeconfig.KubeContext(c.name, c.name, ADMIN_USER))
    for c in record.clusters:
        contexts.append(
            kubeconfig.KubeContext(f"{c.name}-restricted", c.name, RESTRICTED_USER, namespace=RESTRICTED_NAMESPACE)
        )
    for c in record.clusters:
        contexts.append(kubeconfig.KubeContext(f"{c.name}-token", c.name, TOKEN_USER))
    document = kubeconfig.render(
        servers=servers,
        ca_pem=(d / "ca.crt").read_bytes(),
        users=users,
        contexts=contexts,
        current=record.clusters[0].name,
    )
    kubeconfig.write(layout.kubeconfig, document)


def grant_restricted(layout: Layout, c: ClusterRecord) -> None:
    """The restricted user may get/create ConfigMaps in its own namespace, nothing else."""
    admin = admin_client(layout, c.apiserver_port, timeout=10.0)
    ns = RESTRICTED_NAMESPACE
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    name = "sandbox-restricted-configmaps"
    admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    admin.create(
        f"{rbac}/namespaces/{ns}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]}],
        },
    )
    admin.create(
        f"{rbac}/namespaces/{ns}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "subjects": [{"kind": "User", "name": RESTRICTED_USER, "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "Role", "name": name, "apiGroup": "rbac.authorization.k8s.io"},
        },
    )


_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def mint_kubeconfig(
    dir: Path | str | None,
    user: str,
    groups: Sequence[str] = (),
    *,
    clusters: int | Iterable[int] | None = None,
    path: Path | str | None = None,
) -> UserKubeconfig:
    """Write a kubeconfig for ``user`` (member of ``groups``) on the given clusters.

    The user authenticates with a client certificate signed by the sandbox CA, so it has
    exactly the rights RBAC grants that name and those groups (plus what every
    authenticated user gets). ``clusters`` is one index or several (default: all); there
    is one context per cluster, named ``USER@sandbox-I``, the first one current.
    """
    if not user.strip():
        raise UsageError("A kubeconfig can only be minted for a non-empty user name.")
    layout = Layout.of(dir)
    record = require_record(layout)
    if clusters is None:
        indices = tuple(c.index for c in record.clusters)
    elif isinstance(clusters, int):
        indices = (clusters,)
    else:
        indices = tuple(clusters)
    chosen = [cluster_of(record, i) for i in indices]
    if not chosen:
        raise UsageError("Name at least one cluster to mint a kubeconfig for.")
    ca = pki.KeyPair((layout.pki / "ca.crt").read_bytes(), (layout.pki / "ca.key").read_bytes())
    pair = pki.issue(ca, user, organizations=tuple(groups))
    safe = _SAFE_NAME.sub("-", user).strip("-") or "user"
    target = Path(path) if path is not None else layout.users / f"{safe}.kubeconfig"
    contexts = [kubeconfig.KubeContext(f"{safe}@{c.name}", c.name, safe) for c in chosen]
    document = kubeconfig.render(
        servers=[(c.name, c.server) for c in chosen],
        ca_pem=ca.cert_pem,
        users=[kubeconfig.KubeUser(safe, cert_pem=pair.cert_pem, key_pem=pair.key_pem)],
        contexts=contexts,
        current=contexts[0].name,
    )
    kubeconfig.write(target, document)
    return UserKubeconfig(
        path=target,
        user=user,
        groups=tuple(groups),
        clusters=indices,
        contexts=tuple(ctx.name for ctx in contexts),
    )
