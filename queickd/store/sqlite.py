"""SQLite store (`sqlite:///path/to/queue.db`): the durable default for one machine.

WAL journal; synchronous FULL by default (a Pi loses power), NORMAL on request. Every
write in this process goes through one connection, under one Python lock taken before
BEGIN IMMEDIATE, so writers hand over at once instead of backing off in SQLite's sleeping
busy handler; busy_timeout still covers other processes (the CLI, a second daemon by
mistake). Readers use their own per-thread connections and never block writers. Counts by
state are kept in a table (new jobs by the submit, changes of state by triggers), so stats
and the queue cap cost one row read, not a scan of a million jobs.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import functools
import itertools
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence

from ..core.job import DEFAULT_POOL, Job, NewJob, Outcome, State, Submitted
from ..core.policy import admission as adm
from . import rows as dbrows
from .base import (
    CronFire,
    CronRecord,
    EventAccepted,
    EventState,
    Finished,
    NewEvent,
    Pause,
    Recovered,
    StoreBase,
    StoreInUseError,
)
from .pools import set_pool_sql
from .sqlshared import SharedSql

SCHEMA_VERSION = 3  # 2: jobs.pool; 3: inserts counted by the store, not a trigger
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids are never reused
    state TEXT NOT NULL,
    func TEXT NOT NULL,
    args TEXT,                             -- JSON; NULL when empty, to keep rows small
    kwargs TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    run_at REAL NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 1,
    retry TEXT,
    retry_on_network INTEGER NOT NULL DEFAULT 0,
    key TEXT,
    idempotency_key TEXT,
    cron TEXT,
    pool TEXT NOT NULL DEFAULT 'default',
    orphaned INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    finished_at REAL,
    result TEXT,
    error TEXT
);
-- Partial indexes: each holds only the jobs its queries look for, so an insert touches
-- the table, jobs_queued or jobs_scheduled, and nothing else. (A full (state, id) index
-- doubled the cost of an insert.) Queries name their index (INDEXED BY): without
-- statistics the planner may pick a plan that sorts every queued job on each claim.
DROP INDEX IF EXISTS jobs_state;
CREATE INDEX IF NOT EXISTS jobs_queued ON jobs (priority, run_at, id) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS jobs_scheduled ON jobs (run_at) WHERE state = 'scheduled';
-- One small index per rare state (SQLite cannot match `state = 'x'` to `state IN (...)`).
CREATE INDEX IF NOT EXISTS jobs_running ON jobs (id) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (id) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS jobs_waiting_network ON jobs (id) WHERE state = 'waiting_network';
CREATE INDEX IF NOT EXISTS jobs_cancelled ON jobs (id) WHERE state = 'cancelled';
CREATE INDEX IF NOT EXISTS jobs_key ON jobs (key, state) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_cron ON jobs (cron, state) WHERE cron IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS state_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
-- Inserts are counted by _submit_in, once per state and transaction: a per-row trigger
-- cost a quarter of a batched insert. Changes of state and deletes stay with triggers.
DROP TRIGGER IF EXISTS jobs_count_insert;
CREATE TRIGGER IF NOT EXISTS jobs_count_update AFTER UPDATE OF state ON jobs
WHEN OLD.state != NEW.state BEGIN
    UPDATE state_counts SET n = n - 1 WHERE state = OLD.state;
    INSERT INTO state_counts VALUES (NEW.state, 1) ON CONFLICT (state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS jobs_count_delete AFTER DELETE ON jobs BEGIN
    UPDATE state_counts SET n = n - 1 WHERE state = OLD.state;
END;
CREATE TABLE IF NOT EXISTS crons (
    name TEXT PRIMARY KEY,
    schedule TEXT NOT NULL,
    template TEXT NOT NULL,
    next_run_at REAL NOT NULL,
    last_fired_at REAL,
    created_at REAL NOT NULL,
    folded INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS streaks (
    kind TEXT NOT NULL, name TEXT NOT NULL, failures INTEGER NOT NULL, last_error TEXT,
    PRIMARY KEY (kind, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pauses (
    kind TEXT NOT NULL, name TEXT NOT NULL, paused_at REAL NOT NULL, failures INTEGER NOT NULL,
    last_error TEXT, PRIMARY KEY (kind, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    event_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,                   -- pending, delivered, dead
    job TEXT NOT NULL,                     -- the job template, JSON
    func TEXT NOT NULL,
    key TEXT,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL,
    job_id INTEGER,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS events_pending ON events (next_attempt_at) WHERE state = 'pending';
"""
_INSERT = ("INSERT INTO jobs (id, state, func, args, kwargs, priority, run_at, created_at, max_attempts,"
           " retry, retry_on_network, key, idempotency_key, cron, pool) VALUES ", 15)
_INSERT_PLAIN = ("INSERT INTO jobs (id, state, func, run_at, created_at) VALUES ", 5)
_ROWS_MAX = 256  # rows per INSERT statement; statements of 2**k rows, so few distinct ones
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
_RARE = frozenset({State.RUNNING, State.DEAD, State.WAITING_NETWORK, State.CANCELLED})  # own indexes


def _insert_rows(c: sqlite3.Connection, insert: tuple[str, int], rows: list[tuple]) -> None:
    """INSERT rows with multi-row VALUES statements: one statement step for many rows costs
    less than half of executemany's step per row. Chunks of 2**k rows (at most _ROWS_MAX)
    keep the SQL texts few, so the connection's statement cache holds them all."""
    # Older SQLite builds allow 999 parameters per statement, newer ones 32,766.
    fits = min(_ROWS_MAX, c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // insert[1])
    largest = 1 << (fits.bit_length() - 1)
    i, n = 0, len(rows)
    while i < n:
        size = min(largest, 1 << ((n - i).bit_length() - 1))
        c.execute(_values_sql(insert, size), list(itertools.chain.from_iterable(rows[i:i + size])))
        i += size


@functools.cache
def _values_sql(insert: tuple[str, int], rows: int) -> str:
    head, width = insert
    return head + ",".join(["(" + ",".join("?" * width) + ")"] * rows)


class SQLiteStore(SharedSql, StoreBase):
    MARK = "?"  # the parameter marker of sqlite3 (SharedSql)
    supports_notify = False

    def __init__(self, path: str, durability: str = "full", busy_timeout: float = 30.0) -> None:
        if durability not in _SYNCHRONOUS:
            raise ValueError("durability must be 'full' or 'normal'")
        self.path = path
        self.url = f"sqlite:///{path}"
        self.durability = durability
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._w: sqlite3.Connection | None = None  # see _writer
        self._w_sync: str | None = None  # its PRAGMA synchronous, changed under _write_lock
        self._lock_fd: int | None = None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._migrate(self._conn())

    # --- connections ----------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
            c.execute("PRAGMA journal_mode=WAL")
            c.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.durability]}")
            c.execute("PRAGMA journal_size_limit=67108864")  # keep the WAL small on SD cards
            self._local.conn = c
            with self._all_lock:
                self._all.append(c)
        return c

    def _writer(self) -> sqlite3.Connection:
        """The one connection that writes, shared by every thread under _write_lock. One
        connection keeps its page cache across transactions; with one per thread, each
        commit made the other connections drop theirs and read the pages back (a dozen
        pread calls per job). Its synchronous level follows each transaction's needs."""
        if self.path == ":memory:":  # a second connection would be another, empty database
            return self._conn()
        with self._all_lock:
            c = self._w
            if c is None:
                c = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                    check_same_thread=False)
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("PRAGMA journal_size_limit=67108864")  # keep the WAL small on SD cards
                self._w = c
                self._all.append(c)
        return c

    @contextlib.contextmanager
    def _write(self, bookkeeping: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction. `bookkeeping` transactions (claims, finishes, promotions)
        commit without their own fsync in WAL (synchronous=NORMAL): a power cut can undo
        the last of them, and the only effect is that a job runs again (at-least-once).
        Everything else, acknowledged submits above all, commits at the store's
        durability; its fsync also makes every earlier bookkeeping commit durable."""
        inside = getattr(self._local, "batch_conn", None)
        if inside is not None:  # inside batch(): its transaction is ours
            yield inside
            return
        c = self._writer()
        with self._write_lock:
            sync = "NORMAL" if bookkeeping else _SYNCHRONOUS[self.durability]
            if self._w_sync != sync:  # a statement without I/O, only when the level changes
                c.execute(f"PRAGMA synchronous={sync}")
                self._w_sync = sync
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
                c.execute("COMMIT")
            except BaseException:
                # SQLite may already have rolled back (disk full, I/O error); never leave the
                # connection inside a transaction, and never hide the first error.
                if c.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        c.execute("ROLLBACK")
                raise

    def take_ownership(self) -> None:
        # An advisory lock beside the database, held for the daemon's life; the kernel
        # drops it when the process dies, kill -9 included, so no stale lock survives.
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StoreInUseError(f"{self.path} is already served by a daemon (pid {holder}); "
                                  "one store, one daemon") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    @contextlib.contextmanager
    def batch(self, bookkeeping: bool = False) -> Iterator[None]:
        if getattr(self._local, "batch_conn", None) is not None:
            yield
            return
        with self._write(bookkeeping) as c:
            self._local.batch_conn = c
            try:
                yield
            finally:
                self._local.batch_conn = None

    def _migrate(self, c: sqlite3.Connection) -> None:
        with self._write_lock:
            row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() if c.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() else None
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path} has schema version {row[0]}, newer than this queickd ({SCHEMA_VERSION})"
                )
            c.executescript(_SCHEMA)
            # Version 1 files have no pool column: every job they hold is in the default pool.
            if "pool" not in {r[1] for r in c.execute("PRAGMA table_info(jobs)")}:
                c.execute("ALTER TABLE jobs ADD COLUMN pool TEXT NOT NULL DEFAULT 'default'")
            c.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    # --- submit ---------------------------------------------------------------------------
    def submit_requests(
        self, requests: Sequence[Sequence[NewJob]], now: float, admission: adm.Admission = adm.NO_LIMITS
    ) -> list[list[Submitted] | adm.Refusal]:
        with self._write() as c:
            return self._submit_in(c, requests, now, admission)

    def _lookups(self, c: sqlite3.Connection) -> adm.Lookups:
        def by_key(k: str) -> adm.Existing | None:
            row = c.execute("SELECT id, state, created_at FROM jobs WHERE idempotency_key = ?", (k,)).fetchone()
            return adm.Existing(*row) if row else None

        def active(key: str) -> int | None:
            row = c.execute(
                "SELECT id FROM jobs INDEXED BY jobs_key WHERE key = ? AND state IN"
                " ('scheduled', 'queued', 'waiting_network', 'running') ORDER BY id LIMIT 1", (key,)
            ).fetchone()
            return row[0] if row else None

        return adm.Lookups(
            by_idempotency_key=by_key,
            waiting_for_key=lambda key: c.execute(
                "SELECT count(*) FROM jobs INDEXED BY jobs_key WHERE key = ? AND state IN"
                " ('scheduled', 'queued', 'waiting_network')", (key,)).fetchone()[0],
            waiting_total=lambda: c.execute(
                "SELECT coalesce(sum(n), 0) FROM state_counts WHERE state IN"
                " ('scheduled', 'queued', 'waiting_network')").fetchone()[0],
            active_for_key=active,
        )

    def _submit_in(self, c: sqlite3.Connection, requests: Sequence[Sequence[NewJob]], now: float,
                   admission: adm.Admission) -> list[list[Submitted] | adm.Refusal]:
        p = adm.plan(requests, now, admission, self._lookups(c))
        if p.expired_keys:  # an idempotency key past its TTL may name a new job
            c.executemany("UPDATE jobs SET idempotency_key = NULL WHERE idempotency_key = ?",
                          [(k,) for k in p.expired_keys])
        row = c.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        first = (row[0] if row else 0) + 1
        ids = list(range(first, first + len(p.inserts)))
        plain, full = [], []
        for job_id, (_, _, j) in zip(ids, p.inserts, strict=True):
            state = State.QUEUED if j.run_at <= now else State.SCHEDULED
            if (j.args or j.kwargs or j.priority or j.retry or j.retry_on_network or j.key
                    or j.idempotency_key or j.cron or j.pool != DEFAULT_POOL):
                full.append((job_id, state, j.func, dbrows.dumps(j.args) if j.args else None,
                             dbrows.dumps(j.kwargs) if j.kwargs else None, j.priority, j.run_at, now,
                             j.max_attempts, dbrows.dumps(j.retry.to_dict()) if j.retry else None,
                             int(j.retry_on_network), j.key, j.idempotency_key, j.cron, j.pool))
            else:  # binding 5 parameters instead of 14 is most of an insert's Python cost
                plain.append((job_id, state, j.func, j.run_at, now))
        _insert_rows(c, _INSERT_PLAIN, plain)
        _insert_rows(c, _INSERT, full)
        for state, n in collections.Counter(row[1] for rows in (plain, full) for row in rows).items():
            c.execute("INSERT INTO state_counts VALUES (?, ?) ON CONFLICT (state) DO UPDATE SET n = n + excluded.n",
                      (state, n))
        manual = {(k, n) for _, _, j in p.inserts if j.manual for k, n in (("key", j.key), ("func", j.func))
                  if n is not None}
        for kind, name in manual:  # an operator's run lifts a pause
            self._resume_in(c, kind, name)
        return adm.finish(p, requests, ids, now)

    # --- schedule -------------------------------------------------------------------------
    def promote_due(self, now: float) -> int:
        with self._write(bookkeeping=True) as c:
            return c.execute(
                "UPDATE jobs INDEXED BY jobs_scheduled SET state = 'queued'"
                " WHERE state = 'scheduled' AND run_at <= ?", (now,)
            ).rowcount

    def next_scheduled_at(self) -> float | None:
        row = self._conn().execute(
            "SELECT min(run_at) FROM jobs INDEXED BY jobs_scheduled WHERE state = 'scheduled'").fetchone()
        return row[0]

    # --- claim ----------------------------------------------------------------------------
    def claim_available(self, limit: int, now: float, network_up: bool = True,
                        pools: Sequence[str] | None = None) -> list[Job]:
        served = None if pools is None else frozenset(pools)
        if served is not None and not served:
            return []
        with self._write(bookkeeping=True) as c:
            # Keys that cannot start a job (running or paused) and paused functions, in one statement.
            held = c.execute(
                "SELECT 'key', key FROM jobs INDEXED BY jobs_running WHERE state = 'running' AND key IS NOT NULL"
                " UNION ALL SELECT kind, name FROM pauses").fetchall()
            busy = {n for k, n in held if k == "key"}
            paused_funcs = {n for k, n in held if k == "func"}
            chosen: list[int] = []
            offset, page = 0, max(16, limit * 2)
            # Other pools' jobs are passed over inside SQLite, not page by page here; those
            # with a key still come back, as they may hold their key.
            mine = "" if served is None else (
                f" AND (pool IN ({','.join('?' * len(served))}) OR key IS NOT NULL)")
            while len(chosen) < limit:
                rows = c.execute(
                    "SELECT id, key, func, retry_on_network, pool FROM jobs INDEXED BY jobs_queued"
                    f" WHERE state = 'queued'{mine} ORDER BY priority, run_at, id LIMIT ? OFFSET ?",
                    (*(served or ()), page, offset),
                ).fetchall()
                for job_id, key, func, needs_network, pool in rows:
                    if (needs_network and not network_up) or (served is not None and pool not in served):
                        if key is not None:
                            busy.add(key)
                        continue
                    if key in busy or func in paused_funcs:
                        if key is not None:
                            busy.add(key)  # a waiting head holds its key: order within a key
                        continue
                    if key is not None:
                        busy.add(key)  # one job per key, the first in queue order
                    chosen.append(job_id)
                    if len(chosen) == limit:
                        break
                if len(rows) < page:
                    break
                offset += page
            if not chosen:
                return []
            marks = ",".join("?" * len(chosen))
            rows = c.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = ?"
                f" WHERE id IN ({marks}) RETURNING {dbrows.JOB_COLS}", (now, *chosen),
            ).fetchall()
        jobs = [dbrows.row_to_job(r) for r in rows]
        jobs.sort(key=lambda j: (j.priority, j.run_at, j.id))  # RETURNING order is unspecified
        return jobs

    # --- network --------------------------------------------------------------------------
    def park_for_network(self, now: float) -> int:
        with self._write() as c:
            return c.execute(
                "UPDATE jobs INDEXED BY jobs_queued SET state = 'waiting_network'"
                " WHERE state = 'queued' AND retry_on_network = 1"
            ).rowcount

    def release_network_waiting(self, now: float) -> int:
        with self._write() as c:
            return c.execute(
                "UPDATE jobs INDEXED BY jobs_waiting_network SET state = 'queued', run_at = ?"
                " WHERE state = 'waiting_network'", (now,)
            ).rowcount

    # --- finish ---------------------------------------------------------------------------
    def finish_if_running(self, outcomes: Sequence[Outcome], now: float, pause_after: int | None = None) -> Finished:
        changed = 0
        paused: list[Pause] = []
        with self._write(bookkeeping=True) as c:
            # Usually nothing is failing: then a success has no streak to reset.
            any_streak = c.execute("SELECT EXISTS (SELECT 1 FROM streaks)").fetchone()[0]
            if not any_streak and all(o.state == State.SUCCEEDED for o in outcomes):
                # The steady state: successes with no streak to reset need no RETURNING.
                cur = c.executemany(
                    "UPDATE jobs SET state = 'succeeded', result = ?, error = NULL, finished_at = ?"
                    " WHERE id = ? AND state = 'running'",
                    [(None if o.result is None else dbrows.dumps(o.result), now, o.job_id) for o in outcomes])
                return Finished(cur.rowcount, [])
            for o in outcomes:
                row = c.execute(
                    "UPDATE jobs SET state = ?1, run_at = coalesce(?2, run_at), result = ?3, error = ?4,"
                    " finished_at = ?5, attempts = attempts - (?1 = 'waiting_network')"
                    " WHERE id = ?6 AND state = 'running' RETURNING key, func",
                    (o.state, o.run_at, None if o.result is None else dbrows.dumps(o.result),
                     dbrows.dumps(o.error) if o.error else None, now if o.state in State.FINAL else None,
                     o.job_id),
                ).fetchone()
                if row is None:
                    continue
                changed += 1
                if o.state == State.WAITING_NETWORK or o.blameless or (o.state == State.SUCCEEDED and not any_streak):
                    continue
                any_streak = True
                for kind, name in (("key", row[0]), ("func", row[1])):
                    if name is not None:
                        p = self._streak_in(c, kind, name, o, now, pause_after)
                        if p is not None:
                            paused.append(p)
        return Finished(changed, paused)

    def _streak_in(self, c: sqlite3.Connection, kind: str, name: str, o: Outcome, now: float,
                   pause_after: int | None) -> Pause | None:
        if o.state == State.SUCCEEDED:
            c.execute("DELETE FROM streaks WHERE kind = ? AND name = ?", (kind, name))
            return None
        err = dbrows.dumps(o.error) if o.error else None
        failures = c.execute(
            "INSERT INTO streaks VALUES (?, ?, 1, ?) ON CONFLICT (kind, name) DO UPDATE"
            " SET failures = failures + 1, last_error = excluded.last_error RETURNING failures",
            (kind, name, err),
        ).fetchone()[0]
        if pause_after is None or failures < pause_after:
            return None
        if c.execute("SELECT 1 FROM pauses WHERE kind = ? AND name = ?", (kind, name)).fetchone():
            c.execute("UPDATE pauses SET failures = ?, last_error = ? WHERE kind = ? AND name = ?",
                      (failures, err, kind, name))
            return None
        c.execute("INSERT INTO pauses VALUES (?, ?, ?, ?, ?)", (kind, name, now, failures, err))
        return Pause(kind, name, now, failures, o.error)

    def recover_orphans(self, max_requeues: int, now: float) -> Recovered:
        err = dbrows.dumps({"type": "orphaned", "message": "its worker stopped while it ran, too often"})
        with self._write() as c:
            dead = c.execute(
                "UPDATE jobs INDEXED BY jobs_running SET state = 'dead', error = ?, finished_at = ?"
                " WHERE state = 'running' AND orphaned >= ? RETURNING id",
                (err, now, max_requeues),
            ).fetchall()
            requeued = c.execute(
                "UPDATE jobs INDEXED BY jobs_running SET state = 'queued', orphaned = orphaned + 1"
                " WHERE state = 'running' RETURNING id"
            ).fetchall()
        return Recovered(sorted(r[0] for r in requeued), sorted(r[0] for r in dead))

    # --- pauses ---------------------------------------------------------------------------
    def _resume_in(self, c: sqlite3.Connection, kind: str, name: str) -> bool:
        c.execute("DELETE FROM streaks WHERE kind = ? AND name = ?", (kind, name))
        return c.execute("DELETE FROM pauses WHERE kind = ? AND name = ?", (kind, name)).rowcount > 0

    # --- operator actions -----------------------------------------------------------------
    def _update_one(self, sql: str, params: tuple, job_id: int) -> Job | None:
        with self._write() as c:
            c.execute(sql, params)
            row = c.execute(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return dbrows.row_to_job(row) if row else None

    def cancel(self, job_id: int, now: float) -> Job | None:
        return self._update_one(
            "UPDATE jobs SET state = 'cancelled', finished_at = ?"
            " WHERE id = ? AND state IN ('scheduled', 'queued', 'waiting_network')",
            (now, job_id), job_id,
        )

    def retry_dead(self, job_id: int, now: float) -> Job | None:
        return self._update_one(
            "UPDATE jobs SET state = 'queued', run_at = ?, attempts = 0, orphaned = 0,"
            " finished_at = NULL WHERE id = ? AND state = 'dead'",
            (now, job_id), job_id,
        )

    def retry_all_dead(self, now: float) -> int:
        with self._write() as c:
            n = c.execute(
                "UPDATE jobs INDEXED BY jobs_dead SET state = 'queued', run_at = ?, attempts = 0,"
                " orphaned = 0, finished_at = NULL WHERE state = 'dead'", (now,)).rowcount
            n += c.execute(
                "UPDATE events SET state = 'pending', attempts = 0, next_attempt_at = ?"
                " WHERE state = 'dead'", (now,)).rowcount
        return n

    def purge(self, states: Sequence[str], finished_before: float, limit: int) -> int:
        marks = ",".join("?" * len(states))
        with self._write() as c:
            n = c.execute(
                f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_finished"
                f" WHERE finished_at IS NOT NULL AND finished_at < ? AND state IN ({marks})"
                f" ORDER BY finished_at LIMIT ?)",
                (finished_before, *states, limit)).rowcount
            if State.DEAD in states:
                n += c.execute("DELETE FROM events WHERE state = 'dead' AND created_at < ?",
                               (finished_before,)).rowcount
        return n

    # --- inspect --------------------------------------------------------------------------
    def list_jobs(self, state: str | None, limit: int) -> list[Job]:
        if state is None:
            sql, params = f"SELECT {dbrows.JOB_COLS} FROM jobs ORDER BY id DESC LIMIT ?", (limit,)
        else:
            # Rare states have an index; the common ones are found walking back from the
            # newest job (no sort either way).
            if state not in State.ALL:
                raise ValueError(f"unknown state {state!r}")
            # The state is inlined (one of the fixed names): a partial index is usable only
            # when SQLite sees the literal its predicate names.
            hint = f"INDEXED BY jobs_{state}" if state in _RARE else "NOT INDEXED"
            sql = f"SELECT {dbrows.JOB_COLS} FROM jobs {hint} WHERE state = '{state}' ORDER BY id DESC LIMIT ?"
            params = (limit,)
        return [dbrows.row_to_job(r) for r in self._conn().execute(sql, params)]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(State.ALL, 0)
        out.update(self._conn().execute("SELECT state, n FROM state_counts").fetchall())
        return out

    def waiting_by_key(self, limit: int) -> list[tuple[str, int, float]]:
        rows = self._conn().execute(
            "SELECT key, count(*), min(run_at) FROM jobs INDEXED BY jobs_key WHERE key IS NOT NULL"
            " AND state IN ('scheduled', 'queued', 'waiting_network') GROUP BY key"
            " ORDER BY count(*) DESC, key LIMIT ?", (limit,))
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def set_pool(self, kind: str, name: str, pool: str) -> int:
        with self._write() as c:
            return set_pool_sql(c.execute, kind, name, pool, self.MARK)

    def waiting_by_pool(self) -> dict[str, int]:
        return dict(self._conn().execute(
            "SELECT pool, count(*) FROM jobs WHERE state IN ('scheduled', 'queued', 'waiting_network')"
            " GROUP BY pool").fetchall())

    def integrity_check(self) -> str:
        """'ok', or what SQLite's quick_check found wrong."""
        rows = self._conn().execute("PRAGMA quick_check").fetchall()
        return "\n".join(r[0] for r in rows)

    # --- cron -----------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        with self._write() as c:
            c.execute(
                "INSERT OR REPLACE INTO crons VALUES (?,?,?,?,?,?,?)",
                (cron.name, dbrows.dumps(cron.schedule), dbrows.template_to_json(cron.template),
                 cron.next_run_at, cron.last_fired_at, cron.created_at, cron.folded),
            )
        return cron

    def crons_due(self, now: float) -> list[CronRecord]:
        rows = self._conn().execute("SELECT * FROM crons WHERE next_run_at <= ?", (now,))
        return [dbrows.row_to_cron(r) for r in rows]

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> CronFire | None:
        with self._write() as c:
            row = c.execute(
                "SELECT template FROM crons WHERE name = ? AND next_run_at = ?", (name, tick)
            ).fetchone()
            if row is None:
                return None
            waiting = c.execute(
                "SELECT 1 FROM jobs INDEXED BY jobs_cron WHERE cron = ? AND state IN"
                " ('scheduled', 'queued', 'waiting_network') LIMIT 1", (name,)).fetchone()
            c.execute(
                "UPDATE crons SET next_run_at = ?, last_fired_at = ?, folded = folded + ? WHERE name = ?",
                (next_tick, tick, 1 if waiting else 0, name),
            )
            if waiting:
                return CronFire("folded", None)
            t = dbrows.template_from_json(row[0])
            job = dataclasses.replace(t, run_at=now, cron=name, key=t.key or f"cron:{name}",
                                      idempotency_key=f"cron:{name}:{tick!r}")
            answer = self._submit_in(c, [[job]], now, adm.NO_LIMITS)[0]
            return CronFire("fired", answer[0])  # type: ignore[index]

    # --- events ---------------------------------------------------------------------------
    def accept_event(self, event: NewEvent, now: float, admission: adm.Admission) -> EventAccepted:
        template = dbrows.template_to_json(event.job)
        with self._write() as c:
            old = c.execute("SELECT state, job_id FROM events WHERE event_id = ?", (event.event_id,)).fetchone()
            if old:
                return EventAccepted(event.event_id, True, old[0], old[1])
            c.execute(
                "INSERT INTO events (event_id, state, job, func, key, created_at, next_attempt_at)"
                " VALUES (?, 'pending', ?, ?, ?, ?, ?)",
                (event.event_id, template, event.job.func, event.job.key, now, now))
            answer = self._deliver_in(c, event.event_id, template, now, admission)
        if isinstance(answer, adm.Refusal):
            return EventAccepted(event.event_id, False, EventState.PENDING, None)
        return EventAccepted(event.event_id, False, EventState.DELIVERED, answer[0].job_id)

    def deliver_events(self, now: float, admission: adm.Admission, max_attempts: int,
                       backoff: Callable[[int], float], limit: int = 500) -> list[EventAccepted]:
        out = []
        with self._write() as c:
            due = c.execute(
                "SELECT event_id, job, attempts FROM events INDEXED BY events_pending"
                " WHERE state = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?",
                (now, limit)).fetchall()
            for event_id, template, attempts in due:
                answer = self._deliver_in(c, event_id, template, now, admission)
                if not isinstance(answer, adm.Refusal):
                    out.append(EventAccepted(event_id, False, EventState.DELIVERED, answer[0].job_id))
                    continue
                attempts += 1
                dead = attempts >= max_attempts
                c.execute(
                    "UPDATE events SET attempts = ?, state = ?, next_attempt_at = ?, last_error = ?"
                    " WHERE event_id = ?",
                    (attempts, EventState.DEAD if dead else EventState.PENDING, None if dead else now + backoff(attempts),
                     f"{answer.code}: {answer.message}", event_id))
                out.append(EventAccepted(event_id, False, EventState.DEAD if dead else EventState.PENDING, None))
        return out

    def next_event_at(self) -> float | None:
        return self._conn().execute(
            "SELECT min(next_attempt_at) FROM events INDEXED BY events_pending WHERE state = 'pending'"
        ).fetchone()[0]

    def oldest_queued_at(self) -> float | None:
        """For monitoring: the earliest run_at among `queued` jobs."""
        return self._conn().execute(
            "SELECT min(run_at) FROM jobs INDEXED BY jobs_queued WHERE state = 'queued'").fetchone()[0]

    def oldest_pending_event_at(self) -> float | None:
        """For monitoring: when the oldest pending outbox event was created."""
        return self._conn().execute(
            "SELECT min(created_at) FROM events INDEXED BY events_pending WHERE state = 'pending'"
        ).fetchone()[0]

    def close(self) -> None:
        with self._all_lock:
            for c in self._all:
                with contextlib.suppress(sqlite3.Error):
                    c.close()
            self._all.clear()
            self._w, self._w_sync = None, None
        self._local = threading.local()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the daemon's lock
            self._lock_fd = None
