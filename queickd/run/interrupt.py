"""Stopping a thread job: `JobInterrupted` raised in its thread at its timeout or when an
operator cancels it, through CPython's PyThreadState_SetAsyncExc.

The exception is checked for between bytecodes only: it interrupts Python code, never a
call blocked in C (`time.sleep(60)`, a socket read without a timeout, a driver's query),
which gets it only as it returns. A job may catch it; it is sent again every RESEND seconds
until the call returns, its worker thread taken until then.

`Stops` owns the jobs running in threads (id -> `ThreadRun`) and one thread of its own,
started with the first timed or cancelled run, that sends the exceptions and sleeps while
nothing is due. It never touches the store nor decides a fate (the runner reports
`ThreadRun.why`).
"""

from __future__ import annotations

import ctypes
import threading
import time

from ..core.fate import CANCELLED
from ..core.policy.liveness import STALLED
from .base import CANCEL_KEPT
from .context import CurrentJob, JobInterrupted, Ticks

RESEND = 1.0  # seconds between two sends of JobInterrupted to a job that has not returned
TIMEOUT = "timeout"  # the error type of a run stopped at its timeout, as a process run's


_set_async = getattr(ctypes, "pythonapi", None) and ctypes.pythonapi.PyThreadState_SetAsyncExc
if _set_async:
    _set_async.argtypes = (ctypes.c_ulong, ctypes.py_object)
    _set_async.restype = ctypes.c_int


def _send(ident: int) -> None:
    if _set_async:
        _set_async(ident, JobInterrupted)


def _clear(ident: int) -> None:
    if _set_async:
        _set_async(ident, ctypes.py_object())  # NULL: drops an exception not yet raised


class ThreadRun(CurrentJob):
    """One job's run in a worker thread: what queickd.current_job() returns there (its
    `cancelled` set by Stops.cancel), and how far its stop has gone."""

    __slots__ = ("ident", "timeout", "ends", "why", "leaving", "sending", "sent", "next_send")

    def __init__(self, job_id: int, attempt: int, timeout: float | None, began: float,
                 workflow_key: str | None = None, ticks: Ticks | None = None) -> None:
        super().__init__(job_id, attempt, None if timeout is None else time.time() + timeout, workflow_key, ticks)
        self.ident = threading.get_ident()  # made by the thread that runs it
        self.timeout = timeout
        self.ends = None if timeout is None else began + timeout  # monotonic
        self.why: str | None = None  # TIMEOUT, STALLED or CANCELLED once the run was told to stop
        # `leaving` is set by the run's thread once the job's call has returned, `sending`
        # by the stopping thread before it looks at `leaving` (under Stops._send_lock): one
        # of them sees the other's, so a run whose thread saw no `sending` gets no send.
        self.leaving = False
        self.sending = False
        self.sent = False
        self.next_send: float | None = None


class Stops:
    """The thread runs of one runner, and the thread that stops them. Any thread."""

    def __init__(self, clock=time.monotonic) -> None:  # noqa: ANN001 - a monotonic clock
        self._clock = clock
        self._runs: dict[int, ThreadRun] = {}  # job id -> its run (a dict's set and pop are atomic)
        self._due: set[ThreadRun] = set()  # runs with a deadline ahead or an exception to send again
        # Jobs claimed here and cancelled before their run entered (a slow import): job id
        # -> when, kept CANCEL_KEPT seconds. Changed, as _runs is looked at, under _cond.
        self._early: dict[int, float] = {}
        self._cond = threading.Condition()  # notified when _due gains a run or a cancel comes
        # Held while an exception is sent and while a run that may have been sent one drops
        # what is pending: a send under way is over before the drop, and none starts after.
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def enter(self, run: ThreadRun) -> None:
        """Called by the thread about to call the job's function (which made `run`)."""
        with self._cond:  # with cancel's look at _runs: a cancel either finds the run or is early
            self._runs[run.id] = run
            if self._take_early(run.id):
                self._cancel(run)
            elif run.ends is not None:
                self._add(run)

    def cancelled_early(self, job_id: int) -> bool:
        """Whether the job was cancelled while held, before any run of it entered (taken:
        True once). For a run that does not enter here: an async job's on the event loop."""
        with self._cond:
            return self._take_early(job_id)

    def _take_early(self, job_id: int) -> bool:  # holds _cond
        early = self._early.pop(job_id, None) if self._early else None
        return early is not None and self._clock() - early < CANCEL_KEPT

    def leave(self, run: ThreadRun) -> None:
        """Called by the run's thread once the job's call has returned and `run.leaving` is
        set: waits out a send under way, then drops an exception sent and not yet raised.
        An exception raised meanwhile interrupts this call; the caller calls it again
        (ThreadRunner._run), and after `leaving` at most two can come."""
        if run.sending:  # else nothing was sent, and nothing will be (see ThreadRun)
            with self._send_lock:
                if run.sent:
                    _clear(run.ident)
        self._runs.pop(run.id, None)
        if run.ends is not None or run.why is not None:
            with self._cond:
                self._due.discard(run)

    def cancel(self, job_id: int, held: bool = False) -> bool:
        """An operator cancelled this job: JobInterrupted is sent to its thread now (and
        again until it returns). False when no thread runs it here; a job `held` (claimed
        here) is then stopped as its run enters, if that comes within CANCEL_KEPT seconds."""
        with self._cond:
            run = self._runs.get(job_id)
            if run is None:
                if held:
                    now = self._clock()
                    self._early = {j: t for j, t in self._early.items() if now - t < CANCEL_KEPT}
                    self._early[job_id] = now
                return False
            self._cancel(run)
        return True

    def stall(self, job_id: int) -> bool:
        """The job's liveness watch found it stalled (core/policy/liveness.py, on_stall =
        kill): JobInterrupted is sent to its thread now, as at its timeout. False when no
        thread runs it here."""
        with self._cond:
            run = self._runs.get(job_id)
            if run is None:
                return False
            if run.why is None:  # a timeout or a cancel that came first stands
                run.why, run.next_send = STALLED, self._clock()
                self._add(run)
        return True

    def _cancel(self, run: ThreadRun) -> None:  # holds _cond
        run.cancelled = True
        run.why, run.next_send = CANCELLED, self._clock()  # a cancel says more than a timeout
        self._add(run)

    def stopping(self) -> frozenset[int]:
        """The jobs told to stop (timed out, cancelled) whose call has not returned yet."""
        return frozenset(r.id for r in list(self._runs.values()) if r.why is not None)

    def _add(self, run: ThreadRun) -> None:  # holds _cond
        """`run` has a send due: the stopping thread (started now if need be) looks again."""
        self._due.add(run)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="queickd-thread-stops", daemon=True)
            self._thread.start()
        self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while True:
                now = self._clock()
                for run in list(self._due):
                    if run.leaving:  # its call has returned (a cancel may have come just after)
                        self._due.discard(run)
                    elif run.why is None and run.ends is not None and now >= run.ends:
                        self._send(run, TIMEOUT)
                        run.next_send = now + RESEND
                    elif run.why is not None and run.next_send is not None and now >= run.next_send:
                        self._send(run, run.why)
                        run.next_send = now + RESEND
                due = [t for r in self._due for t in (r.ends if r.why is None else r.next_send,)
                       if t is not None]
                self._cond.wait(max(0.0, min(due) - self._clock()) if due else None)

    def _send(self, run: ThreadRun, why: str) -> None:
        """Raise JobInterrupted in the run's thread, unless its call has returned: a job that
        ended just at its deadline is not called timed out."""
        with self._send_lock:
            run.sending = True
            if not run.leaving:
                run.why = run.why or why
                _send(run.ident)
                run.sent = True
