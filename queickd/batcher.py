"""Group commit for the enqueue path.

Every connection hands its validated jobs to one committer thread. While a transaction is
being written, newly arriving jobs from all connections gather; the next transaction takes
them all (up to max_batch). A job's ack is released only after the transaction holding it
has committed, so durability costs one fsync per batch, not one per job.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from .job import NewJob, Submitted
from .protocol import Code, QueueError
from .store import Store

log = logging.getLogger("queickd.batcher")

Done = Callable[[list[Submitted] | BaseException], None]
DEFAULT_MAX_BATCH = 4096


class SubmitBatcher:
    def __init__(
        self,
        store: Store,
        on_committed: Callable[[list[NewJob], list[Submitted]], None] = lambda jobs, subs: None,
        *,
        clock: Callable[[], float] = time.time,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self.store = store
        self._on_committed = on_committed
        self._clock = clock
        self._max_batch = max_batch
        self._q: queue.SimpleQueue[tuple[Sequence[NewJob], Done] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.commits = 0  # transactions written; with `jobs`, shows the batching at work
        self.jobs = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="queickd-committer", daemon=True)
            self._thread.start()

    def submit(self, jobs: Sequence[NewJob], done: Done) -> None:
        """Queue jobs for the next commit. `done` is called once, from the committer thread,
        with the Submitted list (input order) or the exception that kept them out."""
        if self._closed:
            done(QueueError(Code.INTERNAL, "the daemon is shutting down"))
            return
        self._q.put((jobs, done))

    def stop(self) -> None:
        """Commit what is already queued, then stop. Idempotent; safe before start()."""
        self._closed = True
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()

    def _loop(self) -> None:
        stop = False
        while not stop:
            item = self._q.get()
            if item is None:
                break
            batch = [item]
            size = len(item[0])
            while size < self._max_batch:
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
                size += len(item[0])
            self._commit(batch)
        # Anything that raced in after stop was decided: refuse it explicitly.
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[1](QueueError(Code.INTERNAL, "the daemon is shutting down"))

    def _commit(self, batch: list[tuple[Sequence[NewJob], Done]]) -> None:
        jobs = [j for specs, _ in batch for j in specs]
        try:
            submitted = self.store.submit(jobs, self._clock())
        except Exception as e:
            log.exception("could not store %d job(s); none was acknowledged", len(jobs))
            err = QueueError(Code.INTERNAL, f"the store failed: {e}")
            for _, done in batch:
                done(err)
            return
        self.commits += 1
        self.jobs += len(jobs)
        i = 0
        for specs, done in batch:
            done(submitted[i : i + len(specs)])
            i += len(specs)
        self._on_committed(jobs, submitted)
