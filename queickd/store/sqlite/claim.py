"""The SQLite store's claim (Queue.claim_available), in the caller's write transaction.

A claim reads the queued jobs of the pools it serves, each pool walked on its own along
the pool-first queue-order indexes and the walks merged in queue order, so jobs waiting in
a pool no claimer serves cost it nothing. The common claim reads the first jobs and starts
them when core/policy/claim.py's plain() says no rule passes any over; else the selection
(claim.Selection) is offered the jobs in queue order, past the full groups and the used up
budgets. After a claim that met full groups, the first jobs are read with whether their
group is full (_FULL), and those of full groups are left out of what plain() is given.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import operator
import sqlite3
from collections.abc import Iterator

from ...core.job import Job
from ...core.policy import claim, fair, rates
from ...core.policy.rates import RateLimits, admit_all
from .. import rows as dbrows
from ..records import Claimed
from ..sql import fair as sqlfair
from ..sql import rates as sqlrates
from .resource_steps import RATE_KEY, RATE_KEY_FULL

# The queue-order walks of a pool: its jobs without a group, a rate limit or a fair key,
# those with a group, and those with a rate limit and no group. The jobs with a fair key and
# neither are walked by their key (jobs_queued_fair), by a claim that goes the way of fair
# shares whenever such a job waits: each queued job is in one walk.
_PLAIN = "concurrency_group IS NULL AND rate_limit IS NULL AND fair_by IS NULL"
_GROUPED = "concurrency_group IS NOT NULL"
_RATED = "concurrency_group IS NULL AND rate_limit IS NOT NULL"
_WALKS = (("jobs_queued_pool_plain", _PLAIN), ("jobs_queued_pool_grouped", _GROUPED),
          ("jobs_queued_pool_rated", _RATED))

# The pools with a job queued, when the claim serves every pool: a skip scan of each walk's
# index, one seek per pool.
_WAITING_POOLS = "WITH RECURSIVE " + ", ".join(
    f"{w} (name) AS (SELECT (SELECT pool FROM jobs INDEXED BY {index} WHERE state = 'queued'"
    f" AND {which} ORDER BY pool LIMIT 1) UNION ALL SELECT (SELECT pool FROM jobs"
    f" INDEXED BY {index} WHERE state = 'queued' AND {which} AND pool > {w}.name"
    f" ORDER BY pool LIMIT 1) FROM {w} WHERE {w}.name IS NOT NULL)"
    for w, (index, which) in zip(("a", "b", "c"), _WALKS, strict=True)
) + (", d (name) AS (SELECT (SELECT pool FROM fair_keys WHERE waiting > 0 ORDER BY pool LIMIT 1) UNION ALL"
     " SELECT (SELECT pool FROM fair_keys WHERE waiting > 0 AND pool > d.name ORDER BY pool LIMIT 1)"
     " FROM d WHERE d.name IS NOT NULL)"  # the pools of the fair keys waiting: their jobs are in no walk
) + " UNION ".join(f" SELECT name FROM {w} WHERE name IS NOT NULL" for w in ("a", "b", "c", "d"))

# Of the keyed jobs, their key's head only (its first queued job, of any pool), for a claim
# that does not read every pool: a key's head it does not read is not seen holding its key
# (claim.SerialKeys), and the jobs behind it must not start before it.
_HEAD_OF_KEY = (" AND (key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs e INDEXED BY jobs_key WHERE e.key = jobs.key"
                " AND e.state = 'queued' AND (e.priority, e.run_at, e.id) < (jobs.priority, jobs.run_at, jobs.id)))")

# A claim with full groups reads, in place of the pool's whole queue, the pool's queued jobs
# without a group and those of each other group with a job waiting (a skip scan of
# jobs_queued_pool_group), merged in queue order: not the full groups' backlog. Each stream
# is an index walk a page at a time, after its last row: (priority, run_at) equal and a
# greater id, then a greater (priority, run_at) (a range on all three would walk every job
# of the same run_at).
_WAITING_GROUPS = (
    "WITH RECURSIVE w (name) AS (SELECT (SELECT concurrency_group FROM jobs INDEXED BY jobs_queued_pool_group"
    " WHERE state = 'queued' AND concurrency_group IS NOT NULL AND pool = ?1 ORDER BY concurrency_group LIMIT 1)"
    " UNION ALL SELECT (SELECT concurrency_group FROM jobs INDEXED BY jobs_queued_pool_group WHERE state = 'queued'"
    " AND concurrency_group IS NOT NULL AND pool = ?1 AND concurrency_group > w.name ORDER BY concurrency_group"
    " LIMIT 1) FROM w WHERE w.name IS NOT NULL) SELECT name FROM w WHERE name IS NOT NULL")
_STREAMS = (f"SELECT priority, {claim.ROW_COLS} FROM jobs INDEXED BY jobs_queued_pool_plain WHERE state = 'queued'"
            f" AND {_PLAIN} AND pool = ?{{heads}}{{after}} ORDER BY priority, run_at, id LIMIT ?",
            f"SELECT priority, {claim.ROW_COLS} FROM jobs INDEXED BY jobs_queued_pool_group WHERE state = 'queued'"
            " AND concurrency_group IS NOT NULL AND pool = ? AND concurrency_group = ?{heads}{after}"
            " ORDER BY priority, run_at, id LIMIT ?",
            f"SELECT priority, {claim.ROW_COLS} FROM jobs INDEXED BY jobs_queued_pool_rate_key WHERE state = 'queued'"
            f" AND {_RATED} AND pool = ? AND {RATE_KEY} = ?{{heads}}{{after}} ORDER BY priority, run_at, id LIMIT ?")
# The rate keys with a job waiting in a pool (without a group), by a skip scan of
# jobs_queued_pool_rate_key: one seek per key.
_WAITING_RATE_KEYS = (
    f"WITH RECURSIVE w (name) AS (SELECT (SELECT {RATE_KEY} FROM jobs INDEXED BY jobs_queued_pool_rate_key"
    f" WHERE state = 'queued' AND {_RATED} AND pool = ?1 ORDER BY {RATE_KEY} LIMIT 1)"
    f" UNION ALL SELECT (SELECT {RATE_KEY} FROM jobs INDEXED BY jobs_queued_pool_rate_key WHERE state = 'queued'"
    f" AND {_RATED} AND pool = ?1 AND {RATE_KEY} > w.name ORDER BY {RATE_KEY} LIMIT 1)"
    " FROM w WHERE w.name IS NOT NULL) SELECT name FROM w WHERE name IS NOT NULL")
# The rate keys whose window may be full now (core/policy/rates.py: blocked, or keeping
# `lim` starts, some perhaps past the window), each asked then (RateLimits.full).
_FULL_RATE_KEYS = (f"SELECT key FROM rate_keys WHERE {RATE_KEY_FULL}"
                   " UNION SELECT key FROM rate_keys WHERE blocked_until > ?1")
_SAME_AT, _PAST_AT = " AND priority = ? AND run_at = ? AND id > ?", " AND (priority, run_at) > (?, ?)"
_POSITION = operator.itemgetter(0, 6, 1)  # (priority, run_at, id) of a stream's row


def _stream(c: sqlite3.Connection, sql: str, head: tuple, page: int) -> Iterator[tuple]:
    """One stream's rows in queue order (priority, then claim.ROW_COLS), a page at a time."""
    first, same, past = (sql.replace("{after}", a) for a in ("", _SAME_AT, _PAST_AT))
    rows = c.execute(first, (*head, page)).fetchall()
    while True:
        yield from rows
        if len(rows) < page:
            return
        priority, run_at, job_id = _POSITION(rows[-1])
        rows = c.execute(same, (*head, priority, run_at, job_id, page)).fetchall()
        if len(rows) < page:
            rows += c.execute(past, (*head, priority, run_at, page - len(rows))).fetchall()


def _while_open(rows: Iterator[tuple], key: str, rule: RateLimits) -> Iterator[tuple]:
    """A rate key's stream, ended once its window is full: the rest of its backlog would be
    refused (rates.RateLimits.full), and is not read."""
    for r in rows:
        yield r
        if rule.full(key):
            return


def _past_full(c: sqlite3.Connection, walk: tuple[str, ...], heads: str, full: frozenset[str],
               page: int, rule: RateLimits) -> Iterator[tuple]:
    """The candidates of the pools `walk` in queue order, as claim.ROW_COLS, leaving out
    the jobs of `full` groups (claim.Selection.out_groups) and, of the jobs without a group,
    those of the rate keys whose window is full (`rule`: they would be refused), before or
    once the selection fills it."""
    plain, grouped, rated = (sql.replace("{heads}", heads) for sql in _STREAMS)
    streams = []
    for pool in walk:
        streams.append(_stream(c, plain, (pool,), page))
        streams += [_stream(c, grouped, (pool, g), page)
                    for (g,) in c.execute(_WAITING_GROUPS, (pool,)).fetchall() if g not in full]
        streams += [_while_open(_stream(c, rated, (pool, k), page), k, rule)
                    for (k,) in c.execute(_WAITING_RATE_KEYS, (pool,)).fetchall() if not rule.full(k)]
    rows = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_POSITION)
    return (r[1:] for r in rows)


# The jobs with a fair key and no group or rate limit: the part of the queue no walk holds.
_FAIR_ONLY = ("jobs_queued_fair", "fair_by IS NOT NULL AND concurrency_group IS NULL AND rate_limit IS NULL")


def queue_order(cols: str, where: str = "") -> str:
    """Every queued job, `cols` of each, in no order: a compound of the pool-first
    queue-order indexes' walks and the fair keys' (each queued job is in one of them).
    `where`: a further condition on each."""
    return " UNION ALL ".join(f"SELECT {cols} FROM jobs INDEXED BY {index} WHERE state = 'queued'"
                              f" AND {which}{where}" for index, which in (*_WALKS, _FAIR_ONLY))


def served_order(cols: str, pools: int, where: str = "", walks: tuple[tuple[str, str], ...] = _WALKS) -> str:
    """The queued jobs of `pools` pools, `cols` of each (naming priority, run_at and id),
    for an ORDER BY priority, run_at, id to follow: a compound of each pool's walks (the
    pool a parameter of each, after those of `cols`), which SQLite merges walk by walk
    without sorting. `where`: a further condition on each; `walks`: of _WALKS, those read."""
    return " UNION ALL ".join(f"SELECT {cols} FROM jobs INDEXED BY {index} WHERE state = 'queued'"
                              f" AND {which} AND pool = ?{where}"
                              for _ in range(pools) for index, which in walks)


# The claim's first statement: the queue's first jobs (priority, claim.ROW_COLS) and a flag
# word (1: a pause exists; 2: a fair key has a job queued, so the claim goes the way of fair
# shares); _TOTALS_COLS adds what runs in total (claim.Totals; cost units each at least 0,
# so that the sum bounds every pool's and group's).
_HEADS_COLS = (f"priority, {claim.ROW_COLS}, EXISTS (SELECT 1 FROM pauses)"
               " | (EXISTS (SELECT 1 FROM fair_keys WHERE waiting > 0) << 1)")
_RUNNING_IN = "FROM jobs INDEXED BY jobs_running WHERE state = 'running'"
_TOTALS_COLS = (
    f"{_HEADS_COLS}, (SELECT count(*) {_RUNNING_IN}),"
    f" (SELECT min(CASE WHEN concurrency_limit THEN concurrency_limit ELSE 1 END) {_RUNNING_IN}"
    " AND concurrency_group IS NOT NULL),"
    f" CASE WHEN ? THEN (SELECT total(max(coalesce(cost_units, 1.0), 0.0)) {_RUNNING_IN}) END")
_ORDER = " ORDER BY priority, run_at, id LIMIT ?"
_ROW, _FLAGS, _TOTALS = slice(1, 11), 11, slice(12, 15)
_PAUSED, _FAIR_WAITS = 1, 2


# A claim after one that met full groups (and no used up budget) reads with each of the
# queue's first jobs whether what runs fills its group (claim.Selection.out_groups), and as
# many jobs more as the last such claim met of full groups (at least one, at most _PAST):
# with no more than that of full groups among the first, the rest are the first jobs the
# selection may take, and the common claim goes on with them; else the selection.
_FULL_GROUPS = ("WITH full_groups AS MATERIALIZED (SELECT concurrency_group FROM jobs INDEXED BY jobs_running"
                " WHERE state = 'running' AND concurrency_group IS NOT NULL GROUP BY concurrency_group"
                " HAVING count(*) >= min(CASE WHEN concurrency_limit THEN concurrency_limit ELSE 1 END)) ")
_FULL = "CASE WHEN concurrency_group IS NULL THEN 0 ELSE concurrency_group IN full_groups END"
_PAST = 16


@functools.cache
def _heads_sql(totalled: bool, pools: int, heads: str, full: bool = False, rated: bool = True) -> str:
    """The claim's first statement for `pools` pools walked (`heads`: the keyed jobs' condition;
    `full`: with whether each job's group is full, last; `rated`: the walk of the jobs with a
    rate limit and no group read too)."""
    cols = _TOTALS_COLS if totalled else _HEADS_COLS
    walks = _WALKS if rated else _WALKS[:2]
    if not full:
        return served_order(cols, pools, heads, walks) + _ORDER
    return _FULL_GROUPS + served_order(f"{cols}, {_FULL}", pools, heads, walks) + _ORDER


def _read_heads(c: sqlite3.Connection, walk: tuple[str, ...], heads_of_keys: str, totalled: bool,
                budgeted: bool, read: int, full: bool = False, rated: bool = True) -> list[tuple]:
    """The claim's first statement (_heads_sql) run for the pools `walk`, `read` rows at most:
    each walk's parameters are the budgets' flag of its columns (`budgeted`, when
    `totalled`), then its pool."""
    walks = len(_WALKS) if rated else 2
    params = [v for p in walk for _ in range(walks) for v in ((budgeted, p) if totalled else (p,))]
    return c.execute(_heads_sql(totalled, len(walk), heads_of_keys, full, rated), (*params, read)).fetchall()


def _rows_of(heads: list[tuple], totalled: bool) -> tuple[list[claim.Row], claim.Totals | None]:
    """The heads as the claim policy reads them, and what runs in total (when read)."""
    return [claim.Row._make(r[_ROW]) for r in heads], claim.Totals(*heads[0][_TOTALS]) if totalled else None


# While the rate keys a claim found full stay closed (Claims._rates_closed), the common
# claim reads past their backlog: it leaves out the walk of the jobs with a rate limit and
# no group if it holds none of another key, which this asks, in `pools` pools walked, with
# one seek of jobs_queued_pool_rate_key per pool and per gap around the `closed` keys (in
# order): a closed key's backlog is never walked.
_CLOSED_AT_MOST = 4  # closed keys the common claim reads past; more: the selection


@functools.cache
def _other_rate_key_waits_sql(pools: int, closed: int) -> str:
    gaps = [f"{RATE_KEY} < ?", *[f"{RATE_KEY} > ? AND {RATE_KEY} < ?"] * (closed - 1), f"{RATE_KEY} > ?"]
    return "SELECT " + " OR ".join(
        f"EXISTS (SELECT 1 FROM jobs INDEXED BY jobs_queued_pool_rate_key WHERE state = 'queued' AND {_RATED}"
        f" AND pool = ? AND {gap})" for _ in range(pools) for gap in gaps)


def _other_rate_key_params(walk: tuple[str, ...], closed: tuple[str, ...]) -> list[str]:
    bounds = [(closed[0],), *itertools.pairwise(closed), (closed[-1],)]
    return [v for pool in walk for b in bounds for v in (pool, *b)]


@functools.cache
def _page_sql(pools: int, heads: str) -> str:
    """The selection's next page of the queue, for `pools` pools walked."""
    return served_order(f"priority, {claim.ROW_COLS}", pools, heads) + _ORDER + " OFFSET ?"


# A pool's queued jobs without a fair key, keys' heads only, in queue order, a page after an
# offset: its walks, of which only the grouped and rated ones hold jobs with a fair key.
_UNFAIR = served_order(f"priority, {claim.ROW_COLS}", 1, f" AND fair_by IS NULL{sqlfair.HEAD_OF_KEY}") + _ORDER + " OFFSET ?"


# What runs (claim.RUNNING_COLS: a handful of rows through the running index), and with it
# the pauses (kind, name, whether the probe is due: its time has come and no probe of it
# runs), padded to the same columns.
_RUNNING = f"SELECT {claim.RUNNING_COLS.format(slot='NULL')} {_RUNNING_IN}"
_HELD = (f"SELECT 'running', {claim.RUNNING_COLS.format(slot='NULL')} FROM jobs INDEXED BY jobs_running"
         " WHERE state = 'running' UNION ALL SELECT kind, name, coalesce(probe_at <= ?, 0) AND NOT EXISTS"
         " (SELECT 1 FROM jobs WHERE id = probe_job AND state = 'running'), NULL, NULL, NULL, NULL"
         " FROM pauses")


class Claims:
    """A store's claims, with what the last one met (which way the next one reads first)."""

    def __init__(self) -> None:
        self._grouped_heads = False  # the last claim met a grouped job among its first ones
        self._full_groups = False  # the last claim by the selection left jobs out (full groups, used up budgets)
        self._only_groups = True  # ... and only those of full groups
        self._past = _PAST  # how many jobs to read past the first, for full groups' jobs among them
        # The exact windows of rate keys read full, each until it opens (sql/rates.Reader),
        # and until when the last claim by the selection met one with its jobs waiting.
        self._rates_full: dict[str, tuple[float, rates.Window]] = {}
        self._rates_full_until = 0.0
        # ... and of the keys it refused, those full by their window (their whole backlog
        # refused: rates.RateLimits.full), in order, while they are few: closed until then.
        self._rates_closed: tuple[str, ...] = ()

    def claim(self, c: sqlite3.Connection, request: claim.Request) -> list[Job]:
        """Claim in `c`'s write transaction (SQLite serializes writers, so the selection is exact)."""
        served, limits, limit, now = request.pools, request.limits, request.limit, request.now
        # The pools walked: those served, or every pool with a job queued. A claim that
        # does not walk every pool reads only the heads of keys (_HEAD_OF_KEY).
        walk = tuple(sorted(served)) if served is not None else tuple(
            sorted(r[0] for r in c.execute(_WAITING_POOLS)))
        if not walk:
            return []
        heads_of_keys = "" if served is None else _HEAD_OF_KEY
        past_full = self._full_groups and self._only_groups
        if self._full_groups and not past_full:
            if sqlfair.waits(c):  # fair keys wait: the order of fair shares, by the selection
                return self._fair(c, request, walk)
            # The last claim met used up budgets: this one likely will too, and would read
            # past them what it read first. The selection at once, as before the heads.
            return self._select(c, request, self._held(c, now), None, walk)
        if now < self._rates_full_until and not past_full:
            # The last claim met a full rate key's jobs waiting: its backlog likely heads the
            # queue still, and the heads would be refused. The common claim past that backlog
            # if it may, else the selection at once.
            if self._rates_closed and (out := self._past_closed(c, request, walk, heads_of_keys)) is not None:
                return out
            return self._select(c, request, self._held(c, now), None, walk)
        # The common claim (claim.plain): the queue's first jobs and whether anything is
        # paused, in one statement; when no rule applies to them, they start. While
        # budgets are in force, or the last claim met a grouped job, it also reads what runs
        # in total (claim.Totals): the heads start if each fits its group and budgets even
        # with all of that in them; else what runs is read (a handful of rows).
        totalled = limits.any or self._grouped_heads
        read = limit + self._past if past_full else limit
        heads = _read_heads(c, walk, heads_of_keys, totalled, limits.any, read, past_full)
        if not heads:  # the walks hold none, but jobs of fair keys may wait (theirs alone)
            return self._fair(c, request, walk) if sqlfair.waits(c) else []
        paused = bool(heads[0][_FLAGS] & _PAUSED)
        if heads[0][_FLAGS] & _FAIR_WAITS:  # fair keys wait: the order of fair shares, by the selection
            return self._fair(c, request, walk)
        if past_full:  # the jobs of full groups left out (claim.Selection.left_out)
            kept = [r for r in heads if not r[-1]]
            self._full_groups = len(kept) < len(heads)
            self._past = min(_PAST, max(1, len(heads) - len(kept)))
            if paused or (len(kept) < limit and len(heads) == read):
                # More full groups' jobs among the first than were read past: the selection.
                return self._select(c, request, self._held(c, now), None, walk)
            if not kept:
                return []  # only full groups' jobs wait: nothing may start
            heads = kept[:limit]
        first, totals = _rows_of(heads, totalled)
        ids = claim.plain(first, request, paused, totals)
        if ids is not None:
            self._grouped_heads = totalled and any(r.concurrency_group is not None for r in first)
            return self._start(c, ids, now, "")
        if not paused and any(r.rate_limit is not None for r in first):
            # Rate-limited heads: the common claim still, if their keys admit every one.
            rule = admit_all(first, sqlrates.Reader(c, full=self._rates_full), now)
            ids = None if rule is None else claim.plain(first, request, False, totals, rated=True)
            if ids is not None:
                sqlrates.write(c, rule)
                return sqlrates.claimed(self._start(c, ids, now, ""), rule)
        self._grouped_heads = any(r.concurrency_group is not None for r in first)
        if paused:
            running = self._held(c, now)
        else:
            running = claim.Running.of_jobs(c.execute(_RUNNING).fetchall())
            ids = claim.plain(first, request, False, running)
            if ids is not None:
                return self._start(c, ids, now, "")
        return self._select(c, request, running, None if self._full_groups else first, walk)

    def _past_closed(self, c: sqlite3.Connection, request: claim.Request, walk: tuple[str, ...],
                     heads_of_keys: str) -> Claimed | None:
        """The common claim while the rate keys _rates_closed are closed and no job of another
        key waits with a rate limit and no group: the queue's first jobs but theirs (the
        selection would refuse every one of them, and reads none: _past_full), started when
        claim.plain() says no rule passes any over; None: the selection's. Its timer is the
        closed keys' (the selection's would be the same)."""
        closed, limits = self._rates_closed, request.limits
        others = c.execute(_other_rate_key_waits_sql(len(walk), len(closed)),
                           _other_rate_key_params(walk, closed)).fetchone()[0]
        if others:
            return None
        totalled = limits.any or self._grouped_heads
        heads = _read_heads(c, walk, heads_of_keys, totalled, limits.any, request.limit, rated=False)
        if not heads or heads[0][_FLAGS]:  # none, a pause or fair keys waiting: the selection
            return None
        first, totals = _rows_of(heads, totalled)
        ids = claim.plain(first, request, False, totals)
        if ids is None:
            return None
        self._grouped_heads = totalled and any(r.concurrency_group is not None for r in first)
        out = Claimed(self._start(c, ids, request.now, ""))
        out.rate_at = self._rates_full_until
        return out

    @staticmethod
    def _held(c: sqlite3.Connection, now: float) -> claim.Running:
        """What runs (keys, groups, pools, costs) and the pauses, in one statement; a pause's
        third column: its probe is due (its time has come and no probe of it is running)."""
        held = c.execute(_HELD, (now,)).fetchall()
        return claim.Running.of_jobs([r[1:] for r in held if r[0] == "running"],
                                     [(r[0], r[1]) for r in held if r[0] != "running"],
                                     [(r[0], r[1]) for r in held if r[0] != "running" and r[2]])

    def _select(self, c: sqlite3.Connection, request: claim.Request, running: claim.Running,
                first: list[claim.Row] | None, walk: tuple[str, ...]) -> list[Job]:
        """The claim by the selection, offered the queued jobs of the pools `walk` in queue
        order (`first`: the heads, read already)."""
        running.rates = sqlrates.Reader(c, full=self._rates_full)  # under the writer's lock: exact
        pick = claim.Selection(request, running)
        full, out_pools = pick.out_groups, pick.out_pools
        page = max(16, request.limit * 2)
        # The pools whose budget what runs has used up are not walked: the selection leaves
        # their jobs out (they hold nothing but a key, and then only the heads of keys are
        # read). Nor are other pools', which the selection passes over.
        left = tuple(p for p in walk if p not in out_pools)
        if not left:
            return []  # the budget of every pool walked is used up: nothing may start
        heads = _HEAD_OF_KEY if request.pools is not None or len(left) < len(walk) else ""
        self._full_groups, self._only_groups, self._past = bool(full or out_pools), not out_pools, _PAST
        # While a rate key's window is full, each key is read on its own, and not past its
        # window's filling: a full key's backlog is not walked. Else the queue in order,
        # until a key fills during the claim: from there, key by key too.
        full_rates = [k for (k,) in c.execute(_FULL_RATE_KEYS, (request.now,)) if pick.rates.full(k)]
        self._rates_full_until, self._rates_closed = 0.0, ()
        if full or out_pools or full_rates:  # read by group and rate key, past the full ones
            if full_rates and not heads:
                heads = _HEAD_OF_KEY  # a serial key's head left unread holds its key
            pick.offer_all(map(claim.Row._make, _past_full(c, left, heads, full, page, pick.rates)))
        else:  # the heads first if read, then the queue after them a page at a time
            offset, more = 0, True
            offered: set[int] = set()
            if first is not None:
                pick.offer_all(first)
                offered.update(r.id for r in first)
                offset = len(first)
                more = offset == request.limit
            params = [p for p in left for _ in _WALKS]
            while more and not pick.done:
                if pick.rates.refused:  # a key filled: the rest key by key, past what was offered
                    rest = _past_full(c, left, heads or _HEAD_OF_KEY, full, page, pick.rates)
                    pick.offer_all(claim.Row._make(r) for r in rest if r[0] not in offered)
                    heads = heads or _HEAD_OF_KEY
                    break
                rows = [claim.Row._make(r[1:]) for r in
                        c.execute(_page_sql(len(left), heads), (*params, page, offset)).fetchall()]
                pick.offer_all(rows)
                offered.update(r.id for r in rows)
                more = len(rows) == page
                offset += page
        if pick.rates.refused:
            closed = sorted(k for k in pick.rates.refused if pick.rates.full(k))
            self._rates_closed = tuple(closed) if len(closed) <= _CLOSED_AT_MOST else ()
            self._rates_full_until = min(pick.rates.refused.values())
        if not pick.chosen:
            return sqlrates.claimed((), pick.rates)
        sqlrates.write(c, pick.rates)
        if pick.probes:
            c.executemany("UPDATE pauses SET probe_job = ? WHERE kind = ? AND name = ?",
                          [(job_id, *t) for t, job_id in pick.probes])  # no other probe until they finish
        # A key's head among the full groups' jobs, not read, was not seen holding its key:
        # a keyed job chosen behind it must not start before it.
        return sqlrates.claimed(self._start(c, pick.chosen, request.now, _HEAD_OF_KEY if full and not heads else ""),
                                pick.rates)

    def _fair(self, c: sqlite3.Connection, request: claim.Request, walk: tuple[str, ...]) -> list[Job]:
        """The claim by the selection, offered the queued jobs of the pools `walk` in the order
        of fair shares (core/policy/fair.py; store/sql/fair.py reads it), keys' heads only."""
        running = self._held(c, request.now)
        running.rates = sqlrates.Reader(c, full=self._rates_full)  # under the writer's lock: exact
        pick = claim.Selection(request, running)
        shares = fair.FairShares(request.limits.fair, request.now)
        page = max(16, request.limit * 2)
        def own(pool: str) -> Iterator[tuple]:
            return (r[1:] for r in sqlfair.paged(c, _UNFAIR, (pool,) * len(_WALKS), page))

        shares.offer(pick, sqlfair.units(c, walk, page, own))
        self._full_groups = False  # the next claim reads the heads first again
        if not pick.chosen:
            return sqlrates.claimed((), pick.rates)
        sqlrates.write(c, pick.rates)
        sqlfair.write(c, shares)
        if pick.probes:
            c.executemany("UPDATE pauses SET probe_job = ? WHERE kind = ? AND name = ?",
                          [(job_id, *t) for t, job_id in pick.probes])
        return sqlrates.claimed(self._start(c, pick.chosen, request.now, ""), pick.rates)

    @staticmethod
    def _start(c: sqlite3.Connection, ids: list[int], now: float, only: str) -> list[Job]:
        """The chosen jobs marked running (`only`: a further condition on each), in queue order."""
        marks = ",".join("?" * len(ids))
        rows = c.execute(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = ?"
            f" WHERE id IN ({marks}){only} RETURNING {dbrows.JOB_COLS}", (now, *ids),
        ).fetchall()
        jobs = [dbrows.row_to_job(r) for r in rows]
        jobs.sort(key=lambda j: (j.priority, j.run_at, j.id))  # RETURNING order is unspecified
        return jobs
