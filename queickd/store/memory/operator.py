"""The memory store's operator actions and per-minute counters: a mixin of MemoryStore,
kept apart so store.py does not grow further past 500 lines. Runs under the store's lock
on the store's dicts (`_jobs`, `_pauses`, `_minutes`); never touches another store.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from ...core.job import Job, State
from ..records import Minute, Pause
from ..workflows import CANCELLED


class MemoryOperatorOps:
    _lock: threading.RLock
    _jobs: dict[int, Job]
    _pauses: dict[tuple[str, str], Pause]
    _minutes: dict[tuple[int, str], Minute]
    _put: Any
    _advance_locked: Any  # workflows.MemoryWorkflows

    def cancel_running(self, job_id: int, now: float) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.state == State.RUNNING:
                job = dataclasses.replace(job, state=State.CANCELLED, finished_at=now)
                self._put(job)
                self._step_cancelled(job, now)  # its outcome, when it ends, is discarded
            return job

    def cancel_waiting(self, state: str, now: float, *, func: str | None = None, key: str | None = None,
                       pool: str | None = None) -> list[int]:
        if state not in State.PENDING:
            raise ValueError(f"only waiting jobs are cancelled this way, not {state!r}")
        with self._lock:
            hit = [j for j in self._jobs.values() if matches(j, state, func, key, pool)]
            for j in hit:
                self._put(dataclasses.replace(j, state=State.CANCELLED, finished_at=now))
            for j in hit:  # after all are cancelled: a run that fails discards what it still has waiting
                self._step_cancelled(j, now)
            return [j.id for j in hit]

    def _step_cancelled(self, job: Job, now: float) -> None:
        """A job cancelled outside a finish: a workflow step's ends its item as failed."""
        if job.workflow_run is not None:
            self._advance_locked(job, False, None, dict(CANCELLED), now)

    def pause(self, kind: str, name: str, now: float) -> bool:
        with self._lock:
            old = self._pauses.get((kind, name))
            self._pauses[(kind, name)] = (Pause(kind, name, now, 0, None) if old is None
                                          else dataclasses.replace(old, probe_at=None, probe_job=None))
            return old is None

    # --- per-minute counters ----------------------------------------------------------------
    def add_minute(self, m: Minute) -> None:
        with self._lock:
            old = self._minutes.get((m.minute, m.member))
            if old is not None:
                m = Minute(m.minute, m.member, old.completed + m.completed, old.failed + m.failed,
                           old.seconds + m.seconds, old.depth if m.depth is None else m.depth)
            self._minutes[(m.minute, m.member)] = m

    def minutes(self, since: int) -> list[Minute]:
        with self._lock:
            return [self._minutes[k] for k in sorted(self._minutes) if k[0] >= since]

    def prune_minutes(self, before: int) -> int:
        with self._lock:
            old = [k for k in self._minutes if k[0] < before]
            for k in old:
                del self._minutes[k]
            return len(old)


def matches(j: Job, state: str | None, func: str | None, key: str | None, pool: str | None) -> bool:
    return ((state is None or j.state == state) and (func is None or j.func == func)
            and (key is None or j.key == key) and (pool is None or j.pool == pool))
