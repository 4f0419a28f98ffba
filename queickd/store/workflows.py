"""Applying workflow plans inside a store transaction, the same way on every store.

The decisions are core/workflow's (pure); this module only sequences a plan's writes
through `WorkflowTx`, the few reads and writes a store provides for its open transaction
(memory: under its lock; SQLite: on its writing connection; PostgreSQL: on the connection
of the finish, the run's row locked). It must be called inside that transaction and never
opens one, reads a clock or decides anything itself. Order matters for exactly-once: the
step's output is inserted first, under its UNIQUE (run, step, item, loop) guard, and a
conflict (the output is already recorded) leaves the whole plan unapplied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from ..core.job import NewJob
from ..core.workflow import Definition, Lookups, Output, Plan, RunRecord, RunState, StepDone
from ..core.workflow import engine as tr

# The error a step's item ends with when an operator cancels its waiting job.
CANCELLED = {"type": "cancelled", "message": "the step's job was cancelled by an operator"}


class WorkflowTx(Protocol):
    def run_get(self, run_id: int) -> RunRecord | None:
        """The run, its record locked until the transaction ends where the store can."""
        ...

    def run_by_key(self, key: str) -> RunRecord | None: ...

    def run_insert(self, run: RunRecord) -> int:
        """Store a new run (its id ignored); returns the id given."""
        ...

    def run_update(self, run: RunRecord) -> None: ...

    def output_add(self, run_id: int, out: Output, now: float) -> bool:
        """Record a step's output; False (and nothing written) if one is recorded already."""
        ...

    def outputs(self, run_id: int, step: int, loop: int) -> list[tuple[int, bool, Any]]: ...

    def submit(self, jobs: Sequence[NewJob], now: float) -> None:
        """Insert the jobs (no admission limits: the run's budget is their limit)."""
        ...

    def discard_jobs(self, run_id: int, now: float) -> int:
        """Cancel the run's waiting jobs; its running ones finish, and their finish is stale."""
        ...

    def running_in_tree(self, root: int) -> list[RunRecord]:
        """Running runs whose root is `root`."""
        ...


def _lookups(tx: WorkflowTx, run: RunRecord) -> Lookups:
    def ancestors() -> list[RunRecord]:
        out, p = [], run.parent
        while p is not None:
            a = tx.run_get(p["run"])
            if a is None:
                break
            out.append(a)
            p = a.parent
        return out

    return Lookups(lambda step, loop: tx.outputs(run.id, step, loop), ancestors)


def start(tx: WorkflowTx, spec: Definition, state: dict[str, Any], now: float,
          idempotency_key: str | None = None) -> tuple[RunRecord, bool]:
    """A new run, stored and begun (its first jobs enqueued) in the caller's transaction.
    With a known idempotency key: the existing run, and True (a duplicate)."""
    if idempotency_key is not None:
        old = tx.run_by_key(idempotency_key)
        if old is not None:
            return old, True
    run = tr.new_run(spec, state, now, idempotency_key)
    run = dataclasses.replace(run, id=tx.run_insert(run))
    _apply(tx, tr.begin(run, now, _lookups(tx, run)), now)
    got = tx.run_get(run.id)
    assert got is not None
    return got, False


def advance(tx: WorkflowTx, done: StepDone, now: float) -> bool:
    """Apply one finished item to its run. False when stale or already recorded."""
    run = tx.run_get(done.run)
    if run is None:
        return False
    plan = tr.transition(run, done, now, _lookups(tx, run))
    if plan is None:
        return False
    return _apply(tx, plan, now)


def cancel(tx: WorkflowTx, run_id: int, now: float) -> RunRecord | None:
    """Cancel a running run (and what runs under it); the run as it is after, None if unknown."""
    run = tx.run_get(run_id)
    if run is None:
        return None
    plan = tr.cancel(run, now)
    if plan is not None:
        _apply(tx, plan, now)
    return tx.run_get(run_id)


def _apply(tx: WorkflowTx, plan: Plan, now: float) -> bool:
    run = plan.run
    if plan.output is not None and not tx.output_add(run.id, plan.output, now):
        return False  # recorded by an earlier finish of the same item: nothing more to do
    tx.run_update(run)
    stopped = [a for a in plan.ancestors if a.status != RunState.RUNNING]
    for a in plan.ancestors:
        tx.run_update(a)
    if stopped:  # an ancestor's budget stops it, and everything under it with it
        for a in stopped:
            _stop_under(tx, a, now)
        return True
    if plan.jobs:
        tx.submit(plan.jobs, now)
    if plan.discard:
        tx.discard_jobs(run.id, now)
    if plan.ended and run.status != RunState.SUCCEEDED:
        _stop_under(tx, run, now)
    if plan.child is not None:
        child = dataclasses.replace(plan.child, id=0)
        child = dataclasses.replace(child, id=tx.run_insert(child))
        _apply(tx, tr.begin(child, now, _lookups(tx, child)), now)
    if plan.ended:
        done = tr.child_done(run)
        if done is not None:
            advance(tx, done, now)
    return True


def _stop_under(tx: WorkflowTx, top: RunRecord, now: float) -> None:
    """Cancel the running runs under `top` (children, grandchildren, ...) and their jobs."""
    tree = tx.running_in_tree(top.root if top.root is not None else top.id)
    by_id = {r.id: r for r in tree}

    def under(r: RunRecord) -> bool:
        seen = 0
        while r.parent is not None and seen < 64:
            if r.parent["run"] == top.id:
                return True
            parent = by_id.get(r.parent["run"])
            if parent is None:
                return False
            r, seen = parent, seen + 1
        return False

    for r in tree:
        if r.id != top.id and under(r):
            why = f"stopped: run {top.id} ended {top.status}"
            tx.run_update(dataclasses.replace(r, status=RunState.CANCELLED, finished_at=now, progress={},
                                              reason={"message": why}))
            tx.discard_jobs(r.id, now)


def step_done(job_id: int, run: int, step: int, item: int, loop: int, ok: bool, result: Any,
              error: Any) -> StepDone:
    return StepDone(run, step, item, loop, ok, result if ok else None, None if ok else error, job_id)
