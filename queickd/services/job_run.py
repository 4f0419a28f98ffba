"""One run of a claimed job on a worker thread, and the outcome core.fate decides for it.

Whatever the runner or the decision does, the job leaves `running`: a decision that itself
fails makes the job dead with a plain error, never a job stuck in `running`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..core import fate
from ..core.job import Job, Outcome, State
from ..run.base import Runner, RunReport
from .step_state import RunGoneError

log = logging.getLogger("queickd.worker")


def run_job(runner: Runner, job: Job, clock: Callable[[], float], network_checker: Callable[[], bool],
            network_up: Callable[[], bool] = lambda: False,
            arguments: Callable[[Job], Job] | None = None) -> tuple[Outcome, float, RunReport | None]:
    """Run `job` -> (its outcome, its runtime, the runner's report; None if the runner
    failed). The clock and the network checker's state are read on failure only.
    `arguments` completes what the job is called with first (step_state: the run's state
    of a workflow step job stored without it); when that fails the job does not start
    (see _completed)."""
    report: RunReport | None = None
    try:
        called, report = _completed(job, arguments)
        if report is None:
            report = runner.run(called)
    except BaseException as e:  # the runner itself failed: the job must still leave `running`
        return _logged(job, _undecided(job, e), 0.0), 0.0, None
    outcome, runtime = judge(job, report, clock, network_checker, network_up)
    return outcome, runtime, report


def judge(job: Job, report: RunReport, clock: Callable[[], float], network_checker: Callable[[], bool],
          network_up: Callable[[], bool] = lambda: False) -> tuple[Outcome, float]:
    """The outcome core.fate decides for a run that ended with `report`, and its runtime
    (logged when the job did not succeed). For a run the worker thread did not make
    itself too (an async job's, on the event loop's thread): it never blocks."""
    try:
        if report.ok:
            outcome = fate.after_success(job, report)
        else:
            checker = network_checker()
            outcome = fate.after_failure(job, report, clock(), checker, network_up=checker and network_up())
    except BaseException as e:  # deciding itself failed: the job must still leave `running`
        outcome = _undecided(job, e)
    return _logged(job, outcome, report.runtime), report.runtime


def _logged(job: Job, outcome: Outcome, runtime: float) -> Outcome:
    if outcome.state == State.CANCELLED:
        log.info("job %d %s cancelled: its run ended %.1f s after it began (attempt %d/%d)", job.id, job.func,
                 runtime, job.attempts, job.max_attempts)
    elif outcome.rate_until is not None:
        log.info("job %d %s refused for its rate: %s: %s -> rate key %s starts nothing until %s; the job waits"
                 " in its place, no attempt spent", job.id, job.func, outcome.error["type"], outcome.error["message"],
                 job.rate_limit["key"], time.strftime("%H:%M:%S", time.localtime(outcome.rate_until)))
    elif outcome.state != State.SUCCEEDED:
        log.info(
            "job %d %s failed (attempt %d/%d): %s: %s -> %s", job.id, job.func, job.attempts,
            job.max_attempts, outcome.error["type"], outcome.error["message"], outcome.state,
        )
    return outcome


def _undecided(job: Job, e: BaseException) -> Outcome:
    return Outcome.dead(job.id, {"type": type(e).__name__, "message": "queickd could not record this job's outcome"},
                        job.workflow_run)


def _completed(job: Job, arguments: Callable[[Job], Job] | None) -> tuple[Job, RunReport | None]:
    """(the job as it is called, None), or (job, why it cannot start as a failed run's
    report). A run gone is final; a store that cannot be read now is no fault of the job's
    (`resource`: retried, its attempt not spent, as for a host out of file descriptors)."""
    if arguments is None:
        return job, None
    try:
        return arguments(job), None
    except RunGoneError as e:
        return job, RunReport(False, None, "run_gone", str(e), None, permanent=True)
    except Exception as e:
        log.warning("job %d: could not read its workflow run's state: %s", job.id, e)
        return job, RunReport(False, None, "store_unavailable",
                              f"could not read the workflow run's state for this step job: {e}", None, resource=True)
