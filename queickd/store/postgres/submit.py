"""The PostgreSQL store's submit path: admission read under the submit lock only when it
must read, and the rows inserted, their ids returned and the pools woken in one statement.
Submitter runs it on the connection the store hands it."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

try:
    import psycopg
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ValueError("the PostgreSQL store needs psycopg 3: pip install 'queickd[postgres]'") from e

from ...core.job import NewJob, State, Submitted, insert_state
from ...core.policy import admission as adm
from .. import rows as dbrows
from ..sql import operator
from ..sql.dialect import Dialect
from ..sqlstates import UNFINISHED_ANY, UNFINISHED_IN, WAITING_IN
from .channels import QUEUED_CHANNEL
from .connection import KEPT_CURSOR_BYTES

SUBMIT_LOCK = 0x71756963_6B640002  # advisory lock id held by each submit transaction
# Seconds an exact count of the waiting jobs (a read of every one, under the submit lock)
# stands in for (_waiting_total).
_COUNT_TTL = 1.0
# One value drawn from the jobs' serial. Every job that joins the waiting or running ones
# draws one (an insert its id, a replayed dead job one of its own), so the values drawn
# since an exact count bound what has joined since. The serial must be CACHE 1 (as the
# schema makes it): a session's cached block would move its last value ahead at once.
DRAW_ONE = "nextval(pg_get_serial_sequence('jobs', 'id'))"
_DRAWN = "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('jobs', 'id')::regclass), 0)"
_COUNT = f"SELECT count(*) FILTER (WHERE state <> 'running'), count(*) FROM jobs WHERE {UNFINISHED_ANY}"
# A submit's rows are one multi-row VALUES of scalars, not arrays: psycopg dumps scalars
# in C, arrays in Python.
_NOT_ID = [c for c in dbrows.INSERT_COLS if c != "id"]
_ID_AT = dbrows.INSERT_COLS.index("id")
# Each column's scalar type: a guarded insert selects its rows from a VALUES list, where
# PostgreSQL does not take the parameters' types from the target columns.
_NOT_ID_TYPES = [t.removesuffix("[]") for c, t in zip(dbrows.INSERT_COLS, dbrows.PG_INSERT_TYPES, strict=True)
                 if c != "id"]
_ROWS_PER_INSERT = 65535 // len(_NOT_ID)  # the protocol's limit of parameters per statement
_KEPT_ROWS = 8  # an insert of at most this many rows (and KEPT_CURSOR_BYTES) leaves its cursor kept
# From this many rows a batch goes by COPY (_by_copy), which the server takes faster than a
# long VALUES list; below, its two more round trips (ids, wake-up) cost more.
_COPY_FROM = 64
# One COPY per shape the batch holds (rows.py): a job at its fields' defaults is a few
# values to format, not every column.
_COPY_SQL = tuple(f"COPY jobs ({', '.join(cols)}) FROM STDIN" for cols in dbrows.SHAPES)
# The ids as one array (one value to load), the sequence looked up once.
_DRAW_IDS = ("WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('jobs', 'id')::regclass AS seq)"
             " SELECT array_agg(nextval(s.seq)) FROM s, generate_series(1, %s)")
# Scalar subqueries that wake the pools named in $2 on channel $1 (the second: only if rows
# were inserted), to ride in the insert's statement.
_NOTIFY_POOLS, _NOTIFY_POOLS_IF_INSERTED = (
    f"(SELECT count(*) FROM (SELECT pg_notify($1, 'q:' || p) FROM unnest($2::text[]) AS p{where}) AS n)"
    for where in ("", " WHERE EXISTS (SELECT 1 FROM ins)"))


def _by_copy(p: adm.Plan) -> bool:
    """Whether the planned inserts go by COPY: at least _COPY_FROM of them, none with an
    idempotency key (a key held meanwhile by another host would fail the whole COPY; a
    statement's guard answers it)."""
    return len(p.inserts) >= _COPY_FROM and not any(j.idempotency_key for _, _, j in p.inserts)


@dataclasses.dataclass(frozen=True, slots=True)
class Counted:
    """An exact count of the fleet's unfinished jobs, made under the submit lock (_waiting_total)."""

    waiting: int
    unfinished: int  # waiting or running
    drawn: int  # the jobs' serial's last value, read just before the count
    at: float
    by: object  # the submit's reading(), under whose lock it was made


@functools.lru_cache(maxsize=64)
def _insert_sql(rows: int, wake: bool, new_keys_only: bool = False, guard_keys: bool = False) -> str:
    """The insert of `rows` rows, returning their ids (and waking the pools, if `wake`: their
    channel and names are $1 and $2). In $n markers, for a RawCursor: psycopg would re-parse
    a statement this long on every call. `new_keys_only`: a row whose idempotency key is
    held already is left out. `guard_keys`: if any row's key is held already, nothing is
    inserted, no id returned and no pool woken."""
    width, first = len(_NOT_ID), 3 if wake else 1
    cast = _NOT_ID_TYPES if guard_keys else [""] * width
    values = ", ".join("(" + ", ".join(f"${first + r * width + k}{'::' + cast[k] if cast[k] else ''}"
                                       for k in range(width)) + ")"
                       for r in range(rows))
    cols = ", ".join(_NOT_ID)
    if guard_keys:
        notify = _NOTIFY_POOLS_IF_INSERTED
        return (f"WITH v ({cols}) AS (VALUES {values}), ins AS (INSERT INTO jobs ({cols}) SELECT * FROM v"
                " WHERE NOT EXISTS (SELECT 1 FROM jobs j JOIN v ON j.idempotency_key = v.idempotency_key)"
                f" RETURNING id) SELECT array_agg(id), {notify if wake else 'NULL'} FROM ins")
    skip = " ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING" if new_keys_only else ""
    return (f"WITH ins AS (INSERT INTO jobs ({cols}) VALUES {values}{skip} RETURNING id)"
            f" SELECT array_agg(id), {_NOTIFY_POOLS if wake else 'NULL'} FROM ins")


class Submitter:
    """A store's submits (Store.submit_requests), with what they keep between calls: the
    last exact count of the waiting jobs and the insert's cursor."""

    def __init__(self, d: Dialect) -> None:
        self.d = d
        self.cursor: psycopg.RawCursor | None = None  # _insert's, on the connection it last ran on
        self._counted: Counted | None = None  # see _waiting_total
        self._inserted_since_count = 0

    def alone(self, c: psycopg.Connection, requests: Sequence[Sequence[NewJob]], now: float,
              admission: adm.Admission) -> list[list[Submitted] | adm.Refusal]:
        begun = False

        def reading() -> psycopg.Connection:
            # Admission reads what every host has committed, so the lock comes before the
            # first read; BEGIN and the lock share one round trip.
            nonlocal begun
            if not begun:
                c.execute(f"BEGIN; SELECT pg_advisory_xact_lock({SUBMIT_LOCK})")
                begun = True
            return c

        try:
            answers = self._unread(c, requests, now, admission, reading)
            if answers is None:  # it read, resumes a pause, or a key it took for new is held
                answers = self.submit_in(reading(), requests, now, admission, reading)
                c.execute("COMMIT")
        except BaseException:
            if not c.closed and not c.broken and c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):
                    c.execute("ROLLBACK")
            raise
        self._inserted_since_count += sum(1 for a in answers if not isinstance(a, adm.Refusal)
                                          for s in a if not s.duplicate)
        return answers

    def _unread(self, c: psycopg.Connection, requests: Sequence[Sequence[NewJob]], now: float,
                admission: adm.Admission, reading: Callable[[], psycopg.Connection],
                ) -> list[list[Submitted] | adm.Refusal] | None:
        """The submit as one statement, when admission needs no read but its idempotency
        keys' (the client keys every `enqueue`, so a resend is safe): those are taken for
        new, and the statement inserts all its rows or, if any key is held already, none.
        Returns None when it cannot be one statement or a key was held; the caller then
        plans again, reading, in a locked transaction (`reading` begins it)."""
        guard = False

        def taken_for_new(key: str) -> adm.Existing | None:
            nonlocal guard
            guard = True
            return None

        p = adm.plan(requests, now, admission,
                     dataclasses.replace(self._lookups(reading, now, admission, requests),
                                         by_idempotency_key=taken_for_new))
        if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return None  # a lookup read, under the lock: plan again in that transaction
        if any(j.manual for _, _, j in p.inserts):  # an operator's run resumes its pause
            return None
        if guard and any(isinstance(a, adm.Refusal) for a in p.answers):
            return None  # a held key would not have counted against the cap: plan again, reading
        if not p.inserts:
            return adm.finish(p, requests, [], now)
        if guard and len(p.inserts) > _ROWS_PER_INSERT:
            return None  # several statements cannot guard their keys as one
        # No lock: a submit that read nothing is as if it came after any other host's locked
        # admission (a key inserted meanwhile fails the unique index: it plans again).
        if not guard and _by_copy(p):
            with c.transaction():
                ids = self._copy(c, p, now)
            return adm.finish(p, requests, ids, now)
        try:
            ids = self._insert(c, p, now, guard_keys=guard)
        except psycopg.errors.UniqueViolation as e:
            if e.diag.constraint_name != "jobs_idempotency":
                raise
            return None
        if not ids:  # a key is held: nothing was inserted
            return None
        return adm.finish(p, requests, ids, now)

    def unadmitted(self, c: psycopg.Connection, jobs: list[NewJob], now: float) -> None:
        """Insert a workflow step's jobs in the caller's transaction, with no read and no
        submit lock: their limit is their run's budget, and their idempotency keys
        (wf:RUN:STEP:ITEM:LOOP) are new by construction (the transition that enqueues them
        is applied once, under its output's unique row). A key held already (a bug) is left
        out by the unique index, never inserted twice."""
        if jobs:
            self._insert(c, adm.Plan([[None] * len(jobs)], [(0, i, j) for i, j in enumerate(jobs)], [], []), now,
                         new_keys_only=True)

    @staticmethod
    def _copy(c: psycopg.Connection, p: adm.Plan, now: float) -> list[int]:
        """The planned inserts by COPY, in the caller's transaction: their ids drawn first
        (COPY returns none), the rows streamed, the pools of the queued ones woken. Returns
        the ids, ascending in the order of the rows."""
        pools = {j.pool for _, _, j in p.inserts if j.run_at <= now}  # the pools of the queued ones
        ids = sorted(c.execute(_DRAW_IDS, (len(p.inserts),)).fetchone()[0])
        cur = c.cursor()
        for sql, rows in zip(_COPY_SQL, dbrows.split_inserts(ids, p.inserts, now), strict=True):
            if rows:
                with cur.copy(sql) as copy:
                    for row in rows:
                        copy.write_row(row)
        if pools:
            psycopg.RawCursor(c).execute(f"SELECT {_NOTIFY_POOLS}", (QUEUED_CHANNEL, sorted(pools)))
        return ids

    def _insert(self, c: psycopg.Connection, p: adm.Plan, now: float, new_keys_only: bool = False,
                guard_keys: bool = False) -> list[int]:
        """The planned inserts, in statements of at most _ROWS_PER_INSERT rows; the pools of
        the queued ones are woken by the first. Returns the ids of the rows inserted, in
        their order. With guard_keys (one statement only): all or none, as _insert_sql says."""
        flat: list[Any] = []
        pools = set()
        for _, _, j in p.inserts:
            state = insert_state(j.held, j.run_at, now)
            if state == State.QUEUED:
                pools.add(j.pool)
            row = dbrows.insert_values(0, state, now, j)
            flat += row[:_ID_AT]
            flat += row[_ID_AT + 1:]
        # A cursor kept for the connection (one thread at a time holds a connection, and the
        # check is on this local copy): a new one would look up its parameters' dumpers again.
        cur = self.cursor
        if cur is None or cur.connection is not c:
            cur = psycopg.RawCursor(c)
        width, n, ids = len(_NOT_ID), len(p.inserts), []
        for at in range(0, n, _ROWS_PER_INSERT):
            rows = min(_ROWS_PER_INSERT, n - at)
            params = flat[at * width:(at + rows) * width]
            wake = at == 0 and bool(pools)
            row = cur.execute(_insert_sql(rows, wake, new_keys_only, guard_keys),
                              (QUEUED_CHANNEL, sorted(pools), *params) if wake else params).fetchone()
            # One backend draws the ids in the order of the rows: ascending is that order.
            ids += sorted(row[0] or [])
        # Kept only after a small statement: a cursor holds its last parameters until its next
        # statement, and a large one saves no more than a small one.
        small = n <= _KEPT_ROWS and sum(len(v) for v in flat if type(v) is str) <= KEPT_CURSOR_BYTES
        self.cursor = cur if small else None
        return ids

    def _waiting_total(self, reading: Callable[[], psycopg.Connection], cap: int | None, now: float,
                       headroom: int) -> int:
        """Jobs waiting in the whole fleet, or an upper bound of them that decides as the
        exact count would: admission compares it, plus at most `headroom` jobs, with the cap.

        A count younger than _COUNT_TTL stands in: far below the cap, plus what this store
        has added since (no lock; other hosts' submits unseen); otherwise, under the submit
        lock, as a bound: the unfinished jobs then plus the serial's values drawn since
        (every job joining them draws one: DRAW_ONE), while it leaves room for `headroom`.
        Else the count is made again. The bound misses, for the rest of the count's second,
        rows a lock-free writer (another host far below the cap, a workflow step, a cron
        fire, a replay) drew for before the count and commits after it."""
        k = self._counted
        fresh = k is not None and cap is not None and 0 <= now - k.at < _COUNT_TTL
        if fresh and k.waiting + self._inserted_since_count < 0.9 * cap:
            return k.waiting + self._inserted_since_count
        c = reading()  # the submit lock: what follows has seen every locked submit commit
        if k is not None and k.by is reading:
            return k.waiting  # counted in this same submit, under its lock
        drawn = c.execute(_DRAWN).fetchone()[0]  # before any count: a value drawn later is in the bound
        if fresh and k.unfinished + drawn - k.drawn + headroom <= cap:
            return k.unfinished + drawn - k.drawn
        waiting, unfinished = c.execute(_COUNT).fetchone()
        self._counted = Counted(waiting, unfinished, drawn, now, reading)
        self._inserted_since_count = 0
        return waiting

    def _lookups(self, reading: Callable[[], psycopg.Connection], now: float, admission: adm.Admission,
                 requests: Sequence[Sequence[NewJob]]) -> adm.Lookups:
        cap, headroom = admission.max_queued, sum(len(r) for r in requests)

        def by_key(k: str) -> adm.Existing | None:
            row = reading().execute("SELECT id, state, created_at FROM jobs WHERE idempotency_key = %s",
                                    (k,)).fetchone()
            return adm.Existing(*row) if row else None

        def active(key: str) -> int | None:
            row = reading().execute(
                f"SELECT id FROM jobs WHERE key = %s AND state IN {UNFINISHED_IN} ORDER BY id LIMIT 1",
                (key,)).fetchone()
            return row[0] if row else None

        return adm.Lookups(
            by_idempotency_key=by_key,
            waiting_for_key=lambda key: reading().execute(
                f"SELECT count(*) FROM jobs WHERE key = %s AND state IN {WAITING_IN}", (key,)).fetchone()[0],
            waiting_total=lambda: self._waiting_total(reading, cap, now, headroom),
            active_for_key=active,
        )

    def submit_in(self, c: psycopg.Connection, requests: Sequence[Sequence[NewJob]], now: float,
                   admission: adm.Admission, reading: Callable[[], psycopg.Connection] | None = None,
                   ) -> list[list[Submitted] | adm.Refusal]:
        p = adm.plan(requests, now, admission, self._lookups(reading or (lambda: c), now, admission, requests))
        if p.expired_keys:
            c.execute("UPDATE jobs SET idempotency_key = NULL WHERE idempotency_key = ANY(%s)",
                      (p.expired_keys,))
        ids: list[int] = []
        if _by_copy(p):  # a large batch that admission had to read for (a stale count of the waiting)
            ids = self._copy(c, p, now)
        elif p.inserts:
            ids = self._insert(c, p, now)
        manual = {(k, n) for _, _, j in p.inserts if j.manual for k, n in (("key", j.key), ("func", j.func))
                  if n is not None}
        for kind, name in manual:  # an operator's run lifts a pause
            operator.resume(self.d, c, kind, name)
        return adm.finish(p, requests, ids, now)
