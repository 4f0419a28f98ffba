"""The store contract on PostgreSQL, and what only PostgreSQL does (skips without a server)."""

import contextlib
import threading
import time
from functools import partial

import pytest
from contract_jobs import trip_bad
from helpers import run_together
from store_contract import T0, StoreContract, job

from queickd.core.job import Outcome, State
from queickd.core.policy.claim import Request


class TestPostgresStore(StoreContract):
    PROBES_AFTER_THE_REST = True

    @pytest.fixture
    def store(self, pg_store):
        return pg_store


def test_migrate_is_idempotent_and_records_both_versions(pg_store):
    from queickd import __version__
    from queickd.store.postgres.schema import SCHEMA_VERSION

    (s,) = pg_store.submit([job()], T0)
    assert pg_store.migrate() == pg_store.migrate() == SCHEMA_VERSION
    assert pg_store.versions() == (__version__, SCHEMA_VERSION)
    assert pg_store.get(s.job_id) is not None


def test_a_database_migrated_by_a_newer_queickd_is_refused(pg_url, pg_store):
    from queickd.store.postgres.schema import VersionMismatchError
    from queickd.store.postgres.store import PostgresStore

    pg_store._conn().execute("UPDATE queickd_meta SET value = '99.0' WHERE key = 'queickd_version'")
    with pytest.raises(VersionMismatchError, match="99.0"):
        PostgresStore(pg_url)
    with pytest.raises(VersionMismatchError):
        pg_store.check_version()


def test_the_database_itself_refuses_a_second_running_job_for_a_key(pg_store):
    import psycopg

    a, b = pg_store.submit([job(key="k"), job(key="k")], T0)
    pg_store.claim_available(Request.of(1, now=T0))
    with pytest.raises(psycopg.errors.UniqueViolation):
        pg_store._conn().execute("UPDATE jobs SET state = 'running' WHERE id = %s", (b.job_id,))


def test_concurrent_claimers_run_each_job_once_and_one_job_per_key_at_a_time(pg_url, pg_store):
    from queickd.store.postgres.store import PostgresStore

    pg_store.submit([job(key=f"k{i % 4}", args=[i]) for i in range(60)] + [job() for _ in range(40)], T0)
    claimed: list[int] = []
    overlap: list[str] = []
    running: set[str] = set()
    lock = threading.Lock()

    def claimer():
        s = PostgresStore(pg_url, migrate=False)
        try:
            while True:
                jobs = s.claim_available(Request.of(3, now=T0))
                if not jobs and not s.counts()[State.QUEUED]:
                    return
                with lock:
                    for j in jobs:
                        if j.key is not None and j.key in running:
                            overlap.append(j.key)
                        running.add(j.key)
                    claimed.extend(j.id for j in jobs)
                with lock:
                    running.difference_update(j.key for j in jobs)
                s.finish_if_running([Outcome.succeeded(j.id, None) for j in jobs], T0)
        finally:
            s.close()

    run_together(*[claimer] * 4)
    assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == 100
    assert overlap == []
    assert pg_store.counts()[State.SUCCEEDED] == 100


def test_failures_finished_at_once_on_several_connections_are_all_counted(pg_url, pg_store):
    from queickd.store.postgres.store import PostgresStore

    pg_store.submit([job() for _ in range(60)], T0)
    jobs = pg_store.claim_available(Request.of(60, now=T0))
    start = threading.Barrier(3)
    err = {"type": "E", "message": "no"}
    paused = []

    def finisher(mine):
        s = PostgresStore(pg_url, migrate=False)
        try:
            start.wait(10)
            for j in mine:
                paused.extend(s.finish_if_running([Outcome.dead(j.id, err)], T0, pause_after=45).paused)
        finally:
            s.close()

    run_together(*(partial(finisher, jobs[i::3]) for i in range(3)))
    assert pg_store.connect().execute("SELECT failures FROM streaks WHERE kind = 'func'").fetchone()[0] == 60
    assert [(p.name, p.failures) for p in paused] == [("m:f", 45)]
    assert [(p.name, p.failures) for p in pg_store.pauses()] == [("m:f", 60)]


def test_orphans_are_only_jobs_of_workers_that_stopped_beating(pg_url, pg_store):
    from queickd.store.postgres.store import PostgresStore

    other = PostgresStore(pg_url, migrate=False)
    other.register_worker("worker", ["default"], 1, heartbeat=0.2)
    pg_store.submit([job(), job()], T0)
    (mine,) = other.claim_available(Request.of(1, now=T0))
    (nobodys,) = pg_store.claim_available(Request.of(1, now=T0))  # claimed with no registered worker
    assert pg_store.recover_orphans(3, T0).requeued == [nobodys.id]
    assert pg_store.get(mine.id).state == State.RUNNING  # its worker is alive
    pg_store._conn().execute("UPDATE workers SET beat_at = beat_at - 1")  # 5 beats missed
    assert pg_store.recover_orphans(3, T0).requeued == [mine.id]
    assert other.finish_if_running([Outcome.succeeded(mine.id, None)], T0).changed == 0
    other.close()


def test_open_store_takes_postgresql_urls(pg_url):
    from queickd.store import open_store
    from queickd.store.contract.fleet import FleetStore
    from queickd.store.postgres.store import PostgresStore

    s = open_store(pg_url)
    assert isinstance(s, PostgresStore) and isinstance(s, FleetStore)  # a fleet's store: it LISTENs
    s.close()


def test_a_tick_fired_before_is_not_fired_again_and_the_cron_moves_on(pg_store):
    from queickd.store import CronRecord

    cron = CronRecord("c", {"every": 60.0, "start_at": T0}, job(), T0 + 60, None, T0)
    pg_store.cron_save(cron)
    assert pg_store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 60).outcome == "fired"
    pg_store.cron_save(cron)  # saved back onto the tick it already fired
    assert pg_store.cron_fire_if_due("c", T0 + 60, T0 + 120, T0 + 61) is None
    assert pg_store.next_cron_at() == T0 + 120
    assert len(pg_store.list_jobs(None, 10)) == 1


def test_a_new_record_for_the_same_host_and_pid_retires_the_old_one_and_its_jobs(pg_url, pg_store):
    from queickd.store.postgres.store import PostgresStore

    before = PostgresStore(pg_url, migrate=False)  # this pid's previous life, say
    old_id = before.register_worker("worker", ["default"], 1, heartbeat=60)
    pg_store.submit([job()], T0)
    (held,) = before.claim_available(Request.of(1, now=T0))
    assert pg_store.recover_orphans(3, T0).requeued == []  # its worker beats: not an orphan
    pg_store.register_worker("worker", ["default"], 1, heartbeat=60)
    assert [w["id"] for w in pg_store.workers()] == [pg_store.worker_id] != [old_id]
    assert pg_store.recover_orphans(3, T0).requeued == [held.id]
    before.close()


def test_the_hot_table_leaves_room_for_updates_and_is_vacuumed_early(pg_store):
    (options,) = pg_store._conn().execute(
        "SELECT reloptions FROM pg_class WHERE oid = 'jobs'::regclass").fetchone()
    assert {"fillfactor=70", "autovacuum_vacuum_scale_factor=0.02"} <= set(options)


def test_enqueues_and_finishes_are_announced_at_commit_with_their_pool_or_ids(pg_store):
    import psycopg

    listener = psycopg.connect(pg_store._dsn, autocommit=True)
    listener.execute("LISTEN queickd; LISTEN queickd_queued; LISTEN queickd_finished")
    plain, keyed = pg_store.submit([job(pool="gpu"), job(key="k")], T0)
    a, b = pg_store.claim_available(Request.of(2, now=T0))
    pg_store.watch_finish(plain.job_id)  # a client waits on it
    pg_store.finish_if_running([Outcome.succeeded(a.id, None)], T0)
    pg_store.finish_if_running([Outcome.succeeded(b.id, None)], T0)
    pg_store.retry_all_dead(T0)  # nothing dead: no announcement
    heard = [(n.channel, n.payload) for n in listener.notifies(timeout=1, stop_after=4)]
    # A finish that frees a key wakes the workers; one that frees nothing tells the daemons
    # (when a client waits on it).
    told = {j.id: ("queickd", f"fk:{j.id}") if j.key else ("queickd_finished", f"f:{j.id}") for j in (a, b)}
    assert heard == [("queickd_queued", "q:default"), ("queickd_queued", "q:gpu"), told[a.id], told[b.id]]
    with pg_store.transaction() as tx:
        tx.submit([job()], T0)
        assert list(listener.notifies(timeout=0.2)) == []  # not before the commit
    assert [n.payload for n in listener.notifies(timeout=1, stop_after=1)] == ["q:default"]
    listener.close()


def test_running_without_worker_counts_only_running_jobs_whose_worker_is_gone(pg_url, pg_store):
    from queickd.store.postgres.store import PostgresStore

    pg_store.register_worker("worker", ["default"], 2, 10.0)
    pg_store.submit([job(), job(), job()], T0)
    pg_store.claim_available(Request.of(1, now=T0))  # held by a registered worker that beats
    assert pg_store.running_without_worker() == 0
    unregistered = PostgresStore(pg_url)  # its claims carry no worker at all
    try:
        unregistered.claim_available(Request.of(1, now=T0))
    finally:
        unregistered.close()
    assert pg_store.running_without_worker() == 1
    pg_store.deregister_worker()  # its record is gone: its job has no worker either
    assert pg_store.running_without_worker() == 2


@pytest.mark.parametrize("grouped", [False, True], ids=["fast_path", "selection"])
def test_hosts_claiming_at_once_let_one_probe_through(pg_url, pg_store, grouped):
    # Ungrouped jobs are claimed by queickd_claim, grouped ones by the store's selection.
    from queickd.store.postgres.store import PostgresStore

    trip_bad(pg_store)
    kw = {"concurrency_group": "g", "concurrency_limit": 10} if grouped else {}
    pg_store.submit([job(func="m:bad", **kw) for _ in range(20)], T0)
    start = threading.Barrier(4)
    got = []

    def claimer():
        s = PostgresStore(pg_url, migrate=False)
        try:
            start.wait(10)
            for _ in range(10):
                got.extend(s.claim_available(Request.of(5, now=T0 + 60)))
        finally:
            s.close()

    run_together(*[claimer] * 4)
    assert len(got) == 1 and pg_store.pauses()[0].probe_job == got[0].id


@pytest.mark.parametrize("first", ["default", "b"], ids=["fast_path_first", "selection_first"])
def test_a_probe_taken_by_a_claim_not_yet_committed_is_not_taken_again_by_the_other_path(pg_url, pg_store, first):
    # Pool b has a budget: its claims are the selection, pool default's the fast path. The
    # paused function has jobs in both; one claim takes the probe and has not committed.
    from queickd.core.policy.claim import Limits
    from queickd.store.postgres.store import PostgresStore

    trip_bad(pg_store)
    pg_store.adopt_budgets(Limits(pools={"b": 100}))
    pg_store.submit([job(func="m:bad", pool=p) for p in ("default", "b") * 3], T0)
    other, second = PostgresStore(pg_url, migrate=False), "b" if first == "default" else "default"
    got = []
    try:
        with pg_store.transaction() as tx:
            (probe,) = tx.claim_available(Request.of(5, pools=[first], now=T0 + 60))
            t = threading.Thread(target=lambda: got.extend(other.claim_available(Request.of(5, pools=[second], now=T0 + 60))))
            t.start()
            t.join(10)  # the other claim must not wait for this one to decide
            assert not t.is_alive()
        t.join(10)
    finally:
        other.close()
    assert got == [] and pg_store.pauses()[0].probe_job == probe.id


def _race(first, second):
    """Call both at once, on two threads; the errors they raised."""
    barrier, errors = threading.Barrier(2), []

    def at_once(call):
        try:
            barrier.wait(10)
            call()
        except BaseException as e:  # reported by the caller, with the round it failed in
            errors.append(e)

    run_together(partial(at_once, first), partial(at_once, second), timeout=30)
    return errors


def _finish(store, job):
    from store_contract_workflows import run

    with store.transaction(bookkeeping=True) as tx:
        tx.finish_if_running([run(job)], T0)


def test_child_runs_finishing_while_their_parents_are_cancelled_never_deadlock(pg_url, pg_store):
    # A child's end locks the child, then its parent; a cancel of the parent locks the
    # parent, then its children. Raced on two connections, each must take the tree's
    # root first: neither may fail with a deadlock, and each tree ends one way or the other.
    from store_contract_workflows import S, definition

    from queickd.core import workflow as wf
    from queickd.store.postgres.store import PostgresStore

    d = definition({"name": "kid", "workflow": {"name": "c", "steps": [{"name": "m", "func": S + "mark"}]}},
                   {"name": "after", "func": S + "mark"})
    other = PostgresStore(pg_url, migrate=False)
    try:
        for _ in range(40):
            parent, _ = pg_store.workflow_start(d, {}, T0)
            (job,) = pg_store.claim_available(Request.of(1, now=T0))
            assert _race(partial(_finish, pg_store, job), partial(other.workflow_cancel, parent.id, T0)) == []
            parent = pg_store.workflow_get(parent.id)
            (child,) = pg_store.workflow_children(parent)
            assert parent.status == wf.RunState.CANCELLED
            assert pg_store.get(job.id).state == State.SUCCEEDED
            # The child ended first (the parent moved on, its next job then cancelled), or
            # the cancel came first (the child cancelled, its finish stale).
            after = [j.state for j in pg_store.workflow_jobs(parent.id)]
            assert (child.status, after) in ((wf.RunState.SUCCEEDED, [State.CANCELLED]), (wf.RunState.CANCELLED, []))
    finally:
        other.close()


def test_a_step_job_cancelled_while_a_failure_ends_its_run_never_deadlocks(pg_url, pg_store):
    # The failed item's finish locks its job, then the run's root, then cancels the run's
    # waiting jobs; the operator's cancel of one of those must lock the root before the job.
    from store_contract_workflows import S, definition

    from queickd.core import workflow as wf
    from queickd.store.postgres.store import PostgresStore

    d = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "odd_fails"})
    other = PostgresStore(pg_url, migrate=False)
    try:
        for _ in range(40):
            run, _ = pg_store.workflow_start(d, {"xs": [1, 2]}, T0)
            (failing,) = pg_store.claim_available(Request.of(1, now=T0))  # item 0, whose 1 is odd: it fails
            waiting = next(j for j in pg_store.workflow_jobs(run.id) if j.id != failing.id)
            assert _race(partial(_finish, pg_store, failing), partial(other.cancel, waiting.id, T0)) == []
            run = pg_store.workflow_get(run.id)
            assert (run.status, run.reason["step"]) == (wf.RunState.FAILED, "fan")
            assert [j.state for j in pg_store.workflow_jobs(run.id)] == [State.DEAD, State.CANCELLED]
    finally:
        other.close()


def test_a_heartbeat_sweeps_the_orphans_of_workers_that_stopped_beating(pg_url, pg_store):
    from queickd.store.postgres.store import PostgresStore

    gone = PostgresStore(pg_url, migrate=False)
    gone.register_worker("worker", ["default"], 1, heartbeat=0.2)
    pg_store.register_worker("daemon", ["default"], 1, heartbeat=60)
    pg_store.submit([job()], T0)
    (held,) = gone.claim_available(Request.of(1, now=T0))
    pg_store._conn().execute("UPDATE workers SET beat_at = beat_at - 1 WHERE id = %s", (gone.worker_id,))
    beat = pg_store.beat(3, T0)
    assert beat.found and beat.recovered is not None and beat.recovered.requeued == [held.id]
    assert pg_store.get(held.id).state == State.QUEUED
    assert pg_store.beat().recovered is None  # no sweep asked for
    gone.close()


def test_a_read_on_a_connection_the_server_dropped_is_sent_again_on_a_new_one(pg_url, pg_store):
    import psycopg

    (stored,) = pg_store.submit([job()], T0)
    pid = pg_store._conn().execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the terminated backend did not go"
            time.sleep(0.01)
    assert pg_store.get(stored.job_id).id == stored.job_id
    assert pg_store._conn().execute("SELECT pg_backend_pid()").fetchone()[0] != pid


def test_an_events_delivery_waits_for_another_hosts_submit_so_the_key_cap_holds(pg_url):
    from queickd.core.policy.admission import Admission
    from queickd.store.postgres.store import PostgresStore
    from queickd.store.records import NewEvent

    cap = Admission(max_queued_per_key=1)
    host1, host2 = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        accepted = {}
        with host2.transaction() as tx:  # a group commit: one job of key k admitted, not committed yet
            tx.submit_requests([[job(key="k")]], T0, cap)
            t = threading.Thread(target=lambda: accepted.setdefault(
                "event", host1.accept_event(NewEvent("e1", job(func="m:tap", key="k")), T0, cap)))
            t.start()
            t.join(1.0)
            assert t.is_alive()  # its admission waits for the submit lock
        t.join(20)
        assert accepted["event"].state == "pending"  # refused by the cap, kept in the outbox
        assert len(host1.list_jobs(State.QUEUED, 10, key="k")) == 1
    finally:
        host1.close()
        host2.close()


@pytest.mark.parametrize("limit", [3, 10], ids=["near its limit: the selection", "far from it: the fast path"])
def test_claimers_of_a_fleet_start_no_more_than_a_rate_keys_limit(pg_store, limit):
    from queickd.store.postgres.store import PostgresStore

    rl = {"key": "slack", "limit": limit, "per": 1000.0}
    pg_store.submit([job(rate_limit=rl) for _ in range(30)] + [job() for _ in range(30)], T0)
    hosts = [PostgresStore(pg_store._dsn, migrate=False) for _ in range(4)]
    started: list = []
    lock = threading.Lock()

    def claim(store):
        for _ in range(12):
            got = store.claim_available(Request.of(2, now=T0))
            with lock:
                started.extend(got)

    try:
        run_together(*[partial(claim, h) for h in hosts])
    finally:
        for h in hosts:
            h.close()
    assert sum(j.rate_limit is not None for j in started) == limit
    assert sum(j.rate_limit is None for j in started) == 30


def test_a_pass_that_fills_a_rate_key_claims_no_more_than_its_limit(pg_store):
    # A probe is due elsewhere (m:bad paused, its probe at T0 + 60), so the pass hands the
    # room its fast path left to queickd_claim: that room must count the jobs it took.
    trip_bad(pg_store)
    rl = {"key": "k", "limit": 2, "per": 100.0}
    pg_store.submit([job(rate_limit=rl) for _ in range(2)] + [job() for _ in range(3)], T0)
    got = pg_store.finish_and_claim([], T0 + 61, 2) or []
    assert len(got) <= 2, [(j.id, j.rate_limit) for j in got]


def test_a_pass_after_the_selection_filled_a_rate_keys_opened_window_is_one_statement_again(pg_store):
    # Unlike a turn groups or budgets ask for, an opened window asks the selection once: it
    # fills the key, and the next pass does not go the general way.
    rl = {"key": "k", "limit": 1, "per": 10.0}
    subs = pg_store.submit([job(rate_limit=rl) for _ in range(2)] + [job() for _ in range(2)], T0)
    assert [j.id for j in pg_store.claim_available(Request.of(1, now=T0))] == [subs[0].job_id]
    assert pg_store.finish_and_claim([], T0 + 10, 1) is None  # the window opened: the selection's turn
    assert [j.id for j in pg_store.claim_available(Request.of(1, now=T0 + 10))] == [subs[1].job_id]
    assert [j.id for j in pg_store.finish_and_claim([], T0 + 11, 1) or []] == [subs[2].job_id]


@pytest.mark.parametrize("seed", range(1, 9))
def test_a_fleet_of_claims_passes_and_prunes_keeps_every_window_of_a_rate_key(pg_store, seed):
    # Rounds at one time each, the clock stepping 0.1 s: in each, four hosts claim (by
    # claim_available or by a pass that finishes what they hold) and one prunes, at once.
    # Every window of `per` seconds, by the starts' own times, holds at most `limit`. (A
    # deadlock of a prune and a claim, test_the_prune_and_a_claim_reading_two_keys_exact_do_not_deadlock,
    # fails that call only, as it would fail one pass of a pool.)
    import random

    import psycopg

    from queickd.store.postgres.store import PostgresStore

    rnd = random.Random(seed)
    limits = {"a": (3, 0.35), "b": (2, 0.25), "c": (5, 0.45)}
    jobs = [job(rate_limit={"key": k, "limit": lim, "per": per})
            for k, (lim, per) in limits.items() for _ in range(60)] + [job() for _ in range(60)]
    rnd.shuffle(jobs)
    pg_store.submit(jobs, T0)
    hosts = [PostgresStore(pg_store._dsn, migrate=False) for _ in range(4)]
    held: dict[int, list[int]] = {i: [] for i in range(4)}
    barrier = threading.Barrier(5)
    rounds = 40

    def host(i):
        r = random.Random(seed * 100 + i)
        for n in range(rounds):
            now = T0 + 0.1 * n
            barrier.wait()
            ask = r.randint(1, 4)
            got = []
            try:
                got = claim(i, r, now, ask)
            except psycopg.errors.DeadlockDetected:
                pass
            held[i].extend(j.id for j in got)

    def claim(i, r, now, ask):
        if r.random() < 0.5:
            got = hosts[i].finish_and_claim([Outcome.succeeded(j, None) for j in held[i]], now, ask)
            if got is not None:
                held[i] = []
                return got
        return hosts[i].claim_available(Request.of(ask, now=now))

    def pruner():
        for n in range(rounds):
            barrier.wait()
            with contextlib.suppress(psycopg.errors.DeadlockDetected):
                pg_store.prune_rate_keys(T0 + 0.1 * n)

    def aborting(call):
        try:
            call()
        except BaseException:
            barrier.abort()  # the others stop too, and the first error is the test's
            raise

    try:
        run_together(*[partial(aborting, partial(host, i)) for i in range(4)], partial(aborting, pruner),
                     timeout=100)
    finally:
        for h in hosts:
            h.close()
    c = pg_store.connect()
    rows = c.execute("SELECT rate_limit::json ->> 'key', started_at FROM jobs WHERE rate_limit IS NOT NULL"
                     " AND started_at IS NOT NULL").fetchall()
    c.close()
    bad = []
    for k, (lim, per) in limits.items():
        starts = sorted(t for key, t in rows if key == k)
        for i, t in enumerate(starts):
            inside = [s for s in starts[:i + 1] if s > t - per - 1e-9]
            if len(inside) > lim:
                bad.append((k, round(t - T0, 3), [round(s - T0, 3) for s in inside]))
    assert not bad, bad[:5]
    assert len(rows) > 0


def test_the_prune_and_a_claim_reading_two_keys_exact_do_not_deadlock(pg_store):
    # A claim by the selection (under the claim lock) reads key "k1" exact (its starts that
    # left the window deleted), then "k2"; the retention's prune, meanwhile, would delete
    # every key's old starts, "k2"'s first (stored first): it waits for the claim lock instead.
    from queickd.core.policy import rates
    from queickd.store.postgres.claim_sql import CLAIM_LOCK
    from queickd.store.sql import rates as sqlrates

    setup = pg_store.connect()
    for key in ("k2", "k1"):
        setup.execute("INSERT INTO rate_keys (key, lim, per, kept) VALUES (%s, 1, 1.0, 1)", (key,))
        setup.execute("INSERT INTO rate_starts (key, at, n) VALUES (%s, %s, 1)", (key, T0))
    claim = pg_store.connect()
    pruned: list = []
    t = threading.Thread(target=lambda: pruned.append(pg_store.prune_rate_keys(T0 + 10)))
    try:
        with claim.transaction():
            claim.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
            sqlrates._exact(claim, "k1", rates.Window(1, 1.0, None, 0.0, 1), T0 + 10)
            t.start()
            deadline = time.monotonic() + 10
            while not setup.execute("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'advisory'"
                                    " AND datname = current_database())").fetchone()[0]:
                assert time.monotonic() < deadline, "the prune never waited for the claim lock"
            assert sqlrates._exact(claim, "k2", rates.Window(1, 1.0, None, 0.0, 1), T0 + 10).starts == []
        t.join(10)
    finally:
        claim.close()
        setup.close()
    assert pruned == [2]  # both keys, their starts gone, once the claim committed
