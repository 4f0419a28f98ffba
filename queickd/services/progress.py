"""The progress writer: what running jobs say of their progress (queickd.progress), stored
on their jobs in batches, at most once every INTERVAL seconds for all of them.

`offer` takes the latest value of one job; a later value replaces one not yet written, so a
job that reports very often costs a dict store per change and a few rows a second. Its one
thread, started with the first offer, writes each batch with one statement
(set_progress_if_running: a job no longer running that attempt is left alone) and sleeps
while nothing waits. A run's value still waiting when it ends is the worker pool's to
write, with its outcome (`take`). A failed write is dropped (the next value replaces it)
and logged once until a write succeeds again; it never decides anything about a job.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..store.contract.queue import Queue

log = logging.getLogger("queickd.progress")

INTERVAL = 0.25  # seconds between two writes: at most four a second, whatever the jobs say


def record(attempt: int, done: float, total: float | None, note: str | None, at: float) -> dict[str, Any]:
    """A job's `progress` as it is stored and shown."""
    return {"done": done, "total": total, "note": note, "at": at, "attempt": attempt}


class ProgressWriter:
    """Any thread may offer; start() is implicit, stop() idempotent and safe before it."""

    def __init__(self, store: Queue, interval: float = INTERVAL) -> None:
        self.store = store
        self.interval = interval
        self.offered = 0  # values handed over by jobs (each a change: jobs drop repeats)
        self.written = 0  # rows the store changed (those taken by a pass: rows it was given)
        self.batches = 0  # write transactions (a pass that wrote some counts as one)
        self._pending: dict[int, tuple[int, dict[str, Any]]] = {}  # job id -> (attempt, progress)
        self._writing: dict[int, tuple[int, dict[str, Any]]] = {}  # the batch being written now
        self._lock = threading.Lock()  # guards _pending and the counts above
        self._wake = threading.Event()  # set by an offer into an empty _pending, and by stop()
        self._stopping = False
        self._stopped = threading.Event()  # ends the wait between two writes at a stop
        self._thread: threading.Thread | None = None
        self._failing = False  # the last write failed (written by the writing thread only)

    def offer(self, job_id: int, attempt: int, done: float, total: float | None, note: str | None,
              at: float) -> None:
        """The job's latest progress (context.ProgressSink). Never blocks on the store."""
        with self._lock:
            first = not self._pending
            self._pending[job_id] = (attempt, record(attempt, done, total, note, at))
            self.offered += 1
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="queickd-progress", daemon=True)
                self._thread.start()
        if first:
            self._wake.set()

    def waiting(self, job_ids: list[int]) -> bool:
        """Has any of these jobs a value not written yet? A look without the lock: an
        answer that is stale by one offer only moves that value to the next write."""
        pending, writing = self._pending, self._writing
        return any(j in pending or j in writing for j in job_ids)

    def take(self, job_ids: list[int]) -> list[tuple[int, int, dict[str, Any]]]:
        """The values not written yet of these jobs, whose runs have ended: the worker
        pool's pass writes them in the transaction that stores their outcomes, just before
        (the jobs still running then), so a finished job keeps the last progress it said.
        A job with no newer value than the one the writer thread is writing gets that one
        again: that write may come after the outcome, where it does nothing."""
        with self._lock:
            pending, writing = self._pending, self._writing
            taken = [(j, *(pending.pop(j) if j in pending else writing[j])) for j in job_ids
                     if j in pending or j in writing]
            if taken:  # counted as written: the pass's transaction rarely fails
                self.written += len(taken)
                self.batches += 1
        return taken

    def stop(self) -> None:
        """Write what waits, then end the thread. Idempotent; safe before any offer."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._stopped.set()
        self._wake.set()
        if thread is not None:
            thread.join()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"offered": self.offered, "written": self.written, "batches": self.batches}

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                batch, self._pending = self._pending, {}
                self._writing = batch
                stopping = self._stopping
            if batch:
                self._write(batch)
                with self._lock:
                    self._writing = {}
            if stopping:
                return
            if batch:  # the next batch waits: values that come meanwhile replace each other
                self._stopped.wait(self.interval)

    def _write(self, batch: dict[int, tuple[int, dict[str, Any]]]) -> None:
        try:
            n = self.store.set_progress_if_running([(job_id, a, p) for job_id, (a, p) in batch.items()])
        except Exception as e:  # the store in trouble: this progress is lost, the next comes
            if not self._failing:
                log.warning("cannot store the progress of %d job(s): %s; dropped until a write succeeds",
                            len(batch), e)
            self._failing = True
            return
        if self._failing:
            log.info("storing jobs' progress again")
            self._failing = False
        with self._lock:
            self.written += n
            self.batches += 1
