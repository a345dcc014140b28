"""``lock run``: hold the lock around a child process.

The child runs in its own process group with the lock's id, fencing token and
deployment in its environment. The lock is renewed in the background; SIGINT and
SIGTERM sent to us are forwarded to the child. If the lock is lost, the child gets
SIGTERM and, after a grace period, SIGKILL, and we exit 7. The lock is released on
every exit path.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import anyio

from coordinator.errors import CoordinatorError, ExitCode, UsageError
from coordinator.logs import get_logger

log = get_logger(__name__)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_locked(
    app: Any,
    deployment: str,
    command: list[str],
    *,
    ttl_s: float,
    wait_s: float,
    reason: str,
    holder: str | None,
    grace_s: float,
) -> int:
    from coordinator.api import Coordinator
    from coordinator.lock import keep_renewed

    if not command:
        raise UsageError("lock run needs a command after `--`, e.g. `coordinator lock run dep -- ./deploy.sh`.")

    async def main() -> int:
        c = Coordinator.from_config(app.config_path, timeout=app.timeout)
        async with c:
            result = await c.acquire(
                deployment, ttl=ttl_s, wait=wait_s, reason=reason or " ".join(command)[:120], holder=holder
            )
            sys.stderr.write(
                f"coordinator: locked {deployment} (lock {result.lock_id}, token {result.fencing_token}); "
                f"running {' '.join(command)}\n"
            )
            sys.stderr.flush()
            env = dict(os.environ)
            env.update(
                {
                    "COORDINATOR_LOCK_ID": result.lock_id,
                    "COORDINATOR_FENCING_TOKEN": str(result.fencing_token),
                    "COORDINATOR_DEPLOYMENT": deployment,
                }
            )
            engine = c.lock_engine(deployment)
            lost_reason: list[str] = []
            try:
                try:
                    proc = await anyio.open_process(
                        command, stdin=None, stdout=None, stderr=None, env=env, start_new_session=True
                    )
                except OSError as err:
                    raise UsageError(f"Cannot start {command[0]!r}: {err.strerror or err}.") from err
                async with keep_renewed(engine, result, on_lost=lost_reason.append) as lost:
                    async with anyio.create_task_group() as tg:

                        async def forward_signals() -> None:
                            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
                                async for signum in sigs:
                                    log.info("forwarding signal to child", signal=signum)
                                    if proc.returncode is None:
                                        proc.send_signal(signum)

                        async def enforce_loss() -> None:
                            await lost.wait()
                            sys.stderr.write(
                                f"coordinator: LOCK LOST — {lost_reason[0] if lost_reason else 'lost'}; "
                                f"sending SIGTERM to the child\n"
                            )
                            if proc.returncode is None:
                                proc.terminate()
                            with anyio.move_on_after(grace_s):
                                await proc.wait()
                            if proc.returncode is None:
                                sys.stderr.write("coordinator: child still running after the grace period; SIGKILL\n")
                                proc.kill()

                        tg.start_soon(forward_signals)
                        tg.start_soon(enforce_loss)
                        code = await proc.wait()
                        tg.cancel_scope.cancel()
                if lost_reason:
                    sys.stderr.write(f"coordinator: the lock was lost while the child ran (child exit {code})\n")
                    return int(ExitCode.LOCK_LOST)
                return _exit_status(code)
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await engine.release(result.lock_id)
                        c._forget(deployment, result.lock_id)
                    except CoordinatorError as err:
                        log.warning("release after lock run failed", error=err.message)

    return anyio.run(main)
