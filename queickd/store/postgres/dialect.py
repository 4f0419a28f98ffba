"""PostgreSQL's Dialect (sql/dialect.py): its texts of the shared SQL and the steps where
a store shared by several hosts does more (row locks, advisory locks, wake-ups)."""

from __future__ import annotations

import functools

import psycopg

from ...core.policy import pauses as pz
from ..sql.dialect import Dialect
from ..sqlstates import WAITING_IN
from .fleet import notify
from .submit import DRAW_ONE, SUBMIT_LOCK

# pg_advisory lock id (beside schema.MIGRATE_LOCK and the others): one delivery of the
# outbox at a time, and a keyed event's place in it read under it.
OUTBOX_LOCK = 0x71756963_6B640005


def _begin_pause(c: psycopg.Connection, t: pz.Target, at: float, failures: int, err: str | None) -> bool:
    # The plan read the pauses before its streak row lock was granted: another host may
    # have begun this pause meanwhile. Then it stays as begun there, with our count.
    return c.execute(
        "INSERT INTO pauses (kind, name, paused_at, failures, last_error) VALUES (%s, %s, %s, %s, %s)"
        " ON CONFLICT (kind, name) DO UPDATE"
        " SET failures = excluded.failures, last_error = excluded.last_error RETURNING (xmax = 0)",
        (*t, at, failures, err)).fetchone()[0]


def _put_streaks(c: psycopg.Connection, rows: list[tuple]) -> None:
    # One statement for every streak of the finish (their rows exist: _lock_streaks made them).
    c.execute("UPDATE streaks s SET failures = r.f, last_error = r.e FROM unnest(%s::text[], %s::text[],"
              " %s::int[], %s::text[]) AS r(k, n, f, e) WHERE s.kind = r.k AND s.name = r.n",
              [list(col) for col in zip(*rows, strict=True)])


def _xact_lock(c: psycopg.Connection, lock: int) -> None:
    c.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))


DIALECT = Dialect(
    mark="%s",
    release=", worker_id = NULL",  # a job that leaves running is no worker's any more
    # Due first, then in the order accepted (seq: keyed accepts take the outbox's lock, so
    # that order is theirs whatever the hosts' clocks); read under that lock, by one host.
    due_events=("SELECT event_id, job, attempts, key FROM events WHERE state = 'pending'"
                " AND next_attempt_at <= %s ORDER BY next_attempt_at, seq LIMIT %s FOR UPDATE"),
    event_order="seq",
    # Two hosts finishing items of one run at once take turns on its row: each sees the
    # other's counts, so the run is advanced exactly once per item.
    wf_lock=" FOR UPDATE",
    wf_budget="(meta::json)->'reason'->>'budget'",
    wf_waiting=f"SELECT count(*) FROM jobs WHERE state IN {WAITING_IN}",
    # A replayed job draws a value from the jobs' serial, as an insert would: the
    # admission's bound of the waiting counts what joined them by the values drawn.
    replayed=f" RETURNING {DRAW_ONE}",
    # A killed or dropped connection (OperationalError: AdminShutdown, a reset socket...;
    # InterfaceError: a connection psycopg already knows is gone); the next call reconnects.
    unavailable=(psycopg.OperationalError, psycopg.InterfaceError),
    begin_pause=_begin_pause,
    put_streaks=_put_streaks,
    released=functools.partial(notify, payload="r"),
    lock_outbox=functools.partial(_xact_lock, lock=OUTBOX_LOCK),
    lock_admission=functools.partial(_xact_lock, lock=SUBMIT_LOCK),
)
