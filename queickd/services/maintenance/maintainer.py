"""Runs the maintenance services, each once its interval has passed, at the ticks of a host
that already wakes periodically: a daemon's scheduler sweep, a worker's heartbeat sweep.
No thread of its own.

A service's interval is counted in the host's monotonic time, with half a tick of slack, so
one whose interval is the tick runs at every tick however late the tick comes. An error
leaves run_due() (its host logs it) and the services after it run at the next tick, so a
store that cannot be reached is said once per tick."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Service(Protocol):
    name: str  # what the log and the maintainer call it
    interval: float  # seconds between two runs

    def run(self) -> None:
        """One round of its upkeep; raises what its store raises."""
        ...


@dataclass(frozen=True)
class Every:
    """A service that is one call."""

    name: str
    interval: float
    run: Callable[[], None]


class Maintainer:
    def __init__(self, services: Sequence[Service], tick: float,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not tick > 0 or any(not s.interval > 0 for s in services):
            raise ValueError("a maintainer's tick and its services' intervals must be positive")
        names = [s.name for s in services]
        if len(set(names)) != len(names):
            raise ValueError(f"maintenance services named twice: {names}")
        self.services = list(services)
        self._tick = tick
        self._monotonic = monotonic
        self._next: dict[str, float] = dict.fromkeys(names, 0.0)  # monotonic time each is due; all at once

    def run_due(self) -> None:
        """Run, in order, the services whose time has come (the host's tick)."""
        for s in self.services:
            now = self._monotonic()
            if now + self._tick / 2 >= self._next[s.name]:
                s.run()
                self._next[s.name] = now + s.interval
