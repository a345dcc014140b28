"""The process tree a ``lock run`` contender holds the lock around (and the operator's
``lock run`` that the sigkill-lock-run fault kills).
"""

from __future__ import annotations

# The critical section of a `lock run` contender: a shell that starts children, one of
# them left running when the shell exits (nobody waits for it). Every process appends
# marks "PID start|tick|end READING" (the machine clock, from /proc/uptime, which is
# CLOCK_BOOTTIME in centiseconds) and the shell the fencing token it was given; the
# section is judged from the first mark to the last (checkers.section_from_marks).
TREE_SCRIPT = r"""#!/bin/sh
m=$1; n=$2; role=${3:-top}
mark() { read -r up _rest < /proc/uptime; echo "$$ $1 $up" >> "$m"; }
if [ "$role" = top ]; then
  echo "$$ token ${COORDINATOR_FENCING_TOKEN:-none}" >> "$m"
fi
mark start
if [ "$role" = top ]; then
  sh "$0" "$m" "$n" child &
  sh "$0" "$m" $(( n / 2 + 1 )) child &
  ( sh "$0" "$m" $(( n + 10 )) child & )
fi
i=0
while [ "$i" -lt "$n" ]; do sleep 0.2; mark tick; i=$((i + 1)); done
if [ "$role" = top ]; then wait; fi
mark end
"""
TREE_TICK_S = 0.2


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (an orphan's zombie may linger
    where nothing reaps orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]
