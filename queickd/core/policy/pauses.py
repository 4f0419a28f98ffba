"""Failure streaks and pauses: when a key or a function stops being started.

Each finished run counts against its serial key and its function (its targets): a
success ends their streaks, a failure (a retry scheduled, a dead job) extends them, and a
run parked for the network counts for nothing (it did not fail, it could not run). A
streak that reaches `pause_after` failures pauses its target: claims pass its jobs over
until an operator resumes it or runs one of its jobs by hand (both end the streak too).
A target already paused stays paused since its first pause; its failures and last error
follow. A success does not lift a pause.

The store reads, per target, its streak and whether it is paused (`Lookups`, inside its
finishing transaction), and writes the plan. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..job import State

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


@dataclass(frozen=True, slots=True)
class Finish:
    """A run that finished: its new state and error, and its job's key and function."""

    state: str
    error: dict | None
    key: str | None
    func: str


@dataclass
class Lookups:
    """What the plan reads; runs inside the store's transaction, once per target at most."""

    streak: Callable[[Target], tuple[int, bool]]  # (failures so far, 0 without a streak; paused now)


@dataclass
class Plan:
    reset: list[Target] = field(default_factory=list)  # streaks to delete
    streaks: dict[Target, tuple[int, dict | None]] = field(default_factory=dict)  # to write: failures, last error
    # Pauses to write: (paused_at, failures, last error); paused_at None: an existing pause,
    # whose paused_at stays.
    pauses: dict[Target, tuple[float | None, int, dict | None]] = field(default_factory=dict)
    new: list[tuple[Target, int, dict | None]] = field(default_factory=list)  # pauses begun now, as begun


def plan(finished: Iterable[Finish], now: float, pause_after: int | None, look: Lookups) -> Plan:
    """Runs in the order they finished; the plan holds each target's final state."""
    p = Plan()
    seen: dict[Target, tuple[int, bool]] = {}  # target -> (failures, paused) as of this plan

    def state(t: Target) -> tuple[int, bool]:
        if t not in seen:
            seen[t] = look.streak(t)
        return seen[t]

    for f in finished:
        ext = extends(f.state)
        if ext is None:
            continue
        for t in targets(f.key, f.func):
            failures, paused = state(t)
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
                else:
                    at = p.pauses[t][0] if t in p.pauses else None
                    p.pauses[t] = (at, failures, f.error)
                paused = True
            seen[t] = (failures, paused)
    return p
