"""The memory store's part of resource control: budget usage for stats, the functions'
footprints and the release of claimed jobs that did not start. A mixin of MemoryStore
(its lock, jobs and _put); kept apart so the store module stays small. No policy here:
core/policy/memory.py folds the runs."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from ...core.job import Job, State
from ...core.policy import memory as mem
from ...core.policy.costs import Limits


class MemoryResources:
    _lock: threading.RLock
    _jobs: dict[int, Job]
    _footprints: dict[str, mem.Footprint]
    _put: Any

    def footprints(self, funcs: list[str]) -> dict[str, mem.Footprint]:
        with self._lock:
            return {f: self._footprints[f] for f in funcs if f in self._footprints}

    def record_runs(self, runs: list[tuple[str, int | None, float, bool, bool]], now: float) -> None:
        with self._lock:
            for func, peak, runtime, killed, estimated in runs:
                fp = mem.update(self._footprints.get(func), peak, runtime, killed, estimated)
                if fp is not None:
                    self._footprints[func] = fp

    def release_unstarted(self, job_ids: list[int]) -> int:
        n = 0
        with self._lock:
            for job_id in job_ids:
                job = self._jobs.get(job_id)
                if job is None or job.state != State.RUNNING:
                    continue
                self._put(dataclasses.replace(job, state=State.QUEUED, attempts=job.attempts - 1, started_at=None))
                n += 1
        return n

    def waiting_over_budgets(self, limits: Limits) -> list[tuple[int, str, str | None, float | None]]:
        least = min([*limits.pools.values(), *limits.groups.values()], default=None)
        if least is None:
            return []
        with self._lock:
            return sorted((j.id, j.pool, j.concurrency_group, j.cost_units) for j in self._jobs.values()
                          if j.state in State.PENDING and (1.0 if j.cost_units is None else j.cost_units) > least)

    def budget_usage(self, pools: list[str], groups: list[str]) -> dict[tuple[str, str], tuple[float, int, float, int]]:
        out: dict[tuple[str, str], tuple[float, int, float, int]] = {}
        wanted = {("pool", p) for p in pools} | {("group", g) for g in groups}
        with self._lock:
            for j in self._jobs.values():
                if j.state != State.RUNNING and j.state not in State.PENDING:
                    continue
                units = 1.0 if j.cost_units is None else j.cost_units
                for t in (("pool", j.pool), ("group", j.concurrency_group)):
                    if t in wanted:
                        rc, rn, wc, wn = out.get(t, (0.0, 0, 0.0, 0))
                        out[t] = ((rc + units, rn + 1, wc, wn) if j.state == State.RUNNING
                                  else (rc, rn, wc + units, wn + 1))
        return out

