#!/usr/bin/env bash
# Disconnect coordinator from the local Kind clusters made by kind-up.sh, then delete them.
#
# Usage: scripts/kind-down.sh
#
# Handles all of coordinator-1 ... coordinator-3 (connected as kind-1 ... kind-3), whichever
# exist. Running it again is safe: what is already gone is skipped.
#
# Environment:
#   COORDINATOR          how to run the CLI (default "coordinator"; e.g. "python -m coordinator")
#   COORDINATOR_CONFIG   the local config the clusters are recorded in (as for the CLI)
set -euo pipefail

readonly MAX_CLUSTERS=3

die() {
    printf 'kind-down: %s\n' "$*" >&2
    exit 1
}

warn() {
    printf 'kind-down: warning: %s\n' "$*" >&2
}

if [[ $# -gt 0 ]]; then
    printf 'usage: %s   (takes no arguments)\n' "$0" >&2
    exit 2
fi

command -v kind >/dev/null 2>&1 ||
    die "kind is not installed or not on PATH; it is needed to delete the clusters. Install it (https://kind.sigs.k8s.io/docs/user/quick-start/#installation) and run this script again."

read -r -a coordinator <<<"${COORDINATOR:-coordinator}"
have_coordinator=true
if ! command -v "${coordinator[0]}" >/dev/null 2>&1; then
    have_coordinator=false
    warn "'${coordinator[0]}' is not on PATH, so no cluster is disconnected; set COORDINATOR to run it."
fi

existing="$(kind get clusters 2>/dev/null)" ||
    die "'kind get clusters' failed; is the container runtime (Docker) running?"

listing=""
if [[ "$have_coordinator" == true ]]; then
    listing="$("${coordinator[@]}" -o json cluster list 2>/dev/null)" ||
        warn "could not list coordinator's connected clusters; none is disconnected."
fi

failures=0
for ((i = MAX_CLUSTERS; i >= 1; i--)); do
    kind_name="coordinator-$i"
    name="kind-$i"

    if grep -qF -- "\"$name\"" <<<"$listing"; then
        if "${coordinator[@]}" cluster disconnect "$name"; then
            printf 'coordinator: disconnected %s.\n' "$name"
        else
            warn "could not disconnect $name (see above); the cluster is deleted anyway."
            failures=$((failures + 1))
        fi
    fi

    if grep -qxF -- "$kind_name" <<<"$existing"; then
        kind delete cluster --name "$kind_name"
    fi
done

if ((failures > 0)); then
    die "$failures cluster(s) could not be disconnected; remove them with 'coordinator cluster disconnect NAME' once their deployments no longer list them."
fi
printf 'Done: the Kind clusters coordinator-1 ... coordinator-%d are gone.\n' "$MAX_CLUSTERS"
