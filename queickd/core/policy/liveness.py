"""Liveness of a running job: when one that asked for it (`stalled_after`, seconds) is
`stalled`, and what its `on_stall` does then.

A job is alive while it reports progress (queickd.progress) and, for a process job, while
its process tree uses CPU time; one that has done neither for `stalled_after` seconds is
stalled. `mark` (the default) only says so, where jobs are shown, until it reports again;
`kill` stops the run as its timeout would (a process killed, an async task cancelled, a
thread interrupted), and the run fails with error type STALLED, judged by core/fate.py as
a timeout is: retried per the job's policy.

Pure: the bounds and checks of the two fields (the protocol, the config file and the SQL
enqueue function read them here) and the one rule, `stalled`. The watch that applies it
is services/liveness.py.
"""

from __future__ import annotations

import math
from typing import Any

from ..numbers import in_range
from ..sandbox import MAX_TIMEOUT

MARK = "mark"
KILL = "kill"
ON_STALL = (MARK, KILL)
STALLED = "stalled"  # a run's error type when on_stall = kill stopped it; what jobs show
MIN_STALLED_AFTER = 1.0  # seconds: below this, a busy job between two reports looks stuck
MAX_STALLED_AFTER = MAX_TIMEOUT  # a day, as a timeout
CPU_ALIVE = 0.01  # seconds of CPU time between two looks that count as alive (one clock tick)

STALLED_AFTER_MESSAGE = (f"stalled_after must be seconds from {MIN_STALLED_AFTER:g} to "
                         f"{MAX_STALLED_AFTER:.0f} (a day)")
ON_STALL_MESSAGE = f"on_stall must be one of {', '.join(ON_STALL)}"


def check_stalled_after(v: Any) -> float | None:
    """The value stored, or ValueError naming the field (None: not watched)."""
    if v is None:
        return None
    return in_range("stalled_after", v, MIN_STALLED_AFTER, MAX_STALLED_AFTER, message=STALLED_AFTER_MESSAGE)


def check_on_stall(v: Any) -> str | None:
    """The value stored, or ValueError naming the field (None: MARK)."""
    if v is None:
        return None
    if v not in ON_STALL:
        raise ValueError(f"{ON_STALL_MESSAGE}, not {v!r}")
    return v


def stalled(last_alive: float, stalled_after: float, now: float) -> bool:
    """Whether a run last seen alive at `last_alive` is stalled at `now` (same clock)."""
    return now - last_alive >= stalled_after


def due(last_alive: float, stalled_after: float) -> float:
    """When a run last seen alive at `last_alive` is stalled if nothing happens meanwhile."""
    return last_alive + stalled_after


def cpu_alive(before: float | None, after: float | None) -> bool:
    """Whether a process job's CPU time grew between two looks (None: not known)."""
    return before is not None and after is not None and math.isfinite(after) and after - before >= CPU_ALIVE
