"""What the store tests build jobs with: a fixed time, a job due at it, and a function
paused by its failures."""

from __future__ import annotations

from queickd.core.job import NewJob, Outcome
from queickd.core.policy.claim import Request

T0 = 1_700_000_000.0


def job(func: str = "m:f", **kw) -> NewJob:
    kw.setdefault("run_at", T0)
    return NewJob(func=func, **kw)


def trip_bad(store, func: str = "m:bad") -> None:
    """func (m:bad) paused at T0 by 3 dead jobs, its probe due at T0 + 60."""
    store.submit([job(func=func) for _ in range(3)], T0)
    ran = store.claim_available(Request.of(3, now=T0))
    store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": "no"}) for j in ran], T0,
                            pause_after=3, pause_cooldown=60.0)
