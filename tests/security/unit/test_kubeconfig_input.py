"""Kubeconfigs given to the tool by whoever writes them (a shared or merged KUBECONFIG, a
typo): credentials never printed, context names and server URLs cannot forge a line of
an error, tokens with odd endings or control characters are handled or refused.

Found in the fourth security adversary round (docs/regressions.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import run_cli
from helpers.hostile import FORGED, TITLE, Hostile, clean, no_crash

integration = pytest.mark.integration
SECRETS = ("SECRET-TOKEN", "SECRET-CS", "SECRET-RT", "U0VDUkVULUtFWQ")  # the last: base64 of a "key"


def _kubeconfig(tmp_path: Path, name: str, *, server: str, users: Any, contexts: Any = None) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "p", "cluster": {"server": server}}],
        "users": users,
        "contexts": contexts or [{"name": "p", "context": {"cluster": "p", "user": "u"}}],
        "current-context": "p",
    }
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(json.dumps(doc))
    return path


# ================================================================== pure: kubeconfigs
#
# A kubeconfig is a file given to the tool; it holds credentials, and its names may come
# from someone else (a kubeconfig merged from several files, a cloud CLI's entries).

BROKEN_USERS = {
    # A token one level too high: the commonest kubeconfig typo.
    "misindented token": [{"name": "u", "token": "SECRET-TOKEN-1"}],
    # An OIDC auth-provider without client-id: its client secret and refresh token.
    "oidc without client-id": [
        {
            "name": "u",
            "user": {
                "client-key-data": "U0VDUkVULUtFWQ==",
                "auth-provider": {
                    "name": "oidc",
                    "config": {"client-secret": "SECRET-CS", "refresh-token": "SECRET-RT"},
                },
            },
        }
    ],
    # An exec plugin whose env entry lacks a name, next to a token.
    "exec env without a name": [
        {
            "name": "u",
            "user": {
                "token": "SECRET-TOKEN-2",
                "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "true", "env": [{"value": "x"}]},
            },
        }
    ],
}


# Broke before: a broken user entry was quoted whole, credentials included (node names were the entry's dict).
@pytest.mark.parametrize("case", sorted(BROKEN_USERS))
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_broken_kubeconfig_entry_never_prints_its_credentials(tmp_path: Path, case: str, fmt: str) -> None:
    kubeconfig = _kubeconfig(tmp_path, "k", server="https://127.0.0.1:1", users=BROKEN_USERS[case])
    for verbosity in ([], ["-vv"]):
        proc = run_cli(tmp_path, *verbosity, "-o", fmt, "--timeout", "2s", "cluster", "connect", "p",
                    "--context", "p", "--kubeconfig", str(kubeconfig))  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        out = proc.stdout + proc.stderr
        assert not [s for s in SECRETS if s in out], out[-800:]


# Broke before: `--context nope` listed every context name raw, line breaks kept.
def test_kubeconfig_context_names_cannot_forge_a_line_of_the_error(tmp_path: Path) -> None:
    contexts = [
        {"name": "p", "context": {"cluster": "p", "user": "u"}},
        {"name": f"evil\n{FORGED}{TITLE}", "context": {"cluster": "p", "user": "u"}},
    ]
    kubeconfig = _kubeconfig(
        tmp_path, "k", server="https://127.0.0.1:1", users=[{"name": "u", "user": {}}], contexts=contexts
    )
    proc = run_cli(tmp_path, "cluster", "connect", "p", "--context", "nope", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2, proc.stderr
    clean(proc.stdout + proc.stderr)


# Broke before: the unreachable error quoted the server URL raw, a forged line in every error.
def test_a_kubeconfig_server_url_cannot_forge_a_line_of_the_error(tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path, "k", server=f"https://127.0.0.1:1/\n{FORGED}", users=[{"name": "u", "user": {}}])
    proc = run_cli(
        tmp_path, "--timeout", "2s", "cluster", "connect", "p", "--context", "p", "--kubeconfig", str(kubeconfig)
    )
    no_crash(proc)
    clean(proc.stdout + proc.stderr)


# Broke before: a token file ending in CRLF made every command an internal error (ValueError in headers).
def test_a_token_file_ending_in_crlf_is_no_internal_error(tmp_path: Path) -> None:
    """The token is sent trimmed, as kubectl sends it: the connect works, and every
    request the stand-in API server got carried exactly `Bearer SECRET-TOKEN-3`."""
    hostile = Hostile(tmp_path)
    body = {"metadata": {"uid": "0c7d3f9e-round4"}, "gitVersion": "v1.34.0"}
    hostile.answer = (200, {}, json.dumps(body).encode())
    try:
        token = tmp_path / "token"
        token.write_bytes(b"SECRET-TOKEN-3\r\n")
        server = hostile.kubeconfig.read_text().split('server: "')[1].split('"')[0]
        kubeconfig = _kubeconfig(tmp_path, "k", server=server, users=[{"name": "u", "user": {"tokenFile": str(token)}}])
        for n, verbosity in enumerate(([], ["-vv"])):
            config = {"COORDINATOR_CONFIG": str(tmp_path / f"cfg{n}" / "config.yaml")}
            proc = run_cli(tmp_path, *verbosity, "--timeout", "3s", "cluster", "connect", "p", "--context", "p",
                        "--kubeconfig", str(kubeconfig), env=config)  # fmt: skip
            assert "SECRET-TOKEN" not in proc.stdout + proc.stderr
            no_crash(proc)
            assert proc.returncode == 0, proc.stderr
        assert hostile.authorizations == {"Bearer SECRET-TOKEN-3"}, hostile.authorizations
    finally:
        hostile.close()


@pytest.mark.parametrize("token", [b"SECRET-TOKEN-4\nX-Forged: 1\n", b"SECRET\x00TOKEN-5"])
def test_a_token_with_a_control_character_inside_is_a_usage_error(tmp_path: Path, token: bytes) -> None:
    path = tmp_path / "token"
    path.write_bytes(token)
    kubeconfig = _kubeconfig(
        tmp_path, "k", server="https://127.0.0.1:1", users=[{"name": "u", "user": {"tokenFile": str(path)}}]
    )
    proc = run_cli(tmp_path, "cluster", "connect", "p", "--context", "p", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2, proc.stderr
    assert "control character" in proc.stderr and "SECRET" not in proc.stderr, proc.stderr


# ================================================================== pure: rbac print


# ================================================================== pure: the lock's history


# ================================================================== pure: the sandbox's files


# ================================================================== live: a namespace writer under `coordinator`


# ================================================================== live: hostile text in errors and prompts


# ================================================================== live: the lock's history


# ================================================================== live: deep state


# ================================================================== live: least privilege


# ================================================================== live: files


# ================================================================== live: the sandbox
