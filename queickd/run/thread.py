"""The in-thread runner: calls the job's function in the calling worker thread.

Loads the function through the loader (the allowlist is checked again: the operator may
have changed it since the job was accepted), calls it and turns what happened into a
`RunReport` (run.capture). It never raises for what the job does, a job's SystemExit included, and
it never decides the job's fate. Safe to use from many worker threads at once. It cannot
measure a thread's memory or CPU time; when `measure(func)` says this run should measure
itself (the memory gate takes a sample of each function's runs), it reports the process's
RSS growth over the call as an estimate of its peak (`peak_estimated`; two reads of
/proc/self/statm), else None.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..core.job import Job
from ..core.protocol import QueueError
from . import capture, context
from .base import RunReport
from .loader import FunctionLoader

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_statm: tuple[int, int] | None = None  # (pid, fd): kept open, re-read with one pread per look
_statm_lock = threading.Lock()


def _rss() -> int | None:
    """This process's resident bytes. One pread of a kept descriptor (opening the file
    each time costs ~7x more); reopened in a forked child, whose descriptors are not ours."""
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

    def run(self, job: Job) -> RunReport:
        if self.measure is None or not self.measure(job.func):
            return self._run(job)
        before = _rss()
        report = self._run(job)
        after = _rss()
        if before is not None and after is not None:
            report.peak_memory, report.peak_estimated = max(0, after - before), True
        return report

    def _run(self, job: Job) -> RunReport:
        began = time.monotonic()
        try:
            try:
                fn = self.loader.resolve(job.func)
            except QueueError as e:  # no longer allowed: retrying cannot help
                return capture.refused("not_allowed", e.message, time.monotonic() - began)
            if job.workflow_run is None and job.cron is None:
                value = fn(*job.args, **job.kwargs)
            else:  # what queickd.workflow_key(), cron_tick() and cron_last_tick() read
                tokens = context.set_job(job.idempotency_key if job.workflow_run is not None else None,
                                         context.ticks_of(job.cron, job.idempotency_key, job.cron_until))
                try:
                    value = fn(*job.args, **job.kwargs)
                finally:
                    context.reset_job(tokens)
        except BaseException as e:  # a job's SystemExit must not end the worker
            return capture.failed(e, time.monotonic() - began)
        return capture.succeeded(value, time.monotonic() - began)

    def cancel(self, job_id: int) -> None:
        """A thread cannot be stopped from outside: the call runs to its end and the store,
        which has the job cancelled already, discards its outcome."""
