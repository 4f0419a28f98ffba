"""What is in the store, for stats, listings and monitoring, and the per-minute counters
(the history and the fleet's counts). Reads change nothing and see one committed state."""

from __future__ import annotations

from typing import Protocol

from ...core.job import Job
from ..records import Event, FairKey, Minute, Pause, RateKey
from .backend import Backend


class Inspect(Backend, Protocol):
    # --- jobs -----------------------------------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        """The job as it is now, or None if unknown."""
        ...

    def list_jobs(self, state: str | None, limit: int, *, func: str | None = None, key: str | None = None,
                  pool: str | None = None) -> list[Job]:
        """Jobs, newest first, optionally of one state, function, serial key and pool (each
        filter given narrows the list)."""
        ...

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state (every state present, zero included)."""
        ...

    def pauses(self) -> list[Pause]:
        """Every pause in force, by when it was paused, then kind and name."""
        ...

    def rate_keys(self, now: float) -> list[RateKey]:
        """Every rate key (core/policy/rates.py) by key: its limit and window, the starts in
        the window that ends at `now`, its next start and until when it is blocked."""
        ...

    def fair_keys(self, limit: int = 50) -> list[FairKey]:
        """The fair keys with jobs queued (core/policy/fair.py), most waiting first, at most
        `limit`, and the standing of the pools' jobs without one (key '')."""
        ...

    def waiting_by_pool(self) -> dict[str, int]:
        """Waiting jobs (scheduled, queued, waiting_network) per pool; pools with none
        are absent."""
        ...

    def waiting_by_key(self, limit: int) -> list[tuple[str, int, float]]:
        """(key, waiting jobs, oldest run_at) for the keys with the most waiting jobs, most
        first, then by key."""
        ...

    def oldest_queued_at(self) -> float | None:
        """Non-destructively read the earliest run_at among `queued` jobs (how long the
        longest-waiting due job has waited, for monitoring), or None when none is queued.
        Served by the queued-jobs index; cheap enough to call on every scrape."""
        ...

    def count_stalled(self) -> int:
        """Jobs running with a stalled mark (Queue.set_stalled), whichever worker runs them."""
        ...

    # --- per-minute counters --------------------------------------------------------------
    def add_minute(self, m: Minute) -> None:
        """Add a member's counts to its row of that minute (made if new); a depth given
        replaces the row's. A transaction's too (the pool writes it with a finish)."""
        ...

    def minutes(self, since: int) -> list[Minute]:
        """Every member's rows from minute `since` on, by minute then member."""
        ...

    # --- events (the outbox) --------------------------------------------------------------
    def event_counts(self) -> dict[str, int]:
        """Events by state: pending, delivered, dead (every state present)."""
        ...

    def list_events(self, state: str | None, limit: int) -> list[Event]:
        """Events, newest first, optionally of one state."""
        ...

    def oldest_pending_event_at(self) -> float | None:
        """Non-destructively read when the oldest `pending` outbox event was created, or
        None when none is pending (for monitoring)."""
        ...
