"""Immediate mode (`JobQueue.immediate()`): a JobQueue with no daemon and no socket, for a
user's unit tests (docs/how-to/testing.md says what holds, and what does not).

The JobQueue builds its requests and reads its replies as it always does; only its
transport is this one. Each request is encoded and decoded as on the wire (so what a daemon
would refuse is refused here) and answered by a QueueService of this process over a memory
store; then what became due runs in the calling thread through the daemon's own parts: the
worker pool's passes and its in-thread runner, core.fate, the workflow engine, the
scheduler's promotion and cron firing, admission with the daemon's default limits, and
the breaker. Time is the queue's own clock (VirtualClock), moved only by the queue: to the
next retry or pause probe when nothing else can run, by `advance`, and by a wait, up to
its timeout. Jobs run one at a time in the calling thread, whatever isolation they ask for.

Never opens a socket or a file of its own, and starts no process; its one thread is the
event loop's that awaits async jobs (run/aio.py), started with the first, while the calling
thread waits. Safe from several threads: one request at a time (a lock, re-entered by a
job's own requests, an async job's included).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .api.replies import answer_reply, refused
from .api.service import QueueService
from .api.waits import WAIT_MAX, timeout_of
from .core import arguments, protocol
from .core.job import Outcome, State
from .core.protocol import Code, QueueError
from .run.loader import FunctionLoader
from .run.thread import ThreadRunner
from .services import progress
from .services.batcher import SubmitBatcher
from .services.pool_config import PoolConfig, PoolHooks
from .services.scheduler import Scheduler
from .services.worker import WorkerPool
from .settings import Config
from .store import open_store

log = logging.getLogger("queickd.immediate")


class VirtualClock:
    """The immediate queue's wall time: callable like time.time, and moved only by the queue."""

    def __init__(self, start: float) -> None:
        self._now = start

    def __call__(self) -> float:
        return self._now

    def move_to(self, t: float) -> None:
        """Never backwards."""
        self._now = max(self._now, t)


class ImmediateTransport:
    """What a JobQueue sends its requests to in immediate mode (`exchange`), in this process."""

    def __init__(self, app_dir: str = ".", allow: Sequence[str] = (), *, start: float | None = None,
                 sleep: Callable[[float], None] | None = None,
                 workflows: dict[str, dict[str, Any]] | None = None) -> None:
        """app_dir and allow: what may run, as the daemon's --app-dir and --allow (the app
        directory goes first on sys.path). start: the clock's first reading (default: now).
        sleep: called with each time the clock moves by (default: none; time.sleep sleeps
        it). workflows: the config file's [workflows.NAME] definitions, started by name."""
        defaults = Config()
        self.clock = VirtualClock(time.time() if start is None else start)
        self._sleep = sleep
        self._retries: list[tuple[float, int]] = []  # (run_at, job id) of the retries scheduled
        self.loader = loader = FunctionLoader(app_dir, allow)
        self.store = store = open_store("memory://")
        runner = ThreadRunner(loader)
        runner.progress = self._progress  # a job's queickd.progress(), stored as it comes
        self.pool = WorkerPool(store, loader, PoolConfig(1, pause_after=defaults.pause_after,
                                                         pause_cooldown=defaults.pause_cooldown),
                               PoolHooks(on_finished=self._finished), clock=self.clock, runner=runner)
        self.scheduler = Scheduler(store, self.pool.wake, clock=self.clock)
        # Never started: with no committer thread, every submit commits in the caller's thread.
        batcher = SubmitBatcher(store, clock=self.clock, admission=defaults.admission)
        self.service = QueueService(store, batcher, loader, self.scheduler, self.pool, clock=self.clock,
                                    workflows=workflows)
        for name in workflows or {}:  # one that could never start is refused now, as at a daemon's start
            self.service.resolve_definition(None, name)
        self._lock = threading.RLock()
        self._depth = 0  # requests under way in this thread: more than one, a job's own

    def attach(self, queue: Any) -> Any:
        """Make `queue` (a new JobQueue) send its requests here; returns it."""
        queue._transport = self
        # A wait is answered in one request, holding its whole timeout (of this clock).
        queue.timeout = WAIT_MAX + 5.0
        queue.server_info = self.service.hello({})
        return queue

    # --- the transport ----------------------------------------------------------------------
    def exchange(self, reqs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The replies to `reqs`, in order, each once what it made due has run."""
        # An async job runs on the runner's loop thread while the thread that holds the lock
        # waits for it: its requests are that thread's, as a thread job's are.
        own = self._depth > 0 and self.pool.runner.loop.on_loop()  # type: ignore[attr-defined]
        with contextlib.nullcontext() if own else self._lock:
            self._depth += 1
            try:
                return [self._one(req) for req in reqs]
            finally:
                self._depth -= 1

    def _one(self, req: dict[str, Any]) -> dict[str, Any]:
        line = protocol.encode(req)
        try:
            if len(line) > protocol.MAX_LINE + 1:
                raise QueueError(Code.BAD_REQUEST, f"request line longer than {protocol.MAX_LINE} bytes")
            req = protocol.decode_line(line[:-1])
            reply = self._answer(req)
        except TimeoutError:
            raise
        except Exception as e:  # a QueueError, or a bug: an error reply, as from a daemon
            if not isinstance(e, QueueError):
                log.error("internal error serving a request", exc_info=e)
            reply = refused(e).json()
        if self._depth == 1:
            self._settle()
        return protocol.decode_reply(protocol.encode(reply))

    def _answer(self, req: dict[str, Any]) -> dict[str, Any]:
        op, svc = req["op"], self.service
        if op == "hello":
            return svc.hello(req)
        if op in ("enqueue", "enqueue_many"):
            got: list[Any] = []
            svc.enqueue([svc.prepare_jobs(req)], got.append, inline=True)  # answered before it returns
            if isinstance(got[0], BaseException):
                raise got[0]
            return answer_reply(got[0][0], op == "enqueue_many")
        if op == "wait":
            return self._wait(req)
        if op == "workflow_wait":
            return self._workflow_wait(req)
        return svc.call(req)

    def _wait(self, req: dict[str, Any]) -> dict[str, Any]:
        job_id, states = arguments.job_id(req), arguments.states(req)
        self._until(req, lambda: self.service.job(job_id).state in states,
                    lambda: f"job {job_id} is still {self.service.job(job_id).state}")
        return {**self.service.op_get({"job_id": job_id}), "timed_out": False}

    def _workflow_wait(self, req: dict[str, Any]) -> dict[str, Any]:
        run_id = arguments.run_id(req)
        self._until(req, lambda: self.service.workflow_state(run_id) != "running",
                    lambda: f"workflow run {run_id} is still running")
        return {**self.service.op_workflow_get({"run_id": run_id}), "timed_out": False}

    def _until(self, req: dict[str, Any], ended: Callable[[], bool], still: Callable[[], str]) -> None:
        """A wait: returns once ended(), its timeout passing on the clock meanwhile, running
        what comes due; TimeoutError naming still() if it has not ended by then. Not from
        inside a job: what it waits for runs after it."""
        if ended():
            return
        if self._depth == 1:  # to the millisecond: the client sends what is left on its own clock
            self._settle(until=self.clock() + round(timeout_of(req), 3), ended=ended)
        if not ended():
            raise TimeoutError(f"{still()} after {self._waited(req)} of the immediate queue's clock")

    def _waited(self, req: dict[str, Any]) -> str:
        if self._depth > 1:
            return "0 s (a job waiting for a job: in immediate mode that job runs once this one has returned)"
        return f"{round(timeout_of(req), 3):g} s"

    # --- time -------------------------------------------------------------------------------
    def advance(self, seconds: float) -> float:
        """Move the clock on by `seconds`, running what comes due on the way, in order of
        its time. Returns the clock's time after."""
        if not seconds >= 0:
            raise ValueError("seconds must be 0 or more: the queue's clock never goes back")
        with self._lock:
            if self._depth:
                raise RuntimeError("advance() from inside a job of the same immediate queue")
            self._settle(until=self.clock() + seconds)
            return self.clock()

    def _settle(self, until: float | None = None, ended: Callable[[], bool] = lambda: False) -> None:
        """Run what is due; move the clock to the next retry or pause probe and run again,
        until none is left. With `until`, the clock also stops at each delayed job's and
        cron's time up to `until`, and ends at `until` unless ended() first."""
        while True:
            self.scheduler.run_due()
            ran = self.pool.run_here()
            if ended():
                return
            nxt = self._next_time(until)
            if nxt is None or (nxt <= self.clock() and not ran):
                return
            now = self.clock()
            if nxt > now and self._sleep is not None:
                self._sleep(nxt - now)
            self.clock.move_to(nxt)

    def _progress(self, job_id: int, attempt: int, done: float, total: float | None, note: str | None,
                  at: float) -> None:
        """A job's queickd.progress(): a memory store's write costs no more than the batching
        would, so it is stored at once (the job has dropped repeats already)."""
        self.store.set_progress_if_running([(job_id, attempt, progress.record(attempt, done, total, note, at))])

    def _finished(self, outcomes: list[Outcome]) -> None:
        """The pool's runs ended (its thread: the caller's): their retries, as the daemon's
        scheduler is told of them."""
        for o in outcomes:
            if o.state == State.SCHEDULED and o.run_at is not None:
                heapq.heappush(self._retries, (o.run_at, o.job_id))

    def _next_retry(self) -> float | None:
        """The time of the first retry still scheduled (one run, cancelled or moved since is dropped)."""
        while self._retries:
            run_at, job_id = self._retries[0]
            job = self.store.get(job_id)
            if job is not None and job.state == State.SCHEDULED and job.run_at == run_at:
                return run_at
            heapq.heappop(self._retries)
        return None

    def _next_time(self, until: float | None) -> float | None:
        """When something may next run: a retry or a pause's probe (whenever), and with
        `until`, a delayed job or a cron tick up to it, or `until` itself."""
        store = self.store
        times = [t for t in (self._next_retry(),) if t is not None]
        if store.counts()[State.QUEUED]:  # left waiting: perhaps under a pause, whose probe lets one through
            times += [p.probe_at for p in store.pauses() if p.probe_at is not None]
        if until is not None:
            later = (store.next_scheduled_at(), store.next_cron_at())
            times += [t for t in later if t is not None and t <= until]
            if self.clock() < until:
                times.append(until)
        return min(times, default=None)
