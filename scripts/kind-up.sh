#!/usr/bin/env bash
# Create up to three local Kind clusters and connect coordinator to them.
#
# Usage: scripts/kind-up.sh [N]          N = 1, 2 or 3 (default 3)
#
# Cluster i is built from kind-configs/cluster-i.yaml as the Kind cluster "coordinator-i"
# (kubeconfig context "kind-coordinator-i") and connected to coordinator as "kind-i".
# Running it again is safe: clusters that exist are kept, and clusters that are already
# connected stay connected. A cluster this run had to (re)create is connected afresh,
# because its identity (the kube-system namespace UID) is new.
#
# Environment:
#   COORDINATOR          how to run the CLI (default "coordinator"; e.g. "python -m coordinator")
#   COORDINATOR_CONFIG   the local config the clusters are recorded in (as for the CLI)
#   KIND_NODE_IMAGE      node image for new clusters (default: the one kind ships with)
#   KIND_WAIT            how long to wait for a new control plane to be ready (default 120s)
set -euo pipefail

readonly MAX_CLUSTERS=3
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly CONFIG_DIR="$repo_root/kind-configs"

die() {
    printf 'kind-up: %s\n' "$*" >&2
    exit 1
}

usage() {
    printf 'usage: %s [N]   (N = number of clusters, 1 to %d; default %d)\n' \
        "$0" "$MAX_CLUSTERS" "$MAX_CLUSTERS" >&2
    exit 2
}

[[ $# -le 1 ]] || usage
count="${1:-$MAX_CLUSTERS}"
[[ "$count" =~ ^[1-9]$ ]] || usage
((count <= MAX_CLUSTERS)) || usage

command -v kind >/dev/null 2>&1 ||
    die "kind is not installed or not on PATH. Install it (https://kind.sigs.k8s.io/docs/user/quick-start/#installation) and run this script again."
if [[ -z "${KIND_EXPERIMENTAL_PROVIDER:-}" ]]; then
    command -v docker >/dev/null 2>&1 ||
        die "docker is not installed or not on PATH; kind runs each cluster in a Docker container. Install Docker (or set KIND_EXPERIMENTAL_PROVIDER=podman) and run this script again."
    docker info >/dev/null 2>&1 ||
        die "cannot reach the Docker daemon. Start Docker, or make sure this user may use it (e.g. is in the 'docker' group), and run this script again."
fi

read -r -a coordinator <<<"${COORDINATOR:-coordinator}"
command -v "${coordinator[0]}" >/dev/null 2>&1 ||
    die "'${coordinator[0]}' is not on PATH. Install coordinator (pip install -e .) or point COORDINATOR at it, e.g. COORDINATOR='python -m coordinator'."

cluster_exists() {
    local name="$1" existing
    existing="$(kind get clusters 2>/dev/null)" || return 1
    grep -qxF -- "$name" <<<"$existing"
}

is_connected() {
    local name="$1" listing
    listing="$("${coordinator[@]}" -o json cluster list 2>/dev/null)" || return 1
    grep -qF -- "\"$name\"" <<<"$listing"
}

# kind switches kubectl's current context to every cluster it creates; put it back after.
previous_context=""
if command -v kubectl >/dev/null 2>&1; then
    previous_context="$(kubectl config current-context 2>/dev/null || true)"
fi
restore_context() {
    if [[ -n "$previous_context" ]]; then
        kubectl config use-context "$previous_context" >/dev/null 2>&1 || true
    fi
}
trap restore_context EXIT

for ((i = 1; i <= count; i++)); do
    kind_name="coordinator-$i"
    context="kind-$kind_name"
    name="kind-$i"
    config="$CONFIG_DIR/cluster-$i.yaml"
    [[ -f "$config" ]] || die "missing $config"

    created=false
    if cluster_exists "$kind_name"; then
        printf 'Kind cluster %s already exists.\n' "$kind_name"
    else
        printf 'Creating Kind cluster %s from %s ...\n' "$kind_name" "${config#"$repo_root"/}"
        create_args=(create cluster --config "$config" --wait "${KIND_WAIT:-120s}")
        if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then
            create_args+=(--image "$KIND_NODE_IMAGE")
        fi
        kind "${create_args[@]}"
        created=true
    fi

    if is_connected "$name"; then
        if [[ "$created" == false ]]; then
            printf 'coordinator: %s is already connected (context %s).\n' "$name" "$context"
            continue
        fi
        # The record names the cluster that was here before; this one is a new cluster.
        printf 'coordinator: %s was recorded for an earlier cluster; reconnecting.\n' "$name"
        "${coordinator[@]}" cluster disconnect "$name"
    fi
    "${coordinator[@]}" cluster connect "$name" --context "$context"
done

printf 'Ready: %d Kind cluster(s), connected as kind-1 ... kind-%d.\n' "$count" "$count"
