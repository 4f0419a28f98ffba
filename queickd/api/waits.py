"""A connection's long polls: `wait` (until a job is in one of the given states) and
`workflow_wait` (until a run has ended), each with a timeout. They run on the connection's
event loop and read the store on the I/O threads; this process's finishes wake them, and
a finish on another host (PostgreSQL) reaches them by the store's announcement or a poll."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from ..core import arguments, protocol
from .service import QueueService

WAIT_MAX = 3600.0  # seconds a wait may ask for
FORWARDED_POLL = 0.5  # seconds between looks upstream while a client waits on an edge daemon's job


def timeout_of(req: dict[str, Any]) -> float:
    """A wait's `timeout`: 30 s if not given, at most WAIT_MAX."""
    timeout = protocol.number(req, "timeout")
    return 30.0 if timeout is None else max(0.0, min(timeout, WAIT_MAX))


async def for_job(svc: QueueService, io: Executor, req: dict[str, Any]) -> dict[str, Any]:
    """`wait`: the job as `get` shows it once it is in one of the states asked for, or when
    the timeout passes (`timed_out`)."""
    job_id = arguments.job_id(req)
    states = arguments.states(req)
    got: dict[str, Any] = {}

    def ready() -> bool:
        if not got:  # the first look: from now on, a finish on another host is told here
            svc.store.watch_finish(job_id)
        got.update(svc.op_get({"job_id": job_id}))
        return got["job"]["state"] in states

    # A forwarded job's state is its upstream copy's, which no finish here tells: looked at again.
    poll = FORWARDED_POLL if svc.edge is not None else None
    got["timed_out"] = not await until(io, svc.waiters, job_id, ready, timeout_of(req), poll)
    return got


async def for_run(svc: QueueService, io: Executor, req: dict[str, Any]) -> dict[str, Any]:
    """`workflow_wait`: until the run is final or the timeout passes. Woken by finishes of
    step jobs in this process; a finish on another host (PostgreSQL) is seen within a
    second. Only the run's state on each wake-up: its whole status (every job of the run)
    is read once, at the end."""
    run_id = arguments.run_id(req)
    await until(io, svc.run_waiters, run_id, lambda: svc.workflow_state(run_id) != "running",
                timeout_of(req), poll=1.0)
    reply = await asyncio.get_running_loop().run_in_executor(io, svc.op_workflow_get, {"run_id": run_id})
    reply["timed_out"] = reply["run"]["state"] == "running"
    return reply


async def until(io: Executor, waiters: Any, key: int, ready: Callable[[], bool], timeout: float,
                poll: float | None = None) -> bool:
    """Wait until ready() (a store read, run on `io`) is true, looking again each time
    `waiters` wakes `key` (and at least every `poll` s), or until `timeout` passes. True if
    it became ready. The wake-up is registered before each look, so one that comes in
    between is not lost."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        woken = asyncio.Event()

        def wake(ev: asyncio.Event = woken) -> None:  # any thread
            loop.call_soon_threadsafe(ev.set)

        waiters.add(key, wake)
        try:
            if await loop.run_in_executor(io, ready):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), remaining if poll is None else min(remaining, poll))
        finally:
            waiters.discard(key, wake)
