"""The command lines the README and docs/*.md show outside the tour and the on-call
sessions, each run as the page writes it against the three-cluster sandbox, in one story:
connect, create, lock, write, read, break, look back, delete.

Each ``play("coordinator …", …)`` below is one line of a page, character for character
(whitespace normalised, a shell redirection cut off); tests/project/unit/test_doc_commands.py
fails when a page shows a command line that is neither played here, run by the test it
names, nor marked illustrative on its page. The page's names are the documentation's; the
test's real ones replace them word by word (SUBSTITUTE, below), and every other word runs as
written. What is checked is the exit status and the part of the output the page shows or
describes. The commands run with the suite's unhurried request timeout in their environment
(COORDINATOR_TIMEOUT, not a word of the line), so that a loaded machine's slow answer does
not pass for a missing member.
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
from pathlib import Path
from typing import Any

from coord_fixtures import UNHURRIED, Env
from faults.kubectl import kubectl

# The documentation's names, and the placeholders of its synopses, for this sandbox's. The
# value of `-n`/`--namespace` (the docs' "payments") is this test's fresh namespace, as NS
# is, and a lock id (the docs' 110daf411e28c438, or ID) is the lock the story has just taken.
SUBSTITUTE = {
    "eu-1": "c1",
    "eu-2": "c2",
    "us-1": "c3",
    "kind-eu-1": "sandbox-1",  # the context of cluster 1
    "./deploy.sh": "{deploy}",  # a script that says what it deploys
    "DEP": "payments",
    "NAME": "c2",
    "CTX": "sandbox-2",
    "CLUSTER": "c1",
    "NS": "{namespace}",
    "ME": "alice",
    "TEXT": "runner died",
    "CMD": "echo",
    "ARGS...": "deployed",
    "FILE": "{state_file}",  # a YAML document for `state apply`
}
LOCK_IDS = ("110daf411e28c438", "ID")
# What a rollout left on each member, for the drift pages' commands.
ROLLED_OUT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: api}
spec:
  replicas: 3
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec: {containers: [{name: api, image: "registry.example/api:1.2.0"}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: api-settings}
data: {mode: fast}
"""
NAMESPACE_OPTIONS = ("-n", "--namespace")


def test_every_command_line_of_the_docs_runs_as_the_page_says(own_sandbox3: Any, tmp_path: Path) -> None:
    # A sandbox of its own: the story tombstones every lease of c2 (`cluster restored`) and
    # reads the fleet view of every deployment on the clusters, which on the shared sandbox
    # would change other tests' leases and depend on what they left behind.
    namespace = "t-" + secrets.token_hex(4)
    config = tmp_path / "config" / "config.yaml"
    env = Env(sandbox=own_sandbox3, config=config, namespace=namespace, deployment="payments")
    deploy = tmp_path / "deploy.sh"
    deploy.write_text('#!/bin/sh\necho "deploying $1 under fencing token $COORDINATOR_FENCING_TOKEN"\n')
    deploy.chmod(0o755)
    state_file = tmp_path / "state.yaml"
    state_file.write_text("app:\n  version: '1.11'\nreplicas: 4\n")
    files = {"deploy": str(deploy), "state_file": str(state_file), "namespace": namespace}

    def words(shown: str, lock_id: str) -> list[str]:
        out: list[str] = []
        for word in shlex.split(shown)[1:]:
            if out and out[-1] in NAMESPACE_OPTIONS and word == "payments":
                word = namespace
            elif word in LOCK_IDS:
                word = lock_id
            else:
                # Only the substitutes are formatted: a page's own word may hold braces
                # (a jsonpath template).
                word = SUBSTITUTE[word].format(**files) if word in SUBSTITUTE else word
            out.append(word)
        return out

    def play(shown: str, code: int, *expected: str, lock_id: str = "-") -> subprocess.CompletedProcess[str]:
        """Run the page's line ``shown`` with this sandbox's names; it exits ``code`` and
        prints each of ``expected`` (on stdout or stderr)."""
        proc = env.cli(*words(shown, lock_id), env=UNHURRIED)  # every member's answer, under load too
        said = proc.stdout + proc.stderr
        assert proc.returncode == code, f"{shown}: exit {proc.returncode}\n{said}"
        for part in expected:
            assert part.format(ns=namespace) in said, f"{shown}: no {part!r} in\n{said}"
        return proc

    def setup(*args: str) -> subprocess.CompletedProcess[str]:
        """A step of the story that no page shows."""
        proc = env.cli(*args, env=UNHURRIED)
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return proc

    def taken(*args: str) -> str:
        """The lock id of a lock the story takes by hand (a short TTL: nothing waits on it)."""
        return str(
            json.loads(setup("-o", "json", "lock", "acquire", "payments", "--ttl", "30s", *args).stdout)["lock_id"]
        )

    # cli.md, getting-started.md: connect the members, make the deployment over them.
    play("coordinator cluster connect eu-1 --context kind-eu-1", 0, "Connected c1", "context sandbox-1")
    play("coordinator cluster connect NAME --context CTX", 0, "Connected c2", "context sandbox-2")
    setup("cluster", "connect", "c3", "--context", "sandbox-3")
    play(
        "coordinator deployment create payments -n payments --cluster eu-1 --cluster eu-2 --cluster us-1",
        0,
        "Created deployment payments in namespace {ns} on 3 clusters (quorum 2).",
    )
    # cli.md, on-call.md: what a cluster is, for a deployment; the fleet.
    play("coordinator cluster info eu-1 -n payments", 0, "server", "identity", "sandbox-1")
    play("coordinator cluster info NAME", 0, "server", "sandbox-2")
    play("coordinator cluster info NAME -n NS", 0, "server", "sandbox-2")
    play("coordinator lock status", 0, "payments")

    # cli.md: take the lock, write and read the state under it, release it.
    play('coordinator lock acquire payments --wait 5m --reason "release 1.2"', 0, "Locked payments as")
    play(
        "coordinator state set payments app.version=1.10 replicas:=3 canary:=true",
        0,
        "Wrote version 1",
        "on 3 of 3 clusters",
    )
    assert play("coordinator state get payments app.version", 0).stdout.strip() == "1.10"
    shown = play("coordinator lock status payments -o json", 0).stdout
    assert json.loads(shown)["status"] == "held" and json.loads(shown)["reason"] == "release 1.2"
    before = json.loads(play("coordinator lock status payments -o json --timeout 10s", 0).stdout)
    after = json.loads(play("coordinator -o json --timeout 10s lock status payments", 0).stdout)
    assert before["lock_id"] == after["lock_id"] and before.keys() == after.keys()
    # cli.md, output formats: kubectl's, over that same lock and its clusters.
    holder = play("coordinator lock status payments -o jsonpath='{.holder}'", 0).stdout
    assert holder == before["holder"]
    per_member = play(
        """coordinator lock status payments -o jsonpath='{range .clusters[*]}{.name}{"\\t"}{.lock_id}{"\\n"}{end}'""",
        0,
    ).stdout
    assert per_member == "".join(f"c{i}\t{before['lock_id']}\n" for i in (1, 2, 3))
    play("coordinator lock status payments -o wide", 0, "LOCK ID", "TOKEN", before["lock_id"])
    assert play("coordinator cluster list -o name", 0).stdout == "cluster/c1\ncluster/c2\ncluster/c3\n"
    play("coordinator deployment list -o wide", 0, "STORAGE", "configmap")
    # on-call.md: the troubleshooting commands, under that lock.
    play("coordinator lock status DEP", 0, "payments is LOCKED by")
    play("coordinator state diff DEP", 0, "CLUSTER  STATUS", "current")
    play("coordinator state sync DEP --from CLUSTER", 0, "Wrote version 2", "on 3 of 3 clusters")
    play("coordinator state apply DEP -f FILE", 0, "Wrote version 3", "on 3 of 3 clusters")
    assert json.loads(setup("-o", "json", "state", "get", "payments").stdout) == {
        "app": {"version": "1.11"},
        "replicas": 4,
    }
    # drift.md, cli.md: what a rollout left on every member, recorded under that lock.
    for i in (1, 2, 3):
        applied = kubectl(env.kubeconfig, i, namespace, "apply", "-f", "-", stdin=ROLLED_OUT, timeout=60)
        assert applied.returncode == 0, applied.stderr
    play(
        "coordinator drift record payments deployment/api configmap/api-settings",
        0,
        "Recorded Deployment {ns}/api: .spec.replicas = 3",
        "Recorded ConfigMap {ns}/api-settings",
    )
    play("coordinator drift payments", 0, "No drift: 6 of 6")
    play("coordinator drift check payments", 0, "No drift: 6 of 6")
    assert "api-settings" in play("coordinator state get payments drift", 0).stdout
    play("coordinator lock release payments", 0, "Released lock")
    # drift.md: a hand edit on one member is drift, and a rollout does not start over it.
    scaled = kubectl(env.kubeconfig, 2, namespace, "scale", "deployment", "api", "--replicas=5", timeout=60)
    assert scaled.returncode == 0, scaled.stderr
    found = json.loads(play("coordinator drift payments -o json", 8).stdout)
    assert [(f["cluster"], f["status"]) for f in found["findings"] if f["status"] != "match"] == [("c2", "drifted")]
    play("coordinator lock run payments --check-drift -- ./deploy.sh v1.2", 8, "on c2", "was not run")
    scaled = kubectl(env.kubeconfig, 2, namespace, "scale", "deployment", "api", "--replicas=3", timeout=60)
    assert scaled.returncode == 0, scaled.stderr
    # ci.md: the cleanup step finds nothing to release and succeeds.
    play("coordinator lock release DEP --if-held", 0, "nothing to release")

    # cli.md, ci.md: a command under the lock, which it gets at once (free), then gives back.
    ran = play("coordinator lock run payments --wait 10m -- ./deploy.sh v1.2", 0, "after the child exited 0")
    assert "deploying v1.2 under fencing token" in ran.stdout
    ran = play("coordinator lock run DEP -- CMD ARGS...", 0, "after the child exited 0")
    assert ran.stdout.strip() == "deployed"

    # cli.md, on-call.md: break a lock by its id (dave's, taken by hand for each).
    broke = "Broke lock {lock_id} of payments on c1, c2, c3"
    lock_id = taken("--holder", "dave", "--reason", "hotfix")
    play(
        'coordinator lock break payments --lock-id 110daf411e28c438 --yes --reason "runner died"',
        0,
        broke.format(lock_id=lock_id),
        lock_id=lock_id,
    )
    lock_id = taken("--holder", "dave", "--reason", "hotfix")
    play(
        "coordinator lock break DEP --lock-id ID --yes --reason TEXT", 0, broke.format(lock_id=lock_id), lock_id=lock_id
    )
    lock_id = taken("--holder", "dave", "--reason", "hotfix")
    play("coordinator lock break DEP --lock-id ID --yes", 0, broke.format(lock_id=lock_id), lock_id=lock_id)

    # cli.md, on-call.md: what happened, from the history every member keeps.
    history = play(
        "coordinator lock history payments --since 2026-12-01T02:00:00Z", 0, "holder(s) of the lock of payments"
    )
    assert "broken by" in history.stdout and "released" in history.stdout
    play("coordinator lock history DEP", 0, "holder(s) of the lock of payments", "runner died")

    # ci.md, on-call.md: the RBAC to grant, printed (no cluster needed).
    play(
        "coordinator rbac print -n payments --deployment payments --service-account payments:deployer",
        0,
        "kind: Role",
        "namespace: {ns}",
        "name: deployer",
    )
    play("coordinator rbac print -n NS --deployment DEP --user ME", 0, "kind: Role", "name: alice")
    # drift.md: the right to read the watched resources, by name.
    play(
        "coordinator rbac print -n payments --deployment payments --group release-engineers --drift deployment/api "
        "--drift configmap/api-settings",
        0,
        "name: coordinator:drift-reads:",
        "- api-settings",
    )
    # cli.md: shell completion scripts.
    play("coordinator completion bash", 0, "complete")
    play("coordinator completion fish", 0, "complete")

    # assumptions.md: after a member's etcd came back from a backup; then cli.md: delete all.
    play("coordinator cluster restored NAME --yes", 0, "on c2 as held by an unknown holder", "tombstoned")
    play("coordinator deployment delete payments --purge --yes", 0, "Deleted deployment payments")
    assert "payments" not in setup("deployment", "list").stdout
