"""The async runner: awaits async jobs (a coroutine function's call, or the awaitable a
plain function returned) as tasks of one event loop in a thread of its own
("queickd-async"), started with the first async job. One loop for the process, not one per
worker thread: an async job holds no thread (the worker pool starts it with `start`), and
a thousand sleeping jobs cost a thousand tasks. An async job that blocks (time.sleep, a
synchronous socket) stalls every async job until it returns.

A run is stopped by cancelling its task, at its timeout or an operator's cancel, and again
every RESEND seconds while it has not ended; it reports `timeout` or `cancelled`
(run.capture.stopped). A value that is itself awaitable is awaited too: a coroutine object
never becomes a result. Never touches the store nor decides a fate; `done` is called on
the loop's thread and must not block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.fate import CANCELLED
from ..core.job import Job
from ..core.policy.liveness import STALLED
from . import capture, context
from .base import RunReport
from .interrupt import RESEND, TIMEOUT

log = logging.getLogger("queickd.async")


class LoopRun(context.CurrentJob):
    """One async job's run on the loop: what queickd.current_job() returns in its task."""

    __slots__ = ("timeout", "began", "why", "task", "started", "ended", "timer", "stalled_after")

    def __init__(self, job: Job, timeout: float | None, began: float) -> None:
        super().__init__(job.id, job.attempts,
                         None if timeout is None else time.time() + timeout - (time.monotonic() - began),
                         job.idempotency_key if job.workflow_run is not None else None,
                         context.ticks_of(job.cron, job.idempotency_key, job.cron_until))
        self.timeout = timeout
        self.began = began  # monotonic: when the run began (a thread may have called its function)
        self.why: str | None = None  # TIMEOUT, STALLED or CANCELLED once it was told to stop
        self.task: asyncio.Task | None = None
        self.started = False  # its task has taken its first step (a task cancelled before never runs)
        self.ended = False
        self.timer: asyncio.TimerHandle | None = None
        self.stalled_after = job.stalled_after  # what a stall's report says


class LoopRunner:
    """The loop and the async runs on it. start/run/cancel/stopping from any thread."""

    def __init__(self) -> None:
        self.progress: context.ProgressSink | None = None  # where queickd.progress() in a task goes
        # Whether a job was cancelled while held, before its run began (Stops.cancelled_early):
        # such a run is stopped before the job's function is called.
        self.cancelled_early: Callable[[int], bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._runs: dict[int, LoopRun] = {}  # job id -> its run (a dict's set and pop are atomic)

    def start(self, job: Job, call: Callable[[], Any], timeout: float | None,
              done: Callable[[RunReport], None], began: float | None = None) -> None:
        """Run `call()` (on the loop: a coroutine function's call, which runs nothing yet,
        or a lambda handing over an awaitable) as the job's task; `done(report)` once it has
        ended, on the loop's thread. `timeout` counts from `began` (monotonic; now if None)."""
        run = LoopRun(job, timeout, time.monotonic() if began is None else began)
        run.progress_to = self.progress
        self._runs[job.id] = run  # before the task: a cancel from now on finds it
        loop = self._started()
        if self.cancelled_early is not None and self.cancelled_early(job.id):  # after: a cancel finds the run
            run.cancelled = True
            # Before _begin, in the loop's FIFO: the stop marks the run before its task's first
            # step, which then never calls the function (queued after, the task could start first).
            loop.call_soon_threadsafe(self._stop, run, CANCELLED)
        loop.call_soon_threadsafe(self._begin, run, call, done)

    def run(self, job: Job, call: Callable[[], Any], timeout: float | None, began: float) -> RunReport:
        """Like start, and wait in this thread for the report (a job that reached a worker
        thread: its slot stays taken while it is awaited)."""
        ended: concurrent.futures.Future[RunReport] = concurrent.futures.Future()
        self.start(job, call, timeout, ended.set_result, began)
        return ended.result()

    def cancel(self, job_id: int, why: str = CANCELLED) -> bool:
        """An operator cancelled this job (or, `why` STALLED, its liveness watch found it
        stalled: on_stall = kill): its task is cancelled (again until it ends). False when
        it does not run here."""
        run = self._runs.get(job_id)
        if run is None:
            return False
        if why == CANCELLED:
            run.cancelled = True
        self._started().call_soon_threadsafe(self._stop, run, why)
        return True

    def stall(self, job_id: int) -> bool:
        return self.cancel(job_id, STALLED)

    def stopping(self) -> frozenset[int]:
        """The jobs told to stop (timed out, cancelled) whose task has not ended yet."""
        return frozenset(r.id for r in list(self._runs.values()) if r.why is not None)

    def on_loop(self) -> bool:
        """Whether the caller runs on this runner's loop thread (an async job's own call)."""
        try:
            return self._loop is not None and asyncio.get_running_loop() is self._loop
        except RuntimeError:  # no loop runs in this thread
            return False

    def _started(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            with self._lock:
                if self._loop is None:
                    new = asyncio.new_event_loop()
                    threading.Thread(target=new.run_forever, name="queickd-async", daemon=True).start()
                    self._loop = new
                loop = self._loop
        return loop

    # --- on the loop's thread --------------------------------------------------------------
    def _begin(self, run: LoopRun, call: Callable[[], Any], done: Callable[[RunReport], None]) -> None:
        loop = asyncio.get_running_loop()
        run.task = loop.create_task(self._main(run, call, done), name=f"queickd-job-{run.id}")
        if run.timeout is not None:
            run.timer = loop.call_at(loop.time() + run.timeout - (time.monotonic() - run.began),
                                     self._stop, run, TIMEOUT)

    def _stop(self, run: LoopRun, why: str) -> None:
        """Cancel the run's task, unless it has ended: a job that ended just at its deadline
        is not called timed out. A cancel says more than a timeout."""
        if run.ended:
            return
        if why == CANCELLED or run.why is None:
            run.why = why
        if not run.started:  # a cancel that came first: once the task runs (else no report ever)
            asyncio.get_running_loop().call_soon(self._stop, run, run.why)
            return
        assert run.task is not None
        run.task.cancel()
        run.timer = asyncio.get_running_loop().call_later(RESEND, self._stop, run, run.why)

    async def _main(self, run: LoopRun, call: Callable[[], Any], done: Callable[[RunReport], None]) -> None:
        run.started = True
        context.set_job(run)  # the task's own copy of the context
        value: Any = None
        error: BaseException | None = None
        try:
            if run.why is not None:  # stopped before its first step: the function is never called
                raise asyncio.CancelledError
            value = call()
            while capture.awaitable(value):
                value = await value
        except BaseException as e:  # CancelledError (its stop), a job's SystemExit: the report
            error = e
        run.ended = True
        if run.timer is not None:
            run.timer.cancel()
        self._runs.pop(run.id, None)
        runtime = time.monotonic() - run.began
        if run.why is None and run.timeout is not None and runtime > run.timeout:
            # It blocked the loop past its deadline (a time.sleep in an async def): the timer
            # could not fire before it ended. Past its timeout is a timeout, as in a thread.
            run.why = TIMEOUT
        if run.why is not None:
            report = capture.stopped(run.why, error, runtime, run.timeout, "its task was cancelled",
                                     run.stalled_after)
        elif error is not None:
            report = capture.failed(error, runtime)
        else:
            report = capture.succeeded(value, runtime)
        try:
            done(report)
        except Exception:
            log.exception("job %d: its async run's report could not be handed over", run.id)


def awaited(value: Awaitable[Any]) -> Any:
    """What `value` gives once awaited (and what that gives, while awaitable), on a loop of
    its own: a process job's child, which has no loop."""
    async def settle(v: Any) -> Any:
        while capture.awaitable(v):
            v = await v
        return v

    return asyncio.run(settle(value))
