"""The event outbox: the job an event becomes, and what a refused delivery means.

An accepted event waits in the store's outbox until admission lets its job in. This
module builds that job (run now, with the event's id as its idempotency key, so a second
delivery of the same event can never make a second job), and decides what a refused
delivery does: the attempt is counted, the next one waits a capped exponential backoff,
and after max_attempts the event is a dead letter. The store reads the due events, asks,
and writes the answer; the daemon's timer passes `backoff`. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..job import NewJob
from .admission import Refusal

BACKOFF_MAX = 60.0  # seconds: the longest wait between two delivery attempts


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` refused ones: 1, 2, 4, ... 60."""
    return min(BACKOFF_MAX, 2.0 ** (attempts - 1))


def job_for(event_id: str, template: NewJob, now: float) -> NewJob:
    """The job an event delivers: its template, due now, idempotent by the event's id."""
    return dataclasses.replace(template, run_at=now, idempotency_key=f"event:{event_id}")


@dataclass(frozen=True, slots=True)
class Refused:
    """The event after a refused attempt: to write back as it is."""

    attempts: int
    dead: bool
    next_attempt_at: float | None  # None once dead
    last_error: str


def after_refusal(attempts: int, refusal: Refusal, now: float, max_attempts: int,
                  backoff: Callable[[int], float] = backoff) -> Refused:
    """attempts: the event's refused attempts before this one."""
    attempts += 1
    dead = attempts >= max_attempts
    return Refused(attempts, dead, None if dead else now + backoff(attempts),
                   f"{refusal.code}: {refusal.message}")
