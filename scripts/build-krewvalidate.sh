#!/usr/bin/env bash
# Build krew's own manifest validator (sigs.k8s.io/krew/cmd/validate-krew-manifest) from
# the wrapper module in scripts/controlplane/krewvalidate, which pins its version, for the
# check of the kubectl plugin's krew manifest (deploy/krew/coordinator.yaml).
#
# Output: ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/krewvalidate-<version>/validate-krew-manifest
# If that binary already exists the script returns at once. The last line printed on
# stdout is always the binary's path:
#     KREWVALIDATE="$(scripts/build-krewvalidate.sh | tail -n 1)"
#
# Environment: COORDINATOR_CACHE (cache root), GO (go binary to use).
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module_dir="${script_dir}/controlplane/krewvalidate"
tool_module="sigs.k8s.io/krew"
tool_package="${tool_module}/cmd/validate-krew-manifest"

log() { printf 'build-krewvalidate: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f "${module_dir}/go.mod" ]] || die "wrapper module not found at ${module_dir}/go.mod"

# Read from go.mod, so a cache hit needs no Go toolchain.
version="$(awk -v mod="${tool_module}" '$1 == mod { print $2; exit }' "${module_dir}/go.mod")"
[[ -n "${version}" ]] || die "cannot find the ${tool_module} version in ${module_dir}/go.mod"

cache_root="${COORDINATOR_CACHE:-${HOME}/.cache/coordinator}"
out_dir="${cache_root}/bin/krewvalidate-${version}"
binary="${out_dir}/validate-krew-manifest"

if [[ -x "${binary}" ]]; then
    log "validate-krew-manifest (krew ${version}) already built"
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

log "building validate-krew-manifest (krew ${version}) with $("${go_bin}" version)"
mkdir -p "${out_dir}"

# Under a temporary name in the same directory, then renamed: a reader never sees a
# half-written binary, and an interrupted build leaves nothing behind.
tmp="$(mktemp "${out_dir}/.validate-krew-manifest.XXXXXX")"
trap 'rm -f "${tmp}"' EXIT
"${go_bin}" build -C "${module_dir}" -trimpath -ldflags "-s -w" -o "${tmp}" "${tool_package}"
chmod 0755 "${tmp}"
mv -f "${tmp}" "${binary}"
trap - EXIT

log "built ${binary}"
printf '%s\n' "${binary}"
