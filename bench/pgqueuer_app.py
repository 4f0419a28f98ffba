"""pgqueuer's side of bench/pg.py: the worker factory and the jobs, which wrap
benchjobs.py's functions. pg.py copies this file and benchjobs.py into each run's temp dir
and starts `VENV/bin/python pgqueuer_app.py --max-concurrent-tasks C --batch-size B` there,
with the run's database in BENCH_PG_DSN: pgqueuer.run(), the worker loop `pgq run` runs.
(`pgq run` itself fails in 1.6.0 with the typer it installs: its --log-level option reaches
the logger setup as a str and `level.name` raises.) Imports pgqueuer and asyncpg: it runs
only under the pgqueuer virtualenv's Python.

pgqueuer calls async entrypoints on its event loop; a one-byte append is cheaper than a
hop to a thread, so the jobs are async functions that call benchjobs directly."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import benchjobs
import pgqueuer
from pgqueuer import Job, Queries, QueueManager


@asynccontextmanager
async def create_queue_manager() -> AsyncIterator[QueueManager]:
    conn = await asyncpg.connect(os.environ["BENCH_PG_DSN"])
    qm = QueueManager(Queries.from_asyncpg_connection(conn))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        benchjobs.noop()

    @qm.entrypoint("append_byte")
    async def append_byte(job: Job) -> None:
        benchjobs.append_byte(job.payload.decode())

    @qm.entrypoint("append_line_after")
    async def append_line_after(job: Job) -> None:
        path, line, seconds = json.loads(job.payload)
        await asyncio.sleep(seconds)  # the loop's way to work for a while
        benchjobs.append_line(path, line)

    yield qm


def main() -> None:
    p = argparse.ArgumentParser(description="A pgqueuer worker for bench/pg.py.")
    p.add_argument("--max-concurrent-tasks", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    a = p.parse_args()
    # SIGTERM/SIGINT stop it (pgqueuer's own handlers); SIGKILL is what the crash scenario sends
    asyncio.run(pgqueuer.run(create_queue_manager, max_concurrent_tasks=a.max_concurrent_tasks,
                             batch_size=a.batch_size))


if __name__ == "__main__":
    main()
