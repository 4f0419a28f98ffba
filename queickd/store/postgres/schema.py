"""The PostgreSQL schema, as numbered migrations, and the version checks built on it
(fleet.migrate applies them; a worker never migrates, it refuses to claim on any
difference of versions). Nothing here imports psycopg.

Settings of the hot table `jobs`: fillfactor 70, so a job's updates (queued -> running ->
succeeded) stay on its page (HOT updates, no index entries written); autovacuum at 2 % dead
rows with no cost delay, as dead tuples in the claim's indexes slow every claim.
"""

from __future__ import annotations

import re

from . import claim_sql as pgclaimsql
from . import enqueue_sql as pgenqueuesql
from . import history, namespace
from . import pass_sql as pgpasssql

MIGRATE_LOCK = 0x71756963_6B640001  # pg_advisory lock id: "quickd" + 1, held while migrating

# Each entry brings the schema from version i to i + 1. Never change what one that has
# shipped leaves in the database: add the next. The SQL functions are the exception, each
# written once (claim_sql.py, pass_sql.py, enqueue_sql.py) and created from there by every
# migration that changed it. Every pending migration runs in migrate()'s one transaction and
# none calls a function, so only the last definition of each counts, for a database of any
# version as for a fresh one (tests/test_store_postgres_migrations.py).
MIGRATIONS: list[str] = [*history.BEFORE_NAMESPACE]  # 1 to 28
# 29: the queue's objects in a schema of their own (namespace.py): moved there from where
# the default search_path had put them, the tables the migrations so far created.
MIGRATIONS.append(namespace.move_migration(
    sorted({m for sql in MIGRATIONS for m in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", sql)})))
# 30: enqueue(func, args, options), a job enqueued by the caller's own transaction (enqueue_sql.py).
MIGRATIONS.append(pgenqueuesql.ENQUEUE)
# 31: a job's origin, 'direct' when enqueue() inserted it (NULL: a daemon's submit), counted
# by its own small index; enqueue() marks its jobs from here on.
MIGRATIONS.append("""
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS origin text;
    CREATE INDEX IF NOT EXISTS jobs_direct ON jobs (state) WHERE origin IS NOT NULL;
    """ + pgenqueuesql.ENQUEUE)
# 32: enqueue_many(jobs), a batch admitted and inserted as a whole, one statement per step;
# enqueue() is a batch of one.
MIGRATIONS.append(pgenqueuesql.ENQUEUE_MANY + pgenqueuesql.ENQUEUE)
# 33: an edge daemon's jobs for its upstream: their id there (NULL for every other job), and
# one small index per state of theirs, held (read oldest first) and forwarded.
MIGRATIONS.append("""
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS upstream_id bigint;
    CREATE INDEX IF NOT EXISTS jobs_held ON jobs (id) WHERE state = 'held';
    CREATE INDEX IF NOT EXISTS jobs_forwarded ON jobs (id) WHERE state = 'forwarded';
    """)
# 34: a job's liveness (core/policy/liveness.py): stalled_after and on_stall, which enqueue()
# accepts from here on, and the mark its worker sets while it is stalled (NULL: not).
MIGRATIONS.append("""
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS stalled_after double precision;
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS on_stall text;
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS stalled_at double precision;
    """ + pgenqueuesql.ENQUEUE_MANY + pgenqueuesql.ENQUEUE)
# 35: rate limits (core/policy/rates.py): a job's rate_limit (JSON {"key", "limit", "per"}),
# each rate key's window (rate_keys: its latest starts, JSON, and blocked_until), the queued
# rate-limited jobs by key and pool for the fast path's question (claim_sql.OPEN_RATE_WAITS),
# the ungrouped ones apart from the others (jobs_queued_unrated in place of jobs_queued_plain)
# and by key (jobs_queued_rate_key), so the selection's pages read past a full key's backlog;
# the selection's pages and view carry rate_limit (a new row type: dropped and made again),
# the fast path and the pass leave such jobs to the selection, enqueue_many() takes them.
MIGRATIONS.append("""
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS rate_limit text;
    CREATE TABLE IF NOT EXISTS rate_keys (
        key text PRIMARY KEY,
        lim integer NOT NULL,
        per double precision NOT NULL,
        blocked_until double precision,
        starts text NOT NULL DEFAULT '[]'
    );
    CREATE INDEX IF NOT EXISTS jobs_queued_rated ON jobs ((rate_limit::json ->> 'key'), pool)
        WHERE state = 'queued' AND rate_limit IS NOT NULL;
    DROP INDEX IF EXISTS jobs_queued_plain;
    CREATE INDEX IF NOT EXISTS jobs_queued_unrated ON jobs (priority, run_at, id)
        WHERE state = 'queued' AND concurrency_group IS NULL AND rate_limit IS NULL;
    CREATE INDEX IF NOT EXISTS jobs_queued_rate_key ON jobs ((rate_limit::json ->> 'key'), priority, run_at, id)
        WHERE state = 'queued' AND concurrency_group IS NULL AND rate_limit IS NOT NULL;
    DROP FUNCTION IF EXISTS queickd_claim_view(bigint, bigint, text[], integer, double precision, boolean);
    DROP FUNCTION IF EXISTS queickd_candidates_after(text[], text[], integer, integer, double precision, bigint);
    """ + pgclaimsql.CANDIDATES_AFTER + pgclaimsql.VIEW + pgclaimsql.CLAIM + pgpasssql.PASS
                  + pgenqueuesql.ENQUEUE_MANY + pgenqueuesql.ENQUEUE)
# 36: fair shares (core/policy/fair.py): a job's fair_by; fair_keys, each fair key's queued
# count and standing; fair_deltas, the changes of those counts not yet counted: a trigger
# on jobs appends one row per fair job queued or unqueued, in any way (an append takes no
# lock a claim or another enqueue holds: counting in fair_keys at once would lock its rows
# in each transaction's own order, and a multi-key enqueue and a claim could deadlock), and
# the fair claim folds them into fair_keys first, under its claim lock (claim.py FOLD_FAIR);
# the indexes a fair claim walks (store/sql/fair.py: the keys waiting by standing, a key's
# jobs, the jobs without a key, each in queue order); the fast path, the pass and the view
# hand claims to the selection while a fair key waits (claim_sql.OPEN_FAIR_WAITS);
# enqueue() takes fair_by.
MIGRATIONS.append("""
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS fair_by text;
    CREATE TABLE IF NOT EXISTS fair_keys (
        pool text NOT NULL,
        key text NOT NULL,
        waiting integer NOT NULL DEFAULT 0,
        vtime double precision NOT NULL DEFAULT 0,
        last_start double precision NOT NULL DEFAULT 0,
        PRIMARY KEY (pool, key)
    );
    CREATE TABLE IF NOT EXISTS fair_deltas (pool text NOT NULL, key text NOT NULL, n integer NOT NULL);
    CREATE INDEX IF NOT EXISTS fair_deltas_pool ON fair_deltas (pool);
    CREATE INDEX IF NOT EXISTS fair_keys_waiting ON fair_keys (pool, vtime, last_start, key) WHERE waiting > 0;
    CREATE INDEX IF NOT EXISTS jobs_queued_fair ON jobs (pool, fair_by, priority, run_at, id)
        WHERE state = 'queued' AND fair_by IS NOT NULL;
    CREATE INDEX IF NOT EXISTS jobs_queued_unfair ON jobs (pool, priority, run_at, id)
        WHERE state = 'queued' AND fair_by IS NULL;
    CREATE OR REPLACE FUNCTION queickd_fair_count() RETURNS trigger LANGUAGE plpgsql
        """ + pgclaimsql.PLANNED + """ AS $$
    BEGIN
    IF TG_OP <> 'INSERT' AND OLD.fair_by IS NOT NULL AND OLD.state = 'queued' THEN
        INSERT INTO fair_deltas VALUES (OLD.pool, OLD.fair_by, -1);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.fair_by IS NOT NULL AND NEW.state = 'queued' THEN
        INSERT INTO fair_deltas VALUES (NEW.pool, NEW.fair_by, 1);
    END IF;
    RETURN NULL;
    END
    $$;
    DROP TRIGGER IF EXISTS jobs_fair_insert ON jobs;
    CREATE TRIGGER jobs_fair_insert AFTER INSERT ON jobs FOR EACH ROW
        WHEN (NEW.fair_by IS NOT NULL AND NEW.state = 'queued') EXECUTE FUNCTION queickd_fair_count();
    DROP TRIGGER IF EXISTS jobs_fair_update ON jobs;
    CREATE TRIGGER jobs_fair_update AFTER UPDATE OF state, pool, fair_by ON jobs FOR EACH ROW
        WHEN ((OLD.fair_by IS NOT NULL AND OLD.state = 'queued') OR (NEW.fair_by IS NOT NULL AND NEW.state = 'queued'))
        EXECUTE FUNCTION queickd_fair_count();
    DROP TRIGGER IF EXISTS jobs_fair_delete ON jobs;
    CREATE TRIGGER jobs_fair_delete AFTER DELETE ON jobs FOR EACH ROW
        WHEN (OLD.fair_by IS NOT NULL AND OLD.state = 'queued') EXECUTE FUNCTION queickd_fair_count();
    """ + pgclaimsql.VIEW + pgclaimsql.CLAIM + pgpasssql.PASS + pgenqueuesql.ENQUEUE_MANY + pgenqueuesql.ENQUEUE)
# 37: a rate key's starts as rows (rate_starts: n starts at a time, one row per claim) and
# how many its row keeps (rate_keys.kept), in place of its JSON log; the view carries kept,
# and the fast path's question reads the starts only of a key that keeps its limit's worth.
MIGRATIONS.append("""
    CREATE TABLE IF NOT EXISTS rate_starts (
        key text NOT NULL,
        at double precision NOT NULL,
        n integer NOT NULL,
        PRIMARY KEY (key, at)
    );
    ALTER TABLE rate_keys ADD COLUMN IF NOT EXISTS kept integer NOT NULL DEFAULT 0;
    DO $$
    BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
               AND table_name = 'rate_keys' AND column_name = 'starts') THEN
        INSERT INTO rate_starts (key, at, n)
            SELECT k.key, s.value::double precision, count(*) FROM rate_keys k,
                   json_array_elements_text(k.starts::json) AS s (value) GROUP BY 1, 2
            ON CONFLICT DO NOTHING;
        UPDATE rate_keys SET kept = json_array_length(starts::json);
        ALTER TABLE rate_keys DROP COLUMN starts;
    END IF;
    END
    $$;
    """ + pgclaimsql.VIEW + pgclaimsql.CLAIM + pgpasssql.PASS)
# 38: the rate keys near or at their limit, and those blocked, found by index: the fast
# path's questions read those keys, not every key.
MIGRATIONS.append("""
    CREATE INDEX IF NOT EXISTS rate_keys_room ON rate_keys ((lim - kept));
    CREATE INDEX IF NOT EXISTS rate_keys_blocked ON rate_keys (blocked_until) WHERE blocked_until IS NOT NULL;
    """ + pgclaimsql.VIEW + pgclaimsql.CLAIM + pgpasssql.PASS)
# 39: the fast path's claim of rate-limited jobs in rounds (room a filled key left goes to the
# jobs behind it), a key whose waiting job carries a lower limit left to the selection, and
# the pass's count of its jobs taken from the fast path (not from its timer's statement).
MIGRATIONS.append(pgclaimsql.CLAIM + pgpasssql.PASS)
# 40: enqueue_many re-created: its limits and overall cap written by the fragments the plain
# job's statement of queickd.pg shares (enqueue_sql.py); the same rules.
MIGRATIONS.append(pgenqueuesql.ENQUEUE_MANY)
# 41: enqueue_many re-created: the id of a job whose idempotency key another transaction
# committed meanwhile is assigned to its place (SELECT ... INTO an array element is not
# PL/pgSQL: it failed with "cannot subscript type bigint").
MIGRATIONS.append(pgenqueuesql.ENQUEUE_MANY)
# 42: the pass tells a rate key's opened window apart from what keeps the selection in play.
MIGRATIONS.append(pgpasssql.PASS)
SCHEMA_VERSION = len(MIGRATIONS)


class VersionMismatchError(RuntimeError):
    """This queickd and the database disagree on the queickd or schema version."""


def parse_version(v: str) -> tuple:
    """'0.10.2' -> (0, 10, 2); a non-numeric part compares as text after numbers."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in v.split("."))
