"""The sandbox's etcd is open to its own API servers only, not to every local user."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

integration = pytest.mark.integration


# Broke before: every sandbox etcd served plain HTTP to anyone on the machine (curl .../v3/kv/range).
@integration
def test_the_sandbox_etcd_is_not_open_to_every_local_user(sandbox3: Any) -> None:
    """Plain HTTP, TLS without a client certificate, and TLS with a user's certificate of
    the clusters' CA (the restricted user's, which RBAC confines): etcd lists nothing to
    any of them. Its own CA's client, the kube-apiserver, is the only way in."""
    import ssl

    port = sandbox3.record.clusters[0].etcd_client_port
    pki = sandbox3.dir / "pki"
    key = "L3JlZ2lzdHJ5L2NvbmZpZ21hcHMv"  # base64 of /registry/configmaps/
    end = "L3JlZ2lzdHJ5L2NvbmZpZ21hcHMw"  # ... up to /registry/configmaps0
    body = json.dumps({"key": key, "range_end": end, "keys_only": True}).encode()

    def bare() -> ssl.SSLContext:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context

    as_user = bare()
    as_user.load_cert_chain(pki / "restricted.crt", pki / "restricted.key")
    attempts: list[tuple[str, ssl.SSLContext | None]] = [
        ("http", None),
        ("https", bare()),
        ("https", as_user),
    ]
    for scheme, context in attempts:
        request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/v3/kv/range", data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as resp:
                answer = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            continue  # refused: safe
        assert not answer.get("kvs"), f"{scheme}: {answer.get('count')} ConfigMaps listed by another local user"
    # ...while the clusters themselves work (the kube-apiserver is etcd's client).
    assert sandbox3.admin(1).get("/api/v1/namespaces/default") is not None
