"""The worker pool: claims queued jobs for free worker threads and records how they ended.

The pool's store calls happen in passes (passes.py), one at a time under a lock: a pass
applies the finished outcomes in one batch, then claims at most as many jobs as there are free
workers (never more, so a job is never held in memory waiting for a thread). The
dispatcher thread runs a pass when woken (a new job, a promotion, the safety sweep); it
never polls. A thread that has just made work possible runs the pass itself when none is
running: the thread that committed a submit, and a worker whose job has ended, which then
takes its next job without waking anyone. A fixed set of worker threads, fed through one
queue, run the jobs through a runner (run.base.Runner; the in-thread one by default) and
leave the outcome to core.fate. Async jobs run on the runner's event loop instead, up to
`async_jobs` at once, beside the threads (passes.py says how a claim gets them).

Each run is also counted per minute (run_counts.py); a pass writes the counts due in its
own transaction, and the pool writes the rest on stop."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..core.job import Job, Outcome, State
from ..run.base import Runner, RunReport
from ..run.loader import FunctionLoader
from ..run.thread import ThreadRunner
from ..store import Store
from ..store.contract.transaction import Transaction
from . import pool_size
from .job_run import judge, run_job
from .memory_gate import MemoryGate
from .passes import Pass, PassStore
from .pool_config import DEFAULT_CONFIG, NO_HOOKS, PoolConfig, PoolHooks
from .pool_size import PoolSize
from .run_counts import RunCounts
from .step_state import StepState

log = logging.getLogger("queickd.worker")
T = TypeVar("T")

_STORE_RETRY = 1.0  # seconds to wait after a store error before trying again
_MAX_PASSES_HERE = 3  # passes one caller of _pass_here makes in a row before the dispatcher takes over


def member_name() -> str:
    """How this process names itself in the per-minute counts: host:pid, as the fleet shows it."""
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkerPool(PassStore):
    def __init__(
        self,
        store: Store,
        loader: FunctionLoader,
        config: PoolConfig = DEFAULT_CONFIG,
        hooks: PoolHooks = NO_HOOKS,
        *,
        clock: Callable[[], float] = time.time,
        runner: Runner | None = None,
        memory: MemoryGate | None = None,
        size: PoolSize | None = None,
        member: str | None = None,
    ) -> None:
        self.store = store
        self.loader = loader
        self.memory = memory  # which claimed jobs fit in memory; None: all start
        self._set_aside: dict[int, float] = {}  # those jobs (queued): id -> until when; under _dispatch_lock
        self.runner: Runner = runner if runner is not None else ThreadRunner(
            loader, measure=memory.measures_run if memory is not None else None)  # runs each job
        self.size = size if size is not None and size.adaptive else None  # None: a fixed size
        self.workers = self.size.min if self.size is not None else config.workers  # threads now
        self.async_jobs = config.async_jobs  # held jobs that may run on the runner's event loop besides (passes.py)
        self._on_loop: set[int] = set()  # those that do (a subset of _held); under _dispatch_lock
        self._clock = clock
        self.hooks = hooks
        self._pause_after = config.pause_after or None  # 0: the breaker is off
        self._pause_cooldown = config.pause_cooldown
        self.pools = config.pools
        self.limits = config.limits  # cost budgets and their patience, applied by each claim
        self.step_state = StepState(store)  # step jobs stored without the run's state get it as they start
        # Set by anyone who may have made work available or freed a worker; cleared only
        # by the dispatcher before it looks, so no wake-up is lost.
        self._wake = threading.Event()
        # Each run's outcome, with the attempts of the claim it ran under (see _take_outcomes).
        self._done: queue.SimpleQueue[tuple[Outcome, int]] = queue.SimpleQueue()
        self._dispatch_lock = threading.Lock()  # one pass at a time, whichever thread runs it
        self._again = False  # a pass was asked for while one ran: see _pass_here
        # A wake came with every worker busy (see wake); cleared as a pass begins, read once
        # it has freed its slots: it passes again when one is free.
        self._asked_while_full = False
        self._unapplied: list[Outcome] = []  # outcomes taken but not yet stored
        # Ids of the jobs claimed and not yet finished in the store (their count: _busy);
        # written under _dispatch_lock only.
        self._held: dict[int, int] = {}  # jobs claimed and not yet finished: id -> the claim's attempts
        # The held jobs an operator cancelled while they ran: `cancelled` in the store already,
        # their worker busy until the run has really ended. A stop does not wait for them.
        # Changed, with the removals from _held, under _cancel_lock (a subset of _held).
        self._cancelled: set[int] = set()
        self._cancel_lock = threading.Lock()
        # A pass failed with the store unreachable: it may have committed, and the jobs it
        # claimed then run under this process's claims with no thread of ours to run them.
        self._unsure = False
        # A submit that claimed in its own transaction has not yet been acknowledged: a job
        # ending now leaves its outcome to that submit's thread (dispatch_left), which passes
        # once its ack is out, instead of contending with it for the GIL and the writer.
        self._submit_in_flight = False
        self._stopping = False
        self._draining = False  # an operator's drain: claim nothing, let running jobs end
        self._drained = threading.Event()  # set while draining and nothing runs
        self._idle = threading.Event()  # set when stopping and nothing is running
        self._thread: threading.Thread | None = None
        # Claimed jobs for the worker threads; None tells one thread to exit. Plain threads
        # on a SimpleQueue: a ThreadPoolExecutor's Future per job costs more than a no-op job,
        # and a queue that woke one thread per job doubled the context switches under a backlog.
        self._runq: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.completed = 0  # counters written by the dispatcher only
        self.failed = 0
        self.member = member or member_name()
        self.counts = RunCounts(self.member, clock)  # runs per minute, written by the passes

    def report_to(self, hooks: PoolHooks) -> None:
        """Where the pool tells what happens: set by an assembly once the parts the hooks
        reach are built, before start()."""
        self.hooks = hooks

    @property
    def claims(self) -> bool:
        """Whether this pool ever claims: one of no workers that cannot grow never does."""
        return self.workers > 0 or (self.size is not None and self.size.max > 0)

    @property
    def busy(self) -> int:
        """Approximate: read without a lock from another thread."""
        return self._busy

    @property
    def stopping(self) -> int:
        """Jobs held here told to stop (cancelled, timed out) whose run has not ended yet:
        their workers are still taken. Approximate."""
        return len((frozenset(self._cancelled) | self.runner.stopping()) & frozenset(self._held))

    @property
    def cancelled_running(self) -> int:
        """Held jobs an operator cancelled whose run has not ended yet. Approximate."""
        return len(frozenset(self._cancelled) & self.runner.stopping())

    @property
    def running_in_store(self) -> int:
        """Held jobs that are `running` in the store: all but those cancelled. Approximate."""
        return len(frozenset(self._held) - frozenset(self._cancelled))

    def start(self) -> None:
        if self._thread is not None:
            return
        for _ in range(self.workers):
            self._add_thread()
        self._thread = threading.Thread(target=self._loop, name="queickd-dispatcher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Tell the dispatcher that work may be available. Cheap; call from any thread.

        Skipped while every worker is busy: a worker that finishes passes itself, and its
        pass claims after applying outcomes. That pass may be under way already, its claim
        made before this wake's work was stored and its slot freed only after: so the wake
        is noted (_asked_while_full) before the second look, and such a pass that leaves a
        slot free passes again (PassStore._pass_applied)."""
        if self._threads_busy < self.workers or self._stopping or self._can_grow(memory=False):
            self._wake.set()
            return
        self._asked_while_full = True
        if self._threads_busy < self.workers:  # freed since the first look: the pass may have read it before
            self._wake.set()

    def has_room(self) -> bool:
        """Could a pass start a job now (a slot free, or the pool may grow)?"""
        return self._threads_busy < self.workers or self._can_grow(memory=False)

    def running_elsewhere(self, count_running: Callable[[], int]) -> int:
        """Jobs the store has running beyond those this pool holds, for a store this pool
        alone claims from. Counted between two passes: a pass claims and finishes in the
        store first and counts in memory after, so a count taken during one is off by what
        it moves."""
        with self._dispatch_lock:
            elsewhere = max(0, count_running() - self._busy)
        if self._again:  # a pass asked for while this held the lock (see _pass_here)
            self._wake.set()
        return elsewhere

    def with_held(self, call: Callable[[frozenset[int]], T]) -> T:
        """call(ids of the jobs this pool holds), between two passes: no claim of this
        process is under way meanwhile, so a job running in the store is either held here or
        not this process's (an orphan recovery put off past the start reads it so)."""
        with self._dispatch_lock:
            out = call(frozenset(self._held))
        if self._again:  # a pass asked for while this held the lock (see _pass_here)
            self._wake.set()
        return out

    def size_said(self) -> str:
        return pool_size.said(self.size, self.workers)

    def size_info(self) -> dict[str, Any]:
        return pool_size.described(self.size, self.workers)

    def _can_grow(self, memory: bool = True) -> bool:
        """Below the maximum (and, with `memory`, one more typical job would fit: the pass
        asks that; a wake-up, on every commit, does not read /proc)."""
        return (self.size is not None and self.workers < self.size.max and not self._stopping
                and (not memory or self.memory is None or self.memory.fits_one_more()))

    def _add_thread(self) -> None:
        t = threading.Thread(target=self._work, name=f"queickd-job-{len(self._threads)}", daemon=True)
        t.start()
        self._threads.append(t)

    def shrink_if_idle(self, now: float) -> int:
        """The shrink timer's call (tests call it with their clock): one worker less when
        the queue has been quiet for the grace. Returns the size after."""
        with self._dispatch_lock:
            if self.size is not None and self.size.due(self.workers, now) and self._threads_busy < self.workers:
                self.workers -= 1
                self._runq.put(None)  # the next idle thread exits
                self.size.resized(self.workers + 1, self.workers, "idle for the grace", now)
                log.info("worker pool shrinks to %d (quiet for %.0f s)", self.workers, self.size.grace)
        if self._again:  # a pass asked for while this held the lock (see _pass_here)
            self._wake.set()
        return self.workers

    def stop_claiming(self) -> None:
        """Claim nothing more from now on; running jobs go on. Idempotent."""
        self._stopping = True
        self._wake.set()

    def drain(self, on: bool = True) -> None:
        """Stop claiming (on) or claim again (off); running jobs go on either way."""
        self._draining = on
        if not on:
            self._drained.clear()
        self._wake.set()  # the dispatcher's pass sees the pool idle (or claims again)

    @property
    def draining(self) -> bool:
        return self._draining

    def wait_drained(self, timeout: float) -> bool:
        """While draining: wait up to `timeout` s for no job to run here. True once idle."""
        if not self._draining:
            return False
        if not self._drained.is_set():
            # Between two passes (none claims while draining, and one under way when the drain
            # began has ended): nothing running now means idle, without waiting for a pass.
            with self._dispatch_lock:
                if self._busy == 0:
                    self._drained.set()
        return self._drained.wait(timeout)

    def cancel_running(self, job_id: int) -> None:
        """Pass an operator's cancel of a running job on to the runner (see Runner.cancel)."""
        with self._cancel_lock:
            held = job_id in self._held
            if held:
                self._cancelled.add(job_id)
        self.runner.cancel(job_id, held)  # held: its run may not have begun yet
        if self._stopping:
            self._wake.set()  # a stop waits for it no more

    def stop(self, timeout: float) -> bool:
        """Stop claiming; wait up to `timeout` s for running jobs. True if all finished,
        jobs cancelled while they ran aside: their state is final, and waiting for a call
        that may never return (blocked in C) would hold the stop for nothing.

        Jobs still running at the timeout stay `running` in the store; the next start
        recovers them as orphans. Idempotent, and safe before start().
        """
        if self.size is not None:
            self.size.stop()
        if self._thread is None:
            return True
        self.stop_claiming()
        finished = self._idle.wait(timeout)
        self._thread.join(1.0 if finished else 0.1)
        self.flush_counts()
        for _ in self._threads:  # threads still in a job exit when it ends
            self._runq.put(None)
        return finished

    # --- dispatching --------------------------------------------------------------------------
    def dispatch_now(self) -> None:
        """Like wake(), but when the dispatcher is idle, do its pass in this thread.

        For the thread that has just committed a job: the job then starts without first
        waking the dispatcher, one thread hand-off fewer between an ack and the start. A
        pass that fails here is left to the dispatcher, which retries it."""
        if self._threads_busy >= self.workers or self._stopping or self._thread is None:
            self.wake()
            return
        self._pass_here("after a commit")

    def _pass_here(self, after: str) -> None:
        """Do the dispatcher's pass in this thread if no pass is running; else leave it to
        the thread whose pass is running, which passes once more when it ends (_again).
        Handing a pass over by waking the dispatcher instead costs two thread switches, and
        under a steady stream the dispatcher is then always mid-pass when the next job comes:
        every pass of the stream goes through it. A pass that fails here is left to the
        dispatcher, and so are requests still coming after _MAX_PASSES_HERE passes (this
        thread may be the event loop's)."""
        self._again = True
        for _ in range(_MAX_PASSES_HERE):
            if not self._dispatch_lock.acquire(blocking=False):
                return  # the running pass sees _again once it has released the lock
            try:
                self._again = False
                self._wake.clear()
                self._pass()
            except Exception:
                log.warning("dispatch %s failed; the dispatcher retries", after, exc_info=True)
                self._wake.set()
                return
            finally:
                self._dispatch_lock.release()
            if not self._again:  # read after the release: a request made meanwhile is seen
                return
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()  # the scheduler's safety sweep wakes us too: no timer of our own
            with self._dispatch_lock:
                self._wake.clear()
                self._again = False
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
            elif self._again:  # asked for while this pass ran (see _pass_here)
                self._wake.set()

    def _pass(self) -> bool:
        """Apply finished outcomes and claim for the free workers, in one transaction; what
        it changed in memory (busy count, submitted jobs) happens only once it has committed.
        Holds _dispatch_lock. True once stopping and nothing runs any more."""
        p = Pass()
        self._asked_while_full = False  # this pass's claim sees what such a wake announced
        try:
            if self._unsure:
                self._give_back_unheld()
            if not self._pass_in_one(p):
                with self.store.transaction(bookkeeping=True) as tx:
                    self._pass_store(p, tx)
        except BaseException as e:
            self.counts.put_back(p.counted)
            if isinstance(e, self.store.UNAVAILABLE):
                self._unsure = True  # its commit, and so its claims, are unknown
            raise
        ended = self._pass_applied(p)
        self._write_counts(p.count_after)  # never raises
        return ended

    def pass_inside(self, tx: Transaction) -> Callable[[bool], None] | None:
        """A claim made in the caller's open transaction `tx` (a submit's): one commit for
        both. Returns what to call once that transaction has ended (True: committed), or
        None when dispatch_now would not pass here either (it has asked elsewhere). It
        stores no outcome: the submit's acks wait for its commit, outcomes for the next
        pass. A pass that raises is undone here; the caller rolls its transaction back."""
        if self._threads_busy >= self.workers or self._stopping or self._thread is None:
            self.wake()
            return None
        self._again = True
        if not self._dispatch_lock.acquire(blocking=False):
            return None  # the running pass sees _again once it has released the lock
        self._again = False
        self._wake.clear()
        self._asked_while_full = False  # this pass's claim sees what such a wake announced
        p = Pass()
        try:
            self._pass_store(p, tx, finish=False)  # outcomes wait for the next pass: the ack does not
        except BaseException:
            self._pass_undone()
            raise
        self._submit_in_flight = True  # until dispatch_left, or the pass is undone

        def ended(committed: bool) -> None:
            if not committed:
                self._pass_undone()
                return
            try:
                self._pass_applied(p)
            finally:
                self._dispatch_lock.release()

        return ended

    def dispatch_left(self) -> None:
        """After a pass made inside a submit has ended and the submit is acknowledged:
        pass once more here if outcomes or requests came while it held the dispatcher, or
        jobs that ended before the ack left their outcomes to this thread."""
        self._submit_in_flight = False  # before the look: an outcome put after it passes itself
        if self._again or self._unapplied or not self._done.empty():
            self._pass_here("after a commit")

    def _pass_undone(self) -> None:
        """Its transaction did not commit: the dispatcher is woken for another pass."""
        self._submit_in_flight = False
        self._dispatch_lock.release()
        self._wake.set()

    def run_here(self) -> int:
        """For a pool that starts no threads (the immediate queue's): pass, then run each job
        claimed in the calling thread, one after another, until a pass claims none. Each
        run ends as a worker thread's does (its outcome stored by the pass that claims the
        next). Returns how many ran. Raises what a pass raises."""
        ran = 0
        while True:
            with self._dispatch_lock:
                self._wake.clear()
                self._pass()
            try:
                job = self._runq.get_nowait()
            except queue.Empty:
                return ran
            if job is None:  # a stop's marker: none is put in a pool that never started
                return ran
            self._run(job)
            ran += 1

    # --- worker threads ---------------------------------------------------------------------
    def _work(self) -> None:
        while (job := self._runq.get()) is not None:
            self._run(job)

    def _run(self, job: Job) -> None:
        # An async job whose function the pass could not tell (not imported yet) is told
        # here, its function imported in this thread, and moved to the event loop if room.
        if not (len(self._on_loop) < self.async_jobs and self._started_on_loop(job, resolve=True)):
            hooks = self.hooks
            outcome, runtime, report = run_job(self.runner, job, self._clock, hooks.network_checker,
                                               hooks.network_up, self.step_state.complete)
            self._ended(job, outcome, runtime, report)
        if self._stopping:
            self._wake.set()  # the dispatcher sees the pool idle and ends
        elif self._submit_in_flight:  # read after the put: dispatch_left clears it, then looks
            return
        else:
            # The worker that has just finished records its outcome and claims the next job
            # itself: no wake-up of the dispatcher and hand-off back per job.
            self._pass_here("after a run")

    def _ran_on_loop(self, job: Job, report: RunReport) -> None:
        """An async job's run on the event loop has ended (on the loop's thread, which must
        not block: the dispatcher stores its outcome)."""
        outcome, runtime = judge(job, report, self._clock, self.hooks.network_checker, self.hooks.network_up)
        self._ended(job, outcome, runtime, report)
        self._wake.set()

    def _ended(self, job: Job, outcome: Outcome, runtime: float, report: RunReport | None) -> None:
        """A run's outcome counted and put for the next pass to store."""
        self.counts.add(outcome.state == State.SUCCEEDED, runtime)
        if self.memory is not None and report is not None:
            self.memory.after_run(job, report.peak_memory, runtime, report.error_type == "memory_limit",
                                  report.peak_estimated)
        on_ran = self.hooks.on_ran
        if on_ran is not None:
            try:
                on_ran(job, outcome, runtime)
            except Exception:  # counting must never keep an outcome from being recorded
                log.exception("error counting job %d", job.id)
        self._done.put((outcome, job.attempts))
