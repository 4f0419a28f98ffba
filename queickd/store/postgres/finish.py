"""The PostgreSQL store's finish and orphan sweep, in the caller's transaction: the
outcomes written, the freed claimers and waiting clients told, the workflow steps'
runs advanced and the failure streaks counted under their row locks."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import psycopg

from ...core.job import Outcome, State
from ...core.policy import orphans
from ...core.policy import pauses as pz
from .. import rows as dbrows
from ..records import Finished, Pause, Recovered
from ..sql import plans
from ..sql import rates as sqlrates
from ..sql import workflows as wfsql
from .channels import CHANNEL, FINISHED_CHANNEL, NOTIFY_IDS
from .dialect import DIALECT
from .fleet import ORPHANED, notify


def finish_in(c: psycopg.Connection, s: wfsql.Steps, worker_id: int | None, outcomes: Sequence[Outcome],
              now: float, pause_after: int | None, pause_cooldown: float | None) -> Finished:
    paused: list[Pause] = []
    next_probe = None
    cols: tuple[list, ...] = ([], [], [], [], [], [], [])
    for o in outcomes:
        for col, v in zip(cols, (o.job_id, o.state, o.run_at,
                                 None if o.result is None else dbrows.dumps(o.result),
                                 dbrows.dumps(o.error) if o.error else None,
                                 now if o.state in State.FINAL else None, o.output), strict=True):
            col.append(v)
    # The finish notification rides in the same statement when its ids fit one payload:
    # "fk" when a key, a group's slot or a budgeted pool's units were freed (claimers look
    # again), else "f" only when a client waits (channels.FINISHED_CHANNEL).
    steps = {o.job_id: o for o in outcomes
             if o.workflow_run is not None and o.state in (State.SUCCEEDED, State.DEAD)}
    inline = len(outcomes) <= NOTIFY_IDS
    told = (f", told AS (SELECT CASE WHEN d.frees THEN pg_notify('{CHANNEL}', 'fk:' || ids)"
            f" ELSE pg_notify('{FINISHED_CHANNEL}', 'f:' || ids) END"
            " FROM (SELECT bool_or(frees) AS frees, bool_or(wanted) AS wanted,"
            " string_agg(id::text, ',') AS ids FROM done) AS d"
            " WHERE d.ids IS NOT NULL AND (d.frees OR d.wanted))"
            ) if inline else ""
    # The finish, its notification and the successes' streak resets in one statement; a
    # failure's streak counting follows. Only our own claims: a job re-queued as an orphan
    # and claimed by another worker meanwhile is that worker's to finish.
    rows = c.execute(
        "WITH done AS (UPDATE jobs j SET state = o.state, run_at = coalesce(o.run_at, j.run_at),"
        " result = o.result, error = o.error, finished_at = o.finished_at, worker_id = NULL,"
        " attempts = j.attempts - (o.state IN ('waiting_network', 'queued'))::int, output = o.output"
        " FROM unnest(%s::bigint[], %s::text[], %s::float8[], %s::text[], %s::text[], %s::float8[],"
        " %s::text[]) AS o(id, state, run_at, result, error, finished_at, output)"
        " WHERE j.id = o.id AND j.state = 'running'"
        " AND (%s::bigint IS NULL OR j.worker_id = %s::bigint) RETURNING j.id, j.key, j.func, o.state,"
        # What its end frees for other claimers: a serial key, a group slot, a pool's budget.
        " (j.key IS NOT NULL OR j.concurrency_group IS NOT NULL OR EXISTS (SELECT 1 FROM budgets b"
        " WHERE b.kind = 'pool' AND b.name = j.pool)) AS frees,"
        # Who is told of a finish that frees nothing: a client waiting on the job
        # (watch_finish marked it), or a workflow's waiters (its run may have ended).
        " j.waited OR j.workflow_run IS NOT NULL AS wanted,"
        " j.workflow_run, j.workflow_step, j.workflow_item, j.workflow_loop)"
        ", reset AS (DELETE FROM streaks s USING done d WHERE d.state = 'succeeded'"
        " AND ((s.kind = 'key' AND s.name = d.key) OR (s.kind = 'func' AND s.name = d.func)))"
        # A probe that succeeded lifts its pause (the breaker closes).
        ", lifted AS (DELETE FROM pauses p USING done d WHERE d.state = 'succeeded' AND p.probe_job = d.id"
        " RETURNING 1), woke AS (SELECT pg_notify('queickd', 'r') FROM (SELECT 1 FROM lifted LIMIT 1) x)"
        + told +
        " SELECT id, key, func, frees, wanted, (SELECT count(*) FROM woke)"
        + (", (SELECT count(*) FROM told)" if inline else "")
        + (", workflow_run, workflow_step, workflow_item, workflow_loop" if steps else "") + " FROM done",
        (*cols, worker_id, worker_id)).fetchall()
    if not rows:
        return Finished(0, [])
    if steps:  # in the same transaction as the finish: one commits with the other
        wfsql.advance_in(DIALECT, c, s, [(r[0], *r[-4:], steps[r[0]].state == State.SUCCEEDED, steps[r[0]].result,
                              steps[r[0]].error) for r in rows if r[0] in steps], now)
    names = {r[0]: (r[1], r[2]) for r in rows}
    retries = [o.run_at for o in outcomes if o.state == State.SCHEDULED and o.job_id in names
               and o.run_at is not None]
    if retries:  # the daemons' timers must know when to move them back to queued
        notify(c, f"s:{min(retries)!r}")
    blocks = [(o.job_id, o.rate_until) for o in outcomes if o.rate_until is not None and o.job_id in names]
    if blocks:  # told to wait: their keys start nothing before then, on any host
        stored = dict(c.execute("SELECT id, rate_limit FROM jobs WHERE id = ANY(%s)", ([i for i, _ in blocks],)))
        sqlrates.tighten(c, [(stored.get(i), until) for i, until in blocks])
    failed = []
    for o in outcomes:
        if o.job_id not in names or o.blameless or o.state in (State.WAITING_NETWORK, State.SUCCEEDED):
            continue  # a success's streaks were reset by the statement above
        failed.append(pz.Finish(o.state, o.error, *names.pop(o.job_id), o.job_id))
    if failed:
        known = _lock_streaks(c, sorted({t for f in failed for t in pz.targets(f.key, f.func)}))
        p = pz.plan(failed, now, pause_after,
                    pz.Lookups(known.__getitem__, lambda t: plans.pause_of(DIALECT, c, t)), pause_cooldown)
        paused, next_probe = plans.write_pauses(DIALECT, c, p), p.next_probe
    if not inline and any(r[3] or r[4] for r in rows):
        frees = any(r[3] for r in rows)
        kind, channel = ("fk:", CHANNEL) if frees else ("f:", FINISHED_CHANNEL)
        ids = [r[0] for r in rows]
        for i in range(0, len(ids), NOTIFY_IDS):
            notify(c, kind + ",".join(map(str, ids[i:i + NOTIFY_IDS])), channel)
    return Finished(len(rows), paused, next_probe)


def _lock_streaks(c: psycopg.Connection, targets: list[pz.Target]) -> dict[pz.Target, tuple[int, bool]]:
    """The targets' streaks and pauses (pauses.Lookups), read by an upsert that changes
    no value but locks each streak row (made with 0 failures if new) until commit, in
    one order (no deadlock): failures of one function on several hosts at once count one
    after the other, never both from the same old count. (A SELECT ... FOR UPDATE cannot
    lock a row that does not exist yet, and costs as much.)"""
    rows = c.execute(
        "INSERT INTO streaks SELECT k, n, 0, NULL FROM unnest(%s::text[], %s::text[]) AS t(k, n) ORDER BY k, n"
        " ON CONFLICT (kind, name) DO UPDATE SET failures = streaks.failures RETURNING kind, name, failures,"
        " EXISTS (SELECT 1 FROM pauses p WHERE p.kind = streaks.kind AND p.name = streaks.name)",
        ([t[0] for t in targets], [t[1] for t in targets])).fetchall()
    return {(k, n): (f, p) for k, n, f, p in rows}


def recover_orphans_in(c: psycopg.Connection, s: wfsql.Steps, max_requeues: int, now: float,
                       running_here: Collection[int] = ()) -> Recovered:
    # Locked (SKIP LOCKED: another sweep has those) until the plan is written.
    p = orphans.plan(c.execute(f"SELECT id, orphaned FROM jobs WHERE {ORPHANED} FOR UPDATE SKIP LOCKED").fetchall(),
                     max_requeues, running_here)
    plans.write_orphans(DIALECT, c, s, p, now)
    if p.requeue:
        notify(c, "r")
    return Recovered(p.requeue, p.dead)
