"""The PostgreSQL schema's migration of a claim bounded by what could start (version 25):
jobs waiting in a pool no claimer serves, and their groups, cost a claim nothing.
schema.py lists it after the others. The functions it changes are restated from their
shipped text (claim_sql.py, pass_sql.py) with the one condition that changes, so the
restatement cannot drift from what it replaces. Nothing here imports psycopg."""

from __future__ import annotations

from . import claim_sql as pgclaimsql
from . import pass_sql as pgpasssql

# "Must the selection claim?" asked of the pools served only: a grouped job waiting in a
# pool nobody here serves is no reason to leave the fast path. One descent of
# jobs_queued_pool_group per pool served (every pool: NULL, as before). The plan is made
# once per session, perhaps on the empty table of a new store, where every plan costs
# alike: a join with the pools' array was then a hash of every grouped job waiting, and a
# `pool = ANY` a walk of jobs_queued. In queue order of groups within the pool, which only
# that index gives (sorts are off), it is that index's.
_ANY_GROUPED = "EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL)"
_SERVED_GROUPED = (
    f"(CASE WHEN p_pools IS NULL THEN {_ANY_GROUPED} ELSE EXISTS (SELECT 1 FROM unnest(p_pools) s (name)"
    " CROSS JOIN LATERAL (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL"
    " AND q.pool = s.name ORDER BY q.concurrency_group LIMIT 1) x) END)")

# The view's first page: the selection's page reader from the head of the queue (it read
# every queued job in queue order, walking past other pools' jobs one by one).
_FIRST_PAGE = ("RETURN QUERY SELECT 'queued'::text, c.*, NULL::integer, NULL::boolean\n"
               "    FROM queickd_candidates(p_pools, '{}', p_page, 0) c;")
_FIRST_PAGE_AFTER = (
    "RETURN QUERY SELECT 'queued'::text, c.id, c.key, c.func, c.pool, c.retry_on_network, c.run_at,\n"
    "                        c.concurrency_group, c.concurrency_limit, c.cost_units, NULL::integer, NULL::boolean\n"
    "    FROM queickd_candidates_after(p_pools, '{}', p_page, -2147483648, '-infinity', 0) c;")


def _restated(sql: str, *changes: tuple[str, str]) -> str:
    """A shipped function's text with each (old, new) replaced, each old found exactly once."""
    for old, new in changes:
        if sql.count(old) != 1:
            raise AssertionError(f"expected one {old[:60]!r} in the statement restated")
        sql = sql.replace(old, new)
    return sql


# Of keyed jobs, only the head of their key (its first queued job of any pool, one look
# along jobs_queued_key): a key's head in a pool the claim does not read is not seen
# holding its key (claim.SerialKeys), and the jobs behind it must not start before it.
_HEAD_OF_KEY = """(q.key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = q.key AND e.state = 'queued'
                                    AND (e.priority, e.run_at, e.id) < (q.priority, q.run_at, q.id)))"""

# The selection's pages (11, restated): the ungrouped jobs as before, and the groups with a
# job waiting found by a skip scan of jobs_queued_pool_group within each pool served (every
# pool with a grouped job waiting, when p_pools is NULL: one descent per pool), not of every
# group: (i, name) is the i-th pool's group, NULL past its last.
CANDIDATES_SERVED = f"""
    CREATE INDEX IF NOT EXISTS jobs_queued_pool_group ON jobs (pool, concurrency_group, priority, run_at, id)
        WHERE state = 'queued' AND concurrency_group IS NOT NULL;
    DROP INDEX IF EXISTS jobs_queued_group;
    CREATE OR REPLACE FUNCTION queickd_candidates_after(p_pools text[], p_full text[], p_limit integer,
                                                        p_priority integer, p_run_at double precision, p_id bigint)
    RETURNS TABLE (priority integer, id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision)
    LANGUAGE plpgsql STABLE SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off
        SET jit = off SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        walked text[] := p_pools;
    BEGIN
    IF walked IS NULL THEN
        WITH RECURSIVE p (name) AS (
            (SELECT q.pool FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL
             ORDER BY q.pool LIMIT 1)
            UNION ALL
            SELECT (SELECT q.pool FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL
                    AND q.pool > p.name ORDER BY q.pool LIMIT 1)
            FROM p WHERE p.name IS NOT NULL)
        SELECT coalesce(array_agg(p.name), '{{}}') INTO walked FROM p WHERE p.name IS NOT NULL;
    END IF;
    RETURN QUERY WITH RECURSIVE waiting (i, name) AS (
        SELECT 1, (SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL
                   AND q.pool = walked[1] ORDER BY q.concurrency_group LIMIT 1)
        UNION ALL
        SELECT CASE WHEN w.name IS NULL THEN w.i + 1 ELSE w.i END,
               CASE WHEN w.name IS NULL
                    THEN (SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued'
                          AND q.concurrency_group IS NOT NULL AND q.pool = walked[w.i + 1]
                          ORDER BY q.concurrency_group LIMIT 1)
                    ELSE (SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued'
                          AND q.concurrency_group IS NOT NULL AND q.pool = walked[w.i] AND q.concurrency_group > w.name
                          ORDER BY q.concurrency_group LIMIT 1) END
        FROM waiting w WHERE w.name IS NOT NULL OR w.i < cardinality(walked))
    SELECT c.* FROM (
        (SELECT q.priority, q.id, q.key, q.func, q.pool, q.retry_on_network, q.run_at, q.concurrency_group,
                q.concurrency_limit, q.cost_units
         FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NULL
           AND (q.priority, q.run_at, q.id) > (p_priority, p_run_at, p_id)
           AND (p_pools IS NULL OR q.pool = ANY(p_pools) OR q.key IS NOT NULL)
           AND {_HEAD_OF_KEY}
         ORDER BY q.priority, q.run_at, q.id LIMIT p_limit)
        UNION ALL
        SELECT x.* FROM waiting w CROSS JOIN LATERAL (
            SELECT q.priority, q.id, q.key, q.func, q.pool, q.retry_on_network, q.run_at, q.concurrency_group,
                   q.concurrency_limit, q.cost_units
            FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL
              AND q.pool = walked[w.i] AND q.concurrency_group = w.name
              AND (q.priority, q.run_at, q.id) > (p_priority, p_run_at, p_id)
              AND {_HEAD_OF_KEY}
            ORDER BY q.priority, q.run_at, q.id LIMIT p_limit) x
        WHERE w.name IS NOT NULL AND NOT w.name = ANY(p_full)) c
    ORDER BY c.priority, c.run_at, c.id LIMIT p_limit;
    END
    $$;
"""

# 25: the pages by pool, and the fast path, the pass and the view asking of the pools served.
CLAIM_OF_SERVED_POOLS = (
    CANDIDATES_SERVED
    + _restated(pgpasssql.CLAIM_ASKS_FIRST, (_ANY_GROUPED, _SERVED_GROUPED))
    + _restated(pgpasssql.LEANER_PASS, (_ANY_GROUPED, _SERVED_GROUPED))
    + _restated(pgclaimsql.VIEW_ON_REQUEST, (_ANY_GROUPED, _SERVED_GROUPED), (_FIRST_PAGE, _FIRST_PAGE_AFTER)))


# "Must the selection claim?" asked of the groups that could start a job: a grouped job
# waiting in a group that what runs fills (as many running as the lowest limit of its
# running jobs: claim.Selection.out_groups) is passed over by the selection, and holds
# nothing the fast path does not respect (its key: the fast path starts only a key's
# head), so such groups alone leave the claim on the fast path, without the lock the
# selection's claims take turns under. The groups waiting in each pool served are found by
# a skip scan of jobs_queued_pool_group (one descent each, stopping at the first that is
# not full), each one's running jobs through jobs_group_slot. Every pool (NULL): as before.
_OPEN_GROUP_WAITS = f"""(CASE WHEN p_pools IS NULL THEN {_ANY_GROUPED} ELSE EXISTS (
        WITH RECURSIVE w (i, name) AS (
            SELECT 1, (SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued'
                       AND q.concurrency_group IS NOT NULL AND q.pool = p_pools[1] ORDER BY q.concurrency_group LIMIT 1)
            UNION ALL
            SELECT CASE WHEN w.name IS NULL THEN w.i + 1 ELSE w.i END,
                   CASE WHEN w.name IS NULL
                        THEN (SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued'
                              AND q.concurrency_group IS NOT NULL AND q.pool = p_pools[w.i + 1]
                              ORDER BY q.concurrency_group LIMIT 1)
                        ELSE (SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued'
                              AND q.concurrency_group IS NOT NULL AND q.pool = p_pools[w.i]
                              AND q.concurrency_group > w.name ORDER BY q.concurrency_group LIMIT 1) END
            FROM w WHERE w.name IS NOT NULL OR w.i < cardinality(p_pools))
        SELECT 1 FROM w WHERE w.name IS NOT NULL AND NOT coalesce((
            SELECT count(*) >= min(coalesce(nullif(r.concurrency_limit, 0), 1)) FROM jobs r
            WHERE r.state = 'running' AND r.concurrency_group IS NOT NULL AND r.concurrency_group = w.name), false))
    END)"""

# 28: the fast path and the pass (25's, restated) leave the claim to the selection only for
# a group that could start a job.
CLAIM_PAST_FULL_GROUPS = (
    _restated(pgpasssql.CLAIM_ASKS_FIRST, (_ANY_GROUPED, _OPEN_GROUP_WAITS))
    + _restated(pgpasssql.LEANER_PASS, (_ANY_GROUPED, _OPEN_GROUP_WAITS)))
