# shellcheck shell=bash
# Shared by the scripts that build one Go program into the cache (build-toxiproxy.sh,
# build-kindcheck.sh, build-krewvalidate.sh). Source it, then call build_go_tool:
#
#   build_go_tool NAME MODULE_DIR MODULE PACKAGE BINARY [EXTRA_LDFLAGS] [DIGEST_FILES...]
#
#   NAME          what the log lines and the cache directory are called (toxiproxy)
#   MODULE_DIR    the Go module to build in (a wrapper module pinning the tool's version)
#   MODULE        the module whose version go.mod pins: the cache key, read without Go
#   PACKAGE       what `go build` builds (a package path, or . for the module itself)
#   BINARY        the file name of the program in the cache directory
#   EXTRA_LDFLAGS added to "-s -w" (e.g. -X a version variable); "" for none
#   DIGEST_FILES  files under MODULE_DIR whose content also keys the cache (own sources)
#
# Output: ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/NAME-<version>[-<digest>]/BINARY.
# An existing binary returns at once (no Go toolchain needed). The last line printed on
# stdout is always the binary's path. Environment: COORDINATOR_CACHE, GO.

build_go_tool() {
    local name="$1" module_dir="$2" module="$3" package="$4" binary_name="$5" ldflags="${6:-}"
    shift 6 || shift $#
    log() { printf 'build-%s: %s\n' "${name}" "$*" >&2; }
    die() { log "error: $*"; exit 1; }

    [[ -f "${module_dir}/go.mod" ]] || die "module not found at ${module_dir}/go.mod"
    local version
    version="$(awk -v mod="${module}" '$1 == mod { print $2; exit }' "${module_dir}/go.mod")"
    [[ -n "${version}" ]] || die "cannot find the ${module} version in ${module_dir}/go.mod"
    local key="${version}"
    if [[ $# -gt 0 ]]; then
        local digest
        digest="$(cd "${module_dir}" && cat "$@" | sha256sum)"
        key="${version}-${digest:0:12}"
    fi

    local out_dir="${COORDINATOR_CACHE:-${HOME}/.cache/coordinator}/bin/${name}-${key}"
    local binary="${out_dir}/${binary_name}"
    if [[ -x "${binary}" ]]; then
        log "${binary_name} (${module} ${version}) already built"
        printf '%s\n' "${binary}"
        return 0
    fi

    local go_bin="${GO:-}"
    [[ -n "${go_bin}" ]] || go_bin="$(command -v go || true)"
    if [[ -z "${go_bin}" && -x /usr/local/go/bin/go ]]; then
        go_bin=/usr/local/go/bin/go
    fi
    [[ -n "${go_bin}" && -x "${go_bin}" ]] || die "the Go toolchain is missing: install Go 1.24 or newer \
(https://go.dev/dl/), put 'go' on PATH or set GO=/path/to/go, then run this script again"
    # Never let go.mod's 'go' line trigger a toolchain download.
    export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
    export CGO_ENABLED=0

    log "building ${binary_name} (${module} ${version}) with $("${go_bin}" version)"
    mkdir -p "${out_dir}"
    # Under a temporary name in the same directory, then renamed: a reader never sees a
    # half-written binary, and an interrupted build leaves nothing behind.
    local tmp
    tmp="$(mktemp "${out_dir}/.${binary_name}.XXXXXX")"
    # shellcheck disable=SC2064  # expanded now on purpose: tmp is local to this function
    trap "rm -f '${tmp}'" EXIT
    local start=${SECONDS}
    "${go_bin}" build -C "${module_dir}" -trimpath -ldflags "-s -w ${ldflags}" -o "${tmp}" "${package}"
    chmod 0755 "${tmp}"
    mv -f "${tmp}" "${binary}"
    trap - EXIT
    log "built in $((SECONDS - start))s: ${binary}"
    printf '%s\n' "${binary}"
}
