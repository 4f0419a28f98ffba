"""Probes: a paused key or function lets one job through once its cooldown is over. This is
a timer of the daemon's scheduler (its "probes" slot), armed for the next probe time, which
the pool announces for pauses begun here (PoolHooks.on_probe_at); the scheduler's sweep
fires every timer slot, so pauses another host of a shared store began are found then."""

from __future__ import annotations

from ...store import Store
from ..worker import WorkerPool


class PauseProbes:
    def __init__(self, store: Store, pool: WorkerPool) -> None:
        self.store = store
        self.pool = pool

    def due(self, now: float) -> float | None:
        """A probe's time has come, so the pool claims (and lets the probe through); returns
        the next probe time still ahead."""
        self.pool.wake()
        return min((p.probe_at for p in self.store.pauses() if p.probe_at is not None and p.probe_at > now),
                   default=None)
