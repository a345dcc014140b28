#!/usr/bin/env bash
# Build toxiproxy's server (the TCP fault-injection proxy used by the fault tests)
# from the wrapper module in scripts/controlplane/toxiproxy, which pins its version.
#
# Output: ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/toxiproxy-<version>/toxiproxy-server
# If that binary already exists the script returns at once. The last line printed
# on stdout is always the binary's path, so callers can do:
#     TOXIPROXY="$(scripts/build-toxiproxy.sh | tail -n 1)"
#
# Environment: COORDINATOR_CACHE (cache root), GO (go binary to use).
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module_dir="${script_dir}/controlplane/toxiproxy"
tool_module="github.com/Shopify/toxiproxy/v2"
tool_package="${tool_module}/cmd/server"

log() { printf 'build-toxiproxy: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f "${module_dir}/go.mod" ]] || die "wrapper module not found at ${module_dir}/go.mod"

# The pinned version is read from go.mod so the cache hit needs no Go toolchain.
version="$(awk -v mod="${tool_module}" '$1 == mod { print $2; exit }' "${module_dir}/go.mod")"
[[ -n "${version}" ]] || die "cannot find the ${tool_module} version in ${module_dir}/go.mod"

cache_root="${COORDINATOR_CACHE:-${HOME}/.cache/coordinator}"
out_dir="${cache_root}/bin/toxiproxy-${version}"
binary="${out_dir}/toxiproxy-server"

if [[ -x "${binary}" ]]; then
    log "toxiproxy ${version} already built"
    printf '%s\n' "${binary}"
    exit 0
fi

go_bin="${GO:-}"
if [[ -z "${go_bin}" ]]; then
    go_bin="$(command -v go || true)"
fi
if [[ -z "${go_bin}" && -x /usr/local/go/bin/go ]]; then
    go_bin=/usr/local/go/bin/go
fi
[[ -n "${go_bin}" && -x "${go_bin}" ]] || die "the Go toolchain is missing: install Go 1.24 or newer \
(https://go.dev/dl/), put 'go' on PATH or set GO=/path/to/go, then run this script again"

# Never let go.mod's 'go' line trigger a toolchain download.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0

log "building toxiproxy ${version} with $("${go_bin}" version)"
log "output: ${binary}"
mkdir -p "${out_dir}"

# Build under a temporary name in the same directory, then rename: a reader never
# sees a half-written binary, and an interrupted build leaves nothing behind.
tmp="$(mktemp "${out_dir}/.toxiproxy-server.XXXXXX")"
trap 'rm -f "${tmp}"' EXIT

start=${SECONDS}
"${go_bin}" build -C "${module_dir}" -trimpath \
    -ldflags "-s -w -X ${tool_module}.Version=${version}" \
    -o "${tmp}" "${tool_package}"
chmod 0755 "${tmp}"
mv -f "${tmp}" "${binary}"
trap - EXIT

log "built in $((SECONDS - start))s: $("${binary}" -version)"
printf '%s\n' "${binary}"
