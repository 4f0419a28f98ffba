"""What differs between the SQL stores in the SQL they share: one Dialect value per
backend (sqlite/store.py, postgres/store.py), handed with the transaction to every shared
function. Shared queries are written with `?` and turned into the driver's marker once
per text."""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from ...core.job import NewJob, Submitted
from ...core.policy import admission as adm


def _nothing(c: Any) -> None:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    mark: str  # the driver's parameter marker
    release: str  # what else a job's row drops when it leaves `running` (", col = NULL" or "")
    due_events: str  # the events due (event_id, job, attempts, key) in delivery order; (now, limit)
    event_order: str  # the events' column of the order they were accepted in
    wf_lock: str  # how a run's row is locked for the rest of the transaction ("" where the writer holds all)
    wf_budget: str  # the SQL that reads a stopped run's budget from its meta JSON
    wf_waiting: str  # the SQL that counts the waiting jobs (a fan-out paced under queue_cap)
    replayed: str  # what the update of a dead job replayed returns ("" or " RETURNING ...")
    unavailable: tuple[type[BaseException], ...]  # the store's Store.UNAVAILABLE
    # (c, pause target, paused at, failures, last error JSON): write a pause a plan begins;
    # False if it was there already.
    begin_pause: Callable[[Any, tuple[str, str], float, int, str | None], bool]
    # (c, rows of (kind, name, failures, last error JSON)): the streaks as they are now.
    put_streaks: Callable[[Any, list[tuple]], None]
    # A job left `running` outside a finish, or a pause was lifted: a shared store wakes
    # the other claimers.
    released: Callable[[Any], None] = _nothing
    # Before reading the outbox to deliver, or a keyed event's place in it: a store shared
    # by several daemons lets one at a time (else a later event of a key could be delivered
    # by one while another refuses the earlier).
    lock_outbox: Callable[[Any], None] = _nothing
    # Before an admission's reads outside a submit (an event's delivery): a store shared by
    # several daemons serializes them with every other submit.
    lock_admission: Callable[[Any], None] = _nothing

    def q(self, sql: str) -> str:
        """`sql`, written with `?`, in this driver's marker."""
        return _marked(sql, self.mark)


@functools.cache
def _marked(sql: str, mark: str) -> str:
    return sql if mark == "?" else sql.replace("?", mark)


def marked(c: Any, sql: str) -> str:
    """`sql`, written with `?`, in the marker of `c`'s driver: sqlite3's `?` or psycopg's `%s`
    (for what a claim or a finish is given its connection alone)."""
    return sql if isinstance(c, sqlite3.Connection) else _marked(sql, "%s")


# A store's submit inside the caller's transaction: (c, requests, now, admission).
Submit = Callable[[Any, Sequence[Sequence[NewJob]], float, adm.Admission], list[list[Submitted] | adm.Refusal]]
