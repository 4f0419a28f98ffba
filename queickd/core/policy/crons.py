"""Cron firing and folding: what a due tick of a cron does.

The store reads the cron (its template, at the tick it was due) and whether a run of it
is still waiting; this module decides. A tick while a run waits is folded into that run
(counted, no second job: a slow queue never piles up runs of one cron). Otherwise the
tick fires a job built from the template: due now, serialized under the cron's own name
unless the template names a key, and idempotent per (cron, tick) so a tick never fires
twice. The store writes the advanced cron and submits the job. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..job import NewJob


@dataclass(frozen=True, slots=True)
class Fire:
    folded: bool
    job: NewJob | None  # the job to submit; None when folded


def job_for(name: str, template: NewJob, tick: float, now: float) -> NewJob:
    return dataclasses.replace(template, run_at=now, cron=name, key=template.key or f"cron:{name}",
                               idempotency_key=f"cron:{name}:{tick!r}")


def fire(name: str, template: NewJob, tick: float, now: float, run_waiting: bool) -> Fire:
    """run_waiting: a job of this cron is scheduled, queued or waiting for the network."""
    return Fire(True, None) if run_waiting else Fire(False, job_for(name, template, tick, now))
