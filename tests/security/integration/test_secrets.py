"""No credential from the kubeconfig ever reaches the output: not at -vv, not on errors.

Every command runs at ``-vv`` (console and JSON logs) through the bearer-token contexts
(``sandbox-N-token``) and through the client-certificate contexts (``sandbox-N``), on the
happy path and on failures (held lock, paused API server, rejected credentials); stdout
and stderr are searched for the token, the client key (its base64 and its PEM lines), a
password, and the Authorization headers they would make.
"""

from __future__ import annotations

import base64
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from coord_fixtures import Env

pytestmark = pytest.mark.integration

PASSWORD_USER = "basic-auth-user"


def _kubeconfig_with_bad_credentials(sandbox: Any, path: Path) -> dict[str, str]:
    """The sandbox kubeconfig plus two contexts the API server rejects (401): a password
    and a wrong bearer token. Returns those two secrets."""
    doc = yaml.safe_load(sandbox.kubeconfig.read_text())
    cluster = doc["contexts"][0]["context"]["cluster"]
    password = "pw-" + secrets.token_urlsafe(18)
    wrong_token = "tok-" + secrets.token_urlsafe(24)
    doc["users"] += [
        {"name": PASSWORD_USER, "user": {"username": "admin", "password": password}},
        {"name": "wrong-token-user", "user": {"token": wrong_token}},
    ]
    doc["contexts"] += [
        {"name": "password", "context": {"cluster": cluster, "user": PASSWORD_USER}},
        {"name": "wrong-token", "context": {"cluster": cluster, "user": "wrong-token-user"}},
    ]
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return {"password": password, "wrong token": wrong_token}


def _secrets_in(kubeconfig: Path, extra: dict[str, str]) -> dict[str, str]:
    """Every credential in the kubeconfig, in the forms it could leak in."""
    doc = yaml.safe_load(kubeconfig.read_text())
    found = dict(extra)
    for user in doc["users"]:
        name, fields = user["name"], user["user"]
        if fields.get("token"):
            found[f"{name} token"] = fields["token"]
            found[f"{name} bearer header"] = f"Bearer {fields['token']}"
        if fields.get("password"):
            found[f"{name} password"] = fields["password"]
            basic = base64.b64encode(f"{fields['username']}:{fields['password']}".encode()).decode()
            found[f"{name} basic header"] = basic
        if fields.get("client-key-data"):
            found[f"{name} client key data"] = fields["client-key-data"]
            pem = base64.b64decode(fields["client-key-data"]).decode()
            for n, line in enumerate(pem.splitlines()):
                if line and not line.startswith("-----"):
                    found[f"{name} client key line {n}"] = line
    assert any("token" in k for k in found) and any("client key" in k for k in found)
    return found


class Recorder:
    """Runs commands and keeps everything they printed."""

    def __init__(self, env: Env, kubeconfig: Path) -> None:
        self.env = env
        self.kubeconfig = kubeconfig
        self.runs: list[tuple[str, subprocess.CompletedProcess[str]]] = []

    def __call__(self, *args: str, code: int | None = 0, json_logs: bool = False) -> subprocess.CompletedProcess[str]:
        argv = ["-vv", *(["--log-format", "json"] if json_logs else []), *args]
        proc = self.env.cli(*argv, env={"KUBECONFIG": str(self.kubeconfig)}, timeout=180)
        self.runs.append((" ".join(argv), proc))
        if code is not None:
            assert proc.returncode == code, f"`coordinator {' '.join(argv)}` exited {proc.returncode}: {proc.stderr}"
        return proc

    def leaks(self, found: dict[str, str]) -> list[str]:
        problems = []
        for command, proc in self.runs:
            for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                for what, secret in found.items():
                    if secret in text:
                        problems.append(f"{what} in the {stream} of `coordinator {command}`")
                if "PRIVATE KEY" in text:
                    problems.append(f"a private key in the {stream} of `coordinator {command}`")
        return problems


def _every_command(run: Recorder, sandbox: Any, contexts: list[str], tmp_path: Path) -> None:
    env, kc = run.env, str(run.kubeconfig)
    for i, context in enumerate(contexts, start=1):
        run("cluster", "connect", f"x{i}", "--context", context, "--kubeconfig", kc)
    run("cluster", "list")
    run("-o", "json", "cluster", "list")
    run("cluster", "info", "x1", "--namespace", env.namespace)
    run("-o", "yaml", "cluster", "info", "x2")
    members = [a for i in range(1, len(contexts) + 1) for a in ("--cluster", f"x{i}")]
    run("deployment", "create", "web", "-n", env.namespace, *members)
    run("deployment", "list")
    run("deployment", "show", "web", json_logs=True)
    run("lock", "acquire", "web", "--ttl", "90s", "--reason", "secrets test")
    run("lock", "acquire", "web", "--holder", "someone-else", code=3)
    run("lock", "status", "web")
    run("-o", "json", "lock", "status", "web", json_logs=True)
    run("lock", "renew", "web")
    run("state", "set", "web", "replicas=3", "app.version=1.2.0")
    run("state", "get", "web")
    run("-o", "json", "state", "get", "web", "app.version", json_logs=True)
    document = tmp_path / "state.yaml"
    document.write_text("replicas: 4\n")
    run("state", "apply", "web", "-f", str(document))
    run("state", "diff", "web")
    run("state", "sync", "web")
    run("state", "history", "web")
    backup = tmp_path / "backup.json"
    run("state", "backup", "web", "-f", str(backup))
    run("state", "restore", "web", "-f", str(backup))
    run("lock", "release", "web")
    run("lock", "run", "web", "--", "true")
    run("lock", "acquire", "web", "--ttl", "60s", "--wait", "3s")
    run("lock", "break", "web", "--yes", json_logs=True)
    run("rbac", "print", "--namespace", env.namespace, "--deployment", "web", "--user", "someone@example.com")
    run("sandbox", "status", "--dir", str(sandbox.dir))
    # Failures: an API server that does not answer, a cluster that is not connected.
    sandbox.pause(2)
    try:
        run("--timeout", "1s", "lock", "status", "web", code=None)
        run("--timeout", "1s", "lock", "acquire", "web", "--ttl", "30s", code=None)
        run("--timeout", "1s", "state", "get", "web", code=None)
        run("--timeout", "1s", "cluster", "info", "x2", code=None, json_logs=True)
    finally:
        sandbox.resume(2)
    run("lock", "break", "web", "--yes")  # the acquire above may well have won on two clusters
    run("lock", "status", "nosuch", code=2)
    # Rebuild the local record from the clusters, then purge everything.
    run("deployment", "delete", "web")
    run("deployment", "import", "web", "--cluster", "x1", "--namespace", env.namespace)
    run("deployment", "delete", "web", "--purge", "--yes")
    run("cluster", "disconnect", "x3")


@pytest.mark.parametrize("kind", ["token", "client-certificate"])
def test_no_credential_in_any_output(sandbox3: Any, namespace: str, tmp_path: Path, kind: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    bad = _kubeconfig_with_bad_credentials(sandbox3, kubeconfig)
    found = _secrets_in(kubeconfig, bad)
    assert found["sandbox-token-admin token"] == sandbox3.token
    env = Env(sandbox=sandbox3, config=tmp_path / "cfg" / "config.yaml", namespace=namespace)
    run = Recorder(env, kubeconfig)
    contexts = sandbox3.token_contexts if kind == "token" else sandbox3.contexts

    _every_command(run, sandbox3, contexts, tmp_path)
    # Credentials the server rejects: the refusal is reported, the credential is not.
    for context in ("password", "wrong-token"):
        refused = run(
            "cluster", "connect", f"r-{context}", "--context", context, "--kubeconfig", str(kubeconfig), code=2
        )
        assert "401" in refused.stderr or "forbid" in refused.stderr.lower(), refused.stderr

    assert len(run.runs) > 40
    assert run.leaks(found) == []
