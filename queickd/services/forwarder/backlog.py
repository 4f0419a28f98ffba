"""The held jobs' count and bytes, kept in memory (read from the store at start, grown by
each commit of held jobs, shrunk by each forward), and the cap an enqueue meets."""

from __future__ import annotations

import threading

from ...core.protocol import Code, QueueError

RETRY_AFTER = 60.0  # seconds a refused sender is told to wait: the link's back-off at most


class Backlog:
    def __init__(self, jobs: int, size: int, oldest: float | None, max_jobs: int, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self.jobs, self.bytes, self.oldest = jobs, size, oldest  # oldest: created_at, None when none
        self.max_jobs, self.max_bytes = max_jobs, max_bytes

    def admit(self, jobs: int, size: int) -> None:
        """QueueError(queue_full) if `jobs` more held jobs of `size` bytes would pass a cap.
        Checked before the commit and counted after it, so concurrent enqueues may pass a
        cap by what one group commit holds: never a job dropped, at worst a few more kept."""
        with self._lock:
            if self.jobs + jobs > self.max_jobs or self.bytes + size > self.max_bytes:
                raise QueueError(Code.QUEUE_FULL,
                                 f"the backlog for the upstream is full ({self.jobs} jobs, {self.bytes} bytes held;"
                                 f" caps {self.max_jobs} jobs, {self.max_bytes} bytes): try again later",
                                 retry_after=RETRY_AFTER)

    def added(self, jobs: int, size: int, at: float) -> None:
        with self._lock:
            self.jobs += jobs
            self.bytes += size
            if self.oldest is None:
                self.oldest = at

    def removed(self, jobs: int, size: int, oldest: float | None) -> None:
        """Jobs that left `held` (forwarded or refused); `oldest`: the created_at of the
        oldest still held, None when none is."""
        with self._lock:
            self.jobs, self.bytes = max(0, self.jobs - jobs), max(0, self.bytes - size)
            self.oldest = oldest if self.jobs else None
