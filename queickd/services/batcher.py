"""Group commit for the enqueue path.

Every connection hands its validated requests to one committer thread. While a
transaction is being written, newly arriving requests from all connections gather; the
next transaction takes them all (up to max_batch jobs). Admission (caps, conflicts) is
decided per request inside that transaction. An ack is released only after the
transaction holding it has committed, so durability costs one fsync per batch, not one
per job.

A small request that finds nothing committing and nothing waiting may be committed by
its submitter's own thread (`inline=True`): a lone client then pays no thread hand-off
on its way to the disk and back. Order is kept: an inline commit never overtakes a
request that was queued before it, and nothing queued commits beside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ..core.job import NewJob, Submitted
from ..core.policy.admission import NO_LIMITS, Admission, Refusal
from ..core.protocol import Code, QueueError
from ..store import Store

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
        self._pending: deque[tuple[Requests, Done]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._committing = False  # a transaction is being written (by either path)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.commits = 0  # transactions written; with `jobs`, shows the batching at work
        self.jobs = 0  # jobs stored (duplicates not counted)
        self.refused = 0  # requests refused by admission

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="queickd-committer", daemon=True)
            self._thread.start()

    def submit(self, requests: Requests, done: Done, *, inline: bool = False) -> None:
        """Queue requests (each a list of jobs, admitted all or nothing) for the next commit.
        `done` is called once with one answer per request (its Submitted list, or its
        Refusal), or with the exception that kept them all out: from the committer thread,
        or, with `inline` and an idle committer, from this thread before submit returns."""
        with self._cond:
            closed = self._closed
            if not closed:
                if not (inline and not self._committing and not self._pending):
                    self._pending.append((requests, done))
                    self._cond.notify()
                    return
                self._committing = True
        if closed:
            done(QueueError(Code.INTERNAL, "the daemon is shutting down"))
            return
        try:
            self._commit([(requests, done)])
        finally:
            with self._cond:
                self._committing = False
                self._cond.notify()

    def stop(self) -> None:
        """Commit what is already queued, then stop. Idempotent; safe before start()."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        else:
            self._refuse_pending()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._committing or not self._pending:
                    if self._closed and not self._pending:
                        return
                    self._cond.wait()
                batch = [self._pending.popleft()]
                size = sum(len(r) for r in batch[0][0])
                while self._pending and size < self._max_batch:
                    item = self._pending.popleft()
                    batch.append(item)
                    size += sum(len(r) for r in item[0])
                self._committing = True
            try:
                self._commit(batch)
            finally:
                with self._cond:
                    self._committing = False

    def _refuse_pending(self) -> None:
        with self._cond:
            left, self._pending = list(self._pending), deque()
        for _, done in left:
            done(QueueError(Code.INTERNAL, "the daemon is shutting down"))

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
            err = QueueError(Code.INTERNAL, f"the store failed: {e}")
            err.maybe_committed = True  # type: ignore[attr-defined] # it may have raised at or after COMMIT
            batch[0][1](err)
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
