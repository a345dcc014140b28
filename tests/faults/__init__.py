"""The fault-injection suite's harness (``scripts/torture.py`` and the tests use it).

- :mod:`faults.workload`: the sandbox rig, contender processes, recorder and fault
  schedule of a run.

- :mod:`faults.checkers`: pure checkers that judge recorded histories
  (mutual exclusion of lock holders, linearizability of the replicated state).
- :mod:`faults.toxiproxy`: a small controller for a local toxiproxy
  server, to put latency, black holes and cut connections between the tool and
  its control planes.

It lives under tests/ and is not part of the installed package: nothing here is
imported by the tool itself.
"""
