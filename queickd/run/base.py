"""The runner seam: what running one job returns (`RunReport`) and who runs it (`Runner`).

A runner reports what happened as plain data: the result, or the error with the hints the
job's exception gave (`permanent`, `retry_after`, network class). `core.fate` decides the
job's outcome from the report alone, so a job run in another process is judged exactly
like one run in a worker thread. A runner never decides a fate and never touches the
store; only a runner in another process needs `to_dict`/`from_dict` (JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

from ..core.job import Job


@dataclass(slots=True)
class RunReport:
    """How one run of a job ended. Every field is JSON data (see to_dict)."""

    ok: bool
    result: Any = None  # as it can be stored (fate.storable_result); None on failure
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None  # None when there is none to show (a refused function)
    permanent: bool = False  # retrying cannot help: dead at once
    retry_after: float | None = None  # the job's own delay for its next attempt, as given
    network: bool = False  # a network-class failure (connection, timeout, DNS)
    resource: bool = False  # the host ran out of file descriptors (EMFILE/ENFILE): not the job's fault
    runtime: float = 0.0  # seconds, wall clock, around the call
    peak_memory: int | None = None  # bytes; None where the runner cannot measure it
    peak_estimated: bool = False  # peak_memory is the process's RSS growth over a thread run
    cpu_time: float | None = None  # seconds; None where the runner cannot measure it (threads)
    # A process run's captured stdout+stderr, success or failure (capped, a marker when cut);
    # None for a thread run or a run that wrote nothing. Stored as the job's `output`.
    output: str | None = None

    def error(self) -> dict[str, Any]:
        """The error as a job records it: type, message and, when there is one, traceback."""
        err: dict[str, Any] = {"type": self.error_type, "message": self.error_message}
        if self.traceback is not None:
            err["traceback"] = self.traceback
        return err

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies every value, and a process job's child
        # pays for each object it touches (its pages are copied from the zygote's).
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunReport:
        """The report from its to_dict() form (after JSON); unknown keys are ignored, so a
        newer runner's report still reads."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


_FIELDS = tuple(f.name for f in fields(RunReport))


# Seconds a cancel of a job claimed here whose run has not begun (its worker still importing
# its module, its process still starting) waits for the run: it is stopped as it begins.
CANCEL_KEPT = 10.0


class Runner(Protocol):
    """Executes one claimed job; never raises for what the job does (that is the report)."""

    def run(self, job: Job) -> RunReport: ...

    def cancel(self, job_id: int, held: bool = False) -> None:
        """An operator cancelled this job while it runs (the store has it `cancelled`
        already): the runner stops the run (a process is killed; a thread gets
        JobInterrupted, which a call blocked in C sees only as it returns) and its run()
        reports `cancelled` once it has really ended. Called from any thread; a job not
        running here is ignored, unless `held` (claimed here, its run about to begin): then
        the run is stopped as it begins (for CANCEL_KEPT seconds)."""

    def stopping(self) -> frozenset[int]:
        """The jobs running here that were told to stop (timed out, cancelled) and have not
        ended yet. Any thread; approximate."""
