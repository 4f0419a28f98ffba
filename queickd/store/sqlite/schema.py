"""The SQLite schema, as numbered migrations applied at open.

`migrate()` applies each step the file lacks (its version: the `schema_version` row of
`meta`, 0 for a new file) in order, one transaction per step, the step and its new version
committed together; a file of a newer queickd is refused. The version is read again inside
BEGIN IMMEDIATE, so two processes opening the file at once apply nothing twice. A shipped
step is never edited; a new one is appended. New files replay every step, so a file made
today and one upgraded from an old release have the same schema.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from . import resource_steps
from .ddl import add_column, run_script
from .transactions import immediate

# Version 1, as the last release of schema 1 left it. Every statement is IF [NOT] EXISTS:
# files of the first releases of schema 1 lack some of these tables, and step 2 runs it
# again to complete them.
_V1 = """
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
    CREATE TRIGGER IF NOT EXISTS jobs_count_insert AFTER INSERT ON jobs BEGIN
        INSERT INTO state_counts VALUES (NEW.state, 1) ON CONFLICT (state) DO UPDATE SET n = n + 1;
    END;
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


def _v1(c: sqlite3.Connection) -> None:
    """Tables, partial indexes, state counts kept by triggers, crons, streaks, pauses, events."""
    run_script(c, _V1)


def _v2(c: sqlite3.Connection) -> None:
    """jobs.pool: every job of an older file is in the default pool."""
    run_script(c, _V1)  # early schema-1 files: the tables added while the version stayed 1
    add_column(c, "jobs", "pool", "TEXT NOT NULL DEFAULT 'default'")


def _v3(c: sqlite3.Connection) -> None:
    """Inserts are counted by the store, once per state and transaction: a per-row trigger
    cost a quarter of a batched insert. Changes of state and deletes stay with triggers."""
    c.execute("DROP TRIGGER IF EXISTS jobs_count_insert")


def _v4(c: sqlite3.Connection) -> None:
    """Pauses are circuit breakers: the next probe time, the trips so far and the job last
    let through as the probe. A pause of an older file has no probe time: it lasts until
    resumed, as it did."""
    add_column(c, "pauses", "probe_at", "REAL")
    add_column(c, "pauses", "trips", "INTEGER NOT NULL DEFAULT 0")
    add_column(c, "pauses", "probe_job", "INTEGER")


def _v5(c: sqlite3.Connection) -> None:
    """Per-minute counters of runs (and the sampled queue depth), per daemon or worker: the
    status page's chart and the last hour's counts survive a restart. Kept for a day (the
    retention sweep prunes them), so the table stays small."""
    c.execute("CREATE TABLE IF NOT EXISTS minutes (minute INTEGER NOT NULL, member TEXT NOT NULL,"
              " completed INTEGER NOT NULL, failed INTEGER NOT NULL, seconds REAL NOT NULL, depth INTEGER,"
              " PRIMARY KEY (minute, member)) WITHOUT ROWID")


def _v6(c: sqlite3.Connection) -> None:
    """Resource control: jobs.concurrency_group, concurrency_limit, cost_units (NULL: none,
    none, 1). The claim reads running jobs through jobs_running and skips full groups in
    its walk of jobs_queued; no index more on the insert path. `footprints`: each
    function's expected peak memory and runtime (core/policy/memory.py)."""
    for column, decl in (("concurrency_group", "TEXT"), ("concurrency_limit", "INTEGER"), ("cost_units", "REAL")):
        add_column(c, "jobs", column, decl)
    c.execute("CREATE TABLE IF NOT EXISTS footprints (func TEXT PRIMARY KEY, peak REAL NOT NULL,"
              " runtime REAL NOT NULL, runs INTEGER NOT NULL, estimated INTEGER NOT NULL, updated_at REAL NOT NULL)"
              " WITHOUT ROWID")


def _v7(c: sqlite3.Connection) -> None:
    """jobs.isolation, timeout, memory_mb, output_kb: where a job runs and its limits; NULL
    (every older job) means the function's or the daemon's setting."""
    for column, decl in (("isolation", "TEXT"), ("timeout", "REAL"), ("memory_mb", "INTEGER"),
                         ("output_kb", "INTEGER")):
        add_column(c, "jobs", column, decl)


WORKFLOW_STATES = """
    CREATE TABLE IF NOT EXISTS workflow_states (
        run INTEGER PRIMARY KEY,               -- workflow_runs.id
        state TEXT NOT NULL                    -- JSON object
    );
"""

_WORKFLOWS = """
    CREATE TABLE IF NOT EXISTS workflow_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        status TEXT NOT NULL,
        step INTEGER NOT NULL,
        parent INTEGER,                        -- the run whose step started this one
        root INTEGER,                          -- the topmost run; NULL for a topmost run
        idempotency_key TEXT,
        definition TEXT NOT NULL,              -- JSON, children inline
        state TEXT NOT NULL,                   -- unused: '' (workflow_states has it, since v16)
        meta TEXT NOT NULL,                    -- JSON: loop, visits, usage, progress, reason, parent
        created_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE UNIQUE INDEX IF NOT EXISTS workflow_runs_idempotency ON workflow_runs (idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX IF NOT EXISTS workflow_runs_status ON workflow_runs (status, id);
    CREATE INDEX IF NOT EXISTS workflow_runs_root ON workflow_runs (root, status) WHERE root IS NOT NULL;
    -- One output per (run, step, item, loop): a step's job finishing twice (re-run after a
    -- crash) cannot be applied twice.
    CREATE TABLE IF NOT EXISTS workflow_outputs (
        run INTEGER NOT NULL,
        step INTEGER NOT NULL,
        item INTEGER NOT NULL,
        loop_no INTEGER NOT NULL,
        ok INTEGER NOT NULL,
        value TEXT,
        job_id INTEGER,
        recorded_at REAL NOT NULL,
        PRIMARY KEY (run, step, item, loop_no)
    ) WITHOUT ROWID;
    -- Only step jobs are in it, so other jobs' inserts do not touch it.
    CREATE INDEX IF NOT EXISTS jobs_workflow ON jobs (workflow_run, state) WHERE workflow_run IS NOT NULL;
"""


def _v8(c: sqlite3.Connection) -> None:
    """Workflow runs and their step outputs; a step job's run, step, item and loop."""
    for column in ("workflow_run", "workflow_step", "workflow_item", "workflow_loop"):
        add_column(c, "jobs", column, "INTEGER")
    run_script(c, _WORKFLOWS)


def _v9(c: sqlite3.Connection) -> None:
    """jobs.output: a process run's captured stdout+stderr; NULL for every older job (a
    failed one's is in its error, as it was kept then)."""
    add_column(c, "jobs", "output", "TEXT")


def _v10(c: sqlite3.Connection) -> None:
    """The queued jobs also kept without a group (jobs_queued_plain) and by group
    (jobs_queued_group): a claim with full groups reads the ungrouped jobs and each other
    group's first ones, merged in queue order, so it no longer walks the full groups'
    backlog in jobs_queued to reach the jobs behind it. One index entry more per queued job."""
    c.execute("CREATE INDEX IF NOT EXISTS jobs_queued_plain ON jobs (priority, run_at, id)"
              " WHERE state = 'queued' AND concurrency_group IS NULL")
    c.execute("CREATE INDEX IF NOT EXISTS jobs_queued_group ON jobs (concurrency_group, priority, run_at, id)"
              " WHERE state = 'queued' AND concurrency_group IS NOT NULL")


def _v11(c: sqlite3.Connection) -> None:
    """The pending events by serial key: a new event's place behind its key's, and a refused
    one holding its key's later events (outbox.KeyOrder), read without a scan of the outbox."""
    c.execute("CREATE INDEX IF NOT EXISTS events_pending_key ON events (key, next_attempt_at)"
              " WHERE state = 'pending' AND key IS NOT NULL")


def _v12(c: sqlite3.Connection) -> None:
    """The pending events of each serial key made due in the order they were accepted
    (rowid): rows an earlier version wrote may have a later event due before an earlier."""
    from ..sql.schedule import REPAIR_KEY_ORDER

    c.execute(REPAIR_KEY_ORDER.format(order="rowid"))


def _v13(c: sqlite3.Connection) -> None:
    """Each queued job in one queue-order index, not two: jobs_queued (every queued job)
    gives way to jobs_queued_grouped (those with a group), beside jobs_queued_plain (those
    without); the claim reads the queue's head as a merge of the two walks. A plain job, the
    common one, had an entry in both jobs_queued and jobs_queued_plain: one B-tree more to
    write on every submit, claim and WAL commit."""
    c.execute("CREATE INDEX IF NOT EXISTS jobs_queued_grouped ON jobs (priority, run_at, id)"
              " WHERE state = 'queued' AND concurrency_group IS NOT NULL")
    c.execute("DROP INDEX IF EXISTS jobs_queued")


def _v14(c: sqlite3.Connection) -> None:
    """jobs.cron_until: the last tick folded into a cron's run while it waited (NULL: none,
    and for every older job)."""
    add_column(c, "jobs", "cron_until", "REAL")


def _v15(c: sqlite3.Connection) -> None:
    """The delivered events by when they were accepted: retention's prune of those whose job
    is gone reads the old ones only, not the whole outbox once a sweep. One index entry per
    delivered event."""
    c.execute("CREATE INDEX IF NOT EXISTS events_delivered ON events (created_at) WHERE state = 'delivered'")


def _v16(c: sqlite3.Connection) -> None:
    """A workflow run's state in a table of its own (workflow_states): an update of the run's
    row rewrites the whole row, and a fan-out's every item updates its progress, so each
    item rewrote the state, whose list of items grows with the fan-out. workflow_runs.state
    is left empty (a column SQLite before 3.35 cannot drop)."""
    run_script(c, WORKFLOW_STATES)
    c.execute("INSERT OR IGNORE INTO workflow_states (run, state) SELECT id, state FROM workflow_runs")
    c.execute("UPDATE workflow_runs SET state = '' WHERE state != ''")


def _v17(c: sqlite3.Connection) -> None:
    """The queue-order indexes keyed by pool first (jobs_queued_pool_plain, _grouped,
    _group in place of jobs_queued_plain, _grouped, _group): a claim walks the pools it
    serves, each on its own, so jobs waiting in a pool nobody serves, and their groups,
    cost it nothing. As many index entries per queued job as before."""
    for name, cols, grouped in (("plain", "pool, priority, run_at, id", "IS NULL"),
                                ("grouped", "pool, priority, run_at, id", "IS NOT NULL"),
                                ("group", "pool, concurrency_group, priority, run_at, id", "IS NOT NULL")):
        c.execute(f"CREATE INDEX IF NOT EXISTS jobs_queued_pool_{name} ON jobs ({cols})"
                  f" WHERE state = 'queued' AND concurrency_group {grouped}")
        c.execute(f"DROP INDEX IF EXISTS jobs_queued_{name}")


def _v18(c: sqlite3.Connection) -> None:
    """jobs.progress: what a running job last said of its progress (NULL: nothing, and for
    every older job)."""
    add_column(c, "jobs", "progress", "TEXT")


def _v19(c: sqlite3.Connection) -> None:
    """An edge daemon's jobs for its upstream: jobs.upstream_id (their id there, NULL for
    every other job) and one small index per state of theirs, held (read oldest first by
    the forwarder) and forwarded."""
    add_column(c, "jobs", "upstream_id", "INTEGER")
    c.execute("CREATE INDEX IF NOT EXISTS jobs_held ON jobs (id) WHERE state = 'held'")
    c.execute("CREATE INDEX IF NOT EXISTS jobs_forwarded ON jobs (id) WHERE state = 'forwarded'")
def _v20(c: sqlite3.Connection) -> None:
    """jobs.stalled_after, on_stall and stalled_at: a job's liveness (core/policy/liveness.py)
    and the mark its worker sets while it is stalled (NULL: not watched, not stalled, and
    for every older job)."""
    add_column(c, "jobs", "stalled_after", "REAL")
    add_column(c, "jobs", "on_stall", "TEXT")
    add_column(c, "jobs", "stalled_at", "REAL")


# MIGRATIONS[i] brings a file from version i to i + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9, _v10,
                                                          _v11, _v12, _v13, _v14, _v15, _v16, _v17,
                                                          _v18, _v19, _v20, *resource_steps.STEPS]
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNewError(RuntimeError):
    """The file was written by a newer queickd, with a schema this one does not know."""


def version(c: sqlite3.Connection) -> int:
    """The file's schema version; 0 for a file queickd never opened."""
    if c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
        return 0
    row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(c: sqlite3.Connection, path: str) -> int:
    """Bring the file up to SCHEMA_VERSION, one transaction per step. `c` is in autocommit
    mode (isolation_level None). Returns the version. Raises SchemaTooNewError for a file
    of a newer queickd, before changing anything."""
    while True:
        with immediate(c):
            current = version(c)
            if current > SCHEMA_VERSION:
                raise SchemaTooNewError(
                    f"{path} has schema version {current}, newer than this queickd knows ({SCHEMA_VERSION}):"
                    " it was written by a newer queickd; upgrade queickd to open it")
            if current == SCHEMA_VERSION:
                return current
            MIGRATIONS[current](c)
            c.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(current + 1),))
