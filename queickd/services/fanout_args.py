"""A fan-out item's arguments, completed when it starts: (item, the run's state).

A for_each step's item jobs are stored as `[item, null]`; the run's state, the second
argument of every item's function, takes the null's place here, in the pool that starts
the job (a state is always an object, so a stored null is never a state).
Stored in each item's job, the state was written once per item: a thousand items of a
50 KB state, 50 MB of jobs. The state an item gets is the run's as its step entered the
fan-out: the run's state does not change while its current step waits for its items, so
one read per fan-out (run, step, loop) serves all its items here, kept a while as JSON
text and decoded afresh for each job (an item's function may change its arguments).

An item that starts after its step is over (its run moved on: first_success, a failure, a
cancel) gets its fan-out's state if this pool still keeps it, else the run's state as it is
then; its outcome is not recorded either way. An item
job stored with its state (by a version before this one) runs as stored, and so does every
other job, a task step's included (`[state]`: one per step, not per item).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Protocol

from ..core import jsontext
from ..core.job import Job
from ..core.workflow import RunRecord

KEPT = 8  # fan-outs whose state is kept: the ones running now, on any sane pool


class RunReader(Protocol):
    def workflow_get(self, run_id: int) -> RunRecord | None: ...


class RunGoneError(LookupError):
    """The item's run is no longer stored (retention removed it): the job cannot run."""


def needs_state(job: Job) -> bool:
    """A fan-out item stored without its run's state (`[item, null]`)."""
    return job.workflow_run is not None and len(job.args) == 2 and job.args[1] is None


class FanOutArgs:
    """Completes fan-out items' arguments from their run's state, read once per fan-out.
    Any thread."""

    def __init__(self, store: RunReader, kept: int = KEPT) -> None:
        self.store = store
        self.kept = kept
        # (run, step, loop) -> the state's JSON; a run's id is never given again (SQLite's
        # AUTOINCREMENT, PostgreSQL's identity, the memory store's counter), so a key names
        # one fan-out for ever.
        self._states: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0  # runs read from the store (one per fan-out, while it is current)

    def complete(self, job: Job) -> Job:
        """`job` with its run's state in place when it needs it, else `job` itself.
        Raises RunGoneError, or the store's error when it cannot be read."""
        if not needs_state(job):
            return job
        key = (job.workflow_run, job.workflow_step, job.workflow_loop)
        with self._lock:
            text = self._states.get(key)  # type: ignore[arg-type]
        if text is None:
            text = self._read(key)  # type: ignore[arg-type]
        return replace(job, args=[job.args[0], jsontext.loads(text)])

    def _read(self, key: tuple[int, int, int]) -> str:
        run_id, step, loop = key
        run = self.store.workflow_get(run_id)
        self.reads += 1
        if run is None:
            raise RunGoneError(f"workflow run {run_id} is no longer stored")
        text = jsontext.dumps(run.state)
        if run.step == step and run.loop == loop:  # the fan-out is current: its state holds
            with self._lock:
                self._states[key] = text
                while len(self._states) > self.kept:
                    self._states.popitem(last=False)
        return text
