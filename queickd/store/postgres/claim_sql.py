"""The PostgreSQL schema's migrations of resource control and the claim (versions 4, 8, 9
and 10 to 13; from 14 on, the pass's, in pass_sql.py), which schema.py lists in order
with the others. A migration that has shipped
is never edited: a changed function is the next migration, restating it whole (as 13
restates 10's queickd_start with one more condition). Nothing here imports psycopg."""

from __future__ import annotations

# 4: resource control. A grouped job running holds a slot number of its group, from 1 to
# its limit; the unique index makes two hosts taking the same slot a unique violation
# (the loser's claim is undone and tried again), so a group's limit holds across hosts.
# Grouped jobs, and every job of a budgeted pool, are claimed by the store's selection
# (store.py) under a lock per budget; queickd_claim, the fast path, leaves them out.
RESOURCE_CONTROL = """
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS concurrency_group text;
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS concurrency_limit integer;
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cost_units double precision;
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS slot integer;
    CREATE UNIQUE INDEX IF NOT EXISTS jobs_group_slot ON jobs (concurrency_group, slot)
        WHERE state = 'running' AND concurrency_group IS NOT NULL;
    CREATE INDEX IF NOT EXISTS jobs_queued_grouped ON jobs (id)
        WHERE state = 'queued' AND concurrency_group IS NOT NULL;
    -- The claim with groups or budgets reads its candidates a page at a time through this,
    -- in queue order along jobs_queued (planner settings of its own, as queickd_claim's:
    -- never a sort of every queued job), leaving out other pools' jobs without a key and
    -- the jobs of groups with every slot taken (p_full: none for the first page, read
    -- before the claim knows what runs).
    CREATE OR REPLACE FUNCTION queickd_candidates(p_pools text[], p_full text[], p_limit integer,
                                                  p_offset integer)
    RETURNS TABLE (id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision)
    LANGUAGE plpgsql STABLE SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off AS $$
    BEGIN
    RETURN QUERY SELECT q.id, q.key, q.func, q.pool, q.retry_on_network, q.run_at, q.concurrency_group,
                        q.concurrency_limit, q.cost_units
    FROM jobs q WHERE q.state = 'queued'
      AND (p_pools IS NULL OR q.pool = ANY(p_pools) OR q.key IS NOT NULL)
      AND (q.concurrency_group IS NULL OR NOT q.concurrency_group = ANY(p_full))
    ORDER BY q.priority, q.run_at, q.id LIMIT p_limit OFFSET p_offset;
    END
    $$;
    -- What such a claim reads first, in one call with its plans cached: it takes the lock
    -- those claims share (they take turns, host by host), then reads what runs (kind
    -- 'running'), the pauses (kind 'key' or 'func', the name in key) and the first page of
    -- candidates (kind 'queued'), each by a statement of its own (VOLATILE: a snapshot each,
    -- after the lock), so what runs is what every earlier such claim committed.
    CREATE OR REPLACE FUNCTION queickd_claim_view(p_lock bigint, p_pools text[], p_page integer)
    RETURNS TABLE (kind text, id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision, slot integer)
    LANGUAGE plpgsql VOLATILE SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off AS $$
    BEGIN
    PERFORM pg_advisory_xact_lock(p_lock);
    RETURN QUERY SELECT 'running'::text, r.id, r.key, r.func, r.pool, r.retry_on_network, r.run_at,
                        r.concurrency_group, r.concurrency_limit, r.cost_units, r.slot
    FROM jobs r WHERE r.state = 'running';
    RETURN QUERY SELECT p.kind, NULL::bigint, p.name, NULL::text, NULL::text, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, NULL::double precision, NULL::integer
    FROM pauses p;
    RETURN QUERY SELECT 'queued'::text, c.*, NULL::integer FROM queickd_candidates(p_pools, '{}', p_page, 0) c;
    END
    $$;
    -- Each function's expected peak memory (bytes) and runtime, for the memory-aware start.
    CREATE TABLE IF NOT EXISTS footprints (
        func text PRIMARY KEY, peak double precision NOT NULL, runtime double precision NOT NULL,
        runs integer NOT NULL, estimated boolean NOT NULL, updated_at double precision NOT NULL
    );
    CREATE OR REPLACE FUNCTION queickd_claim(p_now double precision, p_worker bigint, p_pools text[],
                                             p_net boolean, p_limit integer) RETURNS SETOF jobs
    LANGUAGE plpgsql SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off AS $$
    DECLARE
        n integer;
        locked text[];
        open_p text[];  -- 'kind:name' of the pauses whose probe this claim may take
        j jobs;
    BEGIN
    RETURN QUERY UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = p_now, worker_id = p_worker
    WHERE id IN (
        SELECT q.id FROM jobs q
        WHERE q.state = 'queued'
          AND q.concurrency_group IS NULL
          AND (p_pools IS NULL OR q.pool = ANY(p_pools))
          AND (p_net OR NOT q.retry_on_network)
          AND NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'pool' AND p.name = q.pool)
          AND NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'func' AND p.name = q.func)
          AND (q.key IS NULL OR (
              NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'key' AND p.name = q.key)
              AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.key = q.key AND r.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = q.key AND e.state = 'queued'
                              AND (e.priority, e.run_at, e.id) < (q.priority, q.run_at, q.id))))
        ORDER BY q.priority, q.run_at, q.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED)
    RETURNING *;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n >= p_limit OR NOT EXISTS (SELECT 1 FROM pauses WHERE probe_at <= p_now) THEN
        RETURN;
    END IF;
    SELECT array_agg(x.kind || ':' || x.name) INTO locked FROM (
        SELECT kind, name FROM pauses WHERE probe_at <= p_now ORDER BY kind, name FOR UPDATE SKIP LOCKED) x;
    -- A new statement, a new snapshot: a probe another host started and committed while
    -- we waited is seen running here.
    SELECT array_agg(p.kind || ':' || p.name) INTO open_p FROM pauses p
    WHERE p.kind || ':' || p.name = ANY(coalesce(locked, '{}'))
      AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.id = p.probe_job AND r.state = 'running');
    WHILE n < p_limit AND coalesce(cardinality(open_p), 0) > 0 LOOP
        SELECT q.* INTO j FROM jobs q
        WHERE q.state = 'queued'
          AND q.concurrency_group IS NULL
          AND (p_pools IS NULL OR q.pool = ANY(p_pools))
          AND (p_net OR NOT q.retry_on_network)
          AND NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'pool' AND p.name = q.pool)
          AND ('func:' || q.func = ANY(open_p) OR 'key:' || q.key = ANY(open_p))
          AND ('func:' || q.func = ANY(open_p)
               OR NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'func' AND p.name = q.func))
          AND (q.key IS NULL OR (
              ('key:' || q.key = ANY(open_p)
               OR NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'key' AND p.name = q.key))
              AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.key = q.key AND r.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = q.key AND e.state = 'queued'
                              AND (e.priority, e.run_at, e.id) < (q.priority, q.run_at, q.id))))
        ORDER BY q.priority, q.run_at, q.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = p_now, worker_id = p_worker
        WHERE id = j.id RETURNING * INTO j;
        UPDATE pauses SET probe_job = j.id
        WHERE (kind = 'func' AND name = j.func AND 'func:' || j.func = ANY(open_p))
           OR (kind = 'key' AND name = j.key AND 'key:' || j.key = ANY(open_p));
        open_p := array_remove(array_remove(open_p, 'func:' || j.func), 'key:' || coalesce(j.key, ''));
        n := n + 1;
        RETURN NEXT j;
    END LOOP;
    END
    $$;
    """

# 8: the budgets in force, one set for every claimer whatever its own config: written at
# start by a daemon or worker started with [budgets] (claim.py adopt_budgets, under
# the budget lock taken exclusively), read by every claim. The claim's first call is the
# view below, which takes that lock shared and says whether this claim is the selection
# (a grouped job waits, or a pool it serves has a budget: it then returns the view, at
# least the row 'selection') or queickd_claim, which takes neither kind of job (no rows).
# Holding the lock shared to the end of the claim's transaction means a budget comes
# into force only once the claims that read none have committed: the claims after it
# see their jobs running. The view also returns the budgets and, for each pause, whether
# this claim may take its probe: the due pauses are locked as queickd_claim locks them
# (SKIP LOCKED: another claim is taking that probe), so one probe starts per pause
# whichever path takes it, and the selection stamps the pause with it.
BUDGETS_IN_FORCE = """
    CREATE TABLE IF NOT EXISTS budgets (
        kind text NOT NULL CHECK (kind IN ('pool', 'group')),
        name text NOT NULL,
        units double precision NOT NULL CHECK (units > 0),  -- its limit, in cost units
        PRIMARY KEY (kind, name)
    );
    DROP FUNCTION IF EXISTS queickd_claim_view(bigint, text[], integer);
    CREATE OR REPLACE FUNCTION queickd_claim_view(p_lock bigint, p_budget_lock bigint, p_pools text[],
                                                  p_page integer, p_now double precision)
    RETURNS TABLE (kind text, id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision, slot integer, probe boolean)
    LANGUAGE plpgsql VOLATILE SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off AS $$
    DECLARE
        selection boolean;
        locked text[];
    BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_budget_lock);
    SELECT EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL)
        OR EXISTS (SELECT 1 FROM budgets b WHERE b.kind = 'pool' AND (p_pools IS NULL OR b.name = ANY(p_pools)))
        INTO selection;
    IF NOT selection THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(p_lock);
    RETURN QUERY SELECT 'selection'::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, NULL::double precision,
                        NULL::integer, NULL::boolean;
    SELECT array_agg(x.kind || ':' || x.name) INTO locked FROM (
        SELECT p.kind, p.name FROM pauses p WHERE p.probe_at <= p_now ORDER BY p.kind, p.name
        FOR UPDATE SKIP LOCKED) x;
    RETURN QUERY SELECT 'running'::text, r.id, r.key, r.func, r.pool, r.retry_on_network, r.run_at,
                        r.concurrency_group, r.concurrency_limit, r.cost_units, r.slot, NULL::boolean
    FROM jobs r WHERE r.state = 'running';
    RETURN QUERY SELECT p.kind, NULL::bigint, p.name, NULL::text, NULL::text, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, NULL::double precision, NULL::integer,
                        coalesce(p.kind || ':' || p.name = ANY(locked), false)
                        AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.id = p.probe_job AND r.state = 'running')
    FROM pauses p;
    RETURN QUERY SELECT 'budget'::text, NULL::bigint, b.name, NULL::text, b.kind, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, b.units, NULL::integer, NULL::boolean
    FROM budgets b;
    RETURN QUERY SELECT 'queued'::text, c.*, NULL::integer, NULL::boolean
    FROM queickd_candidates(p_pools, '{}', p_page, 0) c;
    END
    $$;
    """

# 9: no JIT in the claim functions. They turn seq scans off (the plans must use the
# queue's indexes), which prices a scan of a small table without an index on the filter
# (budgets, pauses) at 10^10 and so over jit_above_cost: PostgreSQL then JIT-compiled
# that query on every claim, 25-65 ms of a claim that otherwise takes 1-3 ms.
NO_JIT = """
    ALTER FUNCTION queickd_claim(double precision, bigint, text[], boolean, integer) SET jit = off;
    ALTER FUNCTION queickd_candidates(text[], text[], integer, integer) SET jit = off;
    ALTER FUNCTION queickd_claim_view(bigint, bigint, text[], integer, double precision) SET jit = off;
    """

# 10: the selection's start (claim.py) as a function with planner settings of its own.
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


# 22: the view (8, with 9's and 14's settings) restated with p_force: the claimer asks for
# the selection whatever waits (its claim sets jobs aside: claim.py).
VIEW_ON_REQUEST = """
    DROP FUNCTION IF EXISTS queickd_claim_view(bigint, bigint, text[], integer, double precision);
    CREATE OR REPLACE FUNCTION queickd_claim_view(p_lock bigint, p_budget_lock bigint, p_pools text[],
                                                  p_page integer, p_now double precision, p_force boolean)
    RETURNS TABLE (kind text, id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision, slot integer, probe boolean)
    LANGUAGE plpgsql VOLATILE SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off
        SET jit = off SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        selection boolean;
        locked text[];
    BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_budget_lock);
    SELECT EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL)
        OR EXISTS (SELECT 1 FROM budgets b WHERE b.kind = 'pool' AND (p_pools IS NULL OR b.name = ANY(p_pools)))
        INTO selection;
    IF NOT selection AND NOT p_force THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(p_lock);
    RETURN QUERY SELECT 'selection'::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, NULL::double precision,
                        NULL::integer, NULL::boolean;
    SELECT array_agg(x.kind || ':' || x.name) INTO locked FROM (
        SELECT p.kind, p.name FROM pauses p WHERE p.probe_at <= p_now ORDER BY p.kind, p.name
        FOR UPDATE SKIP LOCKED) x;
    RETURN QUERY SELECT 'running'::text, r.id, r.key, r.func, r.pool, r.retry_on_network, r.run_at,
                        r.concurrency_group, r.concurrency_limit, r.cost_units, r.slot, NULL::boolean
    FROM jobs r WHERE r.state = 'running';
    RETURN QUERY SELECT p.kind, NULL::bigint, p.name, NULL::text, NULL::text, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, NULL::double precision, NULL::integer,
                        coalesce(p.kind || ':' || p.name = ANY(locked), false)
                        AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.id = p.probe_job AND r.state = 'running')
    FROM pauses p;
    RETURN QUERY SELECT 'budget'::text, NULL::bigint, b.name, NULL::text, b.kind, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, b.units, NULL::integer, NULL::boolean
    FROM budgets b;
    RETURN QUERY SELECT 'queued'::text, c.*, NULL::integer, NULL::boolean
    FROM queickd_candidates(p_pools, '{}', p_page, 0) c;
    END
    $$;
    """
