"""Fair shares, the order in which a claim offers a pool's jobs when some carry `fair_by`
(claim.py's rules then decide each job as they do in queue order).

Within a pool, the claim takes jobs round-robin across the fair keys with work waiting, in
proportion to their weights (`[fair_shares]`: key = weight; 1 when not listed), instead of
strict queue order: stride scheduling. Each (pool, fair key) has a standing, `vtime`: it
grows by 1 / weight with each job of the key started, so a key of weight 2 starts two jobs
for another's one while both have work. A key that starts waiting again (none of its jobs
was queued) comes in at the `vtime` of the least advanced key waiting in its pool, never
below its own: it neither jumps ahead by the turns it missed while idle nor waits behind
another's backlog (the store does this as the job is queued: its `fair_keys` table).

The claim offers next the head of the key of least `vtime`, then of the longest since its
last start, then by pool and name (`Unit.order`); within a key, jobs go in queue order
(priority, run_at, id). So a backlog of 10,000 jobs of one key delays a newly waiting
key's first job by at most one turn. The pool's jobs without a fair key share as one key
of their own (`UNFAIR`, weight 1), which comes in on every claim as a newly waiting key
does (`comes_in`): the store keeps its standing, not its count.

A job a rule passes over does not advance its key: the key's next job is offered in its
place. Of a serial key's jobs only its head (its first queued job, of any pool or fair
key) is offered (`heads_only`): the claim reads keys out of queue order, and a later job of
a serial key must not start because its fair key came first.

The store reads keys in order of standing, lazily (a walk of an index of the keys with work
waiting), and each key's jobs in queue order, lazily: a claim reads about as many keys as
it starts jobs, plus those whose heads it passes over, however many keys have work waiting.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .claim import Selection

UNFAIR = ""  # the fair key of a pool's jobs without one (fair_by is never empty)


@dataclass(slots=True)
class Unit:
    """One fair key of one pool as a claim sees it: its standing and its jobs waiting, in
    queue order (read lazily by the store)."""

    pool: str
    key: str
    vtime: float
    last_start: float
    rows: Iterator[Any]

    def order(self) -> tuple[float, float, str, str]:
        return (self.vtime, self.last_start, self.pool, self.key)


def comes_in(vtime: float, floor: float | None) -> float:
    """A key's standing as it starts waiting again: the least advanced waiting key's
    (`floor`; None: no other waits), never below its own."""
    return vtime if floor is None or floor < vtime else floor


def check_weights(table: Any) -> dict[str, float]:
    """`[fair_shares]` (fair key = weight) -> weights; ValueError naming the key."""
    if not isinstance(table, dict):
        raise ValueError("fair_shares must be a table of fair key = weight")
    out = {}
    for k, v in table.items():
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not v > 0):
            raise ValueError(f"fair_shares.{k} must be a finite number greater than 0 (its weight)")
        if not k or len(str(k).encode()) > 200:
            raise ValueError(f"fair_shares: a fair key is a non-empty string of at most 200 bytes: {k!r}")
        out[str(k)] = float(v)
    return out


class FairShares:
    """The order of offering (see the module), and the standings it changed."""

    __slots__ = ("weights", "now", "moved")

    def __init__(self, weights: Mapping[str, float], now: float) -> None:
        self.weights = weights
        self.now = now
        self.moved: dict[tuple[str, str], Unit] = {}  # (pool, key) -> its unit, for keys that started a job

    def weight(self, key: str) -> float:
        return 1.0 if key == UNFAIR else self.weights.get(key, 1.0)

    def offer(self, pick: Any, units: Iterable[Unit]) -> None:
        """Offer `pick` (a claim.Selection) the units' jobs until it is done: always the head
        of the unit first by order. `units` come in order (the store's index walk): one is
        read only when it may come before every unit read (and not emptied) so far."""
        heap: list[tuple[tuple[float, float, str, str], Unit]] = []
        source = iter(units)
        upcoming = next(source, None)
        while not pick.done:
            while upcoming is not None and (not heap or upcoming.order() <= heap[0][0]):
                heapq.heappush(heap, (upcoming.order(), upcoming))
                upcoming = next(source, None)
            if not heap:
                return
            u = heap[0][1]
            c = next(u.rows, None)
            if c is None:  # the unit has nothing more to offer
                heapq.heappop(heap)
            elif pick.offer(c):
                u.vtime += 1.0 / self.weight(u.key)
                u.last_start = self.now
                self.moved[(u.pool, u.key)] = u
                heapq.heapreplace(heap, (u.order(), u))
            # passed over: the unit keeps its place, its next job is offered next


def heads_only(candidates: Iterable[Any]) -> list[Any]:
    """The candidates (in queue order) less the jobs of a serial key after its head."""
    seen: set[str] = set()
    out = []
    for c in candidates:
        k = c.key
        if k is not None:
            if k in seen:
                continue
            seen.add(k)
        out.append(c)
    return out


def select(candidates: Iterable[Any], request: Any, running: Any,
           standings: Mapping[tuple[str, str], tuple[float, float]], weights: Mapping[str, float]) -> list[int]:
    """The reference claim with fair shares, of every queued job in queue order (each with
    `fair_by`): the ids claim.Selection starts when offered them in the order of fair shares.
    `standings`: (pool, key) -> (vtime, last_start) as the store keeps them (UNFAIR's
    before it comes in; a missing one: (0, 0))."""
    candidates = list(candidates)
    floors: dict[str, float] = {}  # pool -> the least standing of its keys with a job queued
    for c in candidates:
        if c.fair_by is not None:
            v = standings.get((c.pool, c.fair_by), (0.0, 0.0))[0]
            floors[c.pool] = min(floors.get(c.pool, v), v)
    by_unit: dict[tuple[str, str], list[Any]] = {}
    for c in heads_only(candidates):
        if request.pools is not None and c.pool not in request.pools:
            continue  # a pool not served: never offered (a key's head there still holds it)
        by_unit.setdefault((c.pool, c.fair_by or UNFAIR), []).append(c)
    units = []
    for (pool, key), rows in by_unit.items():
        vtime, last = standings.get((pool, key), (0.0, 0.0))
        if key == UNFAIR:
            vtime = comes_in(vtime, floors.get(pool))
        units.append(Unit(pool, key, vtime, last, iter(rows)))
    units.sort(key=Unit.order)
    pick = Selection(request, running)
    FairShares(weights, request.now).offer(pick, units)
    return pick.chosen
