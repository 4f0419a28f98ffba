"""The SQL functions of a direct enqueue in the queue's schema, `enqueue_many(jobs)` and
`enqueue(func, args, options)` (a batch of one): jobs inserted by the caller's own
transaction, visible to workers, and their pools woken (NOTIFY), when it commits. queickd.pg
calls enqueue_many; a plain job (func, args and kwargs alone) it enqueues alone is one
statement, plain_insert, built from the same fragments for the one rule that applies to it,
the overall cap. Nothing here imports psycopg.

A batch is admitted as the daemon admits one `enqueue_many` request (core/policy/
admission.py), all or nothing, reading what the caller's transaction sees; the checks, the
admission's reads and the insert are each one statement over the whole batch
(enqueue_checks_sql.py). The limits are the ones the daemons published (queickd_meta
`admission`). The overall cap's count is read only once the table's estimated rows and the
batch reach half the cap: far below it a count per call would read every waiting job. No
advisory lock: one held to the application's commit would hold up every daemon's submit, so
two open transactions can each take a key's last place under its cap.

Refusals are errors of a stable SQLSTATE (ERRORS), their message starting with the wire
protocol's code; a conflict's DETAIL is the id of the job it is with, a queue_full's HINT
the seconds to wait before trying again.
"""

from __future__ import annotations

from ...core.job import State
from ...core.policy.admission import RETRY_AFTER_DEFAULT
from ...core.protocol import Code
from ..sqlstates import UNFINISHED_IN, WAITING_IN
from . import enqueue_checks_sql as checks
from .channels import CHANNEL, QUEUED_CHANNEL

# A job's `origin` when these functions inserted it (a daemon's submit leaves it NULL), so
# an operator's status tells the two apart (PostgresStore.direct_counts).
DIRECT = "direct"
# SQLSTATE -> the wire protocol's code (class QD: queickd's own, no standard class).
ERRORS = {"QD400": Code.BAD_REQUEST, "QD409": Code.CONFLICT, "QD429": Code.QUEUE_FULL}
_STATE = {code: state for state, code in ERRORS.items()}
_BAD = _STATE[Code.BAD_REQUEST]
_FULL = f"ERRCODE = '{_STATE[Code.QUEUE_FULL]}', HINT = '{RETRY_AFTER_DEFAULT}'"
_JOBS = "jsonb_array_elements(batch) WITH ORDINALITY AS t(j, n)"
# The jobs the batch inserts: neither a live idempotency key's duplicate nor a key repeated.
_NEW = "answer[n] IS NULL AND first[n] IS NULL"


# What every call reads, and the overall cap, written once for the functions and for the
# plain job's statement (PLAIN_INSERT), over `limits` and `estimated` as these name them;
# `schema`: the qualifier of the tables, for a statement run on any search_path.
def _limits(schema: str = "") -> str:
    """The limits the daemons published (a JSON object), NULL before any daemon has."""
    return f"(SELECT value::jsonb FROM {schema}queickd_meta WHERE key = 'admission')"


def _estimated(schema: str = "") -> str:
    """The jobs table's estimated rows (-1 before it was ever analyzed)."""
    name = f"{schema}jobs".replace("'", "''")
    return f"(SELECT reltuples FROM pg_class WHERE oid = '{name}'::regclass)"


def _near_cap(adding: str) -> str:
    """Whether adding `adding` waiting jobs may pass the overall cap: it has one and the
    table's estimated rows and them reach half of it. Only then is the count read."""
    return (f"(limits->>'max_queued') IS NOT NULL AND {adding} > 0"
            f" AND greatest(estimated, 0) + {adding} >= (limits->>'max_queued')::float8 / 2")


def _past_cap(adding: str, schema: str = "") -> str:
    """Whether the waiting jobs and `adding` more pass the overall cap (admission.plan)."""
    return (f"(SELECT count(*) FROM {schema}jobs WHERE state IN {WAITING_IN}) + {adding}"
            " > (limits->>'max_queued')::bigint")


ENQUEUE_MANY = f"""
    CREATE OR REPLACE FUNCTION enqueue_many(jobs jsonb) RETURNS bigint[] LANGUAGE plpgsql AS $enqueue_many$
    DECLARE
        batch jsonb := jobs;  -- by another name than the table's
        now_ double precision := extract(epoch from clock_timestamp());
        total int;
        bad_n bigint;
        bad text;
        check_all boolean;
        estimated real;
        has_ik boolean;
        has_key boolean;
        has_manual boolean;
        limits jsonb;
        answer bigint[];  -- by position: a live idempotency key's job, when the job is its duplicate
        first int[];  -- by position: the job of the batch a repeated idempotency key answers with
        expired text[];
        new_count int;
        r record;
        ids bigint[];  -- the new jobs', in their order
        iks text[];  -- their idempotency keys
        later double precision;  -- when the first of them that waits is due
        k int;
        ik text;
    BEGIN
        IF jsonb_typeof(batch) IS DISTINCT FROM 'array' THEN
            RAISE EXCEPTION USING ERRCODE = '{_BAD}', MESSAGE = 'bad_request: jobs must be a JSON array';
        END IF;
        total := jsonb_array_length(batch);
        IF total = 0 THEN
            RETURN '{{}}';
        END IF;
        -- The common batch, jobs of func, args and kwargs alone, is checked by a light
        -- query; one with options, or a job that fails, by all the checks. With what every
        -- batch reads, in one statement: the limits, and the table's estimated rows.
        SELECT (SELECT n FROM {_JOBS} WHERE {checks.BASIC_FAILS} OR {checks.HAS_OPTIONS} LIMIT 1),
               {_limits()}, {_estimated()}
        INTO bad_n, limits, estimated;
        check_all := bad_n IS NOT NULL;
        has_ik := false;
        has_key := false;
        has_manual := false;
        IF check_all THEN
            SELECT min(n) FILTER (WHERE {checks.FIRST_FAILURE} IS NOT NULL), bool_or(j->>'idempotency_key' IS NOT NULL),
                   bool_or(j->>'key' IS NOT NULL), bool_or(j->'manual' = 'true')
            INTO bad_n, has_ik, has_key, has_manual
            FROM {_JOBS};
        END IF;
        IF bad_n IS NOT NULL THEN
            SELECT {checks.FIRST_FAILURE} INTO bad FROM {_JOBS} WHERE n = bad_n;
            RAISE EXCEPTION USING ERRCODE = '{_BAD}', MESSAGE = 'bad_request: '
                || CASE WHEN total > 1 THEN format('jobs[%s]: ', bad_n - 1) ELSE '' END || bad;
        END IF;

        IF has_ik THEN  -- a key held by a live job answers with it; its repeats, with its first job
            SELECT array_agg(CASE WHEN b.n = b.first AND o.id IS NOT NULL AND o.live THEN o.id END ORDER BY b.n),
                   array_agg(CASE WHEN b.n > b.first THEN b.first END ORDER BY b.n),
                   array_agg(b.ik) FILTER (WHERE b.n = b.first AND o.id IS NOT NULL AND NOT o.live)
            INTO answer, first, expired
            FROM (SELECT n, j->>'idempotency_key' AS ik,
                         CASE WHEN j->>'idempotency_key' IS NULL THEN n
                              ELSE min(n) OVER (PARTITION BY j->>'idempotency_key') END AS first
                  FROM {_JOBS}) b
            LEFT JOIN LATERAL (
                SELECT id, coalesce(limits->'idempotency_ttl', 'null') = 'null'
                           OR now_ - created_at < (limits->>'idempotency_ttl')::float8 AS live
                FROM jobs WHERE idempotency_key = b.ik) o ON true;
        END IF;
        IF has_manual THEN  -- the first manual job whose key is taken, in the batch or by a job
            SELECT b.n, b.k, b.before > 0 AS in_batch,
                   (SELECT id FROM jobs WHERE key = b.k AND state IN {UNFINISHED_IN} ORDER BY id LIMIT 1) AS other
            INTO r
            FROM (SELECT n, j->>'key' AS k, j->'manual' = 'true' AS manual,
                         count(*) OVER (PARTITION BY j->>'key' ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING
                                        AND 1 PRECEDING) AS before
                  FROM {_JOBS} WHERE {_NEW}) b
            WHERE b.manual AND b.k IS NOT NULL
              AND (b.before > 0 OR EXISTS (SELECT 1 FROM jobs WHERE key = b.k AND state IN {UNFINISHED_IN}))
            ORDER BY b.n LIMIT 1;
            IF FOUND AND r.in_batch THEN
                RAISE EXCEPTION USING ERRCODE = '{_STATE[Code.CONFLICT]}',
                    MESSAGE = format('conflict: key %L already has a job in this batch', r.k);
            ELSIF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = '{_STATE[Code.CONFLICT]}', DETAIL = r.other,
                    MESSAGE = format('conflict: key %L already has job %s waiting or running', r.k, r.other);
            END IF;
        END IF;
        IF has_key AND (limits->>'max_queued_per_key') IS NOT NULL THEN  -- the first key past its cap
            SELECT b.k INTO r
            FROM (SELECT j->>'key' AS k, min(n) AS at, count(*) AS adding FROM {_JOBS}
                  WHERE j->>'key' IS NOT NULL AND {_NEW} GROUP BY 1) b
            WHERE (SELECT count(*) FROM jobs WHERE key = b.k AND state IN {WAITING_IN}) + b.adding
                  > (limits->>'max_queued_per_key')::bigint
            ORDER BY b.at LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION USING {_FULL},
                    MESSAGE = format('queue_full: key %L has %s jobs waiting, its limit', r.k,
                                     limits->>'max_queued_per_key');
            END IF;
        END IF;
        new_count := total;
        IF has_ik THEN
            new_count := (SELECT count(*) FROM generate_series(1, total) n WHERE {_NEW});
        END IF;
        IF {_near_cap('new_count')} THEN
            IF {_past_cap('new_count')} THEN
                RAISE EXCEPTION USING {_FULL},
                    MESSAGE = format('queue_full: the queue holds %s waiting jobs, its limit', limits->>'max_queued');
            END IF;
        END IF;

        IF expired IS NOT NULL THEN
            UPDATE jobs SET idempotency_key = NULL WHERE idempotency_key = ANY (expired);
        END IF;
        -- The new jobs inserted in their order, which RETURNING keeps (a job its key's
        -- holder, committed meanwhile, left out), each queued one waking its pool (PostgreSQL
        -- sends a notification once however many times a transaction gives it): one statement.
        WITH ins AS (INSERT INTO jobs ({checks.COLUMNS}, origin)
                     SELECT {checks.VALUES}, '{DIRECT}' FROM (SELECT j, {checks.AT} AS at FROM {_JOBS} WHERE {_NEW}) b
                     ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
                     RETURNING id, idempotency_key, run_at,
                               CASE WHEN state = '{State.QUEUED}' THEN pg_notify('{QUEUED_CHANNEL}', 'q:' || pool) END)
        SELECT array_agg(id), array_agg(idempotency_key), min(run_at) FILTER (WHERE run_at > now_)
        INTO ids, iks, later FROM ins;
        IF later IS NOT NULL THEN  -- the daemons' timers
            PERFORM pg_notify('{CHANNEL}', 's:' || later);
        END IF;
        IF has_manual THEN  -- an operator's run lifts the pauses of its key and function
            DELETE FROM streaks s USING (SELECT kind, name FROM {_JOBS}, LATERAL (VALUES ('key', j->>'key'),
                ('func', {checks.FUNC})) AS v (kind, name) WHERE j->'manual' = 'true' AND {_NEW}) v
            WHERE s.kind = v.kind AND s.name = v.name;
            DELETE FROM pauses s USING (SELECT kind, name FROM {_JOBS}, LATERAL (VALUES ('key', j->>'key'),
                ('func', {checks.FUNC})) AS v (kind, name) WHERE j->'manual' = 'true' AND {_NEW}) v
            WHERE s.kind = v.kind AND s.name = v.name;
            IF FOUND THEN
                PERFORM pg_notify('{CHANNEL}', 'r');
            END IF;
        END IF;
        IF NOT has_ik THEN
            RETURN ids;
        END IF;
        -- By position: the new jobs' ids, in order (one the insert left out, the id of the job
        -- holding its key), then each repeated key's first job's.
        k := 1;
        FOR i IN 1 .. total LOOP
            CONTINUE WHEN answer[i] IS NOT NULL OR first[i] IS NOT NULL;
            ik := batch->(i - 1)->>'idempotency_key';
            IF ik IS NULL OR iks[k] = ik THEN
                answer[i] := ids[k];
                k := k + 1;
            ELSE
                answer[i] := (SELECT id FROM jobs WHERE idempotency_key = ik);  -- INTO takes no element
            END IF;
        END LOOP;
        FOR i IN 1 .. total LOOP
            IF first[i] IS NOT NULL THEN
                answer[i] := answer[first[i]];
            END IF;
        END LOOP;
        RETURN answer;
    END
    $enqueue_many$;
"""

ENQUEUE = f"""
    CREATE OR REPLACE FUNCTION enqueue(func text, args jsonb DEFAULT '[]', options jsonb DEFAULT '{{}}')
    RETURNS bigint LANGUAGE plpgsql AS $enqueue$
    BEGIN
        IF jsonb_typeof(coalesce(options, '{{}}')) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '{_BAD}', MESSAGE = 'bad_request: options must be a JSON object';
        END IF;
        IF options ?| ARRAY['func', 'args'] THEN
            RAISE EXCEPTION USING ERRCODE = '{_BAD}', MESSAGE = 'bad_request: unknown job field(s): '
                || (SELECT string_agg(x, ', ' ORDER BY x) FROM jsonb_object_keys(options) x WHERE x IN ('args', 'func'));
        END IF;
        RETURN (enqueue_many(jsonb_build_array(coalesce(options, '{{}}')
                || jsonb_build_object('func', func, 'args', coalesce(args, '[]')))))[1];
    END
    $enqueue$;
"""


def plain_insert(schema: str) -> str:
    """The statement queickd.pg runs for a plain job (func, args and kwargs alone, checked by
    the wire protocol's parse_job): the overall cap, the insert and its pool's wake-up in one
    statement, not a function's several. Parameters: the func as the daemon stores it, the
    args and kwargs as JSON text or NULL; the other columns are at their defaults
    (rows.PLAIN_COLS). No row, and nothing inserted, if the cap refuses the job: enqueue_many,
    run next, says why (or takes it, if the queue had room again meanwhile). `schema`: the
    quoted name the tables are qualified by."""
    q = schema + "."
    return (f"INSERT INTO {q}jobs (state, func, args, kwargs, run_at, created_at, origin)"
            f" SELECT '{State.QUEUED}', %s, %s::jsonb::text, %s::jsonb::text, now_, now_, '{DIRECT}'"
            f" FROM (SELECT extract(epoch from clock_timestamp()) AS now_, {_limits(q)} AS limits,"
            f" {_estimated(q)} AS estimated) a"
            f" WHERE CASE WHEN {_near_cap('1')} THEN NOT ({_past_cap('1', q)}) ELSE true END"
            f" RETURNING id, pg_notify('{QUEUED_CHANNEL}', 'q:' || pool)")
