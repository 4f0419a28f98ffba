"""Failure streaks and pauses: when a key or a function stops being started.

Each finished run counts against its serial key and its function (its targets): a
success ends their streaks, a dead job (a failure with no retry left) extends them, and a
run that scheduled a retry or was parked for the network counts for nothing: the job is
not done failing (its own retries and their backoff are the first line of defence; a
breaker that also counted them would pause a function after one job's five attempts), or
it could not run. A streak that reaches `pause_after` failures pauses its target: claims
pass its jobs over. A target already paused stays paused since its first pause; its
failures and last error follow. A success of a job that is not its probe does not lift a
pause.

A pause is a circuit breaker: with a cooldown, the pause has a probe time (`probe_at`,
the cooldown after it began) when claims let exactly one of its jobs through (the probe,
`probe_job`); the probe's success resumes the target, its failure (a retry scheduled or a
dead job) pauses it again with the next, longer cooldown (`cooldown_for`: doubling per
trip, at most an hour or the cooldown, whichever is longer). A pause made by hand has no
probe time: it lasts until resumed. An operator's resume, or a run of one of its jobs by
hand, ends the pause and the streak.

The store reads, per target, its streak and whether it is paused (`Lookups`, inside its
finishing transaction), and writes the plan. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..job import State
from ..protocol import Code

FUNCTION_MISSING = Code.NOT_FOUND  # the error type of a run whose module lacks its function

Target = tuple[str, str]  # ("key", key) or ("func", func)


def targets(key: str | None, func: str | None) -> list[Target]:
    """What a job's runs count against (and what a manual run of it resumes)."""
    return [t for t in (("key", key), ("func", func)) if t[1] is not None]  # type: ignore[misc]


def extends(state: str) -> bool | None:
    """True: a run finishing in `state` extends its streaks; False: it ends them; None:
    it counts for nothing."""
    if state == State.WAITING_NETWORK:
        return None
    return state != State.SUCCEEDED


MAX_COOLDOWN = 3600.0  # seconds: the back-off of repeated trips stops growing here


def cooldown_for(base: float, trips: int) -> float:
    """The wait before the probe of a pause tripped `trips` times (1 for the first)."""
    return min(base * 2 ** max(trips - 1, 0), max(base, MAX_COOLDOWN))


def counts(state: str, error: dict | None = None) -> bool | None:
    """Streak counting, as `extends` says, for a run that is not a probe: a retry
    scheduled is not (yet) a failure of the job. Nor is a run refused because its module
    defines no such function (a typo, a function since removed): it never ran, says
    nothing of its key's or its function's health, and a run of typos must not pause them.
    (A probe's such run still fails its probe: the pause then waits for the next one.)"""
    if state == State.SCHEDULED:
        return None
    if error is not None and error.get("type") == FUNCTION_MISSING:
        return None
    return extends(state)


@dataclass(frozen=True, slots=True)
class Finish:
    """A run that finished: its new state and error, and its job's key and function."""

    state: str
    error: dict | None
    key: str | None
    func: str
    job_id: int | None = None  # to tell the probe of a pause from the other runs


@dataclass
class Lookups:
    """What the plan reads; runs inside the store's transaction, once per target at most."""

    streak: Callable[[Target], tuple[int, bool]]  # (failures so far, 0 without a streak; paused now)
    # A paused target's (trips, probe job or None); read only for paused targets.
    pause: Callable[[Target], tuple[int, int | None]] = lambda t: (0, None)


@dataclass
class Plan:
    reset: list[Target] = field(default_factory=list)  # streaks to delete
    streaks: dict[Target, tuple[int, dict | None]] = field(default_factory=dict)  # to write: failures, last error
    # Pauses to write: (paused_at, failures, last error); paused_at None: an existing pause,
    # whose paused_at stays.
    pauses: dict[Target, tuple[float | None, int, dict | None]] = field(default_factory=dict)
    new: list[tuple[Target, int, dict | None]] = field(default_factory=list)  # pauses begun now, as begun
    # Breaker state to write with the pause (begun, or tripped again by its probe): the next
    # probe time and the trips so far; the probe job is cleared.
    probes: dict[Target, tuple[float, int]] = field(default_factory=dict)
    resumed: list[Target] = field(default_factory=list)  # pauses whose probe succeeded: lifted

    @property
    def next_probe(self) -> float | None:
        """The earliest probe time this plan writes (for the caller's timer)."""
        return min((at for at, _ in self.probes.values()), default=None)


def plan(finished: Iterable[Finish], now: float, pause_after: int | None, look: Lookups,
         cooldown: float | None = None) -> Plan:
    """Runs in the order they finished; the plan holds each target's final state.
    `cooldown` None: pauses have no probe (they last until resumed)."""
    p = Plan()
    seen: dict[Target, tuple[int, bool]] = {}  # target -> (failures, paused) as of this plan
    probes: dict[Target, tuple[int, int | None]] = {}  # paused target -> (trips, probe job)

    def state(t: Target) -> tuple[int, bool]:
        if t not in seen:
            seen[t] = look.streak(t)
        return seen[t]

    def probed(t: Target, job_id: int | None) -> int | None:
        """The trips of t's pause if this run is its probe, else None."""
        if job_id is None or t not in seen or not seen[t][1]:
            return None
        if t not in probes:
            probes[t] = look.pause(t)
        trips, probe = probes[t]
        return trips if probe == job_id else None

    for f in finished:
        ext = extends(f.state)
        if ext is None:
            continue
        for t in targets(f.key, f.func):
            failures, paused = state(t)
            trips = probed(t, f.job_id)
            if trips is not None:  # the probe of t's pause: it decides the pause
                probes[t] = (trips, None)
                if not ext:
                    seen[t] = (0, False)
                    p.pauses.pop(t, None)
                    p.streaks.pop(t, None)
                    p.probes.pop(t, None)
                    p.resumed.append(t)
                    if t not in p.reset:
                        p.reset.append(t)
                    continue
                failures += 1
                p.streaks[t] = (failures, f.error)
                p.pauses[t] = (p.pauses.get(t, (None,))[0], failures, f.error)  # paused_at kept
                if cooldown is not None:
                    p.probes[t] = (now + cooldown_for(cooldown, trips + 1), trips + 1)
                seen[t] = (failures, True)
                continue
            if counts(f.state, f.error) is None:
                continue
            if not ext:
                if failures:
                    seen[t] = (0, paused)
                    p.streaks.pop(t, None)
                    if t not in p.reset:
                        p.reset.append(t)
                continue
            failures += 1
            p.streaks[t] = (failures, f.error)
            if pause_after is not None and failures >= pause_after:
                if not paused:
                    p.new.append((t, failures, f.error))
                    p.pauses[t] = (now, failures, f.error)
                    if cooldown is not None:
                        p.probes[t] = (now + cooldown_for(cooldown, 1), 1)
                else:
                    p.pauses[t] = (p.pauses.get(t, (None,))[0], failures, f.error)
                paused = True
            seen[t] = (failures, paused)
    return p
