"""Enqueue in the application's own PostgreSQL transaction: the job exists if and only if the
application's write commits, and idle workers hear of it at that commit (NOTIFY rides on
the commit; a rolled-back transaction wakes nobody).

    with conn.transaction():
        conn.execute("INSERT INTO orders ...")
        job_id = queickd.pg.enqueue(conn, "app.tasks:ship", args=[order_id], key=f"order-{order_id}")

`conn` is a psycopg 3 connection (from SQLAlchemy: `Connection.connection.driver_connection`;
from Django: `django.db.connection.connection` inside `transaction.atomic()`). The options
are the wire protocol's enqueue fields (kwargs, delay, run_at, priority, retry, key,
idempotency_key, pool, ...), checked as the daemon checks them. Both calls run the SQL
function `<schema>.enqueue_many` (store/postgres/enqueue_sql.py), as `<schema>.enqueue`
does, so a job enqueued from Python, from psql or from a trigger meets the same rules, the
ones the daemons published; a plain job (func, args, kwargs) enqueued alone is one INSERT
built from the same rules (enqueue_sql.plain_insert), the function's statements saved.

A refusal (`queue_full`, `conflict`) or a bad job raises QueueError with the wire
protocol's code. Like any failed statement it leaves the transaction failed: run the call
inside `with conn.transaction():` (a savepoint) to go on with the transaction after one.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .core import jsontext
from .core.job import State
from .core.protocol import Code, QueueError, bad, parse_job
from .store import rows as dbrows
from .store.postgres.enqueue_sql import ERRORS, plain_insert
from .store.postgres.namespace import DEFAULT_SCHEMA, ident, missing_schema_hint

try:
    import psycopg
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError("queickd.pg needs psycopg 3: pip install 'queickd[postgres]'") from e
from psycopg.rows import tuple_row

_MISSING = ("3F000", "42883", "42P01")  # no such schema, function or table
_FAILED = "the connection's transaction has failed: roll it back (or to a savepoint) first"
_PLAIN_OPTIONS = frozenset({"kwargs"})  # what a plain job may give beside func and args
_FUNC, _ARGS, _KWARGS = (dbrows.INSERT_COLS.index(c) for c in ("func", "args", "kwargs"))


def enqueue(conn: psycopg.Connection, func: str, args: Sequence[Any] | None = None, *,
            schema: str = DEFAULT_SCHEMA, **options: Any) -> int:
    """Enqueue one job in `conn`'s transaction (or, in autocommit with none open, as one of
    its own); returns its id (an existing job's, for a live idempotency key)."""
    if options.keys() <= _PLAIN_OPTIONS:  # a plain job: one statement of its own
        job_id = _enqueue_plain(conn, func, args, options.get("kwargs"), schema)
        if job_id is not None:
            return job_id
    return enqueue_many(conn, [{"func": func, "args": args, **options}], schema=schema)[0]


def _enqueue_plain(conn: psycopg.Connection, func: str, args: Sequence[Any] | None,
                   kwargs: Mapping[str, Any] | None, schema: str) -> int | None:
    """A job of func, args and kwargs alone, checked by the wire protocol's checks and
    stored in its columns as the daemon stores them, by the statement of enqueue_sql.py's
    plain_insert: its id, or None if the overall cap refuses it (nothing inserted)."""
    spec = {"func": func}
    if args is not None:
        spec["args"] = args
    if kwargs is not None:
        spec["kwargs"] = kwargs
    try:
        job = parse_job(spec, 0.0)
    except QueueError as e:
        raise bad(e.message) from None
    try:
        row = dbrows.insert_values(0, State.QUEUED, 0.0, job)
    except (TypeError, ValueError) as e:
        raise bad(f"the job's arguments are not JSON: {e}") from None
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        raise bad(_FAILED)
    try:
        got = _cursor(conn).execute(_plain_sql(schema), (row[_FUNC], row[_ARGS], row[_KWARGS]),
                                    prepare=True).fetchone()
    except psycopg.Error as e:
        raise _queue_error(e, schema) from e
    return None if got is None else got[0]


def enqueue_many(conn: psycopg.Connection, jobs: Iterable[Mapping[str, Any]], *,
                 schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Enqueue jobs (each a mapping of `func`, `args` and the options) in `conn`'s
    transaction, all or none, as the daemon admits one `enqueue_many` request: a refusal of
    any job (`queue_full`, `conflict`, a bad job) raises and inserts none of them. One
    statement, `<schema>.enqueue_many`. Returns their ids in order."""
    specs = [dict(j) for j in jobs]
    if not specs:
        return []
    now = time.time()
    payload = []
    for i, spec in enumerate(specs):
        try:
            parse_job(spec, now)  # the wire protocol's checks, with its messages
        except QueueError as e:
            raise bad(f"jobs[{i}]: {e.message}" if len(specs) > 1 else e.message) from None
        payload.append({k: v for k, v in spec.items() if v is not None})
    try:
        text = jsontext.dumps(payload)
    except (TypeError, ValueError) as e:
        raise bad(f"the job's arguments are not JSON: {e}") from None
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        raise bad(_FAILED)
    try:
        # A cursor of its own: a kept one would hold the batch's text until its next statement.
        cur = conn.cursor(row_factory=tuple_row)
        return list(cur.execute(_call(schema), (text,), prepare=True).fetchone()[0])
    except psycopg.Error as e:
        raise _queue_error(e, schema) from e


@functools.lru_cache(maxsize=16)
def _call(schema: str) -> str:
    """The one statement of every batch: its text built once, prepared on the connection
    from the first call."""
    return f"SELECT {ident(schema)}.enqueue_many(%s::jsonb)"


@functools.lru_cache(maxsize=16)
def _plain_sql(schema: str) -> str:
    return plain_insert(ident(schema))


def _cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """The plain job's cursor on `conn`, kept on the connection: a new one each call costs
    the client a good part of the call (its parameters' dumpers looked up again). Rows as
    tuples whatever the connection's row factory; one per thread, since a cursor's result
    is its own until its next statement."""
    kept = conn.__dict__.setdefault("_queickd_cursors", {})
    thread = threading.get_ident()
    cur = kept.get(thread)
    if cur is None or cur.closed:
        cur = kept[thread] = conn.cursor(row_factory=tuple_row)
    return cur


def _queue_error(e: psycopg.Error, schema: str) -> Exception:
    state = e.sqlstate or ""
    if state in ERRORS:
        diag = e.diag
        code = ERRORS[state]
        message = (diag.message_primary or str(e)).removeprefix(code + ": ")
        job_id = int(diag.message_detail) if code == Code.CONFLICT and diag.message_detail else None
        retry_after = float(diag.message_hint) if code == Code.QUEUE_FULL and diag.message_hint else None
        return QueueError(code, message, retry_after=retry_after, job_id=job_id)
    if state in _MISSING:
        return QueueError(Code.NOT_FOUND, missing_schema_hint(schema))
    return e
