"""The job model: states, the stored record, new-job specs and finishing outcomes.

This module owns the single list of job states and the shapes that cross the store
boundary; the fields of Job and NewJob are declared in fields.py and the classes built from
that table here. It does no I/O. Everything here is immutable and safe to share between threads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import fields
from .fields import DEFAULT_POOL

__all__ = ["DEFAULT_POOL", "Job", "NewJob", "Outcome", "RetrySpec", "State", "Submitted", "insert_state", "new_record"]


class State:
    """Job states. A job moves scheduled → queued → running → succeeded; see DESIGN.md."""

    SCHEDULED = "scheduled"  # run_at in the future (delayed job or retry backoff)
    QUEUED = "queued"  # due, waiting for a free worker
    RUNNING = "running"  # claimed by a worker
    SUCCEEDED = "succeeded"
    DEAD = "dead"  # attempts exhausted, orphaned too often, or not allowed to run
    WAITING_NETWORK = "waiting_network"  # parked until the network checker sees the network
    CANCELLED = "cancelled"
    # An edge daemon's job for its upstream (services/forwarder/): accepted and stored here,
    # not run here; `held` until the upstream has it, then `forwarded` (its id there in
    # upstream_id) until its final state there is copied back.
    HELD = "held"
    FORWARDED = "forwarded"

    ALL = (SCHEDULED, QUEUED, RUNNING, SUCCEEDED, DEAD, WAITING_NETWORK, CANCELLED, HELD, FORWARDED)
    # States a job can still leave by itself; cancel applies only to those not running.
    PENDING = (SCHEDULED, QUEUED, WAITING_NETWORK)
    FINAL = (SUCCEEDED, DEAD, CANCELLED)


def insert_state(held: bool, run_at: float, now: float) -> str:
    """The state a new job is stored in (the SQL stores' generated insert says the same)."""
    return State.HELD if held else State.QUEUED if run_at <= now else State.SCHEDULED


@dataclass(frozen=True, slots=True)
class RetrySpec:
    """How a failed job is retried. `max_attempts` counts every run, the first included."""

    policy: str
    interval: float
    max_interval: float
    max_attempts: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _NewJobMethods:
    __slots__ = ()

    @property
    def max_attempts(self) -> int:
        return self.retry.max_attempts if self.retry else 1  # type: ignore[attr-defined]


# A validated job to submit (protocol.parse_job, the scheduler); fields in fields.py. Treat
# as immutable (dataclasses.replace): not frozen, as a frozen __init__ costs several times
# more, paid per enqueued job.
NewJob: Any = dataclasses.make_dataclass(
    "NewJob", fields.dataclass_fields(fields.NEW_FIELDS), bases=(_NewJobMethods,), slots=True,
    namespace={"__module__": __name__, "__doc__": "A validated job to submit (fields: fields.py)."},
)


@dataclass(slots=True)
class Submitted:
    """The store's answer for one submitted job. Treat as immutable; not frozen because a
    frozen dataclass's __init__ costs several times more, and one is built per job."""

    job_id: int
    state: str
    duplicate: bool = False  # an idempotency key matched an existing job


# Characters of a job's captured output that a listing (`jobs`, `dead`) carries: its end,
# where a failure shows. A job keeps up to 64 KiB of it; a listing of a hundred such jobs
# (of up to 10,000) would pass the 4 MiB a client reads of one reply. `get` carries it whole.
OUTPUT_PREVIEW = 2000


class _JobMethods:
    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The wire form of a job (protocol `get`)."""
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        d["retry"] = self.retry.to_dict() if self.retry else None  # type: ignore[attr-defined]
        return d

    def to_listing(self) -> dict[str, Any]:
        """The wire form of a job in a listing: its output cut to its last OUTPUT_PREVIEW
        characters, with `output_chars` saying how long it is whole."""
        d = self.to_dict()
        out = d.get("output")
        if out is not None and len(out) > OUTPUT_PREVIEW:
            d["output"], d["output_chars"] = out[-OUTPUT_PREVIEW:], len(out)
        return d


# A job as stored, returned by stores and never mutated in place; its fields are declared
# in fields.py.
Job: Any = dataclasses.make_dataclass(
    "Job", fields.dataclass_fields(fields.JOB_FIELDS), bases=(_JobMethods,), frozen=True, slots=True,
    namespace={"__module__": __name__, "__doc__": "A job as stored (fields: fields.py)."},
)
Job.__init__ = fields.frozen_init(Job)  # the same signature, without a setattr call per field
# The record a store keeps for a newly submitted job: new_record(job_id, state, now, new).
new_record = fields.record_builder(Job)


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
    # The job's workflow run, if it is a step's job: its finish advances the run in the same
    # transaction. None for every other job (the stores' fast path).
    workflow_run: int | None = None
    # The run's captured output (a process run's; None for a thread run or none written):
    # stored as the job's `output`, replacing the previous run's.
    output: str | None = None
    # A run its service refused for its rate (an HTTP 429, queickd.RateLimited): its key
    # starts nothing before this time (core/policy/rates.py); the job waits again, queued
    # in its place, the attempt not counted.
    rate_until: float | None = None

    @classmethod
    def succeeded(cls, job_id: int, result: Any, workflow_run: int | None = None,
                  output: str | None = None) -> Outcome:
        return cls(job_id, State.SUCCEEDED, result=result, workflow_run=workflow_run, output=output)

    @classmethod
    def retry_at(cls, job_id: int, run_at: float, error: dict, output: str | None = None) -> Outcome:
        return cls(job_id, State.SCHEDULED, run_at=run_at, error=error, output=output)

    @classmethod
    def dead(cls, job_id: int, error: dict, workflow_run: int | None = None,
             output: str | None = None) -> Outcome:
        return cls(job_id, State.DEAD, error=error, workflow_run=workflow_run, output=output)

    @classmethod
    def cancelled(cls, job_id: int, error: dict, output: str | None = None) -> Outcome:
        """A run an operator's cancel stopped: the store has the job `cancelled` already
        (so this changes nothing there); it says how the run ended."""
        return cls(job_id, State.CANCELLED, error=error, output=output)

    @classmethod
    def waiting_network(cls, job_id: int, error: dict, output: str | None = None) -> Outcome:
        return cls(job_id, State.WAITING_NETWORK, error=error, output=output)

    @classmethod
    def rate_limited(cls, job_id: int, until: float, error: dict, output: str | None = None) -> Outcome:
        """A run refused for its rate key's sake: queued again in its place (its run_at kept),
        its attempt refunded, its key blocked until `until`. Blameless: no failure streak."""
        return cls(job_id, State.QUEUED, error=error, blameless=True, output=output, rate_until=until)
