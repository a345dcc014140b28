"""``deployment delete --purge``: remove the tool's objects from every member, under the lock."""

from __future__ import annotations

from coordinator.config.store import ConfigStore
from coordinator.engine.clusters import failed
from coordinator.engine.fanout import ClusterResult, fan_out
from coordinator.errors import NoQuorumError
from coordinator.kube import client as kube
from coordinator.kube.client import KubeError
from coordinator.ops.api import Coordinator
from coordinator.rules.outcome import Outcome


async def purge_deployment(store: ConfigStore, name: str, *, timeout: float = 5.0) -> dict[str, str]:
    c = Coordinator(store.load(), store=store, timeout=timeout)
    async with c:
        engine = c.lock_engine(name)
        state = c.state(name)
        async with c.lock(name, ttl=60, reason="deployment delete --purge"):

            def deleter(path: str, what: str):  # type: ignore[no-untyped-def]
                async def delete(cluster: str) -> ClusterResult[str]:
                    client = c.clusters.client(cluster)
                    try:
                        await c.clusters.check_identity(cluster)
                        try:
                            await client.request("DELETE", path)
                        except KubeError as err:
                            if err.kind != kube.NOT_FOUND:
                                raise
                    except KubeError as err:
                        return failed(cluster, err)  # type: ignore[return-value]
                    return ClusterResult(cluster, Outcome.OK, "deleted", detail=f"{what} deleted")

                return delete

            # The state first, everywhere; the leases only once no member keeps a state
            # object. A purge cut short keeps every lease, so that running it again can
            # take the lock (a lease found missing would block it for a maximum TTL).
            results = await fan_out(engine.members, deleter(state.replicas.path, "state"), timeout=timeout)
            if all(m in results and results[m].ok for m in engine.members):
                results = await fan_out(engine.members, deleter(engine.core.path, "state and lease"), timeout=timeout)
    if all(m in results and results[m].ok for m in engine.members):
        # The lock's history last: only now, with this command's own background work done
        # (recording its take of the lock), can nothing write it again.
        c = Coordinator(store.load(), store=store, timeout=timeout)
        async with c:
            path = c.lock_engine(name).history.path
            results = await fan_out(engine.members, deleter(path, "state, lease and lock history"), timeout=timeout)
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
