"""pgqueuer's side of bench/pg.py: the worker factory and the jobs, which wrap
benchjobs.py's functions. pg.py copies this file and benchjobs.py into each run's temp dir
and starts `VENV/bin/python -m pgqueuer run pgqueuer_app:create_queue_manager` there, with
the run's database in BENCH_PG_DSN. Imports pgqueuer and asyncpg: it runs only under the
pgqueuer virtualenv's Python.

pgqueuer calls async entrypoints on its event loop; a one-byte append is cheaper than a
hop to a thread, so the jobs are async functions that call benchjobs directly."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import benchjobs
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

    @qm.entrypoint("append_line")
    async def append_line(job: Job) -> None:
        path, line = json.loads(job.payload)
        benchjobs.append_line(path, line)

    yield qm
