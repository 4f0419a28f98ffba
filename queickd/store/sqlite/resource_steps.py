"""SQLite's schema steps of resource control, migrations 21 to 26: rate keys (a job's
rate_limit, each key's window and its starts) and fair keys (a job's fair_by, each key's
queued count and standing, kept by triggers), with the queue-order walks they split. The
key expressions the claim's SQL must spell as the indexes do are named here once
(RATE_KEY, RATE_KEY_FULL). schema.py lists these steps in their place."""

from __future__ import annotations

import sqlite3

from .ddl import add_column, run_script

RATE_KEY = "json_extract(rate_limit, '$.key')"  # a queued job's rate key, as jobs_queued_pool_rate_key holds it
RATE_KEY_FULL = "lim - kept <= 0"  # a rate key at its limit by count, as rate_keys_full holds it (the same text)
RATE_KEYS_21 = """
    CREATE TABLE IF NOT EXISTS rate_keys (
        key TEXT PRIMARY KEY,
        lim INTEGER NOT NULL,                  -- as the key's latest started job carried it
        per REAL NOT NULL,
        blocked_until REAL,                    -- no job of the key starts before (a 429's Retry-After)
        starts TEXT NOT NULL DEFAULT '[]'      -- JSON: the latest start times, at most lim (24: rate_starts)
    ) WITHOUT ROWID;
"""


def v21(c: sqlite3.Connection) -> None:
    """jobs.rate_limit (JSON {"key", "limit", "per"}; NULL: none, and for every older job)
    and rate_keys, each rate key's window: its latest starts and when it is blocked until.
    The queued jobs without a group are walked in two parts, without a rate limit
    (jobs_queued_pool_plain, made again without them) and with one (jobs_queued_pool_rated),
    and the latter also by rate key (jobs_queued_pool_rate_key): a claim reads past a full
    key's backlog by key, as past a full group's. Each queued job is still in one walk."""
    add_column(c, "jobs", "rate_limit", "TEXT")
    run_script(c, RATE_KEYS_21)
    c.execute("DROP INDEX IF EXISTS jobs_queued_pool_plain")
    for name, cols, rated in (("plain", "pool, priority, run_at, id", "IS NULL"),
                              ("rated", "pool, priority, run_at, id", "IS NOT NULL"),
                              ("rate_key", f"pool, {RATE_KEY}, priority, run_at, id", "IS NOT NULL")):
        c.execute(f"CREATE INDEX IF NOT EXISTS jobs_queued_pool_{name} ON jobs ({cols})"
                  f" WHERE state = 'queued' AND concurrency_group IS NULL AND rate_limit {rated}")


FAIR_KEYS = """
    CREATE TABLE IF NOT EXISTS fair_keys (
        pool TEXT NOT NULL,
        key TEXT NOT NULL,                     -- a fair_by; '' the pool's jobs without one
        waiting INTEGER NOT NULL DEFAULT 0,    -- its queued jobs (kept by the triggers below)
        vtime REAL NOT NULL DEFAULT 0,         -- its standing: 1 / weight more per job started
        last_start REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (pool, key)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS fair_keys_waiting ON fair_keys (pool, vtime, last_start, key) WHERE waiting > 0;
    CREATE INDEX IF NOT EXISTS jobs_queued_fair ON jobs (pool, fair_by, priority, run_at, id)
        WHERE state = 'queued' AND fair_by IS NOT NULL;
"""
# A fair key's count of queued jobs, kept as its jobs come and go in any way (enqueue, claim,
# retry, cancel, purge, a pool moved); a key that starts waiting again comes in at the
# standing of the least advanced one waiting in its pool, never below its own (fair.comes_in).
_FAIR_IN = """
        INSERT INTO fair_keys (pool, key, waiting, vtime) SELECT new.pool, new.fair_by, 1,
            coalesce((SELECT min(vtime) FROM fair_keys WHERE pool = new.pool AND waiting > 0), 0)
        WHERE new.fair_by IS NOT NULL AND new.state = 'queued'
        ON CONFLICT (pool, key) DO UPDATE SET waiting = waiting + 1,
            vtime = CASE WHEN waiting > 0 THEN vtime ELSE max(vtime, excluded.vtime) END;"""
_FAIR_OUT = """
        UPDATE fair_keys SET waiting = waiting - 1 WHERE old.fair_by IS NOT NULL AND old.state = 'queued'
            AND pool = old.pool AND key = old.fair_by;"""
FAIR_TRIGGERS = f"""
    CREATE TRIGGER IF NOT EXISTS jobs_fair_insert AFTER INSERT ON jobs
        WHEN new.fair_by IS NOT NULL AND new.state = 'queued' BEGIN{_FAIR_IN}
    END;
    CREATE TRIGGER IF NOT EXISTS jobs_fair_update AFTER UPDATE OF state, pool, fair_by ON jobs
        WHEN (old.fair_by IS NOT NULL AND old.state = 'queued') OR (new.fair_by IS NOT NULL AND new.state = 'queued')
    BEGIN{_FAIR_OUT}{_FAIR_IN}
    END;
    CREATE TRIGGER IF NOT EXISTS jobs_fair_delete AFTER DELETE ON jobs
        WHEN old.fair_by IS NOT NULL AND old.state = 'queued' BEGIN{_FAIR_OUT}
    END;
"""


def v22(c: sqlite3.Connection) -> None:
    """Fair shares (core/policy/fair.py): jobs.fair_by (NULL: none, and for every older job),
    fair_keys (each fair key's queued count and standing, kept by triggers) and the indexes
    a fair claim walks: the keys waiting by standing, and a key's queued jobs in queue order
    (migration 23 takes them out of jobs_queued_pool_plain)."""
    add_column(c, "jobs", "fair_by", "TEXT")
    run_script(c, FAIR_KEYS)
    run_script(c, FAIR_TRIGGERS)


def v23(c: sqlite3.Connection) -> None:
    """Each queued job in one queue-order walk again: jobs_queued_pool_plain without the jobs
    of a fair key (a fair claim walks those by key, jobs_queued_fair), and no second index
    of the jobs without one (jobs_queued_unfair, one entry more for every plain job)."""
    c.execute("DROP INDEX IF EXISTS jobs_queued_unfair")
    c.execute("DROP INDEX IF EXISTS jobs_queued_pool_plain")
    c.execute("CREATE INDEX jobs_queued_pool_plain ON jobs (pool, priority, run_at, id) WHERE state = 'queued'"
              " AND concurrency_group IS NULL AND rate_limit IS NULL AND fair_by IS NULL")


def v24(c: sqlite3.Connection) -> None:
    """A rate key's starts as rows (rate_starts: n starts at a time, one row per claim) and
    how many its row keeps (rate_keys.kept), in place of its JSON log: a claim adds a row
    and a count, and reads the starts only when the key nears its limit."""
    run_script(c, """
        CREATE TABLE IF NOT EXISTS rate_starts (
            key TEXT NOT NULL,
            at REAL NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (key, at)
        ) WITHOUT ROWID;
    """)
    add_column(c, "rate_keys", "kept", "INTEGER NOT NULL DEFAULT 0")
    if "starts" not in {r[1] for r in c.execute("PRAGMA table_info(rate_keys)")}:
        return
    c.execute("INSERT OR IGNORE INTO rate_starts (key, at, n) SELECT k.key, s.value, count(*)"
              " FROM rate_keys k, json_each(k.starts) s GROUP BY k.key, s.value")
    c.execute("UPDATE rate_keys SET kept = json_array_length(starts)")
    c.execute("ALTER TABLE rate_keys DROP COLUMN starts")


def v25(c: sqlite3.Connection) -> None:
    """The rate keys at their limit by count, and those blocked, found by index (a claim by
    the selection asks for them): those keys, not every key kept."""
    c.execute("CREATE INDEX IF NOT EXISTS rate_keys_room ON rate_keys (lim - kept)")
    c.execute("CREATE INDEX IF NOT EXISTS rate_keys_blocked ON rate_keys (blocked_until) WHERE blocked_until IS NOT NULL")


def v26(c: sqlite3.Connection) -> None:
    """The rate keys at their limit by count in a partial index (rate_keys_full), in place
    of every key by its room (rate_keys_room): a claim that counts a start of a key far from
    its limit changes no index page, where each changed the room's entry."""
    c.execute("DROP INDEX IF EXISTS rate_keys_room")
    c.execute(f"CREATE INDEX IF NOT EXISTS rate_keys_full ON rate_keys (key) WHERE {RATE_KEY_FULL}")


STEPS = (v21, v22, v23, v24, v25, v26)  # migrations 21 to 26, in order
