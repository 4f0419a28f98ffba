"""Fair shares (core/policy/fair.py) as both SQL stores keep them: the table `fair_keys`
(pool, key, waiting, vtime, last_start), its count of queued jobs kept by triggers (SQLite:
at once; PostgreSQL: through fair_deltas, folded in by the fair claim, postgres/claim.py
FOLD_FAIR), read by a claim in its transaction after the lock its store serializes such
claims under (SQLite's writer; PostgreSQL's claim lock).

A claim reads, per pool walked, the keys waiting in order of standing (fair_keys_waiting)
and each key's queued jobs in queue order (jobs_queued_fair), a page at a time: index
walks, never a count of all waiting jobs. The pool's jobs without a fair key come from the
store's own walk (`unfair`). Only serial keys' heads are read (fair.heads_only)."""

from __future__ import annotations

import heapq
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

from ...core.policy import claim, fair
from ..records import FairKey
from .dialect import Dialect, marked

# A keyed job is read only when it is its key's head (its first queued job, of any pool).
HEAD_OF_KEY = (" AND (jobs.key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = jobs.key"
               " AND e.state = 'queued' AND (e.priority, e.run_at, e.id) < (jobs.priority, jobs.run_at, jobs.id)))")
_KEYS = ("SELECT key, vtime, last_start FROM fair_keys WHERE pool = ? AND waiting > 0"
         " ORDER BY vtime, last_start, key LIMIT ? OFFSET ?")
_UNFAIR = "SELECT vtime, last_start FROM fair_keys WHERE pool = ? AND key = ''"
_JOBS = (f"SELECT {claim.ROW_COLS} FROM jobs {{indexed}}WHERE state = 'queued' AND pool = ? AND fair_by = ?"
         f"{HEAD_OF_KEY} ORDER BY priority, run_at, id LIMIT ? OFFSET ?")
_WRITE = ("INSERT INTO fair_keys (pool, key, waiting, vtime, last_start) VALUES (?, ?, 0, ?, ?)"
          " ON CONFLICT (pool, key) DO UPDATE SET vtime = excluded.vtime, last_start = excluded.last_start")


def waits(c: Any) -> bool:
    """Whether any fair key has a job queued (one look at the partial index)."""
    return c.execute("SELECT 1 FROM fair_keys WHERE waiting > 0 LIMIT 1").fetchone() is not None


def paged(c: Any, sql: str, params: tuple, page: int) -> Iterator[tuple]:
    """The rows of `sql` (ending LIMIT ? OFFSET ?), a page at a time as they are asked for."""
    offset = 0
    while True:
        rows = c.execute(sql, (*params, page, offset)).fetchall()
        yield from rows
        if len(rows) < page:
            return
        offset += page


def units(c: Any, pools: tuple[str, ...], page: int,
          unfair: Callable[[str], Iterator[tuple]]) -> Iterator[fair.Unit]:
    """The units of `pools` in order of standing (fair.Unit.order), lazily: each pool's keys
    waiting, merged, and each pool's jobs without a fair key (`unfair(pool)`: claim.ROW_COLS
    rows in queue order) as the key UNFAIR, come in at the pool's least standing."""
    keys_sql = marked(c, _KEYS)
    indexed = "INDEXED BY jobs_queued_fair " if isinstance(c, sqlite3.Connection) else ""
    jobs_sql = marked(c, _JOBS.replace("{indexed}", indexed))
    walks = []
    for pool in pools:
        keys = paged(c, keys_sql, (pool,), page)
        first = next(keys, None)
        row = c.execute(marked(c, _UNFAIR), (pool,)).fetchone()
        vtime, last = row if row is not None else (0.0, 0.0)
        own = fair.Unit(pool, fair.UNFAIR, fair.comes_in(vtime, None if first is None else first[1]), last,
                        map(claim.Row._make, unfair(pool)))
        walks.append(_pool_units(c, jobs_sql, pool, first, keys, own, page))
    yield from walks[0] if len(walks) == 1 else heapq.merge(*walks, key=fair.Unit.order)


def _pool_units(c: Any, jobs_sql: str, pool: str, first: tuple | None, keys: Iterator[tuple],
                own: fair.Unit, page: int) -> Iterator[fair.Unit]:
    """One pool's units in order: its keys waiting, and its own (UNFAIR) in its place."""
    rows = keys if first is None else itertools.chain((first,), keys)
    pending: fair.Unit | None = own
    for key, vtime, last in rows:
        u = fair.Unit(pool, key, vtime, last, map(claim.Row._make, paged(c, jobs_sql, (pool, key), page)))
        if pending is not None and pending.order() <= u.order():
            yield pending
            pending = None
        yield u
    if pending is not None:
        yield pending


def write(c: Any, shares: fair.FairShares) -> None:
    """The standings of the keys that started jobs (in the claim's transaction)."""
    if shares.moved:
        c.cursor().executemany(marked(c, _WRITE), [(u.pool, u.key, u.vtime, u.last_start)
                                               for _, u in sorted(shares.moved.items())])


_LIST = ("SELECT pool, key, waiting, vtime, last_start FROM fair_keys WHERE waiting > 0 OR key = ''"
         " ORDER BY waiting DESC, pool, key LIMIT ?")


def keys(d: Dialect, c: Any, limit: int = 50) -> list[FairKey]:
    """The fair keys with jobs queued, most waiting first, and each pool's own standing."""
    return [FairKey(*r) for r in c.execute(d.q(_LIST), (limit,)).fetchall()]
