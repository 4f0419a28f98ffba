"""Applying workflow plans inside a store transaction, the same way on every store.

The decisions are core/workflow's (pure); this module only sequences a plan's writes
through `WorkflowTx`, the few reads and writes a store provides for its open transaction
(memory: under its lock; SQLite: on its writing connection; PostgreSQL: on the connection
of the finish, the run's row locked). It must be called inside that transaction and never
opens one, reads a clock or decides anything itself. Order matters for exactly-once: the
step's output is inserted first, under its UNIQUE (run, step, item, loop) guard, and a
conflict (the output is already recorded) leaves the whole plan unapplied.

One run's transition that raises (a bug, or data whose problem shows only at run time)
must not undo the finishes it shares a transaction with: each is applied inside a
savepoint, and one that raises is undone and its run ends failed, naming the step. Only
the store's own errors (WorkflowTx.unavailable: a lost connection, a failing disk) go on,
failing the whole transaction as any statement would.

Lock order (PostgreSQL; the others have one writer): whatever locks more than one run of
a tree (a child's end advances its parent, a cancel stops the children, a child's start
charges its ancestors) first locks the tree's root row, every root of a batch at once in
id order, so two transactions on one tree queue at its root and never hold one run each
while waiting for the other's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..core.fate import error_info
from ..core.job import NewJob
from ..core.workflow import Definition, Lookups, Output, Plan, RunRecord, RunState, StepDone
from ..core.workflow import engine as tr

# The error a step's item ends with when an operator cancels its waiting job.
CANCELLED = {"type": "cancelled", "message": "the step's job was cancelled by an operator"}
_MAX_MESSAGE = 1000  # characters of a raised error's message kept in the run's reason

log = logging.getLogger("queickd.store")


class WorkflowTx(Protocol):
    unavailable: tuple[type[BaseException], ...]  # the store's own errors (store.UNAVAILABLE)

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested transaction: if the block raises, what it wrote is undone (the rest of
        the transaction stays) and the error goes on."""
        ...

    def lock_roots(self, run_ids: Iterable[int]) -> None:
        """Lock the rows of the runs' roots (a root is its own) until the transaction
        ends, in id order; nothing where one writer holds the whole store."""
        ...

    def run_get(self, run_id: int, state: bool = True) -> RunRecord | None:
        """The run, its record locked until the transaction ends where the store can. With
        state False, a store may leave its state unread (then it writes none back)."""
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
        """Insert the jobs (no admission: the engine asked room() before making them)."""
        ...

    def room(self) -> int | None:
        """The jobs the queue takes before the store's queue_cap (--max-queued) is reached
        (0 or less: none); None when it has no cap."""
        ...

    def discard_jobs(self, run_id: int, now: float) -> int:
        """Cancel the run's waiting jobs; its running ones finish, and their finish is stale."""
        ...

    def running_in_tree(self, root: int) -> list[RunRecord]:
        """Running runs whose root is `root` (their state may be left unread)."""
        ...


def _lookups(tx: WorkflowTx, run: RunRecord) -> Lookups:
    def ancestors() -> list[RunRecord]:
        out, p = [], run.parent
        while p is not None:
            a = tx.run_get(p["run"], state=False)  # charged for a child: its state untouched
            if a is None:
                break
            out.append(a)
            p = a.parent
        return out

    return Lookups(lambda step, loop: tx.outputs(run.id, step, loop), ancestors, tx.room)


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


def advance(tx: WorkflowTx, dones: Sequence[StepDone], now: float) -> None:
    """Apply finished items to their runs, in run order, their roots locked first. One whose
    transition raises ends its run failed; the others are applied as if it had not been."""
    if not dones:
        return
    tx.lock_roots({d.run for d in dones})
    ordered = sorted(dones, key=lambda d: (d.run, d.job_id or 0))
    if len(ordered) > 1:
        # One savepoint for them all (a savepoint each is two statements per item); if any
        # raises, all are undone and applied again one savepoint each, so that only the
        # run that raised fails. The transitions are pure: the second time decides the same.
        try:
            with tx.savepoint():
                for d in ordered:
                    _transition(tx, d, now)
            return
        except tx.unavailable:
            raise
        except Exception:
            pass
    for d in ordered:
        _advance(tx, d, now)


def _advance(tx: WorkflowTx, done: StepDone, now: float) -> bool:
    """One finished item applied to its run (roots locked). False when stale or already recorded."""
    try:
        with tx.savepoint():
            return _transition(tx, done, now)
    except tx.unavailable:
        raise
    except Exception as e:
        log.warning("workflow run %d: the finish of step %d item %d raised; the run ends failed",
                    done.run, done.step, done.item, exc_info=True)
        info = error_info(e)  # its traceback goes to the log above, not into the run
        error = {"type": info["type"], "message": info["message"][:_MAX_MESSAGE]}
    run = tx.run_get(done.run)
    plan = None if run is None else tr.broken(run, done, now, error)
    if plan is None:
        return False
    return _apply(tx, plan, now)


def _transition(tx: WorkflowTx, done: StepDone, now: float) -> bool:
    run = tx.run_get(done.run, state=False)
    if run is None:
        return False
    if tr.needs_state(run, done):
        run = tx.run_get(done.run)
        assert run is not None
    plan = tr.transition(run, done, now, _lookups(tx, run))
    if plan is None:
        return False
    return _apply(tx, plan, now)


def cancel(tx: WorkflowTx, run_id: int, now: float) -> RunRecord | None:
    """Cancel a running run (and what runs under it); the run as it is after, None if unknown."""
    tx.lock_roots([run_id])
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
        for a in stopped:  # and its parent's step ends, as when a run ends itself
            done = tr.child_done(a)
            if done is not None:  # (a parent stopped too takes it as stale)
                _advance(tx, done, now)
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
        if done is not None:  # the parent, in the same tree: its root is locked already
            _advance(tx, done, now)
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
