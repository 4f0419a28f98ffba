"""The PostgreSQL store's claim: the fast path (queickd_claim, one round trip) and the
selection by core/policy/claim.py for grouped or budgeted jobs, with group slots under a
unique index (a lost race is undone and tried again). A mixin of PostgresStore."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    import psycopg
    from psycopg import errors as pgerrors
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ValueError("the PostgreSQL store needs psycopg 3: pip install 'queickd[postgres]'") from e

from ..core.job import Job
from ..core.policy import claim
from . import rows as dbrows

_CLAIM_RETRIES = 8
_CLAIM_LOCK = 0x71756963_6B640003  # advisory lock id held by each claim with groups or budgets
# The claim itself is the function queickd_claim (pgschema.py): an UPDATE ... WHERE id IN
# (SELECT ... ORDER BY priority, run_at, id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING, one
# round trip. Its conditions are core/policy/claim.py's rules written in SQL (choosing in
# Python would cost a round trip more and hold row locks on every row read); the store
# contract test test_claim_starts_what_the_selection_policy_picks holds the two together.
_CLAIM = f"SELECT {dbrows.JOB_COLS} FROM queickd_claim(%(now)s, %(worker)s, %(pools)s, %(net)s, %(limit)s)"


class PgClaims:
    """Claiming jobs (Store.claim_available) on PostgreSQL."""

    def claim_available(self, limit: int, now: float, network_up: bool = True,
                        pools: Sequence[str] | None = None, limits: claim.Limits = claim.NO_LIMITS) -> list[Job]:
        if limit <= 0:
            return []
        params = {"now": now, "worker": self.worker_id, "pools": list(pools) if pools is not None else None,
                  "net": network_up, "limit": limit}
        if getattr(self._local, "in_batch", False):
            # No savepoint here (two more round trips on every pass of the pool): a lost key
            # or slot race, which the claim's own conditions and its lock all but rule out,
            # fails the batch, and the pool applies its outcomes alone and claims again.
            c = self._conn()
            rows = (self._claim_selected(c, params, limits) if limits.any or self._grouped_waiting(c)
                    else c.execute(_CLAIM, params).fetchall())
        for attempt in range(_CLAIM_RETRIES if not getattr(self._local, "in_batch", False) else 0):
            try:
                with self._write() as c:
                    rows = (self._claim_selected(c, params, limits) if limits.any or self._grouped_waiting(c)
                            else c.execute(_CLAIM, params).fetchall())
                break
            except pgerrors.UniqueViolation:
                # Another worker claimed a job of the same key, or the same slot of a group,
                # meanwhile and committed; the next try sees it running.
                if attempt == _CLAIM_RETRIES - 1:
                    raise
        jobs = [dbrows.row_to_job(r) for r in rows]
        jobs.sort(key=lambda j: (j.priority, j.run_at, j.id))  # RETURNING order is unspecified
        return jobs

    @staticmethod
    def _grouped_waiting(c: psycopg.Connection) -> bool:
        """Is any grouped job queued? (jobs_queued_grouped: one index probe.)"""
        return c.execute("SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'queued'"
                         " AND concurrency_group IS NOT NULL)").fetchone()[0]

    def _claim_selected(self, c: psycopg.Connection, params: dict[str, Any], limits: claim.Limits) -> list[tuple]:
        """The claim with groups or budgets: core/policy/claim.py's selection over the queued
        jobs read page by page in queue order (bounded look-ahead), in the caller's
        transaction, under one transaction lock taken before what runs is read (so what
        runs against a budget is read after every earlier such claim has committed). Group
        limits: the slot each job takes, under jobs_group_slot (a race is a unique violation)."""
        # What runs, the pauses and the first page of candidates, read after the lock these
        # claims share (queickd_claim_view): budgets are exact and slot races all but gone
        # (the unique index still guarantees the limits). One round trip, plans cached.
        page = max(16, params["limit"] * 2)
        view = c.execute("SELECT * FROM queickd_claim_view(%s, %s, %s)", (_CLAIM_LOCK, params["pools"], page)).fetchall()
        running = [(r[2], r[7], r[10], r[8], r[4], r[9]) for r in view if r[0] == "running"]  # RUNNING_COLS
        pauses = [(r[0], r[2]) for r in view if r[0] in ("key", "func")]
        first = [r[1:10] for r in view if r[0] == "queued"]
        served = None if params["pools"] is None else frozenset(params["pools"])
        pick = claim.Selection(claim.Request(params["limit"], params["net"], served, limits, params["now"]),
                               claim.Running.of_jobs(running, pauses))
        # The first page came unfiltered, with what runs; the next ones leave out the jobs of
        # groups full before this claim (they hold nothing), from the first such row not read.
        full = pick.full_groups()
        skip = set(full)
        pick.offer_all(map(claim.Row._make, first))
        offset = sum(1 for r in first if r[6] is None or r[6] not in skip)  # r[6]: concurrency_group
        more = len(first) == page
        while more and not pick.full and offset < pick.look_ahead:
            rows = c.execute("SELECT * FROM queickd_candidates(%s, %s::text[], %s, %s)",
                             (params["pools"], full, page, offset)).fetchall()
            pick.offer_all(map(claim.Row._make, rows))
            more = len(rows) == page
            offset += page
        if not pick.chosen:
            return []
        # A row another claim took meanwhile is no longer queued: it is left out here.
        return c.execute(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = %s, worker_id = %s,"
            " slot = u.s FROM unnest(%s::bigint[], %s::int[]) AS u(i, s) WHERE jobs.id = u.i"
            f" AND jobs.state = 'queued' RETURNING {', '.join('jobs.' + n for n in dbrows.JOB_COLS.split(', '))}",
            (params["now"], params["worker"], pick.chosen, [pick.slot(i) for i in pick.chosen])).fetchall()

    # --- network --------------------------------------------------------------------------
