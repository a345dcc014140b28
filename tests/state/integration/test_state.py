"""The quorum-replicated state, against real API servers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from coord_fixtures import UNHURRIED
from faults.kubectl import kubectl

from coordinator.errors import StateConflictError
from coordinator.rules.resources import configmaps_path

pytestmark = pytest.mark.integration


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def _replica(env: Any, index: int) -> dict[str, Any]:
    return anyio.run(env.raw, index, "GET", f"{configmaps_path(env.namespace)}/coordinator-state-{env.deployment}")


def _diff(env: Any, *extra: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in _json(env.cli("-o", "json", *extra, "state", "diff", "web"))}


def _lock(dep: Any, **kw: Any) -> str:
    # Unhurried: a loaded member that missed the acquisition would leave the lock on two
    # members, and a test that then pauses one of those could not confirm it.
    kw.setdefault("env", UNHURRIED)
    proc = dep.cli("-o", "json", "lock", "acquire", "web", "--ttl", "120s", **kw)
    assert proc.returncode == 0, proc.stderr
    return str(_json(proc)["lock_id"])


def test_set_get_round_trip_and_history(dep3: Any) -> None:
    _lock(dep3)
    proc = dep3.cli("state", "set", "web", "replicas:=3", "app.version=1.2.0", "canary:=true", "note=hello world")
    assert proc.returncode == 0, proc.stderr
    assert "version 1" in proc.stdout
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {
        "replicas": 3,
        "app": {"version": "1.2.0"},
        "canary": True,
        "note": "hello world",
    }
    got = dep3.cli("state", "get", "web", "app.version")
    assert got.stdout.strip() == "1.2.0", got.stderr
    assert dep3.cli("state", "set", "web", "replicas=4").returncode == 0
    assert _json(dep3.cli("-o", "json", "state", "get", "web"))["replicas"] == "4"  # KEY=VALUE: text as typed
    hist = _json(dep3.cli("-o", "json", "state", "history", "web"))
    assert [h["version"] for h in hist] == [1, 2]
    assert hist[1]["keys"] == ["replicas"] and hist[1]["command"].startswith("state set")
    assert all(r["status"] == "current" for r in _diff(dep3).values())


def test_set_without_the_lock_is_refused_and_changes_nothing(dep3: Any) -> None:
    # Every command waits for every member (UNHURRIED): a write of a=1 that timed out on a
    # loaded member and landed there later, or a refusal read with too few answers (exit 4),
    # is not what this test is about.
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "a=1", env=UNHURRIED).returncode == 0
    before = [_replica(dep3, i)["data"] for i in (1, 2, 3)]
    other_holder = dep3.cli("state", "set", "web", "a=2", env={**UNHURRIED, "COORDINATOR_HOLDER": "nobody"})
    assert other_holder.returncode == 6, other_holder.stderr
    assert "no lock is held" in other_holder.stderr
    bogus = dep3.cli("state", "set", "web", "a=3", "--lock-id", "feedfacefeedface", env=UNHURRIED)
    assert bogus.returncode == 6, bogus.stderr
    assert "Nothing was written" in bogus.stderr
    assert [_replica(dep3, i)["data"] for i in (1, 2, 3)] == before


def test_write_with_one_paused_then_read_repairs(dep3: Any) -> None:
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "v=1").returncode == 0
    dep3.sandbox.pause(3)
    proc = dep3.cli("-o", "json", "--timeout", "2s", "state", "set", "web", "v=2")
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert doc["confirmed"] == ["c1", "c2"]
    assert {c["name"]: c["outcome"] for c in doc["clusters"]}["c3"] == "unreachable"
    dep3.sandbox.resume(3)
    assert _diff(dep3)["c3"]["status"] == "behind"
    # Reads consult a majority; make sure the lagging one is among them by pausing c1.
    dep3.sandbox.pause(1)
    assert _json(dep3.cli("-o", "json", "--timeout", "2s", "state", "get", "web")) == {"v": "2"}
    dep3.sandbox.resume(1)
    rows = _diff(dep3)
    assert all(r["status"] == "current" for r in rows.values()), rows
    assert {r["version"] for r in rows.values()} == {2}


def test_write_with_two_of_three_paused_is_no_quorum(dep3: Any) -> None:
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "v=1").returncode == 0
    dep3.sandbox.pause(2)
    dep3.sandbox.pause(3)
    proc = dep3.cli("-o", "json", "--timeout", "1s", "state", "set", "web", "v=2")
    assert proc.returncode == 4, proc.stderr
    assert "1 of 3 clusters answered, 2 are needed" in proc.stderr
    assert "never taken as empty" in proc.stderr
    dep3.sandbox.resume(2)
    dep3.sandbox.resume(3)
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"v": "1"}


def test_a_lock_unconfirmed_for_want_of_answers_is_no_quorum_not_lost(dep3: Any) -> None:
    # The lock holds c2 and c3 (c1's lease is deleted by another client); c3 is paused. The
    # lock is unconfirmed, not gone: exit 4 naming c3, and the same write works once c3 answers.
    _lock(dep3)
    gone = kubectl(dep3.kubeconfig, 1, dep3.namespace, "delete", "lease", "coordinator-lock-web")
    assert gone.returncode == 0, gone.stderr
    dep3.sandbox.pause(3)
    try:
        proc = dep3.cli("state", "set", "web", "v=1", env={"COORDINATOR_TIMEOUT": "2s"})
        assert proc.returncode == 4, proc.stderr
        assert "c3 did not answer" in proc.stderr and "it holds 1 of 3 (c2)" in proc.stderr, proc.stderr
        assert "Nothing was written" in proc.stderr
    finally:
        dep3.sandbox.resume(3)
    assert _diff(dep3)["c2"]["status"] == "empty"
    wrote = dep3.cli("state", "set", "web", "v=1", env=UNHURRIED)
    assert wrote.returncode == 0, wrote.stderr
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"v": "1"}


def test_partial_write_is_reported_honestly(dep3: Any) -> None:
    """Reads succeed on a majority but the writes land on one replica only."""

    async def scenario() -> None:
        async with dep3.api(timeout=2) as c:
            async with c.lock("web", ttl=60) as held:
                state = c.state("web")
                await state.set({"v": 1}, lock=held)
                # c2 and c3 stop answering once the version is promised, as the data
                # is sent: the data reaches c1 only.
                original = state.replicas.cas

                async def flaky(rep: Any, stamp: Any, kind: Any, text: Any, **kw: Any) -> Any:
                    if rep.cluster != "c1" and kind == "write":
                        dep3.sandbox.pause(int(rep.cluster[1:]))
                    return await original(rep, stamp, kind, text, **kw)

                state.replicas.cas = flaky  # type: ignore[method-assign]
                from coordinator.errors import NoQuorumError

                with pytest.raises(NoQuorumError) as err:
                    await state.set({"v": 2}, lock=held)
                assert "Outcome unknown" in err.value.message and "reached 1 of 3" in err.value.message
                # The outcome really is unknown: a resumed server would still read the
                # buffered PUT and may apply it. Kill the paused servers so that it dies
                # with them, and start them again: c2 and c3 keep version 1 for certain.
                for i in (2, 3):
                    dep3.sandbox.kill(i)
                for i in (2, 3):
                    dep3.sandbox.start(i)

    anyio.run(scenario)
    rows = _diff(dep3)
    assert rows["c1"]["version"] == 2 and rows["c2"]["version"] == 1


def test_fencing_refuses_the_late_writer(dep3: Any) -> None:
    async def scenario() -> None:
        async with dep3.api() as c:
            a = await c.acquire("web", ttl=2, holder="A")
            await c.state("web").set({"owner": "A"}, lock=a.lock_id)
            b = await c.acquire("web", ttl=60, holder="B", wait=20)  # A expired, B takes over
            assert b.fencing_token > a.fencing_token
            await c.state("web").set({"owner": "B"}, lock=b.lock_id)
            # A wakes up and writes with its old token: every replica refuses
            with pytest.raises(StateConflictError) as err:
                await c.state("web").write(lambda d: {"owner": "A-late"}, lock=a.lock_id, _token=a.fencing_token)
            assert "fencing token" in err.value.message
            # and A through the ordinary path is told it no longer holds the lock
            with pytest.raises(StateConflictError):
                await c.state("web").set({"owner": "A-late"}, lock=a.lock_id)
            assert await c.state("web").get() == {"owner": "B"}

    anyio.run(scenario)
    for i in (1, 2, 3):
        env = json.loads(_replica(dep3, i)["data"]["envelope.json"])
        assert env["data"] == {"owner": "B"}


def test_garbage_replica_is_named_repaired_and_saved(dep3: Any, tmp_path: Path) -> None:
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "k=v").returncode == 0
    cm = _replica(dep3, 2)
    cm["data"]["envelope.json"] = "this is {not json"
    anyio.run(dep3.raw, 2, "PUT", f"{configmaps_path(dep3.namespace)}/coordinator-state-web", cm)
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"k": "v"}
    rows = _diff(dep3)
    assert rows["c2"]["status"] == "corrupt" and "not JSON" in rows["c2"]["detail"]
    backup_dir = tmp_path / "saved"
    sync = dep3.cli("-o", "json", "state", "sync", "web", "--backup-dir", str(backup_dir))
    assert sync.returncode == 0, sync.stderr
    saved = Path(_json(sync)["saved_corrupt"]["c2"])
    assert "this is {not json" in saved.read_text()
    assert all(r["status"] == "current" for r in _diff(dep3).values())


def test_backup_then_restore_is_a_new_audited_version(dep3: Any, tmp_path: Path) -> None:
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "release=1").returncode == 0
    backup = tmp_path / "b.json"
    assert dep3.cli("state", "backup", "web", "-f", str(backup)).returncode == 0
    assert dep3.cli("state", "set", "web", "release=2", "extra=x").returncode == 0
    proc = dep3.cli("-o", "json", "state", "restore", "web", "-f", str(backup))
    assert proc.returncode == 0, proc.stderr
    assert _json(proc)["version"] == 3
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"release": "1"}
    last = _json(dep3.cli("-o", "json", "state", "history", "web"))[-1]
    assert last["command"] == "state restore" and "b.json" in last["note"]
    # From a pipe, which can be read once only: the file is read once, not again to write.
    assert dep3.cli("state", "set", "web", "release=3").returncode == 0
    piped = dep3.cli("-o", "json", "state", "restore", "web", "-f", "/dev/stdin", input=backup.read_text())
    assert piped.returncode == 0, piped.stderr
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"release": "1"}


def test_oversize_document_is_refused_before_anything_is_written(dep3: Any, tmp_path: Path) -> None:
    _lock(dep3)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * (2 * 1024 * 1024)}))
    proc = dep3.cli("state", "apply", "web", "-f", str(big))
    assert proc.returncode == 2, proc.stderr
    assert "limit" in proc.stderr and "Nothing was written" in proc.stderr
    assert all(r["status"] == "empty" for r in _diff(dep3).values())


def test_apply_replaces_data_and_rejects_bad_files(dep3: Any, tmp_path: Path) -> None:
    _lock(dep3)
    good = tmp_path / "s.yaml"
    good.write_text("replicas: 2\nfeatures:\n  - a\n  - b\n")
    assert dep3.cli("state", "apply", "web", "-f", str(good)).returncode == 0
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"replicas": 2, "features": ["a", "b"]}
    for text in ("replicas: [unclosed", "- just\n- a list\n", "plain scalar"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        proc = dep3.cli("state", "apply", "web", "-f", str(bad))
        assert proc.returncode == 2, (text, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"replicas": 2, "features": ["a", "b"]}


def test_newer_schema_is_refused(dep3: Any) -> None:
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "k=v").returncode == 0
    cm = _replica(dep3, 1)
    env = json.loads(cm["data"]["envelope.json"])
    env["schema"] = 99
    cm["data"]["envelope.json"] = json.dumps(env)
    anyio.run(dep3.raw, 1, "PUT", f"{configmaps_path(dep3.namespace)}/coordinator-state-web", cm)
    proc = dep3.cli("state", "set", "web", "k=w")
    assert proc.returncode == 6, proc.stderr
    assert "schema 99" in proc.stderr
    assert json.loads(_replica(dep3, 1)["data"]["envelope.json"])["schema"] == 99
    # diff only looks: it lists the newer replica instead of refusing
    rows = _diff(dep3)
    assert rows["c1"]["status"] == "newer-schema" and "schema 99" in rows["c1"]["detail"], rows
    assert rows["c2"]["status"] == rows["c3"]["status"] == "current", rows
    text = dep3.cli("state", "diff", "web")
    assert text.returncode == 0 and "newer-schema" in text.stdout, text.stderr


def test_five_clusters_state_with_two_paused(dep5: Any) -> None:
    _lock(dep5)
    dep5.sandbox.pause(4)
    dep5.sandbox.pause(5)
    proc = dep5.cli("-o", "json", "--timeout", "2s", "state", "set", "web", "n=5")
    assert proc.returncode == 0, proc.stderr
    assert _json(proc)["confirmed"] == ["c1", "c2", "c3"]
    dep5.sandbox.resume(4)
    dep5.sandbox.resume(5)
    sync = dep5.cli("-o", "json", "state", "sync", "web")
    assert sorted(_json(sync)["repaired"]) == ["c4", "c5"]
