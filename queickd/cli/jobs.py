"""`queick enqueue/jobs/show/cancel/retry/dead/purge/resume/pause/pool set`: one function per
command, each given the parsed options and a connected client. Never opens a store."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..client import JobQueue
from ..core.job import State
from ..ui.text import ERROR_SHOWN, one_line
from .show import print_job, print_jobs, print_pauses


def _number(text: str) -> int | float | str:
    """A number as the daemon checks it (left as text when it is not one: refused there, by name)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def enqueue(a: argparse.Namespace, q: JobQueue) -> int:
    options: dict[str, Any] = {k: getattr(a, k) for k in (
        "kwargs", "delay", "run_at", "key", "idempotency_key", "manual", "pool", "priority", "concurrency_group",
        "concurrency_limit", "cost_units", "fair_by", "isolation", "timeout", "memory_mb", "output_kb",
        "stalled_after", "on_stall")}
    if a.retry:
        options.update(retry=True, retry_type=a.retry, max_attempts=a.max_attempts)
    if a.rate_limit is not None:
        key, limit, per = a.rate_limit
        options["rate_limit"] = {"key": key, "limit": _number(limit), "per": _number(per)}
    job_id = q.enqueue(a.func, a.args, **options)
    if a.wait is None:
        print(json.dumps({"job_id": job_id}) if a.json else job_id)
        return 0
    job = q.wait(job_id, a.wait)
    ok = job["state"] == State.SUCCEEDED
    if a.json:
        print(json.dumps(job))
    elif ok:  # the result alone, as JSON on one line: what a script reads
        print(json.dumps(job["result"], ensure_ascii=False))
    else:
        err = job.get("error") or {}
        why = f": {err.get('type')}: {one_line(err.get('message'), ERROR_SHOWN)}" if err else ""
        print(f"queick: job {job_id} is {job['state']}{why} ('queick show {job_id}' for the whole job)",
              file=sys.stderr)
    return 0 if ok else 1


def jobs(a: argparse.Namespace, q: JobQueue) -> int:
    out = q.jobs(a.state, a.limit, func=a.func, key=a.key, pool=a.pool)
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
    if (a.job_id is None) == (a.state is None):
        print("queick cancel: give a job ID, or --state (with --func, --key, --pool)", file=sys.stderr)
        return 2
    if a.job_id is not None:
        if a.func or a.key or a.pool or a.yes:
            print("queick cancel: --func, --key, --pool and --yes go with --state", file=sys.stderr)
            return 2
        out = q.cancel(a.job_id)
        print(json.dumps(out)) if a.json else print_job(out)
        return 0
    filters = {"func": a.func, "key": a.key, "pool": a.pool}
    n = q.cancel_waiting(a.state, **filters, dry_run=not a.yes)
    which = " ".join([a.state, *(f"{k} {v}" for k, v in filters.items() if v is not None)])
    if a.json:
        print(json.dumps({"cancelled": n} if a.yes else {"matching": n, "cancelled": 0}))
    elif a.yes:
        print(f"{n} job(s) cancelled ({which})")
    else:
        print(f"{n} job(s) would be cancelled ({which}); run again with --yes to cancel them")
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
            print(f"event {e['event_id']}  {e['func']}  tries {e['attempts']}  "
                  f"[{one_line(e['last_error'], ERROR_SHOWN)}]")
    return 0


def purge(a: argparse.Namespace, q: JobQueue) -> int:
    n = q.purge(a.older_than, a.state)
    print(json.dumps({"purged": n}) if a.json else f"{n} {a.state} job(s) purged")
    return 0


def _target(a: argparse.Namespace, command: str) -> str:
    """The one KEY, --func or --pool given; else a usage error (exit 2, as argparse's)."""
    if sum(v is not None for v in (a.key, a.func, a.pool)) != 1:
        print(f"queick {command}: give a KEY, --func or --pool", file=sys.stderr)
        raise SystemExit(2)
    return a.key or a.func or a.pool


def resume(a: argparse.Namespace, q: JobQueue) -> int:
    name = _target(a, "resume")
    q.resume(a.key, func=a.func, pool=a.pool)
    print(json.dumps({"resumed": name}) if a.json else f"resumed {name}")
    return 0


def pause(a: argparse.Namespace, q: JobQueue) -> int:
    name = _target(a, "pause")
    new = q.pause(a.key, func=a.func, pool=a.pool)
    if a.json:
        print(json.dumps({"paused": name, "new": new}))
    else:
        print(f"paused {name} until 'queick resume'" + ("" if new else " (it was paused already; no probe now)"))
    return 0


def pool_set(a: argparse.Namespace, q: JobQueue) -> int:
    if (a.key is None) == (a.job is None and a.cron is None):
        print("queick: give a KEY, or --job ID, or --cron NAME, and the POOL", file=sys.stderr)
        return 2
    n = q.set_pool(a.pool, key=a.key, job_id=a.job, cron=a.cron)
    print(json.dumps({"moved": n}) if a.json else f"{n} moved to pool {a.pool}")
    if n == 0 and a.key is None:  # a key may have nothing waiting; a job or cron named must be there
        what = (f"job {a.job} is not waiting (no such job, or it is running or finished)" if a.job is not None
                else f"no cron named {a.cron!r}")
        print(f"queick pool set: {what}; nothing moved", file=sys.stderr)
        return 1
    return 0
