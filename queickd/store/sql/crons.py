"""The crons' table on the SQL stores: what they share of Store's cron calls, and the
writing of a due tick's fire (core/policy/crons.py), in the caller's transaction."""

from __future__ import annotations

from typing import Any

from ...core.policy import admission as adm
from ...core.policy import crons
from .. import rows as dbrows
from ..records import CronFire, CronRecord
from ..sqlstates import WAITING_IN
from .dialect import Dialect, Submit


def cron_list(d: Dialect, c: Any) -> list[CronRecord]:
    return [dbrows.row_to_cron(r) for r in c.execute("SELECT * FROM crons ORDER BY name")]


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
