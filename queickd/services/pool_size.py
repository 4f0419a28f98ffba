"""Adaptive worker pool sizing: the bounds, the last resize, and the one shrink timer.

The pool grows by one on the events that already wake it (a pass that finds every worker
busy asks the claim for one job more; when it gets one, a worker is added), up to the
maximum, and not when the memory gate says one more typical job would not fit. Shrinking
is this module's timer: while the pool is above its minimum, one thread sleeps until the
queue has been quiet (nothing claimed) for the grace, then asks the pool to drop one
worker, and again until the minimum. At the minimum it ends: an idle pool at its minimum
has no timer at all. `due()` is the pure decision, so tests drive it with their own clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..settings import DEFAULT_IDLE_GRACE


class PoolSize:
    def __init__(self, minimum: int, maximum: int, idle_grace: float = DEFAULT_IDLE_GRACE, *,
                 clock: Callable[[], float] = time.time) -> None:
        if minimum < 0 or maximum < minimum:
            raise ValueError("min_workers must be 0 or more and max_workers at least min_workers")
        if not idle_grace >= 0:
            raise ValueError("idle_grace must not be negative")
        self.min, self.max, self.grace = minimum, maximum, idle_grace
        self._clock = clock
        self.last_claim_at = clock()
        self.last_resize: dict[str, Any] | None = None
        self._shrink: Callable[[float], int] | None = None  # the pool's: drop one if due -> size
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._grown = False  # a growth found the timer running since its last shrink began

    @property
    def adaptive(self) -> bool:
        return self.max > self.min

    def claimed(self, now: float) -> None:
        self.last_claim_at = now

    def due(self, size: int, now: float) -> bool:
        """Shrink by one now? Above the minimum, with nothing claimed for the grace."""
        return size > self.min and now - self.last_claim_at >= self.grace

    def resized(self, old: int, new: int, reason: str, now: float) -> None:
        self.last_resize = {"at": now, "from": old, "to": new, "reason": reason}

    def start_timer(self, shrink: Callable[[float], int]) -> None:
        """After a growth: make sure the shrink timer runs (one thread, whatever the size)."""
        with self._lock:
            self._shrink = shrink
            self._grown = True  # the running timer must not end on a size read before this
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="queickd-pool-size", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            wait = max(0.05, self.last_claim_at + self.grace - self._clock())
            if self._stop.wait(wait):
                return
            assert self._shrink is not None
            with self._lock:
                self._grown = False
            size = self._shrink(self._clock())
            # Decided under the lock growth takes (size may be stale by now): a growth since
            # the shrink began either set _grown (this timer goes on), or comes after this and
            # finds no timer (it starts one).
            with self._lock:
                if size <= self.min and not self._grown:
                    self._thread = None  # a growth from here on starts a new timer
                    return

    def snapshot(self, size: int) -> dict[str, Any]:
        return {"size": size, "min": self.min, "max": self.max, "idle_grace": self.grace,
                "last_resize": self.last_resize}


def adaptive_size(workers: int, minimum: int | None, maximum: int | None, idle_grace: float,
                  clock: Callable[[], float] = time.time) -> PoolSize:
    """The bounds from the flags: --workers alone is a fixed size; --min-workers and
    --max-workers default to --workers (and the maximum to at least the minimum)."""
    lo = workers if minimum is None else minimum
    hi = max(lo, workers) if maximum is None else maximum
    return PoolSize(lo, hi, idle_grace, clock=clock)


def said(size: PoolSize | None, workers: int) -> str:
    """A pool's size as a start log says it: "4 workers", or "workers 1-8 (adaptive)"."""
    if size is None:
        return f"{workers} worker{'' if workers == 1 else 's'}"
    return f"workers {size.min}-{size.max} (adaptive)"


def described(size: PoolSize | None, workers: int) -> dict[str, Any]:
    """A pool's size, its bounds and its last resize (a fixed pool: min = max = size)."""
    if size is None:
        return {"size": workers, "min": workers, "max": workers, "idle_grace": None, "last_resize": None}
    return size.snapshot(workers)
