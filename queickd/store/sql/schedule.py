"""What the SQL stores schedule: crons (their due ticks fired as core/policy/crons.py
decides) and the outbox's events (accepted, delivered, retried as core/policy/outbox.py
decides), written in the caller's transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.job import Submitted
from ...core.policy import admission as adm
from ...core.policy import crons, outbox
from .. import rows as dbrows
from ..records import CronFire, CronRecord, Event, EventAccepted, EventState, NewEvent
from ..sqlstates import WAITING_IN
from .dialect import Dialect, Submit

# Within a serial key, no pending event is due before an earlier one (outbox.KeyOrder):
# each one's next attempt raised to the latest among its key's pending events up to it, in
# the order accepted ({order}: the dialect's column of that order). After an event of the
# key is refused (its later ones wait as long), after a dead event goes back to pending (a
# retry), and once for rows written before the rule (a migration).
REPAIR_KEY_ORDER = ("UPDATE events SET next_attempt_at = (SELECT max(e2.next_attempt_at) FROM events e2"
                    " WHERE e2.key = events.key AND e2.state = 'pending' AND e2.{order} <= events.{order})"
                    " WHERE state = 'pending' AND key IS NOT NULL")


def repair_key_order(d: Dialect, c: Any, key: str | None = None) -> None:
    """REPAIR_KEY_ORDER for one key, or for every key (None)."""
    sql = REPAIR_KEY_ORDER.format(order=d.event_order)
    if key is None:
        c.execute(sql)
    else:
        c.execute(d.q(sql + " AND key = ?"), (key,))


def deliver_events(d: Dialect, c: Any, submit: Submit, now: float, admission: adm.Admission, max_attempts: int,
                   backoff: Callable[[int], float], limit: int = 500) -> list[EventAccepted]:
    d.lock_outbox(c)
    order, out = outbox.KeyOrder(), []
    for event_id, template, attempts, key in c.execute(d.due_events, (now, limit)).fetchall():
        if order.holds(key):  # an earlier event of its key waits: so does this one
            continue
        answer = _deliver_in(d, c, submit, event_id, template, now, admission)
        if not isinstance(answer, adm.Refusal):
            out.append(EventAccepted(event_id, False, EventState.DELIVERED, answer[0].job_id))
            continue
        r = outbox.after_refusal(attempts, answer, now, max_attempts, backoff)
        state = EventState.DEAD if r.dead else EventState.PENDING
        c.execute(d.q("UPDATE events SET attempts = ?, state = ?, next_attempt_at = ?, last_error = ?"
                      " WHERE event_id = ?"), (r.attempts, state, r.next_attempt_at, r.last_error, event_id))
        if order.refused(key, r) is not None:  # the key's later events wait as long
            repair_key_order(d, c, key)
        out.append(EventAccepted(event_id, False, state, None))
    return out


def accept_event(d: Dialect, c: Any, submit: Submit, event: NewEvent, now: float,
                 admission: adm.Admission) -> EventAccepted:
    template, key = dbrows.template_to_json(event.job), event.job.key
    behind = None
    if key is not None:  # its place behind the pending events of its key
        d.lock_outbox(c)
        behind = c.execute(d.q("SELECT max(next_attempt_at) FROM events WHERE key = ? AND state = 'pending'"),
                           (key,)).fetchone()[0]
    at = outbox.accepted_at(now, behind)
    if not c.execute(d.q(
            "INSERT INTO events (event_id, state, job, func, key, created_at, next_attempt_at)"
            " VALUES (?, 'pending', ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING"),
            (event.event_id, template, event.job.func, key, now, now if at is None else at)).rowcount:
        old = c.execute(d.q("SELECT state, job_id FROM events WHERE event_id = ?"), (event.event_id,)).fetchone()
        return EventAccepted(event.event_id, True, old[0], old[1])
    if at is not None:
        return EventAccepted(event.event_id, False, EventState.PENDING, None)
    answer = _deliver_in(d, c, submit, event.event_id, template, now, admission)
    if isinstance(answer, adm.Refusal):
        return EventAccepted(event.event_id, False, EventState.PENDING, None)
    return EventAccepted(event.event_id, False, EventState.DELIVERED, answer[0].job_id)


def _deliver_in(d: Dialect, c: Any, submit: Submit, event_id: str, template: str, now: float,
                admission: adm.Admission) -> list[Submitted] | adm.Refusal:
    job = outbox.job_for(event_id, dbrows.template_from_json(template), now)
    d.lock_admission(c)
    answer = submit(c, [[job]], now, admission)[0]
    if not isinstance(answer, adm.Refusal):
        c.execute(d.q("UPDATE events SET state = 'delivered', job_id = ?, next_attempt_at = NULL,"
                      " attempts = attempts + 1 WHERE event_id = ?"), (answer[0].job_id, event_id))
    return answer


def retry_event(d: Dialect, c: Any, event_id: str, now: float) -> Event | None:
    d.lock_outbox(c)
    if c.execute(d.q("UPDATE events SET state = 'pending', attempts = 0, next_attempt_at = ?"
                     " WHERE event_id = ? AND state = 'dead'"), (now, event_id)).rowcount:
        key = c.execute(d.q("SELECT key FROM events WHERE event_id = ?"), (event_id,)).fetchone()[0]
        if key is not None:  # its place among its key's pending events
            repair_key_order(d, c, key)
    row = c.execute(d.q(f"SELECT {dbrows.EVENT_COLS} FROM events WHERE event_id = ?"), (event_id,)).fetchone()
    return Event(*row) if row else None


def prune_events(d: Dialect, c: Any, created_before: float, limit: int) -> int:
    return c.execute(d.q(
        "DELETE FROM events WHERE event_id IN (SELECT e.event_id FROM events e WHERE e.state = 'delivered'"
        " AND e.created_at < ? AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = e.job_id) LIMIT ?)"),
        (created_before, limit)).rowcount


def event_counts(d: Dialect, c: Any) -> dict[str, int]:
    out = dict.fromkeys(EventState.ALL, 0)
    out.update(c.execute("SELECT state, count(*) FROM events GROUP BY state").fetchall())
    return out


def list_events(d: Dialect, c: Any, state: str | None, limit: int) -> list[Event]:
    where, params = ("", (limit,)) if state is None else (" WHERE state = ?", (state, limit))
    rows = c.execute(d.q(f"SELECT {dbrows.EVENT_COLS} FROM events{where} ORDER BY created_at DESC LIMIT ?"), params)
    return [Event(*r) for r in rows]


def cron_list(d: Dialect, c: Any) -> list[CronRecord]:
    return [dbrows.row_to_cron(r) for r in c.execute("SELECT * FROM crons ORDER BY name")]


def crons_due(d: Dialect, c: Any, now: float) -> list[CronRecord]:
    return [dbrows.row_to_cron(r) for r in c.execute(d.q("SELECT * FROM crons WHERE next_run_at <= ?"), (now,))]


def cron_delete(d: Dialect, c: Any, name: str) -> bool:
    return c.execute(d.q("DELETE FROM crons WHERE name = ?"), (name,)).rowcount > 0


def next_cron_at(d: Dialect, c: Any) -> float | None:
    return c.execute("SELECT min(next_run_at) FROM crons").fetchone()[0]


def cron_move_if(d: Dialect, c: Any, name: str, tick: float, new_tick: float) -> bool:
    return c.execute(d.q("UPDATE crons SET next_run_at = ? WHERE name = ? AND next_run_at = ?"),
                     (new_tick, name, tick)).rowcount > 0


def fire_in(d: Dialect, c: Any, submit: Submit, name: str, template: str, tick: float, next_tick: float,
            now: float, waiting: int | None) -> CronFire:
    """Write what crons.fire decided for a due tick of `name` (its row read and locked).
    `waiting`: the id of a run of it still waiting, which the tick is folded into (it
    records the tick); if that run has been claimed since it was read (another host's
    worker, between the two statements), the tick fires a run of its own instead."""
    folds = waiting is not None and c.execute(d.q(
        f"UPDATE jobs SET cron_until = ? WHERE id = ? AND state IN {WAITING_IN}"), (tick, waiting)).rowcount > 0
    fire = crons.fire(name, dbrows.template_from_json(template), tick, now, folds)
    c.execute(d.q("UPDATE crons SET next_run_at = ?, last_fired_at = ?, folded = folded + ? WHERE name = ?"),
              (next_tick, tick, int(fire.folded), name))
    if fire.job is None:
        return CronFire("folded", None)
    answer = submit(c, [[fire.job]], now, adm.NO_LIMITS)[0]
    return CronFire("fired", answer[0])
