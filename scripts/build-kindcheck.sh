#!/usr/bin/env bash
# Build kindcheck (scripts/kindcheck): a small Go program that decodes the Kind cluster
# configs with Kind's own config types (sigs.k8s.io/kind/pkg/apis/config/v1alpha4),
# unknown fields refused, fetched through the Go module proxy like the control plane.
#
# Output: ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/kindcheck-<kind version>-<source hash>/kindcheck
# (scripts/lib/go-tool.sh). The directory name carries a hash of the module's sources, so
# an edit to main.go or go.mod builds anew. The last line printed on stdout is the path:
#     KINDCHECK="$(scripts/build-kindcheck.sh | tail -n 1)"
#
# Environment: COORDINATOR_CACHE (cache root), GO (go binary to use).
set -euo pipefail
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib/go-tool.sh
source "${script_dir}/lib/go-tool.sh"
build_go_tool kindcheck "${script_dir}/kindcheck" sigs.k8s.io/kind . kindcheck "" go.mod go.sum main.go
