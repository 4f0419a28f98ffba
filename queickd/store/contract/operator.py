"""An operator's actions (and retention's, which deletes on a timer what an operator could
purge): pauses, cancels, retries, purges, moves between pools. Every call here is one
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ...core.job import Job
from ..records import Event
from .backend import Backend


class Operator(Backend, Protocol):
    # --- pauses ---------------------------------------------------------------------------
    def pause(self, kind: str, name: str, now: float) -> bool:
        """An operator's pause of a key, function or pool ("key", "func", "pool"): no probe,
        it lasts until resume(); over a breaker's pause, it takes its probe away. True if
        it was not paused before."""
        ...

    def resume(self, kind: str, name: str) -> bool:
        """Lift a pause and reset its streak. True if it was paused."""
        ...

    # --- cancel ---------------------------------------------------------------------------
    def cancel(self, job_id: int, now: float) -> Job | None:
        """Cancel a job that is scheduled, queued, waiting_network or held. Returns the job as
        it is after the call (unchanged if it was in another state), None if unknown."""
        ...

    def cancel_running(self, job_id: int, now: float) -> Job | None:
        """An operator's cancel of a running job: `cancelled` at once (finished_at = now),
        so the outcome its run reports later changes nothing (finish_if_running applies
        only to running jobs). Its key is free at once. Returns the job as it is after
        (still in its state if it was not running); None if there is no such job."""
        ...

    def cancel_waiting(self, state: str, now: float, *, func: str | None = None, key: str | None = None,
                       pool: str | None = None) -> list[int]:
        """Cancel every job in `state` (scheduled, queued or waiting_network) matching the
        filters given, in one transaction. Returns their ids."""
        ...

    # --- retry ----------------------------------------------------------------------------
    def retry_dead(self, job_id: int, now: float) -> Job | None:
        """Move a `dead` job back to `queued` with a fresh attempt budget. Returns the job
        as it is after the call (unchanged if it was not dead), None if unknown."""
        ...

    def retry_all_dead(self, now: float) -> int:
        """retry_dead for every dead job and every dead event, in one transaction. Returns
        how many."""
        ...

    def retry_event(self, event_id: str, now: float) -> Event | None:
        """A dead event back to pending, due now, attempts reset. None if unknown."""
        ...

    # --- pools ----------------------------------------------------------------------------
    def set_pool(self, kind: str, name: str, pool: str) -> int:
        """An operator's move to another pool: kind 'job' (name: its id; only while it
        waits), 'key' (its waiting jobs) or 'cron' (its template and its waiting runs).
        Returns how many jobs and crons moved."""
        ...

    # --- purge and retention --------------------------------------------------------------
    def purge(self, states: Sequence[str], finished_before: float, limit: int) -> int:
        """Delete up to `limit` jobs in these (final) states that finished before the
        time, oldest first; for `dead`, dead events created before it too. Returns how many."""
        ...

    def prune_finished(self, finished_before: float, limit: int) -> int:
        """Delete up to `limit` succeeded or cancelled jobs finished before the time, oldest
        first (purge of those states). Returns how many."""
        ...

    def prune_events(self, created_before: float, limit: int) -> int:
        """Delete up to `limit` delivered outbox events accepted before the time whose job
        is gone (deleted by retention or a purge): their event_id is forgotten with it, as a
        job's idempotency key is. Pending and dead events stay. Returns how many."""
        ...

    def prune_rate_keys(self, now: float) -> int:
        """Delete the rate keys that say nothing at `now` (no start within their window, no
        block ahead): a key used once is not kept for ever. Returns how many."""
        ...

    def prune_minutes(self, before: int) -> int:
        """Delete the rows of minutes before `before`; returns how many."""
        ...
