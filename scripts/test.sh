#!/usr/bin/env bash
# Run the whole test suite from a fresh clone: it sets up everything it needs first.
#
#   scripts/test.sh              # everything (unit + integration on real control planes)
#   scripts/test.sh -k lock      # extra arguments go to pytest
#   scripts/test.sh -n 0         # one process (the default is four workers, see below)
#
# Four pytest workers (pytest-xdist) by default, COORDINATOR_TEST_WORKERS to change it: most
# integration tests wait on real API servers (TTLs, timeouts, watches) rather than compute,
# and each worker starts sandboxes of its own (about 0.8 GB of kube-apiservers a worker).
# Measured from fresh clones of the same commit (1,714 tests, quiet machine, 2026-12-07):
# three workers 23 min 16 s with the two cores 62 % busy, four 20 min 22 s at 73 %
# (CONTRIBUTING.md: where the time goes). Work stealing: handed out in fixed shares, the
# last 20 minutes of a run went to one worker while the other had finished.
#
# Set-up, each step skipped when already done: Debian's faketime (clock-skew tests),
# a virtualenv in .venv with the package and its test extras, and the Go builds of
# etcd, kube-apiserver and toxiproxy (cached under ~/.cache/coordinator).
#
# Then the static checks, each named (ruff's lint and format check, mypy --strict as
# pyproject configures it, import-linter's layer contracts), and pytest, which ends with
# the 30 slowest tests and the total.
# With COORDINATOR_CHECK_PYTHONS set, the unit half then runs again on Python 3.12 and 3.13
# (scripts/check-pythons.sh: 4 minutes more on a quiet machine, up to 12 beside another
# suite, one more when its virtualenvs must be made; CI leaves it out until the suite is
# well inside its time). Extra arguments skip the static checks and that step: they are
# for running a part of the suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
began=${SECONDS}
if [ "$#" -eq 0 ]; then
    echo "== ruff check"
    "${VENV}/bin/ruff" check coordinator sandbox tests scripts
    echo "== ruff format --check"
    "${VENV}/bin/ruff" format --check coordinator sandbox tests scripts
    echo "== mypy"
    "${VENV}/bin/mypy"
    echo "== lint-imports (the layer contracts in pyproject.toml)"
    "${VENV}/bin/lint-imports" --no-cache --no-logo
    # The documentation site (mkdocs.yml): a broken link or anchor, or a page left out of
    # the navigation, fails the build. It goes to site/ (ignored by git). Not --quiet: that
    # hides the warnings from --strict too, and the build passes whatever they say.
    echo "== mkdocs build --strict"
    NO_MKDOCS_2_WARNING=1 "${VENV}/bin/mkdocs" build --strict
    echo "== pytest (unit, simulator, integration)"
fi
status=0
"${VENV}/bin/python" -m pytest -q -p no:cacheprovider -n "${COORDINATOR_TEST_WORKERS:-4}" --dist worksteal \
    --durations=30 "$@" || status=$?
if [ "$#" -eq 0 ] && [ -n "${COORDINATOR_CHECK_PYTHONS:-}" ]; then
    echo "== the unit half on Python 3.12 and 3.13 (scripts/check-pythons.sh)"
    pythons=0
    scripts/check-pythons.sh || pythons=$?
    if [ "${status}" -eq 0 ]; then
        status=${pythons}
    fi
fi
echo "== scripts/test.sh took $(( (SECONDS - began) / 60 )) min $(( (SECONDS - began) % 60 )) s (exit ${status})"
exit "${status}"
