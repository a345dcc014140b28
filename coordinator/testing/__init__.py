"""Test helpers for the fault-injection suite.

- :mod:`coordinator.testing.checkers`: pure checkers that judge recorded histories
  (mutual exclusion of lock holders, linearizability of the replicated state).
- :mod:`coordinator.testing.toxiproxy`: a small controller for a local toxiproxy
  server, to put latency, black holes and cut connections between the tool and
  its control planes.

Nothing here is imported by the tool itself.
"""
