"""Group commit for the enqueue path.

Every connection hands its validated requests to one committer thread. While a
transaction is being written, newly arriving requests from all connections gather; the
next transaction takes them all (up to max_batch jobs). Admission (caps, conflicts) is
decided per request inside that transaction. An ack is released only after the
transaction holding it has committed, so durability costs one fsync per batch, not one
per job.
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
from .store.admission import NO_LIMITS, Admission, Refusal

log = logging.getLogger("queickd.batcher")

Answer = list[Submitted] | Refusal
Done = Callable[[list[Answer] | BaseException], None]
Requests = Sequence[Sequence[NewJob]]
DEFAULT_MAX_BATCH = 4096


class SubmitBatcher:
    def __init__(
        self,
        store: Store,
        on_committed: Callable[[list[NewJob], list[Submitted]], None] = lambda jobs, subs: None,
        *,
        clock: Callable[[], float] = time.time,
        max_batch: int = DEFAULT_MAX_BATCH,
        admission: Admission = NO_LIMITS,
    ) -> None:
        self.store = store
        self.admission = admission
        self._on_committed = on_committed
        self._clock = clock
        self._max_batch = max_batch
        self._q: queue.SimpleQueue[tuple[Requests, Done] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.commits = 0  # transactions written; with `jobs`, shows the batching at work
        self.jobs = 0  # jobs stored (duplicates not counted)
        self.refused = 0  # requests refused by admission

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="queickd-committer", daemon=True)
            self._thread.start()

    def submit(self, requests: Requests, done: Done) -> None:
        """Queue requests (each a list of jobs, admitted all or nothing) for the next commit.
        `done` is called once, from the committer thread, with one answer per request (its
        Submitted list, or its Refusal), or with the exception that kept them all out."""
        if self._closed:
            done(QueueError(Code.INTERNAL, "the daemon is shutting down"))
            return
        self._q.put((requests, done))

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
            size = sum(len(r) for r in item[0])
            while size < self._max_batch:
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
                size += sum(len(r) for r in item[0])
            self._commit(batch)
        # Anything that raced in after stop was decided: refuse it explicitly.
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[1](QueueError(Code.INTERNAL, "the daemon is shutting down"))

    def _commit(self, batch: list[tuple[Requests, Done]]) -> None:
        try:
            self._commit_batch(batch)
        except Exception:  # a bug after the commit must not end the committer thread
            log.exception("error after a commit; the committer goes on")

    def _commit_batch(self, batch: list[tuple[Requests, Done]]) -> None:
        requests = [r for reqs, _ in batch for r in reqs]
        try:
            answers = self.store.submit_requests(requests, self._clock(), self.admission)
        except Exception as e:
            if len(batch) > 1 or len(requests) > 1:
                # One bad request must not fail the others that shared its transaction.
                log.warning("a group commit failed (%s); committing its requests one by one", e)
                for reqs, done in batch:
                    self._commit_each(reqs, done)
                return
            log.exception("could not store a request; it was not acknowledged")
            batch[0][1](QueueError(Code.INTERNAL, f"the store failed: {e}"))
            return
        self._finish(batch, requests, answers)

    def _finish(self, batch: list[tuple[Requests, Done]], requests: list[Sequence[NewJob]],
                answers: list[Answer]) -> None:
        """Answer each submitter, then tell the daemon what was stored."""
        self.commits += 1
        i = 0
        for reqs, done in batch:
            done(answers[i : i + len(reqs)])
            i += len(reqs)
        jobs: list[NewJob] = []
        submitted: list[Submitted] = []
        for r, a in zip(requests, answers, strict=True):
            if isinstance(a, Refusal):
                self.refused += 1
            else:
                jobs.extend(r)
                submitted.extend(a)
        self.jobs += sum(1 for s in submitted if not s.duplicate)
        try:
            self._on_committed(jobs, submitted)
        except Exception:
            log.exception("error in the post-commit hook; the jobs are stored and acknowledged")

    def _commit_each(self, reqs: Requests, done: Done) -> None:
        answers: list[Answer] = []
        for r in reqs:
            try:
                answers.append(self.store.submit_requests([r], self._clock(), self.admission)[0])
            except Exception as e:
                log.warning("request refused by the store: %s", e)
                answers.append(Refusal(Code.BAD_REQUEST, f"the store could not take this request: {e}"))
        self._finish([(reqs, done)], list(reqs), answers)
