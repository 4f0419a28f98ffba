"""The SQL stores' workflow tables (workflow_runs, workflow_outputs) and their WorkflowTx,
written once for SQLite and PostgreSQL: functions of the store's Dialect, the caller's
transaction and, where runs may advance, its Steps. It decides nothing: plans come from
core/workflow, sequenced by store/workflows.py, inside the store's transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import MappingProxyType
from typing import Any

from ...core.job import Job, NewJob
from ...core.workflow import Definition, Output, RunRecord, RunState
from .. import rows as dbrows
from .. import workflows as wf
from ..sqlstates import WAITING_IN
from .dialect import Dialect

# What an UPDATE of jobs returns for steps_cancelled_in: the job and its workflow step, if any.
STEP_OF_JOB = "id, workflow_run, workflow_step, workflow_item, workflow_loop"
# A run's row, without its state: the state has a table of its own (workflow_states), so that
# a fan-out's item, which changes only the run's progress, neither reads nor rewrites it.
RUN_COLS = "id, name, status, step, parent, root, idempotency_key, definition, meta, created_at, finished_at"
# The row with its state, last.
RUN_WITH_STATE = (f"SELECT {', '.join('r.' + c for c in RUN_COLS.split(', '))}, s.state FROM workflow_runs r"
                  " JOIN workflow_states s ON s.run = r.id")
# The state of a run read without it (store/workflows.py reads it for a transition that needs
# it): read-only, and an error to encode, so a bug would fail loudly, not store {}.
UNREAD: Any = MappingProxyType({})


class _StateCache:
    """The last state text read and its object: a run's steps that read the state one after
    the other (a task's finish, then its next step's) decode it once, and an unchanged one
    is not written back. The object is shared, so nothing may change it in place (the
    transition builds new dicts). One tuple, swapped whole, so threads may share it."""

    last: tuple[str, dict[str, Any]] = ("", {})
    # A larger state is not kept: the cache would hold it (twice: text and object) after its
    # run has ended, and a fan-out's items no longer read the state at all.
    KEPT_CHARS = 256 * 1024

    @classmethod
    def load(cls, text: str) -> dict[str, Any]:
        last = cls.last
        if last[0] == text:
            return last[1]
        obj = json.loads(text)
        cls.last = (text, obj) if len(text) <= cls.KEPT_CHARS else ("", {})
        return obj

    @classmethod
    def text_of(cls, obj: dict[str, Any]) -> str | None:
        """The text `obj` was read from, if it is the cached object (then it is unchanged)."""
        last = cls.last
        return last[0] if last[1] is obj else None


def row_to_run(r: Sequence[Any]) -> RunRecord:
    """A run from RUN_COLS (its state UNREAD) or RUN_WITH_STATE."""
    meta = json.loads(r[8])
    return RunRecord(id=r[0], name=r[1], status=r[2], step=r[3], root=r[5], idempotency_key=r[6],
                     definition=r[7], state=_StateCache.load(r[11]) if len(r) > 11 else UNREAD,
                     created_at=r[9], finished_at=r[10], loop=meta["loop"], visits=meta["visits"],
                     usage=meta["usage"], progress=meta["progress"], reason=meta["reason"], parent=meta["parent"])


@dataclasses.dataclass(frozen=True, slots=True)
class Steps:
    """What a transaction that may advance runs needs of its store besides the dialect:
    how it inserts a step's jobs (no admission: the engine asked room() first) and the
    store's queue cap (--max-queued) now."""

    submit: Callable[[Any, list[NewJob], float], None]  # (c, jobs, now)
    queue_cap: int | None


class _Tx:
    def __init__(self, d: Dialect, c: Any, steps: Steps) -> None:
        self.d, self.c, self.steps = d, c, steps
        self.unavailable = d.unavailable
        # Runs as lock_roots read them, each until this transaction writes it (then it is
        # read again: what was written may differ in type from what a read gives back,
        # a tuple for a list). Saves a chain's step its read of the run.
        self._locked: dict[int, RunRecord] = {}

    def _x(self, sql: str, params: tuple | list = ()) -> Any:
        return self.c.execute(self.d.q(sql), params)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        # Nested ones share the name: RELEASE and ROLLBACK TO take the latest of that name.
        self.c.execute("SAVEPOINT wf_run")
        try:
            yield
        except self.unavailable:
            raise  # the connection (or the file) is in trouble: the whole transaction goes
        except BaseException:
            self._locked.clear()  # what the block wrote is undone: read it all again
            self.c.execute("ROLLBACK TO SAVEPOINT wf_run")
            self.c.execute("RELEASE SAVEPOINT wf_run")
            raise
        self.c.execute("RELEASE SAVEPOINT wf_run")

    def lock_roots(self, run_ids: Iterable[int]) -> None:
        ids = sorted(run_ids)
        if not self.d.wf_lock or not ids:
            return
        marks = ",".join("?" * len(ids))
        rows = self._x(f"SELECT {RUN_COLS} FROM workflow_runs WHERE id IN (SELECT coalesce(root, id) FROM workflow_runs"
                       f" WHERE id IN ({marks})) ORDER BY id{self.d.wf_lock}", ids).fetchall()
        self._locked.update((r[0], row_to_run(r)) for r in rows)

    def run_get(self, run_id: int, state: bool = True) -> RunRecord | None:
        run = self._locked.get(run_id)
        if run is None:
            row = self._x(f"SELECT {RUN_COLS} FROM workflow_runs WHERE id = ?{self.d.wf_lock}",
                          (run_id,)).fetchone()
            if row is None:
                return None
            run = row_to_run(row)
        if state and run.state is UNREAD:
            text = self._x("SELECT state FROM workflow_states WHERE run = ?", (run_id,)).fetchone()[0]
            run = dataclasses.replace(run, state=_StateCache.load(text))
        return run

    def run_by_key(self, key: str) -> RunRecord | None:
        row = self._x(f"{RUN_WITH_STATE} WHERE r.idempotency_key = ?", (key,)).fetchone()
        return row_to_run(row) if row else None

    def run_insert(self, run: RunRecord) -> int:
        # workflow_runs.state is no longer read (the state is in workflow_states): '' in new rows.
        run_id = self._x("INSERT INTO workflow_runs (name, status, step, parent, root, idempotency_key, definition,"
                         " state, meta, created_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
                         (run.name, run.status, run.step, run.parent["run"] if run.parent else None, run.root,
                          run.idempotency_key, run.definition, "", dbrows.dumps(run.meta()), run.created_at,
                          run.finished_at)).fetchone()[0]
        self._x("INSERT INTO workflow_states (run, state) VALUES (?, ?)", (run_id, dbrows.dumps(run.state)))
        return run_id

    def run_update(self, run: RunRecord) -> None:
        # What a transition changes; the rest of the row is written once, by the insert, and
        # the state only when it changed (not UNREAD, nor the object as read).
        self._locked.pop(run.id, None)
        self._x("UPDATE workflow_runs SET status = ?, step = ?, meta = ?, finished_at = ? WHERE id = ?",
                (run.status, run.step, dbrows.dumps(run.meta()), run.finished_at, run.id))
        if run.state is not UNREAD and _StateCache.text_of(run.state) is None:
            self._x("UPDATE workflow_states SET state = ? WHERE run = ?", (dbrows.dumps(run.state), run.id))

    def output_add(self, run_id: int, out: Output, now: float) -> bool:
        return self._x("INSERT INTO workflow_outputs VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING 1",
                       (run_id, out.step, out.item, out.loop, out.ok,
                        None if out.value is None else dbrows.dumps(out.value), out.job_id, now)
                       ).fetchone() is not None

    def outputs(self, run_id: int, step: int, loop: int) -> list[tuple[int, bool, Any]]:
        rows = self._x("SELECT item, ok, value FROM workflow_outputs WHERE run = ? AND step = ? AND loop_no = ?",
                       (run_id, step, loop)).fetchall()
        return [(i, bool(ok), None if v is None else json.loads(v)) for i, ok, v in rows]

    def submit(self, jobs: Sequence[NewJob], now: float) -> None:
        self.steps.submit(self.c, list(jobs), now)

    def room(self) -> int | None:
        cap = self.steps.queue_cap
        return None if cap is None else cap - self._x(self.d.wf_waiting).fetchone()[0]

    def discard_jobs(self, run_id: int, now: float) -> int:
        return self._x("UPDATE jobs SET state = 'cancelled', finished_at = ? WHERE workflow_run = ?"
                       f" AND state IN {WAITING_IN}", (now, run_id)).rowcount

    def running_in_tree(self, root: int) -> list[RunRecord]:
        # Without their states: what is done with them (stopped, looked up) changes none.
        rows = self._x(f"SELECT {RUN_COLS} FROM workflow_runs WHERE root = ? AND status = 'running'", (root,))
        return [row_to_run(r) for r in rows.fetchall()]


def advance_in(d: Dialect, c: Any, s: Steps, done: list[tuple], now: float) -> None:
    """Advance the runs of finished step jobs: (job id, run, step, item, loop, ok, result,
    error) each (store/workflows.py: their roots locked first, one run's failure its own)."""
    wf.advance(_Tx(d, c, s), [wf.step_done(*x) for x in done], now)


def cancel_in(d: Dialect, c: Any, s: Steps, job_id: int, now: float) -> None:
    """Cancel a waiting job; a workflow step's job ends its item as failed, in the same transaction."""
    lock_step_roots(d, c, "j.id = ?", (job_id,))
    row = c.execute(d.q("UPDATE jobs SET state = 'cancelled', finished_at = ? WHERE id = ?"
                        f" AND state IN {WAITING_IN} RETURNING {STEP_OF_JOB}"), (now, job_id)).fetchone()
    if row is not None:
        steps_cancelled_in(d, c, s, [row], now)


def lock_step_roots(d: Dialect, c: Any, where: str, params: tuple | list) -> None:
    """Where runs are locked (PostgreSQL): the roots of the step jobs `where` selects
    (alias j), before those jobs' rows, in the order a finish takes them."""
    if d.wf_lock:
        c.execute(d.q("SELECT id FROM workflow_runs WHERE id IN (SELECT coalesce(r.root, r.id) FROM jobs j"
                      f" JOIN workflow_runs r ON r.id = j.workflow_run WHERE {where}) ORDER BY id{d.wf_lock}"),
                  params).fetchall()


def steps_cancelled_in(d: Dialect, c: Any, s: Steps, rows: Sequence[Sequence[Any]], now: float) -> None:
    """Jobs cancelled outside a finish, as rows of STEP_OF_JOB: the workflow steps' among
    them end their items as failed ("cancelled"), in the same transaction."""
    done = [(r[0], *r[1:5], False, None, dict(wf.CANCELLED)) for r in rows if r[1] is not None]
    if done:
        advance_in(d, c, s, done, now)


def advance_dead_in(d: Dialect, c: Any, s: Steps, job_ids: list[int], error: dict, now: float) -> None:
    """Jobs made dead outside a finish (orphaned too often): their runs advance as for a failure."""
    marks = ",".join("?" * len(job_ids))
    rows = c.execute(d.q(f"SELECT {STEP_OF_JOB} FROM jobs WHERE id IN ({marks}) AND workflow_run IS NOT NULL"),
                     job_ids).fetchall()
    if rows:
        advance_in(d, c, s, [(*r, False, None, error) for r in rows], now)


def start(d: Dialect, c: Any, s: Steps, spec: Definition, state: dict[str, Any], now: float,
          idempotency_key: str | None = None) -> tuple[RunRecord, bool]:
    return wf.start(_Tx(d, c, s), spec, state, now, idempotency_key)


def cancel(d: Dialect, c: Any, s: Steps, run_id: int, now: float) -> RunRecord | None:
    return wf.cancel(_Tx(d, c, s), run_id, now)


def get(d: Dialect, c: Any, run_id: int) -> RunRecord | None:
    row = c.execute(d.q(f"{RUN_WITH_STATE} WHERE r.id = ?"), (run_id,)).fetchone()
    return row_to_run(row) if row else None


def jobs(d: Dialect, c: Any, run_id: int) -> list[Job]:
    rows = c.execute(d.q(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE workflow_run = ? ORDER BY id"),
                     (run_id,)).fetchall()
    return [dbrows.row_to_job(r) for r in rows]


def outputs(d: Dialect, c: Any, run_id: int) -> list[dict[str, Any]]:
    rows = c.execute(d.q("SELECT step, item, loop_no, ok, value, job_id FROM workflow_outputs WHERE run = ?"
                         " ORDER BY step, item, loop_no"), (run_id,)).fetchall()
    return [{"step": s, "item": i, "loop": lp, "ok": bool(ok), "value": None if v is None else json.loads(v),
             "job_id": j} for s, i, lp, ok, v, j in rows]


def runs(d: Dialect, c: Any, state: str | None, limit: int) -> list[RunRecord]:
    where, params = ("", (limit,)) if state is None else (" WHERE r.status = ?", (state, limit))
    rows = c.execute(d.q(f"{RUN_WITH_STATE}{where} ORDER BY r.id DESC LIMIT ?"), params).fetchall()
    return [row_to_run(r) for r in rows]


def children(d: Dialect, c: Any, run: RunRecord) -> list[RunRecord]:
    rows = c.execute(d.q(f"{RUN_WITH_STATE} WHERE r.root = ? AND r.parent = ? ORDER BY r.id"),
                     (run.root or run.id, run.id)).fetchall()
    return [row_to_run(r) for r in rows]


def counts(d: Dialect, c: Any) -> dict[str, Any]:
    by_state = dict.fromkeys(RunState.ALL, 0)
    by_state.update(c.execute("SELECT status, count(*) FROM workflow_runs GROUP BY status").fetchall())
    stops = dict(c.execute(f"SELECT {d.wf_budget}, count(*) FROM workflow_runs"
                           " WHERE status = 'budget_exceeded' GROUP BY 1").fetchall())
    return {"runs": by_state, "budget_stops": {k: v for k, v in stops.items() if k is not None}}
