"""The operator's actions on jobs and pauses the SQL stores share (Store: get, pause,
resume, cancel_running, cancel_waiting, release_unstarted), in the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.job import Job
from .. import rows as dbrows
from ..records import Pause
from .dialect import Dialect
from .workflows import STEP_OF_JOB, Steps, cancel_in, lock_step_roots, steps_cancelled_in

# A claimed job that did not start, back where it waited; with the dialect's release after it.
REQUEUE = "UPDATE jobs SET state = 'queued', attempts = attempts - 1, started_at = NULL"


def filters(func: str | None, key: str | None, pool: str | None, alias: str = "") -> tuple[str, tuple]:
    """' AND ...' conditions (with ? marks) for list_jobs' and cancel_waiting's filters
    (`alias`: of the jobs table, as 'j.')."""
    given = [(c, v) for c, v in (("func", func), ("key", key), ("pool", pool)) if v is not None]
    return "".join(f" AND {alias}{c} = ?" for c, _ in given), tuple(v for _, v in given)


def get(d: Dialect, c: Any, job_id: int) -> Job | None:
    row = c.execute(d.q(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE id = ?"), (job_id,)).fetchone()
    return dbrows.row_to_job(row) if row else None


def pauses(d: Dialect, c: Any) -> list[Pause]:
    rows = c.execute(f"SELECT {dbrows.PAUSE_COLS} FROM pauses ORDER BY paused_at, kind, name")
    return [dbrows.row_to_pause(r) for r in rows]


def resume(d: Dialect, c: Any, kind: str, name: str) -> bool:
    """Lift a pause and forget its streak; the jobs it held may start."""
    c.execute(d.q("DELETE FROM streaks WHERE kind = ? AND name = ?"), (kind, name))
    gone = c.execute(d.q("DELETE FROM pauses WHERE kind = ? AND name = ?"), (kind, name)).rowcount > 0
    if gone:
        d.released(c)
    return gone


def pause(d: Dialect, c: Any, kind: str, name: str, now: float) -> bool:
    new = c.execute(d.q("SELECT 1 FROM pauses WHERE kind = ? AND name = ?"), (kind, name)).fetchone() is None
    # By hand: no probe, whether it was paused already by the breaker or not.
    c.execute(d.q("INSERT INTO pauses (kind, name, paused_at, failures) VALUES (?, ?, ?, 0)"
                  " ON CONFLICT (kind, name) DO UPDATE SET probe_at = NULL, probe_job = NULL"), (kind, name, now))
    return new


def cancel_running(d: Dialect, c: Any, s: Steps, job_id: int, now: float) -> Job | None:
    lock_step_roots(d, c, "j.id = ?", (job_id,))
    done = c.execute(d.q(f"UPDATE jobs SET state = 'cancelled', finished_at = ?{d.release}"
                         f" WHERE id = ? AND state = 'running' RETURNING {STEP_OF_JOB}"), (now, job_id)).fetchall()
    if done:
        d.released(c)  # its key is free at once: wake the claimers
        steps_cancelled_in(d, c, s, done, now)  # its outcome, when it ends, is discarded
    return get(d, c, job_id)


def cancel_waiting(d: Dialect, c: Any, s: Steps, state: str, now: float, func: str | None, key: str | None,
                   pool: str | None) -> list[int]:
    extra, params = filters(func, key, pool)
    # The state is inlined (one of the fixed names): SQLite's partial indexes need the literal.
    lock_step_roots(d, c, f"j.state = '{state}'{filters(func, key, pool, 'j.')[0]}", params)
    rows = c.execute(d.q(f"UPDATE jobs SET state = 'cancelled', finished_at = ? WHERE state = '{state}'{extra}"
                         f" RETURNING {STEP_OF_JOB}"), (now, *params)).fetchall()
    if rows:  # a key whose head went may start its next job
        d.released(c)
        steps_cancelled_in(d, c, s, rows, now)
    return [r[0] for r in rows]


def cancel(d: Dialect, c: Any, s: Steps, job_id: int, now: float) -> Job | None:
    # An edge daemon's held job has not left the device: cancelled, it is never forwarded.
    if not c.execute(d.q("UPDATE jobs SET state = 'cancelled', finished_at = ? WHERE id = ? AND state = 'held'"),
                     (now, job_id)).rowcount:
        cancel_in(d, c, s, job_id, now)
    return get(d, c, job_id)


def retry_dead(d: Dialect, c: Any, job_id: int, now: float) -> Job | None:
    if c.execute(d.q("UPDATE jobs SET state = 'queued', run_at = ?, attempts = 0, orphaned = 0, finished_at = NULL"
                     f" WHERE id = ? AND state = 'dead'{d.replayed}"), (now, job_id)).rowcount:
        d.released(c)
    return get(d, c, job_id)


def release_unstarted(d: Dialect, c: Any, job_ids: list[int]) -> int:
    """Claimed jobs that did not start go back to `queued` (their place in the queue and
    in their key kept), their attempt not spent. Returns how many were still running."""
    n = 0
    for job_id in job_ids:
        n += c.execute(d.q(f"{REQUEUE}{d.release} WHERE id = ? AND state = 'running'"), (job_id,)).rowcount
    if n:
        d.released(c)
    return n


def set_progress_if_running(d: Dialect, c: Any, updates: list[tuple[int, int, dict[str, Any]]]) -> int:
    # A job that says progress is alive: its stalled mark, if any, goes with the same write.
    cur = c.cursor()
    cur.executemany(d.q("UPDATE jobs SET progress = ?, stalled_at = NULL WHERE id = ? AND state = 'running'"
                        " AND attempts = ?"),
                    [(dbrows.dumps(p), job_id, attempt) for job_id, attempt, p in updates])
    return max(0, cur.rowcount)


def set_stalled(d: Dialect, c: Any, updates: Sequence[tuple[int, int, float | None]]) -> int:
    """A mark (a time) is set on a job still running that attempt; a clear (None) goes on that
    attempt whatever its state now (a run that ended may have been stored first)."""
    marks = [(at, job_id, attempt) for job_id, attempt, at in updates if at is not None]
    clears = [(job_id, attempt) for job_id, attempt, at in updates if at is None]
    n = 0
    cur = c.cursor()
    if marks:
        cur.executemany(d.q("UPDATE jobs SET stalled_at = ? WHERE id = ? AND state = 'running' AND attempts = ?"),
                        marks)
        n += max(0, cur.rowcount)
    if clears:
        cur.executemany(d.q("UPDATE jobs SET stalled_at = NULL WHERE id = ? AND attempts = ?"
                            " AND stalled_at IS NOT NULL"), clears)
        n += max(0, cur.rowcount)
    return n


def count_stalled(d: Dialect, c: Any) -> int:
    return c.execute("SELECT count(*) FROM jobs WHERE state = 'running' AND stalled_at IS NOT NULL").fetchone()[0]
