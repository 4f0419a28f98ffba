"""Orphan fate: what becomes of a job found running when no live worker holds it.

A store finds its orphans (SQLite and memory: every running job at start; PostgreSQL:
running jobs whose worker missed its beats) and reads, for each, how often it was orphaned
before; this module decides which go back to the queue and which are given up as dead, and
with which error. The store writes the plan. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

# The error a given-up orphan records (shown by `queick show` and the status page).
ERROR = {"type": "orphaned", "message": "its worker stopped while it ran, too often"}


@dataclass(frozen=True, slots=True)
class Plan:
    requeue: list[int]  # back to queued, their orphaned count raised by one
    dead: list[int]  # given up: dead, with ERROR, finished now


def plan(orphans: Iterable[tuple[int, int]], max_requeues: int, running_here: Collection[int] = ()) -> Plan:
    """orphans: (job id, times orphaned before). A job is re-queued while it has been
    orphaned fewer than max_requeues times; after that it is dead. Ids come out sorted.
    `running_here`: jobs the calling process has claimed and runs now, never orphans (a
    recovery put off past the start, by a full disk, finds them running beside the jobs
    the previous run left)."""
    requeue, dead = [], []
    for job_id, orphaned in orphans:
        if job_id in running_here:
            continue
        (requeue if orphaned < max_requeues else dead).append(job_id)
    return Plan(sorted(requeue), sorted(dead))
