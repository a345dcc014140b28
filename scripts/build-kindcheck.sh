#!/usr/bin/env bash
# Build kindcheck (scripts/kindcheck): a small Go program that decodes the Kind cluster
# configs with Kind's own config types (sigs.k8s.io/kind/pkg/apis/config/v1alpha4),
# unknown fields refused, fetched through the Go module proxy like the control plane.
#
# Output: ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/kindcheck-<kind version>-<source hash>/kindcheck
# The directory name carries a hash of the module's sources, so an edit to main.go or
# go.mod builds anew. If the binary already exists the script returns at once. The last
# line printed on stdout is always the binary's path:
#     KINDCHECK="$(scripts/build-kindcheck.sh | tail -n 1)"
#
# Environment: COORDINATOR_CACHE (cache root), GO (go binary to use).
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module_dir="${script_dir}/kindcheck"
kind_module="sigs.k8s.io/kind"

log() { printf 'build-kindcheck: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f "${module_dir}/go.mod" ]] || die "module not found at ${module_dir}/go.mod"

# Read from go.mod, so a cache hit needs no Go toolchain.
version="$(awk -v mod="${kind_module}" '$1 == mod { print $2; exit }' "${module_dir}/go.mod")"
[[ -n "${version}" ]] || die "cannot find the ${kind_module} version in ${module_dir}/go.mod"
digest="$(cat "${module_dir}/go.mod" "${module_dir}/go.sum" "${module_dir}/main.go" | sha256sum)"
digest="${digest:0:12}"

cache_root="${COORDINATOR_CACHE:-${HOME}/.cache/coordinator}"
out_dir="${cache_root}/bin/kindcheck-${version}-${digest}"
binary="${out_dir}/kindcheck"

if [[ -x "${binary}" ]]; then
    log "kindcheck (kind ${version}) already built"
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

log "building kindcheck against kind ${version} with $("${go_bin}" version)"
mkdir -p "${out_dir}"

# Build under a temporary name in the same directory, then rename: a reader never sees
# a half-written binary, and an interrupted build leaves nothing behind.
tmp="$(mktemp "${out_dir}/.kindcheck.XXXXXX")"
trap 'rm -f "${tmp}"' EXIT
"${go_bin}" build -C "${module_dir}" -trimpath -ldflags "-s -w" -o "${tmp}" .
chmod 0755 "${tmp}"
mv -f "${tmp}" "${binary}"
trap - EXIT

log "built ${binary}"
printf '%s\n' "${binary}"
