"""In-memory store (`memory://`): the contract without durability, for tests and benchmarks.

Everything is lost when the process exits. One lock guards all state; heaps keep queue
order and are cleaned lazily (an entry whose job has moved on is skipped when popped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from ...core.job import Job, NewJob, Outcome, State, Submitted, new_record
from ...core.policy import admission as adm
from ...core.policy import claim, orphans
from ...core.policy import memory as mem
from ...core.policy import pauses as pz
from ..derived import StoreBase
from ..records import CronRecord, Event, EventState, Finished, Minute, Pause, Recovered
from .events import MemoryCronsEvents
from .operator import MemoryOperatorOps, matches
from .resources import MemoryResources
from .undo import ABSENT, Journal, UndoDict
from .workflows import MemoryWorkflows


class MemoryStore(MemoryOperatorOps, MemoryCronsEvents, MemoryResources, MemoryWorkflows, StoreBase):
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.RLock()  # re-entrant: batch() holds it across several calls
        # What a batch can roll back is written to one journal (by the UndoDicts, and for
        # _jobs, the most used, by _put/_drop); heaps and counts are derived from _jobs
        # and rebuilt on a rollback.
        self._journal = Journal()
        self._jobs: dict[int, Job] = {}  # written only by _put/_drop, which journal it
        self._ids = itertools.count(1)
        self._queued: list[tuple[int, float, int]] = []  # (priority, run_at, id)
        self._scheduled: list[tuple[float, int]] = []  # (run_at, id)
        self._idem: dict[str, int] = UndoDict(self._journal)
        self._crons: dict[str, CronRecord] = UndoDict(self._journal)
        self._streaks: dict[tuple[str, str], tuple[int, dict | None]] = UndoDict(self._journal)
        self._pauses: dict[tuple[str, str], Pause] = UndoDict(self._journal)
        self._events: dict[str, tuple[Event, NewJob]] = UndoDict(self._journal)
        self._minutes: dict[tuple[int, str], Minute] = UndoDict(self._journal)
        self._in_batch = False
        # Kept up to date by _put/_drop so admission and stats never scan every job.
        self._by_state: dict[str, int] = dict.fromkeys(State.ALL, 0)
        self._waiting_by_key: dict[str, int] = {}
        self._running_by_key: dict[str, int] = {}
        self._running: dict[int, Job] = {}  # kept by _count: what the claim's limits read
        self._footprints: dict[str, mem.Footprint] = {}  # func -> expected peak and runtime (resources.py)
        self._init_workflows()

    def take_ownership(self) -> None:
        pass  # one process is the whole store

    def claiming_batch(self) -> contextlib.AbstractContextManager[None]:
        return self.batch(defer_flush=True)  # ClaimsInSubmit: one lock serves both

    @contextlib.contextmanager
    def batch(self, bookkeeping: bool = False, defer_flush: bool = False) -> Iterator[None]:
        with self._lock:
            if self._in_batch:  # a nested batch is part of the outer one
                yield
                return
            self._journal.begin()
            self._in_batch = True
            try:
                yield
            except BaseException:
                self._journal.rollback()
                self._rebuild_derived()
                raise
            else:
                self._journal.commit()
            finally:
                self._in_batch = False

    def _rebuild_derived(self) -> None:
        """After a rollback: heaps and counts again from the jobs (a scan, on failure only)."""
        self._queued[:] = [(j.priority, j.run_at, j.id) for j in self._jobs.values() if j.state == State.QUEUED]
        heapq.heapify(self._queued)
        self._scheduled[:] = [(j.run_at, j.id) for j in self._jobs.values() if j.state == State.SCHEDULED]
        heapq.heapify(self._scheduled)
        self._by_state = dict.fromkeys(State.ALL, 0)
        self._waiting_by_key.clear()
        self._running_by_key.clear()
        self._running.clear()
        for j in self._jobs.values():
            self._count(j, 1)

    # --- helpers (lock held) -------------------------------------------------------------
    def _count(self, job: Job, delta: int) -> None:
        self._by_state[job.state] += delta
        if job.state == State.RUNNING:
            if delta > 0:
                self._running[job.id] = job
            else:
                self._running.pop(job.id, None)
        if job.key is None:
            return
        per_key = (self._waiting_by_key if job.state in State.PENDING
                   else self._running_by_key if job.state == State.RUNNING else None)
        if per_key is not None:
            n = per_key.get(job.key, 0) + delta
            if n:
                per_key[job.key] = n
            else:
                per_key.pop(job.key, None)

    def _drop(self, job: Job) -> None:
        self._count(job, -1)
        if self._journal.entries is not None:
            self._journal.entries.append((self._jobs, job.id, job))
        del self._jobs[job.id]

    def _put(self, job: Job) -> None:
        old = self._jobs.get(job.id)
        if self._journal.entries is not None:
            self._journal.entries.append((self._jobs, job.id, ABSENT if old is None else old))
        if old is not None:
            self._count(old, -1)
        self._count(job, 1)
        self._jobs[job.id] = job
        if job.state == State.QUEUED:
            heapq.heappush(self._queued, (job.priority, job.run_at, job.id))
        elif job.state == State.SCHEDULED:
            heapq.heappush(self._scheduled, (job.run_at, job.id))

    def _lookups(self) -> adm.Lookups:
        def by_key(k: str) -> adm.Existing | None:
            job = self._jobs.get(self._idem.get(k, 0))
            return adm.Existing(job.id, job.state, job.created_at) if job else None

        def active(key: str) -> int | None:
            return next((j.id for j in self._jobs.values()
                         if j.key == key and (j.state in State.PENDING or j.state == State.RUNNING)), None)

        return adm.Lookups(
            by_idempotency_key=by_key,
            waiting_for_key=lambda key: self._waiting_by_key.get(key, 0),
            waiting_total=lambda: sum(self._by_state[s] for s in State.PENDING),
            active_for_key=active,
        )

    def _submit_locked(self, requests: Sequence[Sequence[NewJob]], now: float,
                       admission: adm.Admission) -> list[list[Submitted] | adm.Refusal]:
        p = adm.plan(requests, now, admission, self._lookups())
        for k in p.expired_keys:
            old = self._jobs[self._idem.pop(k)]
            self._put(dataclasses.replace(old, idempotency_key=None))
        ids = []
        for _, _, new in p.inserts:
            job_id = next(self._ids)
            ids.append(job_id)
            self._put(new_record(job_id, State.QUEUED if new.run_at <= now else State.SCHEDULED, now, new))
            if new.idempotency_key is not None:
                self._idem[new.idempotency_key] = job_id
            if new.manual:
                for target in (("key", new.key), ("func", new.func)):
                    if target[1] is not None:
                        self._resume_locked(*target)
        return adm.finish(p, requests, ids, now)

    # --- submit ---------------------------------------------------------------------------
    def submit_requests(
        self, requests: Sequence[Sequence[NewJob]], now: float, admission: adm.Admission = adm.NO_LIMITS
    ) -> list[list[Submitted] | adm.Refusal]:
        with self._lock:
            return self._submit_locked(requests, now, admission)

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
    def claim_available(self, request: claim.Request) -> list[Job]:
        now = request.now
        out: list[Job] = []
        passed_over: list[tuple[int, float, int]] = []
        with self._lock:
            # _running is kept by _count: no scan of every job per claim.
            pick = claim.Selection(
                request,
                claim.Running.of_jobs([(j.key, j.concurrency_group, None, j.concurrency_limit, j.pool, j.cost_units)
                                       for j in self._running.values()], self._pauses, self._due_probes(now)))
            # Every queued job is offered; those the selection leaves out (full groups, used
            # up budgets) are passed over uncounted, as the SQL stores leave them unread.
            while self._queued and not pick.done:
                entry = heapq.heappop(self._queued)
                job = self._jobs.get(entry[2])
                if job is None or job.state != State.QUEUED or (job.priority, job.run_at) != entry[:2]:
                    continue  # a stale entry: the job moved on (or was re-queued at another time)
                if not pick.offer(job):
                    passed_over.append(entry)
                    continue
                job = dataclasses.replace(job, state=State.RUNNING, attempts=job.attempts + 1, started_at=now)
                self._put(job)
                out.append(job)
            for entry in passed_over:
                heapq.heappush(self._queued, entry)
            for t, job_id in pick.probes:  # no other probe of these pauses until it finishes
                self._pauses[t] = dataclasses.replace(self._pauses[t], probe_job=job_id)
        return out

    def _due_probes(self, now: float) -> list[tuple[str, str]]:
        """Pauses whose probe time has come and whose probe (if any) is not running."""
        out = []
        for t, p in self._pauses.items():
            if p.probe_at is not None and p.probe_at <= now:
                probe = self._jobs.get(p.probe_job) if p.probe_job is not None else None
                if probe is None or probe.state != State.RUNNING:
                    out.append(t)
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
    def finish_if_running(self, outcomes: Sequence[Outcome], now: float, pause_after: int | None = None,
                          pause_cooldown: float | None = None) -> Finished:
        changed = 0
        finished: list[pz.Finish] = []
        with self._lock:
            for o in outcomes:
                job = self._jobs.get(o.job_id)
                if job is None or job.state != State.RUNNING:
                    continue
                changes: dict = {"state": o.state, "result": o.result, "error": o.error, "output": o.output}
                if o.state == State.SCHEDULED:
                    changes["run_at"] = o.run_at
                if o.state in State.FINAL:
                    changes["finished_at"] = now
                if o.state == State.WAITING_NETWORK:
                    changes["attempts"] = job.attempts - 1
                self._put(dataclasses.replace(job, **changes))
                changed += 1
                if o.workflow_run is not None and o.state in (State.SUCCEEDED, State.DEAD):
                    self._advance_locked(job, o.state == State.SUCCEEDED, o.result, o.error, now)
                # With no streak yet, successes have nothing to end: the steady state. A
                # blameless run (the host failed it) counts for nothing.
                if not o.blameless and (finished or self._streaks or self._pauses or o.state != State.SUCCEEDED):
                    finished.append(pz.Finish(o.state, o.error, job.key, job.func, job.id))
            if not finished:
                return Finished(changed, [])
            p = pz.plan(finished, now, pause_after, pz.Lookups(
                lambda t: (self._streaks.get(t, (0, None))[0], t in self._pauses),
                lambda t: (q.trips, q.probe_job) if (q := self._pauses.get(t)) else (0, None)), pause_cooldown)
            for t in p.reset:
                self._streaks.pop(t, None)
            for t in p.resumed:
                self._pauses.pop(t, None)
            self._streaks.update(p.streaks)
            for t, (at, failures, err) in p.pauses.items():
                old = self._pauses.get(t)
                self._pauses[t] = (Pause(*t, at, failures, err) if old is None or at is not None
                                   else dataclasses.replace(old, failures=failures, last_error=err))
            for t, (probe_at, trips) in p.probes.items():
                self._pauses[t] = dataclasses.replace(self._pauses[t], probe_at=probe_at, trips=trips, probe_job=None)
        return Finished(changed, [Pause(*t, now, failures, err, *p.probes.get(t, (None, 0)))
                                  for t, failures, err in p.new], p.next_probe)

    def set_progress_if_running(self, updates: Sequence[tuple[int, int, dict[str, Any]]]) -> int:
        n = 0
        with self._lock:
            for job_id, attempt, progress in updates:
                job = self._jobs.get(job_id)
                if job is not None and job.state == State.RUNNING and job.attempts == attempt:
                    self._put(dataclasses.replace(job, progress=dict(progress)))  # shares nothing with the caller
                    n += 1
        return n

    def recover_orphans(self, max_requeues: int, now: float, running_here: Collection[int] = ()) -> Recovered:
        with self._lock:
            p = orphans.plan(((j.id, j.orphaned) for j in self._jobs.values() if j.state == State.RUNNING),
                             max_requeues, running_here)
            for job_id in p.requeue:
                job = self._jobs[job_id]
                self._put(dataclasses.replace(job, state=State.QUEUED, orphaned=job.orphaned + 1))
            for job_id in p.dead:
                self._put(dataclasses.replace(self._jobs[job_id], state=State.DEAD, error=dict(orphans.ERROR),
                                              finished_at=now))
                if self._jobs[job_id].workflow_run is not None:  # a step given up on ends its item
                    self._advance_locked(self._jobs[job_id], False, None, dict(orphans.ERROR), now)
        return Recovered(p.requeue, p.dead)

    # --- pauses ---------------------------------------------------------------------------
    def pauses(self) -> list[Pause]:
        with self._lock:
            return sorted(self._pauses.values(), key=lambda p: (p.paused_at, p.kind, p.name))

    def _resume_locked(self, kind: str, name: str) -> bool:
        self._streaks.pop((kind, name), None)
        return self._pauses.pop((kind, name), None) is not None

    def resume(self, kind: str, name: str) -> bool:
        with self._lock:
            return self._resume_locked(kind, name)

    # --- operator actions -----------------------------------------------------------------
    def cancel(self, job_id: int, now: float) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.state in State.PENDING:
                job = dataclasses.replace(job, state=State.CANCELLED, finished_at=now)
                self._put(job)
                self._step_cancelled(job, now)
            return job

    def _retry_dead_locked(self, job: Job, now: float) -> Job:
        job = dataclasses.replace(job, state=State.QUEUED, run_at=now, attempts=0, orphaned=0, finished_at=None)
        self._put(job)
        return job

    def retry_dead(self, job_id: int, now: float) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.state == State.DEAD:
                job = self._retry_dead_locked(job, now)
            return job

    def retry_all_dead(self, now: float) -> int:
        with self._lock:
            dead = [j for j in self._jobs.values() if j.state == State.DEAD]
            for j in dead:
                self._retry_dead_locked(j, now)
            events = [e for e, _ in self._events.values() if e.state == EventState.DEAD]
            for e in events:
                self._events[e.event_id] = (
                    dataclasses.replace(e, state=EventState.PENDING, attempts=0, next_attempt_at=now),
                    self._events[e.event_id][1])
            if events:
                self._repair_key_order()
            return len(dead) + len(events)

    def purge(self, states: Sequence[str], finished_before: float, limit: int) -> int:
        with self._lock:
            old = sorted((j for j in self._jobs.values() if j.state in states and j.finished_at is not None
                          and j.finished_at < finished_before), key=lambda j: j.finished_at)[:limit]
            for j in old:
                self._drop(j)
                if j.idempotency_key is not None and self._idem.get(j.idempotency_key) == j.id:
                    del self._idem[j.idempotency_key]
            n = len(old)
            if State.DEAD in states:
                gone = [i for i, (e, _) in self._events.items()
                        if e.state == EventState.DEAD and e.created_at < finished_before]
                for i in gone:
                    del self._events[i]
                n += len(gone)
            return n

    # --- inspect --------------------------------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def list_jobs(self, state: str | None, limit: int, *, func: str | None = None, key: str | None = None,
                  pool: str | None = None) -> list[Job]:
        with self._lock:
            jobs = (j for j in reversed(self._jobs.values()) if matches(j, state, func, key, pool))
            return list(itertools.islice(jobs, limit))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_state)

    def waiting_by_key(self, limit: int) -> list[tuple[str, int, float]]:
        per: dict[str, list[float]] = {}
        with self._lock:
            for j in self._jobs.values():
                if j.key is not None and j.state in State.PENDING:
                    per.setdefault(j.key, []).append(j.run_at)
        rows = sorted(((k, len(v), min(v)) for k, v in per.items()), key=lambda r: (-r[1], r[0]))
        return rows[:limit]

    def set_pool(self, kind: str, name: str, pool: str) -> int:
        with self._lock:
            if kind == "job":
                moving = [j for j in (self._jobs.get(int(name)),) if j is not None and j.state in State.PENDING]
            elif kind in ("key", "cron"):
                moving = [j for j in self._jobs.values() if getattr(j, kind) == name and j.state in State.PENDING]
            else:
                raise ValueError(f"kind must be job, key or cron, not {kind!r}")
            for j in moving:
                self._put(dataclasses.replace(j, pool=pool))
            n = len(moving)
            if kind == "cron" and name in self._crons:
                cron = self._crons[name]
                self._crons[name] = dataclasses.replace(cron, template=dataclasses.replace(cron.template, pool=pool))
                n += 1
            return n

    def waiting_by_pool(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._lock:
            for j in self._jobs.values():
                if j.state in State.PENDING:
                    out[j.pool] = out.get(j.pool, 0) + 1
        return out

    def oldest_queued_at(self) -> float | None:
        """For monitoring: the earliest run_at among `queued` jobs."""
        with self._lock:
            return min((j.run_at for j in self._jobs.values() if j.state == State.QUEUED), default=None)

    def durability_said(self) -> str:
        return "not durable: a memory store ends with its process"

    def close(self) -> None:
        pass
