"""The job model: states, the stored record, new-job specs and finishing outcomes.

This module owns the single list of job states and the shapes that cross the store
boundary. It does no I/O. Everything here is immutable and safe to share between threads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DEFAULT_POOL = "default"  # the worker pool a job goes to when it names none


class State:
    """Job states. A job moves scheduled → queued → running → succeeded; see DESIGN.md."""

    SCHEDULED = "scheduled"  # run_at in the future (delayed job or retry backoff)
    QUEUED = "queued"  # due, waiting for a free worker
    RUNNING = "running"  # claimed by a worker
    SUCCEEDED = "succeeded"
    DEAD = "dead"  # attempts exhausted, orphaned too often, or not allowed to run
    WAITING_NETWORK = "waiting_network"  # parked until the network checker sees the network
    CANCELLED = "cancelled"

    ALL = (SCHEDULED, QUEUED, RUNNING, SUCCEEDED, DEAD, WAITING_NETWORK, CANCELLED)
    # States a job can still leave by itself; cancel applies only to those not running.
    PENDING = (SCHEDULED, QUEUED, WAITING_NETWORK)
    FINAL = (SUCCEEDED, DEAD, CANCELLED)


@dataclass(frozen=True, slots=True)
class RetrySpec:
    """How a failed job is retried. `max_attempts` counts every run, the first included."""

    policy: str
    interval: float
    max_interval: float
    max_attempts: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class NewJob:
    """A validated job to submit. Built by protocol.parse_job or by the scheduler.

    Treat as immutable (use dataclasses.replace). Not frozen only because a frozen
    dataclass's __init__ costs several times more, and one is built per enqueued job."""

    func: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    run_at: float = 0.0  # unix seconds; <= now means "queued at once"
    priority: int = 0  # smaller runs first
    retry: RetrySpec | None = None  # None: one attempt only
    retry_on_network: bool = False
    key: str | None = None
    idempotency_key: str | None = None
    cron: str | None = None  # name of the cron that fired it
    manual: bool = False  # an operator's run: refused if its key is busy; resumes a pause
    pool: str = DEFAULT_POOL  # only workers serving this pool run it

    @property
    def max_attempts(self) -> int:
        return self.retry.max_attempts if self.retry else 1


@dataclass(slots=True)
class Submitted:
    """The store's answer for one submitted job. Treat as immutable; not frozen because a
    frozen dataclass's __init__ costs several times more, and one is built per job."""

    job_id: int
    state: str
    duplicate: bool = False  # an idempotency key matched an existing job


@dataclass(frozen=True, slots=True)
class Job:
    """A job as stored. Returned by stores; never mutated in place."""

    id: int
    func: str
    args: list
    kwargs: dict
    state: str
    priority: int
    run_at: float
    created_at: float
    attempts: int
    max_attempts: int
    retry: RetrySpec | None
    retry_on_network: bool
    key: str | None
    idempotency_key: str | None
    cron: str | None
    orphaned: int
    started_at: float | None
    finished_at: float | None
    result: Any
    error: dict | None
    pool: str = DEFAULT_POOL

    def to_dict(self) -> dict[str, Any]:
        """The wire form of a job (protocol `get`, `jobs`)."""
        d = dataclasses.asdict(self)
        d["retry"] = self.retry.to_dict() if self.retry else None
        return d


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to do with a running job. Build with the named constructors, one per transition.

    A store applies an outcome only if the job is still `running` (finish_if_running), so a
    late outcome for a job that was cancelled or recovered meanwhile changes nothing.
    """

    job_id: int
    state: str
    run_at: float | None = None
    result: Any = None
    error: dict | None = None
    blameless: bool = False  # the host failed the run (out of file descriptors): no failure streak grows

    @classmethod
    def succeeded(cls, job_id: int, result: Any) -> Outcome:
        return cls(job_id, State.SUCCEEDED, result=result)

    @classmethod
    def retry_at(cls, job_id: int, run_at: float, error: dict) -> Outcome:
        return cls(job_id, State.SCHEDULED, run_at=run_at, error=error)

    @classmethod
    def dead(cls, job_id: int, error: dict) -> Outcome:
        return cls(job_id, State.DEAD, error=error)

    @classmethod
    def waiting_network(cls, job_id: int, error: dict) -> Outcome:
        return cls(job_id, State.WAITING_NETWORK, error=error)
