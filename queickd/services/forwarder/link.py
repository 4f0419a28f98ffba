"""The connection to the upstream daemon: the Python client's (JobQueue), with the
forwarder's timeouts, and what a failure to reach it means for the link's state."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...client import JobQueue
from ...core.protocol import Code, QueueError
from .settings import UpstreamSettings

log = logging.getLogger("queickd.forwarder")

# The link's states, as `queick status` shows them.
IDLE = "idle"  # nothing sent yet since the start: not known
UP = "up"
DOWN = "down"  # unreachable, refused, cut or silent past the timeout: retried with back-off
UNAUTHORIZED = "unauthorized"  # the upstream refuses our token: nothing is sent until it takes it
CERTIFICATE = "certificate_rejected"  # its certificate does not verify: nothing is sent


class LinkError(Exception):
    """The upstream could not be reached or answered no more; `state` says how (DOWN, ...)."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


def failure(e: BaseException) -> LinkError:
    """What an exception of the client means for the link."""
    if isinstance(e, LinkError):  # said already (a token file that cannot be read)
        return e
    if isinstance(e, QueueError) and e.code == Code.UNAUTHORIZED:
        return LinkError(UNAUTHORIZED, f"the upstream refuses our token: {e.message}")
    text = str(e)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return LinkError(CERTIFICATE, f"the upstream's certificate does not verify: {text}")
    return LinkError(DOWN, text or type(e).__name__)


class Link:
    """One connection to the upstream, opened on first use and again after a failure.
    Not thread-safe by itself beyond the client's own lock: one user at a time."""

    def __init__(self, settings: UpstreamSettings, timeout: float | None = None) -> None:
        self.settings = settings
        self.timeout = settings.timeout if timeout is None else timeout
        self._queue: JobQueue | None = None

    def _open(self) -> JobQueue:
        if self._queue is None:
            s = self.settings
            try:
                token = s.read_token()
            except ValueError as e:  # missing, unreadable or malformed: tokenfile says which
                raise LinkError(UNAUTHORIZED, f"the upstream token_file cannot be used: {e}") from e
            tls: Any = (s.ca_file or True) if s.tls else None
            self._queue = JobQueue(s.host, s.port, token=token or "", timeout=self.timeout,
                                   connect_timeout=min(self.timeout, 5.0), tls=tls)
        return self._queue

    @contextlib.contextmanager
    def _call(self, passed: Callable[[Exception], bool] = lambda e: False) -> Iterator[JobQueue]:
        """The upstream's queue for one call. An error of the call, unless `passed` lets it
        through as it is, closes the connection and is raised as the LinkError it means."""
        try:
            yield self._open()
        except Exception as e:
            if passed(e):
                raise
            self.close()
            raise failure(e) from e

    def enqueue_each(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send each enqueue request (pipelined, in order); their replies. LinkError if the
        replies did not all come (then any of them may have been committed upstream)."""
        with self._call() as q:
            return q.enqueue_each(requests)

    def get(self, job_id: int) -> dict[str, Any]:
        """The upstream's job; LinkError if it cannot say, QueueError(not_found) if it has none."""
        with self._call(lambda e: isinstance(e, QueueError) and e.code == Code.NOT_FOUND) as q:
            return q.get(job_id)

    def get_many(self, job_ids: Sequence[int]) -> list[dict[str, Any]]:
        """The replies to `get` of each id (pipelined); LinkError if they did not all come."""
        with self._call() as q:
            return q.get_each(job_ids)

    def cancel(self, job_id: int) -> None:
        """Cancel the upstream's job (its outcome discarded if it runs); LinkError if it
        cannot say, QueueError if the upstream refuses (a job final there already)."""
        with self._call(lambda e: isinstance(e, QueueError)) as q:
            q.cancel(job_id)

    def close(self) -> None:
        if self._queue is not None:
            q, self._queue = self._queue, None
            try:
                q.close()
            except OSError:
                pass
