"""Network parking: what becomes of the jobs that asked to wait for the network.

A job enqueued with `retry_on_network` may start only while the network checker
(services/netcheck.py) says the network is up. This part decides, from the checker's
state, when such jobs are parked (`waiting_network`) and released: on each transition,
after a commit that brought such jobs while the network is down, and once per safety
sweep (a job can park while the checker still says "up": its own server was down, or the
checker had not noticed yet). It never probes the network and never runs a job; the
store does the parking and releasing. Called from the checker's reader thread, the
committer and the scheduler; the store makes each call atomic, so no lock is needed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from ..core.job import NewJob
from ..store.contract.schedule import Schedule
from .netcheck import NetworkMonitor

log = logging.getLogger("queickd.daemon")  # these lines were the daemon's; their logger stays


class NetworkParking:
    def __init__(self, store: Schedule, monitor: NetworkMonitor | None, wake: Callable[[], None],
                 *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.monitor = monitor  # None: no checker; such jobs follow their normal retry policy
        self._wake = wake  # the worker pool's: released jobs may start
        self._clock = clock
        self._warned_no_checker = False

    @classmethod
    def with_checker(cls, store: Schedule, target: str | None, interval: float, wake: Callable[[], None],
                     *, clock: Callable[[], float] = time.time) -> NetworkParking:
        """Parking and the network checker of `target` (none without one), which tells it
        of each change. The checker starts with the daemon's other threads (start())."""
        parking = cls(store, None, wake, clock=clock)
        if target is not None:
            parking.monitor = NetworkMonitor(target, interval, parking.on_change, clock=clock)
        return parking

    def checker(self) -> bool:
        """Is a checker there to release parked jobs?"""
        return self.monitor is not None

    def network_up(self) -> bool:
        """May jobs that need the network start? Without a checker, always; with one, only
        once it has reported the network up."""
        return self.monitor is None or self.monitor.up is True

    def on_change(self, up: bool) -> None:
        """The checker saw the network come back (release) or go (park)."""
        now = self._clock()
        if up:
            n = self.store.release_network_waiting(now)
            log.info("network is back: %d job(s) waiting for it released", n)
            self._wake()
        else:
            n = self.store.park_for_network(now)
            log.info("network is down: %d queued job(s) that need it parked", n)

    def on_sweep(self) -> None:
        if self.monitor is not None and self.monitor.up:
            n = self.store.release_network_waiting(self._clock())
            if n:
                log.info("sweep: network is up; %d parked job(s) released", n)
        elif self.monitor is not None and self.monitor.up is False:
            self.store.park_for_network(self._clock())

    def on_committed(self, jobs: Sequence[NewJob]) -> None:
        """Jobs were just stored: park those that need a network that is not up."""
        if not any(j.retry_on_network for j in jobs):
            return
        if self.monitor is None:
            if not self._warned_no_checker:
                self._warned_no_checker = True
                log.warning("jobs ask to wait for the network, but no checker is configured "
                            "(--ping-host); they follow their normal retry policy")
        elif not self.monitor.up:
            self.store.park_for_network(self._clock())
