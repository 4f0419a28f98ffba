"""Minute counts: the pool's runs counted per minute are written by its passes; an idle pool
makes none, so the counts of its last minutes are written here."""

from __future__ import annotations

from ...settings import DEFAULT_SWEEP
from ..worker import WorkerPool


class FlushMinuteCounts:
    name = "minute_counts"

    def __init__(self, pool: WorkerPool, *, interval: float = DEFAULT_SWEEP) -> None:
        self.pool = pool
        self.interval = interval

    def run(self) -> None:
        self.pool.flush_counts()  # logs a store error, never raises
