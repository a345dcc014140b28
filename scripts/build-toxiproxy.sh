#!/usr/bin/env bash
# Build toxiproxy's server (the TCP fault-injection proxy used by the fault tests) from
# the wrapper module in scripts/controlplane/toxiproxy, which pins its version.
#
# Output: ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/toxiproxy-<version>/toxiproxy-server
# (scripts/lib/go-tool.sh). The last line printed on stdout is the binary's path:
#     TOXIPROXY="$(scripts/build-toxiproxy.sh | tail -n 1)"
#
# Environment: COORDINATOR_CACHE (cache root), GO (go binary to use).
set -euo pipefail
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib/go-tool.sh
source "${script_dir}/lib/go-tool.sh"
module="github.com/Shopify/toxiproxy/v2"
version="$(awk -v mod="${module}" '$1 == mod { print $2; exit }' "${script_dir}/controlplane/toxiproxy/go.mod")"
build_go_tool toxiproxy "${script_dir}/controlplane/toxiproxy" "${module}" "${module}/cmd/server" \
    toxiproxy-server "-X ${module}.Version=${version}"
