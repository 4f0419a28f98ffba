"""The in-thread runner: calls the job's function in the calling worker thread.

Loads the function through the loader (the allowlist is checked again: the operator may
have changed it since the job was accepted) and turns what the call did into a `RunReport`
(run.capture). An async def, or an awaitable the call returned, is awaited on run.aio's
event loop (start_on_loop starts one there without a thread). Never raises for what the
job does, a SystemExit included, and never decides its fate. Safe from many threads.

A run is stopped at its timeout or an operator's cancel by JobInterrupted (run.interrupt),
which interrupts Python code but not a call blocked in C: it reports only once the call
has returned, its worker thread (its slot in the pool) taken until then. A thread's memory
cannot be measured; when `measure(func)` asks (the memory gate samples each function's
runs), the process's RSS growth over the call is reported as its peak (`peak_estimated`).
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.job import Job
from ..core.protocol import QueueError
from . import capture, context
from .aio import LoopRunner
from .base import RunReport
from .interrupt import JobInterrupted, Stops, ThreadRun
from .loader import FunctionLoader

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_statm: tuple[int, int] | None = None  # (pid, fd): kept open, re-read with one pread per look
_statm_lock = threading.Lock()


def _rss() -> int | None:
    """This process's resident bytes. One pread of a kept descriptor (opening the file
    each time costs far more); reopened in a forked child, whose descriptors are not ours."""
    global _statm
    try:
        if _statm is None or _statm[0] != os.getpid():
            with _statm_lock:  # workers start together: open it once
                if _statm is None or _statm[0] != os.getpid():
                    _statm = (os.getpid(), os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class ThreadRunner:
    def __init__(self, loader: FunctionLoader, measure: Callable[[str], bool] | None = None) -> None:
        self.loader = loader
        self.measure = measure
        self.stops = Stops()
        self.loop = LoopRunner()  # awaits async jobs: run/aio.py
        self.loop.cancelled_early = self.stops.cancelled_early

    @property
    def progress(self) -> context.ProgressSink | None:
        """Where queickd.progress() in a job goes, for thread and async jobs alike."""
        return self.loop.progress

    @progress.setter
    def progress(self, sink: context.ProgressSink | None) -> None:
        self.loop.progress = sink

    def run(self, job: Job, timeout: float | None = None) -> RunReport:
        """Run the job here; `timeout` (seconds): interrupt it once that has passed."""
        if self.measure is None or not self.measure(job.func):
            return self._run(job, timeout)
        before = _rss()
        report = self._run(job, timeout)
        after = _rss()
        if before is not None and after is not None:
            report.peak_memory, report.peak_estimated = max(0, after - before), True
        return report

    def _run(self, job: Job, timeout: float | None) -> RunReport:
        began = time.monotonic()
        try:
            fn = self.loader.resolve(job.func)
        except QueueError as e:  # no longer allowed, or no such function: retrying cannot help
            return capture.refused(e.code, e.message, time.monotonic() - began)
        except BaseException as e:
            return capture.failed(e, time.monotonic() - began)
        if inspect.iscoroutinefunction(fn):  # its coroutine is awaited on the loop; this thread waits
            return self.loop.run(job, lambda: fn(*job.args, **job.kwargs), timeout, began)
        stops = self.stops
        # Also what queickd.current_job(), workflow_key(), cron_tick() and cron_last_tick() read.
        run = ThreadRun(job.id, job.attempts, timeout, began,
                        job.idempotency_key if job.workflow_run is not None else None,
                        context.ticks_of(job.cron, job.idempotency_key, job.cron_until))
        run.progress_to = self.progress
        token = context.set_job(run)
        value: Any = None
        error: BaseException | None = None
        # From enter() until leave() has returned, JobInterrupted may be raised here at any
        # call: so nothing between them but the job's call and leave() itself, each inside
        # a try. Once `leaving` is set no new one is sent, and at most two already sent
        # can still come (one pending, one under way): leave() is tried three times.
        try:
            try:
                stops.enter(run)  # a cancel may come at once
                value = fn(*job.args, **job.kwargs)
            finally:
                run.leaving = True
        except BaseException as e:  # a job's SystemExit must not end the worker
            error = e
        try:
            stops.leave(run)
        except JobInterrupted:
            try:
                stops.leave(run)
            except JobInterrupted:
                stops.leave(run)
        context.reset_job(token)
        runtime = time.monotonic() - began
        if run.why is not None:
            return capture.stopped(run.why, error, runtime, timeout, "was interrupted in its thread",
                                   job.stalled_after)
        if error is not None:
            return capture.failed(error, runtime)
        if capture.awaitable(value):  # a plain function's awaitable: awaited, this thread waiting
            return self.loop.run(job, lambda: value, timeout, began)
        return capture.succeeded(value, runtime)

    def is_async(self, job: Job, resolve: bool = False) -> bool | None:
        """Whether the job's function is an async def, from the function resolved before (a
        dict look, no import); None when it was not, unless `resolve` imports it here (an
        error: False, run() reports it). A runner that sends jobs to processes resolves
        only for its thread jobs."""
        fn = self.loader.cached(job.func)
        if fn is None:
            if not resolve:
                return None
            try:
                fn = self.loader.resolve(job.func)
            except BaseException:
                return False
        return inspect.iscoroutinefunction(fn)

    def start_on_loop(self, job: Job, timeout: float | None, done: Callable[[RunReport], None]) -> bool:
        """Start the job as a task of the event loop, taking no thread, when its function is
        an async def resolved before (is_async); `done` gets its report on the loop's
        thread. False: run it in a worker thread instead."""
        fn = self.loader.cached(job.func)
        if fn is None or not inspect.iscoroutinefunction(fn):
            return False
        self.loop.start(job, lambda: fn(*job.args, **job.kwargs), timeout, done)
        return True

    def stall(self, job_id: int, message: str) -> bool:
        """Runner.stall: JobInterrupted in its thread, or its async task cancelled, as at a
        timeout. False when it does not run here."""
        return self.stops.stall(job_id) or self.loop.stall(job_id)

    def cancel(self, job_id: int, held: bool = False) -> None:
        """Runner.cancel: JobInterrupted is raised in the thread running the job (again
        every second until its call returns; a call blocked in C returns first); an async
        job's task is cancelled."""
        if not self.stops.cancel(job_id, held):
            self.loop.cancel(job_id)

    def stopping(self) -> frozenset[int]:
        """Runner.stopping: the jobs timed out or cancelled whose call has not returned."""
        return self.stops.stopping() | self.loop.stopping()
