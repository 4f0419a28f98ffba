"""SqlStore: the Store methods both SQL stores answer with the same SQL. Each opens its
transaction (the backend's `_write()`) or takes its reading connection (`_conn()`) and
runs the shared function (this package) with the backend's Dialect; what a function needs
of the backend besides (its submit, its insert of a step's jobs) is passed in the call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, TypeVar

from ...core.job import Job, NewJob, Outcome, State
from ...core.policy import admission as adm
from ...core.policy import claim
from ..derived import StoreBase
from ..records import CronFire, EventAccepted, Finished, NewEvent
from . import fair as sqlfair
from . import forward, operator, schedule, stats
from . import rates as sqlrates
from . import workflows as wfsql
from .dialect import Dialect, Submit

R = TypeVar("R")


def _reads(fn: Callable[..., R]) -> Callable[..., R]:
    """A store method that runs `fn` on the store's reading connection."""
    def method(self: SqlStore, /, *args: Any, **kwargs: Any) -> R:
        return fn(self.dialect, self._conn(), *args, **kwargs)
    method.__name__, method.__doc__ = fn.__name__, fn.__doc__
    return method


def _writes(fn: Callable[..., R], steps: bool = False, batch: bool = False) -> Callable[..., R]:
    """A store method that runs `fn` in a write transaction of its own. `steps`: `fn` is
    given the store's workflow Steps too (what it does may advance a run). `batch`: `fn`
    takes a batch of updates (none: no transaction), as bookkeeping, which has no flush of
    its own (a progress note or a stalled mark lost to a power cut is set again)."""
    def method(self: SqlStore, /, *args: Any, **kwargs: Any) -> R:
        if batch and not args[0]:
            return 0  # type: ignore[return-value]
        with self._write(bookkeeping=batch) as c:
            return fn(self.dialect, c, *([self._steps()] if steps else []), *args, **kwargs)
    method.__name__, method.__doc__ = fn.__name__, fn.__doc__
    return method


class SqlStore(StoreBase):
    """The base of SQLiteStore and PostgresStore (each with its connections' class)."""

    dialect: ClassVar[Dialect]
    # The backend's connections (sqlite/connection.py, postgres/connection.py) provide these.
    _conn: Callable[[], Any]
    _write: Callable[..., AbstractContextManager[Any]]  # (bookkeeping=False): a transaction's connection

    # ... and their submit, and insert of a workflow step's jobs (no admission), in a transaction;
    # with their claim and finish there, what a transaction's (transaction.py) run.
    _submit_in: Submit
    _wf_submit: Callable[[Any, list[NewJob], float], None]
    _claim_in: Callable[[Any, claim.Request], list[Job]]
    _finish_in: Callable[[Any, Sequence[Outcome], float, int | None, float | None], Finished]

    def _steps(self) -> wfsql.Steps:
        return wfsql.Steps(self._wf_submit, self.queue_cap)

    get = _reads(operator.get)
    pauses = _reads(operator.pauses)

    rate_keys = _reads(sqlrates.keys)
    fair_keys = _reads(sqlfair.keys)
    resume = _writes(operator.resume)
    pause = _writes(operator.pause)
    release_unstarted = _writes(operator.release_unstarted)
    retry_dead = _writes(operator.retry_dead)

    cancel = _writes(operator.cancel, steps=True)
    cancel_running = _writes(operator.cancel_running, steps=True)

    def cancel_waiting(self, state: str, now: float, *, func: str | None = None, key: str | None = None,
                       pool: str | None = None) -> list[int]:
        if state not in State.PENDING:
            raise ValueError(f"only waiting jobs are cancelled this way, not {state!r}")
        with self._write() as c:
            return operator.cancel_waiting(self.dialect, c, self._steps(), state, now, func, key, pool)

    set_progress_if_running = _writes(operator.set_progress_if_running, batch=True)

    held_jobs = _reads(forward.held_jobs)
    held_backlog = _reads(forward.held_backlog)
    mark_forwarded = _writes(forward.mark_forwarded)
    refuse_held = _writes(forward.refuse_held)
    settle_forwarded = _writes(forward.settle_forwarded)
    forwarded_jobs = _reads(forward.forwarded_jobs)

    set_stalled = _writes(operator.set_stalled, batch=True)
    count_stalled = _reads(operator.count_stalled)
    add_minute = _writes(stats.add_minute)
    minutes = _reads(stats.minutes)
    prune_minutes = _writes(stats.prune_minutes)
    prune_rate_keys = _writes(sqlrates.prune)
    waiting_over_budgets = _reads(stats.waiting_over_budgets)
    budget_usage = _reads(stats.budget_usage)
    footprints = _reads(stats.footprints)
    record_runs = _writes(stats.record_runs)

    cron_list = _reads(schedule.cron_list)
    crons_due = _reads(schedule.crons_due)
    cron_delete = _writes(schedule.cron_delete)
    next_cron_at = _reads(schedule.next_cron_at)
    cron_move_if = _writes(schedule.cron_move_if)

    def _fire_in(self, c: Any, name: str, template: str, tick: float, next_tick: float, now: float,
                 waiting: int | None) -> CronFire:
        return schedule.fire_in(self.dialect, c, self._submit_in, name, template, tick, next_tick, now, waiting)

    def deliver_events(self, now: float, admission: adm.Admission, max_attempts: int,
                       backoff: Callable[[int], float], limit: int = 500) -> list[EventAccepted]:
        with self._write() as c:
            return schedule.deliver_events(self.dialect, c, self._submit_in, now, admission, max_attempts, backoff,
                                         limit)

    def accept_event(self, event: NewEvent, now: float, admission: adm.Admission) -> EventAccepted:
        with self._write() as c:
            return schedule.accept_event(self.dialect, c, self._submit_in, event, now, admission)

    retry_event = _writes(schedule.retry_event)
    prune_events = _writes(schedule.prune_events)
    event_counts = _reads(schedule.event_counts)
    list_events = _reads(schedule.list_events)

    workflow_start = _writes(wfsql.start, steps=True)
    workflow_cancel = _writes(wfsql.cancel, steps=True)
    workflow_get = _reads(wfsql.get)
    workflow_jobs = _reads(wfsql.jobs)
    workflow_outputs = _reads(wfsql.outputs)
    workflow_list = _reads(wfsql.runs)
    workflow_children = _reads(wfsql.children)
    workflow_counts = _reads(wfsql.counts)
