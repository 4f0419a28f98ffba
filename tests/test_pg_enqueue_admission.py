"""The SQL function enqueue() held to the pure admission policy (core/policy/admission.py):
the same requests on the same database, decided by the policy (with the daemon's lookups)
and by the function, are refused with the same codes and admit the same jobs, duplicates
answered with the same ids. A rule changed in one place and not the other fails here."""

from __future__ import annotations

import time

import pytest

from queickd.core.job import State
from queickd.core.policy import admission as adm
from queickd.core.protocol import QueueError, parse_job

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
    p = adm.plan([jobs], now, limits, store._lookups(lambda: c, now, limits.max_queued, len(jobs)))
    answer = p.answers[0]
    if isinstance(answer, adm.Refusal):
        return ("refused", answer.code)
    repeats = {i: key for _, i, key in p.repeats}
    first = {j.idempotency_key: i for _, i, j in p.inserts if j.idempotency_key}
    return tuple(("same as", first[repeats[i]]) if i in repeats
                 else ("duplicate of", a.job_id) if a is not None else "new" for i, a in enumerate(answer))


def _by_function(c, schema: str, specs: list[dict], existing: set[int]) -> tuple:
    try:
        with c.transaction():
            ids = qpg.enqueue_many(c, [{"func": "m:f", **s} for s in specs], schema=schema)
            raise _UndoneError(ids)
    except QueueError as e:
        return ("refused", e.code)
    except _UndoneError as undone:
        ids = undone.ids
    return tuple(("duplicate of", job_id) if job_id in existing
                 else ("same as", ids.index(job_id)) if ids.index(job_id) < i else "new"
                 for i, job_id in enumerate(ids))


class _UndoneError(Exception):
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


@pytest.mark.parametrize("limits", [LIMITS, TIGHT], ids=["room", "tight"])
def test_the_sql_function_admits_and_refuses_as_the_policy_does(pg_database, pg_store, limits):
    now = time.time()
    c = pg_store.connect()
    _existing(c, now)
    pg_store.publish_admission(limits)
    existing = {i for (i,) in c.execute("SELECT id FROM jobs")}
    app = psycopg.connect(pg_database)
    try:
        decided = [(specs, _by_policy(pg_store, c, specs, limits, now), _by_function(app, pg_store.schema, specs,
                                                                                 existing))
                   for specs in REQUESTS]
    finally:
        app.close()
        c.close()
    assert [(s, p) for s, p, f in decided if p != f] == [], [(s, p, f) for s, p, f in decided if p != f]
    # Every outcome is met: new jobs, duplicates, repeats in one request, and each refusal.
    outcomes = {x if isinstance(x, str) else x[0] for _, p, _ in decided for x in (p if p[0] != "refused" else [p])}
    assert {"new", "duplicate of", "refused"} | ({"same as"} if limits is LIMITS else set()) <= outcomes
    assert {p[1] for _, p, _ in decided if p[0] == "refused"} >= {"queue_full", "conflict"}
    assert pg_store.counts()[State.QUEUED] == 3  # the function's jobs were all undone
