"""The PostgreSQL claim's SQL functions from schema version 10 on, as the migrations
pgschema.py appends (it keeps the earlier ones, which are never edited). Nothing here
imports psycopg."""

from __future__ import annotations

# 10: the selection's start (pgclaim.py) as a function with planner settings of its own.
# As a statement prepared by the driver, its generic plan was made from the statistics of
# the moment: taken while the queue was nearly empty, they priced a walk of every queued
# job (bitmap scan of jobs_queued, hash join with the ids) below a lookup of each id, and
# each start then read the whole queue (0.5 ms at 5,000 waiting jobs, against 0.1 ms for
# queickd_claim). With hash and merge joins off the ids drive a nested loop, and the state
# is tested as `state || '' = 'queued'`, the same test in a form no index matches: with
# `state = 'queued'` the inner side could still be a walk of jobs_queued or jobs_state
# under such statistics. Only the primary key is left, one lookup per id. Planned once
# per session (force_generic_plan): the plan no longer depends on the values.
START = """
    CREATE OR REPLACE FUNCTION queickd_start(p_now double precision, p_worker bigint, p_ids bigint[],
                                             p_slots integer[], p_kinds text[], p_names text[],
                                             p_probes bigint[]) RETURNS SETOF jobs
    LANGUAGE plpgsql SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
        SET enable_seqscan = off SET enable_sort = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
    BEGIN
    -- The selection's jobs marked running (a row another claim took meanwhile is no longer
    -- queued: it is left out) and, for those it let through as probes (and only if they
    -- are claimed here), their pauses stamped.
    RETURN QUERY WITH started AS (
        UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = p_now, worker_id = p_worker,
                        slot = u.s
        FROM unnest(p_ids, p_slots) AS u(i, s) WHERE jobs.id = u.i AND jobs.state || '' = 'queued'
        RETURNING jobs.*),
    stamped AS (
        UPDATE pauses p SET probe_job = t.j FROM unnest(p_kinds, p_names, p_probes) AS t(k, n, j)
        WHERE p.kind = t.k AND p.name = t.n AND t.j IN (SELECT s.id FROM started s))
    SELECT * FROM started;
    END
    $$;
"""

# 11: the claim's walk past full groups bounded by the number of groups, not of waiting
# jobs. The selection's pages after its first left out the jobs of full groups by reading
# jobs_queued in queue order and dropping theirs, so reaching a job behind a full group's
# backlog read that backlog (18 ms at 10,000 waiting). Now the queued jobs are also kept
# by group (jobs_queued_group, which also answers the view's "does a grouped job wait?",
# in place of jobs_queued_grouped) and without one (jobs_queued_plain, one index entry
# more per ungrouped job, at its insert); queickd_candidates_after reads the next page in
# queue order after a (priority, run_at, id) as the merge of the ungrouped jobs and, for
# each group with a job waiting that is not full (found by a skip scan of
# jobs_queued_group, one descent per group), that group's first ones. Every stream is an
# index walk from the page's start, at most p_limit rows each. Its plan is made once per
# session (force_generic_plan): planned again on each call, as PL/pgSQL would for its
# parameters, it cost more than it runs.
CANDIDATES_AFTER = """
    CREATE INDEX IF NOT EXISTS jobs_queued_plain ON jobs (priority, run_at, id)
        WHERE state = 'queued' AND concurrency_group IS NULL;
    CREATE INDEX IF NOT EXISTS jobs_queued_group ON jobs (concurrency_group, priority, run_at, id)
        WHERE state = 'queued' AND concurrency_group IS NOT NULL;
    DROP INDEX IF EXISTS jobs_queued_grouped;
    CREATE OR REPLACE FUNCTION queickd_candidates_after(p_pools text[], p_full text[], p_limit integer,
                                                        p_priority integer, p_run_at double precision, p_id bigint)
    RETURNS TABLE (priority integer, id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision)
    LANGUAGE plpgsql STABLE SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off
        SET jit = off SET plan_cache_mode = force_generic_plan AS $$
    BEGIN
    RETURN QUERY WITH RECURSIVE waiting (name) AS (
        (SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL
         ORDER BY q.concurrency_group LIMIT 1)
        UNION ALL
        SELECT (SELECT q.concurrency_group FROM jobs q
                WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL AND q.concurrency_group > w.name
                ORDER BY q.concurrency_group LIMIT 1)
        FROM waiting w WHERE w.name IS NOT NULL)
    SELECT c.* FROM (
        (SELECT q.priority, q.id, q.key, q.func, q.pool, q.retry_on_network, q.run_at, q.concurrency_group,
                q.concurrency_limit, q.cost_units
         FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NULL
           AND (q.priority, q.run_at, q.id) > (p_priority, p_run_at, p_id)
           AND (p_pools IS NULL OR q.pool = ANY(p_pools) OR q.key IS NOT NULL)
         ORDER BY q.priority, q.run_at, q.id LIMIT p_limit)
        UNION ALL
        SELECT x.* FROM waiting w CROSS JOIN LATERAL (
            SELECT q.priority, q.id, q.key, q.func, q.pool, q.retry_on_network, q.run_at, q.concurrency_group,
                   q.concurrency_limit, q.cost_units
            FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL AND q.concurrency_group = w.name
              AND (q.priority, q.run_at, q.id) > (p_priority, p_run_at, p_id)
              AND (p_pools IS NULL OR q.pool = ANY(p_pools) OR q.key IS NOT NULL)
            ORDER BY q.priority, q.run_at, q.id LIMIT p_limit) x
        WHERE w.name IS NOT NULL AND NOT w.name = ANY(p_full)) c
    ORDER BY c.priority, c.run_at, c.id LIMIT p_limit;
    END
    $$;
"""

# 12: the view's first page (queickd_candidates, called by queickd_claim_view on every
# claim with groups or budgets) planned once per session, as queickd_start and
# queickd_candidates_after are. Planned again on each call for its parameters, it was half
# of the view's server time (the view: 109 us -> 73 us at 10,000 waiting jobs over 50
# groups). Its settings leave one plan that keeps the queue order, the walk of jobs_queued.
CANDIDATES_GENERIC = """
    ALTER FUNCTION queickd_candidates(text[], text[], integer, integer) SET plan_cache_mode = force_generic_plan;
"""

# 13: the start leaves out a keyed job that is not its key's head. The pages after the
# first leave out the jobs of full groups, so a key's head among them was not seen holding
# its key (claim.SerialKeys), and a job of the same key behind it could start first. One
# look along jobs_queued_key for each keyed job started.
START_HEADS_ONLY = """
    CREATE OR REPLACE FUNCTION queickd_start(p_now double precision, p_worker bigint, p_ids bigint[],
                                             p_slots integer[], p_kinds text[], p_names text[],
                                             p_probes bigint[]) RETURNS SETOF jobs
    LANGUAGE plpgsql SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
        SET enable_seqscan = off SET enable_sort = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
    BEGIN
    -- The selection's jobs marked running (a row another claim took meanwhile is no longer
    -- queued: it is left out) and, for those it let through as probes (and only if they
    -- are claimed here), their pauses stamped.
    RETURN QUERY WITH started AS (
        UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = p_now, worker_id = p_worker,
                        slot = u.s
        FROM unnest(p_ids, p_slots) AS u(i, s) WHERE jobs.id = u.i AND jobs.state || '' = 'queued'
          AND (jobs.key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = jobs.key
               AND e.state = 'queued' AND (e.priority, e.run_at, e.id) < (jobs.priority, jobs.run_at, jobs.id)))
        RETURNING jobs.*),
    stamped AS (
        UPDATE pauses p SET probe_job = t.j FROM unnest(p_kinds, p_names, p_probes) AS t(k, n, j)
        WHERE p.kind = t.k AND p.name = t.n AND t.j IN (SELECT s.id FROM started s))
    SELECT * FROM started;
    END
    $$;
"""

MIGRATIONS: list[str] = [START, CANDIDATES_AFTER, CANDIDATES_GENERIC, START_HEADS_ONLY]
