"""Run at start-up by a command whose PYTHONPATH begins with this folder
(``helpers.members.KILL_AFTER_JOINT``): the command SIGKILLs itself right after a member
change stored its joint set on the leases (and made the namespace and state objects on
joining members), before the change raises the token floor, copies the state and commits.
That is the moment an interrupted change is most often left in, and the tests of
finishing one start from it."""

from __future__ import annotations

import os
import signal
from typing import Any


def _install() -> None:
    from coordinator.engine.lock.engine import LockEngine

    raise_floor = LockEngine.raise_token_floor

    async def raise_token_floor(self: LockEngine, token: int, lock_id: str, *, payload: Any = None) -> None:
        # The change's own floor raise names no acquisition result (an acquisition's does),
        # and is made by the joint configuration's engine.
        if payload is None and self.dep.joint is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        await raise_floor(self, token, lock_id, payload=payload)

    LockEngine.raise_token_floor = raise_token_floor  # type: ignore[method-assign]


_install()
