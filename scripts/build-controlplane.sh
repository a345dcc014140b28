#!/usr/bin/env bash
# Build the local control plane used by `coordinator sandbox` and the integration tests:
# etcd and kube-apiserver, compiled from the Go module proxy through the wrapper modules
# in scripts/controlplane/{etcd,kube}.
#
#   scripts/build-controlplane.sh            # build (or confirm) the binaries
#   COORDINATOR_CACHE=/some/dir scripts/...  # put them under /some/dir/bin/<version>/
#
# The binaries land in ${COORDINATOR_CACHE:-$HOME/.cache/coordinator}/bin/<k8s version>/.
# Each binary is written under a temporary name and renamed into place, so an interrupted
# build never leaves a half-written binary behind. When both binaries are already there and
# kube-apiserver reports the expected version, the script returns at once.
# The last line printed is the binary directory (handy for COORDINATOR_BIN_DIR=$(...)).
set -euo pipefail

KUBE_VERSION="v1.34.4"
ETCD_VERSION="3.6.16"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kube_module="${here}/controlplane/kube"
etcd_module="${here}/controlplane/etcd"
cache_root="${COORDINATOR_CACHE:-${HOME}/.cache/coordinator}"
bin_dir="${cache_root}/bin/${KUBE_VERSION}"

say() { printf '%s\n' "build-controlplane: $*" >&2; }
die() { say "error: $*"; exit 1; }

etcd_ok() {
    # Capture first: `etcd --version | grep -q` would trip pipefail on SIGPIPE.
    local out
    [[ -x "${bin_dir}/etcd" ]] && out="$("${bin_dir}/etcd" --version 2>/dev/null)" &&
        [[ "${out}" == *"etcd Version: ${ETCD_VERSION}"$'\n'* ]]
}

apiserver_ok() {
    [[ -x "${bin_dir}/kube-apiserver" ]] &&
        [[ "$("${bin_dir}/kube-apiserver" --version 2>/dev/null)" == "Kubernetes ${KUBE_VERSION}" ]]
}

if etcd_ok && apiserver_ok; then
    say "etcd ${ETCD_VERSION} and kube-apiserver ${KUBE_VERSION} are already built"
    printf '%s\n' "${bin_dir}"
    exit 0
fi

go_bin="${GO:-$(command -v go || true)}"
if [[ -z "${go_bin}" && -x /usr/local/go/bin/go ]]; then
    go_bin=/usr/local/go/bin/go
fi
if [[ -n "${GO:-}" && ! -x "${GO}" ]]; then
    die "GO=${GO} is not an executable Go toolchain; unset GO or point it at a go binary (1.24 or newer)."
fi
if [[ -z "${go_bin}" || ! -x "${go_bin}" ]]; then
    die "the Go toolchain (go 1.24 or newer) is needed to build etcd and kube-apiserver, \
but no 'go' was found on PATH. Install it from https://go.dev/dl/ or point GO at it \
(GO=/path/to/go $0)."
fi

grep -Eq "k8s.io/kubernetes ${KUBE_VERSION}( |\$)" "${kube_module}/go.mod" ||
    die "${kube_module}/go.mod does not pin k8s.io/kubernetes ${KUBE_VERSION}; update KUBE_VERSION in $0 together with it"
grep -Eq "go.etcd.io/etcd/server/v3 v${ETCD_VERSION}( |\$)" "${etcd_module}/go.mod" ||
    die "${etcd_module}/go.mod does not pin go.etcd.io/etcd/server/v3 v${ETCD_VERSION}; update ETCD_VERSION in $0 together with it"

# Never let go fetch a different toolchain behind our back; static binaries, no cgo.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0

mkdir -p "${bin_dir}"

# Serialise concurrent runs (two test sessions starting at once) when flock is available.
if command -v flock >/dev/null 2>&1; then
    exec 9>"${bin_dir}/.build.lock"
    if ! flock -n 9; then
        say "another build is running in ${bin_dir}; waiting for it"
        flock 9
    fi
fi

tmp_files=()
cleanup() {
    local f
    for f in "${tmp_files[@]+"${tmp_files[@]}"}"; do
        rm -f -- "${f}"
    done
}
trap cleanup EXIT

# build NAME MODULE_DIR PACKAGE [go build flags...]
build() {
    local name="$1" module="$2" package="$3"
    shift 3
    local tmp="${bin_dir}/.${name}.tmp.$$"
    tmp_files+=("${tmp}")
    local started=${SECONDS}
    say "building ${name} from ${package} (module ${module#"${here}/"}); a cold build takes minutes"
    (cd "${module}" && "${go_bin}" build -trimpath "$@" -o "${tmp}" "${package}")
    mv -f -- "${tmp}" "${bin_dir}/${name}"
    say "built ${name} in $((SECONDS - started))s"
}

say "using $("${go_bin}" version)"

if etcd_ok; then
    say "etcd ${ETCD_VERSION} is already built"
else
    build etcd "${etcd_module}" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
    etcd_ok || die "the etcd just built does not report version ${ETCD_VERSION}"
fi

if apiserver_ok; then
    say "kube-apiserver ${KUBE_VERSION} is already built"
else
    minor="${KUBE_VERSION#v1.}"
    minor="${minor%%.*}"
    if [[ -n "${SOURCE_DATE_EPOCH:-}" ]]; then
        build_date="$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)"
    else
        build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    fi
    ldflags="-s -w"
    # Both version packages are stamped: component-base answers --version and /version,
    # client-go's copy is what the server's own clients report.
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
        ldflags+=" -X ${pkg}.gitMajor=1"
        ldflags+=" -X ${pkg}.gitMinor=${minor}"
        ldflags+=" -X ${pkg}.gitTreeState=clean"
        ldflags+=" -X ${pkg}.buildDate=${build_date}"
    done
    build kube-apiserver "${kube_module}" k8s.io/kubernetes/cmd/kube-apiserver -ldflags "${ldflags}"
    apiserver_ok || die "the kube-apiserver just built does not report ${KUBE_VERSION}"
fi

say "done: etcd ${ETCD_VERSION} and kube-apiserver ${KUBE_VERSION}"
printf '%s\n' "${bin_dir}"
