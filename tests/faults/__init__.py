"""The fault-injection suite's harness (``scripts/torture.py`` and the tests use it).

- A torture run (``scripts/torture.py``), from the top down: :mod:`faults.run` sets it
  up, runs it and judges it; :mod:`faults.rig` holds its options, the sandbox clusters
  behind toxiproxy and the contender processes; :mod:`faults.schedule` injects the fault
  kinds named in :mod:`faults.kinds`; :mod:`faults.contenders` is what each contender
  process runs (and :mod:`faults.tree` the process tree of a ``lock run`` one);
  :mod:`faults.recorder` collects their histories and writes the report; every time in
  them is read on :mod:`faults.clock`.
- :mod:`faults.checkers`: pure checkers that judge recorded histories
  (mutual exclusion of lock holders, linearizability of the replicated state).
- :mod:`faults.toxiproxy`: a small controller for a local toxiproxy
  server, to put latency, black holes and cut connections between the tool and
  its control planes.
- :mod:`faults.admission` (admission policies that turn writes away) and
  :mod:`faults.kubectl` (the real kubectl): other clients of a sandbox cluster, for the
  fault schedule and the tests.

It lives under tests/ and is not part of the installed package: nothing here is
imported by the tool itself.
"""
