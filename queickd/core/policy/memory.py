"""Memory-aware start: what a function's runs are expected to take, and whether a claimed
job may start in the room left.

- `Footprint`: a function's expected peak memory and runtime, an average that favours
  recent runs (each new run weighs `RECENT`); a run killed for its memory limit raises
  the peak to its peak (or the old one, if higher) times `KILLED_MARGIN`.
- `decide`: start when the expected peak fits the room (the lower of the cgroup's and
  the machine's free memory, less the reserve, less what the jobs already running here
  may still grow by (`still_to_take`), less what jobs started in the same pass are
  expected to take); else defer, unless nothing else runs on that worker (progress:
  one big job is never deferred forever).
- `matters`: an expected peak below `NEGLIGIBLE` is the noise of a thread run's RSS
  estimate (pages touched by other threads), far below any reserve: such a job starts
  without a look at free memory.
- `worth_measuring`: whether a thread run should read the process's RSS around it (two
  reads and their GIL hand-offs, dear for a tiny job): a function's first `LEARNING_RUNS`,
  every run of one whose peak matters, of the others one in `SAMPLE_EVERY`.
Pure: reads no file (services/memory_gate.py does), no clock, no store.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

RECENT = 0.5  # the weight of the newest run in the average
KILLED_MARGIN = 1.25
MB = 1024 * 1024
NEGLIGIBLE = 1 * MB
LEARNING_RUNS = 8  # a function's first runs are all measured
SAMPLE_EVERY = 16  # then, while its peak is negligible, one run in this many


@dataclass(frozen=True, slots=True)
class Footprint:
    peak: float  # bytes
    runtime: float  # seconds
    runs: int
    estimated: bool = False  # from a thread's RSS growth, not the run's own high-water mark


def update(old: Footprint | None, peak: float | None, runtime: float, killed: bool = False,
           estimated: bool = False) -> Footprint | None:
    """The footprint after one more run. `killed`: the run was killed for its memory limit
    (its peak, if reported, is where). None when there is nothing to learn."""
    if killed:
        base = max(old.peak if old is not None else 0.0, float(peak or 0))
        if base == 0:
            return old
        return Footprint(base * KILLED_MARGIN, runtime if old is None else old.runtime,
                         (old.runs if old else 0) + 1, False)
    if peak is None:
        return old
    if old is None:
        return Footprint(float(peak), runtime, 1, estimated)
    return Footprint(old.peak + RECENT * (peak - old.peak), old.runtime + RECENT * (runtime - old.runtime),
                     old.runs + 1, estimated and old.estimated)


def matters(need: float) -> bool:
    """Is a job expected to take `need` bytes worth a look at the room left?"""
    return need >= NEGLIGIBLE


def worth_measuring(fp: Footprint | None, nth: int) -> bool:
    """Should the `nth` run here (0, 1, ...) of a function with footprint `fp` (None: none
    known) measure its memory? Runs not measured leave the footprint as it is."""
    if fp is None or fp.runs < LEARNING_RUNS or matters(fp.peak):
        return True
    return nth % SAMPLE_EVERY == 0


@dataclass(frozen=True, slots=True)
class Decision:
    start: bool
    reason: str | None = None  # why not ("memory", "max_rss"), or why anyway ("alone")


def decide(need: float, room: float, taken: float, running_here: int, rss_room: float | None = None) -> Decision:
    """May a job expected to take `need` bytes start, with `room` bytes free (reserve
    already taken off), `taken` bytes expected by jobs started in this pass, and
    `running_here` jobs running on this worker? `rss_room`: what --max-rss leaves."""
    reason = None
    if need > room - taken:
        reason = "memory"
    elif rss_room is not None and need > rss_room - taken:
        reason = "max_rss"
    if reason is None:
        return Decision(True)
    if running_here == 0 and taken == 0:
        return Decision(True, "alone")  # nothing else runs here: waiting frees nothing
    return Decision(False, reason)


def still_to_take(started: list[tuple[float, float]], room: float) -> float:
    """Bytes the jobs running here may still take beyond `room` (as read now): each is
    expected to grow to its peak, and a reading of the room only shows what they took so
    far. `started`: (expected peak, the room read when it started), oldest first.

    The room's drop since a job started is what it and the jobs after it took (or anything
    else did): credited to them at most once, not to each, so the most of, over every
    job, the peaks of it and those after it less that drop."""
    left = peaks = 0.0
    for peak, at_start in reversed(started):
        peaks += peak
        left = max(left, peaks - max(0.0, at_start - room))
    return left


def backoff(deferrals: int, rng: random.Random | None = None) -> float:
    """Seconds a deferred job waits: 0.5 s doubling to at most 10 s, times 0.5-1.5."""
    r = (rng or random).random()
    return min(10.0, 0.5 * 2 ** max(0, deferrals)) * (0.5 + r)
