"""What a read-only command imports at start-up (B4'), and the plain read of the local
config that lets it do without pydantic.

Which modules load is checked, not how long they take: a fresh interpreter goes the way
``coordinator lock status DEP`` goes (the CLI, the lock group, the config read, the
Coordinator and the read side of the lock engine) and reports ``sys.modules``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.config.models import ClusterModel, ConfigModel, DeploymentModel, config_of
from coordinator.config.records import ClusterRecord, DeploymentRecord, LocalConfig, from_document
from coordinator.config.store import ConfigStore

ROOT = Path(__file__).resolve().parents[3]

# Never imported by `lock status DEP`: pydantic (the config is read plainly), rich (not a
# dependency: whoever has it installed must not pay for it), structlog (only when something is logged), filelock (only
# commands that write the config), the lock engine's write side (the engine makes its parts on first
# use), the history, the state.
NOT_FOR_STATUS = (
    "pydantic",
    "pydantic_core",
    "rich",
    "structlog",
    "filelock",
    "coordinator.config.models",
    "coordinator.engine.history",
    "coordinator.engine.cas",
    "coordinator.engine.lock.acquire",
    "coordinator.engine.lock.turns",
    "coordinator.engine.lock.renew",
    "coordinator.engine.lock.release",
    "coordinator.engine.lock.floor",
    "coordinator.engine.state",
    "coordinator.engine.register",
    "coordinator_sandbox",
)

_STATUS_PATH = """
import json, sys
from coordinator.cli import main
try:
    main(["lock", "status", "--help"])
except SystemExit:
    pass
from coordinator.ops.api import Coordinator
from coordinator.config.store import ConfigStore
import coordinator.cli.lock, coordinator.engine.lock.status, coordinator.ops.verdicts

cfg = ConfigStore(sys.argv[1]).load()
assert type(cfg).__module__ == "coordinator.config.records", type(cfg)
assert cfg.deployments["payments"].quorum == 2
c = Coordinator(cfg, store=None)
engine = c.lock_engine("payments")
engine._status  # the part `lock status` uses, made as it makes it
print(json.dumps(sorted(sys.modules)))
"""


def _writer_config(tmp_path: Path) -> Path:
    """A config file as `cluster connect` and `deployment create` write it."""
    path = tmp_path / "config.yaml"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": n, "cluster": {"server": f"https://127.0.0.1:{6440 + i}"}} for i, n in enumerate("ab")
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": f"ctx-{n}", "context": {"cluster": n, "user": "u"}} for n in "ab"],
            }
        )
    )
    with ConfigStore(path).edit() as cfg:
        for n in "ab":
            cfg.clusters[n] = ClusterRecord(
                name=n,
                context=f"ctx-{n}",
                kubeconfig=str(kubeconfig),
                server="https://127.0.0.1:6443",
                identity=f"uid-{n}",
                identity_source="kube-system-uid",
            )
        cfg.deployments["payments"] = DeploymentRecord(name="payments", namespace="pay", clusters=["a", "b"])
    return path


def test_lock_status_path_imports_no_pydantic_rich_or_write_side(tmp_path: Path) -> None:
    path = _writer_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", _STATUS_PATH, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    loaded = set(json.loads(out.splitlines()[-1]))
    assert "coordinator.engine.lock.status" in loaded  # the path was walked
    wrong = sorted(m for m in loaded if any(m == bad or m.startswith(bad + ".") for bad in NOT_FOR_STATUS))
    assert not wrong, f"imported by `lock status`: {wrong}"


def test_plain_read_matches_pydantic_on_what_the_writer_writes(tmp_path: Path) -> None:
    path = _writer_config(tmp_path)
    raw = yaml.safe_load(path.read_text())
    plain = from_document(raw)
    assert plain is not None, "the plain read must vouch for a file the writer wrote"
    assert plain == config_of(ConfigModel.model_validate(raw))
    # and writing it back changes nothing
    with ConfigStore(path).edit():
        pass
    assert yaml.safe_load(path.read_text()) == raw


def _valid() -> dict[str, Any]:
    return {
        "version": 1,
        "clusters": {
            "a": {
                "name": "a",
                "context": "ctx",
                "identity": "i",
                "identity_source": "kube-system-uid",
                "connected_at": "2026-12-01T10:00:00.5Z",
            }
        },
        "deployments": {
            "d": {
                "name": "d",
                "namespace": "ns",
                "clusters": ["a"],
                "max_ttl_s": 60,
                "epoch": 2,
                "created_at": datetime(2026, 12, 1, tzinfo=UTC),
            }
        },
    }


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    doc = _valid()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("version",), 2),
        (("version",), True),
        (("extra",), 1),
        (("clusters",), None),
        (("clusters", "a", "name"), "A_B"),
        (("clusters", "a", "name"), 7),
        (("clusters", "a", "identity_source"), "guess"),
        (("clusters", "a", "connected_at"), "yesterday"),
        (("clusters", "a", "connected_at"), "2026-13-01T10:00:00Z"),
        (("clusters", "a", "extra"), 1),
        (("clusters", "a", "context"), _DELETE),
        (("deployments", "d", "clusters"), []),
        (("deployments", "d", "clusters"), ["a", "a"]),
        (("deployments", "d", "clusters"), "a"),
        (("deployments", "d", "namespace"), "-ns"),
        (("deployments", "d", "name"), "x" * 50),
        (("deployments", "d", "max_ttl_s"), 0.5),
        (("deployments", "d", "max_ttl_s"), "60"),
        (("deployments", "d", "max_ttl_s"), float("inf")),
        (("deployments", "d", "max_ttl_s"), True),
        pytest.param(("deployments", "d", "max_ttl_s"), 10**400, id="max_ttl_s-beyond-float"),
        (("deployments", "d", "epoch"), 0),
        (("deployments", "d", "epoch"), 2.0),
        (("deployments", "d", "storage"), "disk"),
        (("deployments", "d", "joint"), ["a", 1]),
    ],
)
def test_plain_read_leaves_to_pydantic_what_it_cannot_vouch_for(path: tuple[str, ...], value: Any) -> None:
    doc = _with(path, value)
    if value is _DELETE:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    assert from_document(doc) is None


def test_plain_read_of_a_valid_document_is_what_pydantic_makes_of_it() -> None:
    doc = _valid()
    plain = from_document(doc)
    assert plain is not None
    assert plain == config_of(ConfigModel.model_validate(doc))
    assert isinstance(plain.deployments["d"].max_ttl_s, float)


@pytest.mark.parametrize(
    ("record", "model"),
    [(ClusterRecord, ClusterModel), (DeploymentRecord, DeploymentModel), (LocalConfig, ConfigModel)],
)
def test_records_and_models_name_the_same_fields_with_the_same_defaults(record: Any, model: Any) -> None:
    fields = {f.name: f for f in dataclasses.fields(record)}
    assert list(fields) == list(model.model_fields)
    for name, f in fields.items():
        info = model.model_fields[name]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert required == info.is_required(), name
        if f.default is not dataclasses.MISSING:
            assert f.default == info.default, name
        if f.default_factory is not dataclasses.MISSING:
            assert f.default_factory is info.default_factory, name
