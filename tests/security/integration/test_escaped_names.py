"""Names from the clusters (holders, identities) reach error paragraphs and prompts escaped, never as forged lines."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
import pytest
from coord_fixtures import Env, put_lease
from helpers.hostile import FORGED, TITLE, clean, minted_user, request_as

from coordinator.rules.resources import (
    LABEL_DEPLOYMENT,
    LABEL_MANAGED_BY,
    LABEL_VALUE,
    configmaps_path,
    lease_path,
    leases_path,
)

integration = pytest.mark.integration


@integration
def test_an_identity_configmap_cannot_forge_a_line_of_the_mismatch_error(dep3: Env, tmp_path: Path) -> None:
    me = Env(sandbox=dep3.sandbox, config=tmp_path / "r" / "config.yaml", namespace=dep3.namespace)
    ns = dep3.sandbox.restricted_namespace
    connected = me.cli("cluster", "connect", "r1", "--context", dep3.sandbox.restricted_contexts[0],
                       "--identity-namespace", ns)  # fmt: skip
    assert connected.returncode == 0, connected.stderr
    path = f"{configmaps_path(ns)}/coordinator-identity"
    original = anyio.run(dep3.raw, 1, "GET", path)
    try:
        forged = json.loads(json.dumps(original))
        forged["data"]["uuid"] = f"bogus\n{FORGED}\x1b[2J"
        anyio.run(dep3.raw, 1, "PUT", path, forged)
        proc = me.cli("cluster", "info", "r1")
        assert proc.returncode == 5, proc.stderr
        clean(proc.stdout + proc.stderr)
    finally:
        current = anyio.run(dep3.raw, 1, "GET", path)
        current["data"] = original["data"]
        anyio.run(dep3.raw, 1, "PUT", path, current)


# Broke before: `lock renew` named a new holder raw in 'is lost: ... held by X', a forged line.
@integration
def test_a_lost_renewal_names_the_new_holder_escaped(dep3: Env) -> None:
    taken = dep3.cli("-o", "json", "lock", "acquire", "web", "--ttl", "60s", "--holder", "alice")
    lock_id = json.loads(taken.stdout)["lock_id"]

    async def edit() -> None:
        lease = await dep3.raw(3, "GET", lease_path(dep3.namespace, "coordinator-lock-web"))
        lease["spec"]["holderIdentity"] = f"m/zzzz{TITLE}"
        lease["metadata"]["annotations"]["coordinator.io/holder"] = f"x\n{FORGED}{TITLE}"
        await put_lease(dep3, 3, lease)

    anyio.run(edit)
    proc = dep3.cli("lock", "renew", "web", "--lock-id", lock_id)
    assert proc.returncode == 6 and "is lost" in proc.stderr, proc.stderr
    clean(proc.stdout + proc.stderr)


# Broke before: the `lock break` prompt showed the holder raw (title set, prompt rewritten).
@integration
def test_the_lock_break_prompt_shows_the_holder_escaped(dep3: Env) -> None:
    import pty
    import select

    holder = f"mallory{TITLE}\x1b[2K\rnobody"
    assert dep3.cli("lock", "acquire", "web", "--ttl", "120s", "--holder", holder).returncode == 0
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on a terminal
        os.execvpe(sys.executable, [sys.executable, "-m", "coordinator", "lock", "break", "web"], dep3.environ())
    out = b""
    try:
        deadline = time.monotonic() + 45
        while b"[y/N]" not in out and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
        os.write(fd, b"n\n")
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    assert b"[y/N]" in out, out
    text = out.decode("utf-8", "replace")
    clean(text)
    assert "\\x1b]0;pwned" in text, text  # shown, escaped


# Broke before: `deployment import` quoted a planted member identity raw.
@integration
def test_deployment_import_quotes_a_planted_identity_escaped(dep3: Env, tmp_path: Path) -> None:
    minted = minted_user(dep3, tmp_path)
    membership = json.dumps({"epoch": 1, "members": [f"x\n{FORGED}{TITLE}"]})
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "coordinator-lock-zzz",
            "labels": {LABEL_MANAGED_BY: LABEL_VALUE, LABEL_DEPLOYMENT: "zzz"},
            "annotations": {"coordinator.io/membership": membership},
        },
        "spec": {},
    }
    path = lease_path(dep3.namespace, "coordinator-lock-zzz")
    request_as(minted, 1, "POST", leases_path(dep3.namespace), body, {"fieldManager": "coordinator"})
    try:
        proc = dep3.cli("deployment", "import", "zzz", "--cluster", "c1", "-n", dep3.namespace)
    finally:
        anyio.run(dep3.raw, 1, "DELETE", path)  # the fleet view lists every namespace
    assert proc.returncode == 2, proc.stderr
    clean(proc.stdout + proc.stderr)
