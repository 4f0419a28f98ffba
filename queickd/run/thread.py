"""The in-thread runner: calls the job's function in the calling worker thread.

Loads the function through the loader (the allowlist is checked again: the operator may
have changed it since the job was accepted), calls it and turns what happened into a
`RunReport` (run.capture). It never raises for what the job does, a job's SystemExit included, and
it never decides the job's fate. Safe to use from many worker threads at once. It cannot
measure a thread's memory or CPU time, so those stay None.
"""

from __future__ import annotations

import time

from ..core.job import Job
from ..core.protocol import QueueError
from . import capture, context
from .base import RunReport
from .loader import FunctionLoader


class ThreadRunner:
    def __init__(self, loader: FunctionLoader) -> None:
        self.loader = loader

    def run(self, job: Job) -> RunReport:
        began = time.monotonic()
        try:
            try:
                fn = self.loader.resolve(job.func)
            except QueueError as e:  # no longer allowed: retrying cannot help
                return capture.refused("not_allowed", e.message, time.monotonic() - began)
            if job.workflow_run is None:
                value = fn(*job.args, **job.kwargs)
            else:  # a workflow step: its key is readable through queickd.workflow_key()
                token = context.set_key(job.idempotency_key)
                try:
                    value = fn(*job.args, **job.kwargs)
                finally:
                    context.reset(token)
        except BaseException as e:  # a job's SystemExit must not end the worker
            return capture.failed(e, time.monotonic() - began)
        return capture.succeeded(value, time.monotonic() - began)
