"""What the SQL stores keep for stats and memory-aware starts: per-minute counts, the
budgets' use, the waiting jobs over every budget and the functions' footprints."""

from __future__ import annotations

from typing import Any

from ...core.job import State
from ...core.policy import claim
from ...core.policy import memory as mem
from ..records import Minute
from ..sqlstates import WAITING_ANY, state_any
from .dialect import Dialect
from .plans import many


def add_minute(d: Dialect, c: Any, m: Minute) -> None:
    c.execute(d.q("INSERT INTO minutes VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (minute, member) DO UPDATE"
                  " SET completed = minutes.completed + excluded.completed,"
                  " failed = minutes.failed + excluded.failed, seconds = minutes.seconds + excluded.seconds,"
                  " depth = coalesce(excluded.depth, minutes.depth)"),
              (m.minute, m.member, m.completed, m.failed, m.seconds, m.depth))


def minutes(d: Dialect, c: Any, since: int) -> list[Minute]:
    rows = c.execute(d.q("SELECT minute, member, completed, failed, seconds, depth FROM minutes"
                         " WHERE minute >= ? ORDER BY minute, member"), (since,)).fetchall()
    return [Minute(*r) for r in rows]


def prune_minutes(d: Dialect, c: Any, before: int) -> int:
    return c.execute(d.q("DELETE FROM minutes WHERE minute < ?"), (before,)).rowcount


def waiting_over_budgets(d: Dialect, c: Any, limits: claim.Limits) -> list[tuple[int, str, str | None, float | None]]:
    least = min([*limits.pools.values(), *limits.groups.values()], default=None)
    if least is None:
        return []
    return c.execute(d.q(f"SELECT id, pool, concurrency_group, cost_units FROM jobs WHERE {WAITING_ANY}"
                         " AND coalesce(cost_units, 1.0) > ? ORDER BY id"), (least,)).fetchall()


def budget_usage(d: Dialect, c: Any, pools: list[str],
                 groups: list[str]) -> dict[tuple[str, str], tuple[float, int, float, int]]:
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
    for kind, name, running, n, units in c.execute(d.q(" UNION ALL ".join(parts)), params):
        rc, rn, wc, wn = out.get((kind, name), (0.0, 0, 0.0, 0))
        out[(kind, name)] = (rc + units, rn + n, wc, wn) if running else (rc, rn, wc + units, wn + n)
    return out


def footprints(d: Dialect, c: Any, funcs: list[str]) -> dict[str, mem.Footprint]:
    if not funcs:
        return {}
    rows = c.execute(d.q(
        f"SELECT func, peak, runtime, runs, estimated FROM footprints WHERE func IN ({','.join('?' * len(funcs))})"),
        list(funcs)).fetchall()
    return {f: mem.Footprint(p, r, n, bool(e)) for f, p, r, n, e in rows}


def record_runs(d: Dialect, c: Any, runs: list[tuple[str, int | None, float, bool, bool]], now: float) -> None:
    """Fold each run (func, peak bytes, runtime, killed, estimated) into its function's
    footprint (mem.update)."""
    known: dict[str, mem.Footprint | None] = dict(footprints(d, c, sorted({r[0] for r in runs})))
    for func, peak, runtime, killed, estimated in runs:
        known[func] = mem.update(known.get(func), peak, runtime, killed, estimated)
    many(d, c, "INSERT INTO footprints VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (func) DO UPDATE SET"
               " peak = excluded.peak, runtime = excluded.runtime, runs = excluded.runs,"
               " estimated = excluded.estimated, updated_at = excluded.updated_at",
         [(f, fp.peak, fp.runtime, fp.runs, fp.estimated, now) for f, fp in known.items() if fp is not None])
