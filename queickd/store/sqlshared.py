"""What the SQL stores (SQLite, PostgreSQL) do with the same SQL, written once.

A store mixes SharedSql in and provides MARK (its driver's parameter marker), _RELEASE (what
else a job's row drops when it leaves `running`), _conn() (a connection for reads), _write()
(a write transaction), _submit_in() and _resume_in(). Queries here are written with `?` and
turned into the store's marker once per text. The decisions are the policies' (core/policy);
what is here only writes them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..core.job import Job, Submitted
from ..core.policy import admission as adm
from ..core.policy import crons, orphans, outbox
from ..core.policy import pauses as pz
from . import rows as dbrows
from .base import CronFire, CronRecord, Event, EventAccepted, EventState, Pause

# A target's streak and whether it is paused (pauses.Lookups), in one statement.
STREAK = ("SELECT coalesce((SELECT failures FROM streaks WHERE kind = ? AND name = ?), 0),"
          " EXISTS (SELECT 1 FROM pauses WHERE kind = ? AND name = ?)")


@functools.cache
def _marked(sql: str, mark: str) -> str:
    return sql if mark == "?" else sql.replace("?", mark)


class SharedSql:
    MARK: str
    _RELEASE: str
    _conn: Any
    _write: Any
    _submit_in: Any
    _resume_in: Any
    _advance_dead_in: Any  # wfsql.SqlWorkflows

    def _q(self, sql: str) -> str:
        return _marked(sql, self.MARK)

    def get(self, job_id: int) -> Job | None:
        row = self._conn().execute(self._q(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE id = ?"), (job_id,)).fetchone()
        return dbrows.row_to_job(row) if row else None

    def pauses(self) -> list[Pause]:
        rows = self._conn().execute("SELECT * FROM pauses ORDER BY paused_at, kind, name")
        return [dbrows.row_to_pause(r) for r in rows]

    def resume(self, kind: str, name: str) -> bool:
        with self._write() as c:
            return self._resume_in(c, kind, name)

    def cron_list(self) -> list[CronRecord]:
        return [dbrows.row_to_cron(r) for r in self._conn().execute("SELECT * FROM crons ORDER BY name")]

    def cron_delete(self, name: str) -> bool:
        with self._write() as c:
            return c.execute(self._q("DELETE FROM crons WHERE name = ?"), (name,)).rowcount > 0

    def next_cron_at(self) -> float | None:
        return self._conn().execute("SELECT min(next_run_at) FROM crons").fetchone()[0]

    def _fire_in(self, c: Any, name: str, template: str, tick: float, next_tick: float, now: float,
                 run_waiting: bool) -> CronFire:
        """Write what crons.fire decided for a due tick of `name` (its row read and locked)."""
        fire = crons.fire(name, dbrows.template_from_json(template), tick, now, run_waiting)
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
        begun = set()
        for t, (at, n, e) in p.pauses.items():
            err = dbrows.dumps(e) if e else None
            if at is None:
                c.execute(self._q("UPDATE pauses SET failures = ?, last_error = ? WHERE kind = ? AND name = ?"),
                          (n, err, *t))
            elif self._begin_pause(c, t, at, n, err):
                begun.add(t)
        return [Pause(*t, p.pauses[t][0], n, e) for t, n, e in p.new if t in begun]  # type: ignore[arg-type]

    def _begin_pause(self, c: Any, t: pz.Target, at: float, failures: int, err: str | None) -> bool:
        """Write a pause the plan begins; False if it was there already (see PostgreSQL)."""
        c.execute(self._q("INSERT INTO pauses VALUES (?, ?, ?, ?, ?)"), (*t, at, failures, err))
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
    def _deliver_in(self, c: Any, event_id: str, template: str, now: float,
                    admission: adm.Admission) -> list[Submitted] | adm.Refusal:
        job = outbox.job_for(event_id, dbrows.template_from_json(template), now)
        answer = self._submit_in(c, [[job]], now, admission)[0]
        if not isinstance(answer, adm.Refusal):
            c.execute(self._q("UPDATE events SET state = 'delivered', job_id = ?, next_attempt_at = NULL,"
                              " attempts = attempts + 1 WHERE event_id = ?"), (answer[0].job_id, event_id))
        return answer

    def _deliver_due_in(self, c: Any, event_id: str, template: str, attempts: int, now: float,
                        admission: adm.Admission, max_attempts: int,
                        backoff: Callable[[int], float]) -> EventAccepted:
        """One due event of the outbox: delivered, or its refusal written as outbox decides."""
        answer = self._deliver_in(c, event_id, template, now, admission)
        if not isinstance(answer, adm.Refusal):
            return EventAccepted(event_id, False, EventState.DELIVERED, answer[0].job_id)
        r = outbox.after_refusal(attempts, answer, now, max_attempts, backoff)
        state = EventState.DEAD if r.dead else EventState.PENDING
        c.execute(self._q("UPDATE events SET attempts = ?, state = ?, next_attempt_at = ?, last_error = ?"
                          " WHERE event_id = ?"), (r.attempts, state, r.next_attempt_at, r.last_error, event_id))
        return EventAccepted(event_id, False, state, None)

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
            c.execute(self._q("UPDATE events SET state = 'pending', attempts = 0, next_attempt_at = ?"
                              " WHERE event_id = ? AND state = 'dead'"), (now, event_id))
            row = c.execute(self._q(f"SELECT {dbrows.EVENT_COLS} FROM events WHERE event_id = ?"),
                            (event_id,)).fetchone()
        return Event(*row) if row else None
