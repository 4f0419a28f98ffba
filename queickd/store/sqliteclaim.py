"""The SQLite store's claim (Store.claim_available): a mixin of SQLiteStore.

The common claim reads the queue's first jobs and starts them when core/policy/claim.py's
plain() says no rule passes any over; else the selection (claim.Selection) is offered the
queued jobs in queue order, past the full groups and the used up budgets, in the claim's
write transaction.
"""

from __future__ import annotations

import functools
import heapq
import operator
import sqlite3
from collections.abc import Collection, Iterator, Sequence

from ..core.job import Job
from ..core.policy import claim
from . import rows as dbrows

# A claim with full groups reads, in place of the whole queue (queue_order), the queued jobs
# without a group and those of each other group with a job waiting (found by a skip scan of
# jobs_queued_group, one seek per group), merged in queue order: what it reads is bounded
# by the groups, not by the full groups' backlog (sqlite_schema.py, 10). Each stream is an
# index walk a page at a time, from the head and then after its last row: (priority,
# run_at) equal and a greater id, then a greater (priority, run_at) (SQLite ranges over
# the id of such an index only under equal leading columns; a range on all three walks
# every job of the same run_at).
_WAITING_GROUPS = (
    "WITH RECURSIVE w (name) AS (SELECT (SELECT concurrency_group FROM jobs INDEXED BY jobs_queued_group"
    " WHERE state = 'queued' AND concurrency_group IS NOT NULL ORDER BY concurrency_group LIMIT 1)"
    " UNION ALL SELECT (SELECT concurrency_group FROM jobs INDEXED BY jobs_queued_group WHERE state = 'queued'"
    " AND concurrency_group IS NOT NULL AND concurrency_group > w.name ORDER BY concurrency_group LIMIT 1)"
    " FROM w WHERE w.name IS NOT NULL) SELECT name FROM w WHERE name IS NOT NULL")
_STREAMS = (f"SELECT priority, {claim.ROW_COLS} FROM jobs INDEXED BY jobs_queued_plain WHERE state = 'queued'"
            " AND concurrency_group IS NULL{mine}{after} ORDER BY priority, run_at, id LIMIT ?",
            f"SELECT priority, {claim.ROW_COLS} FROM jobs INDEXED BY jobs_queued_group WHERE state = 'queued'"
            " AND concurrency_group IS NOT NULL AND concurrency_group = ?{mine}{after}"
            " ORDER BY priority, run_at, id LIMIT ?")
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


# The full groups' jobs were not read, so a key's head among them was not seen holding its
# key (claim.SerialKeys): a keyed job chosen behind it must not start before it. Each keyed
# job chosen is one look along jobs_key.
_HEADS_ONLY = (" AND (key IS NULL OR NOT EXISTS (SELECT 1 FROM jobs e INDEXED BY jobs_key WHERE e.key = jobs.key"
               " AND e.state = 'queued' AND (e.priority, e.run_at, e.id) < (jobs.priority, jobs.run_at, jobs.id)))")


def _past_full(c: sqlite3.Connection, mine: str, served: tuple, full: frozenset[str],
               page: int) -> Iterator[tuple]:
    """The candidates in queue order, as claim.ROW_COLS, leaving out the jobs of `full`
    groups (claim.Selection.out_groups)."""
    plain, grouped = (sql.replace("{mine}", mine) for sql in _STREAMS)
    streams = [_stream(c, plain, served, page)]
    streams += [_stream(c, grouped, (g, *served), page)
                for (g,) in c.execute(_WAITING_GROUPS).fetchall() if g not in full]
    rows = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_POSITION)
    return (r[1:] for r in rows)


def queue_order(cols: str, where: str = "") -> str:
    """The queued jobs, `cols` of each (naming priority, run_at and id), for an ORDER BY
    priority, run_at, id to follow: a compound of the two queue-order indexes, the jobs
    without a group (jobs_queued_plain) and those with one (jobs_queued_grouped), which
    SQLite merges walk by walk without sorting (each queued job is in one of the two:
    sqlite_schema.py, 13). `where`: a further condition on both."""
    return (f"SELECT {cols} FROM jobs INDEXED BY jobs_queued_plain WHERE state = 'queued'"
            f" AND concurrency_group IS NULL{where} UNION ALL SELECT {cols} FROM jobs INDEXED BY"
            f" jobs_queued_grouped WHERE state = 'queued' AND concurrency_group IS NOT NULL{where}")


# The claim's first statement: the queue's first jobs (priority, claim.ROW_COLS; `mine`: the
# pools served, its parameters given once per index walk) and whether anything is paused;
# _HEADS_TOTALS adds what runs in total (claim.Totals: jobs, the least limit of a grouped
# one, and with budgets in force their cost units, each at least 0 so that the sum bounds
# every pool's and group's).
_HEADS = queue_order(f"priority, {claim.ROW_COLS}, EXISTS (SELECT 1 FROM pauses)", "{mine}") + (
    " ORDER BY priority, run_at, id LIMIT ?")
_RUNNING_IN = "FROM jobs INDEXED BY jobs_running WHERE state = 'running'"
_HEADS_TOTALS = queue_order(
    f"priority, {claim.ROW_COLS}, EXISTS (SELECT 1 FROM pauses), (SELECT count(*) {_RUNNING_IN}),"
    f" (SELECT min(CASE WHEN concurrency_limit THEN concurrency_limit ELSE 1 END) {_RUNNING_IN}"
    " AND concurrency_group IS NOT NULL),"
    f" CASE WHEN ? THEN (SELECT total(max(coalesce(cost_units, 1.0), 0.0)) {_RUNNING_IN}) END", "{mine}") + (
    " ORDER BY priority, run_at, id LIMIT ?")


def _mine(pools: int) -> str:
    """The condition on the queued jobs a claim reads, for `pools` pools served (0: every
    pool): their own pools' and, as they may hold their key, every keyed job."""
    return "" if not pools else f" AND (pool IN ({','.join('?' * pools)}) OR key IS NOT NULL)"


def _read(served: frozenset[str] | None, out: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """The condition on the queued jobs the selection reads, and its parameters: _mine's,
    less the pools whose budget what runs has used up (`out`, claim.Selection.out_pools;
    their keyed jobs still come back, as they may hold their key)."""
    if not out:
        return _mine(0 if served is None else len(served)), tuple(served or ())
    if served is None:
        return f" AND (pool NOT IN ({','.join('?' * len(out))}) OR key IS NOT NULL)", tuple(out)
    left = tuple(served - out)  # not empty: the caller claims nothing when every pool served is out
    return _mine(len(left)), left


@functools.cache
def _heads_sql(totalled: bool, pools: int) -> str:
    """The claim's first statement (_HEADS or _HEADS_TOTALS) for `pools` pools served."""
    return (_HEADS_TOTALS if totalled else _HEADS).replace("{mine}", _mine(pools))


# What runs (claim.RUNNING_COLS: a handful of rows through the running index), and with it
# the pauses (kind, name, whether the probe is due: its time has come and no probe of it
# runs), padded to the same columns.
_RUNNING = f"SELECT {claim.RUNNING_COLS.format(slot='NULL')} {_RUNNING_IN}"
_HELD = (f"SELECT 'running', {claim.RUNNING_COLS.format(slot='NULL')} FROM jobs INDEXED BY jobs_running"
         " WHERE state = 'running' UNION ALL SELECT kind, name, coalesce(probe_at <= ?, 0) AND NOT EXISTS"
         " (SELECT 1 FROM jobs WHERE id = probe_job AND state = 'running'), NULL, NULL, NULL, NULL"
         " FROM pauses")


class SqliteClaims:
    """Claiming jobs (Store.claim_available) on SQLite."""

    _grouped_heads = False  # the last claim met a grouped job among its first ones
    _full_groups = False  # the last claim by the selection left jobs out (full groups, used up budgets)

    def claim_available(self, limit: int, now: float, network_up: bool = True,
                        pools: Sequence[str] | None = None, limits: claim.Limits = claim.NO_LIMITS,
                        exclude: Collection[int] = ()) -> list[Job]:
        served = None if pools is None else frozenset(pools)
        if served is not None and not served:
            return []
        request = claim.Request(limit, network_up, served, limits, now, frozenset(exclude))
        # Inside the write transaction: SQLite serializes writers, so the selection is exact.
        with self._write(bookkeeping=True) as c:
            if self._full_groups:
                # The last claim met full groups: this one likely will too, and would read
                # past them what it read first. The selection at once, as before the heads.
                return self._select(c, request, self._held(c, now), None)
            # The common claim (claim.plain): the queue's first jobs and whether anything is
            # paused, in one statement; when no rule applies to them, they start. While
            # budgets are in force, or the last claim met a grouped job, the statement also
            # reads what runs in total (claim.Totals: three aggregates over the running
            # index, no row per running job): the heads start if each fits its group and its
            # budgets even with all of that in them. Else what runs is read (a handful of
            # rows), and they start if each is within its group and its budgets.
            totalled = limits.any or self._grouped_heads
            sql = _heads_sql(totalled, 0 if served is None else len(served))
            walk = (limits.any, *(served or ())) if totalled else tuple(served or ())
            heads = c.execute(sql, (*walk, *walk, limit)).fetchall()  # the parameters of each index walk
            if not heads:
                return []
            paused = bool(heads[0][10])
            first = [claim.Row._make(r[1:10]) for r in heads]
            ids = claim.plain(first, request, paused, claim.Totals(*heads[0][11:]) if totalled else None)
            if ids is not None:
                self._grouped_heads = totalled and any(r.concurrency_group is not None for r in first)
                return self._start(c, ids, now, "")
            self._grouped_heads = any(r.concurrency_group is not None for r in first)
            if paused:
                running = self._held(c, now)
            else:
                running = claim.Running.of_jobs(c.execute(_RUNNING).fetchall())
                ids = claim.plain(first, request, False, running)
                if ids is not None:
                    return self._start(c, ids, now, "")
            return self._select(c, request, running, first)

    @staticmethod
    def _held(c: sqlite3.Connection, now: float) -> claim.Running:
        """What runs (keys, groups, pools, costs) and the pauses, in one statement; a pause's
        third column: its probe is due (its time has come and no probe of it is running)."""
        held = c.execute(_HELD, (now,)).fetchall()
        return claim.Running.of_jobs([r[1:] for r in held if r[0] == "running"],
                                     [(r[0], r[1]) for r in held if r[0] != "running"],
                                     [(r[0], r[1]) for r in held if r[0] != "running" and r[2]])

    def _select(self, c: sqlite3.Connection, request: claim.Request, running: claim.Running,
                first: list[claim.Row] | None) -> list[Job]:
        """The claim by the selection, offered the queued jobs in queue order (`first`: the
        heads, read already)."""
        pick = claim.Selection(request, running)
        served, full, out_pools = request.pools, pick.out_groups, pick.out_pools
        if served is not None and served <= out_pools:
            return []  # the budget of every pool served is used up: nothing may start
        page = max(16, request.limit * 2)
        # Other pools' jobs are passed over inside SQLite, not page by page here (`mine`);
        # those with a key still come back, as they may hold their key. So are the jobs
        # the selection leaves out: of groups with every slot taken or whose budget is used
        # up, of pools whose budget is (they hold nothing but a key).
        mine, params = _read(served, out_pools)
        self._full_groups = bool(full or out_pools)
        if full or out_pools:  # read by group, past the full ones
            pick.offer_all(map(claim.Row._make, _past_full(c, mine, params, full, page)))
        else:  # the heads first if read, then the queue after them a page at a time
            offset, more = 0, True
            if first is not None:
                pick.offer_all(first)
                offset = len(first)
                more = offset == request.limit
            while more and not pick.done:
                rows = c.execute(
                    queue_order(f"priority, {claim.ROW_COLS}", mine)
                    + " ORDER BY priority, run_at, id LIMIT ? OFFSET ?",
                    (*params, *params, page, offset),
                ).fetchall()
                pick.offer_all(claim.Row._make(r[1:]) for r in rows)
                more = len(rows) == page
                offset += page
        if not pick.chosen:
            return []
        if pick.probes:
            self._stamp_probes(c, pick.probes)
        return self._start(c, pick.chosen, request.now, _HEADS_ONLY if full else "")

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
