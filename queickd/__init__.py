"""queickd: a durable job-queue daemon for edge devices, with Queick's client API.

The client names import nothing outside the standard library.
"""

from .client import JobQueue, QueueError
from .core.cron import SchedulingTime
from .core.retry import RETRY_TYPE
from .run.context import CurrentJob, JobInterrupted, cron_last_tick, cron_tick, current_job, workflow_key
from .version import __version__

__all__ = ["JobQueue", "QueueError", "SchedulingTime", "RETRY_TYPE", "__version__", "cron_tick", "cron_last_tick",
           "workflow_key", "current_job", "CurrentJob", "JobInterrupted"]
