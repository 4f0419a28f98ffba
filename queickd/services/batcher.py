"""Group commit for the enqueue path.

Every connection hands its validated requests to one committer thread. While a
transaction is being written, newly arriving requests from all connections gather; the
next transaction takes them all (up to max_batch jobs). Admission (caps, conflicts) is
decided per request inside that transaction. An ack is released only after the
transaction holding it has committed and been flushed to disk (store.flush()), so
durability costs one fsync per batch, not one per job. Jobs claimed in the submit's own
transaction start before that flush: the ack, not the start, waits for durability.

A small request that finds nothing committing and nothing waiting may be committed by
its submitter's own thread (`inline=True`): a lone client then pays no thread hand-off
on its way to the disk and back. Order is kept: an inline commit never overtakes a
request that was queued before it, and nothing queued commits beside it.

An event loop serving many connections must not commit their requests one by one on its
own thread: while it writes one, it reads nothing, so the others cannot gather. `Gather`
collects what one pass of the loop submitted and hands it over as one submission when the
pass ends; only a pass that brought a single small submission commits inline.

Clients that wait for each ack come back right after a shared commit, a moment after the
committer has started the next one with whoever arrived first; they would split into two
cohorts taking turns, each commit holding half of them. So after a commit of several
submissions, with fewer waiting than it held, the committer waits a little (at most half a
commit, and max_linger) for the rest, when commits take long enough (a disk flush) for
that to pay. Nothing waits after a lone commit, and nothing waits for more than the next
commit after its arrival.

This module owns batching and acks; it never decides admission (the store applies the
admission plan) and never touches a socket.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from ..core.job import NewJob, State, Submitted
from ..core.policy.admission import NO_LIMITS, Admission, Refusal
from ..core.protocol import Code, QueueError
from ..store import Store
from ..store.contract.capabilities import ClaimsInSubmit
from ..store.contract.transaction import Transaction
from ..store.records import NotDurableError

log = logging.getLogger("queickd.batcher")

Answer = list[Submitted] | Refusal
Done = Callable[[list[Answer] | BaseException], None]
Requests = Sequence[Sequence[NewJob]]




class Dispatch(Protocol):
    """The worker pool, as the committer sees it: jobs it has just stored may start."""

    def dispatch_now(self) -> None: ...

    def pass_inside(self, tx: Transaction) -> Callable[[bool], None] | None: ...

    def dispatch_left(self) -> None: ...


class SubmitAll(Protocol):
    """SubmitBatcher.submit_all's shape: what a Gather hands each pass to."""

    def __call__(self, items: Sequence[tuple[Requests, Done]], *, inline: bool = ...) -> None: ...


DEFAULT_MAX_BATCH = 4096
DEFAULT_MAX_LINGER = 0.002  # seconds the committer may wait for acked clients to come back
# A commit shorter than this wrote no disk flush (SQLite at normal durability, memory://)
# and is over before an acked client is back: no linger after it. A commit that flushed to
# disk (an SSD's or an SD card's) takes longer, and lingering then lets clients join the next.
_LINGER_FROM = 0.0003


class SubmitBatcher:
    def __init__(
        self,
        store: Store,
        on_committed: Callable[[list[NewJob], list[Submitted]], None] = lambda jobs, subs: None,
        *,
        clock: Callable[[], float] = time.time,
        max_batch: int = DEFAULT_MAX_BATCH,
        admission: Admission = NO_LIMITS,
        max_linger: float = DEFAULT_MAX_LINGER,
        dispatch: Dispatch | None = None,
    ) -> None:
        self.store = store
        self._dispatch = dispatch  # told of stored jobs that may start; None: nobody runs them here
        # Claim in the submit's own transaction where one writer serves both (a commit less per job).
        self._claim_inside = store if dispatch is not None and isinstance(store, ClaimsInSubmit) else None
        self.admission = admission
        self._on_committed = on_committed
        self._clock = clock
        self._max_batch = max_batch
        self._max_linger = max_linger
        self._pending: deque[tuple[Requests, Done]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._committing = False  # a transaction is being written (by either path)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last_size = 0  # submissions in the last commit, and how long it took
        self._last_seconds = 0.0
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
        self.submit_all([(requests, done)], inline=inline)

    def submit_all(self, items: Sequence[tuple[Requests, Done]], *, inline: bool = False) -> None:
        """submit() for several submissions at once: they join the same commit (unless
        max_batch splits them), each `done` answered as submit() says."""
        with self._cond:
            closed = self._closed
            if not closed:
                if not (inline and not self._committing and not self._pending):
                    self._pending.extend(items)
                    self._cond.notify()
                    return
                self._committing = True
        if closed:
            for _, done in items:
                done(QueueError(Code.INTERNAL, "the daemon is shutting down"))
            return
        try:
            self._commit(list(items))
        finally:
            with self._cond:
                self._committing = False
                if self._pending:  # they waited for this commit; with none, a wake-up would be for nothing
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
                self._linger()
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

    def _linger(self) -> None:
        """After a commit shared by several submitters, those just acked are likely on their
        way back: wait a little (at most half that commit's duration, and max_linger) for
        as many submissions as it held, so the clients do not split into two cohorts that
        take turns. Never after a lone commit: a lone client does not wait. Holds _cond."""
        want = self._last_size
        if want < 2 or len(self._pending) >= want or self._last_seconds < _LINGER_FROM:
            return
        until = time.monotonic() + min(self._max_linger, self._last_seconds / 2)
        while len(self._pending) < want and not self._closed:
            left = until - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _refuse_pending(self) -> None:
        with self._cond:
            left, self._pending = list(self._pending), deque()
        for _, done in left:
            done(QueueError(Code.INTERNAL, "the daemon is shutting down"))

    def _commit(self, batch: list[tuple[Requests, Done]]) -> None:
        t0 = time.monotonic()
        try:
            self._commit_batch(batch)
        except Exception:  # a bug after the commit must not end the committer thread
            log.exception("error after a commit; the committer goes on")
        self._last_size, self._last_seconds = len(batch), time.monotonic() - t0

    def _commit_batch(self, batch: list[tuple[Requests, Done]]) -> None:
        requests = [r for reqs, _ in batch for r in reqs]
        try:
            answers, ended = self._store(requests)
        except Exception as e:
            if isinstance(e, self.store.NOT_WRITTEN):
                # Refused before anything was written (a full disk): so is every other request
                # of the group, and each submitter may send it again as it is.
                log.warning("a commit was refused before it began (%s); its requests were not stored", e)
                self._answer(batch, [], QueueError(Code.INTERNAL, str(e)))
                return
            if self._perhaps_committed(e):
                # Committed perhaps (not flushed; or the connection lost at or after COMMIT):
                # committing the requests again one by one could store each twice. Every one
                # of them may have been stored.
                log.warning("a commit's outcome is unknown (%s); its requests may have been stored", e)
                self._answer(batch, [], _perhaps_stored(e))
                return
            if len(batch) > 1 or len(requests) > 1:
                # One bad request must not fail the others that shared its transaction.
                log.warning("a group commit failed (%s); committing its requests one by one", e)
                for reqs, done in batch:
                    self._commit_each(reqs, done)
                return
            log.exception("could not store a request; it was not acknowledged")
            # It may have raised at or after COMMIT.
            batch[0][1](QueueError(Code.INTERNAL, f"the store failed: {e}", maybe_committed=True))
            return
        if ended is not None:
            # The jobs claimed with the submit start while the disk flushes it: the ack,
            # not the start, waits for durability (store/sqlite/flush.py says what that risks).
            try:
                ended(True)
            except Exception:
                log.exception("error starting the jobs just stored; the pool's sweep starts them")
        unflushed = None
        try:
            self.store.flush()
        except Exception as e:
            log.exception("could not flush a commit to disk; its requests were not acknowledged")
            unflushed = _perhaps_stored(e)
        self._finish(batch, requests, answers, started=ended is not None,
                     passed=ended not in (None, _asked_elsewhere), unflushed=unflushed)

    def _store(self, requests: list[Sequence[NewJob]]) -> tuple[list[Answer], Callable[[bool], None] | None]:
        """Submit the requests in one transaction; where the store allows it, the pool's pass
        (the claim of what has just been stored) is made in that same transaction. Returns
        the answers and what ends that pass (None: no pass was made in it), the commit
        visible but perhaps not yet flushed: the caller ends the pass, then flushes.
        A pass that fails costs nothing but itself: the requests are submitted again
        without it."""
        one_writer = self._claim_inside
        if one_writer is None:
            return self.store.submit_requests(requests, self._clock(), self.admission), None
        assert self._dispatch is not None
        ended: Callable[[bool], None] | None = None
        in_pass = False
        try:
            with one_writer.claiming_transaction() as tx:
                answers = tx.submit_requests(requests, self._clock(), self.admission)
                if _any_queued(answers):
                    in_pass = True
                    # None: the pool asked for its pass elsewhere; nothing is left to do here.
                    ended = self._dispatch.pass_inside(tx) or _asked_elsewhere
                    in_pass = False
        except Exception:
            if ended is not None:
                ended(False)
            if not in_pass:
                raise
            log.warning("the claim made with a submit failed; submitting without it", exc_info=True)
            return self.store.submit_requests(requests, self._clock(), self.admission), None
        return answers, ended

    def _finish(self, batch: list[tuple[Requests, Done]], requests: list[Sequence[NewJob]],
                answers: list[Answer], started: bool = False, passed: bool = False,
                unflushed: QueueError | None = None) -> None:
        """Answer each submitter of a durable commit (`unflushed`: of a commit the disk
        failed to flush, with that error), tell the daemon what was stored, then, unless
        they were `started` already, ask the pool to start the stored jobs (`passed`: the
        pool's pass was made in the commit, and may have left work: the outcomes of jobs
        that ended before these acks wait for it)."""
        try:
            self._answer(batch, answers, unflushed)
        finally:
            if passed:
                try:
                    self._dispatch.dispatch_left()  # type: ignore[union-attr] # passed: there is a pool
                except Exception:
                    log.exception("error storing the outcomes left to a submit; the pool's sweep stores them")
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
        try:
            if not started and self._dispatch is not None and _any_queued([submitted]):
                self._dispatch.dispatch_now()  # the committing thread claims: one hand-off fewer
        except Exception:
            log.exception("error starting the jobs just stored; the pool's sweep starts them")

    def _answer(self, batch: list[tuple[Requests, Done]], answers: list[Answer],
                unflushed: QueueError | None) -> None:
        """Answer each submitter its share of `answers`, or every one `unflushed` (an error)."""
        self.commits += 1
        i = 0
        for reqs, done in batch:
            done(unflushed if unflushed is not None else answers[i : i + len(reqs)])
            i += len(reqs)

    def _perhaps_committed(self, e: Exception) -> bool:
        """Whether a failed submit may have been committed all the same: its flush failed,
        or the store was unavailable (PostgreSQL: the connection lost, perhaps after its
        COMMIT took effect). Not bad data, which no retry of the others would meet."""
        return isinstance(e, NotDurableError) or isinstance(e, self.store.UNAVAILABLE)

    def _commit_each(self, reqs: Requests, done: Done) -> None:
        answers: list[Answer] = []
        for r in reqs:
            try:
                answers.append(self.store.submit_requests([r], self._clock(), self.admission)[0])
            except Exception as e:
                if isinstance(e, self.store.NOT_WRITTEN):  # neither is any other of this submitter's
                    self._answer([(reqs, done)], [], QueueError(Code.INTERNAL, str(e)))
                    return
                if self._perhaps_committed(e):
                    # This one may be committed, and the store is in trouble: the rest are not
                    # tried, and every request of this submitter may have been stored.
                    self._finish([(reqs, done)], list(reqs[:len(answers)]), answers, unflushed=_perhaps_stored(e))
                    return
                log.warning("request refused by the store: %s", e)
                answers.append(Refusal(Code.BAD_REQUEST, f"the store could not take this request: {e}"))
        self._finish([(reqs, done)], list(reqs), answers)


def _perhaps_stored(e: Exception) -> QueueError:
    """The answer to requests that may have been committed, perhaps not durably."""
    what = "could not make the jobs durable" if isinstance(e, NotDurableError) else "failed; they may have been stored"
    return QueueError(Code.INTERNAL, f"the store {what}: {e}", maybe_committed=True)  # visible, perhaps not on disk


def _asked_elsewhere(committed: bool) -> None:
    """The end of a pass the pool made elsewhere (see SubmitBatcher._store)."""


def _any_queued(answers: Sequence[Answer]) -> bool:
    """Whether a commit stored a new job that may start now."""
    return any(s.state == State.QUEUED and not s.duplicate
               for a in answers if not isinstance(a, Refusal) for s in a)


class Gather:
    """The submissions one thread makes during one pass of its event loop, handed to the
    batcher together when the pass ends. `schedule(fn)` must run fn on the same thread
    after the pass (asyncio: loop.call_soon, which runs after every read of the pass).
    `pass_has_more()`, if given, tells whether anything else is still to run in this pass:
    if not, the first submission is the pass's only one and is handed over at once.
    Not thread-safe: one per event loop."""

    def __init__(self, submit_all: SubmitAll, schedule: Callable[[Callable[[], None]], object],
                 inline_max: int = 8, pass_has_more: Callable[[], bool] | None = None) -> None:
        self._submit_all = submit_all  # SubmitBatcher.submit_all, or the service's door to it
        self._schedule = schedule
        self._inline_max = inline_max
        self._pass_has_more = pass_has_more
        self._items: list[tuple[Requests, Done]] = []

    def submit(self, requests: Requests, done: Done) -> None:
        self._items.append((requests, done))
        if len(self._items) == 1:
            if self._pass_has_more is not None and not self._pass_has_more():
                # Nothing else is left in this pass, so no other submission can join it: the
                # flush runs now, not in a pass of its own (a poll and a loop turn a request).
                self._flush()
            else:
                self._schedule(self._flush)

    def _flush(self) -> None:
        items, self._items = self._items, []
        # One small submission in the pass: likely a lone client, whose ack should not pay a
        # thread hand-off. Several: the loop stays free to read while the committer writes.
        inline = len(items) == 1 and sum(len(r) for r in items[0][0]) <= self._inline_max
        self._submit_all(items, inline=inline)
