"""The memory store's workflow tables (runs, step outputs) and its WorkflowTx.

Owned by MemoryStore (a mixin): every method runs under the store's lock, and what a
batch may roll back lives in UndoDicts on the store's journal. It decides nothing: plans
come from core/workflow, sequenced by store/workflows.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ...core.job import Job, NewJob, State
from ...core.policy import admission as adm
from ...core.workflow import Definition, Output, RunRecord, RunState
from .. import workflows as wf
from .undo import UndoDict


class _Tx:
    unavailable: tuple[type[BaseException], ...] = ()  # nothing here fails on its own

    def __init__(self, store: MemoryWorkflows) -> None:
        self.s = store

    def savepoint(self) -> contextlib.AbstractContextManager[None]:
        return self.s._savepoint()

    def lock_roots(self, run_ids: Iterable[int]) -> None:
        pass  # the store's lock is held throughout

    def run_get(self, run_id: int, state: bool = True) -> RunRecord | None:
        return self.s._runs.get(run_id)

    def run_by_key(self, key: str) -> RunRecord | None:
        return self.s._runs.get(self.s._run_keys.get(key, 0))

    def run_insert(self, run: RunRecord) -> int:
        run_id = next(self.s._run_ids)
        self.s._runs[run_id] = dataclasses.replace(run, id=run_id)
        if run.idempotency_key is not None:
            self.s._run_keys[run.idempotency_key] = run_id
        return run_id

    def run_update(self, run: RunRecord) -> None:
        self.s._runs[run.id] = run

    def output_add(self, run_id: int, out: Output, now: float) -> bool:
        k = (run_id, out.step, out.item, out.loop)
        if k in self.s._outputs:
            return False
        self.s._outputs[k] = (out.ok, out.value, out.job_id, now)
        return True

    def outputs(self, run_id: int, step: int, loop: int) -> list[tuple[int, bool, Any]]:
        return [(k[2], v[0], v[1]) for k, v in self.s._outputs.items()
                if k[0] == run_id and k[1] == step and k[3] == loop]

    def submit(self, jobs: Sequence[NewJob], now: float) -> None:
        self.s._submit_locked([list(jobs)], now, adm.NO_LIMITS)  # type: ignore[attr-defined]

    def room(self) -> int | None:
        cap = self.s.queue_cap  # type: ignore[attr-defined]
        return None if cap is None else cap - sum(self.s._by_state[s] for s in State.PENDING)  # type: ignore[attr-defined]

    def discard_jobs(self, run_id: int, now: float) -> int:
        gone = [j for j in self.s._jobs.values()  # type: ignore[attr-defined]
                if j.workflow_run == run_id and j.state in State.PENDING]
        for j in gone:
            self.s._put(dataclasses.replace(j, state=State.CANCELLED, finished_at=now))  # type: ignore[attr-defined]
        return len(gone)

    def running_in_tree(self, root: int) -> list[RunRecord]:
        return [r for r in self.s._runs.values() if r.status == RunState.RUNNING and r.root == root]


class MemoryWorkflows:
    """Workflow runs for MemoryStore; call _init_workflows from its __init__."""

    def _init_workflows(self) -> None:
        journal = self._journal  # type: ignore[attr-defined]
        self._runs: dict[int, RunRecord] = UndoDict(journal)
        self._run_keys: dict[str, int] = UndoDict(journal)
        self._outputs: dict[tuple[int, int, int, int], tuple] = UndoDict(journal)
        self._run_ids = itertools.count(1)

    def _advance_locked(self, job: Job, ok: bool, result: Any, error: Any, now: float) -> None:
        wf.advance(_Tx(self), [wf.step_done(job.id, job.workflow_run, job.workflow_step, job.workflow_item,
                                            job.workflow_loop, ok, result, error)], now)

    @contextlib.contextmanager
    def _savepoint(self) -> Iterator[None]:
        """Undo what the block wrote if it raises (lock held): back to where it began inside
        a batch; outside one (an operator's cancel), the block is a batch of its own."""
        journal = self._journal  # type: ignore[attr-defined]
        if journal.entries is None:
            with self.batch():  # type: ignore[attr-defined]
                yield
            return
        mark = journal.mark()
        try:
            yield
        except BaseException:
            journal.rollback_to(mark)
            self._rebuild_derived()  # type: ignore[attr-defined]
            raise

    def workflow_start(self, spec: Definition, state: dict[str, Any], now: float,
                       idempotency_key: str | None = None) -> tuple[RunRecord, bool]:
        with self.batch():  # type: ignore[attr-defined]
            return wf.start(_Tx(self), spec, state, now, idempotency_key)

    def workflow_get(self, run_id: int) -> RunRecord | None:
        with self._lock:  # type: ignore[attr-defined]
            return self._runs.get(run_id)

    def workflow_jobs(self, run_id: int) -> list[Job]:
        with self._lock:  # type: ignore[attr-defined]
            return [j for j in self._jobs.values() if j.workflow_run == run_id]  # type: ignore[attr-defined]

    def workflow_outputs(self, run_id: int) -> list[dict[str, Any]]:
        with self._lock:  # type: ignore[attr-defined]
            return [{"step": k[1], "item": k[2], "loop": k[3], "ok": v[0], "value": v[1], "job_id": v[2]}
                    for k, v in sorted(self._outputs.items()) if k[0] == run_id]

    def workflow_list(self, state: str | None, limit: int) -> list[RunRecord]:
        with self._lock:  # type: ignore[attr-defined]
            runs = [r for r in reversed(self._runs.values()) if state is None or r.status == state]
        return runs[:limit]

    def workflow_children(self, run: RunRecord) -> list[RunRecord]:
        with self._lock:  # type: ignore[attr-defined]
            return [r for r in self._runs.values() if r.parent is not None and r.parent["run"] == run.id]

    def workflow_cancel(self, run_id: int, now: float) -> RunRecord | None:
        with self.batch():  # type: ignore[attr-defined]
            return wf.cancel(_Tx(self), run_id, now)

    def workflow_counts(self) -> dict[str, Any]:
        by_state = dict.fromkeys(RunState.ALL, 0)
        stops: dict[str, int] = {}
        with self._lock:  # type: ignore[attr-defined]
            for r in self._runs.values():
                by_state[r.status] += 1
                if r.status == RunState.BUDGET_EXCEEDED and r.reason:
                    stops[r.reason["budget"]] = stops.get(r.reason["budget"], 0) + 1
        return {"runs": by_state, "budget_stops": stops}
