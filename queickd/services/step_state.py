"""A workflow step job's arguments, completed when it starts: the run's state put in.

The run's state is the last argument of every step function: `func(state)` for a task,
`func(item, state)` for a fan-out's item. Not to store it in every item's job (and every
pass of a loop), a fan-out item's job is stored as `[item, null]`, and a task's as `[null]`
when the state is larger than the engine keeps inline (engine.INLINE_STATE_BYTES); here, in
the pool that starts the job, the run's state takes the null's place (a state is always an
object, so a stored null is never a state).

The run's state does not change while its current step waits for its jobs, so one read per
step visit (run, step, loop) serves all a fan-out's items, kept a while as JSON text and
decoded afresh for each job (a function may change its arguments). A job that starts after
its step is over (its run moved on) gets its step's state if this pool still keeps it, else
the run's as it is then; its outcome is not recorded either way. A step job stored with its
state runs as stored, as every other job does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Protocol

from ..core import jsontext
from ..core.job import Job
from ..core.workflow import RunRecord

KEPT = 8  # step visits whose state is kept: the fan-outs running now, on any sane pool
# Characters of state text kept in all: a daemon's memory for states is bounded whatever
# the budgets allow a state to be (a state above it is read for each of its items instead).
KEPT_CHARS = 8 * 1024 * 1024


class RunReader(Protocol):
    def workflow_get(self, run_id: int) -> RunRecord | None: ...


class RunGoneError(LookupError):
    """The job's run is no longer stored (retention removed it): the job cannot run."""


def needs_state(job: Job) -> bool:
    """A step job stored without its run's state: `[item, null]` or `[null]`."""
    if job.workflow_run is None:
        return False
    args = job.args
    return (len(args) == 2 and args[1] is None) or (len(args) == 1 and args[0] is None)


def _state_for(run: RunRecord, step: int) -> tuple[dict, bool]:
    """The state a job of the run's step gets, and whether the step is a fan-out (whose
    items share it: worth keeping). A fan-out's item gets the state without the list fanned
    out (it has its own item), else each item's decode would cost the whole list."""
    spec = run.spec
    fan = spec.steps[step] if step < len(spec.steps) else None
    if fan is None or fan.kind != "for_each":
        return run.state, False
    return {k: v for k, v in run.state.items() if k != fan.items}, True


class StepState:
    """Completes step jobs' arguments from their run's state, read once per step visit.
    Any thread."""

    def __init__(self, store: RunReader, kept: int = KEPT, kept_chars: int = KEPT_CHARS) -> None:
        self.store = store
        self.kept = kept
        self.kept_chars = kept_chars
        self._chars = 0  # of the texts in _states
        # (run, step, loop) -> the state's JSON; a run's id is never given again (SQLite's
        # AUTOINCREMENT, PostgreSQL's identity), so a key names one step visit for ever.
        self._states: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        # Step visits being read now: the workers that start a fan-out's first items together
        # wait for the one read rather than each reading the run.
        self._reading: dict[tuple[int, int, int], threading.Event] = {}
        self._lock = threading.Lock()
        self.reads = 0  # runs read from the store (one per step visit, while it is current)

    def complete(self, job: Job) -> Job:
        """`job` with its run's state in place when it needs it, else `job` itself.
        Raises RunGoneError, or the store's error when it cannot be read."""
        if not needs_state(job):
            return job
        key = (job.workflow_run, job.workflow_step, job.workflow_loop)
        text = self._text(key)  # type: ignore[arg-type]
        state = jsontext.loads(text)
        return replace(job, args=[job.args[0], state] if len(job.args) == 2 else [state])

    def _text(self, key: tuple[int, int, int]) -> str:
        """The state's JSON for a step visit: kept, read by another thread just now, or read."""
        with self._lock:
            text = self._states.get(key)
            if text is not None:
                return text
            other = self._reading.get(key)
            if other is None:
                mine = self._reading[key] = threading.Event()
        if other is not None:
            other.wait()
            with self._lock:
                text = self._states.get(key)
            # Not kept (the step is over, or that read failed): a read of this job's own.
            return text if text is not None else self._read(key, None)
        return self._read(key, mine)

    def _read(self, key: tuple[int, int, int], done: threading.Event | None) -> str:
        run_id, step, loop = key
        try:
            run = self.store.workflow_get(run_id)
            with self._lock:
                self.reads += 1
            if run is None:
                raise RunGoneError(f"workflow run {run_id} is no longer stored")
            state, shared = _state_for(run, step)
            text = jsontext.dumps(state)
            # Kept for a fan-out whose step is current (its state holds until the step is
            # over); a task's step visit has one job: nothing to keep it for.
            if shared and run.step == step and run.loop == loop and len(text) <= self.kept_chars:
                with self._lock:
                    self._chars += len(text) - len(self._states.pop(key, ""))
                    self._states[key] = text
                    while len(self._states) > self.kept or self._chars > self.kept_chars:
                        self._chars -= len(self._states.popitem(last=False)[1])
            return text
        finally:
            if done is not None:
                with self._lock:
                    del self._reading[key]
                done.set()
