"""An exec plugin's token is got again when the server refused it or it is about to expire,
and a plugin that fails leaves the token it gave before in use (kube/credentials.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.kube_config import ConfigNode

from coordinator.kube.credentials import CREDENTIAL_ATTRIBUTE, REFUSED_AGAIN_AFTER_S, ExecToken, refused

PLUGIN = """\
import datetime, json, sys
from pathlib import Path
state = Path(sys.argv[1])
n = int(state.read_text() or 0) + 1
state.write_text(str(n))
if Path(sys.argv[2]).exists():
    sys.exit("the identity provider is down")
expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(sys.argv[3]))
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": f"token-{n}", "expirationTimestamp": expiry.isoformat()}}))
"""


def _setup(tmp_path: Path, lifetime_s: float) -> tuple[ExecToken, Any, Path, Path]:
    script, state, broken = tmp_path / "plugin.py", tmp_path / "runs", tmp_path / "broken"
    script.write_text(PLUGIN)
    state.write_text("0")
    node = ConfigNode(
        "exec",
        {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script), str(state), str(broken), str(lifetime_s)],
        },
    )
    token = ExecToken(node)
    cfg = Configuration()
    cfg.api_key["BearerToken"] = "Bearer token-0"  # what the loader got when it loaded
    cfg.refresh_api_key_hook = token.refresh
    setattr(cfg, CREDENTIAL_ATTRIBUTE, token)
    return token, cfg, state, broken


async def _sent_with(cfg: Any) -> str:
    return str((await cfg.auth_settings())["BearerToken"]["value"])


def test_a_refused_token_is_got_again_once_and_a_fresh_one_refused_is_the_answer(tmp_path: Path) -> None:
    token, cfg, state, _ = _setup(tmp_path, 3600)

    async def go() -> None:
        assert await _sent_with(cfg) == "Bearer token-0"  # nothing to get: no run
        assert not refused(cfg)  # just loaded: a refusal of a fresh token is the answer
        token._got_at = time.monotonic() - REFUSED_AGAIN_AFTER_S - 1
        assert refused(cfg)
        assert await _sent_with(cfg) == "Bearer token-1"
        assert await _sent_with(cfg) == "Bearer token-1"  # far from its expiry: kept
        assert not refused(cfg)

    anyio.run(go)
    assert state.read_text() == "1"


def test_a_token_near_its_expiry_is_got_again_before_the_request(tmp_path: Path) -> None:
    token, cfg, state, _ = _setup(tmp_path, 10)  # inside the margin as soon as it is given

    async def go() -> None:
        token._got_at = time.monotonic() - REFUSED_AGAIN_AFTER_S - 1
        assert refused(cfg)
        assert await _sent_with(cfg) == "Bearer token-1"
        assert await _sent_with(cfg) == "Bearer token-2"

    anyio.run(go)
    assert state.read_text() == "2"


def test_a_plugin_that_fails_leaves_the_token_it_gave_before(tmp_path: Path) -> None:
    token, cfg, state, broken = _setup(tmp_path, 3600)
    broken.touch()

    async def go() -> None:
        token._got_at = time.monotonic() - REFUSED_AGAIN_AFTER_S - 1
        assert refused(cfg)
        assert await _sent_with(cfg) == "Bearer token-0"
        assert await _sent_with(cfg) == "Bearer token-0"  # not run again at once
        assert not refused(cfg)

    anyio.run(go)
    assert state.read_text() == "1"


def test_a_configuration_without_a_changing_credential_is_never_sent_again() -> None:
    assert not refused(Configuration())
