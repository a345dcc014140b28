#!/usr/bin/env bash
# Build krew's own manifest validator (sigs.k8s.io/krew/cmd/validate-krew-manifest) from
# the wrapper module in scripts/controlplane/krewvalidate, which pins its version, for the
# check of the kubectl plugin's krew manifest (deploy/krew/coordinator.yaml).
#
# Output: ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/krewvalidate-<version>/validate-krew-manifest
# (scripts/lib/go-tool.sh). The last line printed on stdout is the binary's path:
#     KREWVALIDATE="$(scripts/build-krewvalidate.sh | tail -n 1)"
#
# Environment: COORDINATOR_CACHE (cache root), GO (go binary to use).
set -euo pipefail
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib/go-tool.sh
source "${script_dir}/lib/go-tool.sh"
build_go_tool krewvalidate "${script_dir}/controlplane/krewvalidate" sigs.k8s.io/krew \
    sigs.k8s.io/krew/cmd/validate-krew-manifest validate-krew-manifest ""
