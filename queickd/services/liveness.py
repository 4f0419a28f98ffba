"""The liveness watch: the runs of jobs with a `stalled_after`, each marked `stalled` in the
store when it has reported no progress (nor, in a process, used CPU time) for that long,
and stopped when its `on_stall` is "kill" (core/policy/liveness.py has the rule).

The runner tells it as each such run begins and ends (run/routing.py), and every progress
value of a run passes through `sink` on its way to the progress writer. Its one thread,
started with the first watched run, sleeps until the earliest run is due (no polling); a
process job's CPU time is read then, and any growth counts as alive. The mark (by the host
that runs the job, seen by every host) is cleared by a progress write
(set_progress_if_running), and here when a process job uses CPU again and when the run
ends. A failed write is logged once and dropped: it never decides a job's fate. A run
killed (RoutingRunner.stall) is judged by core/fate.py as a timeout is (error `stalled`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..core.job import Job
from ..core.policy import liveness
from ..run import capture, context
from ..store.contract.queue import Queue

log = logging.getLogger("queickd.liveness")


class Stoppable(Protocol):
    def stall(self, job_id: int, message: str) -> bool: ...

    def cpu_time(self, job_id: int) -> float | None: ...


class _Run:
    __slots__ = ("job_id", "attempt", "after", "kill", "process", "alive_at", "cpu", "marked", "due", "said")

    def __init__(self, job: Job, process: bool, now: float) -> None:
        self.job_id = job.id
        self.attempt = job.attempts
        self.after: float = job.stalled_after  # type: ignore[assignment]
        self.kill = job.on_stall == liveness.KILL
        self.process = process
        self.alive_at = now  # monotonic: its run began, it reported, or its CPU time grew
        # The last look at a process job's CPU time: a fresh child's starts at none.
        self.cpu: float | None = 0.0 if process else None
        self.marked = False  # the store has (or is being given) its mark
        self.due = liveness.due(now, self.after)
        self.said = 0  # progress values reported: a mark decided before one is undone after


class LivenessWatch:
    """began/ended/sink from any thread (never blocking on the store); start() implicit,
    stop() idempotent. `clock` is monotonic (when runs are due), `wall` unix time (marks);
    `thread` False leaves the looks to tick() (tests with their clocks)."""

    def __init__(self, store: Queue, runner: Stoppable, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, thread: bool = True) -> None:
        self.store = store
        self.runner = runner
        self._clock = clock
        self._wall = wall
        self._runs: dict[int, _Run] = {}  # job id -> its watched run
        self._clears: list[tuple[int, int]] = []  # (job id, attempt) marks to clear
        self._cond = threading.Condition()  # guards the above; notified when one changes
        self._thread: threading.Thread | None = None
        self._threaded = thread  # False: no thread of its own; the caller calls tick()
        self._waking: float | None = None  # when the thread's wait ends (None: not before a notify)
        self._stopping = False
        self._failing = False  # the last write failed (written by the watch's thread only)
        self.stalls = dict.fromkeys(liveness.ON_STALL, 0)  # runs found stalled, by on_stall

    # --- from the runner's threads -------------------------------------------------------
    def began(self, job: Job, process: bool) -> None:
        """A run of a job with a stalled_after begins (`process`: in a process)."""
        run = _Run(job, process, self._clock())
        with self._cond:
            self._runs[job.id] = run
            if job.stalled_at is not None:  # a mark left by a run its daemon never ended
                self._clears.append((job.id, job.attempts))
            if self._thread is None and self._threaded and not self._stopping:
                self._thread = threading.Thread(target=self._loop, name="queickd-liveness", daemon=True)
                self._thread.start()
            if job.stalled_at is not None or self._waking is None or run.due < self._waking:
                self._cond.notify()  # else its wait ends before this run is due: no wake per run

    def ended(self, job: Job) -> None:
        """Its run has ended: not watched any more, its mark cleared."""
        with self._cond:
            run = self._runs.pop(job.id, None)
            if run is not None and run.marked:
                self._clears.append((run.job_id, run.attempt))
                self._cond.notify()

    def sink(self, offer: context.ProgressSink) -> context.ProgressSink:
        """The progress sink to give the runner: each value says its run is alive, then goes
        to `offer` (the progress writer, whose write clears a mark)."""
        runs, clock = self._runs, self._clock

        def alive(job_id: int, attempt: int, done: float, total: float | None, note: str | None,
                  at: float) -> None:
            # No lock: one thread reports for a run, and a look that judged it meanwhile sees
            # `said` moved once its mark is written, and takes the mark back (_act).
            run = runs.get(job_id)
            if run is not None:
                run.alive_at = clock()
                run.said += 1
                run.marked = False  # the write of this value clears it
            offer(job_id, attempt, done, total, note, at)

        return alive

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify()
        if thread is not None:
            thread.join()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"watched": len(self._runs), "stalled": sum(r.marked for r in self._runs.values()),
                    "stalls": dict(self.stalls)}

    # --- the watch's thread ----------------------------------------------------------------
    def tick(self) -> None:
        """One look, in the calling thread: the runs due judged (marked, killed, unmarked)
        and the marks of ended runs cleared. The watch's thread calls it when a run is due
        or a clear waits; a test calls it after moving its clock."""
        with self._cond:
            now = self._clock()
            due = [r for r in self._runs.values() if r.due <= now]
            clears, self._clears = self._clears, []
        found = self._look(due)
        self._write([(j, a, None) for j, a in clears])
        if found:
            self._act(found)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping:
                    now = self._clock()
                    if self._clears or any(r.due <= now for r in self._runs.values()):
                        break
                    self._waking = min((r.due for r in self._runs.values()), default=None)
                    self._cond.wait(None if self._waking is None else self._waking - now)
                    self._waking = None
                if self._stopping:
                    clears, self._clears = self._clears, []
            if self._stopping:
                self._write([(j, a, None) for j, a in clears])
                return
            self.tick()

    def _look(self, due: list[_Run]) -> list[tuple[_Run, int]]:
        """The due runs' CPU time read (outside the lock: a /proc walk), then each judged:
        (run, progress values it had said) for those found stalled now."""
        cpu = {r.job_id: self.runner.cpu_time(r.job_id) for r in due if r.process}
        found, resumed = [], []
        with self._cond:
            now = self._clock()
            for r in due:
                if self._runs.get(r.job_id) is not r:
                    continue  # ended meanwhile
                said = r.said  # before alive_at: a report that comes after shows in one or the other
                seen = cpu.get(r.job_id)
                if r.process and liveness.cpu_alive(r.cpu, seen):
                    r.alive_at = now
                    if r.marked:
                        r.marked = False
                        resumed.append((r.job_id, r.attempt))
                if seen is not None:
                    r.cpu = seen
                if liveness.stalled(r.alive_at, r.after, now) and not r.marked:
                    r.marked = True
                    found.append((r, said))
                # Marked: due again only to see a process job's CPU time grow; a report unmarks it.
                r.due = liveness.due(max(r.alive_at, now) if r.marked else r.alive_at, r.after)
        if resumed:
            self._write([(j, a, None) for j, a in resumed])
        return found

    def _act(self, found: list[tuple[_Run, int]]) -> None:
        at = self._wall()
        self._write([(r.job_id, r.attempt, at) for r, _ in found])
        undone, stalled = [], []
        with self._cond:
            for r, said in found:
                if r.said != said:  # it reported while it was judged or its mark written: the
                    undone.append((r.job_id, r.attempt, None))  # progress write may have come first
                    r.marked = False
                else:
                    stalled.append(r)
                    self.stalls[liveness.KILL if r.kill else liveness.MARK] += 1
        self._write(undone)
        for r in stalled:
            what = "killed" if r.kill else "marked stalled"
            log.warning("job %d: no progress%s for %g s (stalled_after): %s", r.job_id,
                        " nor CPU time" if r.process else "", r.after, what)
            if r.kill:
                self.runner.stall(r.job_id, capture.stall_text(r.after, r.process) + " and was killed")

    def _write(self, updates: list[tuple[int, int, float | None]]) -> None:
        if not updates:
            return
        try:
            self.store.set_stalled(updates)
        except Exception as e:  # the store in trouble: the marks wait for the next change
            if not self._failing:
                log.warning("cannot store the stalled marks of %d job(s): %s", len(updates), e)
            self._failing = True
            return
        self._failing = False
