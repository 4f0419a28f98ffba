"""`queick enqueue/jobs/show/cancel/retry/dead/purge/resume/pool set`: one function per
command, each given the parsed options and a connected client. Never opens a store."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..client import JobQueue
from ..core.job import State
from .show import print_job, print_jobs, print_pauses


def enqueue(a: argparse.Namespace, q: JobQueue) -> int:
    options: dict[str, Any] = {"kwargs": a.kwargs, "delay": a.delay, "run_at": a.run_at,
                               "key": a.key, "idempotency_key": a.idempotency_key,
                               "manual": a.manual, "pool": a.pool, "isolation": a.isolation,
                               "timeout": a.timeout, "memory_mb": a.memory_mb, "output_kb": a.output_kb}
    if a.retry:
        options.update(retry=True, retry_type=a.retry, max_attempts=a.max_attempts)
    job_id = q.enqueue(a.func, a.args, **options)
    if a.wait is None:
        print(json.dumps({"job_id": job_id}) if a.json else job_id)
        return 0
    job = q.wait(job_id, a.wait)
    print(json.dumps(job)) if a.json else print_job(job)
    return 0 if job["state"] == State.SUCCEEDED else 1


def jobs(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.jobs(a.state, a.limit)
    if a.json:
        print(json.dumps(out))
    else:
        print_pauses(q.stats()["paused"])
        print_jobs(out)
    return 0


def show(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.get(a.job_id)
    print(json.dumps(out)) if a.json else print_job(out)
    return 0


def cancel(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.cancel(a.job_id)
    print(json.dumps(out)) if a.json else print_job(out)
    return 0


def retry(a: argparse.Namespace, q: JobQueue) -> int:
    if a.all:
        n = q.retry_all()
        print(json.dumps({"retried": n}) if a.json else f"{n} dead letter(s) sent back")
    elif a.event:
        out = q.retry_event(a.event)
        print(json.dumps(out) if a.json else f"event {a.event} is {out['state']} again")
    else:
        out = q.retry(a.job_id)
        print(json.dumps(out)) if a.json else print_job(out)
    return 0


def dead(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.dead(a.limit)
    if a.json:
        print(json.dumps(out))
    else:
        print_jobs(out["jobs"])
        for e in out["events"]:
            print(f"event {e['event_id']}  {e['func']}  tries {e['attempts']}  [{e['last_error']}]")
    return 0


def purge(a: argparse.Namespace, q: JobQueue) -> int:
    n = q.purge(a.older_than, a.state)
    print(json.dumps({"purged": n}) if a.json else f"{n} {a.state} job(s) purged")
    return 0


def resume(a: argparse.Namespace, q: JobQueue) -> int:
    if (a.key is None) == (a.func is None):
        print("queick resume: give a KEY or --func", file=sys.stderr)
        return 2
    q.resume(a.key, func=a.func)
    print(json.dumps({"resumed": a.key or a.func}) if a.json else f"resumed {a.key or a.func}")
    return 0


def pool_set(a: argparse.Namespace, q: JobQueue) -> int:
    if (a.key is None) == (a.job is None and a.cron is None):
        print("queick: give a KEY, or --job ID, or --cron NAME, and the POOL", file=sys.stderr)
        return 2
    n = q.set_pool(a.pool, key=a.key, job_id=a.job, cron=a.cron)
    print(json.dumps({"moved": n}) if a.json else f"{n} moved to pool {a.pool}")
    return 0
