"""An alarm clock for a process without the daemon's scheduler (`queick worker`): calls an
action at each time it is given, from a thread of its own that sleeps until the earliest
one (no polling: idle costs nothing). Times are wall-clock, as the store's are; one that has
passed fires at once, and several due together fire once."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("queickd.alarm")


class Alarm:
    def __init__(self, action: Callable[[], None], *, clock: Callable[[], float] = time.time,
                 name: str = "queickd-alarm") -> None:
        self._action = action
        self._clock = clock
        self._name = name
        self._times: list[float] = []  # a heap of the times to come
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def at(self, t: float) -> None:
        """Call the action at wall time t (at once if it has passed). Any thread."""
        with self._cond:
            earliest = self._times[0] if self._times else None
            if t == earliest:  # the next already: a claim reports its rate key's opening at every pass
                return
            heapq.heappush(self._times, t)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if earliest is None or t < earliest:  # a later time leaves the thread's wait as it is
                self._cond.notify()

    def stop(self) -> None:
        """Idempotent; what has not fired yet never does."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._times or self._times[0] > self._clock()):
                    # A wall clock that jumps is caught within a minute: no wait is longer.
                    self._cond.wait(min(60.0, self._times[0] - self._clock()) if self._times else None)
                if self._stopping:
                    return
                now = self._clock()
                while self._times and self._times[0] <= now:  # due together: one call
                    heapq.heappop(self._times)
            try:
                self._action()
            except Exception:
                log.exception("alarm action failed")
