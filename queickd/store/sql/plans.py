"""Writing what the policies decided at a finish or an orphan sweep (core/policy/pauses.py,
orphans.py) on the SQL stores, in the caller's transaction."""

from __future__ import annotations

from typing import Any

from ...core.policy import orphans
from ...core.policy import pauses as pz
from .. import rows as dbrows
from ..records import Pause
from .dialect import Dialect
from .workflows import Steps, advance_dead_in

# A target's streak and whether it is paused (pauses.Lookups), in one statement.
STREAK = ("SELECT coalesce((SELECT failures FROM streaks WHERE kind = ? AND name = ?), 0),"
          " EXISTS (SELECT 1 FROM pauses WHERE kind = ? AND name = ?)")


def many(d: Dialect, c: Any, sql: str, rows: list) -> None:
    c.cursor().executemany(d.q(sql), rows)  # psycopg's connections have no executemany


def pause_of(d: Dialect, c: Any, t: pz.Target) -> tuple[int, int | None]:
    """pauses.Lookups.pause: a paused target's trips and probe job."""
    row = c.execute(d.q("SELECT trips, probe_job FROM pauses WHERE kind = ? AND name = ?"), t).fetchone()
    return (row[0], row[1]) if row else (0, None)


def write_pauses(d: Dialect, c: Any, p: pz.Plan) -> list[Pause]:
    """Write a pauses plan; returns the pauses it begins."""
    if p.reset:
        many(d, c, "DELETE FROM streaks WHERE kind = ? AND name = ?", p.reset)
    if p.streaks:
        d.put_streaks(c, [(*t, n, dbrows.dumps(e) if e else None) for t, (n, e) in p.streaks.items()])
    if p.resumed:  # a probe succeeded
        many(d, c, "DELETE FROM pauses WHERE kind = ? AND name = ?", p.resumed)
    begun = set()
    for t, (at, n, e) in p.pauses.items():
        err = dbrows.dumps(e) if e else None
        if at is None:
            c.execute(d.q("UPDATE pauses SET failures = ?, last_error = ? WHERE kind = ? AND name = ?"), (n, err, *t))
        elif d.begin_pause(c, t, at, n, err):
            begun.add(t)
    if p.probes:
        many(d, c, "UPDATE pauses SET probe_at = ?, trips = ?, probe_job = NULL WHERE kind = ? AND name = ?",
             [(at, trips, *t) for t, (at, trips) in p.probes.items()])
    return [Pause(*t, p.pauses[t][0], n, e, *p.probes.get(t, (None, 0)))  # type: ignore[arg-type]
            for t, n, e in p.new if t in begun]


def write_orphans(d: Dialect, c: Any, s: Steps, p: orphans.Plan, now: float) -> None:
    if p.dead:
        many(d, c, f"UPDATE jobs SET state = 'dead', error = ?, finished_at = ?{d.release} WHERE id = ?",
             [(dbrows.dumps(orphans.ERROR), now, i) for i in p.dead])
        advance_dead_in(d, c, s, p.dead, orphans.ERROR, now)  # a step given up on ends its item
    if p.requeue:
        many(d, c, f"UPDATE jobs SET state = 'queued', orphaned = orphaned + 1{d.release} WHERE id = ?",
             [(i,) for i in p.requeue])
