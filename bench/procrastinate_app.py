"""procrastinate's side of bench/pg.py: the App and its tasks, which wrap benchjobs.py's
functions. pg.py copies this file and benchjobs.py into each run's temp dir and starts
`VENV/bin/python -m procrastinate --app procrastinate_app.app worker` there, with the run's
database in BENCH_PG_DSN. Imports procrastinate: it runs only under the procrastinate
virtualenv's Python.

The tasks are async (procrastinate runs sync tasks in a thread; a one-byte append is cheaper
on the loop). retry_stalled_jobs is procrastinate's documented recipe for jobs whose worker
died (kill -9): without it they stay `doing` for ever, and the bench asks every system for
at-least-once execution. It runs every 30 s; a worker is stalled after 30 s without a
heartbeat (its default), the same window as queickd's (3 x 10 s) and pgqueuer's (30 s)."""

from __future__ import annotations

import asyncio
import os

import benchjobs
import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_PG_DSN"]))


@app.task(name="noop")
async def noop() -> None:
    benchjobs.noop()


@app.task(name="append_byte")
async def append_byte(path: str) -> None:
    benchjobs.append_byte(path)


@app.task(name="append_line_after")
async def append_line_after(path: str, line: str, seconds: float) -> None:
    await asyncio.sleep(seconds)  # the loop's way to work for a while
    benchjobs.append_line(path, line)


@app.periodic(cron="* * * * * */30")  # the 6th field is seconds
@app.task(name="retry_stalled_jobs", queueing_lock="retry_stalled_jobs", pass_context=True)
async def retry_stalled_jobs(context: procrastinate.JobContext, timestamp: int) -> None:
    for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=30):
        await app.job_manager.retry_job(job)
