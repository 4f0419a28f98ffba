"""queickd: a durable job-queue daemon for edge devices, with Queick's client API.

The client names import nothing outside the standard library.
"""

from .client import JobQueue, QueueError
from .core.cron import SchedulingTime
from .core.retry import RETRY_TYPE
from .run.context import (
    CurrentJob,
    JobInterrupted,
    RateLimited,
    cron_last_tick,
    cron_tick,
    current_job,
    progress,
    workflow_key,
)
from .tasks import AsyncJobHandle, JobCancelled, JobFailed, JobHandle, Task
from .version import __version__

__all__ = ["JobQueue", "AsyncJobQueue", "QueueError", "JobFailed", "JobCancelled", "JobHandle", "AsyncJobHandle",
           "Task", "SchedulingTime", "RETRY_TYPE", "__version__", "cron_tick", "cron_last_tick", "workflow_key",
           "current_job", "CurrentJob", "JobInterrupted", "RateLimited", "progress"]


def __getattr__(name: str) -> object:
    # AsyncJobQueue on first use: a program (or a job's process) that never awaits does
    # not import asyncio for it.
    if name == "AsyncJobQueue":
        from .aclient import AsyncJobQueue

        return AsyncJobQueue
    raise AttributeError(f"module 'queickd' has no attribute {name!r}")
