"""The PostgreSQL schema's migrations of a worker pool's pass (versions 14 on): the claim
planned once, the fast path asking for itself whether the selection must claim, the
steady state's pass as one statement, and finishes told only when a client waits on them.
schema.py lists them after claim_sql.py's. A migration that has shipped is never
edited: a changed function is the next migration, restating it whole (as 15 restates
queickd_claim with its first question). Nothing here imports psycopg."""

from __future__ import annotations

from .channels import CHANNEL, FINISHED_CHANNEL

# 14: the claim's first call (queickd_claim_view) and the fast path (queickd_claim) planned
# once per session, as the selection's functions are. Their statements take parameters
# (the pools served, the limit), and PL/pgSQL planned them again for each call's values
# while a generic plan priced above the custom ones: the generic plan of the view's "does
# a grouped job wait, or has a pool served a budget?" cannot bound its walk of the budgets
# by the pools (a filter, not an index condition) and, priced at 25.7 against 13.6, lost
# on every call. A worker of one slot paid that planning on every job: the view cost
# 200-225 us of server time per call, 138-152 us of it planning (pg_stat_statements with
# nested statements tracked), in a pass (finish one job, claim the next) of ~2 ms; planned
# once, 50-55 us. The generic plans walk the same indexes.
PLANNED_ONCE = """
    ALTER FUNCTION queickd_claim_view(bigint, bigint, text[], integer, double precision)
        SET plan_cache_mode = force_generic_plan;
    ALTER FUNCTION queickd_claim(double precision, bigint, text[], boolean, integer)
        SET plan_cache_mode = force_generic_plan;
"""

# The fast path's claim: the oldest claimable jobs of the pools served (no grouped job, none
# paused, the head of its serial key only), locked with SKIP LOCKED and marked running, as
# queickd_claim (15) and queickd_pass (18) both state it.
_FAST_CLAIM = """    RETURN QUERY UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = p_now, worker_id = p_worker
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
"""

# 15: the fast path decides itself whether it may claim: the view's first question (does
# a grouped job wait, or has a pool served a budget?) asked under the budget lock taken
# shared, as the view asks it. When the answer is yes it claims nothing and returns one row
# of NULLs, and the store calls the view for the selection. The common claim (no group, no
# budget) is one round trip instead of two: a worker of one slot makes it once per job.
# p_budget_lock NULL: the view has just answered no in this transaction, under the lock it
# holds to its end (a grouped job submitted since is not the fast path's to take: its
# NOTIFY wakes the pool for the next claim).
CLAIM_ASKS_FIRST = """
    DROP FUNCTION IF EXISTS queickd_claim(double precision, bigint, text[], boolean, integer);
    CREATE OR REPLACE FUNCTION queickd_claim(p_budget_lock bigint, p_now double precision, p_worker bigint,
                                             p_pools text[], p_net boolean, p_limit integer) RETURNS SETOF jobs
    LANGUAGE plpgsql SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off
        SET jit = off SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        n integer;
        locked text[];
        open_p text[];  -- 'kind:name' of the pauses whose probe this claim may take
        j jobs;
    BEGIN
    IF p_budget_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(p_budget_lock);
        IF EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL)
           OR EXISTS (SELECT 1 FROM budgets b WHERE b.kind = 'pool' AND (p_pools IS NULL OR b.name = ANY(p_pools)))
        THEN
            RETURN NEXT j;  -- all NULL: the selection's turn (queickd_claim_view)
            RETURN;
        END IF;
    END IF;
""" + _FAST_CLAIM + """    GET DIAGNOSTICS n = ROW_COUNT;
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

# queickd_pass's signature and settings, and its first question (does the selection claim
# instead?), as 16, 17 and 18 state them.
_PASS_SIGNATURE = """    CREATE OR REPLACE FUNCTION queickd_pass(p_budget_lock bigint, p_now double precision, p_worker bigint,
                                            p_pools text[], p_net boolean, p_limit integer,
                                            p_ids bigint[], p_results text[], p_outputs text[]) RETURNS SETOF jobs
    LANGUAGE plpgsql SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off
        SET jit = off SET plan_cache_mode = force_generic_plan AS $$
"""
_PASS_ASKS_FIRST = """    PERFORM pg_advisory_xact_lock_shared(p_budget_lock);
    IF EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL)
       OR EXISTS (SELECT 1 FROM budgets b WHERE b.kind = 'pool' AND (p_pools IS NULL OR b.name = ANY(p_pools)))
    THEN
        RETURN NEXT nothing;  -- all NULL: nothing done, the selection's turn
        RETURN;
    END IF;
"""


# 16: a worker pool's pass in the steady state (its finished jobs all succeeded, outside
# any workflow; then the next claim, on the fast path) as one statement, in a transaction
# of its own: BEGIN, the finish, the claim and COMMIT were four round trips, each costing
# the server ~50 us and the worker ~80 us of CPU besides the statement (a bare `SELECT 1`
# on this loopback), and a worker of one slot passes once per job. The finish is
# finish_if_running's for successes, restated (store.py; the store contract test
# test_a_pass_in_one_statement_stores_what_the_finish_and_the_claim_store holds the two
# together): the jobs still running for this worker marked succeeded, their keys' and
# functions' failure streaks reset, a pause whose probe this was lifted (and the pools
# woken), and the finish told: on the wake-up channel if it freed a key, a group's slot
# or a budgeted pool's units, else on the finished channel. Like the fast path, it asks
# first whether the selection must claim: if so it does nothing, returns the row of
# NULLs, and the pass goes the general way.
def _pass_function(told_when_waited: bool) -> str:
    """queickd_pass's CREATE statement: as migration 16 made it, or (told_when_waited) as 17
    restates it, reading the mark and telling a finish that frees nothing only when marked.
    One text for both, so the restatement cannot drift from the function it replaces."""
    return """
{signature}    DECLARE
        told integer;
        nothing jobs;
    BEGIN
{asks_first}    IF cardinality(p_ids) > 0 THEN
        WITH done AS (
            UPDATE jobs j SET state = 'succeeded', result = o.result, error = NULL, finished_at = p_now,
                              worker_id = NULL, output = o.output
            FROM unnest(p_ids, p_results, p_outputs) AS o(id, result, output)
            WHERE j.id = o.id AND j.state = 'running' AND (p_worker IS NULL OR j.worker_id = p_worker)
            RETURNING j.id, j.key, j.func,
                      (j.key IS NOT NULL OR j.concurrency_group IS NOT NULL
                       OR EXISTS (SELECT 1 FROM budgets b WHERE b.kind = 'pool' AND b.name = j.pool)) AS frees{returned}),
        reset AS (DELETE FROM streaks s USING done d
                  WHERE (s.kind = 'key' AND s.name = d.key) OR (s.kind = 'func' AND s.name = d.func)),
        lifted AS (DELETE FROM pauses p USING done d WHERE p.probe_job = d.id RETURNING 1),
        woke AS (SELECT pg_notify('{CHANNEL}', 'r') FROM (SELECT 1 FROM lifted LIMIT 1) x),
        said AS (SELECT CASE WHEN t.frees THEN pg_notify('{CHANNEL}', 'fk:' || t.ids)
                             ELSE pg_notify('{FINISHED_CHANNEL}', 'f:' || t.ids) END
                 FROM (SELECT bool_or(frees) AS frees, {aggregated}string_agg(id::text, ',') AS ids FROM done) t
                 WHERE t.ids IS NOT NULL{told_when})
        SELECT (SELECT count(*) FROM woke) + (SELECT count(*) FROM said) INTO told;
    END IF;
    RETURN QUERY SELECT * FROM queickd_claim(NULL, p_now, p_worker, p_pools, p_net, p_limit);
    END
    $$;
""".format(
        CHANNEL=CHANNEL, FINISHED_CHANNEL=FINISHED_CHANNEL, signature=_PASS_SIGNATURE, asks_first=_PASS_ASKS_FIRST,
        returned=",\n                      j.waited" if told_when_waited else "",
        aggregated="bool_or(waited) AS waited,\n                              " if told_when_waited else "",
        told_when=" AND (t.frees OR t.waited)" if told_when_waited else "")


PASS_IN_ONE = _pass_function(told_when_waited=False)

# 17: a finish that frees nothing is told (`f:IDS` on the finished channel) only when a
# client waits on one of its jobs: the daemon serving that `wait` marks the job `waited`
# first (store.watch_finish), and the finish reads the mark from the row it updates.
# PostgreSQL 15 signals every listening backend of the database on each notifying commit,
# whatever the channel: with a daemon and 4 worker processes that was 5 backends woken,
# and the daemon's listener thread, per job, for finishes nobody waited on (e2e, medians
# of 3 alternating runs: the database's CPU per job 238 -> 206 µs with 1 worker process,
# 480 -> 446 µs with 4). The mark and the finish update the same row, so one of them waits for
# the other's commit: the finish sees the mark, or the daemon's look after marking sees
# the finish. queickd_pass restated (_pass_function) with the mark read.
WAITED = """
    ALTER TABLE jobs ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT false;""" + _pass_function(
    told_when_waited=True)

# 18: the same pass in fewer and smaller statements, for the same rows, streaks, pauses and
# notifications. PostgreSQL builds each statement's executor state afresh on every call
# (plans are cached, their state is not), and a one-slot worker passes once per job: the
# pass's server CPU was ~500 us, ~170 us of it outside its statements' execution. Now:
# the finish finds its rows by id (= ANY, the primary key; the join with unnest built a
# hash table of every running job each time), the streaks and pauses are deleted only when
# the tables hold a row at all (a steady state has none), the notification is one
# pg_notify, and the claim is the fast path's statement itself, not a call of
# queickd_claim (a function call with its own settings, its rows copied once more). A
# probe due with room left goes to queickd_claim, for the room left. In process, one job a
# pass, 4 alternating runs: 396-554 -> 308-422 us of server CPU a pass.
LEANER_PASS = f"""
{_PASS_SIGNATURE}    DECLARE
        n integer;
        done_ids bigint[];  -- the jobs this pass finished (still running under this worker)
        done_keys text[];
        done_funcs text[];
        frees boolean;      -- a finish freed a key, a group's slot or a budgeted pool's units
        waited boolean;     -- a client waits on one of them (17)
        nothing jobs;
    BEGIN
{_PASS_ASKS_FIRST}    IF cardinality(p_ids) > 0 THEN
        WITH done AS (
            UPDATE jobs j SET state = 'succeeded', result = p_results[array_position(p_ids, j.id)], error = NULL,
                              finished_at = p_now, worker_id = NULL, output = p_outputs[array_position(p_ids, j.id)]
            WHERE j.id = ANY(p_ids) AND j.state = 'running' AND (p_worker IS NULL OR j.worker_id = p_worker)
            RETURNING j.id, j.key, j.func, j.waited,
                      (j.key IS NOT NULL OR j.concurrency_group IS NOT NULL
                       OR EXISTS (SELECT 1 FROM budgets b WHERE b.kind = 'pool' AND b.name = j.pool)) AS frees)
        SELECT array_agg(d.id), array_agg(d.key), array_agg(d.func), bool_or(d.frees), bool_or(d.waited)
        INTO done_ids, done_keys, done_funcs, frees, waited FROM done d;
        IF done_ids IS NOT NULL THEN
            IF EXISTS (SELECT 1 FROM streaks) THEN
                DELETE FROM streaks s WHERE (s.kind = 'key' AND s.name = ANY(done_keys))
                                         OR (s.kind = 'func' AND s.name = ANY(done_funcs));
            END IF;
            IF EXISTS (SELECT 1 FROM pauses) THEN
                DELETE FROM pauses p WHERE p.probe_job = ANY(done_ids);
                IF FOUND THEN
                    PERFORM pg_notify('{CHANNEL}', 'r');
                END IF;
            END IF;
            IF frees THEN
                PERFORM pg_notify('{CHANNEL}', 'fk:' || array_to_string(done_ids, ','));
            ELSIF waited THEN
                PERFORM pg_notify('{FINISHED_CHANNEL}', 'f:' || array_to_string(done_ids, ','));
            END IF;
        END IF;
    END IF;
{_FAST_CLAIM}    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < p_limit AND EXISTS (SELECT 1 FROM pauses WHERE probe_at <= p_now) THEN
        RETURN QUERY SELECT * FROM queickd_claim(NULL, p_now, p_worker, p_pools, p_net, p_limit - n);
    END IF;
    END
    $$;
"""

MIGRATIONS: list[str] = [PLANNED_ONCE, CLAIM_ASKS_FIRST, PASS_IN_ONE, WAITED, LEANER_PASS]
