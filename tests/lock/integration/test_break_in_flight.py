"""What happens to a lease while an acquisition's takes are on the way, on real API servers.

An attempt's takes land at different times. Alice's take of c1 lands; her takes of c2 and c3
are held (an admission webhook keeps them waiting); an operator breaks the lock, clearing
c1; Bob takes c1 and c2 and holds the lock. Then Alice's takes go on: c2 is Bob's (a
conflict), c3 is free and hers. Counting c1 as she took it, she would have a majority and
report the lock taken while Bob holds it. The acquisition reads the leases it counted
again before it returns, finds c1 Bob's, gives c3 back and exits 3.

And a token drawn from reads that are overtaken: Bob reads every lease and draws token T;
his takes are held; Alice acquires with the same T (nothing has changed) and releases; a
namespace writer annotates the token to 0 on two members. Bob's takes meet a changed lease
(a conflict) and read again: where coordinator's token T was, there is another client's 0.
A lease whose token history was coordinator's when the token was drawn, and is not any
more, is not taken: Bob must not be granted T a second time.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import anyio
import pytest
from coord_fixtures import Env
from faults.kubectl import kubectl
from helpers.throttle import Rule, Webhook

from coordinator.rules.lease import LeaseView
from coordinator.rules.resources import lease_name, lease_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _lease_holders(env: Env) -> dict[int, str | None]:
    async def read() -> dict[int, str | None]:
        out = {}
        for i in (1, 2, 3):
            view = LeaseView.parse(await env.raw(i, "GET", lease_path(env.namespace, lease_name(env.deployment))))
            out[i] = view.lock_id
        return out

    return anyio.run(read)


def test_a_break_during_an_acquisition_does_not_let_it_count_a_cleared_lease(dep3: Env, tmp_path: Path) -> None:
    name = lease_name(dep3.deployment)
    webhook = Webhook(dep3.sandbox, tmp_path)
    go = threading.Event()
    try:
        # With the token on c2 and c3 last written by another client (not believed), no reads
        # but all three prove a token new, so Bob's token is drawn with c1's (Alice's) in
        # view and above it, whichever members answer first. Otherwise Bob could draw
        # Alice's token from c2 and c3 alone, which is correct (she holds no majority), but
        # his take of c1 is then refused as a concurrent attempt's and the race is not run.
        for i in (2, 3):
            edited = kubectl(dep3.kubeconfig, i, dep3.namespace, "annotate", "--overwrite", "lease", name,
                             "coordinator.io/fencing-token=5")  # fmt: skip
            assert edited.returncode == 0, edited.stderr
        webhook.install(dep3.namespace, "inflight")
        # Alice's takes of c2 and c3 wait for `go`; so does Bob's take of c3, so that Bob's
        # majority is c1 and c2 and c3 is still free when Alice's take of it lands.
        for cluster, times in ((2, 1), (3, 2)):
            held = (cluster, "UPDATE", "leases", name)
            webhook.rules.append(Rule(lambda k, held=held: k == held, hold_s=60, release=go, times=times))
        slow = {"COORDINATOR_TIMEOUT": "90s"}
        alice = dep3.popen(
            "-o", "json", "lock", "acquire", "web", "--holder", "alice", "--ttl", "120s",
            env=slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (webhook.saw(2, name) and webhook.saw(3, name) and _lease_holders(dep3)[1] is not None):
            assert time.monotonic() < deadline and alice.poll() is None, "alice's takes did not arrive"
            time.sleep(0.1)
        alice_id = _lease_holders(dep3)[1]
        broken = dep3.cli("lock", "break", "web", "--yes", "--reason", "runner died", env=slow)
        assert broken.returncode == 0, broken.stdout + broken.stderr
        assert _lease_holders(dep3)[1] is None
        bob = dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--ttl", "120s", env=slow)
        assert bob.returncode == 0, bob.stdout + bob.stderr
        bob_id = json.loads(bob.stdout)["lock_id"]
        assert _lease_holders(dep3) == {1: bob_id, 2: bob_id, 3: None}
        go.set()
        out, err = alice.communicate(timeout=120)
        # Without the confirming read: exit 0, alice "holding" c1 (Bob's) and c3.
        assert alice.returncode == 3, out + err
        assert "c1: held by lock " + bob_id in err and "a `lock break`" in err, err
        holders = _lease_holders(dep3)
        assert holders[1] == holders[2] == bob_id and holders[3] != alice_id, holders
        status = dep3.cli("-o", "json", "lock", "status", "web")
        assert status.returncode == 0 and json.loads(status.stdout)["holder"] == "bob", status.stdout
    finally:
        go.set()
        webhook.close()


def test_a_token_rewritten_while_the_takes_are_on_the_way_is_not_granted_twice(dep3: Env, tmp_path: Path) -> None:
    name = lease_name(dep3.deployment)
    webhook = Webhook(dep3.sandbox, tmp_path)
    go = threading.Event()
    try:
        webhook.install(dep3.namespace, "overtaken")
        for cluster in (1, 2, 3):  # the first take on each member, Bob's, waits for `go`
            held = (cluster, "UPDATE", "leases", name)
            webhook.rules.append(Rule(lambda k, held=held: k == held, hold_s=60, release=go, times=1))
        slow = {"COORDINATOR_TIMEOUT": "90s"}
        bob = dep3.popen(
            "-o", "json", "lock", "acquire", "web", "--holder", "bob", "--ttl", "120s",
            env=slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not all(webhook.saw(i, name) for i in (1, 2, 3)):
            assert time.monotonic() < deadline and bob.poll() is None, "bob's takes did not arrive"
            time.sleep(0.1)
        alice = dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "alice", "--ttl", "120s", env=slow)
        assert alice.returncode == 0, alice.stdout + alice.stderr
        granted = json.loads(alice.stdout)
        released = dep3.cli("lock", "release", "web", "--lock-id", granted["lock_id"], env=slow)
        assert released.returncode == 0, released.stdout + released.stderr
        for i in (1, 2):
            done = kubectl(dep3.kubeconfig, i, dep3.namespace, "annotate", "--overwrite", "lease", name,
                           "coordinator.io/fencing-token=0")  # fmt: skip
            assert done.returncode == 0, done.stderr
        go.set()
        out, err = bob.communicate(timeout=120)
        # Before: exit 0 with Alice's token.
        assert bob.returncode in (3, 4), out + err
        assert "rewrote or removed its fencing token" in err, err
        again = dep3.cli("-o", "json", "lock", "acquire", "web", "--holder", "bob", "--ttl", "60s", env=slow)
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(again.stdout)["fencing_token"] > granted["fencing_token"], (again.stdout, granted)
    finally:
        go.set()
        webhook.close()
