"""What a running job may ask about itself: `current_job()`, `progress()`,
`workflow_key()`, `cron_tick()` and `cron_last_tick()`; and `JobInterrupted`, the
exception a thread job is stopped with.

Owns one context variable (the CurrentJob), set by a runner around the call of a job and
reset after it; it never touches the store (progress goes to the sink its runner gave).
Read from the thread (or context) that runs the job; elsewhere they return None.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable

Ticks = tuple[float, float]  # (the tick a run was fired for, the last tick folded into it)

NOTE_MAX = 200  # characters of a progress note kept
_INF = float("inf")
# (job id, attempt, done, total, note, unix time it was said): where a runner takes progress.
ProgressSink = Callable[[int, int, float, "float | None", "str | None", float], None]

_JOB: contextvars.ContextVar[CurrentJob | None] = contextvars.ContextVar("queickd_current_job", default=None)


class JobInterrupted(BaseException):
    """Raised in a thread job's thread when its timeout has passed or an operator cancelled
    it (run/interrupt.py). A BaseException, so that `except Exception` in the job does not
    swallow it; a job that catches it to clean up should raise it again (it is raised again
    every second until the job's call returns)."""


class RateLimited(Exception):  # noqa: N818 - the name the issue and the docs promise
    """Raised by a job that the service it calls refused for its rate (an HTTP 429):
    `retry_after` seconds (its Retry-After) before any job of the job's rate key may start
    again, on every host. The job waits again in its place, the attempt not counted toward
    max_attempts nor toward a pause. A job without a rate_limit is retried after
    `retry_after` by its retry policy."""

    def __init__(self, retry_after: float, message: str = "") -> None:
        super().__init__(message or f"rate limited: retry after {retry_after:g} s")
        self.retry_after = retry_after


class CurrentJob:
    """The job being run here, as queickd.current_job() returns it: `id`, `attempt` (1 on
    its first run), `deadline` (unix time its timeout ends at; None without a timeout) and
    `cancelled` (True once an operator cancelled it while it ran: a thread job's cue to
    stop; a process job is killed instead, so it never reads True there). It also holds
    what workflow_key(), cron_tick() and cron_last_tick() read: one context variable for
    all, set once per run."""

    __slots__ = ("id", "attempt", "deadline", "cancelled", "_key", "_ticks", "progress_to", "_said")

    def __init__(self, job_id: int, attempt: int, deadline: float | None, workflow_key: str | None = None,
                 ticks: Ticks | None = None) -> None:
        self.id = job_id
        self.attempt = attempt
        self.deadline = deadline
        self.cancelled = False
        self._key = workflow_key
        self._ticks = ticks
        # Where progress() hands a changed value (services/progress.py); None: nowhere (False).
        self.progress_to: ProgressSink | None = None
        self._said: tuple | None = None  # the last (done, total, note) handed over

    def remaining(self) -> float | None:
        """Seconds left before the timeout (never below 0); None without a timeout."""
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    def __repr__(self) -> str:
        return (f"CurrentJob(id={self.id}, attempt={self.attempt}, deadline={self.deadline}, "
                f"cancelled={self.cancelled})")


def current_job() -> CurrentJob | None:
    """The job being run in this thread (or process job), or None outside a job. A long
    thread job checks `current_job().cancelled` between steps to stop cleanly when an
    operator cancels it; `deadline` says when its timeout ends."""
    return _JOB.get()


def progress(done: float, total: float | None = None, note: str | None = None) -> bool:
    """Say how far the running job has got: `done` out of `total` (None: not known), with a
    short `note` (cut to NOTE_MAX characters). Cheap enough to call per item: a value equal
    to the last one is dropped here, and the daemon writes the latest one at most a few
    times a second. True once handed over; False outside a job (a no-op). Raises TypeError
    or ValueError for a value that is not a finite number (or a note not text)."""
    job = _JOB.get()
    if job is None or job.progress_to is None:
        return False
    said = (done, total, note)
    if said == job._said:
        return True
    job._said = None  # until this value is handed over: one that raises is not "the last"
    done = _number(done)
    total = None if total is None else _number(total)
    if note is not None:
        if not isinstance(note, str):
            raise TypeError(f"progress note is text, not {type(note).__name__}")
        if len(note) > NOTE_MAX:
            note = note[:NOTE_MAX - 1] + "…"
    job.progress_to(job.id, job.attempt, done, total, note, time.time())
    job._said = said
    return True


def _number(v: object) -> int | float:
    """A finite int or float as JSON holds it (a numpy number too), or TypeError/ValueError."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"progress takes numbers, not {type(v).__name__} ({v!r})")
    if isinstance(v, float):
        if v != v or v in (_INF, -_INF):
            raise ValueError(f"progress takes finite numbers, not {v!r}")
        return float(v)
    return int(v)


def workflow_key() -> str | None:
    """The idempotency key `wf:RUN:STEP:ITEM[:LOOP]` of the workflow step job being run
    here (the same on every attempt of that job), or None outside a workflow step. Use it
    to make the step's own side effects idempotent: steps run at least once."""
    job = _JOB.get()
    return None if job is None else job._key


def cron_tick() -> float | None:
    """The tick (unix time) the cron run being executed here was fired for, the same on
    every attempt and when it ran late (after a power cut, a network wait, a backlog); None
    outside a cron's run. A job that reports on "today" should take its day from this, not
    from the clock when it happens to run."""
    job = _JOB.get()
    return None if job is None or job._ticks is None else job._ticks[0]


def cron_last_tick() -> float | None:
    """The last tick the cron run being executed here stands for: ticks due while it was
    still waiting (for the network, a worker, a retry) get no run of their own but are
    folded into it, so a daily report held back for three days covers the days from
    cron_tick() to this one. cron_tick() when nothing was folded; None outside a cron's run."""
    job = _JOB.get()
    return None if job is None or job._ticks is None else job._ticks[1]


def ticks_of(cron: str | None, idempotency_key: str | None, cron_until: float | None) -> Ticks | None:
    """A cron run's ticks: the one its cron fired it for (from the idempotency key it gave
    it, `cron:NAME:TICK`) and the last one folded into it (`cron_until`)."""
    if cron is None or idempotency_key is None or not idempotency_key.startswith(f"cron:{cron}:"):
        return None
    try:
        tick = float(idempotency_key[len(cron) + 6:])
    except ValueError:
        return None
    return tick, tick if cron_until is None else max(tick, cron_until)


def set_job(job: CurrentJob) -> contextvars.Token:
    """What current_job(), workflow_key(), cron_tick() and cron_last_tick() read from here
    on, until reset_job()."""
    return _JOB.set(job)


def reset_job(token: contextvars.Token) -> None:
    _JOB.reset(token)
