"""The PostgreSQL store's claim: the fast path (queickd_claim, one round trip) and the
selection by core/policy/claim.py for grouped or budgeted jobs, with group slots under a
unique index (a lost race is undone and tried again); and the budgets in force, in the
table `budgets` for every claimer alike."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

try:
    import psycopg
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ValueError("the PostgreSQL store needs psycopg 3: pip install 'queickd[postgres]'") from e

from ...core.job import Job, Outcome, State
from ...core.policy import claim, fair, rates
from ...core.policy.resources import BudgetChange, budget_changes
from .. import rows as dbrows
from ..records import Claimed
from ..sql import fair as sqlfair
from ..sql import rates as sqlrates
from .channels import NOTIFY_IDS
from .claim_sql import CLAIM_LOCK, skip_scan
from .connection import KEPT_CURSOR_BYTES
from .fleet import notify

CLAIM_RETRIES = 8
# Held shared by every claim (from its first call to its commit), exclusively by a write of
# the budgets: a budget comes into force after the claims that did not see it.
_BUDGET_LOCK = 0x71756963_6B640004
_PAUSE_KINDS = frozenset({"key", "func", "pool"})  # the view's rows of pauses
# The fast path (claim_sql.CLAIM): one row of NULLs when the selection must claim instead;
# without the lock (NULL), the view has said no already.
_CLAIM = (f"SELECT {dbrows.JOB_COLS} FROM queickd_claim(%(lock)s, %(now)s, %(worker)s, %(pools)s, %(net)s,"
          " %(limit)s)")
_VIEW = "SELECT * FROM queickd_claim_view(%s, %s, %s, %s, %s, %s)"
# The selection's pages after its first (claim_sql.CANDIDATES_AFTER); _HEAD is before every job.
_AFTER = "SELECT * FROM queickd_candidates_after(%s, %s::text[], %s, %s, %s, %s, %s::text[])"
_HEAD = (-(1 << 31), float("-inf"), 0)
# The selection's jobs marked running and their probes' pauses stamped (claim_sql.START).
_START = (f"SELECT {dbrows.JOB_COLS} FROM queickd_start(%s, %s, %s::bigint[], %s::int[], %s::text[], %s::text[],"
          " %s::bigint[])")


# A pool's pass in the steady state (pass_sql.py). In PostgreSQL's own $n markers, sent by a
# cursor kept for it: a worker of one slot sends it once per job, and a new cursor would look
# up its columns' loaders and its arrays' dumpers again each time.
_PASS = f"SELECT {dbrows.JOB_COLS} FROM queickd_pass($1, $2, $3, $4, $5, $6, $7, $8, $9)"
# After the selection claimed, passes go the general way this long (seconds): asking
# queickd_pass first would be a round trip more on every pass while groups or budgets are
# in play. Not after a turn a rate key's opened window asked for (its row's state set): the
# selection fills it, and a busy key, opening many times a second, would keep every pass
# off queickd_pass.
_SELECTION_LINGERS = 1.0
_RUN_AT = dbrows.JOB_COLS.split(", ").index("run_at")
_STATE = dbrows.JOB_COLS.split(", ").index("state")


class Passes:
    """A store's passes in one statement (PassInOneCall.finish_and_claim), with what they keep
    between calls: whether the selection claimed lately, and the pass's cursor."""

    def __init__(self) -> None:
        self._selection_until = 0.0  # monotonic: passes go the general way until then
        self.cursor: psycopg.RawCursor | None = None  # on the bookkeeping connection

    def may_pass(self, outcomes: Sequence[Outcome]) -> bool:
        """Whether a pass of these outcomes may be one statement: successes of no workflow
        step, whose finish notification fits one payload, while the selection is not in play."""
        return (len(outcomes) <= NOTIFY_IDS and time.monotonic() >= self._selection_until
                and all(o.state == State.SUCCEEDED and o.workflow_run is None for o in outcomes))

    def pass_in(self, c: psycopg.Connection, worker_id: int | None, outcomes: Sequence[Outcome], now: float,
                limit: int, network_up: bool, pools: Sequence[str] | None) -> list[tuple] | None:
        """The pass as one statement on `c` (autocommit: its own transaction, no BEGIN, no
        COMMIT): the rows of the jobs it claimed, or None when the selection must claim."""
        results = [None if o.result is None else dbrows.dumps(o.result) for o in outcomes]
        outputs = [o.output for o in outcomes]
        params = (_BUDGET_LOCK, now, worker_id, list(pools) if pools is not None else None, network_up,
                  max(0, limit), [o.job_id for o in outcomes], results, outputs)
        cur = self.cursor
        if cur is None or cur.connection is not c:
            cur = psycopg.RawCursor(c)
        rows = cur.execute(_PASS, params).fetchall()
        # Kept only after a pass of small outcomes: a cursor holds its last parameters
        # (the results and outputs) until its next statement, which an idle pool never sends.
        small = sum(len(t) for t in (*results, *outputs) if t is not None) <= KEPT_CURSOR_BYTES
        self.cursor = cur if small else None
        if _selection_turn(rows):
            if rows[0][_STATE] is None:
                self._selection_until = time.monotonic() + _SELECTION_LINGERS
            return None
        return rows


def _selection_turn(rows: list[tuple]) -> bool:
    """The fast path's answer that the selection must claim: one row of NULLs (a row with
    only run_at is its timer, claim_sql.FAST_CLAIM)."""
    return bool(rows) and rows[0][0] is None and rows[0][_RUN_AT] is None


def jobs_of(rows: list[tuple]) -> list[Job]:
    """Claimed rows as jobs, in queue order (RETURNING order is unspecified), with the
    timer the selection or the fast path set."""
    jobs = Claimed(dbrows.row_to_job(r) for r in rows if r[0] is not None)
    jobs.sort(key=lambda j: (j.priority, j.run_at, j.id))
    timers = [r[_RUN_AT] for r in rows if r[0] is None]
    jobs.rate_at = getattr(rows, "rate_at", None) or min(timers, default=None)
    return jobs


def claim_in(c: psycopg.Connection, params: dict[str, Any], limits: claim.Limits) -> list[tuple]:
    """One claim in the caller's transaction: the fast path, unless it answers that the
    selection must claim; then the view, which may find the selection needless by then (the
    fast path claims after all, under the lock the view holds). A claim that sets jobs aside
    (`exclude`) is the selection's at once: the fast path knows no such jobs."""
    force = bool(params["exclude"])
    if not force:
        rows = c.execute(_CLAIM, {**params, "lock": _BUDGET_LOCK}).fetchall()
        if not _selection_turn(rows):
            return rows
    page = max(16, params["limit"] * 2)
    view = c.execute(_VIEW, (CLAIM_LOCK, _BUDGET_LOCK, params["pools"], page, params["now"], force)).fetchall()
    if not view:
        return c.execute(_CLAIM, {**params, "lock": None}).fetchall()
    return _claim_selected(c, params, limits, view, page)


def _claim_selected(c: psycopg.Connection, params: dict[str, Any], limits: claim.Limits,
                    view: list[tuple], page: int) -> list[tuple]:
    """The claim with groups or budgets: core/policy/claim.py's selection over the queued
    jobs read page by page in queue order, under the lock the view took before it read
    what runs (so what runs against a budget is read after every earlier such claim has
    committed). A group's limit: the slot each job takes, under jobs_group_slot (a race
    is a unique violation). The budgets are the view's (only `limits.patience` is the caller's)."""
    running = [(r[2], r[7], r[10], r[8], r[4], r[9]) for r in view if r[0] == "running"]  # RUNNING_COLS
    pauses = [(r[0], r[2]) for r in view if r[0] in _PAUSE_KINDS]
    probes = [(r[0], r[2]) for r in view if r[0] in _PAUSE_KINDS and r[11]]
    budgets = [(r[4], r[2], r[9]) for r in view if r[0] == "budget"]  # (kind, name, units)
    limits = dataclasses.replace(limits, pools={n: u for k, n, u in budgets if k == "pool"},
                                 groups={n: u for k, n, u in budgets if k == "group"})
    first = [(*r[1:10], r[12]) for r in view if r[0] == "queued"]  # claim.ROW_COLS
    served = None if params["pools"] is None else frozenset(params["pools"])
    held = claim.Running.of_jobs(running, pauses, probes)
    # The rate keys' windows, read by the view under the claim lock.
    held.rates = sqlrates.Reader(c, sqlrates.windows_of([(r[2], r[8], r[9], r[6], r[10])
                                                         for r in view if r[0] == "rate"]))
    pick = claim.Selection(claim.Request(params["limit"], params["net"], served, limits, params["now"],
                                         params["exclude"]), held)
    c.execute(FOLD_FAIR)  # under the view's lock (the claim lock): one fold at a time
    if sqlfair.waits(c):  # fair keys wait: the order of fair shares (under the same lock)
        return _claim_fair(c, params, limits, pick, page)
    full, out_pools = pick.out_groups, pick.out_pools
    if served is not None and served <= out_pools:
        return []  # the budget of every pool served is used up: nothing may start
    # The first page came unfiltered; the next ones leave out the jobs the selection leaves
    # out (claim.Selection.left_out: of full groups, whose backlog is not walked, and of the
    # pools served whose budget is used up, but for their keyed jobs). They start again
    # from the head of the queue, without the rows the first page offered.
    pools = params["pools"] if served is None or not out_pools else sorted(served - out_pools)
    pick.offer_all(map(claim.Row._make, first))
    # The rate keys whose window is full (a job of theirs was refused) are read no further.
    rates_full = set(pick.rates.refused)
    offered = {r[0] for r in first  # r[6]: concurrency_group, r[3]: pool, r[1]: key, r[9]: rate_limit
               if r[6] not in full and (pools is None or r[3] in pools or r[1] is not None)
               and (r[9] is None or r[6] is not None or rates.parse(r[9]).key not in rates_full)}
    after = _HEAD
    more = len(first) == page
    while more and not pick.done:
        ask = page + len(offered)
        rows = c.execute(_AFTER, (pools, sorted(full), ask, *after, sorted(rates_full))).fetchall()
        more = len(rows) == ask
        if rows:
            after = (rows[-1][0], rows[-1][6], rows[-1][1])  # (priority, run_at, id)
        if offered:
            rows = [r for r in rows if r[1] not in offered]
            offered = set()
        pick.offer_all(claim.Row._make(r[1:]) for r in rows)
        rates_full = set(pick.rates.refused)
    if not pick.chosen:
        return sqlrates.claimed((), pick.rates)
    # The starts logged for the rate keys go in the same round trip (a pipeline).
    if not pick.rates.added:
        return sqlrates.claimed(c.execute(_START, _start(params, pick)).fetchall(), pick.rates)
    with c.pipeline():
        sqlrates.write(c, pick.rates)
        cur = c.execute(_START, _start(params, pick))
    return sqlrates.claimed(cur.fetchall(), pick.rates)


def _start(params: dict[str, Any], pick: claim.Selection) -> tuple:
    """queickd_start's arguments for the jobs `pick` chose."""
    stamps = pick.probes
    return (params["now"], params["worker"], pick.chosen, [pick.slot(i) for i in pick.chosen],
            [t[0] for t, _ in stamps], [t[1] for t, _ in stamps], [j for _, j in stamps])


# A pool's queued jobs without a fair key, keys' heads only, in queue order, a page after an
# offset (jobs_queued_unfair).
_UNFAIR = (f"SELECT {claim.ROW_COLS} FROM jobs WHERE state = 'queued' AND pool = %s AND fair_by IS NULL"
           f"{sqlfair.HEAD_OF_KEY.replace('?', '%s')} ORDER BY priority, run_at, id LIMIT %s OFFSET %s")
# The counts of fair keys' queued jobs not yet counted (schema.py, 36) folded into fair_keys,
# under the claim lock: a key that starts waiting comes in at the least standing waiting in
# its pool, never below its own (fair.comes_in), as SQLite's triggers do at once.
FOLD_FAIR = """
    WITH d AS (DELETE FROM fair_deltas RETURNING pool, key, n),
    s AS (SELECT pool, key, sum(n)::integer AS n FROM d GROUP BY pool, key)
    INSERT INTO fair_keys AS f (pool, key, waiting, vtime)
    SELECT s.pool, s.key, s.n, coalesce((SELECT min(w.vtime) FROM fair_keys w WHERE w.pool = s.pool
                                         AND w.waiting > 0), 0) FROM s ORDER BY s.pool, s.key
    ON CONFLICT (pool, key) DO UPDATE SET waiting = f.waiting + excluded.waiting,
        vtime = CASE WHEN f.waiting > 0 THEN f.vtime ELSE greatest(f.vtime, excluded.vtime) END"""


def fold_fair(c: psycopg.Connection) -> None:
    """FOLD_FAIR in the caller's transaction, after the claim lock (another process's fold
    waits for this one's commit: the two never count a change twice)."""
    c.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
    c.execute(FOLD_FAIR)


_WALK_INDEXES = ("SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off;"
                 " SET LOCAL jit = off")
# The pools with a job queued: a skip scan of the fair keys waiting and one of the jobs
# without a fair key (jobs_queued_unfair), one descent per pool each.
_WALKED = ("WITH RECURSIVE " + skip_scan("a", "pool", "fair_keys WHERE waiting > 0") + ", "
           + skip_scan("b", "pool", "jobs WHERE state = 'queued' AND fair_by IS NULL")
           + " SELECT name FROM a WHERE name IS NOT NULL UNION SELECT name FROM b WHERE name IS NOT NULL")


def _claim_fair(c: psycopg.Connection, params: dict[str, Any], limits: claim.Limits, pick: claim.Selection,
                page: int) -> list[tuple]:
    """The claim in the order of fair shares (core/policy/fair.py, read by store/sql/fair.py),
    under the selection's lock, so the standings it writes are every such claim's."""
    # Its reads walk their indexes, as the claim's functions do (claim_sql.PLANNED).
    c.execute(_WALK_INDEXES)
    pools = params["pools"]
    if pools is None:  # every pool with a job queued
        pools = sorted(r[0] for r in c.execute(_WALKED))
    shares = fair.FairShares(limits.fair, params["now"])

    def own(pool: str) -> Any:
        return sqlfair.paged(c, _UNFAIR, (pool,), page)

    shares.offer(pick, sqlfair.units(c, tuple(pools), page, own))
    if not pick.chosen:
        return sqlrates.claimed((), pick.rates)
    sqlrates.write(c, pick.rates)
    sqlfair.write(c, shares)
    return sqlrates.claimed(c.execute(_START, _start(params, pick)).fetchall(), pick.rates)


# --- the budgets in force ---------------------------------------------------------------
def adopt_budgets(c: psycopg.Connection, limits: claim.Limits) -> list[BudgetChange]:
    """The table made to hold exactly `limits`' budgets, under the budget lock (after
    the claims in flight, before the next), and the others told (NOTIFY 'b')."""
    c.execute("SELECT pg_advisory_xact_lock(%s)", (_BUDGET_LOCK,))
    changes = budget_changes(budgets_in(c, limits), limits)
    if changes:
        c.execute("DELETE FROM budgets")
        rows = [("pool", n, u) for n, u in limits.pools.items()] + [
            ("group", n, u) for n, u in limits.groups.items()]
        if rows:
            c.execute("INSERT INTO budgets SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[])",
                      [list(col) for col in zip(*rows, strict=True)])
        notify(c, "b")
    return changes


def budgets_in(c: psycopg.Connection, limits: claim.Limits) -> claim.Limits:
    pools: dict[str, float] = {}
    groups: dict[str, float] = {}
    for kind, name, units in c.execute("SELECT kind, name, units FROM budgets"):
        (pools if kind == "pool" else groups)[name] = units
    return dataclasses.replace(limits, pools=pools, groups=groups)
