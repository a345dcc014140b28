"""The pure rules: what a lease, a stored member set, a turn line, an evidence field or a
field path means, and how many answers make a majority. No I/O, no clock of their own
(a default time comes through ``coordinator.clock``), no pydantic, no API server: every
answer and every time is an argument, so each rule is tested case by case."""
