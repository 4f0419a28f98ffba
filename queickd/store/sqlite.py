"""SQLite store (`sqlite:///path/to/queue.db`): the durable default for one machine.

WAL journal; synchronous FULL by default (a Pi loses power), NORMAL on request. Writers
in this process take one Python lock before BEGIN IMMEDIATE, so they hand over at once
instead of backing off in SQLite's sleeping busy handler; busy_timeout still covers other
processes (the CLI, a second daemon by mistake). Readers use their own per-thread
connections and never block writers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from .. import retry as retry_mod
from ..job import Job, NewJob, Outcome, State, Submitted
from .base import CronRecord, Recovered

SCHEMA_VERSION = 1
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
    orphaned INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    finished_at REAL,
    result TEXT,
    error TEXT
);
-- Partial indexes: the hot ones only hold jobs that can still move. Queries name them
-- (INDEXED BY): without statistics the planner would pick jobs_state and sort every
-- queued job on each claim.
CREATE INDEX IF NOT EXISTS jobs_queued ON jobs (priority, run_at, id) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS jobs_scheduled ON jobs (run_at) WHERE state = 'scheduled';
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, id);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS crons (
    name TEXT PRIMARY KEY,
    schedule TEXT NOT NULL,
    template TEXT NOT NULL,
    next_run_at REAL NOT NULL,
    last_fired_at REAL,
    created_at REAL NOT NULL
);
"""
_COLS = (
    "id, func, args, kwargs, state, priority, run_at, created_at, attempts, max_attempts, retry,"
    " retry_on_network, key, idempotency_key, cron, orphaned, started_at, finished_at, result, error"
)
_INSERT = (
    "INSERT INTO jobs (id, state, func, args, kwargs, priority, run_at, created_at, max_attempts,"
    " retry, retry_on_network, key, idempotency_key, cron) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}


def _dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _row_to_job(r: tuple) -> Job:
    return Job(
        id=r[0], func=r[1], args=json.loads(r[2]) if r[2] else [],
        kwargs=json.loads(r[3]) if r[3] else {}, state=r[4], priority=r[5], run_at=r[6],
        created_at=r[7], attempts=r[8], max_attempts=r[9],
        retry=retry_mod.spec_from_dict(json.loads(r[10])) if r[10] else None,
        retry_on_network=bool(r[11]), key=r[12], idempotency_key=r[13], cron=r[14],
        orphaned=r[15], started_at=r[16], finished_at=r[17],
        result=json.loads(r[18]) if r[18] is not None else None,
        error=json.loads(r[19]) if r[19] else None,
    )


def _template_to_json(t: NewJob) -> str:
    return _dumps({
        "func": t.func, "args": t.args, "kwargs": t.kwargs, "priority": t.priority,
        "retry": t.retry.to_dict() if t.retry else None, "retry_on_network": t.retry_on_network,
        "key": t.key,
    })


def _template_from_json(s: str) -> NewJob:
    d = json.loads(s)
    d["retry"] = retry_mod.spec_from_dict(d.get("retry"))
    return NewJob(**d)


def _row_to_cron(r: tuple) -> CronRecord:
    return CronRecord(
        name=r[0], schedule=json.loads(r[1]), template=_template_from_json(r[2]),
        next_run_at=r[3], last_fired_at=r[4], created_at=r[5],
    )


class SQLiteStore:
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
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
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

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        c = self._conn()
        with self._write_lock:
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

    def _migrate(self, c: sqlite3.Connection) -> None:
        with self._write_lock:
            c.executescript(_SCHEMA)
            row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path} has schema version {row[0]}, newer than this queickd ({SCHEMA_VERSION})"
                )

    # --- submit ---------------------------------------------------------------------------
    def submit(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        with self._write() as c:
            return self._insert(c, jobs, now)

    def _insert(self, c: sqlite3.Connection, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        out: list[Submitted | None] = [None] * len(jobs)
        seen: dict[str, Submitted] = {}
        for i, j in enumerate(jobs):
            k = j.idempotency_key
            if k is None:
                continue
            if k in seen:
                out[i] = Submitted(seen[k].job_id, seen[k].state, duplicate=True)
                continue
            row = c.execute("SELECT id, state FROM jobs WHERE idempotency_key = ?", (k,)).fetchone()
            if row:
                out[i] = seen[k] = Submitted(row[0], row[1], duplicate=True)
        row = c.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        next_id = (row[0] if row else 0) + 1
        rows = []
        for i, j in enumerate(jobs):
            if out[i] is not None:
                continue
            first = seen.get(j.idempotency_key) if j.idempotency_key is not None else None
            if first is not None:  # the same key earlier in this batch
                out[i] = Submitted(first.job_id, first.state, duplicate=True)
                continue
            state = State.QUEUED if j.run_at <= now else State.SCHEDULED
            out[i] = Submitted(next_id, state)
            if j.idempotency_key is not None:
                seen[j.idempotency_key] = out[i]
            rows.append((
                next_id, state, j.func, _dumps(j.args) if j.args else None,
                _dumps(j.kwargs) if j.kwargs else None, j.priority, j.run_at, now,
                j.max_attempts, _dumps(j.retry.to_dict()) if j.retry else None,
                int(j.retry_on_network), j.key, j.idempotency_key, j.cron,
            ))
            next_id += 1
        c.executemany(_INSERT, rows)
        return out  # type: ignore[return-value]

    # --- schedule -------------------------------------------------------------------------
    def promote_due(self, now: float) -> int:
        with self._write() as c:
            return c.execute(
                "UPDATE jobs INDEXED BY jobs_scheduled SET state = 'queued'"
                " WHERE state = 'scheduled' AND run_at <= ?", (now,)
            ).rowcount

    def next_scheduled_at(self) -> float | None:
        row = self._conn().execute("SELECT min(run_at) FROM jobs INDEXED BY jobs_scheduled WHERE state = 'scheduled'").fetchone()
        return row[0]

    # --- claim ----------------------------------------------------------------------------
    def claim_available(self, limit: int, now: float, network_up: bool = True) -> list[Job]:
        with self._write() as c:
            rows = c.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = ?"
                " WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_queued WHERE state = 'queued'"
                "              AND (? OR retry_on_network = 0)"
                "              ORDER BY priority, run_at, id LIMIT ?)"
                f" RETURNING {_COLS}",
                (now, int(network_up), limit),
            ).fetchall()
        jobs = [_row_to_job(r) for r in rows]
        jobs.sort(key=lambda j: (j.priority, j.run_at, j.id))  # RETURNING order is unspecified
        return jobs

    # --- network --------------------------------------------------------------------------
    def park_for_network(self, now: float) -> int:
        with self._write() as c:
            return c.execute(
                "UPDATE jobs SET state = 'waiting_network' WHERE state = 'queued' AND retry_on_network = 1"
            ).rowcount

    def release_network_waiting(self, now: float) -> int:
        with self._write() as c:
            return c.execute(
                "UPDATE jobs SET state = 'queued', run_at = ? WHERE state = 'waiting_network'", (now,)
            ).rowcount

    # --- finish ---------------------------------------------------------------------------
    def finish_if_running(self, outcomes: Sequence[Outcome], now: float) -> int:
        rows = [
            (
                o.state, o.run_at, None if o.result is None else _dumps(o.result),
                _dumps(o.error) if o.error else None, now if o.state in State.FINAL else None,
                o.job_id,
            )
            for o in outcomes
        ]
        with self._write() as c:
            return c.executemany(
                "UPDATE jobs SET state = ?1, run_at = coalesce(?2, run_at), result = ?3, error = ?4,"
                " finished_at = ?5, attempts = attempts - (?1 = 'waiting_network')"
                " WHERE id = ?6 AND state = 'running'",
                rows,
            ).rowcount

    def recover_orphans(self, max_requeues: int, now: float) -> Recovered:
        err = _dumps({"type": "orphaned", "message": "its worker stopped while it ran, too often"})
        with self._write() as c:
            dead = c.execute(
                "UPDATE jobs SET state = 'dead', error = ?, finished_at = ?"
                " WHERE state = 'running' AND orphaned >= ? RETURNING id",
                (err, now, max_requeues),
            ).fetchall()
            requeued = c.execute(
                "UPDATE jobs SET state = 'queued', orphaned = orphaned + 1"
                " WHERE state = 'running' RETURNING id"
            ).fetchall()
        return Recovered(sorted(r[0] for r in requeued), sorted(r[0] for r in dead))

    # --- operator actions -----------------------------------------------------------------
    def _update_one(self, sql: str, params: tuple, job_id: int) -> Job | None:
        with self._write() as c:
            c.execute(sql, params)
            row = c.execute(f"SELECT {_COLS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(row) if row else None

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

    # --- inspect --------------------------------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        row = self._conn().execute(f"SELECT {_COLS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_job(row) if row else None

    def list_jobs(self, state: str | None, limit: int) -> list[Job]:
        if state is None:
            sql, params = f"SELECT {_COLS} FROM jobs ORDER BY id DESC LIMIT ?", (limit,)
        else:
            sql = f"SELECT {_COLS} FROM jobs WHERE state = ? ORDER BY id DESC LIMIT ?"
            params = (state, limit)
        return [_row_to_job(r) for r in self._conn().execute(sql, params)]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(State.ALL, 0)
        out.update(self._conn().execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
        return out

    # --- cron -----------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        with self._write() as c:
            c.execute(
                "INSERT OR REPLACE INTO crons VALUES (?,?,?,?,?,?)",
                (cron.name, _dumps(cron.schedule), _template_to_json(cron.template),
                 cron.next_run_at, cron.last_fired_at, cron.created_at),
            )
        return cron

    def cron_list(self) -> list[CronRecord]:
        return [_row_to_cron(r) for r in self._conn().execute("SELECT * FROM crons ORDER BY name")]

    def cron_delete(self, name: str) -> bool:
        with self._write() as c:
            return c.execute("DELETE FROM crons WHERE name = ?", (name,)).rowcount > 0

    def crons_due(self, now: float) -> list[CronRecord]:
        rows = self._conn().execute("SELECT * FROM crons WHERE next_run_at <= ?", (now,))
        return [_row_to_cron(r) for r in rows]

    def next_cron_at(self) -> float | None:
        return self._conn().execute("SELECT min(next_run_at) FROM crons").fetchone()[0]

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> Submitted | None:
        with self._write() as c:
            row = c.execute(
                "SELECT template FROM crons WHERE name = ? AND next_run_at = ?", (name, tick)
            ).fetchone()
            if row is None:
                return None
            c.execute(
                "UPDATE crons SET next_run_at = ?, last_fired_at = ? WHERE name = ?",
                (next_tick, tick, name),
            )
            job = dataclasses.replace(
                _template_from_json(row[0]), run_at=now, cron=name,
                idempotency_key=f"cron:{name}:{tick!r}",
            )
            return self._insert(c, [job], now)[0]

    def integrity_check(self) -> str:
        """'ok', or what SQLite's quick_check found wrong."""
        rows = self._conn().execute("PRAGMA quick_check").fetchall()
        return "\n".join(r[0] for r in rows)

    def close(self) -> None:
        with self._all_lock:
            for c in self._all:
                with contextlib.suppress(sqlite3.Error):
                    c.close()
            self._all.clear()
        self._local = threading.local()
