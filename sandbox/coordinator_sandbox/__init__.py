"""Local Kubernetes control planes for demos and tests.

Each sandbox cluster is one etcd and one kube-apiserver on 127.0.0.1, started from
binaries built by ``scripts/build-controlplane.sh``; there is no kubelet, scheduler or
controller-manager, which the tool never needs. Clusters are independent (own etcd,
own identity) but share one CA, so a context re-pointed at another sandbox cluster still
authenticates: exactly the situation the identity check must catch.

With ``apiservers=2`` (``sandbox up --apiservers 2``) each cluster is highly available:
two kube-apiservers on its etcd behind a front proxy on the cluster's address
(:mod:`coordinator_sandbox.frontproxy`), one of which may answer with shifted times.

    sb = up(3, "/tmp/sb")          # contexts sandbox-1..3 in /tmp/sb/kubeconfig
    sb.pause(1); sb.resume(1)      # cluster 1 accepts connections but never answers
    sb.kill(2); sb.start(2)        # cluster 2's API server goes away and comes back
    down("/tmp/sb")

    ha = up(3, "/tmp/ha", apiservers=2, date_offset=3)  # two kube-apiservers per cluster
    ha.proxy_stats(1)              # requests each one served through the front proxy

The modules, bottom up: ``records`` (the state file, the directory, the results),
``process`` (spawning and signalling processes), ``binaries`` (where etcd and
kube-apiserver are), ``pki`` and ``kubeconfig`` (certificates and kubeconfig files),
``adminclient`` (a small cluster-admin HTTPS client),
``credentials`` (the sandbox's users, certificates and RBAC), ``servers`` (the programs of
a cluster: arguments, spawning, health), ``startup`` (``up``), ``shutdown`` (``down``),
``operations`` (``status``, ``pause``, ``resume``, ``kill``, ``start``, ``heal``, the date
offset), ``handle`` (:class:`Sandbox`), and ``frontproxy``, the HA clusters' proxy process.

This package does not import the lock and state engine, nor the Kubernetes client.
"""

from coordinator_sandbox.adminclient import AdminClient, AdminRequestError
from coordinator_sandbox.binaries import (
    BUILD_SCRIPT,
    ETCD_VERSION,
    KUBE_VERSION,
    Binaries,
    default_bin_dir,
    find_binaries,
)
from coordinator_sandbox.credentials import RESTRICTED_NAMESPACE, RESTRICTED_USER, mint_kubeconfig
from coordinator_sandbox.handle import Sandbox
from coordinator_sandbox.operations import heal, kill, pause, resume, set_date_offset, start, status
from coordinator_sandbox.records import (
    BackendStatus,
    ClusterStatus,
    DownReport,
    SandboxStatus,
    UserKubeconfig,
    default_dir,
)
from coordinator_sandbox.servers import SandboxError
from coordinator_sandbox.shutdown import down
from coordinator_sandbox.startup import up

__all__ = [
    "BUILD_SCRIPT",
    "ETCD_VERSION",
    "KUBE_VERSION",
    "RESTRICTED_NAMESPACE",
    "RESTRICTED_USER",
    "AdminClient",
    "AdminRequestError",
    "BackendStatus",
    "Binaries",
    "ClusterStatus",
    "DownReport",
    "Sandbox",
    "SandboxError",
    "SandboxStatus",
    "UserKubeconfig",
    "default_bin_dir",
    "default_dir",
    "down",
    "find_binaries",
    "heal",
    "kill",
    "mint_kubeconfig",
    "pause",
    "resume",
    "set_date_offset",
    "start",
    "status",
    "up",
]
