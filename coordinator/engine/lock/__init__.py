"""The multi-cluster lease engine: acquire, renew, release, break, status.

The per-lease rules (may this lease be taken, has it lapsed, which token, what a
renewal finds) are pure functions in :mod:`coordinator.rules.lease`; this package reads and
writes the leases, fans out over the members and decides the majority.

What it guarantees, and under which assumptions
-----------------------------------------------
A contender holds the lock when its lock id is the ``holderIdentity`` of live leases on
a majority q = floor(n/2) + 1 of the n members. Two majorities share a cluster, and on
one cluster every write is a compare-and-swap on ``resourceVersion``, so at most one
contender holds the lock at a time — provided that a lease is never taken over before
its holder's validity ended, and that a lease that disappears is never taken as free.

* Expiry evidence is the coordinator's own: the server's stamp on the ``coordinator``
  field manager's managedFields entry (our takes and renewals), compared with a fresh
  server stamp from a probe write made after the read. Edits by other field managers
  move neither. The HTTP ``Date`` only tells when to probe. A lease without our entry
  (stripped, or merged by the server into ``ancient-changes``) lapses only by local
  observation (the fields the lock rules read unchanged for a whole TTL on the
  contender's clock). A duration written by someone else is replaced by the
  deployment's maximum TTL.
* The margin before a lapse counts is drift (1 % of the TTL) + 2 s (one-second stamps)
  + ``max_server_skew`` (API servers of one cluster disagreeing on the time).
* The holder counts validity = TTL − elapsed − 1 % on CLOCK_BOOTTIME from the moment
  *before* it sent its writes; every server stamped those writes later, so contenders
  see the lapse strictly after the holder's validity ended, as long as clock rates
  agree within 1 % and server offsets within ``max_server_skew``.
* A lease found missing is recorded as a tombstone that counts as held by an unknown
  holder for one maximum TTL (no lease may be taken for longer). Leases are created
  with the deployment, so a missing one was deleted. A lease whose ``coordinator.io/uid``
  does not name the object itself is a recreated copy: it blocks for a maximum TTL after
  its creation and carries no history.
* Fencing tokens: one more than the highest on a majority of leases that kept their
  history; when deleted leases leave no such majority, every member's lease and the
  state replicas' tokens of a majority are included too; short of that, nothing is taken.
* Renewals return once a majority is renewed, never re-take a lease, and report the
  lock lost at once when a lease names another lock id with a token not below ours (a
  take after ours, or an edit) or a break note names ours.

Assumed: only coordinator writes a lease's ``spec`` holder fields and its
``coordinator.io/`` holder annotations; anyone may label or annotate it, strip its
managedFields, change its duration, or delete it (each handled as above).

Not guaranteed: a holder that stops past its validity may still act, unless it checks
``held.valid`` or the resource checks fencing tokens. A token can be granted again when
the leases and the state objects (which carry the token floor) of a majority are deleted
together: nothing in the clusters remembers it.

The engine is :class:`LockEngine` (``engine``): one ``core`` (the configuration it
counts with, and one lease's reads, writes and compare-and-swap) and one part per job,
each holding the core: ``members`` (the stored member set), ``acquire`` and ``turns``
(taking the lock, waiters' turns), ``renew``, ``release`` (release and break), ``floor``
(the token floor on the state objects), ``status``; ``bodies`` (what is written) and
``results``/``reports`` (what callers and people get) are plain functions and values.
Import what you need from the module that defines it (``coordinator.engine.lock.engine``,
``coordinator.engine.lock.results``...): the package itself imports nothing, so that a command
that only reads the lock (``lock status``) never imports the write side.
"""
