"""The SQL function enqueue() held to the pure admission policy (core/policy/admission.py):
the same requests on the same database, decided by the policy (with the daemon's lookups)
and by the function, are refused with the same codes and admit the same jobs, duplicates
answered with the same ids. A rule changed in one place and not the other fails here."""

from __future__ import annotations

import json
import time

import pytest

from queickd.core.job import State
from queickd.core.policy import admission as adm
from queickd.core.protocol import QueueError, parse_job
from queickd.store.postgres.enqueue_sql import ERRORS

psycopg = pytest.importorskip("psycopg")
qpg = pytest.importorskip("queickd.pg")

LIMITS = adm.Admission(max_queued=8, max_queued_per_key=2, idempotency_ttl=100.0)
TIGHT = adm.Admission(max_queued=5, max_queued_per_key=2, idempotency_ttl=100.0)  # room for one more

REQUESTS = [
    [{}],
    [{"key": "full"}],
    [{"key": "one"}],
    [{"key": "busy"}],
    [{"key": "new"}],
    [{"key": "full", "delay": 600}],
    [{"key": "busy", "manual": True}],
    [{"key": "done", "manual": True}],
    [{"key": "one", "manual": True}],
    [{"key": "full", "manual": True}],
    [{"idempotency_key": "live"}],
    [{"idempotency_key": "old"}],
    [{"idempotency_key": "fresh"}],
    [{"idempotency_key": "live", "key": "full"}],
    [{"key": "one"}, {"key": "one"}],
    [{"key": "new"}, {"key": "new"}, {"key": "new"}],
    [{"idempotency_key": "z"}, {}, {"idempotency_key": "z"}],
    [{"key": "new", "manual": True}, {"key": "new"}],
    [{}, {}],
    # Batches that mix jobs the policy would admit with one it refuses: refused whole.
    [{"key": "new"}, {"key": "full"}],
    [{}, {"key": "new"}, {"key": "busy", "manual": True}],
    [{"key": "new"}, {"key": "new", "manual": True}],
    [{"key": "full"}, {"key": "busy", "manual": True}],  # the conflict comes first, as in the policy
    [{"key": "one"}, {"key": "full"}, {"key": "one"}],
    [{"idempotency_key": "live", "key": "full"}, {"key": "one"}],
    [{"idempotency_key": "old"}, {"idempotency_key": "old"}, {"key": "full"}],
    [{"idempotency_key": "old"}, {"idempotency_key": "old"}],
    [{"idempotency_key": "live"}, {"idempotency_key": "live"}, {"idempotency_key": "n1"}],
    [{"idempotency_key": "z", "key": "one"}, {"idempotency_key": "z", "key": "one"}, {"key": "one"}],
    [{}] * 6,
]


def _existing(c, now: float) -> None:
    rows = [("queued", "full", None, now), ("queued", "full", None, now), ("scheduled", "one", None, now),
            ("running", "busy", None, now), ("succeeded", "done", None, now),
            ("queued", None, "live", now - 10), ("succeeded", None, "old", now - 1000)]
    for state, key, ik, created in rows:
        c.execute("INSERT INTO jobs (state, func, run_at, created_at, key, idempotency_key)"
                  " VALUES (%s, 'm:f', %s, %s, %s, %s)", (state, created, created, key, ik))
    c.execute("ANALYZE jobs")


def _by_policy(store, c, specs: list[dict], limits: adm.Admission, now: float) -> tuple:
    jobs = [parse_job({"func": "m:f", **s}, now) for s in specs]
    p = adm.plan([jobs], now, limits, store._submitter._lookups(lambda: c, now, limits, [jobs]))
    answer = p.answers[0]
    if isinstance(answer, adm.Refusal):
        return ("refused", answer.code)
    repeats = {i: key for _, i, key in p.repeats}
    first = {j.idempotency_key: i for _, i, j in p.inserts if j.idempotency_key}
    return tuple(("same as", first[repeats[i]]) if i in repeats
                 else ("duplicate of", a.job_id) if a is not None else "new" for i, a in enumerate(answer))


def _by_function(c, schema: str, specs: list[dict], existing: set[int], path: str) -> tuple:
    """The request decided by the SQL function: a batch by enqueue_many (what queickd.pg
    calls), one job by enqueue() as psql or a trigger calls it, or by queickd.pg's enqueue
    (a plain job's own statement, the function for any other). Undone after, as refused."""
    try:
        with c.transaction():
            if path == "enqueue":
                ids = [c.execute(f"SELECT {schema}.enqueue('m:f', '[]', %s::jsonb)",
                                 (json.dumps(specs[0]),)).fetchone()[0]]
            elif path == "pg.enqueue":
                ids = [qpg.enqueue(c, "m:f", schema=schema, **specs[0])]
            else:
                ids = qpg.enqueue_many(c, [{"func": "m:f", **s} for s in specs], schema=schema)
            raise _UndoneError(ids)
    except QueueError as e:
        return ("refused", e.code)
    except psycopg.Error as e:  # from SQL, the code is the SQLSTATE's
        return ("refused", ERRORS.get(e.sqlstate, e.sqlstate))
    except _UndoneError as undone:
        ids = undone.ids
    return tuple(("duplicate of", job_id) if job_id in existing
                 else ("same as", ids.index(job_id)) if ids.index(job_id) < i else "new"
                 for i, job_id in enumerate(ids))


class _UndoneError(Exception):
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


@pytest.mark.parametrize("path", ["enqueue_many", "enqueue", "pg.enqueue"])
@pytest.mark.parametrize("limits", [LIMITS, TIGHT], ids=["room", "tight"])
def test_the_sql_functions_admit_and_refuse_as_the_policy_does(pg_database, pg_store, limits, path):
    now = time.time()
    c = pg_store.connect()
    _existing(c, now)
    pg_store.publish_admission(limits)
    existing = {i for (i,) in c.execute("SELECT id FROM jobs")}
    requests = [r for r in REQUESTS if path == "enqueue_many" or len(r) == 1]
    app = psycopg.connect(pg_database)
    try:
        decided = [(specs, _by_policy(pg_store, c, specs, limits, now), _by_function(app, pg_store.schema, specs,
                                                                                 existing, path))
                   for specs in requests]
    finally:
        app.close()
        c.close()
    assert [(s, p) for s, p, f in decided if p != f] == [], [(s, p, f) for s, p, f in decided if p != f]
    # Every outcome is met: new jobs, duplicates, repeats in one request, and each refusal.
    outcomes = {x if isinstance(x, str) else x[0] for _, p, _ in decided for x in (p if p[0] != "refused" else [p])}
    assert {"new", "duplicate of", "refused"} | ({"same as"} if path == "enqueue_many" else set()) <= outcomes
    assert {p[1] for _, p, _ in decided if p[0] == "refused"} >= {"queue_full", "conflict"}
    if path == "enqueue_many":  # a batch refused for one job, of others the policy would admit
        assert any(p[0] == "refused" and len(s) > 1 and _by_policy_alone(s, limits) for s, p, _ in decided)
    assert pg_store.counts()[State.QUEUED] == 3  # the function's jobs were all undone


# Caps around the 4 waiting jobs of _existing: none, far above them (the count not read),
# room for exactly one more, and full.
PLAIN_CAPS = [None, 1000, 5, 4, 3]


@pytest.mark.parametrize("cap", PLAIN_CAPS)
def test_a_plain_jobs_statement_admits_and_refuses_as_the_policy_does(pg_database, pg_store, cap):
    """The one rule of a plain job (func, args, kwargs alone), the overall cap, held to the
    policy on its own statement (None: refused, nothing inserted), by queickd.pg's enqueue,
    whose refusal the function then raises, and by SQL's enqueue()."""
    now = time.time()
    c = pg_store.connect()
    _existing(c, now)
    limits = adm.Admission(max_queued=cap, max_queued_per_key=2, idempotency_ttl=100.0)
    pg_store.publish_admission(limits)
    existing = {i for (i,) in c.execute("SELECT id FROM jobs")}
    app = psycopg.connect(pg_database)
    try:
        policy = _by_policy(pg_store, c, [{"kwargs": {"a": 2}}], limits, now)
        plain = qpg._enqueue_plain(app, "m:f", [1], {"a": 2}, pg_store.schema)
        inserted = app.execute(f"SELECT count(*) FROM {pg_store.schema}.jobs").fetchone()[0] - len(existing)
        app.rollback()
        by_plain = ("new",) if plain is not None else ("refused", "queue_full")
        decided = {path: _by_function(app, pg_store.schema, [{"kwargs": {"a": 2}}], existing, path)
                   for path in ("pg.enqueue", "enqueue", "enqueue_many")}
    finally:
        app.close()
        c.close()
    assert (by_plain, inserted) == (policy, 1 if plain is not None else 0)
    assert decided == dict.fromkeys(decided, policy)
    assert policy == (("refused", "queue_full") if cap is not None and cap <= 4 else ("new",))


def _by_policy_alone(specs: list[dict], limits: adm.Admission) -> bool:
    """Whether the policy admits the request's first job on its own, on an empty queue."""
    none = adm.Lookups(lambda k: None, lambda k: 0, lambda: 0, lambda k: None)
    return not isinstance(adm.plan([[parse_job({"func": "m:f", **specs[0]}, 0.0)]], 0.0, limits, none).answers[0],
                          adm.Refusal)


def test_a_refused_batch_inserts_none_of_its_jobs(pg_database, pg_store):
    c = pg_store.connect()
    pg_store.publish_admission(adm.Admission(max_queued_per_key=1))
    app = psycopg.connect(pg_database, autocommit=True)
    try:
        with pytest.raises(QueueError) as refused:
            qpg.enqueue_many(app, [{"func": "m:f"}, {"func": "m:f", "key": "k"}, {"func": "m:f", "key": "k"}],
                             schema=pg_store.schema)
        assert refused.value.code == "queue_full"
        assert c.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    finally:
        app.close()
        c.close()


# The checks of a job's fields: what the wire protocol refuses, the function refuses; what
# it accepts, the function stores as the daemon's insert would.
VALID = [{}, {"args": [1, "a", None, 2.5, {"x": [True]}]}, {"kwargs": {"b": [1], "a": "z"}},
         {"args": ["é", 10**20], "kwargs": {"k": {"n": -0.5}}}, {"func": "pkg.mod.fn", "args": []}, {"priority": -3},
         {"delay": 60}, {"run_at": 1.0}, {"retry": True}, {"retry": {"policy": "constant", "max_attempts": 3}},
         {"retry": {"interval": 2, "max_interval": 10}}, {"retry": False}, {"retry_on_network": True},
         {"key": "k"}, {"idempotency_key": "i"}, {"pool": "gpu"}, {"manual": True, "key": "m"},
         {"concurrency_group": "g", "concurrency_limit": 2, "cost_units": 1.5},
         {"isolation": "process", "timeout": 30, "memory_mb": 64, "output_kb": 10},
         {"isolation": "thread", "timeout": 5}, {"func": "pkg.mod.fn"}]
INVALID = [{"colour": 1}, {"args": {"a": 1}}, {"kwargs": [1]}, {"priority": 1.5}, {"priority": 2.0}, {"priority": "1"},
           {"retry": {"max_attempts": 2.0}},
           {"delay": -1}, {"delay": 1, "run_at": 2}, {"run_at": -1}, {"run_at": 1e13}, {"retry": "yes"},
           {"retry": {"policy": "x"}}, {"retry": {"interval": 0}}, {"retry": {"max_attempts": 0}},
           {"retry": {"speed": 1}}, {"retry": {"interval": "1"}}, {"retry_on_network": 1}, {"key": ""},
           {"key": "x" * 201}, {"idempotency_key": 5}, {"pool": ""}, {"concurrency_limit": 0},
           {"cost_units": 0}, {"isolation": "vm"}, {"timeout": 0}, {"timeout": 90000}, {"memory_mb": 8},
           {"output_kb": 0}, {"isolation": "thread", "memory_mb": 64}, {"func": "nocolon"}, {"func": "a:b:c"},
           {"manual": "yes"}]


def _call(c, spec: dict):
    spec = {"func": "m:f", **spec}
    options = {k: v for k, v in spec.items() if k not in ("func", "args")}
    return c.execute("SELECT enqueue(%s, %s::jsonb, %s::jsonb)",
                     (spec["func"], json.dumps(spec.get("args", [])), json.dumps(options))).fetchone()[0]


@pytest.mark.parametrize("spec", INVALID, ids=lambda s: json.dumps(s)[:40])
def test_the_sql_function_refuses_what_the_wire_protocol_refuses(pg_store, spec):
    with pytest.raises(QueueError) as wire:
        parse_job({"func": "m:f", **spec}, time.time())
    c = pg_store.connect()
    try:
        with pytest.raises(psycopg.Error) as sql:
            _call(c, spec)
    finally:
        c.close()
    assert (wire.value.code, sql.value.sqlstate) == ("bad_request", "QD400"), str(sql.value)


@pytest.mark.parametrize("spec", INVALID, ids=lambda s: json.dumps(s)[:40])
def test_a_batch_with_a_bad_job_is_refused_whole_naming_the_job(pg_store, spec):
    c = pg_store.connect()
    try:
        with pytest.raises(psycopg.Error) as sql:
            c.execute("SELECT enqueue_many(%s::jsonb)", (json.dumps([{"func": "m:f"}, {"func": "m:f", **spec}]),))
        c.rollback()
        left = c.execute("SELECT count(*) FROM jobs").fetchone()[0]
    finally:
        c.close()
    assert (sql.value.sqlstate, sql.value.diag.message_primary.startswith("bad_request: jobs[1]: "), left) == (
        "QD400", True, 0), str(sql.value)


def _by_pg(c, spec: dict):
    spec = {"func": "m:f", **spec}
    return qpg.enqueue(c, spec.pop("func"), spec.pop("args", None), schema=c.execute("SELECT current_schema()")
                       .fetchone()[0], **spec)


@pytest.mark.parametrize("via", [_call, _by_pg], ids=["sql", "pg.enqueue"])
def test_the_sql_function_stores_a_job_as_the_daemons_insert_does(pg_store, via):
    """And so does queickd.pg's enqueue, whose plain jobs take a statement of their own."""
    from queickd.core import retry as retry_mod
    from queickd.store import rows as dbrows

    c = pg_store.connect()
    cols = dbrows.INSERT_COLS
    try:
        for spec in VALID:
            now = time.time()
            job_id = via(c, spec)
            assert c.execute("SELECT origin FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == "direct"
            stored = dict(zip(cols, c.execute(f"SELECT {', '.join(cols)} FROM jobs WHERE id = %s",
                                              (job_id,)).fetchone(), strict=True))
            j = parse_job({"func": "m:f", **spec}, now)
            expected = dict(zip(cols, dbrows.insert_values(job_id, State.QUEUED if j.run_at <= now else State.SCHEDULED,
                                                           now, j), strict=True))
            for name in ("args", "kwargs"):
                stored[name], expected[name] = (json.loads(x) if x else None for x in (stored[name], expected[name]))
            stored["retry"], expected["retry"] = (retry_mod.spec_from_dict(json.loads(x)) if x else None
                                                  for x in (stored["retry"], expected["retry"]))
            assert abs((stored.pop("run_at") - stored.pop("created_at"))
                       - (expected.pop("run_at") - expected.pop("created_at"))) < 5 or "run_at" in spec, spec
            assert stored == expected, spec
    finally:
        c.close()
