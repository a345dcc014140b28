"""Bearer tokens that change while a command runs: a pod's ServiceAccount token file, which
the kubelet replaces, and the token of a kubeconfig's exec plugin (a cloud provider's
`get-token`: an EKS token lives 15 minutes), which is got again.

Each is installed as the ``Configuration``'s ``refresh_api_key_hook``, which
``auth_settings()`` runs before every request, and under ``CREDENTIAL_ATTRIBUTE``, where
the transport finds it when the server answers 401: the token was revoked or has
expired, and one more request with a fresh token is worth sending (the server did nothing
with a request it did not authenticate). So a `lock run` holds its lock through a
rotation: its renewals carry the new token as soon as the old one is refused.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

CREDENTIAL_ATTRIBUTE = "coordinator_credential"

# A token the server refused is got again only if it is older than this: a fresh token
# refused too (a user with no rights anywhere, a plugin that keeps printing the revoked
# token) is the answer, not a reason to run the plugin before every request.
REFUSED_AGAIN_AFTER_S = 5.0
# An exec plugin's token is got again this long before the expirationTimestamp it gave,
# so that a renewal does not wait for the plugin right when its token runs out.
EXPIRY_MARGIN_S = 30.0


class Credential(Protocol):
    def refused(self) -> bool:
        """The server refused the current token (401): true when a request sent again
        will carry another one."""
        ...


def refused(cfg: Any) -> bool:
    """Tell ``cfg``'s changing credential, if it has one, that its token was refused; true
    when the request is worth sending once more."""
    credential: Credential | None = getattr(cfg, CREDENTIAL_ATTRIBUTE, None)
    return credential is not None and credential.refused()


class TokenFile:
    """A ServiceAccount token file, read again when it changes (the kubelet replaces a
    projected token well before it expires) or when its token was refused."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int, int] | None = None
        self._read_at = 0.0
        self.token = ""

    def refresh(self, cfg: Any) -> None:
        try:
            st = self.path.stat()  # follows the kubelet's ..data symlink
            seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                token = self.path.read_text(encoding="utf-8").strip()
                if token:
                    self.token, self._seen, self._read_at = token, seen, time.monotonic()
        except (OSError, UnicodeDecodeError):
            pass  # mid-rotation: the last token read is still the best one
        if self.token:
            cfg.api_key["BearerToken"] = f"Bearer {self.token}"

    def refused(self) -> bool:
        if time.monotonic() - self._read_at < REFUSED_AGAIN_AFTER_S:
            return False
        self._seen = None  # read the file again, whatever its stamps say
        return True


class ExecToken:
    """The bearer token of a kubeconfig user's exec plugin, got again by running the
    plugin when the server refused it, or when the expirationTimestamp the plugin gave
    with it on such a run is near. (The client library runs the plugin once, when the
    kubeconfig is loaded, and keeps that token's expiry to itself: the first token is
    got again on its first 401.) A plugin that fails then leaves the token it gave before
    in use, and is not run again for ``REFUSED_AGAIN_AFTER_S``; the requests say what the
    server thinks of that token."""

    def __init__(self, exec_config: Any) -> None:
        self.exec_config = exec_config  # the user's ``exec`` entry, as the loader reads it
        self._stale = False
        self._expires: float | None = None  # wall clock, from the plugin's expirationTimestamp
        self._got_at = time.monotonic()
        self._lock: Any = None
        self.runs = 0

    def _due(self) -> bool:
        if self._stale:
            return True
        return self._expires is not None and time.time() >= self._expires - EXPIRY_MARGIN_S

    def refused(self) -> bool:
        if time.monotonic() - self._got_at < REFUSED_AGAIN_AFTER_S:
            return False
        self._stale = True
        return True

    async def refresh(self, cfg: Any) -> None:
        if not self._due():
            return
        import anyio

        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if not self._due():  # another request got it meanwhile
                return
            await self._run(cfg)

    async def _run(self, cfg: Any) -> None:
        from kubernetes_asyncio.config.exec_provider import ExecProvider

        from coordinator.logs import get_logger

        self._stale, self._got_at = False, time.monotonic()
        self.runs += 1
        try:
            status = await ExecProvider(self.exec_config).run()
        except Exception as err:  # the plugin failed or printed nonsense: keep the token in use
            get_logger(__name__).warning("exec plugin failed; the token it gave before stays in use", error=str(err))
            self._expires = None
            return
        token = status.get("token") if isinstance(status, dict) else None
        if not isinstance(token, str) or not token.strip():
            get_logger(__name__).warning("exec plugin gave no token; the token it gave before stays in use")
            return
        cfg.api_key["BearerToken"] = f"Bearer {token.strip()}"
        self._expires = _expiry(status.get("expirationTimestamp"))


def _expiry(stamp: Any) -> float | None:
    """An RFC 3339 time as a wall-clock timestamp; None for anything else."""
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()
