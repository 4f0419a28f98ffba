"""Queue depth: the jobs waiting, sampled for the status page's chart and kept in the store
with the per-minute run counts, so the chart survives a restart."""

from __future__ import annotations

import time
from collections.abc import Callable

from ...core.job import State
from ...settings import DEFAULT_SWEEP
from ...store import Store
from ...store.records import Minute


class DepthSample:
    name = "depth"

    def __init__(self, store: Store, sample: Callable[[int], None], member: str, *,
                 interval: float = DEFAULT_SWEEP, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._sample = sample  # the metrics' in-memory series
        self.member = member  # whose minute row holds it (the pool's name in the per-minute counts)
        self.interval = interval
        self._clock = clock

    def run(self) -> None:
        counts = self.store.counts()
        depth = sum(counts[s] for s in State.PENDING)
        self._sample(depth)
        self.store.add_minute(Minute(int(self._clock() // 60), self.member, 0, 0, 0.0, depth))
