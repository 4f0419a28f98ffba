"""What time and conditions move: scheduled jobs come due, jobs park while the network is
down, crons fire, outbox events become jobs. Every call here is one transaction; the
`next_*` reads change nothing."""

from __future__ import annotations

from typing import Any, Protocol

from ...core.policy.admission import Admission
from ..records import CronFire, CronRecord, EventAccepted, NewEvent
from .backend import Backend


class Schedule(Backend, Protocol):
    # --- scheduled jobs and the network ------------------------------------------------
    def promote_due(self, now: float) -> int:
        """Move every `scheduled` job with run_at <= now to `queued`. Returns how many."""
        ...

    def next_scheduled_at(self) -> float | None:
        """Non-destructively read the earliest run_at among `scheduled` jobs, or None."""
        ...

    def park_for_network(self, now: float) -> int:
        """Move every `queued` job with retry_on_network to `waiting_network`. Returns how many."""
        ...

    def release_network_waiting(self, now: float) -> int:
        """Move every `waiting_network` job to `queued` with run_at = now, so they run in
        the order they were first enqueued (within priority). Returns how many."""
        ...

    # --- cron -----------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        """Create or replace the cron of that name. Returns what is stored."""
        ...

    def cron_list(self) -> list[CronRecord]:
        """Every cron, by name."""
        ...

    def cron_delete(self, name: str) -> bool:
        """Delete the cron of that name (its waiting jobs stay). Whether there was one."""
        ...

    def crons_due(self, now: float) -> list[CronRecord]:
        """Crons whose next_run_at <= now, in no set order."""
        ...

    def next_cron_at(self) -> float | None:
        """The earliest next_run_at among the crons, or None."""
        ...

    def cron_move_if(self, name: str, tick: float, new_tick: float) -> bool:
        """Set the cron's next_run_at to new_tick if it still equals `tick` (a firing or a
        new registration since it was read wins). Whether it moved."""
        ...

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> CronFire | None:
        """If the cron's next_run_at still equals `tick`, in one transaction: set next_run_at
        to next_tick and last_fired_at to tick, and either submit one job from its template
        (idempotency key `cron:NAME:TICK`, so a tick never runs twice; serial key the
        template's or `cron:NAME`, so runs of one cron never overlap) or, when a job of
        this cron is already waiting, fold the tick into it (folded grows by one; the job's
        cron_until becomes the tick, which the run reads as queickd.cron_last_tick()).
        Otherwise (not due any more, or unknown) None."""
        ...

    # --- events (the outbox) ------------------------------------------------------------
    def accept_event(self, event: NewEvent, now: float, admission: Admission) -> EventAccepted:
        """Store the event unless its id is known (then: duplicate), and deliver it at once
        if admission lets its job in; otherwise it stays pending, next attempt at now. An
        event whose serial key has a pending event is not tried now: it waits behind them
        (outbox.accepted_at). One transaction."""
        ...

    def deliver_events(self, now: float, admission: Admission, max_attempts: int,
                       backoff: Any, limit: int = 500) -> list[EventAccepted]:
        """Try the pending events that are due, by next attempt, then in the order accepted:
        each becomes a job (idempotency key `event:ID`) if admitted; else its attempts grow
        and its next try is now + backoff(attempts), or, at max_attempts, it is dead with the
        refusal. A refused event holds its key's later events as long (outbox.KeyOrder):
        they are not tried, and no attempt of theirs is counted. One transaction; the answers
        in the order tried."""
        ...

    def next_event_at(self) -> float | None:
        """The earliest next attempt among the pending events, or None."""
        ...
