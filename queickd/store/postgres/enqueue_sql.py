"""The SQL function `enqueue(func, args, options)` in the queue's schema: a job inserted by
the caller's own transaction (an application's connection, psql, a trigger), visible to
workers when, and only when, that transaction commits; the wake-up is a NOTIFY, sent at
that commit too. queickd.pg calls it from Python: it is the one place these rules are
written for a direct enqueue. Nothing here imports psycopg.

It applies the daemon's admission (core/policy/admission.py) to the one job, reading what
the caller's transaction sees: a live idempotency key answers with its job's id (an
expired one is released), a manual job refuses a key that has a job waiting or running
(`conflict`) and lifts the pauses of its key and function, the per-key and overall caps
refuse `queue_full`. The limits are the ones the daemons published (queickd_meta
`admission`, written by each daemon as it starts); none before any daemon has. The
overall cap's count is read only once the table's estimated rows reach half the cap: far
below it a count per enqueue would cost a read of every waiting job. No advisory lock:
one held to the application's commit would hold up every daemon's submit. Two
transactions that are both open can each take a key's last place under its cap.

Refusals are errors of a stable SQLSTATE (ERRORS, below), their message starting with the
wire protocol's code; a conflict's DETAIL is the id of the job it is with, a queue_full's
HINT the seconds to wait before trying again.
"""

from __future__ import annotations

from ...core import fields, sandbox
from ...core import retry as retry_mod
from ...core.cron import LATEST
from ...core.job import DEFAULT_POOL, State
from ...core.policy import rates
from ...core.policy.admission import RETRY_AFTER_DEFAULT
from ...core.protocol import MAX_COST_UNITS, MAX_INT, MAX_KEY_LEN, Code
from ..sqlstates import UNFINISHED_IN, WAITING_IN
from .channels import CHANNEL, QUEUED_CHANNEL

# A job's `origin` when this function inserted it (a daemon's submit leaves it NULL), so an
# operator's status tells the two apart (PostgresStore.direct_counts).
DIRECT = "direct"
# SQLSTATE -> the wire protocol's code (class QD: queickd's own, no standard class).
ERRORS = {"QD400": Code.BAD_REQUEST, "QD409": Code.CONFLICT, "QD429": Code.QUEUE_FULL}
_STATE = {code: state for state, code in ERRORS.items()}
OPTIONS = sorted(fields.ENQUEUE_WIRE - {"func", "args"} | {"delay"})  # what `options` may hold
_TEXT = ("key", "idempotency_key", "pool", "concurrency_group", "isolation")
_INTS = ("priority", "concurrency_limit", "memory_mb", "output_kb")
_NUMBERS = ("cost_units", "timeout")
_DEFAULT_INTERVAL = " ".join(f"WHEN '{p}' THEN {v}" for p, v in retry_mod.DEFAULT_INTERVAL.items())
_POLICIES = ", ".join(f"'{p}'" for p in retry_mod.POLICIES)


def _bad(condition: str, message: str) -> str:
    return (f"IF ({condition}) THEN RAISE EXCEPTION USING ERRCODE = '{_STATE[Code.BAD_REQUEST]}',"
            f" MESSAGE = 'bad_request: ' || {message}; END IF;")


def _checks() -> str:
    """Each option the job gives, checked as the wire protocol checks it (core/protocol.py):
    a loop over the keys given, so a job pays for the options it has."""
    by_name: dict[str, list[str]] = {}

    def check(name: str, condition: str, message: str) -> None:
        by_name.setdefault(name, []).append(_bad(condition, message))

    for name in _TEXT:
        check(name, f"jsonb_typeof(o->'{name}') <> 'null' AND (jsonb_typeof(o->'{name}') <> 'string'"
              f" OR o->>'{name}' = '' OR length(o->>'{name}') > {MAX_KEY_LEN})",
              f"'{name} must be a non-empty string of at most {MAX_KEY_LEN} characters'")
    for name in _INTS:
        check(name, f"jsonb_typeof(o->'{name}') NOT IN ('number', 'null')", f"'{name} must be an integer'")
        check(name, f"o->>'{name}' !~ '^-?[0-9]+$' OR abs((o->>'{name}')::numeric) > {MAX_INT}",
              f"'{name} must be an integer'")
    for name in (*_NUMBERS, "delay", "run_at"):
        check(name, f"jsonb_typeof(o->'{name}') NOT IN ('number', 'null')", f"'{name} must be a number'")
    for name in ("retry_on_network", "manual"):
        check(name, f"jsonb_typeof(o->'{name}') NOT IN ('boolean', 'null')", f"'{name} must be true or false'")
    iso = ", ".join(f"'{i}'" for i in sandbox.ISOLATIONS)
    check("isolation", f"o->>'isolation' NOT IN ({iso})", f"'isolation must be one of {iso.replace(chr(39), '')}'")
    check("timeout", f"(o->>'timeout')::float8 <= 0 OR (o->>'timeout')::float8 > {sandbox.MAX_TIMEOUT}",
          f"'timeout must be seconds above 0 and at most {sandbox.MAX_TIMEOUT:.0f} (a day)'")
    check("memory_mb", f"(o->>'memory_mb')::numeric NOT BETWEEN {sandbox.MIN_MEMORY_MB} AND {sandbox.MAX_MEMORY_MB}",
          f"'memory_mb must be an integer from {sandbox.MIN_MEMORY_MB} to {sandbox.MAX_MEMORY_MB}'")
    check("output_kb", f"(o->>'output_kb')::numeric NOT BETWEEN 1 AND {sandbox.MAX_OUTPUT_KB}",
          f"'output_kb must be an integer from 1 to {sandbox.MAX_OUTPUT_KB}'")
    check("isolation", f"o->>'isolation' = '{sandbox.THREAD}' AND ("
          + " OR ".join(f"o->>'{k}' IS NOT NULL" for k in sandbox.PROCESS_LIMITS) + ")",
          "'a job with memory_mb or output_kb runs in a process'")
    check("concurrency_limit", "(o->>'concurrency_limit')::numeric < 1", "'concurrency_limit must be at least 1'")
    check("cost_units", f"(o->>'cost_units')::float8 <= 0 OR (o->>'cost_units')::float8 > {MAX_COST_UNITS:.0f}",
          "'cost_units must be above 0'")
    # rate_limit: {"key", "limit", "per"} as protocol.rate_limit checks it, each part in turn.
    rl, shape = "o->'rate_limit'", "'rate_limit must be {\"key\": text, \"limit\": starts, \"per\": seconds}'"
    check("rate_limit", f"jsonb_typeof({rl}) NOT IN ('object', 'null')", shape)
    check("rate_limit", f"jsonb_typeof({rl}) = 'object' AND (SELECT array_agg(x ORDER BY x)"
          f" FROM jsonb_object_keys({rl}) x) <> ARRAY['key', 'limit', 'per']", shape)
    check("rate_limit", f"jsonb_typeof({rl}->'key') <> 'string' OR {rl}->>'key' = ''"
          f" OR octet_length({rl}->>'key') > {MAX_KEY_LEN}",
          f"'rate_limit.key must be a non-empty string of at most {MAX_KEY_LEN} bytes'")
    check("rate_limit", f"jsonb_typeof({rl}->'limit') <> 'number' OR {rl}->>'limit' !~ '^[0-9]+$'"
          f" OR ({rl}->>'limit')::numeric NOT BETWEEN 1 AND {rates.MAX_LIMIT}",
          f"'rate_limit.limit must be an integer from 1 to {rates.MAX_LIMIT}'")
    check("rate_limit", f"jsonb_typeof({rl}->'per') <> 'number'"
          f" OR ({rl}->>'per')::numeric NOT BETWEEN {rates.MIN_PER} AND {rates.MAX_PER:.0f}",
          f"'rate_limit.per must be a number from {rates.MIN_PER} to {rates.MAX_PER:.0f}'")
    check("delay", "(o->>'delay')::float8 < 0", "'delay must not be negative'")
    check("delay", "jsonb_typeof(o->'run_at') = 'number' AND jsonb_typeof(o->'delay') = 'number'",
          "'give run_at or delay, not both'")
    check("run_at", "(o->>'run_at')::float8 < 0", "'run_at must be unix seconds: a finite number, 0 or later'")
    branches = "".join(f"\n                WHEN '{name}' THEN\n                    " + "\n                    ".join(checks)
                       for name, checks in sorted(by_name.items()))
    return f"""FOR given IN SELECT jsonb_object_keys(o) LOOP
            CASE given{branches}
                ELSE NULL;
            END CASE;
        END LOOP;"""


_ALLOWED = ", ".join(f"'{k}'" for k in OPTIONS)

ENQUEUE = f"""
    CREATE OR REPLACE FUNCTION enqueue(func text, args jsonb DEFAULT '[]', options jsonb DEFAULT '{{}}')
    RETURNS bigint LANGUAGE plpgsql AS $enqueue$
    DECLARE
        o jsonb := coalesce(options, '{{}}');
        f text := func;
        a jsonb := coalesce(args, '[]');
        kw jsonb := coalesce(nullif(o->'kwargs', 'null'), '{{}}');
        now_ double precision := extract(epoch from clock_timestamp());
        at double precision;
        k text := o->>'key';
        ik text := o->>'idempotency_key';
        pool_ text := coalesce(o->>'pool', '{DEFAULT_POOL}');
        manual boolean;
        r jsonb := nullif(o->'retry', 'null');
        limits jsonb;
        old record;
        other bigint;
        new_id bigint;
        unknown text;
        given text;
    BEGIN
        {_bad("f IS NULL OR f !~ '^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*[:.][A-Za-z_][A-Za-z0-9_]*$'",
              "'func must be ''module:function'' (or ''module.function'')'")}
        IF position(':' in f) = 0 THEN
            f := regexp_replace(f, '[.]([^.]*)$', ':\\1');
        END IF;
        {_bad("jsonb_typeof(o) <> 'object'", "'options must be a JSON object'")}
        SELECT string_agg(x, ', ' ORDER BY x) INTO unknown FROM jsonb_object_keys(o) x
        WHERE x NOT IN ({_ALLOWED});
        {_bad("unknown IS NOT NULL", "'unknown job field(s): ' || unknown")}
        {_bad("jsonb_typeof(a) <> 'array'", "'args must be a JSON array'")}
        {_bad("jsonb_typeof(kw) <> 'object'", "'kwargs must be a JSON object'")}
        {_checks()}
        manual := coalesce((o->>'manual')::boolean, false);
        at := coalesce((o->>'run_at')::float8, now_ + (o->>'delay')::float8, now_);
        {_bad(f"at > {LATEST:.0f}", "'the job would run after the year 9999: run_at is unix seconds, not milliseconds'")}
        IF r = 'false' THEN
            r := NULL;
        ELSIF r = 'true' THEN
            r := '{{}}';
        END IF;
        IF r IS NOT NULL THEN
            {_bad("jsonb_typeof(r) <> 'object'", "'retry must be an object, true or false'")}
            {_bad("EXISTS (SELECT 1 FROM jsonb_object_keys(r) x WHERE x NOT IN "
                  "('policy', 'interval', 'max_interval', 'max_attempts'))", "'unknown retry field(s)'")}
            {_bad("jsonb_typeof(r->'policy') NOT IN ('string', 'null') OR EXISTS (SELECT 1 FROM jsonb_each(r) x"
                  " WHERE x.key <> 'policy' AND jsonb_typeof(x.value) NOT IN ('number', 'null'))",
                  "'retry interval, max_interval and max_attempts must be numbers'")}
            {_bad("r->>'max_attempts' !~ '^-?[0-9]+$'",
                  "'retry.max_attempts must be an integer'")}
            r := jsonb_strip_nulls(r);
            r := jsonb_build_object('policy', coalesce(r->>'policy', '{retry_mod.DEFAULT_POLICY}'));
            r := r || jsonb_build_object(
                'interval', coalesce((o->'retry'->>'interval')::float8,
                                     CASE r->>'policy' {_DEFAULT_INTERVAL} END),
                'max_interval', coalesce((o->'retry'->>'max_interval')::float8, {retry_mod.DEFAULT_MAX_INTERVAL}),
                'max_attempts', coalesce((o->'retry'->>'max_attempts')::numeric::int, {retry_mod.DEFAULT_MAX_ATTEMPTS}));
            {_bad(f"r->>'policy' NOT IN ({_POLICIES})", f"'retry policy must be one of {_POLICIES.replace(chr(39), '')}'")}
            {_bad("(r->>'interval')::float8 <= 0 OR (r->>'max_interval')::float8 <= 0",
                  "'retry interval and max_interval must be positive'")}
            {_bad("(r->>'max_attempts')::int < 1", "'retry max_attempts must be at least 1'")}
        END IF;

        SELECT value::jsonb INTO limits FROM queickd_meta WHERE key = 'admission';
        IF ik IS NOT NULL THEN
            SELECT id, state, created_at INTO old FROM jobs WHERE idempotency_key = ik;
            IF FOUND THEN
                IF limits->'idempotency_ttl' IS NULL OR limits->'idempotency_ttl' = 'null'
                   OR now_ - old.created_at < (limits->>'idempotency_ttl')::float8 THEN
                    RETURN old.id;  -- a duplicate: the job the key already names
                END IF;
                UPDATE jobs SET idempotency_key = NULL WHERE idempotency_key = ik;
            END IF;
        END IF;
        IF manual AND k IS NOT NULL THEN
            SELECT id INTO other FROM jobs WHERE key = k AND state IN {UNFINISHED_IN} ORDER BY id LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = '{_STATE[Code.CONFLICT]}', DETAIL = other,
                    MESSAGE = format('conflict: key %L already has job %s waiting or running', k, other);
            END IF;
        END IF;
        IF k IS NOT NULL AND (limits->>'max_queued_per_key') IS NOT NULL
           AND (SELECT count(*) FROM jobs WHERE key = k AND state IN {WAITING_IN})
               + 1 > (limits->>'max_queued_per_key')::bigint THEN
            RAISE EXCEPTION USING ERRCODE = '{_STATE[Code.QUEUE_FULL]}', HINT = '{RETRY_AFTER_DEFAULT}',
                MESSAGE = format('queue_full: key %L has %s jobs waiting, its limit', k, limits->>'max_queued_per_key');
        END IF;
        IF (limits->>'max_queued') IS NOT NULL
           AND (SELECT reltuples FROM pg_class WHERE oid = 'jobs'::regclass) >= (limits->>'max_queued')::float8 / 2
           AND (SELECT count(*) FROM jobs WHERE state IN {WAITING_IN}) + 1 > (limits->>'max_queued')::bigint THEN
            RAISE EXCEPTION USING ERRCODE = '{_STATE[Code.QUEUE_FULL]}', HINT = '{RETRY_AFTER_DEFAULT}',
                MESSAGE = format('queue_full: the queue holds %s waiting jobs, its limit', limits->>'max_queued');
        END IF;

        INSERT INTO jobs (state, func, args, kwargs, priority, run_at, created_at, max_attempts, retry,
                          retry_on_network, key, idempotency_key, pool, concurrency_group, concurrency_limit,
                          cost_units, isolation, timeout, memory_mb, output_kb, rate_limit, origin)
        VALUES (CASE WHEN at <= now_ THEN '{State.QUEUED}' ELSE '{State.SCHEDULED}' END, f,
                CASE WHEN a = '[]' THEN NULL ELSE a::text END, CASE WHEN kw = '{{}}' THEN NULL ELSE kw::text END,
                coalesce((o->>'priority')::numeric::int, 0), at, now_, coalesce((r->>'max_attempts')::int, 1), r::text,
                coalesce((o->>'retry_on_network')::boolean, false), k, ik, pool_, o->>'concurrency_group',
                (o->>'concurrency_limit')::numeric::int, (o->>'cost_units')::float8, o->>'isolation',
                (o->>'timeout')::float8, (o->>'memory_mb')::numeric::int, (o->>'output_kb')::numeric::int,
                CASE WHEN jsonb_typeof(o->'rate_limit') = 'object' THEN jsonb_build_object(
                    'key', o->'rate_limit'->>'key', 'limit', (o->'rate_limit'->>'limit')::int,
                    'per', (o->'rate_limit'->>'per')::float8)::text END,
                '{DIRECT}')
        ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id INTO new_id;
        IF new_id IS NULL THEN  -- a transaction that committed meanwhile took the key: its job
            SELECT id INTO new_id FROM jobs WHERE idempotency_key = ik;
            RETURN new_id;
        END IF;
        IF manual THEN  -- an operator's run lifts the pauses of its key and function
            DELETE FROM streaks WHERE (kind = 'key' AND name = k) OR (kind = 'func' AND name = f);
            IF EXISTS (SELECT 1 FROM pauses WHERE (kind = 'key' AND name = k) OR (kind = 'func' AND name = f)) THEN
                DELETE FROM pauses WHERE (kind = 'key' AND name = k) OR (kind = 'func' AND name = f);
                PERFORM pg_notify('{CHANNEL}', 'r');
            END IF;
        END IF;
        IF at <= now_ THEN
            PERFORM pg_notify('{QUEUED_CHANNEL}', 'q:' || pool_);
        ELSE
            PERFORM pg_notify('{CHANNEL}', 's:' || at);  -- the daemons' timers
        END IF;
        RETURN new_id;
    END
    $enqueue$;
"""
