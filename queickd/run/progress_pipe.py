"""A process job's side of queickd.progress: the child's values, written as lines on its
report pipe (run/watch.py takes them off ahead of the report), at most one every INTERVAL
seconds. A value that comes sooner waits for a timer thread, started then, and a later one
replaces it; so a job that reports 10,000 times a second writes a few lines a second.

Lives in the child only (made by run/child.py after the fork); never reads the pipe, never
blocks the job for longer than one small write (a line is under PIPE_BUF: written whole).
"""

from __future__ import annotations

import json
import os
import threading
import time

INTERVAL = 0.25  # seconds between two lines, as the daemon's writer spaces its writes


class ProgressPipe:
    """A context.ProgressSink writing to `fd`. Any thread of the child."""

    def __init__(self, fd: int, interval: float = INTERVAL) -> None:
        self.fd = fd
        self.interval = interval
        self._lock = threading.Lock()  # one line at a time, and none after close()
        self._pending: tuple | None = None  # (done, total, note, at) not written yet
        self._next_at = 0.0  # monotonic: no line before then
        self._timer: threading.Timer | None = None  # writes _pending at _next_at
        self._closed = False

    def __call__(self, job_id: int, attempt: int, done: float, total: float | None, note: str | None,
                 at: float) -> None:
        with self._lock:
            if self._closed:
                return
            now = time.monotonic()
            if self._timer is None and now >= self._next_at:
                self._write((done, total, note, at))
                self._next_at = now + self.interval
                return
            self._pending = (done, total, note, at)
            if self._timer is None:
                self._timer = threading.Timer(self._next_at - now, self._due)
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        """Before the report: what waits is written now, and nothing after."""
        with self._lock:
            if self._pending is not None and not self._closed:
                self._write(self._pending)
            self._closed, self._pending = True, None

    def _due(self) -> None:
        with self._lock:
            self._timer = None
            if self._pending is None or self._closed:
                return
            self._write(self._pending)
            self._pending = None
            self._next_at = time.monotonic() + self.interval

    def _write(self, value: tuple) -> None:
        line = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")
        try:
            os.write(self.fd, line + b"\n")
        except OSError:  # the daemon's end is gone: the job goes on, its progress unseen
            pass
