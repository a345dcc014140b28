"""The engines: the lock (``lock``) and the replicated state (``state``) of one
deployment over its member clusters, with what they share — the clusters and their
identity checks (``clusters``), fan-out with deadlines (``fanout``), one object's
compare-and-swap (``cas``), the lock history (``history``) and the state envelope
(``register``). They apply the rules of ``coordinator.rules`` through ``coordinator.kube``
and never import the commands above them (``ops``, ``run``, ``cli``)."""
