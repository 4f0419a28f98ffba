"""The records the store contract (store/contract/) speaks in besides jobs: crons, pauses,
per-minute counts, what a finish did, events and their outbox states, what orphan
recovery did, and the errors a store raises for a caller's reasons."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..core.job import NewJob, Submitted
from ..core.policy.admission import Refusal


class _Record:
    """A record whose dict form is its fields, in order."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True)
class CronRecord:
    """A durable recurring job: a schedule (wire form, see cron.py) and a job template."""

    name: str
    schedule: dict[str, Any]
    template: NewJob
    next_run_at: float
    last_fired_at: float | None
    created_at: float
    folded: int = 0  # ticks that found a run of this cron still waiting and joined it

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schedule": self.schedule,
            "func": self.template.func,
            "args": self.template.args,
            "kwargs": self.template.kwargs,
            "pool": self.template.pool,
            "next_run_at": self.next_run_at,
            "last_fired_at": self.last_fired_at,
            "created_at": self.created_at,
            "folded": self.folded,
        }


@dataclass(frozen=True, slots=True)
class Pause(_Record):
    """A key or function that stopped being started after repeated failures (or by hand)."""

    kind: str  # "key" or "func"
    name: str
    paused_at: float
    failures: int
    last_error: dict | None
    probe_at: float | None = None  # when one job is let through to test it; None: until resumed
    trips: int = 0  # times the breaker paused it (0: paused by hand)
    probe_job: int | None = None  # the job last let through as its probe


@dataclass(frozen=True, slots=True)
class Minute:
    """One member's (a daemon's or worker's, "host:pid") runs in one minute (unix time // 60):
    runs that succeeded, runs that did not, their seconds in all, and the waiting jobs it
    last sampled then (None: it sampled none)."""

    minute: int
    member: str
    completed: int
    failed: int
    seconds: float
    depth: int | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """What finish_if_running did: jobs changed, and pauses it started."""

    changed: int
    paused: list[Pause]
    next_probe: float | None = None  # the earliest probe time this finish wrote, if any


@dataclass(frozen=True, slots=True)
class CronFire:
    """What cron_fire_if_due did: 'fired' (submitted a job) or 'folded' (a run was already
    waiting, so this tick joined it)."""

    outcome: str
    submitted: Submitted | None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event for the outbox: becomes a job when the queue has room."""

    event_id: str
    job: NewJob


class EventState:
    """States of an event in the outbox."""

    PENDING = "pending"  # waiting for room in the queue
    DELIVERED = "delivered"  # became a job
    DEAD = "dead"  # out of delivery attempts: a dead letter
    ALL = (PENDING, DELIVERED, DEAD)


@dataclass(frozen=True, slots=True)
class Event(_Record):
    """An event as stored in the outbox; state is one of EventState."""

    event_id: str
    state: str
    func: str
    key: str | None
    created_at: float
    attempts: int
    next_attempt_at: float | None
    job_id: int | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class EventAccepted:
    event_id: str
    duplicate: bool
    state: str  # the event's state after the call
    job_id: int | None  # the job it became, if delivered


class StoreInUseError(ValueError):
    """Another daemon already serves this store (a configuration error: two daemons on one
    SQLite file would each think the other's running jobs were orphans)."""


class NotDurableError(OSError):
    """A write committed (visible) but not made durable: its flush to disk failed, now or
    earlier (after one failed fdatasync nothing written since can be promised to be on disk:
    Linux reports a writeback error once and may drop the pages it could not write). The
    write may have been stored: `maybe_committed`, as the protocol says."""

    maybe_committed = True


class RefusedError(Exception):
    """Raised by Store.submit (the one-request form) when admission refused the request."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Recovered:
    """What recover_orphans did: ids re-queued and ids given up on (now dead)."""

    requeued: list[int]
    dead: list[int]


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat found: whether this worker's record was still there, the
    database's queickd and schema versions, and what its orphan sweep did (None when no
    sweep was asked for, or the sweep failed and only the beat was written)."""

    found: bool
    version: str | None
    schema: int
    recovered: Recovered | None = None


class Claimed(list):  # type: ignore[type-arg]
    """The jobs a claim started (a list of Job), and when a job it passed over for its rate
    key may start (`rate_at`, None: none was): the claimer's timer (core/policy/rates.py)."""

    rate_at: float | None = None


@dataclass(frozen=True, slots=True)
class RateKey(_Record):
    """A rate key as operators see it: its limit and window, the starts within the window
    that ends now, when its next job may start and until when it is blocked (None: not)."""

    key: str
    limit: int
    per: float
    used: int
    next_start: float
    blocked_until: float | None


@dataclass(frozen=True, slots=True)
class FairKey(_Record):
    """A fair key of a pool (core/policy/fair.py) as operators see it: its jobs queued, its
    standing (1 / weight more per job started) and its last start (0: none yet)."""

    pool: str
    key: str
    waiting: int
    vtime: float
    last_start: float
