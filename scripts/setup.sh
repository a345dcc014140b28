# shellcheck shell=bash
# Shared set-up for scripts/test.sh, scripts/demo.sh and the benchmarks (sourced, not run).
# Leaves VENV, COORDINATOR_BIN_DIR, COORDINATOR_TOXIPROXY and COORDINATOR_KINDCHECK exported.
say() { printf '[setup] %s\n' "$*" >&2; }

if ! command -v faketime >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing Debian's faketime (for the clock-skew tests)"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
    else
        say "faketime is missing and cannot be installed here; the clock-skew tests will be skipped"
    fi
fi

if ! command -v kubectl >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing Debian's kubernetes-client (kubectl: the other client in the lock tests)"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
    else
        say "kubectl is missing and cannot be installed here; the tests that use it will fail"
    fi
fi

if ! command -v tmux >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing Debian's tmux (for the tests of what an 80-column terminal shows)"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
    else
        say "tmux is missing and cannot be installed here; the terminal tests will be skipped"
    fi
fi

if ! command -v shellcheck >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing Debian's shellcheck (for the check of scripts/*.sh)"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null
    else
        say "shellcheck is missing and cannot be installed here; the script check will be skipped"
    fi
fi

export VENV="${COORDINATOR_VENV:-$PWD/.venv}"
if [[ ! -x "${VENV}/bin/python" ]]; then
    say "creating a virtualenv in ${VENV}"
    python3 -m venv "${VENV}"
fi
stamp="${VENV}/.coordinator-installed"
# The dev tools' versions are pinned in constraints/dev.txt: every run checks with the same ones.
if [[ ! -f "${stamp}" || pyproject.toml -nt "${stamp}" || sandbox/pyproject.toml -nt "${stamp}" ||
      constraints/dev.txt -nt "${stamp}" ]]; then
    say "installing coordinator with its test, benchmark and docs extras, and the sandbox (sandbox/) beside it (versions from constraints/dev.txt)"
    log="${VENV}/pip-install.log"
    if ! { "${VENV}/bin/python" -m pip install --upgrade pip -c constraints/dev.txt &&
           "${VENV}/bin/python" -m pip install -e ".[test,bench,docs]" -e ./sandbox -c constraints/dev.txt; } >"${log}" 2>&1; then
        tail -n 30 "${log}" >&2
        say "pip install failed; the whole log is in ${log}"
        exit 1
    fi
    touch "${stamp}"
fi

say "building (or finding) etcd and kube-apiserver; a cold build takes several minutes"
COORDINATOR_BIN_DIR="$(scripts/build-controlplane.sh | tail -n 1)"
export COORDINATOR_BIN_DIR
say "building (or finding) toxiproxy"
COORDINATOR_TOXIPROXY="$(scripts/build-toxiproxy.sh | tail -n 1)"
export COORDINATOR_TOXIPROXY
say "building (or finding) kindcheck (Kind's own config types, for the Kind config check)"
COORDINATOR_KINDCHECK="$(scripts/build-kindcheck.sh | tail -n 1)"
export COORDINATOR_KINDCHECK
say "building (or finding) krew's manifest validator (for the kubectl plugin's krew manifest)"
COORDINATOR_KREWVALIDATE="$(scripts/build-krewvalidate.sh | tail -n 1)"
export COORDINATOR_KREWVALIDATE
export PATH="${VENV}/bin:${PATH}"

# The editable install leaves the package's bytecode to be written on first import, and
# with PYTHONDONTWRITEBYTECODE set (some machines set it) every command would compile the
# whole package from source again (~70 ms per start). Compile it now, as installing a wheel
# does; files changed later are compiled again the next time this runs.
"${VENV}/bin/python" -m compileall -q coordinator >/dev/null
