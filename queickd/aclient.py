"""AsyncJobQueue: JobQueue's operations as coroutines, over one asyncio connection.

    async with AsyncJobQueue() as q:
        ids = await asyncio.gather(*(q.enqueue(mymod.work, args=(i,)) for i in range(1000)))
        job = await q.wait(ids[0])

Every request goes out on the one connection as soon as it is made, without waiting for
the replies owed before it (requests made in the same turn of the event loop leave in one
write); the daemon answers in request order and each reply goes to the await that sent its
request, so many awaits may be in flight at once. An await that is cancelled gives up its
reply, never another's. `wait`, `workflow_wait` and `drain(wait=...)` hold their reply
until the job (run, drain) ends, which would hold every reply behind them: they go on
connections of their own, kept for the next such call.

The requests and what is made of the replies are clientops' plans, the same JobQueue runs;
so are the errors: QueueError with the daemon's code, ConnectionError when the daemon
cannot be reached, RequestLostError (a ConnectionError) when the connection broke or no
reply came for `timeout` seconds after a request was sent (an `enqueue` is then resent
under its idempotency key, as JobQueue does). The connection is opened on first use and
again after it broke.

Use one AsyncJobQueue from one event loop (its thread): it is not thread-safe. Standard
library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import clientops
from .clientflow import WorkflowBuilder
from .clientops import one
from .clientwire import RequestLostError, _token_from_env, func_name, reply_error
from .core import protocol
from .core.cron import SchedulingTime
from .core.protocol import QueueError

__all__ = ["AsyncJobQueue"]

_BACKLOG = 1 << 20  # bytes written but not yet sent beyond which a sender waits for the socket


class _Connection:
    """One connection: requests written in the order sent, replies matched to them in that
    order. Runs on one event loop; a reader task owns the reading side."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply_timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader, self._writer = reader, writer
        self._reply_timeout = reply_timeout
        self._owed: deque[asyncio.Future[dict[str, Any]]] = deque()  # one per request sent, in order
        self._out: list[bytes] = []  # encoded requests of this turn of the loop, written at its end
        self._replies = 0  # replies read so far: the watchdog's measure of progress
        self._watchdog: asyncio.TimerHandle | None = None
        self.broken: BaseException | None = None
        self._reading = self._loop.create_task(self._read())

    def send(self, reqs: Sequence[dict[str, Any]]) -> list[asyncio.Future[dict[str, Any]]]:
        """Queue requests to be written (this turn of the loop); a future per reply."""
        if self.broken is not None:
            raise ConnectionError(f"the connection to queickd is closed ({self.broken})")
        lines = [protocol.encode(r) for r in reqs]  # a request that cannot be encoded sends none
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out += lines
        futures = [self._loop.create_future() for _ in lines]
        self._owed.extend(futures)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self._reply_timeout, self._watch, self._replies)
        return futures

    def _flush(self) -> None:
        if self._out and self.broken is None:
            self._writer.write(b"".join(self._out))
        self._out.clear()

    async def backpressure(self) -> None:
        """Wait for the socket to take our writes, if they have piled up."""
        transport = self._writer.transport
        if transport.get_write_buffer_size() > _BACKLOG and not transport.is_closing():
            with contextlib.suppress(OSError):
                await self._writer.drain()

    def _watch(self, replies_then: int) -> None:
        # One timer per reply_timeout, not one per request: a request owed a reply for
        # that long with no reply read meanwhile breaks the connection.
        self._watchdog = None
        if not self._owed:
            return
        if self._replies == replies_then:
            self._fail(TimeoutError(f"no reply from queickd in {self._reply_timeout:g} s"))
            return
        self._watchdog = self._loop.call_later(self._reply_timeout, self._watch, self._replies)

    async def _read(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line.endswith(b"\n"):
                    raise ConnectionError("queickd closed the connection")
                reply = protocol.decode_reply(line)
                self._replies += 1
                if not self._owed:
                    raise ValueError(f"queickd sent a reply to no request: {line[:80]!r}")
                future = self._owed.popleft()
                if not future.done():  # its await was cancelled: the reply is dropped, the order kept
                    future.set_result(reply)
        except (OSError, ValueError) as e:  # ValueError: not JSON, or a line past the limit
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """Break the connection: every reply still owed is lost (the request may have been
        applied, or not)."""
        if self.broken is None:
            self.broken = e
        while self._owed:
            future = self._owed.popleft()
            if not future.done():
                future.set_exception(RequestLostError(f"connection to queickd failed mid-request: {e}"))
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._writer.close()
        if self._reading is not asyncio.current_task():
            self._reading.cancel()

    async def close(self) -> None:
        self._fail(ConnectionError("closed by the client"))
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await self._reading
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class AsyncJobQueue:
    def __init__(self, host: str | None = None, port: int | None = None, *, token: str | None = None,
                 timeout: float = 60.0, connect_timeout: float = 5.0) -> None:
        """As JobQueue's: `timeout` is how long a sent request may wait for its reply."""
        self.host = host or os.environ.get("QUEICKD_HOST", "127.0.0.1")
        self.port = int(port or os.environ.get("QUEICKD_PORT", protocol.DEFAULT_PORT))
        self.token = token if token is not None else _token_from_env()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.server_info: dict[str, Any] | None = None
        self._conn: _Connection | None = None
        self._connecting: asyncio.Lock | None = None  # made on first use, in the loop that uses it
        self._spare: list[_Connection] = []  # connections of held requests (waits), free for the next

    # --- connection ---------------------------------------------------------------------------
    async def _open(self) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=protocol.MAX_LINE * 4 + 2), self.connect_timeout)
        except OSError as e:  # TimeoutError too
            raise ConnectionError(
                f"cannot reach queickd at {self.host}:{self.port} ({str(e) or 'timed out'}); is the daemon running?"
            ) from e
        conn = _Connection(reader, writer, self.timeout)
        info = await conn.send([clientops.hello(self.token)])[0]
        if not info.get("ok"):
            await conn.close()
            raise QueueError.from_reply(info)
        self.server_info = info
        return conn

    async def _shared(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.broken is None:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # the first awaits in flight all wait for one connection
            if self._conn is None or self._conn.broken is not None:
                self._conn = await self._open()
            return self._conn

    async def _request(self, req: dict[str, Any]) -> dict[str, Any]:
        if clientops.held(req):
            conn = self._spare.pop() if self._spare else await self._open()
            try:
                return await conn.send([req])[0]
            finally:  # replies stay matched even if this await was cancelled: still reusable
                if conn.broken is None:
                    self._spare.append(conn)
        conn = await self._shared()
        future = conn.send([req])[0]
        await conn.backpressure()
        return await future

    async def _run(self, plan: clientops.Plan[Any]) -> Any:
        """Carry out a plan of clientops, as JobQueue._run does, awaiting instead of blocking."""
        outcome: Any = None
        while True:
            try:
                step = plan.throw(outcome) if isinstance(outcome, BaseException) else plan.send(outcome)
            except StopIteration as done:
                return done.value
            try:
                if type(step) is dict:
                    outcome = await self._request(step)
                    if not outcome.get("ok"):
                        outcome = reply_error(outcome)
                elif type(step) is list:
                    conn = await self._shared()
                    outcome = await asyncio.gather(*conn.send(step))
                else:
                    outcome = await asyncio.sleep(step)
            except Exception as e:  # the plan decides: resend, wait and retry, or raise it
                outcome = e

    async def close(self) -> None:
        conns, self._conn, self._spare = [self._conn, *self._spare], None, []
        for conn in conns:
            if conn is not None:
                await conn.close()

    async def __aenter__(self) -> AsyncJobQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the queue: as JobQueue's methods of the same names ------------------------------------
    job = staticmethod(clientops.job)

    async def enqueue(self, func: Callable[..., Any] | str, args: Iterable[Any] | None = None, *,
                      block: bool = False, block_timeout: float = 60.0, **options: Any) -> int:
        return await self._run(clientops.enqueue(func, args, block, block_timeout, options))

    async def enqueue_at(self, start_at: float | SchedulingTime, func: Callable[..., Any] | str,
                         args: Iterable[Any] | None = None, **options: Any) -> int:
        return await self.enqueue(func, args, run_at=clientops.run_at(start_at), **options)

    async def enqueue_many(self, jobs: Sequence[dict[str, Any]]) -> list[int]:
        return await self._run(clientops.enqueue_many(jobs))

    async def enqueue_pipelined(self, jobs: Sequence[dict[str, Any]]) -> list[int]:
        return await self._run(clientops.enqueue_pipelined(jobs))

    async def cron(self, schedule: SchedulingTime | str, func: Callable[..., Any] | str,
                   args: Iterable[Any] | None = None, *, name: str | None = None, **options: Any) -> dict[str, Any]:
        return await self._run(clientops.cron(schedule, func, args, name, options))

    async def emit_event(self, event_id: str, func: Callable[..., Any] | str, args: Iterable[Any] | None = None,
                         kwargs: dict[str, Any] | None = None, *, key: str | None = None,
                         **options: Any) -> dict[str, Any]:
        return await self._run(clientops.emit_event(event_id, func, args, kwargs, key, options))

    async def dead(self, limit: int = 100) -> dict[str, list[dict[str, Any]]]:
        return await self._run(clientops.dead(limit))

    async def retry_all(self) -> int:
        return await self._run(one({"op": "retry", "all": True}, "retried"))

    async def retry_event(self, event_id: str) -> dict[str, Any]:
        return await self._run(one({"op": "retry", "event_id": event_id}, "event"))

    async def purge(self, older_than: float, state: str = "dead") -> int:
        return await self._run(one({"op": "purge", "state": state, "older_than": older_than}, "purged"))

    async def resume(self, key: str | None = None, *, func: Callable[..., Any] | str | None = None,
                     pool: str | None = None) -> None:
        await self._run(one(clientops.target("resume", key, func, pool)))

    async def pause(self, key: str | None = None, *, func: Callable[..., Any] | str | None = None,
                    pool: str | None = None) -> bool:
        return await self._run(one(clientops.target("pause", key, func, pool), "paused"))

    async def drain(self, wait: float = 0.0, *, off: bool = False) -> dict[str, Any]:
        return await self._run(one(clientops.drain(wait, off)))

    async def cancel_waiting(self, state: str, *, func: Callable[..., Any] | str | None = None,
                             key: str | None = None, pool: str | None = None, dry_run: bool = False) -> int:
        return await self._run(clientops.cancel_waiting(state, func, key, pool, dry_run))

    async def get(self, job_id: int) -> dict[str, Any]:
        return await self._run(one({"op": "get", "job_id": job_id}, "job"))

    async def wait(self, job_id: int, timeout: float = 30.0, states: Iterable[str] | None = None) -> dict[str, Any]:
        return await self._run(clientops.wait(job_id, timeout, states, self.timeout))

    async def cancel(self, job_id: int) -> dict[str, Any]:
        return await self._run(one({"op": "cancel", "job_id": job_id}, "job"))

    async def retry(self, job_id: int) -> dict[str, Any]:
        return await self._run(one({"op": "retry", "job_id": job_id}, "job"))

    async def set_pool(self, pool: str, *, key: str | None = None, job_id: int | None = None,
                       cron: str | None = None) -> int:
        return await self._run(one(clientops.set_pool(pool, key, job_id, cron), "moved"))

    async def jobs(self, state: str | None = None, limit: int = 100, *, func: Callable[..., Any] | str | None = None,
                   key: str | None = None, pool: str | None = None) -> list[dict[str, Any]]:
        return await self._run(one(clientops.jobs(state, limit, func, key, pool), "jobs"))

    async def stats(self, detail: bool = False) -> dict[str, Any]:
        return await self._run(one({"op": "stats", "detail": True} if detail else {"op": "stats"}))

    async def crons(self) -> list[dict[str, Any]]:
        return await self._run(one({"op": "crons"}, "crons"))

    async def cron_delete(self, name: str) -> None:
        await self._run(one({"op": "cron_delete", "name": name}))

    # --- tasks ---------------------------------------------------------------------------------
    def task(self, func: Callable[..., Any] | None = None, **options: Any) -> Any:
        """`@q.task(**options)` on a function at the top level of a module: a Task (tasks.py),
        which the function's callers still call, with .enqueue(...) queuing it with these options."""
        from . import tasks  # tasks builds on this module

        return tasks.decorate(self, func, options)

    # --- workflows ----------------------------------------------------------------------------
    def workflow(self, name: str) -> WorkflowBuilder:
        """A builder, as JobQueue's: `await q.workflow(name).then(...).start(state)`."""
        return WorkflowBuilder(self, name, func_name)

    async def workflow_get(self, run_id: int) -> dict[str, Any]:
        return await self._run(one({"op": "workflow_get", "run_id": run_id}, "run"))

    async def workflow_wait(self, run_id: int, timeout: float = 30.0) -> dict[str, Any]:
        return await self._run(clientops.workflow_wait(run_id, timeout, self.timeout))

    async def workflow_cancel(self, run_id: int) -> dict[str, Any]:
        return await self._run(one({"op": "workflow_cancel", "run_id": run_id}, "run"))

    async def workflows(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return await self._run(one(clientops.workflows(state, limit), "runs"))
