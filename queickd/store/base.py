"""The store contract: every backend (memory, SQLite, PostgreSQL) implements `Store`.

Rules that hold for every method unless its docstring says otherwise:
- Each call is one transaction: it happens entirely or not at all, and when it returns
  the change is as durable as the backend promises (SQLite: on disk per --durability).
- Methods are safe to call from any thread, concurrently.
- Order among waiting jobs is priority (smaller first), then run_at, then id (insertion).
- Times are unix seconds (wall clock) and are passed in by the caller (`now`), so tests
  control time and stores never read the clock for decisions.
Backends stay thin: retry policies, backoff, cron arithmetic and serialisation of results
live in the core; a store only records what it is told, atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..job import Job, NewJob, Outcome, Submitted


@dataclass(frozen=True, slots=True)
class CronRecord:
    """A durable recurring job: a schedule (wire form, see cron.py) and a job template."""

    name: str
    schedule: dict[str, Any]
    template: NewJob
    next_run_at: float
    last_fired_at: float | None
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schedule": self.schedule,
            "func": self.template.func,
            "args": self.template.args,
            "kwargs": self.template.kwargs,
            "next_run_at": self.next_run_at,
            "last_fired_at": self.last_fired_at,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True)
class Recovered:
    """What recover_orphans did: ids re-queued and ids given up on (now dead)."""

    requeued: list[int]
    dead: list[int]


class Store(Protocol):
    url: str
    # Capabilities. A store that cannot push wake-ups to other processes leaves this False
    # and the core relies on its own in-process signals plus one slow safety sweep.
    supports_notify: bool

    # --- submit -----------------------------------------------------------------------
    def submit(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        """Insert jobs in order, one transaction for the whole batch (group commit).

        A job whose run_at <= now is stored `queued`, a later one `scheduled`. A job whose
        idempotency_key matches a stored job (or an earlier job of the same batch) is not
        inserted: its answer carries the existing id and duplicate=True. Returns one
        Submitted per input, in input order.
        """
        ...

    # --- schedule ---------------------------------------------------------------------
    def promote_due(self, now: float) -> int:
        """Move every `scheduled` job with run_at <= now to `queued`. Returns how many."""
        ...

    def next_scheduled_at(self) -> float | None:
        """Non-destructively read the earliest run_at among `scheduled` jobs, or None."""
        ...

    # --- claim ------------------------------------------------------------------------
    def claim_available(self, limit: int, now: float, network_up: bool = True) -> list[Job]:
        """Atomically move up to `limit` `queued` jobs to `running`, in queue order.

        Each claimed job's attempts grows by one and started_at becomes now. With
        network_up False, jobs that asked for network replay are passed over (they wait).
        Returns the claimed jobs as they are after the claim; [] when nothing is queued.
        """
        ...

    # --- network ----------------------------------------------------------------------
    def park_for_network(self, now: float) -> int:
        """Move every `queued` job with retry_on_network to `waiting_network`. Returns how many."""
        ...

    def release_network_waiting(self, now: float) -> int:
        """Move every `waiting_network` job to `queued` with run_at = now, so they run in
        the order they were first enqueued (within priority). Returns how many."""
        ...

    # --- finish -----------------------------------------------------------------------
    def finish_if_running(self, outcomes: Sequence[Outcome], now: float) -> int:
        """Apply each outcome to its job only if that job is still `running`.

        succeeded/dead set finished_at; scheduled sets run_at; waiting_network gives back
        the attempt (a run that found no network does not count against max_attempts);
        result and error are stored as given. One transaction for the batch. Returns how
        many jobs changed.
        """
        ...

    def recover_orphans(self, max_requeues: int, now: float) -> Recovered:
        """Every `running` job is an orphan (call only when no worker of this store runs).

        An orphan whose `orphaned` count is below max_requeues goes back to `queued` with
        that count grown by one; the others become `dead` with error type "orphaned".
        """
        ...

    # --- operator actions -------------------------------------------------------------
    def cancel(self, job_id: int, now: float) -> Job | None:
        """Cancel a job that is scheduled, queued or waiting_network. Returns the job as
        it is after the call (unchanged if it was in another state), None if unknown."""
        ...

    def retry_dead(self, job_id: int, now: float) -> Job | None:
        """Move a `dead` job back to `queued` with a fresh attempt budget. Returns the job
        as it is after the call (unchanged if it was not dead), None if unknown."""
        ...

    # --- inspect ----------------------------------------------------------------------
    def get(self, job_id: int) -> Job | None: ...

    def list_jobs(self, state: str | None, limit: int) -> list[Job]:
        """Jobs, newest first, optionally of one state."""
        ...

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state (every state present, zero included)."""
        ...

    # --- cron -------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        """Create or replace the cron of that name. Returns what is stored."""
        ...

    def cron_list(self) -> list[CronRecord]: ...

    def cron_delete(self, name: str) -> bool: ...

    def crons_due(self, now: float) -> list[CronRecord]:
        """Crons whose next_run_at <= now."""
        ...

    def next_cron_at(self) -> float | None: ...

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> Submitted | None:
        """If the cron's next_run_at still equals `tick`: submit one job from its template
        (idempotency key `cron:NAME:TICK`, so a tick never runs twice), set next_run_at to
        next_tick and last_fired_at to tick, all in one transaction. Otherwise None."""
        ...

    def close(self) -> None: ...
