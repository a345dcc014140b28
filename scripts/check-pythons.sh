#!/usr/bin/env bash
# The unit half of the suite (every test marked unit: tests/<topic>/unit/ and the simulator's) on the other
# Pythons the package supports: 3.12 and 3.13 (scripts/test.sh runs everything on .venv's).
#
#   scripts/check-pythons.sh                 # 3.12 and 3.13
#   COORDINATOR_PYTHONS="3.13" scripts/...   # the versions named
#   scripts/check-pythons.sh -k lease        # extra arguments go to pytest
#
# Each version gets a virtualenv of its own under ~/.cache/coordinator/venvs/py3.X with the
# package's requirements, its test extra, the sandbox's requirements (sandbox/) and its
# build backend, at constraints/dev.txt's versions.
# It holds no code of the checkout (the tests import coordinator from the checkout, through
# PYTHONPATH), so every clone on the machine can use it; it is made again when what it was
# made from changes: the requirements in pyproject.toml, constraints/dev.txt or the
# interpreter (compared by content: a fresh clone's files are all newer than any stamp).
# Two runs at once share it; one that must make it again waits for the other to finish.
#
# The interpreter: python3.X on PATH if it runs, else pyenv's newest 3.X, else uv's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
cache="${COORDINATOR_CACHE:-${HOME}/.cache/coordinator}/venvs"
read -r -a versions <<<"${COORDINATOR_PYTHONS:-3.12 3.13}"
began=${SECONDS}

say() { printf '[check-pythons] %s\n' "$*" >&2; }

is_version() {  # is_version PYTHON 3.X: the interpreter runs and is that version
    "$1" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$2')" 2>/dev/null
}

find_python() {
    local version=$1 candidate pyenv_root
    if candidate=$(command -v "python${version}") && is_version "${candidate}" "${version}"; then
        echo "${candidate}"
        return
    fi
    pyenv_root=$(pyenv root 2>/dev/null || echo "${HOME}/.pyenv")
    candidate=$(find "${pyenv_root}/versions" -maxdepth 3 -path "*/versions/${version}.*/bin/python${version}" \
        2>/dev/null | sort -V | tail -n 1)
    if [[ -n "${candidate}" ]] && is_version "${candidate}" "${version}"; then
        echo "${candidate}"
        return
    fi
    if command -v uv >/dev/null 2>&1 && candidate=$(uv python find "${version}" 2>/dev/null) &&
        is_version "${candidate}" "${version}"; then
        echo "${candidate}"
        return
    fi
    return 1
}

# What the package needs with its test extra, what the sandbox needs besides coordinator
# (sandbox/pyproject.toml), and the build backend (the unit tests ask setuptools which
# packages the wheel holds), as the pyproject.toml files say.
requirements() {
    "$1" - <<'EOF'
import tomllib

pyproject = tomllib.load(open("pyproject.toml", "rb"))
project, extras = pyproject["project"], pyproject["project"]["optional-dependencies"]
sandbox = [d for d in tomllib.load(open("sandbox/pyproject.toml", "rb"))["project"]["dependencies"]
           if not d.startswith("coordinator")]
print("\n".join([*project["dependencies"], *extras["test"], *sandbox, *pyproject["build-system"]["requires"]]))
EOF
}

make_venv() {  # make_venv PYTHON VENV: (re)made unless its recipe is the one it was made from
    local python=$1 venv=$2 wanted log
    wanted=$({ "${python}" --version; requirements "${python}"; cat constraints/dev.txt; } | sha256sum | cut -d' ' -f1)
    if [[ -x "${venv}/bin/python" && "$(cat "${venv}/.coordinator-recipe" 2>/dev/null)" == "${wanted}" ]]; then
        return
    fi
    say "making ${venv} (a minute or two, once)"
    rm -rf "${venv}"
    log="${venv}-install.log"
    if ! {
        "${python}" -m venv "${venv}" &&
            requirements "${python}" >"${venv}/requirements.txt" &&
            "${venv}/bin/python" -m pip install --upgrade pip -c constraints/dev.txt &&
            "${venv}/bin/python" -m pip install -r "${venv}/requirements.txt" -c constraints/dev.txt
    } >"${log}" 2>&1; then
        tail -n 30 "${log}" >&2
        say "installing into ${venv} failed; the whole log is in ${log}"
        rm -rf "${venv}"
        return 1
    fi
    echo "${wanted}" >"${venv}/.coordinator-recipe"
}

status=0
for version in "${versions[@]}"; do
    if ! python=$(find_python "${version}"); then
        say "Python ${version} is not installed (looked for python${version} on PATH, in pyenv and uv);" \
            "install it, e.g. \`pyenv install ${version}\`, or leave it out with COORDINATOR_PYTHONS"
        status=1
        continue
    fi
    venv="${cache}/py${version}"
    mkdir -p "${cache}"
    exec 9>"${venv}.lock"
    flock -x 9  # making the venv: no run of the tests may be using it
    if ! make_venv "${python}" "${venv}"; then
        status=1
        exec 9>&-
        continue
    fi
    flock -s 9  # running the tests: others may too
    echo "== unit tests on $("${venv}/bin/python" --version) (${python})"
    # The checkout's bytecode for this version, once (PYTHONDONTWRITEBYTECODE may be set).
    "${venv}/bin/python" -m compileall -q coordinator tests >/dev/null
    PATH="${venv}/bin:${PATH}" PYTHONPATH="${root}:${root}/sandbox${PYTHONPATH:+:${PYTHONPATH}}" "${venv}/bin/python" -m pytest -q -p no:cacheprovider \
        -m unit -n "${COORDINATOR_TEST_WORKERS:-2}" --dist worksteal tests "$@" || status=$?
    exec 9>&-
done
echo "== scripts/check-pythons.sh took $(( SECONDS - began )) s (exit ${status})"
exit "${status}"
