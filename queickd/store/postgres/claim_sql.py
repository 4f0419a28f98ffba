"""The claim's SQL functions, each written once; schema.py's migrations create them from
here. core/policy/claim.py's rules in SQL, where a claim must not cost a round trip more
(the store contract holds the two together). Each function sets its own planner settings,
so that statistics taken while the queue was empty never make it sort or scan the queue
instead of walking its indexes; PL/pgSQL caches its plans for the session."""

from __future__ import annotations

# Held to its commit by each claim of the selection, and by the fast path before it reads rate
# keys' rooms: one such claim at a time, across hosts.
CLAIM_LOCK = 0x71756963_6B640003

# --- the rules, each written once ---------------------------------------------------------
MARK_RUNNING = "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = p_now, worker_id = p_worker"

# A queued job the fast path may take, but for its function's and key's pauses and its key:
# no group, rate limit or fair key (the selection's), of a pool served and not paused.
_FAST_PATH_JOB = """        WHERE q.state = 'queued'
          AND q.concurrency_group IS NULL
          AND q.rate_limit IS NULL
          AND q.fair_by IS NULL
          AND (p_pools IS NULL OR q.pool = ANY(p_pools))
          AND (p_net OR NOT q.retry_on_network)
          AND NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'pool' AND p.name = q.pool)
"""

# Its key runs nothing and it is its key's head (no job of the key before it waits, of any
# pool: a head that cannot start holds its key), taken in queue order.
_KEY_FREE_IN_ORDER = """              AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.key = q.key AND r.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = q.key AND e.state = 'queued'
                              AND (e.priority, e.run_at, e.id) < (q.priority, q.run_at, q.id))))
        ORDER BY q.priority, q.run_at, q.id
"""

# ... neither its function nor its key paused.
_FREE_IN_ORDER = """          AND NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'func' AND p.name = q.func)
          AND (q.key IS NULL OR (
              NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'key' AND p.name = q.key)
""" + _KEY_FREE_IN_ORDER

# The fast path's claim: the oldest such jobs, none paused, locked with SKIP LOCKED and
# marked running in one statement (queickd_claim's and queickd_pass's).
_PLAIN_CLAIM = f"""    RETURN QUERY {MARK_RUNNING}
    WHERE id IN (
        SELECT q.id FROM jobs q
{_FAST_PATH_JOB}{_FREE_IN_ORDER}        LIMIT p_limit
        FOR UPDATE SKIP LOCKED)
    RETURNING *;
"""



def skip_scan(cte: str, col: str, rows: str, of: str = "name") -> str:
    """The recursive `cte (of)`: each distinct `col` of `rows` (a FROM and its WHERE) in order,
    one index descent each (a skip scan), then NULL."""
    first = f"SELECT {col} FROM {rows}"
    return f"""{cte} ({of}) AS (
            ({first} ORDER BY {col} LIMIT 1)
            UNION ALL
            SELECT ({first} AND {col} > {cte}.{of} ORDER BY {col} LIMIT 1)
            FROM {cte} WHERE {cte}.{of} IS NOT NULL)"""


def _groups_waiting(pools: str) -> str:
    """The recursive `waiting (i, name)`: name is a group with a job queued in the i-th pool of
    the array `pools`, NULL past its last, by a skip scan of jobs_queued_pool_group."""
    def group(i: str, after: str = "") -> str:
        return (f"(SELECT q.concurrency_group FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL"
                f" AND q.pool = {pools}[{i}]{after} ORDER BY q.concurrency_group LIMIT 1)")
    return f"""waiting (i, name) AS (
            SELECT 1, {group("1")}
            UNION ALL
            SELECT CASE WHEN w.name IS NULL THEN w.i + 1 ELSE w.i END,
                   CASE WHEN w.name IS NULL THEN {group("w.i + 1")}
                   ELSE {group("w.i", " AND q.concurrency_group > w.name")} END
            FROM waiting w WHERE w.name IS NOT NULL OR w.i < cardinality({pools}))"""


# --- rate limits: the fast path's part and the selection's ----------------------------------
RATE_KEY = "(q.rate_limit::json ->> 'key')"
# The lim-th newest start of a key (rate_starts counted back from the newest, along its key).
_LIM_TH_NEWEST = """(SELECT s.at FROM (SELECT s.at, sum(s.n) OVER (ORDER BY s.at DESC) AS seen
                                FROM rate_starts s WHERE s.key = {key}) s
                      WHERE s.seen >= r.lim ORDER BY s.at DESC LIMIT 1)"""
# A key's window is full when it is blocked or keeps `lim` starts of which the lim-th
# newest is within the window.
RATE_ROOM = ("NOT EXISTS (SELECT 1 FROM rate_keys r WHERE r.key = {key} AND (r.blocked_until > p_now"
             " OR (r.kept >= r.lim AND " + _LIM_TH_NEWEST.replace("{key}", "r.key") + " + r.per > p_now)))")
# A job of key k waits in a pool served (jobs_queued_rated; a lateral look, LIMIT 1: as an
# EXISTS, the planner hashed every queued rate-limited job's key instead). The keys asked
# about are found by rate_keys_room or rate_keys_blocked: not every key.
_KEY_WAITS = f"""CROSS JOIN LATERAL (
            SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.rate_limit IS NOT NULL
            AND {RATE_KEY} = k.key AND (p_pools IS NULL OR q.pool = ANY(p_pools)) LIMIT 1) x"""
# A key that admits nothing by its count (blocked, or keeping its limit's worth of starts)
# has a job waiting: the fast path then walks only the jobs without a rate limit (not a full
# key's backlog), and those of keys with room are the selection's.
FULL_RATE_KEY_WAITS = f"""(EXISTS (SELECT 1 FROM rate_keys k {_KEY_WAITS} WHERE k.lim - k.kept <= 0)
        OR EXISTS (SELECT 1 FROM rate_keys k {_KEY_WAITS} WHERE k.blocked_until > p_now))"""
# A rate-limited job waits in a pool served whose key's window has room (found by a skip
# scan of jobs_queued_rated, one descent per key, stopping at the first with room).
_ROOMY_RATE_KEY_WAITS = f"""EXISTS (
        WITH RECURSIVE {skip_scan("k", RATE_KEY, "jobs q WHERE q.state = 'queued' AND q.rate_limit IS NOT NULL", "key")}
        SELECT 1 FROM k {_KEY_WAITS}
        WHERE k.key IS NOT NULL AND {RATE_ROOM.format(key="k.key")})"""
# "Must the selection claim?", of rate limits: a key this claim could fill ({room} more
# starts reach its limit) has room now and a job waiting; or, while a full key's backlog
# waits (the fast path takes no rate-limited job then), any key with room has one.
NEAR_RATE_KEY_OPEN = f"""EXISTS (SELECT 1 FROM rate_keys k {_KEY_WAITS}
            WHERE k.lim - k.kept < {{room}} AND {RATE_ROOM.format(key="k.key")})"""
ROOMY_BEHIND_FULL = f"({FULL_RATE_KEY_WAITS} AND {_ROOMY_RATE_KEY_WAITS})"
OPEN_RATE_WAITS = f"""({NEAR_RATE_KEY_OPEN}
        OR {ROOMY_BEHIND_FULL})"""

# While rate-limited jobs wait, the fast path also takes those whose key has room by its
# count (core/policy/rates.py admits by the count alone) and is not blocked, at most a
# key's room of them (by each job's own limit), in queue order, in rounds while a round left
# jobs past a key's room. It takes the claim lock first (claims that may start rate-limited
# jobs take turns), then reads each key's room, and logs its starts as the selection does
# (store/sql/rates.py: every change of a key's count is relative, so retention's prune
# composes with it).
_HAS_ROOM = """(q.rate_limit IS NULL OR NOT EXISTS (
              SELECT 1 FROM rate_keys r WHERE r.key = rl.j ->> 'key' AND (r.blocked_until > p_now OR r.kept >= r.lim)))"""
FAST_CLAIM_VARS = """        f_ids bigint[];     -- the fast path's jobs of a round, with rate-limited ones, in queue order
        f_keys text[];      -- their rate keys (NULL: none)
        f_lims integer[];   -- and limits
        f_pers double precision[];
        f_left integer;     -- the jobs a round left for their key's room
        f_lower text[];     -- ... and of them the keys its own limit fills by their count
        f_lows integer[];   -- ... with that limit
        f_met text[] := '{}';  -- the rate keys filled by their count: they time the claimer
        f_round integer := 0;
        f_filled boolean := false;  -- a key filled by its count: the timer is asked
        f_took integer;
        f_timer jobs;       -- its timer: id NULL, run_at when a key it filled opens
"""
FAST_CLAIM = f"""    IF NOT EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.rate_limit IS NOT NULL)
       OR {FULL_RATE_KEY_WAITS} THEN
{_PLAIN_CLAIM}        GET DIAGNOSTICS n = ROW_COUNT;
    ELSE
        PERFORM pg_advisory_xact_lock({CLAIM_LOCK});  -- before any row lock, as the selection's
        n := 0;
        LOOP
            -- Read after the lock: a rate key's jobs within its room (its limit less the
            -- starts it keeps), in queue order; a job past its key's room is left.
            SELECT array_agg(y.id ORDER BY y.o) FILTER (WHERE y.ok), array_agg(y.k ORDER BY y.o) FILTER (WHERE y.ok),
                   array_agg(y.l ORDER BY y.o) FILTER (WHERE y.ok), array_agg(y.p ORDER BY y.o) FILTER (WHERE y.ok),
                   count(*) FILTER (WHERE NOT y.ok),
                   array_agg(y.k) FILTER (WHERE NOT y.ok AND y.kept >= y.l),
                   array_agg(y.l) FILTER (WHERE NOT y.ok AND y.kept >= y.l)
            INTO f_ids, f_keys, f_lims, f_pers, f_left, f_lower, f_lows
            FROM (SELECT x.*, row_number() OVER (ORDER BY x.priority, x.run_at, x.id) AS o,
                         x.k IS NULL OR x.kept + row_number() OVER (PARTITION BY x.k ORDER BY x.priority, x.run_at, x.id)
                                        <= x.l AS ok
                  FROM (SELECT q.id, q.priority, q.run_at, rl.j ->> 'key' AS k, (rl.j ->> 'limit')::integer AS l,
                               (rl.j ->> 'per')::float8 AS p,
                               coalesce((SELECT r.kept FROM rate_keys r WHERE r.key = rl.j ->> 'key'), 0) AS kept
                        FROM jobs q CROSS JOIN LATERAL (SELECT q.rate_limit::jsonb AS j) rl  -- read once a row
{_FAST_PATH_JOB.replace("AND q.rate_limit IS NULL", "AND " + _HAS_ROOM)}{_FREE_IN_ORDER}        LIMIT p_limit - n
        FOR UPDATE OF q SKIP LOCKED) x) y;
            IF EXISTS (SELECT 1 FROM unnest(f_keys) k WHERE k IS NOT NULL) THEN
                WITH s AS (SELECT u.k, count(*) AS c, min(u.l) AS l, min(u.p) AS p
                           FROM unnest(f_keys, f_lims, f_pers) AS u(k, l, p) WHERE u.k IS NOT NULL GROUP BY u.k),
                kept AS (INSERT INTO rate_keys (key, lim, per, kept) SELECT s.k, s.l, s.p, s.c FROM s ORDER BY s.k
                         ON CONFLICT (key) DO UPDATE SET kept = rate_keys.kept + excluded.kept, lim = excluded.lim,
                                                         per = excluded.per
                         RETURNING rate_keys.kept >= rate_keys.lim AS full),
                logged AS (INSERT INTO rate_starts (key, at, n) SELECT s.k, p_now, s.c FROM s
                           ON CONFLICT (key, at) DO UPDATE SET n = rate_starts.n + excluded.n)
                SELECT f_filled OR coalesce(bool_or(kept.full), false) INTO f_filled FROM kept;
            END IF;
            -- A job whose own limit its key's count reaches, below the key's limit (its jobs
            -- disagree): the key takes that limit, so the next claim is the selection's.
            IF f_lower IS NOT NULL THEN
                UPDATE rate_keys r SET lim = t.l
                FROM (SELECT u.k, min(u.l) AS l FROM unnest(f_lower, f_lows) AS u(k, l) GROUP BY u.k) t
                WHERE r.key = t.k AND r.lim > t.l;
            END IF;
            f_met := f_met || coalesce(f_keys, '{{}}') || coalesce(f_lower, '{{}}');
            f_filled := f_filled OR f_lower IS NOT NULL;
            RETURN QUERY {MARK_RUNNING} WHERE id = ANY(f_ids) RETURNING *;
            GET DIAGNOSTICS f_took = ROW_COUNT;
            n := n + f_took;
            f_round := f_round + 1;
            -- Room left by a key filled here goes to the jobs behind its backlog: the filled
            -- key is left out of the next round by its count.
            EXIT WHEN f_left = 0 OR n >= p_limit OR f_round >= 3;
        END LOOP;
        -- A key it filled says when it opens: the claimer's timer, a row of its own after
        -- the jobs (the claims after it leave such a key's jobs).
        IF f_filled THEN
            SELECT min(t.at) INTO f_timer.run_at FROM (
                SELECT {_LIM_TH_NEWEST.format(key="r.key")} + r.per AS at FROM rate_keys r
                WHERE r.key = ANY(f_met) AND r.kept >= r.lim) t WHERE t.at > p_now;
            IF f_timer.run_at IS NOT NULL THEN
                RETURN NEXT f_timer;
            END IF;
        END IF;
    END IF;
"""

# "Must the selection claim?": a pool served has a budget, or a grouped job waits in a pool
# served in a group that could start a job (not full by what runs: as many running as the
# lowest limit of its running jobs, claim.Selection.out_groups). A full group's jobs hold
# nothing the fast path does not respect (their key: it starts only a key's head). Each
# group's running jobs are read through jobs_group_slot, up to the first group not full.
# Every pool (NULL): any grouped job waiting.
POOL_BUDGETED = "EXISTS (SELECT 1 FROM budgets b WHERE b.kind = 'pool' AND (p_pools IS NULL OR b.name = ANY(p_pools)))"
_ANY_GROUPED = "EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL)"
OPEN_GROUP_WAITS = f"""(CASE WHEN p_pools IS NULL THEN {_ANY_GROUPED} ELSE EXISTS (
        WITH RECURSIVE {_groups_waiting("p_pools")}
        SELECT 1 FROM waiting w WHERE w.name IS NOT NULL AND NOT coalesce((
            SELECT count(*) >= min(coalesce(nullif(r.concurrency_limit, 0), 1)) FROM jobs r
            WHERE r.state = 'running' AND r.concurrency_group IS NOT NULL AND r.concurrency_group = w.name), false))
    END)"""
# The view's question, of every grouped job waiting in a pool served, full group or not
# (one descent of jobs_queued_pool_group per pool served).
_SERVED_GROUPED = (
    f"(CASE WHEN p_pools IS NULL THEN {_ANY_GROUPED} ELSE EXISTS (SELECT 1 FROM unnest(p_pools) s (name)"
    " CROSS JOIN LATERAL (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL"
    " AND q.pool = s.name ORDER BY q.concurrency_group LIMIT 1) x) END)")

# "Must the selection claim?", of fair shares (core/policy/fair.py): a fair key has a job
# queued in a pool served, or a count of one not yet folded into fair_keys (schema.py, 36;
# one look at fair_keys_waiting and at fair_deltas_pool per pool): the claim's order is
# then the fair shares', which the selection keeps.
OPEN_FAIR_WAITS = ("(EXISTS (SELECT 1 FROM fair_keys f WHERE f.waiting > 0"
                   " AND (p_pools IS NULL OR f.pool = ANY(p_pools)))"
                   " OR EXISTS (SELECT 1 FROM fair_deltas d WHERE p_pools IS NULL OR d.pool = ANY(p_pools)))")

# The settings of a function planned once per session, whose plans must walk the indexes.
PLANNED = ("SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off\n"
           "        SET jit = off SET plan_cache_mode = force_generic_plan")

# --- the functions --------------------------------------------------------------------------
# queickd_claim, the fast path: given the budget lock, it takes it shared and asks whether
# the selection must claim; if so it claims nothing and returns one row of NULLs. NULL: the
# view has just answered no, under the lock it holds. Then due probes, when room is left:
# the due pauses are locked (SKIP LOCKED: another host's claim is taking that probe) and each
# is stamped with its probe's id in the same transaction, so two hosts never both probe.
CLAIM = f"""
    CREATE OR REPLACE FUNCTION queickd_claim(p_budget_lock bigint, p_now double precision, p_worker bigint,
                                             p_pools text[], p_net boolean, p_limit integer) RETURNS SETOF jobs
    LANGUAGE plpgsql {PLANNED} AS $$
    DECLARE
        n integer;
        locked text[];
        open_p text[];  -- 'kind:name' of the pauses whose probe this claim may take
        j jobs;
{FAST_CLAIM_VARS}    BEGIN
    IF p_budget_lock IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(p_budget_lock);
        IF {OPEN_GROUP_WAITS}
           OR {POOL_BUDGETED}
           OR {OPEN_RATE_WAITS.replace("{room}", "p_limit")}
           OR {OPEN_FAIR_WAITS}
        THEN
            RETURN NEXT j;  -- all NULL: the selection's turn (queickd_claim_view)
            RETURN;
        END IF;
    END IF;
{FAST_CLAIM}
    IF n >= p_limit OR NOT EXISTS (SELECT 1 FROM pauses WHERE probe_at <= p_now) THEN
        RETURN;
    END IF;
    SELECT array_agg(x.kind || ':' || x.name) INTO locked FROM (
        SELECT kind, name FROM pauses WHERE probe_at <= p_now ORDER BY kind, name FOR UPDATE SKIP LOCKED) x;
    -- A new statement, a new snapshot: a probe another host started and committed while
    -- we waited is seen running here.
    SELECT array_agg(p.kind || ':' || p.name) INTO open_p FROM pauses p
    WHERE p.kind || ':' || p.name = ANY(coalesce(locked, '{{}}'))
      AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.id = p.probe_job AND r.state = 'running');
    WHILE n < p_limit AND coalesce(cardinality(open_p), 0) > 0 LOOP
        SELECT q.* INTO j FROM jobs q
{_FAST_PATH_JOB}          AND ('func:' || q.func = ANY(open_p) OR 'key:' || q.key = ANY(open_p))
          AND ('func:' || q.func = ANY(open_p)
               OR NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'func' AND p.name = q.func))
          AND (q.key IS NULL OR (
              ('key:' || q.key = ANY(open_p)
               OR NOT EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'key' AND p.name = q.key))
{_KEY_FREE_IN_ORDER}        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        {MARK_RUNNING}
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

# queickd_candidates, the selection's first page as migration 4 made it (the view reads
# queickd_candidates_after now); its settings beyond these are migrations 9's and 12's ALTERs.
CANDIDATES = """
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
"""

# queickd_claim_view, the selection's first call: it takes the budget lock shared and asks
# whether the selection claims (or is asked to by p_force); if not it returns no rows. Else,
# under the claim lock, it returns the row 'selection', what runs, the pauses (with whether
# this claim may take each one's probe), the rate keys' windows, the budgets and the first
# page of candidates, each by a statement of its own (VOLATILE: a snapshot each, after the
# lock), so what runs is what every earlier such claim committed.
VIEW = f"""
    CREATE OR REPLACE FUNCTION queickd_claim_view(p_lock bigint, p_budget_lock bigint, p_pools text[],
                                                  p_page integer, p_now double precision, p_force boolean)
    RETURNS TABLE (kind text, id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision, slot integer, probe boolean, rate_limit text)
    LANGUAGE plpgsql VOLATILE {PLANNED} AS $$
    DECLARE
        selection boolean;
        locked text[];
    BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_budget_lock);
    SELECT {_SERVED_GROUPED}
        OR {POOL_BUDGETED}
        OR {OPEN_RATE_WAITS.replace("{room}", "p_page")}
        OR {OPEN_FAIR_WAITS}
        INTO selection;
    IF NOT selection AND NOT p_force THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(p_lock);
    RETURN QUERY SELECT 'selection'::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, NULL::double precision,
                        NULL::integer, NULL::boolean, NULL::text;
    SELECT array_agg(x.kind || ':' || x.name) INTO locked FROM (
        SELECT p.kind, p.name FROM pauses p WHERE p.probe_at <= p_now ORDER BY p.kind, p.name
        FOR UPDATE SKIP LOCKED) x;
    RETURN QUERY SELECT 'running'::text, r.id, r.key, r.func, r.pool, r.retry_on_network, r.run_at,
                        r.concurrency_group, r.concurrency_limit, r.cost_units, r.slot, NULL::boolean, NULL::text
    FROM jobs r WHERE r.state = 'running';
    RETURN QUERY SELECT p.kind, NULL::bigint, p.name, NULL::text, NULL::text, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, NULL::double precision, NULL::integer,
                        coalesce(p.kind || ':' || p.name = ANY(locked), false)
                        AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.id = p.probe_job AND r.state = 'running'),
                        NULL::text
    FROM pauses p;
    RETURN QUERY SELECT 'rate'::text, NULL::bigint, k.key, NULL::text, NULL::text, NULL::boolean, k.blocked_until,
                        NULL::text, k.lim, k.per, k.kept, NULL::boolean, NULL::text
    FROM rate_keys k;
    RETURN QUERY SELECT 'budget'::text, NULL::bigint, b.name, NULL::text, b.kind, NULL::boolean,
                        NULL::double precision, NULL::text, NULL::integer, b.units, NULL::integer, NULL::boolean,
                        NULL::text
    FROM budgets b;
    RETURN QUERY SELECT 'queued'::text, c.id, c.key, c.func, c.pool, c.retry_on_network, c.run_at,
                        c.concurrency_group, c.concurrency_limit, c.cost_units, NULL::integer, NULL::boolean,
                        c.rate_limit
    FROM queickd_candidates_after(p_pools, '{{}}', p_page, -2147483648, '-infinity', 0, '{{}}') c;
    END
    $$;
"""

# queickd_start, the selection's start: its jobs marked running (a keyed job only as its
# key's head: the pages leave out full groups' jobs, a head among them included) and the
# pauses it let probes through stamped. Only the primary key is left to the plan (hash and
# merge joins off, the state tested in a form no index matches): one lookup per id.
START = f"""
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
        {MARK_RUNNING},
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

# Of keyed jobs, only the head of their key (its first queued job of any pool, one look
# along jobs_queued_key): a key's head in a pool the claim does not read is not seen
# holding its key (claim.SerialKeys), and the jobs behind it must not start before it.
_HEAD_OF_KEY = """(q.key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = q.key AND e.state = 'queued'
                                    AND (e.priority, e.run_at, e.id) < (q.priority, q.run_at, q.id)))"""

_SERVED = "(p_pools IS NULL OR q.pool = ANY(p_pools) OR q.key IS NOT NULL)"


def _page(where: str) -> str:
    """One stream of the selection's pages: the queued jobs `where` after the page's start,
    keys' heads only, in queue order, at most p_limit (an index walk)."""
    return f"""SELECT q.priority, q.id, q.key, q.func, q.pool, q.retry_on_network, q.run_at, q.concurrency_group,
                   q.concurrency_limit, q.cost_units, q.rate_limit
            FROM jobs q WHERE q.state = 'queued' AND {where}
              AND (q.priority, q.run_at, q.id) > (p_priority, p_run_at, p_id)
              AND {_HEAD_OF_KEY}
            ORDER BY q.priority, q.run_at, q.id LIMIT p_limit"""


# queickd_candidates_after, the selection's next pages: queued jobs in queue order after a
# (priority, run_at, id), as the merge of the ungrouped ones without a rate limit, for each
# group waiting that is not in p_full, that group's first ones, and for each rate key
# waiting (of jobs without a group) that is not in p_rates_full, that key's first ones
# (jobs_queued_rate_key): a full group's or key's backlog is not walked. The groups are
# those of the pools served (each pool with a grouped job waiting, when p_pools is NULL).
CANDIDATES_AFTER = f"""
    CREATE OR REPLACE FUNCTION queickd_candidates_after(p_pools text[], p_full text[], p_limit integer,
                                                        p_priority integer, p_run_at double precision, p_id bigint,
                                                        p_rates_full text[])
    RETURNS TABLE (priority integer, id bigint, key text, func text, pool text, retry_on_network boolean,
                   run_at double precision, concurrency_group text, concurrency_limit integer,
                   cost_units double precision, rate_limit text)
    LANGUAGE plpgsql STABLE {PLANNED} AS $$
    DECLARE
        walked text[] := p_pools;
    BEGIN
    IF walked IS NULL THEN
        WITH RECURSIVE {skip_scan("p", "q.pool", "jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NOT NULL")}
        SELECT coalesce(array_agg(p.name), '{{}}') INTO walked FROM p WHERE p.name IS NOT NULL;
    END IF;
    RETURN QUERY WITH RECURSIVE {_groups_waiting("walked")},
        {skip_scan("rated", RATE_KEY, "jobs q WHERE q.state = 'queued' AND q.concurrency_group IS NULL"
                    " AND q.rate_limit IS NOT NULL")}
    SELECT c.* FROM (
        ({_page(f"q.concurrency_group IS NULL AND q.rate_limit IS NULL AND {_SERVED}")})
        UNION ALL
        SELECT x.* FROM waiting w CROSS JOIN LATERAL (
            {_page("q.concurrency_group IS NOT NULL AND q.pool = walked[w.i] AND q.concurrency_group = w.name")}) x
        WHERE w.name IS NOT NULL AND NOT w.name = ANY(p_full)
        UNION ALL
        SELECT x.* FROM rated r CROSS JOIN LATERAL (
            {_page(f"q.concurrency_group IS NULL AND q.rate_limit IS NOT NULL AND {RATE_KEY} = r.name AND {_SERVED}")}) x
        WHERE r.name IS NOT NULL AND NOT r.name = ANY(p_rates_full)) c
    ORDER BY c.priority, c.run_at, c.id LIMIT p_limit;
    END
    $$;
"""
