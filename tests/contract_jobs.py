"""What the store contract's tests build jobs with: a fixed time and a job due at it."""

from __future__ import annotations

from queickd.core.job import NewJob

T0 = 1_700_000_000.0


def job(func: str = "m:f", **kw) -> NewJob:
    kw.setdefault("run_at", T0)
    return NewJob(func=func, **kw)
