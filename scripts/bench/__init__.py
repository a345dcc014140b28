"""Benchmarks of coordinator against local control planes, each figure a ratio against
a baseline measured side by side in the same run.

The harness starts its own sandbox (etcd + kube-apiserver per cluster) in a temporary
directory, puts one toxiproxy proxy in front of each API server, and connects the
clusters through the proxies, so latency and black holes can be injected per cluster.
Everything it started is stopped at the end, also on Ctrl-C or SIGTERM.

    python scripts/bench.py --quick
    python scripts/bench.py --json bench-results/full.json --plot bench-results/bench.png

Figures (see the table printed at the end; each row is PASS or FAIL, or "info"):

B1  lock acquire over N = 1, 3, 5, 7 clusters at +100 ms, parallel fan-out vs the same
    per-cluster steps done cluster after cluster (a sequential loop, as naive scripts
    and Redlock's reference algorithm do).
B2  acquire over 5 clusters with k black-holed (connections accepted, never answered)
    vs healthy acquire over 5.
B3  handoff: holder releases -> a waiting contender holds the lock, vs a waiter that
    polls every 2 s.
B4  `coordinator lock status` over 5 clusters as a whole process vs
    `python -c "import kubernetes_asyncio.client"`: wall time and peak RSS.
B5  `state set` / `state get` over 5 clusters at +100 ms vs over 1 cluster.
B6  8 contender processes cycling acquire/release on 3 clusters: cycles/s, fairness.
B7  state document size 1 KiB -> 512 KiB: write and read latency growth.

Round two (targets in TARGETS; ``--target ID=VALUE`` overrides one):

B3' B3 with 100 handoffs: median and p99.
B4' B4 with tighter targets (1.3x the import, 100 MB).
B8  fleet view: `lock status --all` over 20 deployments x 5 clusters vs `lock status` of
    one deployment; the fleet view's requests counted per cluster.
B9  acquire over 9 vs 3 clusters at +50 ms per cluster, fresh clients; client CPU per
    extra cluster.
B10 TCP connections per cluster opened by `lock acquire`, `state set`, `lock status`,
    counted at a small forwarder in front of each cluster's proxy.
B11 `lock status --all --watch` over 20 x 5 while a lock changes hands every 2 s: RSS
    growth after the first minute, and how long after each change it is shown.

Protocol figures use the ``coordinator`` API in-process, one fresh ``Coordinator`` per
operation (as one CLI command has: own clients, own identity checks, cold connections);
CLI figures run whole processes.
"""
