"""What the SQL stores (SQLite, PostgreSQL) do with the same SQL, written once.

A store mixes SharedSql in and provides MARK (its driver's parameter marker), _conn() (a
connection for reads), _write() (a write transaction), _submit_in() and _resume_in().
Queries here are written with `?` and turned into the store's marker once per text."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ..core.job import Job, Submitted
from ..core.policy import admission as adm
from . import rows as dbrows
from .base import CronRecord, Event, EventState, Pause


@functools.cache
def _marked(sql: str, mark: str) -> str:
    return sql if mark == "?" else sql.replace("?", mark)


class SharedSql:
    MARK: str
    _conn: Any
    _write: Any
    _submit_in: Any
    _resume_in: Any

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

    # --- the outbox -------------------------------------------------------------------------
    def _deliver_in(self, c: Any, event_id: str, template: str, now: float,
                    admission: adm.Admission) -> list[Submitted] | adm.Refusal:
        job = dataclasses.replace(dbrows.template_from_json(template), run_at=now, idempotency_key=f"event:{event_id}")
        answer = self._submit_in(c, [[job]], now, admission)[0]
        if not isinstance(answer, adm.Refusal):
            c.execute(self._q("UPDATE events SET state = 'delivered', job_id = ?, next_attempt_at = NULL,"
                              " attempts = attempts + 1 WHERE event_id = ?"), (answer[0].job_id, event_id))
        return answer

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
