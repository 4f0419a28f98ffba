"""PostgreSQL store (`postgresql://user@host/db`): one queue shared by many hosts.

Needs the `postgres` extra (psycopg 3). Three connections per process, however many
threads it has (connection.py); a call is one transaction, or runs in the one whose handle
(transaction()) it was made through.

What the database guarantees, not luck:
- claims take their rows FOR UPDATE SKIP LOCKED (the function queickd_claim), so
  concurrent workers never take the same job;
- one running job per serial key is a partial unique index; a claim that loses that race
  is undone and tried again;
- idempotency keys, event ids and (cron, tick) rows are unique indexes;
- a submit whose admission reads (caps, duplicates, conflicts) takes one advisory lock
  before its first read, so it decides on what every other daemon has committed; one that
  reads nothing is a single statement (submit.py).
Wake-ups are NOTIFYs, sent at commit (channels.py): `q:POOL` when jobs become claimable,
`fk:ID,ID,...` when finished jobs free a key, a group's slot or a budgeted pool's units,
`s:RUN_AT` when a failed job is scheduled for a retry (for the daemons' timers), `r` when
jobs are released (re-queued, resumed, retried), and `f:ID,ID,...` for other finishes that
a client waits on (watch_finish) or that are workflow steps.

Liveness is by record: workers (daemons included) register in `workers` and beat from a
thread of their own; a running job is an orphan only when its worker has missed three
beats (database clock), so a long job is never rescued while its worker lives.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

try:
    import psycopg
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ValueError("the PostgreSQL store needs psycopg 3: pip install 'queickd[postgres]'") from e

from ...core.job import Job, NewJob, Outcome, State, Submitted
from ...core.policy import admission as adm
from ...core.policy import claim
from ...core.policy.resources import BudgetChange
from .. import rows as dbrows
from ..pools import set_pool_sql
from ..records import Beat, CronFire, CronRecord, FairKey, Finished, Recovered
from ..sql import fair as sqlfair
from ..sql import rates as sqlrates
from ..sql.operator import filters
from ..sql.schedule import repair_key_order
from ..sql.store import SqlStore
from ..sqlstates import WAITING_ANY, WAITING_IN
from . import claim as pgclaim
from . import finish, fleet
from .channels import QUEUED_CHANNEL
from .claim_sql import CLAIM_LOCK
from .connection import PgConnections
from .dialect import DIALECT
from .fleet import notify
from .namespace import split_url
from .submit import DRAW_ONE, Submitter

# counts(), exact, in one statement: each state a job moves through counted along its own
# partial index, the states a job rests in along jobs_settled, which holds them all (a shared
# counter row would make every claim and finish of every worker wait for its lock).
_MOVING = (State.SCHEDULED, State.QUEUED, State.RUNNING, State.HELD, State.FORWARDED)
_COUNTS = ("".join(f"SELECT '{s}', count(*) FROM jobs WHERE state = '{s}' UNION ALL " for s in _MOVING)
           + "SELECT state, count(*) FROM jobs WHERE state IN ("
           + ", ".join(f"'{s}'" for s in State.ALL if s not in _MOVING) + ") GROUP BY state")


def _redact(url: str) -> str:
    """The URL with any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class PostgresStore(PgConnections, SqlStore):
    dialect = DIALECT
    UNAVAILABLE = DIALECT.unavailable

    def __init__(self, url: str, migrate: bool = True) -> None:
        dsn, self.schema = split_url(url)  # the conninfo names the queue's schema
        super().__init__(dsn)
        self.url = _redact(url)  # what logs and stats show: never a password
        self._submitter = Submitter(DIALECT)
        self._submit_in = self._submitter.submit_in
        self._wf_submit = self._submitter.unadmitted  # no admission: submit.py says why
        self._passes = pgclaim.Passes()
        self.worker_id: int | None = None  # set by register_worker; claims are recorded with it
        if migrate:
            try:
                self.migrate()
            except psycopg.Error as e:
                self.close()
                raise OSError(f"PostgreSQL store {self.url}: {e}".strip()) from e

    def take_ownership(self) -> None:
        pass  # many daemons share one database; running jobs are guarded by heartbeats

    # --- the fleet (contract.fleet.FleetStore) -------------------------------------------------
    def migrate(self) -> int:
        with self._write() as c:
            return fleet.migrate(c, self.schema)

    def versions(self) -> tuple[str | None, int]:
        try:
            return fleet.versions(self._conn())
        except psycopg.OperationalError as e:
            raise OSError(f"PostgreSQL store {self.url}: {e}".strip()) from e

    def check_version(self) -> None:
        fleet.check_version(*self.versions())

    def direct_counts(self) -> dict[str, int]:
        return dict(self._conn().execute(
            "SELECT state, count(*) FROM jobs WHERE origin IS NOT NULL GROUP BY state").fetchall())

    def publish_admission(self, limits: adm.Admission) -> None:
        with self._write() as c:
            fleet.publish_admission(c, limits)

    def register_worker(self, kind: str, pools: Sequence[str], slots: int, heartbeat: float,
                        refused: str | None = None) -> int:
        with self._write() as c:
            worker_id = fleet.register(c, kind, pools, slots, heartbeat, refused)
        if refused is None:
            self.worker_id = worker_id  # its claims carry the id from now on
            self.set_session_limits(heartbeat, fleet.MISSED_BEATS * heartbeat)
        return worker_id

    def beat(self, max_orphan_requeues: int | None = None, now: float | None = None) -> Beat:
        def sweep(c: psycopg.Connection) -> Recovered:
            return finish.recover_orphans_in(c, self._steps(), max_orphan_requeues,  # type: ignore[arg-type]
                                             time.time() if now is None else now)

        # On the bookkeeping connection, whose transactions are the pool's short passes: a
        # long statement on the shared one (a huge submit) must not silence the beats.
        with self._write(bookkeeping=True) as c:
            return fleet.beat(c, self.worker_id, None if max_orphan_requeues is None else sweep)

    def deregister_worker(self) -> int:
        if self.worker_id is None:
            return 0
        with self._write() as c:
            held = fleet.deregister(c, self.worker_id)
        self.worker_id = None
        return held

    def forget_gone_workers(self, older_than: float) -> int:
        with self._write() as c:
            return fleet.forget_gone_workers(c, older_than)

    def workers(self) -> list[dict[str, Any]]:
        return fleet.workers(self._conn())

    def running_without_worker(self) -> int:
        return fleet.running_without_worker(self._conn())

    # --- submit ---------------------------------------------------------------------------
    def submit_requests(
        self, requests: Sequence[Sequence[NewJob]], now: float, admission: adm.Admission = adm.NO_LIMITS
    ) -> list[list[Submitted] | adm.Refusal]:
        with self._lease() as c:  # the process's shared connection, this thread's until the commit
            return self._submitter.alone(c, requests, now, admission)

    def promote_due(self, now: float) -> int:
        with self._write() as c:
            pools = [r[0] for r in c.execute(
                "UPDATE jobs SET state = 'queued' WHERE state = 'scheduled' AND run_at <= %s RETURNING pool",
                (now,))]
            for pool in sorted(set(pools)):
                notify(c, "q:" + pool, QUEUED_CHANNEL)
        return len(pools)

    def next_scheduled_at(self) -> float | None:
        return self._conn().execute("SELECT min(run_at) FROM jobs WHERE state = 'scheduled'").fetchone()[0]

    # --- claim ----------------------------------------------------------------------------
    def finish_and_claim(self, outcomes: Sequence[Outcome], now: float, limit: int, network_up: bool = True,
                         pools: Sequence[str] | None = None) -> list[Job] | None:
        if not self._passes.may_pass(outcomes):
            return None
        with self._bk_lock:
            rows = self._passes.pass_in(self._bookkeeping_conn(), self.worker_id, outcomes, now, limit,
                                        network_up, pools)
        if rows is None:
            return None
        try:
            return pgclaim.jobs_of(rows)
        except Exception:
            # Claimed and committed but not to be run here: given back (attempt not spent), or
            # they would stay `running` under a worker that beats on without them.
            with contextlib.suppress(Exception):  # the error to report is the first one
                self.release_unstarted([r[0] for r in rows])
            raise

    def claim_available(self, request: claim.Request) -> list[Job]:
        if request.limit <= 0:
            return []
        params = self._claim_params(request)
        for attempt in range(pgclaim.CLAIM_RETRIES):
            try:
                with self._write() as c:
                    rows = pgclaim.claim_in(c, params, request.limits)
                break
            except psycopg.errors.UniqueViolation:
                # Another worker claimed a job of the same key, or the same slot of a group,
                # meanwhile and committed; the next try sees it running.
                if attempt == pgclaim.CLAIM_RETRIES - 1:
                    raise
        return pgclaim.jobs_of(rows)

    def _claim_in(self, c: psycopg.Connection, request: claim.Request) -> list[Job]:
        """A transaction's claim, with no retry and no savepoint (round trips on every pass):
        a lost key or slot race fails the transaction; the pool applies its outcomes alone
        and claims again."""
        if request.limit <= 0:
            return []
        return pgclaim.jobs_of(pgclaim.claim_in(c, self._claim_params(request), request.limits))

    def _claim_params(self, request: claim.Request) -> dict[str, Any]:
        pools = request.pools
        return {"now": request.now, "worker": self.worker_id, "pools": list(pools) if pools is not None else None,
                "net": request.network_up, "limit": request.limit, "exclude": request.exclude}

    def adopt_budgets(self, limits: claim.Limits) -> list[BudgetChange]:
        with self._write() as c:
            return pgclaim.adopt_budgets(c, limits)

    def budgets_in_force(self, limits: claim.Limits) -> claim.Limits:
        return pgclaim.budgets_in(self._conn(), limits)

    def wake_claimers(self) -> None:
        with self._write() as c:
            DIALECT.released(c)

    def prune_rate_keys(self, now: float) -> int:
        # Under the claim lock: a claim reading keys' starts exactly deletes and updates the
        # rows the prune does, in its own order (a deadlock otherwise).
        with self._write() as c:
            c.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
            return sqlrates.prune(self.dialect, c, now)

    def park_for_network(self, now: float) -> int:
        with self._write() as c:
            return c.execute("UPDATE jobs SET state = 'waiting_network'"
                             " WHERE state = 'queued' AND retry_on_network").rowcount

    def release_network_waiting(self, now: float) -> int:
        with self._write() as c:
            n = c.execute("UPDATE jobs SET state = 'queued', run_at = %s WHERE state = 'waiting_network'",
                          (now,)).rowcount
            if n:
                DIALECT.released(c)
        return n

    # --- finish ---------------------------------------------------------------------------
    def finish_if_running(self, outcomes: Sequence[Outcome], now: float, pause_after: int | None = None,
                          pause_cooldown: float | None = None) -> Finished:
        if not outcomes:
            return Finished(0, [])
        with self._write() as c:
            return self._finish_in(c, outcomes, now, pause_after, pause_cooldown)

    def _finish_in(self, c: psycopg.Connection, outcomes: Sequence[Outcome], now: float, pause_after: int | None,
                   pause_cooldown: float | None) -> Finished:
        return finish.finish_in(c, self._steps(), self.worker_id, outcomes, now, pause_after, pause_cooldown)

    def recover_orphans(self, max_requeues: int, now: float, running_here: Collection[int] = ()) -> Recovered:
        with self._write() as c:
            return finish.recover_orphans_in(c, self._steps(), max_requeues, now, running_here)

    def fair_keys(self, limit: int = 50) -> list[FairKey]:
        with self._write() as c:  # the counts not yet folded into fair_keys folded first
            pgclaim.fold_fair(c)
            return sqlfair.keys(self.dialect, c, limit)

    def waiting_by_pool(self) -> dict[str, int]:
        return dict(self._conn().execute(f"SELECT pool, count(*) FROM jobs WHERE {WAITING_ANY}"
                                         " GROUP BY pool").fetchall())

    def set_pool(self, kind: str, name: str, pool: str) -> int:
        with self._write() as c:
            n = set_pool_sql(c.execute, kind, name, pool, DIALECT.mark)
            if n:
                notify(c, "q:" + pool, QUEUED_CHANNEL)
        return n

    # --- operator actions -----------------------------------------------------------------
    def release_unheld(self, held: Collection[int], now: float) -> int:
        if self.worker_id is None:
            return 0  # its claims carry no id: ours cannot be told from others'
        self._end_lost_backends()  # what a lost pass did is final from here on
        with self._write() as c:
            # Back to wait, their attempt given back. One statement: a job swept as an orphan
            # meanwhile and claimed by another worker is no longer under our id.
            n = c.execute("UPDATE jobs SET state = 'scheduled', run_at = %s, attempts = attempts - 1,"
                          f" started_at = NULL{DIALECT.release} WHERE state = 'running' AND worker_id = %s"
                          " AND id <> ALL(%s)", (now, self.worker_id, list(held))).rowcount
            if n:  # the daemons' timers must know when to move them back to queued
                notify(c, f"s:{now!r}")
        return n

    def watch_finish(self, job_id: int) -> None:
        # Marks the row its finish updates: whichever of the two commits second sees the
        # other (pass_sql.py). A job still queued is announced again: a claim skipped it
        # while the mark held its row's lock.
        for attempt in (1, 2):
            try:
                with self._write() as c:
                    row = c.execute("UPDATE jobs SET waited = true WHERE id = %s AND NOT waited"
                                    " AND state <> ALL(%s) RETURNING state, pool",
                                    (job_id, list(State.FINAL))).fetchone()
                    if row is not None and row[0] == State.QUEUED:
                        notify(c, f"q:{row[1]}", QUEUED_CHANNEL)
                return
            except psycopg.OperationalError:
                # A connection found lost (a server restart): the mark is made again on a
                # new one rather than failing the client's wait.
                if attempt == 2 or not self._shared_lost():
                    raise

    def retry_all_dead(self, now: float) -> int:
        with self._write() as c:
            n = c.execute("WITH r AS (UPDATE jobs SET state = 'queued', run_at = %s, attempts = 0, orphaned = 0,"
                          f" finished_at = NULL WHERE state = 'dead' RETURNING 1) SELECT count({DRAW_ONE}) FROM r",
                          (now,)).fetchone()[0]  # a value drawn for each, as retry_dead says
            DIALECT.lock_outbox(c)
            n += (events := c.execute("UPDATE events SET state = 'pending', attempts = 0, next_attempt_at = %s"
                                      " WHERE state = 'dead'", (now,)).rowcount)
            if events:
                repair_key_order(DIALECT, c)
            if n:
                notify(c, "r")
        return n

    def purge(self, states: Sequence[str], finished_before: float, limit: int) -> int:
        with self._write() as c:
            n = c.execute(
                "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE finished_at < %s"
                " AND state = ANY(%s) ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED)",
                (finished_before, list(states), limit)).rowcount
            if State.DEAD in states:
                n += c.execute("DELETE FROM events WHERE state = 'dead' AND created_at < %s",
                               (finished_before,)).rowcount
            # Fired-tick rows only guard against a second firing of a recent tick.
            c.execute("DELETE FROM cron_ticks WHERE fired_at < %s", (finished_before,))
        return n

    # --- inspect --------------------------------------------------------------------------
    def list_jobs(self, state: str | None, limit: int, *, func: str | None = None, key: str | None = None,
                  pool: str | None = None) -> list[Job]:
        extra, params = filters(func, key, pool)
        if state is not None and state not in State.ALL:
            raise ValueError(f"unknown state {state!r}")
        where, params = ("true", params) if state is None else ("state = %s", (state, *params))
        rows = self._conn().execute(f"SELECT {dbrows.JOB_COLS} FROM jobs WHERE {where}{DIALECT.q(extra)}"
                                    " ORDER BY id DESC LIMIT %s", (*params, limit))
        return [dbrows.row_to_job(r) for r in rows]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(State.ALL, 0)
        out.update(self._conn().execute(_COUNTS).fetchall())
        return out

    def waiting_by_key(self, limit: int) -> list[tuple[str, int, float]]:
        rows = self._conn().execute(
            f"SELECT key, count(*), min(run_at) FROM jobs WHERE key IS NOT NULL AND state IN {WAITING_IN}"
            " GROUP BY key ORDER BY count(*) DESC, key LIMIT %s", (limit,))
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def oldest_queued_at(self) -> float | None:
        """Hops along jobs_queued (priority, run_at) from one priority's first entry to the
        next: a few index probes, not a read of every queued row as min() would be."""
        return self._conn().execute(
            "WITH RECURSIVE heads AS ("
            " (SELECT priority, run_at FROM jobs WHERE state = 'queued' ORDER BY priority, run_at, id LIMIT 1)"
            " UNION ALL SELECT n.priority, n.run_at FROM heads h, LATERAL (SELECT priority, run_at FROM jobs"
            "  WHERE state = 'queued' AND priority > h.priority ORDER BY priority, run_at, id LIMIT 1) n)"
            " SELECT min(run_at) FROM heads").fetchone()[0]

    # --- cron -----------------------------------------------------------------------------
    def cron_save(self, cron: CronRecord) -> CronRecord:
        with self._write() as c:
            c.execute(
                "INSERT INTO crons VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (name) DO UPDATE SET"
                " schedule = excluded.schedule, template = excluded.template, next_run_at = excluded.next_run_at,"
                " last_fired_at = excluded.last_fired_at, created_at = excluded.created_at, folded = excluded.folded",
                (cron.name, dbrows.dumps(cron.schedule), dbrows.template_to_json(cron.template), cron.next_run_at,
                 cron.last_fired_at, cron.created_at, cron.folded))
        return cron

    def cron_fire_if_due(self, name: str, tick: float, next_tick: float, now: float) -> CronFire | None:
        with self._write() as c:
            # The row lock makes a second daemon wait here, then find next_run_at moved on;
            # the (cron, tick) row makes a second firing of the same tick impossible anyway.
            row = c.execute("SELECT template FROM crons WHERE name = %s AND next_run_at = %s FOR UPDATE",
                            (name, tick)).fetchone()
            if row is None:
                return None
            if c.execute("INSERT INTO cron_ticks VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                         (name, tick, now)).rowcount == 0:
                # Fired before (the cron was saved back onto an old tick): move on, or the
                # scheduler would find it due again at once, forever.
                c.execute("UPDATE crons SET next_run_at = %s WHERE name = %s", (next_tick, name))
                return None
            waiting = c.execute(
                f"SELECT id FROM jobs WHERE cron = %s AND state IN {WAITING_IN} LIMIT 1", (name,)).fetchone()
            return self._fire_in(c, name, row[0], tick, next_tick, now, None if waiting is None else waiting[0])

    # --- events ---------------------------------------------------------------------------
    def next_event_at(self) -> float | None:
        return self._conn().execute("SELECT min(next_attempt_at) FROM events WHERE state = 'pending'").fetchone()[0]

    def oldest_pending_event_at(self) -> float | None:
        """A walk of the partial index events_pending (pending rows only)."""
        return self._conn().execute("SELECT min(created_at) FROM events WHERE state = 'pending'").fetchone()[0]
