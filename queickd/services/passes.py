"""What a worker pool's pass does in the store, and how what it did is applied in memory
once it committed. A mixin of WorkerPool (worker.py), whose dispatching decides when a
pass runs and in which thread; the attributes named below are the pool's.

A pass is one store call where the store has one (store.finish_and_claim: PostgreSQL, whose
round trips cost more than the statements of a pass in the steady state), else one
transaction of several calls: the last progress of the runs that ended and their outcomes
stored, the next jobs claimed, the per-minute counts due and the memory gate's measures
written, the claimed jobs that may not fit in memory sent back.

A job sent back for want of memory goes back to `queued`, where it waited: its place in the
queue and at the head of its serial key kept (its key's later jobs wait behind it). This
pool sets it aside (`_set_aside`: id -> until when) and its claims pass it over until
then; another host's pool, with room of its own, may take it at once.

Async jobs have room of their own: up to `async_jobs` of the held jobs run as tasks of the
runner's event loop (`_on_loop`), taking no worker thread. A claim still asks for no more
jobs than there are free worker threads, so a sync job claimed always has a thread; an
async one claimed (its function known as an async def: run.thread.ThreadRunner
.start_on_loop) goes to the loop instead and leaves its thread free, and the pass that
moved one asks for another pass at once (async jobs waiting are claimed a thread count at
a time). The claim cannot tell an async job before it has claimed it: a claim sized to the
async room could take sync jobs with no thread to run them, which would then wait in
memory, held from every other worker."""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..core.job import Job, Outcome, State
from ..core.policy.claim import Limits, Request
from ..run.base import Runner, RunReport
from ..store import Store
from ..store.contract.capabilities import PassInOneCall
from ..store.contract.transaction import Transaction
from ..store.records import Finished, Minute
from .memory_gate import MemoryGate
from .outcomes import log_pauses, store_one_by_one
from .pool_config import PoolHooks
from .pool_size import PoolSize
from .progress import ProgressWriter
from .run_counts import RunCounts
from .step_state import needs_state

log = logging.getLogger("queickd.worker")


@dataclass
class Pass:
    """What one pass did in the store, applied in memory once its transaction commits."""

    unapplied: list[Outcome] = field(default_factory=list)  # outcomes it stored
    report: Finished | None = None
    free: int = 0  # workers free for it
    claimed: list[Job] = field(default_factory=list)  # jobs it started, to run here
    counted: list[Minute] = field(default_factory=list)  # per-minute counts it wrote
    count_after: list[Minute] = field(default_factory=list)  # counts to write once it is applied
    deferred_at: float | None = None  # when the first job sent back for want of memory returns
    rate_at: float | None = None  # when a rate key its claim passed over or filled may start again


class PassStore:
    """The store side of WorkerPool's passes (a mixin)."""

    store: Store
    workers: int
    memory: MemoryGate | None
    size: PoolSize | None
    pools: list[str] | None
    limits: Limits
    counts: RunCounts
    completed: int
    failed: int
    # The progress writer (services/progress.py), set by the daemon: the last progress of
    # the runs a pass finishes, not written yet, goes in that pass, before their outcomes.
    progress: ProgressWriter | None = None
    _done: queue.SimpleQueue[tuple[Outcome, int]]
    _unapplied: list[Outcome]
    _held: dict[int, int]
    async_jobs: int
    _on_loop: set[int]
    _cancelled: set[int]
    _cancel_lock: threading.Lock
    _set_aside: dict[int, float]
    _unsure: bool
    _runq: queue.SimpleQueue[Job | None]
    _stopping: bool
    _draining: bool
    _drained: threading.Event
    _idle: threading.Event
    _wake: threading.Event
    _again: bool
    _asked_while_full: bool
    _clock: Callable[[], float]
    hooks: PoolHooks
    _pause_after: int | None
    _pause_cooldown: float | None
    _can_grow: Callable[..., bool]
    _add_thread: Callable[[], None]
    _ran_on_loop: Callable[[Job, RunReport], None]
    runner: Runner

    @functools.cached_property
    def _one_call(self) -> PassInOneCall | None:
        """The store, where it takes a steady-state pass in one call (else None)."""
        return self.store if isinstance(self.store, PassInOneCall) else None

    @property
    def _busy(self) -> int:
        """Jobs claimed and not yet finished in the store: the ones held."""
        return len(self._held)

    @property
    def _threads_busy(self) -> int:
        """Held jobs that take a worker thread: all but those on the event loop."""
        return len(self._held) - len(self._on_loop)

    def _free_threads(self, unapplied: list[Outcome]) -> int:
        """Worker threads free once these outcomes are stored (their jobs still held)."""
        on_loop = self._on_loop
        ending = len(unapplied) if not on_loop else sum(1 for o in unapplied if o.job_id not in on_loop)
        return self.workers - self._threads_busy + ending

    def _aside(self, now: float) -> frozenset[int]:
        """The jobs set aside until a moment still ahead (those whose time has come dropped)."""
        aside = self._set_aside
        if not aside:
            return frozenset()
        for job_id in [i for i, until in aside.items() if until <= now]:
            del aside[job_id]
        return frozenset(aside)

    def next_set_aside_at(self, now: float) -> float | None:
        """When the next job set aside may be claimed again (None: none waits). Any thread."""
        return min((t for t in tuple(self._set_aside.values()) if t > now), default=None)

    def _pass_in_one(self, p: Pass) -> bool:
        """The steady state's pass as one store call, a transaction of its own
        (store.finish_and_claim): its outcomes all successes, no run measures to write.
        False: nothing done, the pass goes the general way. What follows a committed call
        (jobs sent back for want of memory; the per-minute counts, left in p.count_after)
        takes transactions of its own, and never raises: the pass is applied whatever
        becomes of them."""
        one_call = self._one_call
        if (one_call is None or (self.memory is not None and self.memory.has_pending())
                or (self._set_aside and self._aside(self._clock()))):  # the one call sets nothing aside
            return False
        unapplied = self._take_outcomes()
        if self.progress is not None and self.progress.waiting([o.job_id for o in unapplied]):
            return False  # the one call writes no progress
        free = self._free_threads(unapplied)
        ask = free + 1 if self._can_grow() else free
        if self._stopping or self._draining:
            ask = 0
        if not unapplied and ask <= 0:
            return False
        claimed = one_call.finish_and_claim(unapplied, self._clock(), ask, self.hooks.network_up(), pools=self.pools)
        if claimed is None:
            return False
        p.unapplied, p.free, p.claimed = unapplied, free, claimed
        p.rate_at = getattr(claimed, "rate_at", None)
        if unapplied:
            # Written once the pass is applied (_write_counts): its jobs start first.
            p.count_after = self.counts.take(force=self._busy == len(unapplied) and not claimed)
        if self.memory is not None and claimed:
            try:
                p.claimed, p.deferred_at = self._fit(claimed, self._busy - len(unapplied), self.store)
            except Exception:
                log.warning("could not send back the claimed jobs that may not fit in memory; they start",
                            exc_info=True)
        return True

    def _write_counts(self, counted: list[Minute]) -> None:
        """Per-minute counts in a transaction of their own; put back to be written with
        later ones if it fails."""
        if not counted:
            return
        try:
            with self.store.transaction(bookkeeping=True) as tx:
                for m in counted:
                    tx.add_minute(m)
        except Exception:
            self.counts.put_back(counted)
            log.warning("could not write the per-minute counts; they go with the next ones", exc_info=True)

    def _take_outcomes(self) -> list[Outcome]:
        """The outcomes not yet stored (self._unapplied), with those put since. A run whose
        job this pool has claimed again meanwhile ran under a claim taken from it: this
        process stalled past the heartbeat window (PostgreSQL), the job was swept as an
        orphan and claimed anew. Its outcome is dropped, as one of a worker that lost its
        job always is; stored, it would finish the later claim while that run goes on."""
        done = self._done
        while not done.empty():  # one taker (under the dispatch lock): not empty, a get succeeds
            outcome, attempt = done.get_nowait()
            if self._held.get(outcome.job_id, attempt) != attempt:
                log.warning("job %d: a run under an earlier claim ended (this worker lost the job while it ran, "
                            "and claimed it again): its outcome is ignored; the later run's counts",
                            outcome.job_id)
                continue
            self._unapplied.append(outcome)
        return self._unapplied

    def _pass_store(self, p: Pass, tx: Transaction, finish: bool = True) -> None:
        """A pass's store calls, in the caller's transaction `tx`; records them in `p`.
        Without `finish` it only claims, leaving every outcome to the next pass."""
        unapplied = self._take_outcomes() if finish else []
        p.unapplied = unapplied
        if unapplied:
            if self.progress is not None and (last := self.progress.take([o.job_id for o in unapplied])):
                tx.set_progress_if_running(last)  # while they still run
            p.report = tx.finish_if_running(unapplied, self._clock(), self._pause_after, self._pause_cooldown)
        p.free = self._free_threads(unapplied)
        # One job more than the free workers when the pool may grow: getting it is the
        # sign that work waits with every worker busy (no polling for it).
        ask = p.free + 1 if self._can_grow() else p.free
        if ask > 0 and not self._stopping and not self._draining:
            now = self._clock()
            p.claimed = tx.claim_available(Request.of(ask, self.hooks.network_up(), self.pools, self.limits,
                                                      now, self._aside(now)))
            p.rate_at = getattr(p.claimed, "rate_at", None)
        # Every count is written once the pool goes idle (nothing runs, nothing was
        # claimed); while busy, once a second at most. Idle is decided after the claim:
        # a worker of one slot is "idle" between every two jobs of a backlog, and a
        # write each time was a statement more in every pass.
        if unapplied:
            p.counted = self.counts.take(force=self._busy == len(unapplied) and not p.claimed)
            for m in p.counted:
                tx.add_minute(m)
        if self.memory is not None:
            self.memory.flush(self._clock(), tx)
            if p.claimed:
                p.claimed, p.deferred_at = self._fit(p.claimed, self._busy - len(unapplied), tx)

    def _give_back_unheld(self) -> None:
        """After a pass that failed with the store unreachable (it may have committed):
        the jobs the store has running under this process's claims that this pool does not
        hold go back to wait, their attempt given back. Else they would stay `running`
        under a worker that goes on beating, which the orphan sweep never re-queues."""
        n = self.store.release_unheld(self._held, self._clock())
        self._unsure = False
        if n:
            log.warning("%d job(s) claimed by a pass whose answer was lost went back to wait", n)

    def _pass_applied(self, p: Pass) -> bool:
        """A pass has committed: what it changed, in memory. True once stopping and idle."""
        claimed = p.claimed
        finished = p.unapplied
        if finished:
            self._unapplied = []
            self._release(o.job_id for o in finished)
        # The claimed jobs are held and queued before anything here that may fail: they are
        # running in the store, and nothing else would ever run them (a job finished by this
        # pass may be among them again: a retry due at once, hence after the line above).
        to_loop = False
        for job in claimed:
            self._held[job.id] = job.attempts
            if len(self._on_loop) < self.async_jobs and self._started_on_loop(job):
                to_loop = True
            else:
                self._runq.put(job)
        if to_loop:
            self._wake.set()  # its thread is free again: claim for it (more async jobs may wait)
        if finished:
            self._after_finish(finished, p.report)
        if claimed and self.size is not None:
            now = self._clock()
            self.size.claimed(now)
            if len(claimed) > max(0, p.free):
                self._grow(now)
        if claimed:
            self.hooks.on_claimed(claimed)
        if self._draining and self._busy == 0:
            self._drained.set()
        if p.deferred_at is not None:
            self.hooks.on_deferred(p.deferred_at)
        # No one polls a rate key: the claim that filled or passed over one, and the finish
        # that blocked one (a 429), set the time to look again.
        waits = [t for t in (p.rate_at, *(o.rate_until for o in finished)) if t is not None]
        if waits:
            self.hooks.on_rate_at(min(waits))
        if self._asked_while_full and self._threads_busy < self.workers:
            # Work was announced while this pass held every slot, perhaps after its claim:
            # a slot freed by any outcome (a cancelled run's, which the store ignores, too)
            # must lead to a look, or that work waits for the safety sweep.
            self._again = True
        if self._stopping and self._busy == len(self._cancelled):  # a stop does not wait for those
            self._idle.set()
            return True
        return False

    def _started_on_loop(self, job: Job, resolve: bool = False) -> bool:
        """Start a held job on the runner's event loop if it is an async job that may run
        there (a step job still to read its run's state takes a thread: that read blocks).
        `resolve`: import its function to tell (a worker thread's call; a pass tells only
        from the functions resolved before). Counted in _on_loop before it starts, so that
        its outcome, stored by a pass, always finds it there; a pass that reads _on_loop
        meanwhile (a set's add is atomic) counts its thread busy or free, either way safe."""
        runner = self.runner
        if not hasattr(runner, "is_async") or not runner.is_async(job, resolve) or needs_state(job):
            return False
        self._on_loop.add(job.id)
        try:
            if runner.start_on_loop(job, lambda report: self._ran_on_loop(job, report)):
                return True
        except Exception:  # a worker thread runs it instead, which awaits it as well
            log.exception("job %d: could not start it on the event loop", job.id)
        self._on_loop.discard(job.id)
        return False

    def _release(self, job_ids: Iterable[int]) -> None:
        """Jobs finished in the store: no longer held (nor cancelled while held)."""
        with self._cancel_lock:
            for job_id in job_ids:
                self._held.pop(job_id, None)
                self._cancelled.discard(job_id)
                self._on_loop.discard(job_id)

    # --- per-minute counts ------------------------------------------------------------------
    def flush_counts(self) -> None:
        """Write the counts not yet stored (on stop). A store error is logged, not raised."""
        counted = self.counts.take(force=True)
        try:
            for m in counted:
                self.store.add_minute(m)
        except Exception:
            log.exception("could not store the last per-minute counts")

    def _grow(self, now: float) -> None:
        assert self.size is not None
        # Counted before the thread starts: it may take a queued job at once.
        self.workers += 1
        self.size.resized(self.workers - 1, self.workers, "work waiting with every worker busy", now)
        try:
            self._add_thread()
        except RuntimeError as e:  # no thread to be had (a pids or process limit): stay this size
            self.workers -= 1
            self.size.resized(self.workers + 1, self.workers, f"no thread to be had: {e}", now)
            log.warning("worker pool cannot grow past %d: %s", self.workers, e)
            return
        log.info("worker pool grows to %d (work waiting with every worker busy)", self.workers)
        self.size.start_timer(self.shrink_if_idle)
        self._wake.set()  # look again at once: more may wait, for one more worker

    def _fit(self, claimed: list[Job], running_here: int, tx: Transaction) -> tuple[list[Job], float | None]:
        """The claimed jobs that fit in memory; the others go back to where they waited,
        their attempt not spent (in `tx`: the pass's transaction, or the store), set aside
        here a little. -> (to start, when the first may be claimed again)."""
        assert self.memory is not None
        start, later = self.memory.split(claimed, running_here, tx)
        if not later:
            return start, None
        now = self._clock()
        untils = [now + w for w in self.memory.backoffs(later)]
        tx.release_unstarted([j.id for j in later])
        for job, until in zip(later, untils, strict=True):
            self._set_aside[job.id] = until
            log.info("job %d %s deferred: it may not fit in memory now (%s)", job.id, job.func, self.memory.source)
        return start, min(untils)

    def _isolate(self, outcomes: list[Outcome]) -> list[Outcome]:
        """After a failed batch: the outcomes stored one by one (outcomes.store_one_by_one);
        returns those the store still could not take."""
        stored, left = store_one_by_one(self.store, outcomes, self._clock, self._pause_after,
                                        self._pause_cooldown)
        for attempt, report in stored:
            self._release((attempt.job_id,))
            self._after_finish([attempt], report)
        return left

    def _after_finish(self, finished: list[Outcome], report: Finished | None) -> None:
        log_pauses(report, self._clock())
        if report is not None and report.next_probe is not None:
            self.hooks.on_probe_at(report.next_probe)
        ok = sum(1 for o in finished if o.state == State.SUCCEEDED)
        self.completed += ok
        self.failed += len(finished) - ok
        self.hooks.on_finished(finished)
