"""Rows of the SQL stores (SQLite, PostgreSQL) to and from queickd's objects: one column
order and one encoding (JSON text for args, kwargs, retry, result, error) for both."""

from __future__ import annotations

import json
from typing import Any

from ..core import retry as retry_mod
from ..core.job import Job, NewJob
from .base import CronRecord, Pause

JOB_COLS = (
    "id, func, args, kwargs, state, priority, run_at, created_at, attempts, max_attempts, retry,"
    " retry_on_network, key, idempotency_key, cron, orphaned, started_at, finished_at, result, error, pool"
)
EVENT_COLS = "event_id, state, func, key, created_at, attempts, next_attempt_at, job_id, last_error"


def dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def row_to_job(r: tuple) -> Job:
    """A row of JOB_COLS as a Job."""
    return Job(
        id=r[0], func=r[1], args=json.loads(r[2]) if r[2] else [],
        kwargs=json.loads(r[3]) if r[3] else {}, state=r[4], priority=r[5], run_at=r[6],
        created_at=r[7], attempts=r[8], max_attempts=r[9],
        retry=retry_mod.spec_from_dict(json.loads(r[10])) if r[10] else None,
        retry_on_network=bool(r[11]), key=r[12], idempotency_key=r[13], cron=r[14],
        orphaned=r[15], started_at=r[16], finished_at=r[17],
        result=json.loads(r[18]) if r[18] is not None else None,
        error=json.loads(r[19]) if r[19] else None, pool=r[20],
    )


def template_to_json(t: NewJob) -> str:
    """A cron's job template as stored."""
    return dumps({
        "func": t.func, "args": t.args, "kwargs": t.kwargs, "priority": t.priority,
        "retry": t.retry.to_dict() if t.retry else None, "retry_on_network": t.retry_on_network,
        "key": t.key, "pool": t.pool,
    })


def template_from_json(s: str) -> NewJob:
    d = json.loads(s)
    d["retry"] = retry_mod.spec_from_dict(d.get("retry"))
    return NewJob(**d)


def row_to_cron(r: tuple) -> CronRecord:
    """A row of (name, schedule, template, next_run_at, last_fired_at, created_at, folded)."""
    return CronRecord(name=r[0], schedule=json.loads(r[1]), template=template_from_json(r[2]),
                      next_run_at=r[3], last_fired_at=r[4], created_at=r[5], folded=r[6])


def row_to_pause(r: tuple) -> Pause:
    """A row of (kind, name, since, failures, last_error)."""
    return Pause(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None)
