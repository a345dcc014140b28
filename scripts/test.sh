#!/usr/bin/env bash
# Run the whole test suite from a fresh clone: it sets up everything it needs first.
#
#   scripts/test.sh              # everything (unit + integration on real control planes)
#   scripts/test.sh -k lock      # extra arguments go to pytest
#
# Set-up, each step skipped when already done: Debian's faketime (clock-skew tests),
# a virtualenv in .venv with the package and its test extras, and the Go builds of
# etcd, kube-apiserver and toxiproxy (cached under ~/.cache/coordinator).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec "${VENV}/bin/python" -m pytest -q -p no:cacheprovider "$@"
