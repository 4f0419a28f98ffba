"""Runs counted per minute (runs, failures, seconds) by one pool, until a pass writes them.

Worker threads add a run as it ends; the pool's pass takes what is due and writes it to the
store (`add_minute`, as this member "host:pid") in its own transaction, at most once a
second or when the minute turns, and everything when forced (the pool idle, or stopping).
A pass that fails puts its counts back, to be written with a later one. The fleet's counts
and the status page's history are read from the store, whoever ran the jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..store.records import Minute

COUNTS_EVERY = 1.0  # seconds between writes of the per-minute counts (and when the minute turns)


class RunCounts:
    def __init__(self, member: str, clock: Callable[[], float]) -> None:
        self.member = member
        self._clock = clock
        self._counts: dict[int, list] = {}  # minute -> [completed, failed, seconds] not yet stored
        self._lock = threading.Lock()  # worker threads add, the pass takes
        self._taken_at = 0.0  # monotonic time of the last take

    def add(self, ok: bool, seconds: float) -> None:
        """Worker thread: one run ended."""
        minute = int(self._clock() // 60)
        with self._lock:
            c = self._counts.get(minute)
            if c is None:
                c = self._counts[minute] = [0, 0, 0.0]
            c[0 if ok else 1] += 1
            c[2] += seconds

    def take(self, force: bool) -> list[Minute]:
        """The counts due to be written: all of them when forced, a second after the last
        write, or once a minute other than the current one holds some."""
        now = time.monotonic()
        with self._lock:
            if not self._counts:
                return []
            current = int(self._clock() // 60)
            if not force and now - self._taken_at < COUNTS_EVERY and len(self._counts) == 1 and current in self._counts:
                return []
            taken, self._counts = self._counts, {}
        self._taken_at = now
        return [Minute(m, self.member, c[0], c[1], c[2]) for m, c in sorted(taken.items())]

    def put_back(self, counted: list[Minute]) -> None:
        """A batch that failed: its counts are written with a later one."""
        with self._lock:
            for m in counted:
                c = self._counts.setdefault(m.minute, [0, 0, 0.0])
                c[0] += m.completed
                c[1] += m.failed
                c[2] += m.seconds
