#!/usr/bin/env bash
# The five-minute tour, run against a fresh local sandbox of three clusters.
# It sets up what it needs (virtualenv, control-plane binaries), prints every command
# before running it, and tears the sandbox down at the end, even on Ctrl-C.
#
#   scripts/demo.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

work="$(mktemp -d "${TMPDIR:-/tmp}/coordinator-demo.XXXXXX")"
export COORDINATOR_CONFIG="${work}/config.yaml"
export XDG_STATE_HOME="${work}/state"
export NO_COLOR=1
unset COORDINATOR_LOCK_ID COORDINATOR_HOLDER

cleanup() {
    echo
    echo "### Tearing the sandbox down"
    coordinator sandbox down --dir "${work}/sandbox" || true
    rm -rf "${work}"
}
trap cleanup EXIT

step() { printf '\n### %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# Commands that are expected to fail: show the exit code and go on.
expect_fail() {
    printf '$ %s\n' "$*"
    set +e
    "$@"
    local code=$?
    set -e
    printf '(exit status %s)\n' "${code}"
}

step "Start three local clusters (etcd + kube-apiserver each)"
run coordinator sandbox up --clusters 3 --dir "${work}/sandbox"
export KUBECONFIG="${work}/sandbox/kubeconfig"

step "Connect them: each is recorded with its identity (the kube-system namespace UID)"
for i in 1 2 3; do run coordinator cluster connect "eu-${i}" --context "sandbox-${i}"; done
run coordinator cluster list

step "A deployment spanning the three clusters (quorum 2 of 3)"
run coordinator deployment create payments --namespace payments --cluster eu-1 --cluster eu-2 --cluster eu-3

step "Alice takes the lock"
run coordinator lock acquire payments --holder alice --ttl 60s --reason "release 1.2"

step "Bob is refused, and told who holds it, where, since when and until when"
expect_fail coordinator lock acquire payments --holder bob

step "Who holds it?"
run coordinator lock status payments

step "Alice releases; Bob runs his deployment step under the lock"
run coordinator lock release payments --holder alice
# The child's shell expands these, not this one: the single quotes are on purpose.
# shellcheck disable=SC2016
run coordinator lock run payments --holder bob --reason "deploy 1.2.0" -- \
    sh -c 'echo "child: lock $COORDINATOR_LOCK_ID, fencing token $COORDINATOR_FENCING_TOKEN"; coordinator state set payments replicas:=3 app.version=1.2.0'

step "The state lives in the clusters; any reader gets it from a majority"
run coordinator state get payments
run coordinator state history payments

step "Pause eu-1's API server (it accepts connections but never answers)"
run coordinator sandbox pause 1 --dir "${work}/sandbox"
export COORDINATOR_HOLDER=carol   # as a CI job would: its own holder id
run coordinator --timeout 2s lock acquire payments --ttl 10m
run coordinator --timeout 2s state set payments replicas:=4
run coordinator --timeout 2s lock status payments

step "Resume it: eu-1 is behind until a read repairs it"
run coordinator sandbox resume 1 --dir "${work}/sandbox"
run coordinator state diff payments
run coordinator sandbox pause 2 --dir "${work}/sandbox"
run coordinator --timeout 2s state get payments replicas
# Carol holds eu-2 and eu-3; with eu-2 silent, eu-3 alone cannot say she holds a majority,
# and eu-1 free cannot say she does not: unknown, never "free" (exit 4).
expect_fail coordinator --timeout 2s lock status payments
run coordinator sandbox resume 2 --dir "${work}/sandbox"
run coordinator state diff payments

step "Watch the lock while Carol releases it"
coordinator lock status payments --watch --interval 0.5s &
watcher=$!
sleep 3
run coordinator lock release payments
sleep 2
# SIGTERM, not SIGINT: a background job of a script starts with SIGINT ignored.
# The watch ends cleanly on SIGTERM (exit 0).
kill -TERM "${watcher}"
wait "${watcher}"

step "Done"
echo "Everything above ran against real API servers on this machine."
