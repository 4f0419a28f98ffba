"""What a running job may ask about itself: `workflow_key()` (a workflow step's key) and
`cron_tick()` (the tick a cron's run was fired for).

Owns two context variables, set by a runner around the call of such a job and reset after
it; it never touches the store. Read from the thread (or context) that runs the job;
elsewhere they are None.
"""

from __future__ import annotations

import contextvars

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("queickd_workflow_key", default=None)
_TICK: contextvars.ContextVar[float | None] = contextvars.ContextVar("queickd_cron_tick", default=None)


def workflow_key() -> str | None:
    """The idempotency key `wf:RUN:STEP:ITEM[:LOOP]` of the workflow step job being run
    here (the same on every attempt of that job), or None outside a workflow step. Use it
    to make the step's own side effects idempotent: steps run at least once."""
    return _KEY.get()


def cron_tick() -> float | None:
    """The tick (unix time) the cron run being executed here was fired for, the same on
    every attempt and when it ran late (after a power cut, a network wait, a backlog); None
    outside a cron's run. A job that reports on "today" should take its day from this, not
    from the clock when it happens to run."""
    return _TICK.get()


def tick_of(cron: str | None, idempotency_key: str | None) -> float | None:
    """A cron run's tick, from the idempotency key its cron gave it (`cron:NAME:TICK`)."""
    if cron is None or idempotency_key is None or not idempotency_key.startswith(f"cron:{cron}:"):
        return None
    try:
        return float(idempotency_key[len(cron) + 6:])
    except ValueError:
        return None


def set_job(workflow_key: str | None, tick: float | None) -> tuple[contextvars.Token, contextvars.Token]:
    """What workflow_key() and cron_tick() read from here on, until reset_job()."""
    return _KEY.set(workflow_key), _TICK.set(tick)


def reset_job(tokens: tuple[contextvars.Token, contextvars.Token]) -> None:
    _KEY.reset(tokens[0])
    _TICK.reset(tokens[1])
