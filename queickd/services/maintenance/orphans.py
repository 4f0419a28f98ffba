"""Orphans: jobs a previous run of this daemon left `running` are re-queued (or dead once
they used their orphan re-queues). At start; while the store cannot be written (a full
disk), again at each round until it could. A shared store's other members' orphans are
the fleet's heartbeat's (services/fleet.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...settings import DEFAULT_MAX_ORPHAN_REQUEUES, DEFAULT_SWEEP
from ...store import Store
from ...store.records import Recovered
from ..worker import WorkerPool

log = logging.getLogger("queickd.daemon")  # the lines were the daemon's; their logger stays


class OrphanRecovery:
    name = "orphans"

    def __init__(self, store: Store, pool: WorkerPool, *, max_requeues: int = DEFAULT_MAX_ORPHAN_REQUEUES,
                 interval: float = DEFAULT_SWEEP, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.pool = pool
        self.max_requeues = max_requeues
        self.interval = interval
        self._clock = clock
        self.recovered = False  # once done, nothing is left to do until the next start

    def run(self) -> None:
        if not self.recovered:
            self.recover()

    def recover(self) -> None:
        """Recover the previous run's orphans; logs, never raises, when the store cannot be written."""
        def recover(running_here: frozenset[int]) -> Recovered:
            return self.store.recover_orphans(self.max_requeues, self._clock(), running_here)

        try:
            # Once the pool has started (a recovery put off by a full disk), the jobs it
            # claimed meanwhile are running here: they are not the previous run's.
            recovered = self.pool.with_held(recover)
        except self.store.UNAVAILABLE as e:
            log.warning("cannot recover jobs left running by a previous run yet (%s); trying again at "
                        "each sweep", e)
            return
        self.recovered = True
        if recovered.requeued or recovered.dead:
            log.warning(
                "recovered jobs left running by a previous run: %d re-queued, %d dead (orphaned)",
                len(recovered.requeued), len(recovered.dead),
            )
