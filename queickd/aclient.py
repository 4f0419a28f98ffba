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
connections of their own, kept for the next such call (one given up by its caller is
closed: the reply it still owes would hold the next one's).

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
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import clientops, tasks
from .clientflow import WorkflowBuilder
from .clientops import one
from .clientwire import RequestLostError, endpoint, func_name
from .core import protocol
from .core.cron import SchedulingTime
from .core.protocol import QueueError

if TYPE_CHECKING:
    import ssl


__all__ = ["AsyncJobQueue"]

_MAX_REPLY = protocol.MAX_LINE * 4  # bytes of one reply line, as JobQueue reads at most


class _Connection(asyncio.Protocol):
    """One connection: requests written in the order sent, replies matched to them in that
    order as they arrive (no task reads: the event loop hands us the bytes). Runs on the
    event loop that opened it."""

    def __init__(self, reply_timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._reply_timeout = reply_timeout
        self.transport: asyncio.Transport | None = None
        self._owed: deque[asyncio.Future[dict[str, Any]]] = deque()  # one per request sent, in order
        self._out: list[bytes] = []  # encoded requests of this turn of the loop, written at its end
        self._partial: list[bytes] = []  # the start of a reply line not yet whole
        self._partial_len = 0
        self._replies = 0  # replies read so far: the watchdog's measure of progress
        self._watchdog: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future[None] | None = None  # while the socket's send buffer is full
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self.broken: BaseException | None = None

    def send(self, line: bytes) -> asyncio.Future[dict[str, Any]]:
        """Queue an encoded request to be written at the end of this turn of the loop (with
        every other request of the turn); the future of its reply."""
        if self.broken is not None:
            raise ConnectionError(f"the connection to queickd is closed ({self.broken})")
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(line)
        future = self._loop.create_future()
        self._owed.append(future)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self._reply_timeout, self._watch, self._replies)
        return future

    def _flush(self) -> None:
        if self._out and self.broken is None:
            self.transport.write(b"".join(self._out))  # type: ignore[union-attr]
        self._out.clear()

    @property
    def paused(self) -> bool:
        """Whether the socket's send buffer is full (the daemon reads slower than we write)."""
        return self._writable is not None

    async def writable(self) -> None:
        """Return once the socket takes writes again."""
        if self._writable is not None:
            await asyncio.shield(self._writable)

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

    # asyncio.Protocol's callbacks -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if b"\n" not in data:
            self._partial.append(data)
            self._partial_len += len(data)
            if self._partial_len > _MAX_REPLY:
                self._fail(ValueError(f"a reply from queickd is longer than {_MAX_REPLY} bytes"))
            return
        if self._partial:
            data = b"".join(self._partial) + data
            self._partial.clear()
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial.append(rest)
        self._partial_len = len(rest)
        owed = self._owed
        for line in lines:
            try:
                reply = protocol.decode_reply(line)
            except ValueError as e:  # not JSON: not queickd, or a broken stream
                self._fail(e)
                return
            self._replies += 1
            if not owed:
                self._fail(ValueError(f"queickd sent a reply to no request: {line[:80]!r}"))
                return
            future = owed.popleft()
            if not future.done():  # its await was cancelled: the reply is dropped, the order kept
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("queickd closed the connection"))
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

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
        self.resume_writing()
        if self.transport is not None:
            self.transport.close()

    def abandon(self) -> None:
        """Close without waiting: the replies still owed are not wanted."""
        self._fail(ConnectionError("closed by the client"))

    async def close(self) -> None:
        self._fail(ConnectionError("closed by the client"))
        if self.transport is not None:
            await self._closed


class AsyncJobQueue:
    def __init__(self, host: str | None = None, port: int | None = None, *, token: str | None = None,
                 timeout: float = 60.0, connect_timeout: float = 5.0,
                 tls: bool | str | ssl.SSLContext | None = None) -> None:
        """As JobQueue's: `timeout` is how long a sent request may wait for its reply; `tls`
        as JobQueue's (True, a CA file's path, an ssl.SSLContext; None: $QUEICKD_TLS_CA)."""
        self.host, self.port, self.token, self.tls = endpoint(host, port, token, tls)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.server_info: dict[str, Any] | None = None
        self._conn: _Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop our connections belong to
        self._connecting: asyncio.Lock | None = None  # made with them, in that loop
        self._held: set[_Connection] = set()  # connections of held requests (waits), open
        self._spare: list[_Connection] = []  # ... of them, free for the next
        # Immediate mode's (queickd/immediate.py), for the tasks of a JobQueue.immediate():
        # requests answered in this thread, no connection. None: the daemon's socket.
        self._transport: Any = None

    # --- connection ---------------------------------------------------------------------------
    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self.timeout), self.host, self.port, ssl=self.tls),
                self.connect_timeout)
        except OSError as e:  # TimeoutError too
            if type(e).__name__.startswith("SSL"):  # reached, but the handshake failed
                raise ConnectionError(f"TLS with queickd at {self.host}:{self.port} failed: {e}") from e
            raise ConnectionError(
                f"cannot reach queickd at {self.host}:{self.port} ({str(e) or 'timed out'}); is the daemon running?"
            ) from e
        try:
            info = await conn.send(protocol.encode(clientops.hello(self.token)))
        except BaseException:  # cancelled too: a connection no one holds would stay open
            conn.abandon()
            raise
        if not info.get("ok"):
            await conn.close()
            raise QueueError.from_reply(info)
        self.server_info = info
        return conn

    def _in_this_loop(self) -> None:
        """A queue used from a new event loop (a second asyncio.run, a test's own loop)
        drops the connections of the last one: they ended with it, and cannot be closed
        from here."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._conn, self._connecting = loop, None, asyncio.Lock()
            self._held, self._spare = set(), []

    async def _shared(self) -> _Connection:
        self._in_this_loop()
        conn = self._conn
        if conn is not None and conn.broken is None:
            return conn
        assert self._connecting is not None
        async with self._connecting:  # the first awaits in flight all wait for one connection
            if self._conn is None or self._conn.broken is not None:
                self._conn = await self._open()
            return self._conn

    async def _held_request(self, line: bytes) -> dict[str, Any]:
        """The reply to a request the daemon may hold (a wait), on a connection of its own."""
        self._in_this_loop()
        while self._spare and self._spare[-1].broken is not None:  # the daemon restarted, say
            self._held.discard(self._spare.pop())
        conn = self._spare.pop() if self._spare else await self._open()
        self._held.add(conn)
        try:
            reply = await conn.send(line)
        except BaseException:  # cancelled too: the reply it gave up would hold the next one's
            conn.abandon()
            self._held.discard(conn)
            raise
        self._spare.append(conn)
        return reply

    async def _run(self, plan: clientops.Plan[Any]) -> Any:
        """Carry out a plan of clientops, as JobQueue._run does, awaiting instead of blocking.
        A request goes out on the shared connection from here, not from a coroutine of its
        own (one more per enqueue would cost the client dearly)."""
        steps = clientops.Steps(plan)
        for step in steps:
            try:
                if self._transport is not None and type(step) in (dict, list):  # an immediate queue's twin
                    replies = self._transport.exchange([step] if type(step) is dict else step)
                    outcome = replies if type(step) is list else replies[0]
                    if type(step) is dict and not outcome.get("ok"):
                        outcome = QueueError.from_reply(outcome)
                elif type(step) is dict:
                    line = protocol.encode(step)  # a request that cannot be encoded is never sent
                    if clientops.held(step):
                        outcome = await self._held_request(line)
                    else:
                        conn = self._conn
                        if conn is None or conn.broken is not None or self._loop is not asyncio.get_running_loop():
                            conn = await self._shared()
                        future = conn.send(line)
                        if conn.paused:
                            await conn.writable()
                        outcome = await future
                    if not outcome.get("ok"):
                        outcome = QueueError.from_reply(outcome)
                elif type(step) is list:
                    lines = [protocol.encode(r) for r in step]  # all, before any is sent
                    conn = await self._shared()
                    outcome = await asyncio.gather(*[conn.send(line) for line in lines])
                else:
                    outcome = await asyncio.sleep(step)
            except Exception as e:  # the plan decides: resend, wait and retry, or raise it
                outcome = e
            steps.outcome = outcome
        return steps.result

    async def close(self) -> None:
        if self._loop is not asyncio.get_running_loop():
            self._in_this_loop()  # nothing of ours is open in this loop
            return
        conns, self._conn, self._held, self._spare = [self._conn, *self._held], None, set(), []
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
    task = tasks.queue_task
    """As JobQueue.task; the Task enqueues with `await task.aenqueue(...)`."""

    def _async_queue(self) -> AsyncJobQueue:
        return self

    def _sync_queue(self) -> Any:
        raise TypeError("a task of an AsyncJobQueue is enqueued with `await task.aenqueue(...)`; for a blocking "
                        "enqueue, decorate the function with a JobQueue's task")

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
