"""SQLite store (`sqlite:///path/to/queue.db`): the durable default for one machine.

This module owns the store's queries but the claim's (claim.py); its connections and
transactions are in connection.py, its schema in schema.py. Counts by state are kept in a
table (new jobs by the submit, changes of state by triggers), so stats and the queue cap
cost one row read, not a scan of a million jobs.
"""

from __future__ import annotations

import collections
import functools
import sqlite3
from collections.abc import Collection, Sequence

from ...core.job import Job, NewJob, Outcome, State, Submitted
from ...core.policy import admission as adm
from ...core.policy import claim, orphans
from ...core.policy import pauses as pz
from .. import rows as dbrows
from ..pools import set_pool_sql
from ..records import CronFire, CronRecord, Finished, Recovered
from ..sql import operator, plans
from ..sql import rates as sqlrates
from ..sql import workflows as wfsql
from ..sql.dialect import Dialect
from ..sql.operator import filters
from ..sql.plans import STREAK
from ..sql.schedule import repair_key_order
from ..sql.store import SqlStore
from ..sqlstates import UNFINISHED_IN, WAITING_IN
from .claim import Claims, queue_order
from .connection import SQLiteFile, insert_rows
from .schema import SCHEMA_VERSION, SchemaTooNewError

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "SchemaTooNewError"]

# The insert of each of the rows' shapes (rows.py: plain, grouped, keyed, rated, full), with where
# a row of that shape holds its state.
_INSERTS = tuple(((f"INSERT INTO jobs ({', '.join(cols)}) VALUES ", len(cols)), cols.index("state"))
                 for cols in dbrows.SHAPES)
_RARE = frozenset({State.RUNNING, State.DEAD, State.WAITING_NETWORK, State.CANCELLED})  # own indexes


def _begin_pause(c: sqlite3.Connection, t: pz.Target, at: float, failures: int, err: str | None) -> bool:
    c.execute("INSERT INTO pauses (kind, name, paused_at, failures, last_error) VALUES (?, ?, ?, ?, ?)",
              (*t, at, failures, err))
    return True  # the one writer: no other could have begun it meanwhile


def _put_streaks(c: sqlite3.Connection, rows: list[tuple]) -> None:
    c.executemany("INSERT INTO streaks VALUES (?, ?, ?, ?) ON CONFLICT (kind, name) DO UPDATE"
                  " SET failures = excluded.failures, last_error = excluded.last_error", rows)


DIALECT = Dialect(
    mark="?",
    release="",  # a running job's row holds nothing else
    # Due first, then in the order accepted (a key's events: see outbox.KeyOrder): by rowid,
    # not created_at, which a clock stepped back would turn round.
    due_events=("SELECT event_id, job, attempts, key FROM events INDEXED BY events_pending"
                " WHERE state = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at, rowid LIMIT ?"),
    event_order="rowid",
    wf_lock="",  # the one writing connection holds the file: no row lock to take
    wf_budget="json_extract(meta, '$.reason.budget')",
    wf_waiting=f"SELECT coalesce(sum(n), 0) FROM state_counts WHERE state IN {WAITING_IN}",
    replayed="",
    unavailable=SQLiteFile.UNAVAILABLE,
    begin_pause=_begin_pause,
    put_streaks=_put_streaks,
)


class SQLiteStore(SQLiteFile, SqlStore):
    dialect = DIALECT

    def __init__(self, path: str, durability: str = "full", busy_timeout: float = 30.0) -> None:
        self._claims = Claims()
        super().__init__(path, durability, busy_timeout)

    def _wf_submit(self, c: sqlite3.Connection, jobs: list[NewJob], now: float) -> None:
        self._submit_in(c, [jobs], now, adm.NO_LIMITS)

    # --- submit ---------------------------------------------------------------------------
    def submit_requests(
        self, requests: Sequence[Sequence[NewJob]], now: float, admission: adm.Admission = adm.NO_LIMITS
    ) -> list[list[Submitted] | adm.Refusal]:
        with self._write() as c:
            return self._submit_in(c, requests, now, admission)

    def _lookups(self, c: sqlite3.Connection, requests: Sequence[Sequence[NewJob]]) -> adm.Lookups:
        # Every idempotency key of the requests (admission.plan asks for no other) is looked
        # up at once: a client gives each enqueue one, and this is a statement per commit.
        known = _jobs_by_key(c, {j.idempotency_key for r in requests for j in r if j.idempotency_key is not None})

        def active(key: str) -> int | None:
            row = c.execute(
                f"SELECT id FROM jobs INDEXED BY jobs_key WHERE key = ? AND state IN {UNFINISHED_IN}"
                " ORDER BY id LIMIT 1", (key,)
            ).fetchone()
            return row[0] if row else None

        return adm.Lookups(
            by_idempotency_key=known.get,
            waiting_for_key=lambda key: c.execute(
                f"SELECT count(*) FROM jobs INDEXED BY jobs_key WHERE key = ? AND state IN {WAITING_IN}",
                (key,)).fetchone()[0],
            waiting_total=lambda: c.execute(
                f"SELECT coalesce(sum(n), 0) FROM state_counts WHERE state IN {WAITING_IN}").fetchone()[0],
            active_for_key=active,
        )

    def _submit_in(self, c: sqlite3.Connection, requests: Sequence[Sequence[NewJob]], now: float,
                   admission: adm.Admission) -> list[list[Submitted] | adm.Refusal]:
        p = adm.plan(requests, now, admission, self._lookups(c, requests))
        if p.expired_keys:  # an idempotency key past its TTL may name a new job
            c.executemany("UPDATE jobs SET idempotency_key = NULL WHERE idempotency_key = ?",
                          [(k,) for k in p.expired_keys])
        row = c.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        first = (row[0] if row else 0) + 1
        ids = list(range(first, first + len(p.inserts)))
        counts: collections.Counter[str] = collections.Counter()
        for (insert, state_at), rows in zip(_INSERTS, dbrows.split_inserts(ids, p.inserts, now), strict=True):
            if rows:  # a lone job fills one of the shapes
                insert_rows(c, insert, rows)
                counts.update(row[state_at] for row in rows)
        for state, n in counts.items():
            c.execute("INSERT INTO state_counts VALUES (?, ?) ON CONFLICT (state) DO UPDATE SET n = n + excluded.n",
                      (state, n))
        manual = {(k, n) for _, _, j in p.inserts if j.manual for k, n in (("key", j.key), ("func", j.func))
                  if n is not None}
        for kind, name in manual:  # an operator's run lifts a pause
            operator.resume(DIALECT, c, kind, name)
        return adm.finish(p, requests, ids, now)

    # --- claim ----------------------------------------------------------------------------
    def claim_available(self, request: claim.Request) -> list[Job]:
        if request.pools is not None and not request.pools:
            return []
        with self._write(bookkeeping=True) as c:
            return self._claims.claim(c, request)

    def _claim_in(self, c: sqlite3.Connection, request: claim.Request) -> list[Job]:
        return self._claims.claim(c, request)

    # --- schedule -------------------------------------------------------------------------
    def promote_due(self, now: float) -> int:
        with self._write(bookkeeping=True) as c:
            return c.execute(
                "UPDATE jobs INDEXED BY jobs_scheduled SET state = 'queued'"
                " WHERE state = 'scheduled' AND run_at <= ?", (now,)
            ).rowcount

    def next_scheduled_at(self) -> float | None:
        row = self._conn().execute(
            "SELECT min(run_at) FROM jobs INDEXED BY jobs_scheduled WHERE state = 'scheduled'").fetchone()
        return row[0]

    # --- network --------------------------------------------------------------------------
    def park_for_network(self, now: float) -> int:
        with self._write() as c:
            return c.execute(
                "UPDATE jobs SET state = 'waiting_network' WHERE id IN"
                f" ({queue_order('id', ' AND retry_on_network = 1')})"
            ).rowcount

    def release_network_waiting(self, now: float) -> int:
        with self._write() as c:
            return c.execute(
                "UPDATE jobs INDEXED BY jobs_waiting_network SET state = 'queued', run_at = ?"
                " WHERE state = 'waiting_network'", (now,)
            ).rowcount

    # --- finish ---------------------------------------------------------------------------
    def finish_if_running(self, outcomes: Sequence[Outcome], now: float, pause_after: int | None = None,
                          pause_cooldown: float | None = None) -> Finished:
        with self._write(bookkeeping=True) as c:
            return self._finish_in(c, outcomes, now, pause_after, pause_cooldown)

    def _finish_in(self, c: sqlite3.Connection, outcomes: Sequence[Outcome], now: float, pause_after: int | None,
                   pause_cooldown: float | None) -> Finished:
        changed = 0
        finished: list[pz.Finish] = []
        steps: list[tuple] = []  # finished jobs of workflow steps: their runs advance
        # Usually nothing is failing: then a success has no streak to reset, nor a probe
        # whose success would lift its pause (one statement for both).
        any_streak, probing = c.execute(
            "SELECT EXISTS (SELECT 1 FROM streaks), EXISTS (SELECT 1 FROM pauses WHERE probe_job IS NOT NULL)"
        ).fetchone()
        if not any_streak and not probing and all(o.state == State.SUCCEEDED and o.workflow_run is None
                                                  for o in outcomes):  # the steady state: no RETURNING
            cur = c.executemany(
                "UPDATE jobs SET state = 'succeeded', result = ?, error = NULL, output = ?, finished_at = ?"
                " WHERE id = ? AND state = 'running'",
                [(None if o.result is None else dbrows.dumps(o.result), o.output, now, o.job_id)
                 for o in outcomes])
            return Finished(cur.rowcount, [])
        for o in outcomes:
            row = c.execute(
                "UPDATE jobs SET state = ?1, run_at = coalesce(?2, run_at), result = ?3, error = ?4,"
                " finished_at = ?5, attempts = attempts - (?1 IN ('waiting_network', 'queued')), output = ?7"
                " WHERE id = ?6 AND state = 'running' RETURNING key, func, workflow_step, workflow_item,"
                " workflow_loop, rate_limit",
                (o.state, o.run_at, None if o.result is None else dbrows.dumps(o.result),
                 dbrows.dumps(o.error) if o.error else None, now if o.state in State.FINAL else None,
                 o.job_id, o.output),
            ).fetchone()
            if row is None:
                continue
            changed += 1
            if o.rate_until is not None:  # told to wait: its key starts nothing before then
                sqlrates.tighten(c, [(row[5], o.rate_until)])
            if not o.blameless:  # the host failed it: counts for nothing
                finished.append(pz.Finish(o.state, o.error, row[0], row[1], o.job_id))
            if o.workflow_run is not None and o.state in (State.SUCCEEDED, State.DEAD):
                steps.append((o.job_id, o.workflow_run, *row[2:5], o.state == State.SUCCEEDED, o.result,
                              o.error))
        if steps:  # in the same transaction as the finish: one commits with the other
            wfsql.advance_in(DIALECT, c, self._steps(), steps, now)
        if not finished:
            return Finished(changed, [])

        def streak(t: pz.Target) -> tuple[int, bool]:
            if not any_streak:  # no streak anywhere before this finish: only the pause to read
                return 0, c.execute("SELECT 1 FROM pauses WHERE kind = ? AND name = ?", t).fetchone() is not None
            n, paused = c.execute(STREAK, (*t, *t)).fetchone()
            return n, bool(paused)

        p = pz.plan(finished, now, pause_after, pz.Lookups(streak, lambda t: plans.pause_of(DIALECT, c, t)),
                    pause_cooldown)
        return Finished(changed, plans.write_pauses(DIALECT, c, p), p.next_probe)

    def recover_orphans(self, max_requeues: int, now: float, running_here: Collection[int] = ()) -> Recovered:
        with self._write() as c:
            p = orphans.plan(c.execute("SELECT id, orphaned FROM jobs INDEXED BY jobs_running"
                                       " WHERE state = 'running'").fetchall(), max_requeues, running_here)
            plans.write_orphans(DIALECT, c, self._steps(), p, now)
        return Recovered(p.requeue, p.dead)

    # --- operator actions -----------------------------------------------------------------
    def retry_all_dead(self, now: float) -> int:
        with self._write() as c:
            n = c.execute(
                "UPDATE jobs INDEXED BY jobs_dead SET state = 'queued', run_at = ?, attempts = 0,"
                " orphaned = 0, finished_at = NULL WHERE state = 'dead'", (now,)).rowcount
            n += (events := c.execute(
                "UPDATE events SET state = 'pending', attempts = 0, next_attempt_at = ?"
                " WHERE state = 'dead'", (now,)).rowcount)
            if events:
                repair_key_order(DIALECT, c)
        return n

    def purge(self, states: Sequence[str], finished_before: float, limit: int) -> int:
        marks = ",".join("?" * len(states))
        with self._write() as c:
            n = c.execute(
                f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_finished"
                f" WHERE finished_at IS NOT NULL AND finished_at < ? AND state IN ({marks})"
                f" ORDER BY finished_at LIMIT ?)",
                (finished_before, *states, limit)).rowcount
            if State.DEAD in states:
                n += c.execute("DELETE FROM events WHERE state = 'dead' AND created_at < ?",
                               (finished_before,)).rowcount
        return n

    # --- inspect --------------------------------------------------------------------------
    def list_jobs(self, state: str | None, limit: int, *, func: str | None = None, key: str | None = None,
                  pool: str | None = None) -> list[Job]:
        if state is not None and state not in State.ALL:
            raise ValueError(f"unknown state {state!r}")
        extra, params = filters(func, key, pool)
        # The state is inlined (one of the fixed names): a partial index is usable only when
        # SQLite sees the literal its predicate names. Unfiltered, a rare state is read through
        # its index, a common one walking back from the newest job (no sort either way).
        hint = "" if extra or state is None else f"INDEXED BY jobs_{state}" if state in _RARE else "NOT INDEXED"
        where = "1" if state is None else f"state = '{state}'"
        sql = f"SELECT {dbrows.JOB_COLS} FROM jobs {hint} WHERE {where}{extra} ORDER BY id DESC LIMIT ?"
        return [dbrows.row_to_job(r) for r in self._conn().execute(sql, (*params, limit))]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(State.ALL, 0)
        out.update(self._conn().execute("SELECT state, n FROM state_counts").fetchall())
        return out

    def waiting_by_key(self, limit: int) -> list[tuple[str, int, float]]:
        rows = self._conn().execute(
            "SELECT key, count(*), min(run_at) FROM jobs INDEXED BY jobs_key WHERE key IS NOT NULL"
            f" AND state IN {WAITING_IN} GROUP BY key"
            " ORDER BY count(*) DESC, key LIMIT ?", (limit,))
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def set_pool(self, kind: str, name: str, pool: str) -> int:
        with self._write() as c:
            return set_pool_sql(c.execute, kind, name, pool, DIALECT.mark)

    def waiting_by_pool(self) -> dict[str, int]:
        return dict(self._conn().execute(
            f"SELECT pool, count(*) FROM jobs WHERE state IN {WAITING_IN} GROUP BY pool").fetchall())

    # --- cron -----------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        with self._write() as c:
            c.execute(
                "INSERT OR REPLACE INTO crons VALUES (?,?,?,?,?,?,?)",
                (cron.name, dbrows.dumps(cron.schedule), dbrows.template_to_json(cron.template),
                 cron.next_run_at, cron.last_fired_at, cron.created_at, cron.folded),
            )
        return cron

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> CronFire | None:
        with self._write() as c:
            row = c.execute(
                "SELECT template FROM crons WHERE name = ? AND next_run_at = ?", (name, tick)
            ).fetchone()
            if row is None:
                return None
            waiting = c.execute(
                f"SELECT id FROM jobs INDEXED BY jobs_cron WHERE cron = ? AND state IN {WAITING_IN} LIMIT 1",
                (name,)).fetchone()
            return self._fire_in(c, name, row[0], tick, next_tick, now, None if waiting is None else waiting[0])

    # --- events ---------------------------------------------------------------------------
    def next_event_at(self) -> float | None:
        return self._conn().execute(
            "SELECT min(next_attempt_at) FROM events INDEXED BY events_pending WHERE state = 'pending'"
        ).fetchone()[0]

    def oldest_queued_at(self) -> float | None:
        """For monitoring: the earliest run_at among `queued` jobs."""
        return self._conn().execute(f"SELECT min(run_at) FROM ({queue_order('run_at')})").fetchone()[0]

    def oldest_pending_event_at(self) -> float | None:
        """For monitoring: when the oldest pending outbox event was created."""
        return self._conn().execute(
            "SELECT min(created_at) FROM events INDEXED BY events_pending WHERE state = 'pending'"
        ).fetchone()[0]


_KEYS_MAX = 256  # idempotency keys per lookup statement; statements of 2**k keys, so few distinct ones


def _jobs_by_key(c: sqlite3.Connection, keys: set[str]) -> dict[str, adm.Existing]:
    """The jobs holding these idempotency keys, by key (a key no job holds is absent)."""
    found: dict[str, adm.Existing] = {}
    todo = list(keys)
    while todo:
        size = min(_KEYS_MAX, 1 << (len(todo) - 1).bit_length())  # the next power of two
        chunk, todo = todo[:size], todo[size:]
        chunk += chunk[:1] * (size - len(chunk))  # padded with a repeat: the same SQL text
        for k, job_id, state, created_at in c.execute(_by_keys_sql(size), chunk):
            found[k] = adm.Existing(job_id, state, created_at)
    return found


@functools.cache
def _by_keys_sql(n: int) -> str:
    return ("SELECT idempotency_key, id, state, created_at FROM jobs INDEXED BY jobs_idempotency"
            f" WHERE idempotency_key IN ({','.join('?' * n)})")
