"""queickd: a durable job-queue daemon for edge devices, with Queick's client API.

The client names import nothing outside the standard library.
"""

__version__ = "0.1.0"

from .client import JobQueue, QueueError  # noqa: E402
from .cron import SchedulingTime  # noqa: E402
from .retry import RETRY_TYPE  # noqa: E402

__all__ = ["JobQueue", "QueueError", "SchedulingTime", "RETRY_TYPE", "__version__"]
