"""The queue's front door: its operations, independent of the transport.

Every transport (the TCP server, HTTP webhooks and pages, Queick 1.2.1 clients) goes in
through these and nothing else; it frames requests and renders replies (a refusal's:
api/replies.py). Validation comes from protocol.py, submissions go to the committer, state
changes to the store, and the components that must react (pool, scheduler, waiters) are
told. Blocking methods touch the store and are called from the transports' threads.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import collector
from ..core import arguments, protocol
from ..core.cron import parse_schedule
from ..core.job import Job, NewJob, State
from ..core.policy.resources import NO_RESOURCES, Resources, budget_view
from ..core.protocol import Code, QueueError
from ..core.workflow import model as wf_model
from ..run.loader import FunctionLoader
from ..services import served as served_mod
from ..services.batcher import Answer, Done, Requests, SubmitBatcher
from ..services.netcheck import NetworkMonitor
from ..services.scheduler import Scheduler
from ..services.served import ServedPools
from ..services.worker import WorkerPool
from ..store import CronRecord, Store
from ..store.contract.fleet import FleetStore
from ..store.records import EventState, NewEvent
from ..ui import status
from ..ui.metrics import Metrics
from ..version import __version__
from .replies import NotCommittedError
from .tokens import Tokens
from .wfops import WorkflowOps

log = logging.getLogger("queickd.service")


RATE_KEYS_SHOWN = 50  # rate keys a stats reply lists (core/policy/rates.py), by key
FAIR_KEYS_SHOWN = 20  # fair keys a stats reply lists (core/policy/fair.py), most waiting first

class Waiters:
    """Callbacks waiting for jobs to reach a final state. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[int, list[Callable[[], None]]] = {}

    def add(self, job_id: int, callback: Callable[[], None]) -> None:
        with self._lock:
            self._by_job.setdefault(job_id, []).append(callback)

    def discard(self, job_id: int, callback: Callable[[], None]) -> None:
        with self._lock:
            cbs = self._by_job.get(job_id)
            if cbs and callback in cbs:
                cbs.remove(callback)
                if not cbs:
                    del self._by_job[job_id]

    def notify_all(self) -> None:
        with self._lock:
            cbs = [cb for cbs in self._by_job.values() for cb in cbs]
            self._by_job.clear()
        for cb in cbs:
            cb()

    def notify(self, job_ids: list[int]) -> None:
        with self._lock:
            if not self._by_job:
                return
            cbs = [cb for i in job_ids for cb in self._by_job.pop(i, ())]
        for cb in cbs:
            cb()


class QueueService(WorkflowOps):
    def __init__(
        self,
        store: Store,
        batcher: SubmitBatcher,
        loader: FunctionLoader,
        scheduler: Scheduler,
        pool: WorkerPool,
        *,
        tokens: Tokens | None = None,
        clock: Callable[[], float] = time.time,
        network: NetworkMonitor | None = None,
        metrics: Metrics | None = None,
        resources: Resources = NO_RESOURCES,
        workflows: dict[str, dict[str, Any]] | None = None,
        workflow_budget: dict[str, int] | None = None,
    ) -> None:
        self.store = store
        self.batcher = batcher
        self.loader = loader
        self.scheduler = scheduler
        self.pool = pool
        self.tokens = tokens  # None: no token asked (no --token-file)
        self.clock = clock
        self.network = network
        self.metrics = metrics
        # Per-function job defaults and the budgets in force, applied to every job; replaced
        # whole (never changed in place) when another process writes the budgets.
        self.resources = resources
        self.waiters = Waiters()
        self.workflows = workflows or {}  # [workflows.NAME] of the config file: started by name
        # The operator's run budgets: each run's where its definition names none, and the
        # most a client's definition may ask.
        self.workflow_budget = wf_model.DEFAULT_BUDGET if workflow_budget is None else workflow_budget
        self.run_waiters = Waiters()  # by run id; woken by every finish of a step job
        self.started_at = clock()
        # The pools a live worker serves, as last seen (the daemon keeps it current).
        self.served = ServedPools()
        # With an [upstream]: api/edge.py's Edge, the jobs routed there (not imported here: it
        # reaches the Python client, which imports this module for its immediate mode).
        self.edge: Any = None

    # --- in the event loop: cheap, no store access ------------------------------------------
    def hello(self, req: dict[str, Any]) -> dict[str, Any]:
        """The hello reply; with tokens, its `token_name` is the name the token was given."""
        reply = {"ok": True, "server": "queickd", "version": __version__, "protocol": protocol.VERSION}
        if self.tokens is not None:
            name = self.tokens.identify(req.get("token"))
            if name is None:
                raise QueueError(Code.UNAUTHORIZED, "bad or missing token")
            reply["token_name"] = name
        return reply

    def prepare_jobs(self, req: dict[str, Any]) -> list[NewJob]:
        """Validate an enqueue/enqueue_many request and check the allowlist."""
        now = self.clock()
        jobs = [protocol.parse_job(req, now)] if req["op"] == "enqueue" else protocol.parse_jobs(req, now)
        if self.edge is not None:
            jobs = self.edge.route(jobs)
        for j in jobs:
            if not j.held:  # a held job runs upstream, which checks it
                self.loader.check(j.func)
        if self.resources.active:
            jobs = self._resourced(jobs)
        return jobs

    def _resourced(self, jobs: list[NewJob]) -> list[NewJob]:
        apply = self.resources.apply
        if len(jobs) == 1:
            return [apply(jobs[0])]
        out = []
        for i, j in enumerate(jobs):
            try:
                out.append(apply(j))
            except QueueError as e:
                raise protocol.bad(f"jobs[{i}]: {e.message}") from None
        return out

    def enqueue_warnings(self, jobs: list[NewJob]) -> list[str]:
        """What an enqueue's reply adds for these (accepted) jobs: one line per pool no live
        worker serves, whose jobs wait until one does. A set lookup per job; no store access."""
        if len(jobs) == 1 and self.served.serves(jobs[0].pool):  # the usual enqueue
            return []
        unserved = self.served.unserved({j.pool: None for j in jobs})
        for pool in unserved:
            log.warning("accepted job(s) for pool %r, which no live worker serves: they wait until one does", pool)
        return [served_mod.warning(p) for p in unserved]

    def prepare_job(self, spec: dict[str, Any]) -> NewJob:
        """Validate one job's fields (an enqueue request without its op) and check the allowlist."""
        return self.prepare_jobs({**spec, "op": "enqueue"})[0]

    # --- submitting: the one way jobs come in ------------------------------------------------
    def enqueue(self, requests: Requests, done: Done, *, inline: bool = False) -> None:
        """Submit prepared requests (each a list of jobs, admitted all or nothing) to the next
        group commit. `done` gets one answer per request, its Submitted list or its Refusal,
        or the exception that kept them all out (see SubmitBatcher.submit for the thread)."""
        self.batcher.submit(requests, done, inline=inline)

    def enqueue_all(self, items: Sequence[tuple[Requests, Done]], *, inline: bool = False) -> None:
        """enqueue() for several submissions at once (one event-loop pass of every connection):
        they join the same group commit."""
        self.batcher.submit_all(items, inline=inline)

    def enqueue_wait(self, requests: Requests, timeout: float) -> list[Answer]:
        """enqueue() for a thread that may block: the answers once committed. NotCommittedError
        if the commit failed or did not finish within `timeout` seconds (then the requests
        still wait for their commit: maybe_committed)."""
        finished = threading.Event()
        result: list[list[Answer] | BaseException] = []

        def committed(r: list[Answer] | BaseException) -> None:  # the committer's thread
            result.append(r)
            finished.set()

        self.enqueue(requests, committed)
        if not finished.wait(timeout):
            raise NotCommittedError("the commit did not finish in time", maybe_committed=True)  # still queued
        if isinstance(result[0], BaseException):
            raise NotCommittedError(str(result[0])) from result[0]
        return result[0]

    # --- blocking: store access -------------------------------------------------------------
    def call(self, req: dict[str, Any]) -> dict[str, Any]:
        return getattr(self, "op_" + req["op"])(req)

    def job(self, job_id: int) -> Job:
        """The job, or QueueError(not_found)."""
        job = self.store.get(job_id)
        if job is None:
            raise QueueError(Code.NOT_FOUND, f"no job {job_id}")
        return job

    def health(self) -> tuple[bool, str]:
        """(healthy, reason): the store answers a read, can still make writes durable, and
        the scheduler thread is alive."""
        try:
            self.store.counts()
        except Exception as e:
            return False, f"store does not answer: {type(e).__name__}: {e}"
        lost = self.store.durability_lost()
        if lost is not None:
            return False, f"{lost}; no write is acknowledged as stored until the daemon restarts"
        if not self.scheduler.alive:
            return False, "scheduler thread is not running"
        return True, "ok"

    def op_get(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self.job(arguments.job_id(req))
        if job.state == State.FORWARDED and self.edge is not None:
            return {"ok": True, "job": self.edge.view.show(job)}
        return {"ok": True, "job": job.to_dict()}

    def op_cancel(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("job_id") is None and req.get("state") is not None:
            return self._cancel_bulk(req)
        job_id = arguments.job_id(req)
        job = self.store.cancel(job_id, self.clock())
        if job is not None and job.state == State.RUNNING:
            # Cancelled in the store at once; its run's outcome is discarded when it ends.
            job = self.store.cancel_running(job_id, self.clock())
            if job is not None and job.state == State.CANCELLED:
                log.warning("operator cancelled job %d (%s) while it ran", job_id, job.func)
                self.pool.cancel_running(job_id)
                self.pool.wake()  # its key is free
        if job is None:
            raise QueueError(Code.NOT_FOUND, f"no job {job_id}")
        if job.state != State.CANCELLED:
            raise QueueError(Code.CONFLICT, f"job {job_id} is {job.state} and cannot be cancelled")
        self.waiters.notify([job_id])
        return {"ok": True, "job": job.to_dict()}

    def _cancel_bulk(self, req: dict[str, Any]) -> dict[str, Any]:
        """Every waiting job of one state matching the filters; with dry_run, only their count."""
        state = arguments.state_filter(req)
        if state not in State.PENDING:
            raise QueueError(Code.BAD_REQUEST, f"bulk cancel takes a waiting state: {', '.join(State.PENDING)}")
        filters = arguments.job_filters(req)
        if req.get("dry_run") is True:
            n = len(self.store.list_jobs(state, protocol.MAX_BATCH, **filters))
            return {"ok": True, "cancelled": 0, "matching": n}
        ids = self.store.cancel_waiting(state, self.clock(), **filters)  # type: ignore[arg-type]
        log.warning("operator cancelled %d %s job(s) (%s)", len(ids), state,
                    ", ".join(f"{k} {v}" for k, v in filters.items() if v is not None) or "all")
        self.waiters.notify(ids)
        self.pool.wake()
        return {"ok": True, "cancelled": len(ids), "matching": len(ids)}

    def op_event(self, req: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        event_id, job = protocol.parse_event(req, now)
        self.loader.check(job.func)
        job = self.resources.apply(job)
        acc = self.store.accept_event(NewEvent(event_id, job), now, self.batcher.admission)
        if acc.state == EventState.DELIVERED and not acc.duplicate:
            self.pool.wake()
        elif acc.state == EventState.PENDING:
            self.scheduler.wake_at(now, "events")
        reply: dict[str, Any] = {"ok": True, "event_id": event_id, "state": acc.state, "job_id": acc.job_id}
        if acc.duplicate:
            reply["duplicate"] = True
        return reply

    def op_dead(self, req: dict[str, Any]) -> dict[str, Any]:
        n = arguments.limit(req)
        return {"ok": True, "jobs": [j.to_listing() for j in self.store.list_jobs(State.DEAD, n)],
                "events": [e.to_dict() for e in self.store.list_events(EventState.DEAD, n)]}

    def op_purge(self, req: dict[str, Any]) -> dict[str, Any]:
        state = req.get("state", State.DEAD)
        if state not in State.FINAL:
            raise QueueError(Code.BAD_REQUEST, f"state must be one of {', '.join(State.FINAL)}")
        older = protocol.number(req, "older_than", 0, protocol.LATEST)
        if older is None:
            raise QueueError(Code.BAD_REQUEST, "older_than (seconds, 0 or more) is required")
        cutoff, total = self.clock() - older, 0
        while (n := self.store.purge([state], cutoff, 1000)) > 0:  # small transactions
            total += n
        return {"ok": True, "purged": total}

    def op_pause(self, req: dict[str, Any]) -> dict[str, Any]:
        """An operator's pause: no probe, until resume."""
        kind, name = arguments.pause_target(req)
        new = self.store.pause(kind, name, self.clock())
        log.warning("operator paused %s %r; its jobs wait until 'queick resume'", kind, name)
        return {"ok": True, "paused": new}

    def op_drain(self, req: dict[str, Any]) -> dict[str, Any]:
        """Stop claiming (or with off, claim again); with wait, wait up to that many seconds
        (at most 60 per request) for this daemon's running jobs to end."""
        if req.get("off") is True:
            self.pool.drain(False)
            log.warning("operator ended the drain: claiming again")
            return {"ok": True, "draining": False, "running": self.pool.busy, "idle": self.pool.busy == 0}
        wait = protocol.number(req, "wait") or 0.0
        if not 0 <= wait <= 60:
            raise QueueError(Code.BAD_REQUEST, "wait must be 0 to 60 seconds")
        if not self.pool.draining:
            self.pool.drain(True)
            log.warning("operator began a drain: no new jobs start here; %d running", self.pool.busy)
        idle = self.pool.wait_drained(wait)
        return {"ok": True, "draining": True, "running": self.pool.busy, "idle": idle}

    def op_resume(self, req: dict[str, Any]) -> dict[str, Any]:
        if not any(req.get(k) is not None for k in ("key", "func", "pool")):
            raise QueueError(Code.BAD_REQUEST, "give the key or the func to resume")
        kind, name = arguments.pause_target(req)
        if not self.store.resume(kind, name):
            raise QueueError(Code.NOT_FOUND, f"{kind} {name!r} is not paused")
        self.pool.wake()
        return {"ok": True}

    def op_retry(self, req: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        if req.get("all") is True:
            n = self.store.retry_all_dead(now)
            self.pool.wake()
            self.scheduler.wake_at(now, "events")
            return {"ok": True, "retried": n}
        if req.get("event_id") is not None:
            event_id = protocol.opt_str(req, "event_id")
            ev = self.store.retry_event(event_id, now)
            if ev is None:
                raise QueueError(Code.NOT_FOUND, f"no event {event_id!r}")
            if ev.state != EventState.PENDING:
                raise QueueError(Code.CONFLICT, f"event {event_id!r} is {ev.state}; only dead events are retried")
            self.scheduler.wake_at(now, "events")
            return {"ok": True, "event": ev.to_dict()}
        job_id = arguments.job_id(req)
        before = self.job(job_id)
        if before.state != State.DEAD:
            raise QueueError(Code.CONFLICT, f"job {job_id} is {before.state}; only dead jobs are retried")
        if self.edge is not None and self.edge.forwarder.route(before.func):  # it never runs here
            raise QueueError(Code.CONFLICT, f"job {job_id} is for the upstream: enqueue it again, or retry it there")
        job = self.store.retry_dead(job_id, self.clock())
        self.waiters.notify([job_id])
        self.pool.wake()
        return {"ok": True, "job": job.to_dict()}

    def op_jobs(self, req: dict[str, Any]) -> dict[str, Any]:
        jobs = self.store.list_jobs(arguments.state_filter(req), arguments.limit(req), **arguments.job_filters(req))
        return {"ok": True, "jobs": [j.to_listing() for j in jobs]}

    def op_stats(self, req: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        crons = self.store.cron_list()
        reply = {
            "ok": True,
            "version": __version__,
            "store": self.store.url,
            "uptime": round(now - self.started_at, 3),
            "counts": self.store.counts(),
            "workers": {"total": self.pool.workers, "busy": self.pool.busy, "stopping": self.pool.stopping,
                        **self.pool.size_info()},
            "draining": self.pool.draining,
            "store_problem": self.store.durability_lost(),  # None while writes are safe
            "enqueued": self.batcher.jobs,
            "commits": self.batcher.commits,
            "completed": self.pool.completed,
            "failed": self.pool.failed,
            "scheduler": {"alive": self.scheduler.alive, "last_fired_at": self.scheduler.last_fired_at},
            "crons": len(crons),
            "crons_folded": sum(c.folded for c in crons),
            "refused": self.batcher.refused,
            "paused": [p.to_dict() for p in self.store.pauses()],
            "waiting_by_key": [{"key": k, "waiting": n, "oldest_run_at": t}
                               for k, n, t in self.store.waiting_by_key(10)],
            "events": self.store.event_counts(),
            "workflows": self.store.workflow_counts(),  # runs by state, budget stops by budget
            "network": self.network.snapshot() if self.network is not None else None,
            "budgets": self.budgets(),
            "rate_keys": [k.to_dict() for k in self.store.rate_keys(now)[:RATE_KEYS_SHOWN]],
            "fair_keys": [k.to_dict() for k in self.store.fair_keys(FAIR_KEYS_SHOWN) if k.waiting],
            "memory": self.pool.memory.snapshot() if self.pool.memory is not None else None,
            "sandbox": self.metrics.sandbox_stats() if self.metrics is not None else None,
            "progress": self.metrics.progress_stats() if self.metrics is not None else None,
            # Running jobs marked stalled, whichever host runs them; this process's own finds.
            "liveness": {"stalled": self.store.count_stalled(),
                         **((self.metrics.liveness_stats() if self.metrics is not None else None) or {})},
            "collector": collector.snapshot(),
            "tokens": self.tokens.snapshot() if self.tokens is not None else None,
            "upstream": self.edge.forwarder.snapshot() if self.edge is not None else None,
        }
        reply.update(self._fleet_stats(reply["counts"]))
        if isinstance(self.store, FleetStore):  # the jobs applications enqueued themselves
            reply["direct"] = self.store.direct_counts()
        minutes = self.store.minutes(status.first_minute(now))  # whoever ran them: the fleet's
        # A single-host store's only member is this daemon: the others in its counts are
        # this store's earlier daemons, gone (their runs count in the totals alone).
        live = None if isinstance(self.store, FleetStore) else {self.pool.member}
        reply["last_hour"] = status.last_hour(minutes, live)
        if req.get("detail"):  # running jobs, dead letters, oldest waits, the last hour
            reply.update(status.detail(self.store, self.metrics, now, reply["counts"], minutes))
        return reply

    def budgets(self) -> list[dict[str, Any]]:
        """Each budget in force: its limit, the cost running against it, the cost waiting.
        Read from the store where it keeps them (PostgreSQL: whichever process wrote them),
        not from the copy enqueue checks use, which follows them a notification later."""
        limits = self.store.budgets_in_force(self.resources.limits)
        if not limits.any:
            return []
        usage = self.store.budget_usage(sorted(limits.pools), sorted(limits.groups))
        return budget_view(limits, usage)

    def _fleet_stats(self, counts: dict[str, int]) -> dict[str, Any]:
        """Pools (waiting jobs, live worker slots), jobs running without a live worker and,
        in a shared store, every registered worker: host, pid, pools, version, alive, and
        why it refused to claim if it did."""
        from ..services.fleet import pools_view

        store = self.store
        registry: list[dict[str, Any]] | None = None
        if isinstance(store, FleetStore):  # shared store: by the worker registry
            registry = store.workers()
            self.served.from_registry(registry)  # read anyway: the enqueue check's view too
            without = store.running_without_worker()
        else:  # this daemon is the only worker: the running jobs it does not hold
            without = self.pool.running_elsewhere(lambda: store.counts().get(State.RUNNING, 0))
        return {"pools": pools_view(self.store, self.pool.pools, self.pool.workers, registry),
                "fleet": registry, "running_without_worker": without}

    def op_set_pool(self, req: dict[str, Any]) -> dict[str, Any]:
        kind, name, pool = arguments.pool_target(req)
        moved = self.store.set_pool(kind, name, pool)
        # An operator's reallocation of resources: always on the record.
        log.warning("operator moved %s %r to pool %r (%d job(s)/cron(s) moved)", kind, name, pool, moved)
        self.pool.wake()
        return {"ok": True, "moved": moved}

    def op_cron(self, req: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        name, schedule, template = protocol.parse_cron(req, now)
        self.loader.check(template.func)
        template = self.resources.apply(template)
        old = next((c for c in self.store.cron_list() if c.name == name), None)
        if old is not None and _same_timing(old.schedule, schedule, req):
            # Registered again as it was (a script that registers its crons at every start):
            # it keeps its timing, or an interval registered more often than it fires never would.
            cron = self.store.cron_save(dataclasses.replace(old, template=template))
            return {"ok": True, "cron": cron.to_dict()}
        start = schedule.get("start_at")
        # A start time that is now (give or take the client's clock) fires at once.
        first = start if start is not None and start >= now - 1.0 else parse_schedule(schedule).next_after(now)
        cron = self.store.cron_save(CronRecord(name, schedule, template, first, None, now))
        self.scheduler.wake_at(first, "crons")
        return {"ok": True, "cron": cron.to_dict()}

    def op_crons(self, req: dict[str, Any]) -> dict[str, Any]:  # each with its `folded` count
        return {"ok": True, "crons": [c.to_dict() for c in self.store.cron_list()]}

    def op_cron_delete(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req.get("name")
        if not isinstance(name, str):
            raise QueueError(Code.BAD_REQUEST, "name must be a string")
        if not self.store.cron_delete(name):
            raise QueueError(Code.NOT_FOUND, f"no cron named {name!r}")
        return {"ok": True}


def _same_timing(old: dict[str, Any], new: dict[str, Any], req: dict[str, Any]) -> bool:
    """Whether a cron registered again asks for the timing it has: the same expression, or
    the same interval without a start time of its own (one is made up from the clock)."""
    if "cron" in new:
        return old.get("cron") == new["cron"]
    return req.get("start_at") is None and old.get("every") == new["every"]
