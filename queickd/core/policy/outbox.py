"""The event outbox: the job an event becomes, and what a refused delivery means.

An accepted event waits in the store's outbox until admission lets its job in. This
module builds that job (run now, with the event's id as its idempotency key, so a second
delivery of the same event can never make a second job), and decides what a refused
delivery does: the attempt is counted, the next one waits a capped exponential backoff,
and after max_attempts the event is a dead letter. The store reads the due events, asks,
and writes the answer; the daemon's timer passes `backoff`. Pure: no I/O, no clock.

A serial key's events become jobs in the order they were accepted, as its jobs run in the
order they were enqueued: a new event waits behind a pending event of its key
(`accepted_at`), and once one is refused, the key's later events wait as long
(`KeyOrder`). So, within a key, a later event is never tried before an earlier one: the
store keeps every pending event of a key due no sooner than the earlier ones.
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


def accepted_at(now: float, behind: float | None) -> float | None:
    """When a new event is first tried. `behind`: the latest next attempt among the pending
    events of its serial key (None: none is pending, or it has no key). None: at once, in
    its accept; otherwise it waits behind them, tried with them or after."""
    return None if behind is None else max(now, behind)


class KeyOrder:
    """One delivery pass, fed the due events in order (next attempt, then acceptance): once
    an event of a key is refused and waits its backoff, the key's later events wait as
    long; the store makes every later pending event of that key due no sooner."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: set[str] = set()

    def holds(self, key: str | None) -> bool:
        """An earlier event of this key was refused in this pass: this one is not tried."""
        return key is not None and key in self._held

    def refused(self, key: str | None, r: Refused) -> float | None:
        """After an event of `key` was refused: the time before which no pending event of
        its key may be tried, or None (no key, or it is dead: it no longer holds its key)."""
        if key is None or r.next_attempt_at is None:
            return None
        self._held.add(key)
        return r.next_attempt_at
