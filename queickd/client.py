"""JobQueue: the Python client. Queick's call shapes, over protocol v1.

    from queickd import JobQueue, SchedulingTime, RETRY_TYPE
    q = JobQueue()
    job_id = q.enqueue(function, args=(1, 2))
    q.enqueue_at(time.time() + 5, function, args=(3, 4))
    q.cron(SchedulingTime().every(minutes=1).starting_from(time.time() + 10), function, args=(1, 2))

One persistent connection, opened on first use and shared by all threads (one request or
pipelined batch at a time holds it). Errors from the daemon raise QueueError with its code;
a daemon that cannot be reached raises ConnectionError. A request is never sent twice
unless resending is safe: `enqueue` gives its job an idempotency key (`auto:<time><random>`,
unless the caller gave one), and `enqueue` (and `enqueue_many` when the caller keyed
every job) resend the same request when its outcome is unknown (the connection broke after it was sent: RequestLostError; or the
daemon answered `internal` with `maybe_committed`), so the daemon returns the job it
stored the first time instead of storing it again. Other requests raise RequestLostError
and the caller decides.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import clientops, clientwire, tasks
from .clientflow import WorkflowBuilder
from .clientops import one
from .clientwire import RequestLostError, endpoint, func_name
from .core import protocol
from .core.cron import SchedulingTime
from .core.protocol import QueueError

if TYPE_CHECKING:
    import ssl


__all__ = ["JobQueue", "QueueError", "RequestLostError", "func_name"]

_SLICE = 256  # requests per send when a long pipeline is streamed


# Every JobQueue of this process: a child made by os.fork() gets a copy of each, whose
# connection is its parent's and whose lock another thread may have held at the fork.
_LIVE: weakref.WeakSet[JobQueue] = weakref.WeakSet()


def _in_child() -> None:
    clientwire.reset_after_fork()
    for q in list(_LIVE):
        q._forked()


os.register_at_fork(after_in_child=_in_child)


class JobQueue:
    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        tls: bool | str | ssl.SSLContext | None = None,
    ) -> None:
        """`tls`: True (trusting the system's CAs), a CA file's path, or an ssl.SSLContext
        (with a client certificate for mutual TLS); None: plaintext, or $QUEICKD_TLS_CA."""
        self.host, self.port, self.token, self.tls = endpoint(host, port, token, tls)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._rfile: Any = None
        self.server_info: dict[str, Any] | None = None
        self._transport: Any = None  # immediate mode's (queickd/immediate.py); None: the socket
        _LIVE.add(self)

    @classmethod
    def immediate(cls, app_dir: str = ".", allow: Sequence[str] = (), **options: Any) -> JobQueue:
        """A queue with no daemon and no socket, for tests: each call returns once what it
        made due has run in this thread (queickd/immediate.py says what holds and `options`)."""
        from .immediate import ImmediateTransport

        return ImmediateTransport(app_dir, allow, **options).attach(cls())

    def advance(self, seconds: float) -> float:
        """Immediate mode: move the queue's clock on, running what comes due. Returns its time."""
        if self._transport is None:
            raise TypeError("advance() moves an immediate queue's clock (JobQueue.immediate())")
        return self._transport.advance(seconds)

    def _forked(self) -> None:
        """In a child made by os.fork(): a lock and connection of its own, from the next call
        on. The parent's connection is let go without a shutdown, which would end it for the
        parent too; replies to the parent's requests stay the parent's."""
        self._lock = threading.Lock()
        sock, rfile, self._sock, self._rfile = self._sock, self._rfile, None, None
        for f in (rfile, sock):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()

    # --- connection ---------------------------------------------------------------------------
    def _connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as e:
            raise ConnectionError(
                f"cannot reach queickd at {self.host}:{self.port} ({e}); is the daemon running?"
            ) from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:  # the handshake, within connect_timeout
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            except OSError as e:
                sock.close()
                raise ConnectionError(f"TLS with queickd at {self.host}:{self.port} failed: {e}") from e
        sock.settimeout(self.timeout)
        self._sock, self._rfile = sock, sock.makefile("rb", buffering=65536)
        self.server_info = self._exchange([clientops.hello(self.token)])[0]
        if not self.server_info.get("ok"):
            err = QueueError.from_reply(self.server_info)
            self.close()
            raise err

    def _stale(self) -> bool:
        # A daemon restart leaves our socket readable at EOF; find out before sending, so
        # the request goes to the new daemon instead of failing after the fact.
        assert self._sock is not None
        readable, _, _ = select.select([self._sock], [], [], 0)
        if readable and self.tls is not None:  # perhaps TLS's own records (session tickets), no data
            import ssl

            self._sock.setblocking(False)
            try:
                self._sock.recv(1)  # data between replies, or EOF: stale either way
            except ssl.SSLWantReadError:
                return False
            except OSError:
                pass
            finally:
                self._sock.settimeout(self.timeout)
        return bool(readable)

    def _send_slices(self, reqs: Sequence[dict[str, Any]], failed: list[BaseException]) -> None:
        try:
            for i in range(0, len(reqs), _SLICE):
                self._sock.sendall(b"".join(protocol.encode(r) for r in reqs[i : i + _SLICE]))  # type: ignore[union-attr]
        except OSError as e:
            failed.append(e)

    def _exchange(self, reqs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self._sock is not None
        sender = None
        failed: list[BaseException] = []
        try:
            if len(reqs) <= _SLICE:
                self._sock.sendall(b"".join(protocol.encode(r) for r in reqs))
            else:
                # Long pipelines: encode and send on a thread while this one reads replies, so
                # the daemon never waits for us and neither side's buffers fill up.
                sender = threading.Thread(target=self._send_slices, args=(reqs, failed), daemon=True)
                sender.start()
            replies = []
            for _ in reqs:
                line = self._rfile.readline(protocol.MAX_LINE * 4 + 2)
                if not line:
                    raise ConnectionError(f"queickd closed the connection{f' ({failed[0]})' if failed else ''}")
                replies.append(protocol.decode_reply(line))
            if sender is not None:
                sender.join()
            return replies
        except (OSError, ValueError) as e:
            if sender is not None:
                with contextlib.suppress(OSError):  # a reset connection is not connected any more
                    self._sock.shutdown(socket.SHUT_RDWR)  # unblocks the sender, if still sending
                sender.join()
            with contextlib.suppress(OSError):
                self.close()
            if isinstance(e, ConnectionError):
                raise RequestLostError(str(e)) from e
            raise RequestLostError(f"connection to queickd failed mid-request: {e}") from e
        except BaseException:
            # Interrupted (Ctrl-C, a signal handler's exception) with replies still owed:
            # kept, the connection would hand them to the next requests as their own.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # unblocks the sender, if still sending
            with contextlib.suppress(OSError):
                self.close()
            raise

    def _call_many(self, reqs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._transport is not None:
            return self._transport.exchange(reqs)
        with self._lock:
            if self._sock is not None and self._stale():
                self.close()
            if self._sock is None:
                self._connect()
            return self._exchange(reqs)

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        reply = self._call_many([req])[0]
        if not reply.get("ok"):
            raise QueueError.from_reply(reply)
        return reply

    def _run(self, plan: clientops.Plan[Any]) -> Any:
        """Carry out a plan of clientops: send its requests, pause its pauses, hand it the
        replies (a refused one or a lost connection thrown into it), return its result."""
        steps = clientops.Steps(plan)
        for step in steps:
            try:
                if type(step) is dict:
                    outcome = self._call(step)
                elif type(step) is list:
                    outcome = self._call_many(step)
                else:
                    outcome = time.sleep(step)
            except Exception as e:  # the plan decides: resend, wait and retry, or raise it
                outcome = e
            steps.outcome = outcome
        return steps.result

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._rfile.close()
                self._sock.close()
            finally:
                self._sock = self._rfile = None

    def __enter__(self) -> JobQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- building requests ----------------------------------------------------------------------
    job = staticmethod(clientops.job)

    # --- the queue ------------------------------------------------------------------------------
    def enqueue(self, func: Callable[..., Any] | str, args: Iterable[Any] | None = None, *,
                block: bool = False, block_timeout: float = 60.0, **options: Any) -> int:
        """Queue a call of func(*args, **kwargs). Returns the job id once it is stored.

        When the queue (or the job's key) is full the daemon answers queue_full with a
        retry_after; with block=True this waits that long and tries again, up to
        block_timeout seconds, before raising the QueueError."""
        return self._run(clientops.enqueue(func, args, block, block_timeout, options))

    def enqueue_at(self, start_at: float | SchedulingTime, func: Callable[..., Any] | str,
                   args: Iterable[Any] | None = None, **options: Any) -> int:
        """Queue a call to run at unix time start_at."""
        return self.enqueue(func, args, run_at=clientops.run_at(start_at), **options)

    def enqueue_many(self, jobs: Sequence[dict[str, Any]]) -> list[int]:
        """Store up to 10,000 jobs in one request, all or none (one transaction). `jobs` are
        JobQueue.job(...) dicts. Returns their ids, in order."""
        return self._run(clientops.enqueue_many(jobs))

    def enqueue_pipelined(self, jobs: Sequence[dict[str, Any]]) -> list[int]:
        """Send one `enqueue` per job without waiting between them; replies come in order.
        Raises the first error after reading every reply (the other jobs are stored)."""
        return self._run(clientops.enqueue_pipelined(jobs))

    def enqueue_each(self, jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each job (a job() dict) its own enqueue, pipelined on one connection: the replies,
        one per job in order, each ok with its `job_id` or refused with its `error`. A lost
        connection raises (any of them may have been committed: give them idempotency keys)."""
        return self._run(clientops.each([{"op": "enqueue", **j} for j in jobs]))

    def get_each(self, job_ids: Sequence[int]) -> list[dict[str, Any]]:
        """`get` of each job, pipelined: the replies as they are (ok with `job`, or an error)."""
        return self._run(clientops.each([{"op": "get", "job_id": i} for i in job_ids]))

    def cron(self, schedule: SchedulingTime | str, func: Callable[..., Any] | str,
             args: Iterable[Any] | None = None, *, name: str | None = None, **options: Any) -> dict[str, Any]:
        """Run func on a schedule: a SchedulingTime, or a 5-field cron expression string.
        Registering the same function on the same schedule again replaces it (by name)."""
        return self._run(clientops.cron(schedule, func, args, name, options))

    def emit_event(self, event_id: str, func: Callable[..., Any] | str, args: Iterable[Any] | None = None,
                   kwargs: dict[str, Any] | None = None, *, key: str | None = None, **options: Any) -> dict[str, Any]:
        """Hand an event to the daemon's durable outbox (idempotent on event_id). It becomes a
        job now if there is room, later otherwise; never dropped. Returns {state, job_id, ...}."""
        return self._run(clientops.emit_event(event_id, func, args, kwargs, key, options))

    def dead(self, limit: int = 100) -> dict[str, list[dict[str, Any]]]:
        """Dead letters: {"jobs": [...], "events": [...]}."""
        return self._run(clientops.dead(limit))

    def retry_all(self) -> int:
        """Send every dead job and dead event back. Returns how many."""
        return self._run(one({"op": "retry", "all": True}, "retried"))

    def retry_event(self, event_id: str) -> dict[str, Any]:
        return self._run(one({"op": "retry", "event_id": event_id}, "event"))

    def purge(self, older_than: float, state: str = "dead") -> int:
        """Delete jobs in a final state (dead by default) that finished over older_than s ago."""
        return self._run(one({"op": "purge", "state": state, "older_than": older_than}, "purged"))

    def resume(self, key: str | None = None, *, func: Callable[..., Any] | str | None = None,
               pool: str | None = None) -> None:
        """Lift the pause of a key (or of a function, or of a pool)."""
        self._run(one(clientops.target("resume", key, func, pool)))

    def pause(self, key: str | None = None, *, func: Callable[..., Any] | str | None = None,
              pool: str | None = None) -> bool:
        """Pause a key (or a function, or a pool) by hand: its jobs wait, with no probe, until
        resume(). True if it was not paused before."""
        return self._run(one(clientops.target("pause", key, func, pool), "paused"))

    def drain(self, wait: float = 0.0, *, off: bool = False) -> dict[str, Any]:
        """Stop this daemon claiming new jobs (running ones go on) and wait up to `wait` s
        (at most 60) for them to end; off=True claims again. Returns draining, running and
        idle."""
        return self._run(one(clientops.drain(wait, off)))

    def cancel_waiting(self, state: str, *, func: Callable[..., Any] | str | None = None, key: str | None = None,
                       pool: str | None = None, dry_run: bool = False) -> int:
        """Cancel every job in a waiting state (queued, scheduled, waiting_network) of the
        given function, key and pool. Returns how many were cancelled (with dry_run: how
        many would be, up to 10,000, and none is)."""
        return self._run(clientops.cancel_waiting(state, func, key, pool, dry_run))

    def get(self, job_id: int) -> dict[str, Any]:
        return self._run(one({"op": "get", "job_id": job_id}, "job"))

    def wait(self, job_id: int, timeout: float = 30.0, states: Iterable[str] | None = None) -> dict[str, Any]:
        """Block until the job is succeeded, dead or cancelled (or in one of `states`), or
        timeout seconds pass. Returns the job; raises TimeoutError if it is not there yet."""
        return self._run(clientops.wait(job_id, timeout, states, self.timeout))

    def cancel(self, job_id: int) -> dict[str, Any]:
        """Cancel a job that waits, or one that runs (its outcome is then discarded)."""
        return self._run(one({"op": "cancel", "job_id": job_id}, "job"))

    def retry(self, job_id: int) -> dict[str, Any]:
        """Send a dead job back to the queue."""
        return self._run(one({"op": "retry", "job_id": job_id}, "job"))

    def set_pool(self, pool: str, *, key: str | None = None, job_id: int | None = None,
                 cron: str | None = None) -> int:
        """Move a key's waiting jobs (or one waiting job, or a cron) to another worker
        pool: an operator's action, logged by the daemon. Returns how many moved."""
        return self._run(one(clientops.set_pool(pool, key, job_id, cron), "moved"))

    def jobs(self, state: str | None = None, limit: int = 100, *, func: Callable[..., Any] | str | None = None,
             key: str | None = None, pool: str | None = None) -> list[dict[str, Any]]:
        return self._run(one(clientops.jobs(state, limit, func, key, pool), "jobs"))

    def stats(self, detail: bool = False) -> dict[str, Any]:
        """Counts, workers, scheduler, network; with detail, also running jobs, dead letters,
        the oldest waits and the last hour's history (what `queick status` shows)."""
        return self._run(one({"op": "stats", "detail": True} if detail else {"op": "stats"}))

    def crons(self) -> list[dict[str, Any]]:
        return self._run(one({"op": "crons"}, "crons"))

    def cron_delete(self, name: str) -> None:
        self._run(one({"op": "cron_delete", "name": name}))

    # --- tasks ---------------------------------------------------------------------------------
    task = tasks.queue_task
    """`@q.task` or `@q.task(**options)` on a function at the top level of a module: a Task,
    still the function when called, whose .enqueue(...) queues a call of it with these
    options (any of enqueue's). Connects to nothing."""

    def _sync_queue(self) -> JobQueue:
        return self

    def _async_queue(self) -> Any:
        """An AsyncJobQueue at this queue's address, for its tasks' `aenqueue`: made once
        (again if the address or token changed), asyncio imported only then."""
        twin = self.__dict__.get("_twin")
        if twin is None or (twin.host, twin.port, twin.token, twin.tls) != (self.host, self.port, self.token, self.tls):
            from .aclient import AsyncJobQueue

            twin = self._twin = AsyncJobQueue(self.host, self.port, token=self.token, timeout=self.timeout,
                                              connect_timeout=self.connect_timeout, tls=self.tls)
            twin._transport, twin.server_info = self._transport, self.server_info  # immediate mode: no socket
        return twin

    # --- workflows ----------------------------------------------------------------------------
    def workflow(self, name: str) -> WorkflowBuilder:
        """A builder for a workflow run: .then(...).for_each(...).budget(...).start(state)."""
        return WorkflowBuilder(self, name, func_name)

    def workflow_get(self, run_id: int) -> dict[str, Any]:
        """The run's status: state, data (the state object) and its size, step, jobs, budget."""
        return self._run(one({"op": "workflow_get", "run_id": run_id}, "run"))

    def workflow_wait(self, run_id: int, timeout: float = 30.0) -> dict[str, Any]:
        """Block until the run ends (any state but running) or timeout seconds pass.
        Returns its status; raises TimeoutError if it is still running."""
        return self._run(clientops.workflow_wait(run_id, timeout, self.timeout))

    def workflow_cancel(self, run_id: int) -> dict[str, Any]:
        return self._run(one({"op": "workflow_cancel", "run_id": run_id}, "run"))

    def workflows(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self._run(one(clientops.workflows(state, limit), "runs"))
