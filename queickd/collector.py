"""CPython's cyclic garbage collector, set for a long-running server process (the daemon,
an external worker).

A batch of jobs makes thousands of containers that all live until its commit: by default
the young generation is collected many times per batch, freeing nothing, and the full
collections walk the whole heap, every module included.

Two changes, nothing disabled, made once the process is set up (its store open, its app's
modules loaded, its threads started): the young generation is collected every
YOUNG_THRESHOLD net allocations, and what the process holds then is frozen out of later
collections. A frozen object is never collected, so nothing temporary may be alive at that
point. The jobs a daemon runs in threads share the setting: a cycle holding a job's data
waits for up to YOUNG_THRESHOLD allocations. (`gc.get_objects()` does not list frozen
objects: a debugging look at the heap calls `gc.unfreeze()` first.)
"""

from __future__ import annotations

import gc
from typing import Any

YOUNG_THRESHOLD = 20_000  # net container allocations between young collections (CPython: 700)


def tune_for_server() -> None:
    """Collect the young generation less often, and freeze what exists now: call it once,
    when the process is set up and serving has not begun."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
    gc.collect()  # garbage made while setting up is freed, not frozen
    gc.freeze()


def snapshot() -> dict[str, Any]:
    """The collector as the daemon's stats show it: its thresholds (a server process set up
    by tune_for_server has YOUNG_THRESHOLD first), how many objects are frozen out of its
    collections, and the collections each generation has had since the start."""
    return {"thresholds": list(gc.get_threshold()), "frozen": gc.get_freeze_count(),
            "collections": [g["collections"] for g in gc.get_stats()]}
