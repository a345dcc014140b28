"""``deployment delete --purge``: remove the tool's objects from every member, under the lock."""

from __future__ import annotations

from coordinator.api import Coordinator
from coordinator.clusters import failed
from coordinator.config import ConfigStore
from coordinator.errors import NoQuorumError
from coordinator.fanout import ClusterResult, fan_out
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.outcome import Outcome


async def purge_deployment(store: ConfigStore, name: str, *, timeout: float = 5.0) -> dict[str, str]:
    c = Coordinator(store.load(), store=store, timeout=timeout)
    async with c:
        engine = c.lock_engine(name)
        state = c.state(name)
        async with c.lock(name, ttl=60, reason="deployment delete --purge"):

            async def wipe(cluster: str) -> ClusterResult[str]:
                client = c.clusters.client(cluster)
                try:
                    await c.clusters.check_identity(cluster)
                    for path in (state.path, engine.path):
                        try:
                            await client.request("DELETE", path)
                        except KubeError as err:
                            if err.kind != kube.NOT_FOUND:
                                raise
                except KubeError as err:
                    return failed(cluster, err)  # type: ignore[return-value]
                return ClusterResult(cluster, Outcome.OK, "deleted", detail="deleted")

            # The lease goes last on each cluster; releasing it afterwards finds nothing.
            results = await fan_out(engine.members, wipe, timeout=timeout)
    left = {m: results.get(m) for m in engine.members if m not in results or not results[m].ok}
    if left:
        done = [m for m in engine.members if m not in left]
        why = "; ".join(f"{m}: {r.outcome}: {r.detail}" if r else f"{m}: no answer" for m, r in left.items())
        raise NoQuorumError(
            f"Deployment {name!r} was purged on {', '.join(done) or 'no cluster'} but not on "
            f"{', '.join(left)} ({why}). The local record is kept so that you can run "
            f"`coordinator deployment delete {name} --purge` again once they answer."
        )
    return {m: f"{results[m].outcome}: {results[m].detail}" for m in engine.members}
