"""What a running job may ask about itself: `workflow_key()` (a workflow step's key),
`cron_tick()` (the tick a cron's run was fired for) and `cron_last_tick()` (the last tick
it stands for: ticks that came while it waited were folded into it).

Owns two context variables, set by a runner around the call of such a job and reset after
it; it never touches the store. Read from the thread (or context) that runs the job;
elsewhere they are None.
"""

from __future__ import annotations

import contextvars

Ticks = tuple[float, float]  # (the tick a run was fired for, the last tick folded into it)

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("queickd_workflow_key", default=None)
_TICKS: contextvars.ContextVar[Ticks | None] = contextvars.ContextVar("queickd_cron_ticks", default=None)


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
    ticks = _TICKS.get()
    return None if ticks is None else ticks[0]


def cron_last_tick() -> float | None:
    """The last tick the cron run being executed here stands for: ticks due while it was
    still waiting (for the network, a worker, a retry) get no run of their own but are
    folded into it, so a daily report held back for three days covers the days from
    cron_tick() to this one. cron_tick() when nothing was folded; None outside a cron's run."""
    ticks = _TICKS.get()
    return None if ticks is None else ticks[1]


def ticks_of(cron: str | None, idempotency_key: str | None, cron_until: float | None) -> Ticks | None:
    """A cron run's ticks: the one its cron fired it for (from the idempotency key it gave
    it, `cron:NAME:TICK`) and the last one folded into it (`cron_until`)."""
    if cron is None or idempotency_key is None or not idempotency_key.startswith(f"cron:{cron}:"):
        return None
    try:
        tick = float(idempotency_key[len(cron) + 6:])
    except ValueError:
        return None
    return tick, tick if cron_until is None else max(tick, cron_until)


def set_job(workflow_key: str | None, ticks: Ticks | None) -> tuple[contextvars.Token, contextvars.Token]:
    """What workflow_key(), cron_tick() and cron_last_tick() read from here on, until reset_job()."""
    return _KEY.set(workflow_key), _TICKS.set(ticks)


def reset_job(tokens: tuple[contextvars.Token, contextvars.Token]) -> None:
    _KEY.reset(tokens[0])
    _TICKS.reset(tokens[1])
