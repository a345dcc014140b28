"""The state register on real API servers: the issue's reproduction (a write rejected on
two clusters by a ValidatingAdmissionPolicy, then one confirmed while the third is
paused), a replica forged by hand, and the values and files `state set` / `state apply`
take."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from faults.admission import add_policy, remove_policy

from coordinator.rules.resources import configmaps_path

pytestmark = pytest.mark.integration

PROBE = "vap-probe"


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def _lock(env: Any) -> str:
    proc = env.cli("-o", "json", "lock", "acquire", "web", "--ttl", "300s")
    assert proc.returncode == 0, proc.stderr
    return str(_json(proc)["lock_id"])


def _state_path(env: Any) -> str:
    return f"{configmaps_path(env.namespace)}/coordinator-state-{env.deployment}"


def _envelope(env: Any, index: int) -> dict[str, Any]:
    obj = anyio.run(env.raw, index, "GET", _state_path(env))
    return dict(json.loads(obj["data"]["envelope.json"]))


def _diff(env: Any) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in _json(env.cli("-o", "json", "--timeout", "3s", "state", "diff", "web"))}


# ------------------------------------------------------------------ admission policies


def _freeze_updates(env: Any, index: int, *, data_only: bool) -> None:
    """Make cluster ``index`` reject UPDATEs of the state ConfigMap (and of a probe
    ConfigMap, to see when the policy is in force): all of them, or those that change
    ``data``, as a policy engine, a quota or a webhook outage would."""
    admin = env.sandbox.admin(index)
    ns, name = env.namespace, f"freeze-{env.namespace}"
    targets = f"['coordinator-state-{env.deployment}', '{PROBE}']"
    allowed = f"object.metadata.namespace != '{ns}' || !(object.metadata.name in {targets})"
    if data_only:
        allowed += (
            " || (has(object.data) ? (has(oldObject.data) && object.data == oldObject.data) : !has(oldObject.data))"
        )
    add_policy(admin, name, allowed, "state updates are frozen by a test policy", operations=["UPDATE"], exist_ok=False)
    _wait_for_probe(env, index, rejected=True)


def _thaw_updates(env: Any, index: int) -> None:
    remove_policy(env.sandbox.admin(index), f"freeze-{env.namespace}")
    _wait_for_probe(env, index, rejected=False)


def _wait_for_probe(env: Any, index: int, *, rejected: bool) -> None:
    """Policies take effect a moment after they are created or deleted: update the probe
    (its data, which either policy turns away) until the answer is the one expected."""
    admin = env.sandbox.admin(index)
    collection = configmaps_path(env.namespace)
    admin.create(collection, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": PROBE}})
    deadline = time.monotonic() + 60
    last = None
    while time.monotonic() < deadline:
        probe = admin.get(f"{collection}/{PROBE}")
        assert probe is not None
        probe["data"] = {"n": str(time.monotonic())}
        last = admin.request("PUT", f"{collection}/{PROBE}", probe)
        if (last.status >= 400) == rejected and last.status != 409:
            return
        time.sleep(0.2)
    pytest.fail(
        f"cluster {index}: the admission policy did not {'take' if rejected else 'stop taking'} effect "
        f"within 60 s (last answer {last and last.status}); does this kube-apiserver admit "
        "ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA since 1.30)?"
    )


# ------------------------------------------------------------------ the issue


@pytest.mark.parametrize("rejects", ["every-update", "data-only"])
def test_a_confirmed_write_is_never_contradicted(dep3: Any, rejects: str) -> None:
    """The issue's four steps. Version 1 everywhere; a write rejected by an admission
    policy on c2 and c3 (c1 takes it, or with a data-only policy c1 takes the data and
    every member the promise); the policy removed and c1 paused, a write confirmed on c2
    and c3; c1 back. Then reads, whichever cluster is paused, always return the
    confirmed write, `state diff` reports the divergence until a read repairs it, and
    `state history` shows every confirmed write."""
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "replicas=3").returncode == 0
    for i in (2, 3):
        _freeze_updates(dep3, i, data_only=rejects == "data-only")
    try:
        rejected = dep3.cli("-o", "json", "state", "set", "web", "replicas=4")
        assert rejected.returncode in (4, 6), rejected.stderr
        if rejects == "data-only":
            assert "Outcome unknown" in rejected.stderr and "reached 1 of 3" in rejected.stderr, rejected.stderr
            assert str(_envelope(dep3, 1)["data"]["replicas"]) == "4"  # the partial write is on c1
    finally:
        for i in (2, 3):
            _thaw_updates(dep3, i)
    dep3.sandbox.pause(1)
    confirmed = dep3.cli("-o", "json", "--timeout", "2s", "state", "set", "web", "replicas=5")
    assert confirmed.returncode == 0, confirmed.stderr
    assert _json(confirmed)["confirmed"] == ["c2", "c3"]
    dep3.sandbox.resume(1)

    # No read has run since c1 came back: `state diff` must show the divergence.
    rows = _diff(dep3)
    text = dep3.cli("state", "diff", "web")
    assert text.returncode == 0, text.stderr
    assert "All replicas are equal" not in text.stdout, text.stdout
    assert rows["c2"]["status"] == rows["c3"]["status"] == "current", rows
    assert rows["c1"]["status"] == "behind", rows
    assert rows["c1"]["checksum"] != rows["c2"]["checksum"], rows
    assert "behind" in text.stdout and "different data" in text.stdout, text.stdout

    # Reads hear every majority in turn; the first one hears c1's divergent replica.
    for paused in (2, 1, 3, None, 2, 1):
        if paused:
            dep3.sandbox.pause(paused)
        try:
            read = dep3.cli("--timeout", "2s", "state", "get", "web", "replicas")
            assert read.returncode == 0, read.stderr
            assert read.stdout.strip() == "5", f"with c{paused} paused, a read returned {read.stdout.strip()}"
        finally:
            if paused:
                dep3.sandbox.resume(paused)

    rows = _diff(dep3)
    assert {r["status"] for r in rows.values()} == {"current"}, rows
    assert len({(r["token"], r["version"], r.get("write_id"), r["checksum"]) for r in rows.values()}) == 1, rows
    assert "All replicas are equal." in dep3.cli("state", "diff", "web").stdout
    history = _json(dep3.cli("-o", "json", "state", "history", "web"))
    commands = [h["command"] for h in history]
    assert "state set replicas=3" in commands and "state set replicas=5" in commands, history
    assert commands.index("state set replicas=3") < commands.index("state set replicas=5")
    versions = [h["version"] for h in history]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), history


# ------------------------------------------------------------------ a replica forged by hand


def _forge(env: Any, index: int, token: int, data: dict[str, Any]) -> None:
    """Edit one replica by hand, as a person would: valid JSON, a higher token, other
    data, the checksum recomputed."""
    canon = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    obj = anyio.run(env.raw, index, "GET", _state_path(env))
    doc = json.loads(obj["data"]["envelope.json"])
    doc.update(token=token, data=data, checksum="sha256:" + hashlib.sha256(canon.encode()).hexdigest())
    obj["data"]["envelope.json"] = json.dumps(doc)
    anyio.run(env.raw, index, "PUT", _state_path(env), obj)


def test_a_forged_replica_is_evidence_not_authority(dep3: Any, tmp_path: Path) -> None:
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "owner=team-a").returncode == 0
    _forge(dep3, 2, 1000, {"owner": "mallory"})
    for _ in range(3):  # whichever majority a read hears
        got = dep3.cli("-o", "json", "state", "get", "web")
        assert got.returncode == 0, got.stderr
        assert _json(got) == {"owner": "team-a"}
    assert _envelope(dep3, 1)["data"] == _envelope(dep3, 3)["data"] == {"owner": "team-a"}  # never repaired onto
    rows = _diff(dep3)
    assert rows["c2"]["status"] == "suspect" and "1000" in rows["c2"]["detail"], rows
    assert "Suspect: c2" in dep3.cli("state", "diff", "web").stdout
    # Writers are not held up by it (the forged replica refuses them; the others confirm).
    written = dep3.cli("-o", "json", "state", "set", "web", "owner=team-b")
    assert written.returncode == 0, written.stderr
    assert _json(written)["confirmed"] == ["c1", "c3"]
    sync = dep3.cli("-o", "json", "state", "sync", "web")
    assert sync.returncode == 0, sync.stderr
    assert list(_json(sync)["suspect"]) == ["c2"] and _json(sync)["repaired"] == []
    assert _envelope(dep3, 2)["token"] == 1000

    # Deliberately: without the lock, refused; under it, overwritten, saved and audited.
    no_lock = dep3.cli("state", "sync", "web", "--from", "c1", env={"COORDINATOR_HOLDER": "nobody"})
    assert no_lock.returncode == 6, no_lock.stderr
    saved_dir = tmp_path / "saved"
    fixed = dep3.cli("-o", "json", "state", "sync", "web", "--from", "c1", "--backup-dir", str(saved_dir))
    assert fixed.returncode == 0, fixed.stderr
    assert _json(fixed)["confirmed"] == ["c1", "c2", "c3"]
    assert "mallory" in Path(_json(fixed)["saved"]["c2"]).read_text()
    rows = _diff(dep3)
    assert {r["status"] for r in rows.values()} == {"current"}, rows
    assert _envelope(dep3, 2)["data"] == {"owner": "team-b"} and _envelope(dep3, 2)["token"] < 1000
    last = _json(dep3.cli("-o", "json", "state", "history", "web"))[-1]
    assert last["command"] == "state sync --from c1" and "overwrote c2" in last["note"], last


def test_sync_from_can_adopt_the_suspect_data(dep3: Any) -> None:
    _lock(dep3)
    assert dep3.cli("state", "set", "web", "owner=team-a").returncode == 0
    _forge(dep3, 3, 77, {"owner": "restored-elsewhere"})
    adopted = dep3.cli("-o", "json", "state", "sync", "web", "--from", "c3")
    assert adopted.returncode == 0, adopted.stderr
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"owner": "restored-elsewhere"}
    assert {r["status"] for r in _diff(dep3).values()} == {"current"}
    last = _json(dep3.cli("-o", "json", "state", "history", "web"))[-1]
    assert "adopted the data of c3" in last["note"] and "suspect" in last["note"], last


# ------------------------------------------------------------------ values and files


def test_values_are_kept_as_typed(dep3: Any) -> None:
    _lock(dep3)
    proc = dep3.cli(
        "state", "set", "web", "app.version=1.10", "region=NO", "mode=0755", "at=12:30", "mask=0x1F",
        "day=2026-01-01", "replicas:=3", "ratio:=1.10", "canary:=true", "tags:=[\"a\", \"b\"]",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Stored ratio as 1.1 (typed 1.10)." in proc.stdout, proc.stdout
    assert "Stored replicas" not in proc.stdout and "app.version" not in proc.stdout, proc.stdout
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {
        "app": {"version": "1.10"},
        "region": "NO",
        "mode": "0755",
        "at": "12:30",
        "mask": "0x1F",
        "day": "2026-01-01",
        "replicas": 3,
        "ratio": 1.1,
        "canary": True,
        "tags": ["a", "b"],
    }
    assert dep3.cli("state", "get", "web", "app.version").stdout.strip() == "1.10"
    bad = dep3.cli("state", "set", "web", "replicas:=three")
    assert bad.returncode == 2 and "not a JSON value" in bad.stderr, bad.stderr


def test_apply_refuses_keys_yaml_does_not_read_as_text(dep3: Any, tmp_path: Path) -> None:
    _lock(dep3)
    doc = tmp_path / "s.yaml"
    doc.write_text("name: web\non: push\n")
    proc = dep3.cli("state", "apply", "web", "-f", str(doc))
    assert proc.returncode == 2, proc.stderr
    assert "Internal error" not in proc.stderr and "'on'" in proc.stderr and "quote it" in proc.stderr, proc.stderr
    doc.write_text("name: web\n1: one\n")
    proc = dep3.cli("state", "apply", "web", "-f", str(doc))
    assert proc.returncode == 2 and "the number 1" in proc.stderr, proc.stderr
    doc.write_text("name: web\n'on': push\n'1': one\n")
    assert dep3.cli("state", "apply", "web", "-f", str(doc)).returncode == 0
    assert _json(dep3.cli("-o", "json", "state", "get", "web")) == {"name": "web", "on": "push", "1": "one"}


BOMB = "\n".join(
    [f"a: &a [{','.join(['lol'] * 9)}]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
)


def test_an_alias_bomb_is_refused_fast_and_only_after_the_lock(dep3: Any, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    assert len(BOMB) < 400
    unlocked = dep3.cli("state", "apply", "web", "-f", str(bomb))
    assert unlocked.returncode == 6 and "no lock is held" in unlocked.stderr, unlocked.stderr
    _lock(dep3)
    begun = time.monotonic()
    locked = dep3.cli("state", "apply", "web", "-f", str(bomb))
    assert locked.returncode == 2, locked.stderr
    assert "expands to more than" in locked.stderr and "Nothing was written" in locked.stderr, locked.stderr
    assert time.monotonic() - begun < 15  # the whole command; parsing the bomb once took 10 s and 1.15 GB
    assert all(r["status"] == "empty" for r in _diff(dep3).values())


def test_sync_never_rolls_back_a_corrupt_replica_that_promised_a_newer_write(dep3: Any) -> None:
    """Found by trying to break it: version 2 confirmed on c1 and c2, c2 then edited by hand
    (its checksum no longer matches, its promise still names version 2), c1 paused. The
    newest readable replica is c3's version 1; syncing it over c2 would roll the confirmed
    write back. Sync refuses (a corrupt replica counts as unanswered, and one replica that
    decodes is no majority) and writes nothing."""
    lock_id = _lock(dep3)
    assert dep3.cli("state", "set", "web", "replicas:=1", "--lock-id", lock_id).returncode == 0
    dep3.sandbox.pause(3)
    two = dep3.cli("--timeout", "2s", "state", "set", "web", "replicas:=2", "--lock-id", lock_id)
    assert two.returncode == 0, two.stderr
    dep3.sandbox.resume(3)
    obj = anyio.run(dep3.raw, 2, "GET", _state_path(dep3))
    doc = json.loads(obj["data"]["envelope.json"])
    doc["data"] = {"replicas": 99}  # the checksum no longer matches: corrupt
    obj["data"]["envelope.json"] = json.dumps(doc)
    anyio.run(dep3.raw, 2, "PUT", _state_path(dep3), obj)
    before = anyio.run(dep3.raw, 2, "GET", _state_path(dep3))["metadata"]["resourceVersion"]
    dep3.sandbox.pause(1)
    synced = dep3.cli("--timeout", "2s", "state", "sync", "web")
    assert synced.returncode == 4, synced.stdout + synced.stderr
    assert "a corrupt replica counts as unanswered" in synced.stderr
    assert anyio.run(dep3.raw, 2, "GET", _state_path(dep3))["metadata"]["resourceVersion"] == before
    dep3.sandbox.resume(1)
    assert dep3.cli("state", "get", "web", "replicas").stdout.strip() == "2"
