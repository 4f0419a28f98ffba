"""In-memory store (`memory://`): the contract without durability, for tests and benchmarks.

Everything is lost when the process exits. One lock guards all state; heaps keep queue
order and are cleaned lazily (an entry whose job has moved on is skipped when popped).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
from collections.abc import Sequence

from ..job import Job, NewJob, Outcome, State, Submitted
from .base import CronRecord, Recovered


class MemoryStore:
    supports_notify = False

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._queued: list[tuple[int, float, int]] = []  # (priority, run_at, id)
        self._scheduled: list[tuple[float, int]] = []  # (run_at, id)
        self._idem: dict[str, int] = {}
        self._crons: dict[str, CronRecord] = {}

    # --- helpers (lock held) -------------------------------------------------------------
    def _put(self, job: Job) -> None:
        self._jobs[job.id] = job
        if job.state == State.QUEUED:
            heapq.heappush(self._queued, (job.priority, job.run_at, job.id))
        elif job.state == State.SCHEDULED:
            heapq.heappush(self._scheduled, (job.run_at, job.id))

    def _insert(self, new: NewJob, now: float) -> Submitted:
        if new.idempotency_key is not None and new.idempotency_key in self._idem:
            old = self._jobs[self._idem[new.idempotency_key]]
            return Submitted(old.id, old.state, duplicate=True)
        job_id = next(self._ids)
        state = State.QUEUED if new.run_at <= now else State.SCHEDULED
        self._put(
            Job(
                id=job_id, func=new.func, args=list(new.args), kwargs=dict(new.kwargs),
                state=state, priority=new.priority, run_at=new.run_at, created_at=now,
                attempts=0, max_attempts=new.max_attempts, retry=new.retry,
                retry_on_network=new.retry_on_network, key=new.key,
                idempotency_key=new.idempotency_key, cron=new.cron, orphaned=0,
                started_at=None, finished_at=None, result=None, error=None,
            )
        )
        if new.idempotency_key is not None:
            self._idem[new.idempotency_key] = job_id
        return Submitted(job_id, state)

    # --- submit ---------------------------------------------------------------------------
    def submit(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        with self._lock:
            return [self._insert(j, now) for j in jobs]

    # --- schedule -------------------------------------------------------------------------
    def promote_due(self, now: float) -> int:
        n = 0
        with self._lock:
            while self._scheduled and self._scheduled[0][0] <= now:
                run_at, job_id = heapq.heappop(self._scheduled)
                job = self._jobs.get(job_id)
                if job and job.state == State.SCHEDULED and job.run_at == run_at:
                    self._put(dataclasses.replace(job, state=State.QUEUED))
                    n += 1
        return n

    def next_scheduled_at(self) -> float | None:
        with self._lock:
            while self._scheduled:
                run_at, job_id = self._scheduled[0]
                job = self._jobs.get(job_id)
                if job and job.state == State.SCHEDULED and job.run_at == run_at:
                    return run_at
                heapq.heappop(self._scheduled)
            return None

    # --- claim ----------------------------------------------------------------------------
    def claim_available(self, limit: int, now: float, network_up: bool = True) -> list[Job]:
        out: list[Job] = []
        passed_over: list[tuple[int, float, int]] = []
        with self._lock:
            while self._queued and len(out) < limit:
                entry = heapq.heappop(self._queued)
                job = self._jobs.get(entry[2])
                if job is None or job.state != State.QUEUED or (job.priority, job.run_at) != entry[:2]:
                    continue  # a stale entry: the job moved on (or was re-queued at another time)
                if job.retry_on_network and not network_up:
                    passed_over.append(entry)
                    continue
                job_id = job.id
                job = dataclasses.replace(
                    job, state=State.RUNNING, attempts=job.attempts + 1, started_at=now
                )
                self._jobs[job_id] = job
                out.append(job)
            for entry in passed_over:
                heapq.heappush(self._queued, entry)
        return out

    # --- network --------------------------------------------------------------------------
    def park_for_network(self, now: float) -> int:
        with self._lock:
            parked = [j for j in self._jobs.values() if j.state == State.QUEUED and j.retry_on_network]
            for j in parked:
                self._put(dataclasses.replace(j, state=State.WAITING_NETWORK))
            return len(parked)

    def release_network_waiting(self, now: float) -> int:
        with self._lock:
            waiting = [j for j in self._jobs.values() if j.state == State.WAITING_NETWORK]
            for j in waiting:
                self._put(dataclasses.replace(j, state=State.QUEUED, run_at=now))
            return len(waiting)

    # --- finish ---------------------------------------------------------------------------
    def finish_if_running(self, outcomes: Sequence[Outcome], now: float) -> int:
        n = 0
        with self._lock:
            for o in outcomes:
                job = self._jobs.get(o.job_id)
                if job is None or job.state != State.RUNNING:
                    continue
                changes: dict = {"state": o.state, "result": o.result, "error": o.error}
                if o.state == State.SCHEDULED:
                    changes["run_at"] = o.run_at
                if o.state in State.FINAL:
                    changes["finished_at"] = now
                if o.state == State.WAITING_NETWORK:
                    changes["attempts"] = job.attempts - 1
                self._put(dataclasses.replace(job, **changes))
                n += 1
        return n

    def recover_orphans(self, max_requeues: int, now: float) -> Recovered:
        requeued, dead = [], []
        with self._lock:
            for job in [j for j in self._jobs.values() if j.state == State.RUNNING]:
                if job.orphaned < max_requeues:
                    self._put(dataclasses.replace(job, state=State.QUEUED, orphaned=job.orphaned + 1))
                    requeued.append(job.id)
                else:
                    err = {"type": "orphaned", "message": "its worker stopped while it ran, too often"}
                    self._put(dataclasses.replace(job, state=State.DEAD, error=err, finished_at=now))
                    dead.append(job.id)
        return Recovered(requeued, dead)

    # --- operator actions -----------------------------------------------------------------
    def cancel(self, job_id: int, now: float) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.state in State.PENDING:
                job = dataclasses.replace(job, state=State.CANCELLED, finished_at=now)
                self._put(job)
            return job

    def retry_dead(self, job_id: int, now: float) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.state == State.DEAD:
                job = dataclasses.replace(
                    job, state=State.QUEUED, run_at=now, attempts=0, orphaned=0, finished_at=None
                )
                self._put(job)
            return job

    # --- inspect --------------------------------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def list_jobs(self, state: str | None, limit: int) -> list[Job]:
        with self._lock:
            jobs = (j for j in reversed(self._jobs.values()) if state is None or j.state == state)
            return list(itertools.islice(jobs, limit))

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(State.ALL, 0)
        with self._lock:
            for j in self._jobs.values():
                out[j.state] += 1
        return out

    # --- cron -----------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        with self._lock:
            self._crons[cron.name] = cron
            return cron

    def cron_list(self) -> list[CronRecord]:
        with self._lock:
            return sorted(self._crons.values(), key=lambda c: c.name)

    def cron_delete(self, name: str) -> bool:
        with self._lock:
            return self._crons.pop(name, None) is not None

    def crons_due(self, now: float) -> list[CronRecord]:
        with self._lock:
            return [c for c in self._crons.values() if c.next_run_at <= now]

    def next_cron_at(self) -> float | None:
        with self._lock:
            return min((c.next_run_at for c in self._crons.values()), default=None)

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> Submitted | None:
        with self._lock:
            cron = self._crons.get(name)
            if cron is None or cron.next_run_at != tick:
                return None
            job = dataclasses.replace(
                cron.template, run_at=now, cron=name, idempotency_key=f"cron:{name}:{tick!r}"
            )
            submitted = self._insert(job, now)
            self._crons[name] = dataclasses.replace(cron, next_run_at=next_tick, last_fired_at=tick)
            return submitted

    def close(self) -> None:
        pass
