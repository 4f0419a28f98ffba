"""Storing the outcomes of finished runs when a pass's batch could not: one by one, and
what a stored outcome's report says to the operator (a pause begun by a run of failures)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core.job import Outcome
from ..store.contract.queue import Queue
from ..store.records import Finished

log = logging.getLogger("queickd.worker")


def store_one_by_one(store: Queue, outcomes: list[Outcome], clock: Callable[[], float],
                     pause_after: int | None, pause_cooldown: float | None,
                     ) -> tuple[list[tuple[Outcome, Finished | None]], list[Outcome]]:
    """After a failed batch: apply outcomes one by one, so that one the store cannot take
    (a bug, bad data) cannot hold up the others; such a one is recorded as dead with a
    plain error. -> (those stored, each as stored with its report; those still not stored,
    the store itself being in trouble).

    An error the store reports as its own (store.UNAVAILABLE: a lost connection, a failing
    disk) is never an outcome's fault: it stops there and every outcome not yet stored is
    kept, as it is, for the next pass (which reconnects)."""
    stored: list[tuple[Outcome, Finished | None]] = []
    left: list[Outcome] = []
    for i, o in enumerate(outcomes):
        for attempt in (o, Outcome.dead(o.job_id, {"type": "unstorable_outcome",
                                                   "message": "the job's outcome could not be stored"},
                                        o.workflow_run)):
            try:
                report = store.finish_if_running([attempt], clock(), pause_after, pause_cooldown)
            except store.UNAVAILABLE:
                return stored, left + outcomes[i:]
            except Exception:
                continue
            stored.append((attempt, report))
            break
        else:
            left.append(o)
    return stored, left


def log_pauses(report: Finished | None, now: float) -> None:
    """One warning for each pause the stored outcomes began."""
    for p in report.paused if report else ():
        err = p.last_error or {}
        until = ("until 'queick resume' or a manual run" if p.probe_at is None else
                 f"until a probe job in {p.probe_at - now:.0f} s succeeds, 'queick resume' or a manual run")
        log.warning("%s %s paused after %d failed runs in a row (last: %s: %s); its jobs wait "
                    "%s", p.kind, p.name, p.failures, err.get("type"), err.get("message"), until)
