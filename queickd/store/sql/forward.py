"""An edge daemon's jobs for its upstream (Store's Forwarding role), in SQL both stores
share: the held jobs oldest first, and the changes of state forwarding makes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.job import Job, State
from .. import rows as dbrows
from .dialect import Dialect


def held_jobs(d: Dialect, c: Any, limit: int, after: int = 0) -> list[Job]:
    rows = c.execute(d.q(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE state = '{State.HELD}' AND id > ?"
                         " ORDER BY id LIMIT ?"), (after, limit)).fetchall()
    return [dbrows.row_to_job(r) for r in rows]


def held_backlog(d: Dialect, c: Any) -> tuple[int, int, float | None]:
    # The bytes as policy/forward.size counts them, near enough: the stored JSON's length.
    row = c.execute(f"SELECT count(*), coalesce(sum(length(func) + coalesce(length(args), 2)"
                    f" + coalesce(length(kwargs), 2)), 0), min(created_at) FROM jobs WHERE state = '{State.HELD}'"
                    ).fetchone()
    return int(row[0]), int(row[1]), row[2]


def mark_forwarded(d: Dialect, c: Any, pairs: Sequence[tuple[int, int]]) -> int:
    if not pairs:
        return 0
    cur = c.cursor()  # one executemany for the batch (its rowcount: all the rows it changed)
    cur.executemany(d.q(f"UPDATE jobs SET state = '{State.FORWARDED}', upstream_id = ?"
                        f" WHERE id = ? AND state = '{State.HELD}'"), [(u, j) for j, u in pairs])
    return cur.rowcount


def refuse_held(d: Dialect, c: Any, job_id: int, error: dict[str, Any], now: float) -> bool:
    return c.execute(d.q(f"UPDATE jobs SET state = '{State.DEAD}', error = ?, finished_at = ?"
                         f" WHERE id = ? AND state = '{State.HELD}'"),
                     (dbrows.dumps(error), now, job_id)).rowcount > 0


def settle_forwarded(d: Dialect, c: Any, job_id: int, state: str, result: Any, error: dict[str, Any] | None,
                     finished_at: float | None) -> bool:
    if state not in State.FINAL:
        raise ValueError(f"a forwarded job settles in a final state, not {state!r}")
    return c.execute(d.q(f"UPDATE jobs SET state = ?, result = ?, error = ?, finished_at = ?"
                         f" WHERE id = ? AND state = '{State.FORWARDED}'"),
                     (state, None if result is None else dbrows.dumps(result),
                      None if error is None else dbrows.dumps(error), finished_at, job_id)).rowcount > 0


def forwarded_jobs(d: Dialect, c: Any, limit: int, after: int = 0) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in c.execute(
        d.q(f"SELECT id, upstream_id FROM jobs WHERE state = '{State.FORWARDED}' AND id > ? ORDER BY id LIMIT ?"),
        (after, limit)).fetchall()]
