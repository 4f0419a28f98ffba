"""The worker pool: claims queued jobs for free worker threads and records how they ended.

The pool's store calls happen in passes, one at a time under a lock: a pass applies the
finished outcomes in one batch, then claims at most as many jobs as there are free
workers (never more, so a job is never held in memory waiting for a thread). The
dispatcher thread runs a pass when woken (a new job, a promotion, the safety sweep); it
never polls. A thread that has just made work possible runs the pass itself when none is
running: the thread that committed a submit, and a worker whose job has ended, which then
takes its next job without waking anyone. A fixed set of worker threads, fed through one
queue, run the jobs through a runner (run.base.Runner; the in-thread one by default) and
leave the outcome to core.fate."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from ..core import fate
from ..core.job import Job, Outcome, State
from ..run.base import Runner
from ..run.loader import FunctionLoader
from ..run.thread import ThreadRunner
from ..store import Store
from ..store.base import Finished

log = logging.getLogger("queickd.worker")

DEFAULT_WORKERS = 4
DEFAULT_SWEEP = 60.0  # seconds between safety sweeps when nothing wakes the pool
_STORE_RETRY = 1.0  # seconds to wait after a store error before trying again


class WorkerPool:
    def __init__(
        self,
        store: Store,
        loader: FunctionLoader,
        workers: int = DEFAULT_WORKERS,
        *,
        clock: Callable[[], float] = time.time,
        sweep: float = DEFAULT_SWEEP,
        network_checker: Callable[[], bool] = lambda: False,
        network_up: Callable[[], bool] = lambda: True,
        on_finished: Callable[[list[Outcome]], None] = lambda outcomes: None,
        on_claimed: Callable[[list[Job]], None] = lambda jobs: None,
        pause_after: int | None = None,
        on_ran: Callable[[Job, Outcome, float], None] | None = None,
        pools: list[str] | None = None,
        runner: Runner | None = None,
    ) -> None:
        if workers < 0:
            raise ValueError("workers must be 0 or more")
        self.store = store
        self.loader = loader
        self.runner: Runner = runner if runner is not None else ThreadRunner(loader)  # runs each job
        self.workers = workers
        self._clock = clock
        self._sweep = sweep
        self._network_checker = network_checker  # is a checker there to release parked jobs?
        self._network_up = network_up  # may jobs that need the network start now?
        self._on_finished = on_finished
        self._on_claimed = on_claimed
        self._pause_after = pause_after
        self._on_ran = on_ran  # (job, outcome, seconds) from the worker thread: metrics
        self.pools = pools  # the worker pools whose jobs it runs; None: every pool
        # Set by anyone who may have made work available or freed a worker; cleared only
        # by the dispatcher before it looks, so no wake-up is lost.
        self._wake = threading.Event()
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._busy = 0  # claimed and not yet finished; written under _dispatch_lock only
        self._dispatch_lock = threading.Lock()  # one pass at a time, whichever thread runs it
        self._unapplied: list[Outcome] = []  # outcomes taken but not yet stored
        self._stopping = False
        self._idle = threading.Event()  # set when stopping and nothing is running
        self._thread: threading.Thread | None = None
        # Claimed jobs for the worker threads; None tells one thread to exit. Plain threads
        # on a SimpleQueue: a ThreadPoolExecutor's Future per job costs more than a no-op job.
        self._runq: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.completed = 0  # counters written by the dispatcher only
        self.failed = 0

    @property
    def busy(self) -> int:
        """Approximate: read without a lock from another thread."""
        return self._busy

    def start(self) -> None:
        if self._thread is not None:
            return
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"queickd-job-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._thread = threading.Thread(target=self._loop, name="queickd-dispatcher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Tell the dispatcher that work may be available. Cheap; call from any thread.

        Skipped while every worker is busy: a worker that finishes wakes the dispatcher
        itself, and the dispatcher claims after applying outcomes in the same pass."""
        if self._busy < self.workers or self._stopping:
            self._wake.set()

    def stop_claiming(self) -> None:
        """Claim nothing more from now on; running jobs go on. Idempotent."""
        self._stopping = True
        self._wake.set()

    def stop(self, timeout: float) -> bool:
        """Stop claiming; wait up to `timeout` s for running jobs. True if all finished.

        Jobs still running at the timeout stay `running` in the store; the next start
        recovers them as orphans. Idempotent, and safe before start().
        """
        if self._thread is None:
            return True
        self.stop_claiming()
        finished = self._idle.wait(timeout)
        self._thread.join(1.0 if finished else 0.1)
        for _ in self._threads:  # threads still in a job exit when it ends
            self._runq.put(None)
        return finished

    # --- dispatching --------------------------------------------------------------------------
    def dispatch_now(self) -> None:
        """Like wake(), but when the dispatcher is idle, do its pass in this thread.

        For the thread that has just committed a job: the job then starts without first
        waking the dispatcher, one thread hand-off fewer between an ack and the start. A
        pass that fails here is left to the dispatcher, which retries it."""
        if self._busy >= self.workers or self._stopping or self._thread is None:
            self.wake()
            return
        self._pass_here("after a commit")

    def _pass_here(self, after: str) -> None:
        """Do the dispatcher's pass in this thread if no pass is running; else make sure the
        running one is followed by another. A pass that fails here is left to the dispatcher."""
        if not self._dispatch_lock.acquire(blocking=False):
            self._wake.set()  # a pass is running: the dispatcher will look again after it
            return
        try:
            self._wake.clear()
            self._pass()
        except Exception:
            log.warning("dispatch %s failed; the dispatcher retries", after, exc_info=True)
            self._wake.set()
        finally:
            self._dispatch_lock.release()

    def _loop(self) -> None:
        while True:
            self._wake.wait()  # the scheduler's safety sweep wakes us too: no timer of our own
            with self._dispatch_lock:
                self._wake.clear()
                try:
                    if self._pass():
                        return
                except Exception:
                    log.exception("store error in the dispatcher; retrying in %.0f s", _STORE_RETRY)
                    self._unapplied = self._isolate(self._unapplied)
                    failed = True
                else:
                    failed = False
            if failed:
                time.sleep(_STORE_RETRY)
                self._wake.set()

    def _pass(self) -> bool:
        """Apply finished outcomes and claim for the free workers, in one transaction; what
        it changed in memory (busy count, submitted jobs) happens only once it has committed.
        Holds _dispatch_lock. True once stopping and nothing runs any more."""
        unapplied = self._unapplied
        while True:
            try:
                unapplied.append(self._done.get_nowait())
            except queue.Empty:
                break
        report = None
        claimed: list[Job] = []
        with self.store.batch(bookkeeping=True):
            if unapplied:
                report = self.store.finish_if_running(unapplied, self._clock(), self._pause_after)
            free = self.workers - self._busy + len(unapplied)
            if free > 0 and not self._stopping:
                claimed = self.store.claim_available(free, self._clock(), self._network_up(),
                                                     pools=self.pools)
        if unapplied:
            self._busy -= len(unapplied)
            finished, self._unapplied = unapplied, []
            self._after_finish(finished, report)
        for job in claimed:
            self._busy += 1
            self._runq.put(job)
        if claimed:
            self._on_claimed(claimed)
        if self._stopping and self._busy == 0:
            self._idle.set()
            return True
        return False

    def _isolate(self, outcomes: list[Outcome]) -> list[Outcome]:
        """After a failed batch: apply outcomes one by one, so that one the store cannot take
        (a bug, bad data) cannot hold up the others; such a one is recorded as dead with a
        plain error. Returns those that still failed (the store itself is in trouble)."""
        left: list[Outcome] = []
        for o in outcomes:
            for attempt in (o, Outcome.dead(o.job_id, {"type": "unstorable_outcome",
                                                       "message": "the job's outcome could not be stored"},
                                            o.workflow_run)):
                try:
                    report = self.store.finish_if_running([attempt], self._clock(), self._pause_after)
                except Exception:
                    continue
                self._busy -= 1
                self._after_finish([attempt], report)
                break
            else:
                left.append(o)
        return left

    def _after_finish(self, finished: list[Outcome], report: Finished | None) -> None:
        for p in report.paused if report else ():
            err = p.last_error or {}
            log.warning("%s %s paused after %d failed runs in a row (last: %s: %s); its jobs wait "
                        "until 'queick resume' or a manual run", p.kind, p.name, p.failures,
                        err.get("type"), err.get("message"))
        ok = sum(1 for o in finished if o.state == State.SUCCEEDED)
        self.completed += ok
        self.failed += len(finished) - ok
        self._on_finished(finished)

    # --- worker threads ---------------------------------------------------------------------
    def _work(self) -> None:
        while (job := self._runq.get()) is not None:
            self._run(job)

    def _run(self, job: Job) -> None:
        try:
            report = self.runner.run(job)
            runtime = report.runtime
            if report.ok:  # the clock and the checker are read on failure only
                outcome = fate.after_success(job, report)
            else:
                outcome = fate.after_failure(job, report, self._clock(), self._network_checker())
        except BaseException as e:  # deciding itself failed: the job must still leave `running`
            runtime = 0.0
            outcome = Outcome.dead(job.id, {"type": type(e).__name__,
                                            "message": "queickd could not record this job's outcome"},
                                   job.workflow_run)
        if outcome.state != State.SUCCEEDED:
            log.info(
                "job %d %s failed (attempt %d/%d): %s: %s -> %s", job.id, job.func, job.attempts,
                job.max_attempts, outcome.error["type"], outcome.error["message"], outcome.state,
            )
        if self._on_ran is not None:
            try:
                self._on_ran(job, outcome, runtime)
            except Exception:  # counting must never keep an outcome from being recorded
                log.exception("error counting job %d", job.id)
        self._done.put(outcome)
        if self._stopping:
            self._wake.set()  # the dispatcher sees the pool idle and ends
        else:
            # The worker that has just finished records its outcome and claims the next job
            # itself: no wake-up of the dispatcher and hand-off back per job.
            self._pass_here("after a run")
