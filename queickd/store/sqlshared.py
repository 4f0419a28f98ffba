"""What the SQL stores (SQLite, PostgreSQL) do with the same SQL, written once.

A store mixes SharedSql in and provides MARK (its driver's parameter marker), _RELEASE (what
else a job's row drops when it leaves `running`), _conn() (a connection for reads), _write()
(a write transaction), _DUE_EVENTS (its query of the events due: id, job, attempts, key,
in delivery order), _submit_in() and
_resume_in(). Queries here are written with `?` and
turned into the store's marker once per text. The decisions are the policies' (core/policy);
what is here only writes them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..core.job import Job, State, Submitted
from ..core.policy import admission as adm
from ..core.policy import crons, orphans, outbox
from ..core.policy import memory as mem
from ..core.policy import pauses as pz
from . import rows as dbrows
from .records import CronFire, CronRecord, Event, EventAccepted, EventState, Minute, NewEvent, Pause
from .sqlstates import WAITING_ANY, WAITING_IN, state_any
from .wfsql import STEP_OF_JOB

# A target's streak and whether it is paused (pauses.Lookups), in one statement.
STREAK = ("SELECT coalesce((SELECT failures FROM streaks WHERE kind = ? AND name = ?), 0),"
          " EXISTS (SELECT 1 FROM pauses WHERE kind = ? AND name = ?)")


# A claimed job that did not start, back where it waited; with the store's _RELEASE after it.
REQUEUE = "UPDATE jobs SET state = 'queued', attempts = attempts - 1, started_at = NULL"


# Within a serial key, no pending event is due before an earlier one (outbox.KeyOrder):
# each one's next attempt raised to the latest among its key's pending events up to it, in
# the order accepted ({order}: the store's column of that order). After an event of the key
# is refused (its later ones wait as long), after a dead event goes back to pending (a
# retry), and once for rows written before the rule (a migration).
REPAIR_KEY_ORDER = ("UPDATE events SET next_attempt_at = (SELECT max(e2.next_attempt_at) FROM events e2"
                    " WHERE e2.key = events.key AND e2.state = 'pending' AND e2.{order} <= events.{order})"
                    " WHERE state = 'pending' AND key IS NOT NULL")


def filters(func: str | None, key: str | None, pool: str | None, alias: str = "") -> tuple[str, tuple]:
    """' AND ...' conditions (with ? marks) for list_jobs' and cancel_waiting's filters
    (`alias`: of the jobs table, as 'j.')."""
    given = [(c, v) for c, v in (("func", func), ("key", key), ("pool", pool)) if v is not None]
    return "".join(f" AND {alias}{c} = ?" for c, _ in given), tuple(v for _, v in given)


@functools.cache
def _marked(sql: str, mark: str) -> str:
    return sql if mark == "?" else sql.replace("?", mark)


class SharedSql:
    MARK: str
    _RELEASE: str
    _DUE_EVENTS: str
    _EVENT_ORDER: str  # the events' column of the order they were accepted in
    _conn: Any
    _write: Any
    _submit_in: Any
    _resume_in: Any
    _advance_dead_in: Any  # wfsql.SqlWorkflows
    _lock_step_roots: Any
    _steps_cancelled_in: Any

    def _q(self, sql: str) -> str:
        return _marked(sql, self.MARK)

    def get(self, job_id: int) -> Job | None:
        row = self._conn().execute(self._q(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE id = ?"), (job_id,)).fetchone()
        return dbrows.row_to_job(row) if row else None

    def pauses(self) -> list[Pause]:
        rows = self._conn().execute(f"SELECT {dbrows.PAUSE_COLS} FROM pauses ORDER BY paused_at, kind, name")
        return [dbrows.row_to_pause(r) for r in rows]

    def resume(self, kind: str, name: str) -> bool:
        with self._write() as c:
            return self._resume_in(c, kind, name)

    def cancel_running(self, job_id: int, now: float) -> Job | None:
        with self._write() as c:
            self._lock_step_roots(c, "j.id = ?", (job_id,))
            done = c.execute(self._q(f"UPDATE jobs SET state = 'cancelled', finished_at = ?{self._RELEASE}"
                                     f" WHERE id = ? AND state = 'running' RETURNING {STEP_OF_JOB}"),
                             (now, job_id)).fetchall()
            if done:
                # Its key is free at once: wake the claimers (PostgreSQL notifies, see _released).
                self._released(c)
                self._steps_cancelled_in(c, done, now)  # its outcome, when it ends, is discarded
            row = c.execute(self._q(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE id = ?"), (job_id,)).fetchone()
        return dbrows.row_to_job(row) if row else None

    def cancel_waiting(self, state: str, now: float, *, func: str | None = None, key: str | None = None,
                       pool: str | None = None) -> list[int]:
        if state not in State.PENDING:
            raise ValueError(f"only waiting jobs are cancelled this way, not {state!r}")
        extra, params = filters(func, key, pool)
        with self._write() as c:
            # The state is inlined (one of the fixed names): SQLite's partial indexes need the literal.
            self._lock_step_roots(c, f"j.state = '{state}'{filters(func, key, pool, 'j.')[0]}", params)
            rows = c.execute(self._q(
                f"UPDATE jobs SET state = 'cancelled', finished_at = ? WHERE state = '{state}'{extra}"
                f" RETURNING {STEP_OF_JOB}"), (now, *params)).fetchall()
            if rows:  # a key whose head went may start its next job
                self._released(c)
                self._steps_cancelled_in(c, rows, now)
        return [r[0] for r in rows]

    def _released(self, c: Any) -> None:
        """A job left `running` outside a finish: PostgreSQL tells the other claimers."""

    def pause(self, kind: str, name: str, now: float) -> bool:
        with self._write() as c:
            new = c.execute(self._q("SELECT 1 FROM pauses WHERE kind = ? AND name = ?"), (kind, name)).fetchone() is None
            # By hand: no probe, whether it was paused already by the breaker or not.
            c.execute(self._q("INSERT INTO pauses (kind, name, paused_at, failures) VALUES (?, ?, ?, 0)"
                              " ON CONFLICT (kind, name) DO UPDATE SET probe_at = NULL, probe_job = NULL"),
                      (kind, name, now))
        return new

    def _pause_of(self, c: Any, t: pz.Target) -> tuple[int, int | None]:
        """pauses.Lookups.pause: a paused target's trips and probe job."""
        row = c.execute(self._q("SELECT trips, probe_job FROM pauses WHERE kind = ? AND name = ?"), t).fetchone()
        return (row[0], row[1]) if row else (0, None)

    def _stamp_probes(self, c: Any, probes: list[tuple[pz.Target, int]]) -> None:
        """The claim let these jobs through as probes: no other probe until they finish."""
        self._many(c, "UPDATE pauses SET probe_job = ? WHERE kind = ? AND name = ?",
                   [(job_id, *t) for t, job_id in probes])

    # --- per-minute counters ---------------------------------------------------------------
    def add_minute(self, m: Minute) -> None:
        with self._write() as c:
            c.execute(self._q("INSERT INTO minutes VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (minute, member) DO UPDATE"
                              " SET completed = minutes.completed + excluded.completed,"
                              " failed = minutes.failed + excluded.failed, seconds = minutes.seconds + excluded.seconds,"
                              " depth = coalesce(excluded.depth, minutes.depth)"),
                      (m.minute, m.member, m.completed, m.failed, m.seconds, m.depth))

    def minutes(self, since: int) -> list[Minute]:
        rows = self._conn().execute(self._q("SELECT minute, member, completed, failed, seconds, depth FROM minutes"
                                            " WHERE minute >= ? ORDER BY minute, member"), (since,)).fetchall()
        return [Minute(*r) for r in rows]

    def prune_minutes(self, before: int) -> int:
        with self._write() as c:
            return c.execute(self._q("DELETE FROM minutes WHERE minute < ?"), (before,)).rowcount

    def cron_list(self) -> list[CronRecord]:
        return [dbrows.row_to_cron(r) for r in self._conn().execute("SELECT * FROM crons ORDER BY name")]

    def cron_delete(self, name: str) -> bool:
        with self._write() as c:
            return c.execute(self._q("DELETE FROM crons WHERE name = ?"), (name,)).rowcount > 0

    def next_cron_at(self) -> float | None:
        return self._conn().execute("SELECT min(next_run_at) FROM crons").fetchone()[0]

    def waiting_over_budgets(self, limits: Any) -> list[tuple[int, str, str | None, float | None]]:
        least = min([*limits.pools.values(), *limits.groups.values()], default=None)
        if least is None:
            return []
        return self._conn().execute(self._q(
            f"SELECT id, pool, concurrency_group, cost_units FROM jobs WHERE {WAITING_ANY}"
            " AND coalesce(cost_units, 1.0) > ? ORDER BY id"),
            (least,)).fetchall()

    def cron_move_if(self, name: str, tick: float, new_tick: float) -> bool:
        with self._write() as c:
            return c.execute(self._q("UPDATE crons SET next_run_at = ? WHERE name = ? AND next_run_at = ?"),
                             (new_tick, name, tick)).rowcount > 0

    def _fire_in(self, c: Any, name: str, template: str, tick: float, next_tick: float, now: float,
                 waiting: int | None) -> CronFire:
        """Write what crons.fire decided for a due tick of `name` (its row read and locked).
        `waiting`: the id of a run of it still waiting, which the tick is folded into (it
        records the tick); if that run has been claimed since it was read (another host's
        worker, between the two statements), the tick fires a run of its own instead."""
        folds = waiting is not None and c.execute(self._q(
            f"UPDATE jobs SET cron_until = ? WHERE id = ? AND state IN {WAITING_IN}"),
            (tick, waiting)).rowcount > 0
        fire = crons.fire(name, dbrows.template_from_json(template), tick, now, folds)
        c.execute(self._q("UPDATE crons SET next_run_at = ?, last_fired_at = ?, folded = folded + ? WHERE name = ?"),
                  (next_tick, tick, int(fire.folded), name))
        if fire.job is None:
            return CronFire("folded", None)
        answer = self._submit_in(c, [[fire.job]], now, adm.NO_LIMITS)[0]
        return CronFire("fired", answer[0])

    # --- finishing and orphans: the plans of pauses.py and orphans.py, written -------------
    def _many(self, c: Any, sql: str, rows: list) -> None:
        c.cursor().executemany(self._q(sql), rows)  # psycopg's connections have no executemany

    def _write_pauses(self, c: Any, p: pz.Plan) -> list[Pause]:
        """Write a pauses plan; returns the pauses it begins."""
        if p.reset:
            self._many(c, "DELETE FROM streaks WHERE kind = ? AND name = ?", p.reset)
        if p.streaks:
            self._put_streaks(c, [(*t, n, dbrows.dumps(e) if e else None) for t, (n, e) in p.streaks.items()])
        if p.resumed:  # a probe succeeded
            self._many(c, "DELETE FROM pauses WHERE kind = ? AND name = ?", p.resumed)
        begun = set()
        for t, (at, n, e) in p.pauses.items():
            err = dbrows.dumps(e) if e else None
            if at is None:
                c.execute(self._q("UPDATE pauses SET failures = ?, last_error = ? WHERE kind = ? AND name = ?"),
                          (n, err, *t))
            elif self._begin_pause(c, t, at, n, err):
                begun.add(t)
        if p.probes:
            self._many(c, "UPDATE pauses SET probe_at = ?, trips = ?, probe_job = NULL WHERE kind = ? AND name = ?",
                       [(at, trips, *t) for t, (at, trips) in p.probes.items()])
        return [Pause(*t, p.pauses[t][0], n, e, *p.probes.get(t, (None, 0)))  # type: ignore[arg-type]
                for t, n, e in p.new if t in begun]

    def _begin_pause(self, c: Any, t: pz.Target, at: float, failures: int, err: str | None) -> bool:
        """Write a pause the plan begins; False if it was there already (see PostgreSQL)."""
        c.execute(self._q("INSERT INTO pauses (kind, name, paused_at, failures, last_error) VALUES (?, ?, ?, ?, ?)"),
                  (*t, at, failures, err))
        return True

    def _put_streaks(self, c: Any, rows: list[tuple]) -> None:
        """(kind, name, failures, last error JSON) rows: the streaks as they are now."""
        self._many(c, "INSERT INTO streaks VALUES (?, ?, ?, ?) ON CONFLICT (kind, name) DO UPDATE"
                      " SET failures = excluded.failures, last_error = excluded.last_error", rows)

    def _write_orphans(self, c: Any, p: orphans.Plan, now: float) -> None:
        if p.dead:
            self._many(c, f"UPDATE jobs SET state = 'dead', error = ?, finished_at = ?{self._RELEASE} WHERE id = ?",
                       [(dbrows.dumps(orphans.ERROR), now, i) for i in p.dead])
            self._advance_dead_in(c, p.dead, orphans.ERROR, now)  # a step given up on ends its item
        if p.requeue:
            self._many(c, f"UPDATE jobs SET state = 'queued', orphaned = orphaned + 1{self._RELEASE} WHERE id = ?",
                       [(i,) for i in p.requeue])

    # --- the outbox -------------------------------------------------------------------------
    def deliver_events(self, now: float, admission: adm.Admission, max_attempts: int,
                       backoff: Callable[[int], float], limit: int = 500) -> list[EventAccepted]:
        with self._write() as c:
            self._lock_outbox(c)
            due = c.execute(self._DUE_EVENTS, (now, limit)).fetchall()
            order, out = outbox.KeyOrder(), []
            for event_id, template, attempts, key in due:
                if not order.holds(key):  # an earlier event of its key waits: so does this one
                    out.append(self._deliver_due_in(c, event_id, template, attempts, key, now, admission,
                                                    max_attempts, backoff, order))
            return out

    def _lock_admission(self, c: Any) -> None:
        """Before an admission's reads outside submit_requests (an event's delivery): a store
        shared by several daemons serializes them with every other submit."""

    def _repair_key_order(self, c: Any, key: str | None = None) -> None:
        """REPAIR_KEY_ORDER for one key, or for every key (None)."""
        sql = REPAIR_KEY_ORDER.format(order=self._EVENT_ORDER)
        if key is None:
            c.execute(sql)
        else:
            c.execute(self._q(sql + " AND key = ?"), (key,))

    def _lock_outbox(self, c: Any) -> None:
        """Before reading the outbox to deliver, or a keyed event's place in it: a store
        shared by several daemons lets one at a time (else a later event of a key could be
        delivered by one while another refuses the earlier)."""

    def accept_event(self, event: NewEvent, now: float, admission: adm.Admission) -> EventAccepted:
        template, key = dbrows.template_to_json(event.job), event.job.key
        with self._write() as c:
            behind = None
            if key is not None:  # its place behind the pending events of its key
                self._lock_outbox(c)
                behind = c.execute(self._q("SELECT max(next_attempt_at) FROM events WHERE key = ?"
                                           " AND state = 'pending'"), (key,)).fetchone()[0]
            at = outbox.accepted_at(now, behind)
            if not c.execute(self._q(
                    "INSERT INTO events (event_id, state, job, func, key, created_at, next_attempt_at)"
                    " VALUES (?, 'pending', ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING"),
                    (event.event_id, template, event.job.func, key, now, now if at is None else at)).rowcount:
                old = c.execute(self._q("SELECT state, job_id FROM events WHERE event_id = ?"),
                                (event.event_id,)).fetchone()
                return EventAccepted(event.event_id, True, old[0], old[1])
            if at is not None:
                return EventAccepted(event.event_id, False, EventState.PENDING, None)
            answer = self._deliver_in(c, event.event_id, template, now, admission)
        return self._accepted(event.event_id, answer)

    @staticmethod
    def _accepted(event_id: str, answer: Any) -> EventAccepted:
        """What accept_event says of a new event: delivered as a job, or pending."""
        if isinstance(answer, adm.Refusal):
            return EventAccepted(event_id, False, EventState.PENDING, None)
        return EventAccepted(event_id, False, EventState.DELIVERED, answer[0].job_id)

    def _deliver_in(self, c: Any, event_id: str, template: str, now: float,
                    admission: adm.Admission) -> list[Submitted] | adm.Refusal:
        job = outbox.job_for(event_id, dbrows.template_from_json(template), now)
        self._lock_admission(c)
        answer = self._submit_in(c, [[job]], now, admission)[0]
        if not isinstance(answer, adm.Refusal):
            c.execute(self._q("UPDATE events SET state = 'delivered', job_id = ?, next_attempt_at = NULL,"
                              " attempts = attempts + 1 WHERE event_id = ?"), (answer[0].job_id, event_id))
        return answer

    def _deliver_due_in(self, c: Any, event_id: str, template: str, attempts: int, key: str | None, now: float,
                        admission: adm.Admission, max_attempts: int, backoff: Callable[[int], float],
                        order: outbox.KeyOrder) -> EventAccepted:
        """One due event of the outbox: delivered, or its refusal written as outbox decides
        (with the later events of its key held as long)."""
        answer = self._deliver_in(c, event_id, template, now, admission)
        if not isinstance(answer, adm.Refusal):
            return EventAccepted(event_id, False, EventState.DELIVERED, answer[0].job_id)
        r = outbox.after_refusal(attempts, answer, now, max_attempts, backoff)
        state = EventState.DEAD if r.dead else EventState.PENDING
        c.execute(self._q("UPDATE events SET attempts = ?, state = ?, next_attempt_at = ?, last_error = ?"
                          " WHERE event_id = ?"), (r.attempts, state, r.next_attempt_at, r.last_error, event_id))
        if order.refused(key, r) is not None:  # the key's later events wait as long
            self._repair_key_order(c, key)
        return EventAccepted(event_id, False, state, None)

    # --- memory-aware start ----------------------------------------------------------------
    def footprints(self, funcs: list[str]) -> dict[str, mem.Footprint]:
        if not funcs:
            return {}
        rows = self._conn().execute(self._q(
            f"SELECT func, peak, runtime, runs, estimated FROM footprints WHERE func IN ({','.join('?' * len(funcs))})"),
            list(funcs)).fetchall()
        return {f: mem.Footprint(p, r, n, bool(e)) for f, p, r, n, e in rows}

    def record_runs(self, runs: list[tuple[str, int | None, float, bool, bool]], now: float) -> None:
        """Fold each run (func, peak bytes, runtime, killed, estimated) into its function's
        footprint (mem.update), in one transaction."""
        with self._write() as c:
            rows = c.execute(self._q(
                "SELECT func, peak, runtime, runs, estimated FROM footprints WHERE func IN"
                f" ({','.join('?' * len({r[0] for r in runs}))})"), sorted({r[0] for r in runs})).fetchall()
            known: dict[str, mem.Footprint | None] = {f: mem.Footprint(p, r, n, bool(e)) for f, p, r, n, e in rows}
            for func, peak, runtime, killed, estimated in runs:
                known[func] = mem.update(known.get(func), peak, runtime, killed, estimated)
            self._many(c, self._q(
                "INSERT INTO footprints VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (func) DO UPDATE SET peak = excluded.peak,"
                " runtime = excluded.runtime, runs = excluded.runs, estimated = excluded.estimated,"
                " updated_at = excluded.updated_at"),
                [(f, fp.peak, fp.runtime, fp.runs, fp.estimated, now) for f, fp in known.items() if fp is not None])

    def prune_events(self, created_before: float, limit: int) -> int:
        with self._write() as c:
            return c.execute(self._q(
                "DELETE FROM events WHERE event_id IN (SELECT e.event_id FROM events e WHERE e.state = 'delivered'"
                " AND e.created_at < ? AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = e.job_id) LIMIT ?)"),
                (created_before, limit)).rowcount

    def release_unstarted(self, job_ids: list[int]) -> int:
        """Claimed jobs that did not start go back to `queued` (their place in the queue and
        in their key kept), their attempt not spent. Returns how many were still running."""
        with self._write() as c:
            n = 0
            for job_id in job_ids:
                n += c.execute(self._q(f"{REQUEUE}{self._RELEASE} WHERE id = ? AND state = 'running'"),
                               (job_id,)).rowcount
            if n:
                self._released(c)
        return n

    def set_progress_if_running(self, updates: list[tuple[int, int, dict[str, Any]]]) -> int:
        """One statement for the batch (Store.set_progress_if_running); losing it in a power
        cut loses a progress note, so it is bookkeeping (no flush of its own)."""
        if not updates:
            return 0
        with self.batch(bookkeeping=True), self._write() as c:
            cur = c.cursor()
            cur.executemany(self._q("UPDATE jobs SET progress = ? WHERE id = ? AND state = 'running' AND attempts = ?"),
                            [(dbrows.dumps(p), job_id, attempt) for job_id, attempt, p in updates])
            return max(0, cur.rowcount)

    def _scheduled_at(self, c: Any, run_at: float) -> None:
        """Jobs were scheduled at run_at (a shared store tells the other daemons' timers)."""

    def budget_usage(self, pools: list[str], groups: list[str]) -> dict[tuple[str, str], tuple[float, int, float, int]]:
        """(kind, name) -> (running cost, running jobs, waiting cost, waiting jobs) of the
        named pools and groups (for stats; a scan of the waiting jobs, never on a claim)."""
        parts, params = [], []
        for kind, col, names in (("pool", "pool", pools), ("group", "concurrency_group", groups)):
            if names:
                parts.append(f"SELECT '{kind}', {col}, state = 'running', count(*), sum(coalesce(cost_units, 1))"
                             f" FROM jobs WHERE {state_any(State.RUNNING, *State.PENDING)}"
                             f" AND {col} IN ({','.join('?' * len(names))}) GROUP BY {col}, state = 'running'")
                params += names
        out: dict[tuple[str, str], tuple[float, int, float, int]] = {}
        if not parts:
            return out
        for kind, name, running, n, units in self._conn().execute(self._q(" UNION ALL ".join(parts)), params):
            rc, rn, wc, wn = out.get((kind, name), (0.0, 0, 0.0, 0))
            out[(kind, name)] = (rc + units, rn + n, wc, wn) if running else (rc, rn, wc + units, wn + n)
        return out

    def event_counts(self) -> dict[str, int]:
        out = dict.fromkeys(EventState.ALL, 0)
        out.update(self._conn().execute("SELECT state, count(*) FROM events GROUP BY state").fetchall())
        return out

    def list_events(self, state: str | None, limit: int) -> list[Event]:
        where, params = ("", (limit,)) if state is None else (" WHERE state = ?", (state, limit))
        rows = self._conn().execute(
            self._q(f"SELECT {dbrows.EVENT_COLS} FROM events{where} ORDER BY created_at DESC LIMIT ?"), params)
        return [Event(*r) for r in rows]

    def retry_event(self, event_id: str, now: float) -> Event | None:
        with self._write() as c:
            self._lock_outbox(c)
            if c.execute(self._q("UPDATE events SET state = 'pending', attempts = 0, next_attempt_at = ?"
                                 " WHERE event_id = ? AND state = 'dead'"), (now, event_id)).rowcount:
                key = c.execute(self._q("SELECT key FROM events WHERE event_id = ?"), (event_id,)).fetchone()[0]
                if key is not None:  # its place among its key's pending events
                    self._repair_key_order(c, key)
            row = c.execute(self._q(f"SELECT {dbrows.EVENT_COLS} FROM events WHERE event_id = ?"),
                            (event_id,)).fetchone()
        return Event(*row) if row else None
