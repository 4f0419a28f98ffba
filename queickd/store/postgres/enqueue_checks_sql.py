"""The SQL expressions that check and read one job of a direct enqueue (enqueue_sql.py), each
over `j`, the job as a JSON object (`func`, `args` and the wire protocol's enqueue fields),
and `now_`, the time of the call: expressions, not statements, so that one query checks or
inserts a whole batch.

FIRST_FAILURE is the wire protocol's checks (core/protocol.py) as one CASE: the message of
the first check the job fails, NULL if none; BASIC_FAILS is true if the job fails a check of
what every job has. A check that casts a value comes after the check of its JSON type, in
the CASE's order, so a bad value is refused, never a cast error.
"""

from __future__ import annotations

from ...core import fields, sandbox
from ...core import retry as retry_mod
from ...core.cron import LATEST
from ...core.job import DEFAULT_POOL, State
from ...core.policy import liveness, rates
from ...core.protocol import MAX_COST_UNITS, MAX_INT, MAX_KEY_LEN

OPTIONS = sorted(fields.ENQUEUE_WIRE - {"func", "args"} | {"delay"})  # what a job may hold beside them
_FIELDS = "ARRAY[" + ", ".join(f"'{k}'" for k in ("func", "args", *OPTIONS)) + "]"
_TEXT = ("key", "idempotency_key", "pool", "concurrency_group", "isolation", "on_stall")
_INTS = ("priority", "concurrency_limit", "memory_mb", "output_kb")
_NUMBERS = ("cost_units", "timeout", "stalled_after")
_RL_SHAPE = "'rate_limit must be {\"key\": text, \"limit\": starts, \"per\": seconds}'"
_RETRY_FIELDS = ("policy", "interval", "max_interval", "max_attempts")
_POLICIES = ", ".join(f"'{p}'" for p in retry_mod.POLICIES)
_FUNC_RE = "^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*[:.][A-Za-z_][A-Za-z0-9_]*$"

# When the job runs: unix seconds.
AT = "coalesce((j->>'run_at')::float8, now_ + (j->>'delay')::float8, now_)"
# 'module.function' spelled 'module:function', as the daemon stores it.
FUNC = "CASE WHEN position(':' in j->>'func') = 0 THEN regexp_replace(j->>'func', '[.]([^.]*)$', ':\\1')" \
       " ELSE j->>'func' END"
POOL = f"coalesce(j->>'pool', '{DEFAULT_POOL}')"
_R = "(j->'retry')"
_RETRIES = f"jsonb_typeof({_R}) = 'object' OR {_R} = 'true'"  # retry false or null: none
_POLICY = f"coalesce({_R}->>'policy', '{retry_mod.DEFAULT_POLICY}')"
_DEFAULT_INTERVAL = " ".join(f"WHEN '{p}' THEN {v}" for p, v in retry_mod.DEFAULT_INTERVAL.items())
# The retry column: the policy with every default filled in, as the daemon's insert stores it.
RETRY = (f"CASE WHEN {_RETRIES} THEN jsonb_build_object('policy', {_POLICY},"
         f" 'interval', coalesce(({_R}->>'interval')::float8, CASE {_POLICY} {_DEFAULT_INTERVAL} END),"
         f" 'max_interval', coalesce(({_R}->>'max_interval')::float8, {retry_mod.DEFAULT_MAX_INTERVAL}),"
         f" 'max_attempts', coalesce(({_R}->>'max_attempts')::numeric::int, {retry_mod.DEFAULT_MAX_ATTEMPTS}))::text"
         " END")
MAX_ATTEMPTS = (f"CASE WHEN {_RETRIES} THEN coalesce(({_R}->>'max_attempts')::numeric::int,"
                f" {retry_mod.DEFAULT_MAX_ATTEMPTS}) ELSE 1 END")
_RL = "(j->'rate_limit')"
# The rate_limit column: {"key", "limit", "per"} as JSON text (core/policy/rates.py).
RATE_LIMIT = (f"CASE WHEN jsonb_typeof({_RL}) = 'object' THEN jsonb_build_object('key', {_RL}->>'key',"
              f" 'limit', ({_RL}->>'limit')::int, 'per', ({_RL}->>'per')::float8)::text END")
# Every column of the daemon's insert (store/rows.py), in this order.
COLUMNS = ("state, func, args, kwargs, priority, run_at, created_at, max_attempts, retry, retry_on_network, key,"
           " idempotency_key, pool, concurrency_group, concurrency_limit, cost_units, isolation, timeout,"
           " memory_mb, output_kb, rate_limit, stalled_after, on_stall, fair_by")
VALUES = (f"CASE WHEN at <= now_ THEN '{State.QUEUED}' ELSE '{State.SCHEDULED}' END, {FUNC},"
          " CASE WHEN coalesce(j->'args', '[]') IN ('[]', 'null') THEN NULL ELSE (j->'args')::text END,"
          " CASE WHEN coalesce(j->'kwargs', '{}') IN ('{}', 'null') THEN NULL ELSE (j->'kwargs')::text END,"
          f" coalesce((j->>'priority')::numeric::int, 0), at, now_, {MAX_ATTEMPTS}, {RETRY},"
          f" coalesce((j->>'retry_on_network')::boolean, false), j->>'key', j->>'idempotency_key', {POOL},"
          " j->>'concurrency_group', (j->>'concurrency_limit')::numeric::int, (j->>'cost_units')::float8,"
          " j->>'isolation', (j->>'timeout')::float8, (j->>'memory_mb')::numeric::int,"
          " (j->>'output_kb')::numeric::int,"
          f" {RATE_LIMIT}, (j->>'stalled_after')::float8, j->>'on_stall', j->>'fair_by'")


def _basic() -> list[tuple[str, str]]:
    """(condition, message) in the order they are tried, for what every job has: its shape,
    func, args and kwargs."""
    return [
        ("jsonb_typeof(j) IS DISTINCT FROM 'object'", "'a job must be a JSON object'"),
        (f"jsonb_typeof(j->'func') IS DISTINCT FROM 'string' OR j->>'func' !~ '{_FUNC_RE}'",
         "'func must be ''module:function'' (or ''module.function'')'"),
        (f"j - {_FIELDS} <> '{{}}'",
         f"'unknown job field(s): ' || (SELECT string_agg(x, ', ' ORDER BY x) FROM jsonb_object_keys(j - {_FIELDS}) x)"),
        ("jsonb_typeof(j->'args') NOT IN ('array', 'null')", "'args must be a JSON array'"),
        ("jsonb_typeof(j->'kwargs') NOT IN ('object', 'null')", "'kwargs must be a JSON object'"),
    ]


# Whether the job gives an option that _options() checks (the common job gives none).
HAS_OPTIONS = "j ?| ARRAY[" + ", ".join(f"'{k}'" for k in sorted(set(OPTIONS) - {"kwargs"})) + "]"


def _options() -> list[tuple[str, str]]:
    """(condition, message) in the order they are tried, for the options; an absent field
    reads as NULL, so a condition on it is never true."""
    out = []
    for name in _TEXT:
        out.append((f"jsonb_typeof(j->'{name}') <> 'null' AND (jsonb_typeof(j->'{name}') <> 'string'"
                    f" OR j->>'{name}' = '' OR length(j->>'{name}') > {MAX_KEY_LEN})",
                    f"'{name} must be a non-empty string of at most {MAX_KEY_LEN} characters'"))
    for name in _INTS:
        out.append((f"jsonb_typeof(j->'{name}') NOT IN ('number', 'null') OR j->>'{name}' !~ '^-?[0-9]+$'"
                    f" OR abs((j->>'{name}')::numeric) > {MAX_INT}", f"'{name} must be an integer'"))
    for name in (*_NUMBERS, "delay", "run_at"):
        out.append((f"jsonb_typeof(j->'{name}') NOT IN ('number', 'null')", f"'{name} must be a number'"))
    for name in ("retry_on_network", "manual"):
        out.append((f"jsonb_typeof(j->'{name}') NOT IN ('boolean', 'null')", f"'{name} must be true or false'"))
    iso = ", ".join(f"'{i}'" for i in sandbox.ISOLATIONS)
    out += [
        (f"j->>'isolation' NOT IN ({iso})", f"'isolation must be one of {iso.replace(chr(39), '')}'"),
        (f"(j->>'timeout')::float8 <= 0 OR (j->>'timeout')::float8 > {sandbox.MAX_TIMEOUT}",
         f"'timeout must be seconds above 0 and at most {sandbox.MAX_TIMEOUT:.0f} (a day)'"),
        (f"(j->>'memory_mb')::numeric NOT BETWEEN {sandbox.MIN_MEMORY_MB} AND {sandbox.MAX_MEMORY_MB}",
         f"'memory_mb must be an integer from {sandbox.MIN_MEMORY_MB} to {sandbox.MAX_MEMORY_MB}'"),
        (f"(j->>'output_kb')::numeric NOT BETWEEN 1 AND {sandbox.MAX_OUTPUT_KB}",
         f"'output_kb must be an integer from 1 to {sandbox.MAX_OUTPUT_KB}'"),
        (f"NOT (j->>'stalled_after')::float8 BETWEEN {liveness.MIN_STALLED_AFTER:g}"
         f" AND {liveness.MAX_STALLED_AFTER:.0f}", f"'{liveness.STALLED_AFTER_MESSAGE}'"),
        (f"j->>'on_stall' NOT IN ({', '.join(repr(v) for v in liveness.ON_STALL)})", f"'{liveness.ON_STALL_MESSAGE}'"),
        (f"j->>'isolation' = '{sandbox.THREAD}' AND ("
         + " OR ".join(f"j->>'{k}' IS NOT NULL" for k in sandbox.PROCESS_LIMITS) + ")",
         "'a job with memory_mb or output_kb runs in a process'"),
        ("(j->>'concurrency_limit')::numeric < 1", "'concurrency_limit must be at least 1'"),
        (f"(j->>'cost_units')::float8 <= 0 OR (j->>'cost_units')::float8 > {MAX_COST_UNITS:.0f}",
         "'cost_units must be above 0'"),
        ("jsonb_typeof(j->'fair_by') <> 'null' AND (jsonb_typeof(j->'fair_by') <> 'string'"
         f" OR j->>'fair_by' = '' OR octet_length(j->>'fair_by') > {MAX_KEY_LEN})",
         f"'fair_by must be a non-empty string of at most {MAX_KEY_LEN} bytes'"),
        # rate_limit as protocol.rate_limit checks it, each part in turn.
        (f"jsonb_typeof({_RL}) NOT IN ('object', 'null')", _RL_SHAPE),
        (f"jsonb_typeof({_RL}) = 'object' AND (SELECT array_agg(x ORDER BY x) FROM jsonb_object_keys({_RL}) x)"
         " <> ARRAY['key', 'limit', 'per']", _RL_SHAPE),
        (f"jsonb_typeof({_RL}) = 'object' AND (jsonb_typeof({_RL}->'key') <> 'string' OR {_RL}->>'key' = ''"
         f" OR octet_length({_RL}->>'key') > {MAX_KEY_LEN})",
         f"'rate_limit.key must be a non-empty string of at most {MAX_KEY_LEN} bytes'"),
        (f"jsonb_typeof({_RL}) = 'object' AND (jsonb_typeof({_RL}->'limit') <> 'number'"
         f" OR {_RL}->>'limit' !~ '^[0-9]+$' OR ({_RL}->>'limit')::numeric NOT BETWEEN 1 AND {rates.MAX_LIMIT})",
         f"'rate_limit.limit must be an integer from 1 to {rates.MAX_LIMIT}'"),
        (f"jsonb_typeof({_RL}) = 'object' AND (jsonb_typeof({_RL}->'per') <> 'number'"
         f" OR ({_RL}->>'per')::numeric NOT BETWEEN {rates.MIN_PER} AND {rates.MAX_PER:.0f})",
         f"'rate_limit.per must be a number from {rates.MIN_PER} to {rates.MAX_PER:.0f}'"),
        ("(j->>'delay')::float8 < 0", "'delay must not be negative'"),
        ("jsonb_typeof(j->'run_at') = 'number' AND jsonb_typeof(j->'delay') = 'number'",
         "'give run_at or delay, not both'"),
        ("(j->>'run_at')::float8 < 0", "'run_at must be unix seconds: a finite number, 0 or later'"),
        (f"{AT} > {LATEST:.0f}", "'the job would run after the year 9999: run_at is unix seconds, not milliseconds'"),
        (f"jsonb_typeof({_R}) NOT IN ('object', 'boolean', 'null')", "'retry must be an object, true or false'"),
        (f"jsonb_typeof({_R}) = 'object' AND {_R} - ARRAY[{', '.join(repr(f) for f in _RETRY_FIELDS)}] <> '{{}}'",
         "'unknown retry field(s)'"),
        (f"jsonb_typeof({_R}->'policy') NOT IN ('string', 'null')"
         + "".join(f" OR jsonb_typeof({_R}->'{f}') NOT IN ('number', 'null')" for f in _RETRY_FIELDS[1:]),
         "'retry interval, max_interval and max_attempts must be numbers'"),
        (f"{_R}->>'max_attempts' !~ '^-?[0-9]+$'", "'retry.max_attempts must be an integer'"),
        (f"({_RETRIES}) AND {_POLICY} NOT IN ({_POLICIES})",
         f"'retry policy must be one of {_POLICIES.replace(chr(39), '')}'"),
        (f"({_R}->>'interval')::float8 <= 0 OR ({_R}->>'max_interval')::float8 <= 0",
         "'retry interval and max_interval must be positive'"),
        (f"({_R}->>'max_attempts')::numeric < 1", "'retry max_attempts must be at least 1'"),
    ]
    return out


def _case(checks: list[tuple[str, str]]) -> str:
    return "CASE" + "".join(f"\n                WHEN {c} THEN {m}" for c, m in checks) + " END"


# Two expressions, because a statement pays for building its expressions each time it runs
# (the whole CASE of every option): every batch is checked by BASIC_FAILS, and
# only one with options (HAS_OPTIONS), or with a failure to name, by FIRST_FAILURE.
BASIC_FAILS = _case([(c, "true") for c, _ in _basic()])
FIRST_FAILURE = _case([*_basic(), (f"NOT {HAS_OPTIONS}", "NULL"), *_options()])
