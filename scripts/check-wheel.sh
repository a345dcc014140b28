#!/usr/bin/env bash
# The package as users get it: build the sdist and the wheel (with `python -m build`, the
# wheel from the sdist, as a release is made), check that the wheel holds the coordinator
# package and nothing of the test suite or the sandbox, install it into a fresh virtualenv
# and run `coordinator --version` there (and `coordinator sandbox`, which must say what to
# install).
#
#   scripts/check-wheel.sh         # in a temporary folder, removed at the end
#   scripts/check-wheel.sh DIR     # leaves DIR/dist and DIR/venv (tests/project/integration/test_wheel.py
#                                  # runs that venv's `coordinator` against the sandbox)
#
# The virtualenv gets the wheel and what its metadata requires, from the package index, at
# the versions constraints/dev.txt pins (the check is of the wheel, not of the index's newest
# releases); neither the checkout nor .venv is on its path. Without the `build` package
# (the test extra has it) only the wheel is built, with `pip wheel`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
began=${SECONDS}

python="${VENV:-${root}/.venv}/bin/python"
if [[ ! -x "${python}" ]]; then
    python=python3
fi

if [[ $# -gt 0 ]]; then
    work=$(mkdir -p "$1" && cd "$1" && pwd)
else
    work=$(mktemp -d)
    trap 'rm -rf "${work}"' EXIT
fi
dist="${work}/dist"
venv="${work}/venv"
rm -rf "${dist}" "${venv}"

quiet() {  # run a command, its output to a log shown only when it fails
    local log="${work}/$1.log"
    shift
    if ! "$@" >"${log}" 2>&1; then
        tail -n 30 "${log}" >&2
        echo "check-wheel: failed: $*; the whole log is in ${log}" >&2
        exit 1
    fi
}

if "${python}" -c "import build" 2>/dev/null; then
    echo "== build: sdist, and the wheel from it"
    quiet build "${python}" -m build --outdir "${dist}" .
else
    echo "== build: the wheel alone (pip wheel; the build package is not installed)"
    quiet build "${python}" -m pip wheel --no-deps --wheel-dir "${dist}" .
fi
wheels=("${dist}"/coordinator-*.whl)
wheel=${wheels[0]}
version=$("${python}" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    pyproject.toml)

echo "== what the wheel holds: $(basename "${wheel}")"
"${python}" - "${wheel}" "${version}" <<'EOF'
import ast
import sys
import zipfile
from email.parser import Parser

wheel, version = sys.argv[1], sys.argv[2]
# The test suite's tools and helpers, the benchmarks: none of it is for users.
TOOLS = {"pytest", "_pytest", "xdist", "hypothesis", "trio", "tests", "testing", "faults", "sim",
         "bench", "coord_fixtures", "dateproxy", "register_model", "cliserver", "served", "scripts"}
info = f"coordinator-{version}.dist-info/"
problems = []
with zipfile.ZipFile(wheel) as whl:
    names = whl.namelist()
    for name in names:
        if not (name.startswith("coordinator/") or name.startswith(info)):
            problems.append(f"{name}: outside the coordinator package")
        elif TOOLS & set(name.split("/")[:-1]):
            problems.append(f"{name}: a test tool's folder")
        elif "sandbox" in name.lower():
            problems.append(f"{name}: sandbox code (a distribution of its own, sandbox/)")
        if name.endswith(".py"):
            for node in ast.walk(ast.parse(whl.read(name), name)):
                if isinstance(node, ast.Import):
                    tops = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    tops = {(node.module or "").split(".")[0]}
                else:
                    continue
                if tops & TOOLS:
                    problems.append(f"{name}:{node.lineno}: imports {', '.join(sorted(tops & TOOLS))}")
    for needed in ("coordinator/__init__.py", "coordinator/cli/__init__.py", "coordinator/py.typed"):
        if needed not in names:
            problems.append(f"{needed} is missing")
    meta = Parser().parsestr(whl.read(info + "METADATA").decode())
    for req in meta.get_all("Requires-Dist") or []:
        dist = req.split(";")[0].split("<")[0].split(">")[0].split("=")[0].split("[")[0].strip().lower()
        if "extra ==" not in req and dist.replace("-", "_") in TOOLS | {"pytest_xdist", "ruff", "mypy"}:
            problems.append(f"Requires-Dist {req!r}: a test tool every user would install")
        if dist in ("cryptography", "coordinator-sandbox"):
            problems.append(f"Requires-Dist {req!r}: the sandbox's, not coordinator's")
    entry_points = whl.read(info + "entry_points.txt").decode()
    if "coordinator = coordinator.cli:main" not in entry_points:
        problems.append("the console script coordinator = coordinator.cli:main is missing")
if problems:
    sys.exit("check-wheel: the wheel is not what users should get:\n  " + "\n  ".join(problems))
print(f"{len(names)} files, all under coordinator/ and its dist-info; no test tools, no sandbox")
EOF

echo "== a fresh virtualenv with the wheel and its requirements"
quiet venv "${python}" -m venv --without-pip "${venv}"
quiet install "${python}" -m pip --python "${venv}/bin/python" install --no-warn-script-location \
    -c constraints/dev.txt "${wheel}"

echo "== coordinator --version, from the virtualenv"
# From the work folder and without PYTHONPATH, so that nothing of the checkout can be imported.
cd "${work}"
shown=$(env -u PYTHONPATH "${venv}/bin/coordinator" --version)
echo "${shown}"
if [[ "${shown}" != "coordinator, version ${version}" ]]; then
    echo "check-wheel: expected 'coordinator, version ${version}'" >&2
    exit 1
fi
# The kubectl plugin (`kubectl coordinator`) is the same CLI under the name kubectl looks for.
plugin=$(env -u PYTHONPATH "${venv}/bin/kubectl-coordinator" --version)
if [[ "${plugin}" != "${shown}" ]]; then
    echo "check-wheel: kubectl-coordinator --version said '${plugin}', not '${shown}'" >&2
    exit 1
fi
# Without the sandbox distribution, `coordinator sandbox` says what to install and exits 2.
set +e
missing=$(env -u PYTHONPATH "${venv}/bin/coordinator" sandbox status 2>&1)
code=$?
set -e
if [[ ${code} -ne 2 || "${missing}" != *"pip install ./sandbox"* ]]; then
    echo "check-wheel: coordinator sandbox status exited ${code} without the sandbox installed: ${missing}" >&2
    exit 1
fi
origin=$(env -u PYTHONPATH "${venv}/bin/python" -c 'import coordinator; print(coordinator.__file__)')
if [[ "${origin}" != "${venv}/"* ]]; then
    echo "check-wheel: coordinator was imported from ${origin}, not from the virtualenv" >&2
    exit 1
fi
echo "== the wheel checks out ($(( SECONDS - began )) s)"
