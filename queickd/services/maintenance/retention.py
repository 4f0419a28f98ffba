"""Retention: succeeded and cancelled jobs are deleted once older than `keep_finished`, the
delivered outbox events whose job is gone with them, the per-minute counters once older
than a day, and the rate keys whose window is empty.

A maintenance service of the daemon (no thread of its own). Deletes in small batches,
each its own transaction, so a large backlog never holds the store's writer for long.
Dead jobs are never pruned: they wait for an operator ('queick purge').
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...settings import DEFAULT_SWEEP
from ...store.contract.operator import Operator

log = logging.getLogger("queickd.daemon")  # the line was the daemon's; its logger stays

BATCH = 500  # jobs deleted per transaction
KEEP_MINUTES = 24 * 60  # per-minute counters kept (the status page shows the last hour)


class Retention:
    name = "retention"

    def __init__(self, store: Operator, keep_finished: float, *, interval: float = DEFAULT_SWEEP,
                 clock: Callable[[], float] = time.time) -> None:
        if keep_finished < 0:
            raise ValueError("keep_finished must not be negative")
        self.store = store
        self.keep_finished = keep_finished
        self.interval = interval
        self._clock = clock

    def run(self) -> None:
        self.prune()

    def prune(self) -> int:
        """Delete the finished jobs past their time; returns how many."""
        cutoff, total, events = self._clock() - self.keep_finished, 0, 0
        while (n := self.store.prune_finished(cutoff, BATCH)) > 0:
            total += n
        while (n := self.store.prune_events(cutoff, BATCH)) > 0:
            events += n
        if total or events:
            log.info("retention: pruned %d finished job(s) and %d delivered event(s) older than %.0f s",
                     total, events, self.keep_finished)
        self.store.prune_minutes(int(self._clock() // 60) - KEEP_MINUTES)
        self.store.prune_rate_keys(self._clock())
        return total
