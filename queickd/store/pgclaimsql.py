"""The PostgreSQL claim's SQL functions from schema version 10 on, as the migrations
pgschema.py appends (it keeps the earlier ones, which are never edited). Nothing here
imports psycopg."""

from __future__ import annotations

# 10: the selection's start (pgclaim.py) as a function with planner settings of its own.
# As a statement prepared by the driver, its generic plan was made from the statistics of
# the moment: taken while the queue was nearly empty, they priced a walk of every queued
# job (bitmap scan of jobs_queued, hash join with the ids) below a lookup of each id, and
# each start then read the whole queue (0.5 ms at 5,000 waiting jobs, against 0.1 ms for
# queickd_claim). With hash and merge joins off, the ids are looked up one by one.
START = """
    CREATE OR REPLACE FUNCTION queickd_start(p_now double precision, p_worker bigint, p_ids bigint[],
                                             p_slots integer[], p_kinds text[], p_names text[],
                                             p_probes bigint[]) RETURNS SETOF jobs
    LANGUAGE plpgsql SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
        SET enable_seqscan = off SET enable_sort = off SET jit = off AS $$
    BEGIN
    -- The selection's jobs marked running (a row another claim took meanwhile is no longer
    -- queued: it is left out) and, for those it let through as probes (and only if they
    -- are claimed here), their pauses stamped.
    RETURN QUERY WITH started AS (
        UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = p_now, worker_id = p_worker,
                        slot = u.s
        FROM unnest(p_ids, p_slots) AS u(i, s) WHERE jobs.id = u.i AND jobs.state = 'queued'
        RETURNING jobs.*),
    stamped AS (
        UPDATE pauses p SET probe_job = t.j FROM unnest(p_kinds, p_names, p_probes) AS t(k, n, j)
        WHERE p.kind = t.k AND p.name = t.n AND t.j IN (SELECT s.id FROM started s))
    SELECT * FROM started;
    END
    $$;
"""

MIGRATIONS: list[str] = [START]
