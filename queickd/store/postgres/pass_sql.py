"""A worker pool's pass in the steady state as one SQL function, written once; schema.py's
migrations create it from here. Nothing here imports psycopg."""

from __future__ import annotations

from .channels import CHANNEL, FINISHED_CHANNEL
from .claim_sql import (
    FAST_CLAIM,
    FAST_CLAIM_VARS,
    NEAR_RATE_KEY_OPEN,
    OPEN_FAIR_WAITS,
    OPEN_GROUP_WAITS,
    PLANNED,
    POOL_BUDGETED,
    ROOMY_BEHIND_FULL,
)

# queickd_pass: the pass of a pool whose finished jobs all succeeded outside any workflow,
# then its next claim on the fast path, as one statement (a worker of one slot passes once
# per job, and each round trip costs more than the statement). The finish is
# finish_if_running's for successes, restated (the store contract holds the two together),
# told on the wake-up channel if it freed a key, a group's slot or a budgeted pool's units,
# else on the finished channel only when a client waits on one of its jobs. When the
# selection must claim it does nothing and returns the row of NULLs, its state 'queued' when
# a rate key near its limit whose window opened asks for it (the next pass is this one's
# again). A probe due with room left goes to queickd_claim.
PASS = f"""
    CREATE OR REPLACE FUNCTION queickd_pass(p_budget_lock bigint, p_now double precision, p_worker bigint,
                                            p_pools text[], p_net boolean, p_limit integer,
                                            p_ids bigint[], p_results text[], p_outputs text[]) RETURNS SETOF jobs
    LANGUAGE plpgsql {PLANNED} AS $$
    DECLARE
        n integer;
        done_ids bigint[];  -- the jobs this pass finished (still running under this worker)
        done_keys text[];
        done_funcs text[];
        frees boolean;      -- a finish freed a key, a group's slot or a budgeted pool's units
        waited boolean;     -- a client waits on one of them (17)
        nothing jobs;
{FAST_CLAIM_VARS}    BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_budget_lock);
    IF {NEAR_RATE_KEY_OPEN.replace("{room}", "p_limit")} THEN
        nothing.state := 'queued';  -- the selection's turn for a key whose window opened, once
        RETURN NEXT nothing;
        RETURN;
    END IF;
    IF {OPEN_GROUP_WAITS}
       OR {POOL_BUDGETED}
       OR {ROOMY_BEHIND_FULL.replace("{room}", "p_limit")}
       OR {OPEN_FAIR_WAITS}
    THEN
        RETURN NEXT nothing;  -- all NULL: nothing done, the selection's turn
        RETURN;
    END IF;
    IF cardinality(p_ids) > 0 THEN
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
{FAST_CLAIM}
    IF n < p_limit AND EXISTS (SELECT 1 FROM pauses WHERE probe_at <= p_now) THEN
        RETURN QUERY SELECT * FROM queickd_claim(NULL, p_now, p_worker, p_pools, p_net, p_limit - n);
    END IF;
    END
    $$;
"""
