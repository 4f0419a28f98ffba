"""The store contract on PostgreSQL, and what only PostgreSQL does (skips without a server)."""

import threading
from functools import partial

import pytest
from helpers import run_together
from store_contract import T0, StoreContract, job

from queickd.core.job import Outcome, State


@pytest.fixture
def pg_store(pg_url):
    from queickd.store.postgres import PostgresStore

    s = PostgresStore(pg_url)
    yield s
    s.close()


class TestPostgresStore(StoreContract):
    @pytest.fixture
    def store(self, pg_store):
        return pg_store


def test_migrate_is_idempotent_and_records_both_versions(pg_store):
    from queickd import __version__
    from queickd.store.pgschema import SCHEMA_VERSION

    (s,) = pg_store.submit([job()], T0)
    assert pg_store.migrate() == pg_store.migrate() == SCHEMA_VERSION
    assert pg_store.versions() == (__version__, SCHEMA_VERSION)
    assert pg_store.get(s.job_id) is not None


def test_a_database_migrated_by_a_newer_queickd_is_refused(pg_url, pg_store):
    from queickd.store.pgschema import VersionMismatchError
    from queickd.store.postgres import PostgresStore

    pg_store._conn().execute("UPDATE queickd_meta SET value = '99.0' WHERE key = 'queickd_version'")
    with pytest.raises(VersionMismatchError, match="99.0"):
        PostgresStore(pg_url)
    with pytest.raises(VersionMismatchError):
        pg_store.check_version()


def test_the_database_itself_refuses_a_second_running_job_for_a_key(pg_store):
    import psycopg

    a, b = pg_store.submit([job(key="k"), job(key="k")], T0)
    pg_store.claim_available(1, T0)
    with pytest.raises(psycopg.errors.UniqueViolation):
        pg_store._conn().execute("UPDATE jobs SET state = 'running' WHERE id = %s", (b.job_id,))


def test_concurrent_claimers_run_each_job_once_and_one_job_per_key_at_a_time(pg_url, pg_store):
    from queickd.store.postgres import PostgresStore

    pg_store.submit([job(key=f"k{i % 4}", args=[i]) for i in range(60)] + [job() for _ in range(40)], T0)
    claimed: list[int] = []
    overlap: list[str] = []
    running: set[str] = set()
    lock = threading.Lock()

    def claimer():
        s = PostgresStore(pg_url, migrate=False)
        try:
            while True:
                jobs = s.claim_available(3, T0)
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
    from queickd.store.postgres import PostgresStore

    pg_store.submit([job() for _ in range(60)], T0)
    jobs = pg_store.claim_available(60, T0)
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
    from queickd.store.postgres import PostgresStore

    other = PostgresStore(pg_url, migrate=False)
    other.register_worker("worker", ["default"], 1, heartbeat=0.2)
    pg_store.submit([job(), job()], T0)
    (mine,) = other.claim_available(1, T0)
    (nobodys,) = pg_store.claim_available(1, T0)  # claimed with no registered worker
    assert pg_store.recover_orphans(3, T0).requeued == [nobodys.id]
    assert pg_store.get(mine.id).state == State.RUNNING  # its worker is alive
    pg_store._conn().execute("UPDATE workers SET beat_at = beat_at - 1")  # 5 beats missed
    assert pg_store.recover_orphans(3, T0).requeued == [mine.id]
    assert other.finish_if_running([Outcome.succeeded(mine.id, None)], T0).changed == 0
    other.close()


def test_open_store_takes_postgresql_urls(pg_url):
    from queickd.store import open_store
    from queickd.store.postgres import PostgresStore

    s = open_store(pg_url)
    assert isinstance(s, PostgresStore) and s.supports_notify
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
    from queickd.store.postgres import PostgresStore

    before = PostgresStore(pg_url, migrate=False)  # this pid's previous life, say
    old_id = before.register_worker("worker", ["default"], 1, heartbeat=60)
    pg_store.submit([job()], T0)
    (held,) = before.claim_available(1, T0)
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
    a, b = pg_store.claim_available(2, T0)
    pg_store.watch_finish(plain.job_id)  # a client waits on it
    pg_store.finish_if_running([Outcome.succeeded(a.id, None)], T0)
    pg_store.finish_if_running([Outcome.succeeded(b.id, None)], T0)
    pg_store.retry_all_dead(T0)  # nothing dead: no announcement
    heard = [(n.channel, n.payload) for n in listener.notifies(timeout=1, stop_after=4)]
    # A finish that frees a key wakes the workers; one that frees nothing tells the daemons
    # (when a client waits on it).
    told = {j.id: ("queickd", f"fk:{j.id}") if j.key else ("queickd_finished", f"f:{j.id}") for j in (a, b)}
    assert heard == [("queickd_queued", "q:default"), ("queickd_queued", "q:gpu"), told[a.id], told[b.id]]
    with pg_store.batch():
        pg_store.submit([job()], T0)
        assert list(listener.notifies(timeout=0.2)) == []  # not before the commit
    assert [n.payload for n in listener.notifies(timeout=1, stop_after=1)] == ["q:default"]
    listener.close()


def test_running_without_worker_counts_only_running_jobs_whose_worker_is_gone(pg_url, pg_store):
    from queickd.store.postgres import PostgresStore

    pg_store.register_worker("worker", ["default"], 2, 10.0)
    pg_store.submit([job(), job(), job()], T0)
    pg_store.claim_available(1, T0)  # held by a registered worker that beats
    assert pg_store.running_without_worker() == 0
    unregistered = PostgresStore(pg_url)  # its claims carry no worker at all
    try:
        unregistered.claim_available(1, T0)
    finally:
        unregistered.close()
    assert pg_store.running_without_worker() == 1
    pg_store.deregister_worker()  # its record is gone: its job has no worker either
    assert pg_store.running_without_worker() == 2


def _fill_the_fleet_to(pg_url, n):
    """Another host's store adds n waiting jobs, unseen by pg_store's cached count."""
    from queickd.store.postgres import PostgresStore

    other = PostgresStore(pg_url)
    try:
        other.submit([job() for _ in range(n)], T0)
    finally:
        other.close()


def test_far_below_the_cap_a_count_younger_than_its_ttl_stands_in_for_an_exact_one(pg_url, pg_store):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=10)
    pg_store.submit_requests([[job()]], T0, cap)  # counts exactly: nothing waits
    _fill_the_fleet_to(pg_url, 9)
    (answer,) = pg_store.submit_requests([[job()]], T0 + 0.5, cap)  # estimate: 0 + the 1 it added
    assert not isinstance(answer, Refusal)


def test_a_count_older_than_its_ttl_is_made_again(pg_url, pg_store):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=10)
    pg_store.submit_requests([[job()]], T0, cap)
    _fill_the_fleet_to(pg_url, 9)
    (answer,) = pg_store.submit_requests([[job()]], T0 + 1.5, cap)
    assert isinstance(answer, Refusal) and answer.code == "queue_full"


def test_a_count_made_later_than_now_is_made_again(pg_url, pg_store):
    from queickd.core.policy.admission import Admission, Refusal

    cap = Admission(max_queued=10)
    pg_store.submit_requests([[job()]], T0, cap)
    _fill_the_fleet_to(pg_url, 9)
    (answer,) = pg_store.submit_requests([[job()]], T0 - 5, cap)  # the wall clock went back
    assert isinstance(answer, Refusal) and answer.code == "queue_full"


def _trip_bad(store):
    """m:bad paused at T0 by 3 dead jobs, its probe due at T0 + 60."""
    store.submit([job(func="m:bad") for _ in range(3)], T0)
    ran = store.claim_available(3, T0)
    store.finish_if_running([Outcome.dead(j.id, {"type": "E", "message": "no"}) for j in ran], T0,
                            pause_after=3, pause_cooldown=60.0)


@pytest.mark.parametrize("grouped", [False, True], ids=["fast_path", "selection"])
def test_hosts_claiming_at_once_let_one_probe_through(pg_url, pg_store, grouped):
    # Ungrouped jobs are claimed by queickd_claim, grouped ones by the store's selection.
    from queickd.store.postgres import PostgresStore

    _trip_bad(pg_store)
    kw = {"concurrency_group": "g", "concurrency_limit": 10} if grouped else {}
    pg_store.submit([job(func="m:bad", **kw) for _ in range(20)], T0)
    start = threading.Barrier(4)
    got = []

    def claimer():
        s = PostgresStore(pg_url, migrate=False)
        try:
            start.wait(10)
            for _ in range(10):
                got.extend(s.claim_available(5, T0 + 60))
        finally:
            s.close()

    run_together(*[claimer] * 4)
    assert len(got) == 1 and pg_store.pauses()[0].probe_job == got[0].id


@pytest.mark.parametrize("first", ["default", "b"], ids=["fast_path_first", "selection_first"])
def test_a_probe_taken_by_a_claim_not_yet_committed_is_not_taken_again_by_the_other_path(pg_url, pg_store, first):
    # Pool b has a budget: its claims are the selection, pool default's the fast path. The
    # paused function has jobs in both; one claim takes the probe and has not committed.
    from queickd.core.policy.claim import Limits
    from queickd.store.postgres import PostgresStore

    _trip_bad(pg_store)
    pg_store.adopt_budgets(Limits(pools={"b": 100}))
    pg_store.submit([job(func="m:bad", pool=p) for p in ("default", "b") * 3], T0)
    other, second = PostgresStore(pg_url, migrate=False), "b" if first == "default" else "default"
    got = []
    try:
        with pg_store.batch():
            (probe,) = pg_store.claim_available(5, T0 + 60, pools=[first])
            t = threading.Thread(target=lambda: got.extend(other.claim_available(5, T0 + 60, pools=[second])))
            t.start()
            t.join(10)  # the other claim must not wait for this one to decide
            assert not t.is_alive()
        t.join(10)
    finally:
        other.close()
    assert got == [] and pg_store.pauses()[0].probe_job == probe.id


def test_the_ids_a_submit_returns_follow_the_order_of_its_jobs(pg_store):
    subs = pg_store.submit([job(args=[i]) for i in range(50)], T0)
    assert [pg_store.get(s.job_id).args for s in subs] == [[i] for i in range(50)]
    assert sorted(s.job_id for s in subs) == [s.job_id for s in subs]


def test_a_submit_the_database_refuses_leaves_the_store_usable(pg_store):
    import psycopg

    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        pg_store.submit([job(priority=2**40)], T0)  # the column is an integer
    (s,) = pg_store.submit([job()], T0)
    assert pg_store.get(s.job_id).state == State.QUEUED


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

    with store.batch(bookkeeping=True):
        store.finish_if_running([run(job)], T0)


def test_child_runs_finishing_while_their_parents_are_cancelled_never_deadlock(pg_url, pg_store):
    # A child's end locks the child, then its parent; a cancel of the parent locks the
    # parent, then its children. Raced on two connections, each must take the tree's
    # root first: neither may fail with a deadlock, and each tree ends one way or the other.
    from store_contract_workflows import S, definition

    from queickd.core import workflow as wf
    from queickd.store.postgres import PostgresStore

    d = definition({"name": "kid", "workflow": {"name": "c", "steps": [{"name": "m", "func": S + "mark"}]}},
                   {"name": "after", "func": S + "mark"})
    other = PostgresStore(pg_url, migrate=False)
    try:
        for _ in range(40):
            parent, _ = pg_store.workflow_start(d, {}, T0)
            (job,) = pg_store.claim_available(1, T0)
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
    from queickd.store.postgres import PostgresStore

    d = definition({"name": "fan", "kind": "for_each", "items": "xs", "func": S + "odd_fails"})
    other = PostgresStore(pg_url, migrate=False)
    try:
        for _ in range(40):
            run, _ = pg_store.workflow_start(d, {"xs": [1, 2]}, T0)
            (failing,) = pg_store.claim_available(1, T0)  # item 0, whose 1 is odd: it fails
            waiting = next(j for j in pg_store.workflow_jobs(run.id) if j.id != failing.id)
            assert _race(partial(_finish, pg_store, failing), partial(other.cancel, waiting.id, T0)) == []
            run = pg_store.workflow_get(run.id)
            assert (run.status, run.reason["step"]) == (wf.RunState.FAILED, "fan")
            assert [j.state for j in pg_store.workflow_jobs(run.id)] == [State.DEAD, State.CANCELLED]
    finally:
        other.close()


def test_a_keyed_submit_is_stored_without_waiting_for_the_submit_lock(pg_url, pg_store):
    # The client gives every enqueue a key (so a resend is safe): its submit must stay one
    # statement, not a locked transaction that looks the key up first.
    import psycopg

    from queickd.store.pgsubmit import SUBMIT_LOCK

    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (SUBMIT_LOCK,))  # held until the end
        stored = []
        run_together(lambda: stored.extend(pg_store.submit([job(idempotency_key="fresh")], T0)), timeout=10)
        holder.rollback()
    assert not stored[0].duplicate
    assert pg_store.get(stored[0].job_id).idempotency_key == "fresh"


def test_a_request_with_a_held_key_stores_its_new_jobs_once_and_names_the_held_one(pg_store):
    (held,) = pg_store.submit([job(idempotency_key="held")], T0)
    new, again = pg_store.submit([job(idempotency_key="new"), job(idempotency_key="held")], T0 + 1)
    assert (again.job_id, again.duplicate) == (held.job_id, True)
    assert not new.duplicate and new.job_id != held.job_id
    assert pg_store.counts()[State.QUEUED] == 2


def _copied_batch(n: int = 100) -> list:
    from queickd.store.pgsubmit import _COPY_FROM

    assert n >= _COPY_FROM  # sent by COPY, not as one INSERT
    return [job(args=[i, "x"], priority=i % 3, retry=None) for i in range(n)]


def test_a_batch_sent_by_copy_is_stored_in_its_order_with_its_fields(pg_store):
    batch = _copied_batch() + [job(run_at=T0 + 60, kwargs={"k": "v"}, pool="later")] * 64
    stored = pg_store.submit(batch, T0)
    ids = [s.job_id for s in stored]
    assert ids == sorted(ids) and len(set(ids)) == len(batch)
    assert [s.state for s in stored] == [State.QUEUED] * 100 + [State.SCHEDULED] * 64
    first, last = pg_store.get(ids[0]), pg_store.get(ids[-1])
    assert (first.args, first.priority, first.state) == ([0, "x"], 0, State.QUEUED)
    assert (last.kwargs, last.pool, last.run_at, last.state) == ({"k": "v"}, "later", T0 + 60, State.SCHEDULED)


def test_a_batch_sent_by_copy_is_stored_all_or_nothing(pg_store):
    import psycopg

    bad = job(func="m:f\x00")  # PostgreSQL's text cannot hold a NUL: the server refuses the row
    with pytest.raises(psycopg.Error):
        pg_store.submit([*_copied_batch(), bad], T0)
    assert pg_store.counts().get(State.QUEUED, 0) == 0
    assert len(pg_store.submit(_copied_batch(), T0)) == 100  # the connection is usable after


def test_a_batch_sent_by_copy_wakes_the_pools_of_its_queued_jobs_at_commit(pg_store):
    import psycopg

    listener = psycopg.connect(pg_store._dsn, autocommit=True)
    listener.execute("LISTEN queickd_queued")
    pg_store.submit([*_copied_batch(), job(pool="gpu"), job(pool="later", run_at=T0 + 60)], T0)
    assert sorted(n.payload for n in listener.notifies(timeout=1, stop_after=2)) == ["q:default", "q:gpu"]
    assert list(listener.notifies(timeout=0.2)) == []  # the scheduled job's pool is not woken
    listener.close()


def test_a_worker_listener_hears_wake_ups_but_not_the_finishes_that_free_nothing(pg_fresh_database):
    import queue

    from queickd.services.fleet import Listener
    from queickd.store.postgres import PostgresStore

    store = PostgresStore(pg_fresh_database)
    heard = {"worker": queue.Queue(), "daemon": queue.Queue()}
    listeners = [Listener(store, heard["worker"].put, lambda: None, finished=False),
                 Listener(store, heard["daemon"].put, lambda: None)]
    for listener in listeners:
        listener.start()
        assert listener.connected.wait(10)
    try:
        (plain,) = store.submit([job()], T0)
        (one,) = store.claim_available(1, T0)
        store.watch_finish(one.id)
        store.finish_if_running([Outcome.succeeded(one.id, None)], T0)
        (keyed,) = store.submit([job(key="k")], T0)
        (two,) = store.claim_available(1, T0)
        store.finish_if_running([Outcome.succeeded(two.id, None)], T0)

        def first(who: str, n: int) -> list[str]:
            return [heard[who].get(timeout=10) for _ in range(n)]

        # Delivered in commit order: the worker's last is the keyed finish, so it never heard the plain one.
        assert first("worker", 3) == ["q:default", "q:default", f"fk:{two.id}"]
        assert first("daemon", 4) == ["q:default", f"f:{one.id}", "q:default", f"fk:{two.id}"]
    finally:
        for listener in listeners:
            listener.stop()
        store.close()


def test_a_listener_not_for_new_jobs_hears_the_finish_first(pg_fresh_database):
    import queue

    from queickd.services.fleet import Listener
    from queickd.store.postgres import PostgresStore

    store = PostgresStore(pg_fresh_database)
    heard: queue.Queue[str] = queue.Queue()
    listener = Listener(store, heard.put, lambda: None, queued=False)
    listener.start()
    try:
        assert listener.connected.wait(10)
        store.submit([job()], T0)
        (one,) = store.claim_available(1, T0)
        store.watch_finish(one.id)
        store.finish_if_running([Outcome.succeeded(one.id, None)], T0)
        assert heard.get(timeout=10) == f"f:{one.id}"  # delivered in commit order: no q: before it
    finally:
        listener.stop()
        store.close()


def test_a_daemon_of_no_workers_does_not_hear_of_new_jobs(pg_fresh_database):
    import queue

    from queickd.run.loader import FunctionLoader
    from queickd.services.fleet import FleetMember
    from queickd.services.worker import WorkerPool
    from queickd.store.postgres import PostgresStore

    store = PostgresStore(pg_fresh_database)
    front = FleetMember(store, WorkerPool(store, FunctionLoader("."), 0), kind="daemon",
                        on_finished_ids=lambda ids: None)
    heard: queue.Queue[str] = queue.Queue()
    front.listener._on_notify = heard.put  # what its listener hears
    front.start()
    try:
        assert front.listener.connected.wait(10)
        store.submit([job()], T0)
        (one,) = store.claim_available(1, T0)
        store.watch_finish(one.id)
        store.finish_if_running([Outcome.succeeded(one.id, None)], T0)
        assert heard.get(timeout=10) == f"f:{one.id}"  # the finish, for its waiting clients, and no q: before it
    finally:
        front.stop()
        store.close()


def test_a_heartbeat_sweeps_the_orphans_of_workers_that_stopped_beating(pg_url, pg_store):
    from queickd.store.postgres import PostgresStore

    gone = PostgresStore(pg_url, migrate=False)
    gone.register_worker("worker", ["default"], 1, heartbeat=0.2)
    pg_store.register_worker("daemon", ["default"], 1, heartbeat=60)
    pg_store.submit([job()], T0)
    (held,) = gone.claim_available(1, T0)
    pg_store._conn().execute("UPDATE workers SET beat_at = beat_at - 1 WHERE id = %s", (gone.worker_id,))
    beat = pg_store.beat(3, T0)
    assert beat.found and beat.recovered is not None and beat.recovered.requeued == [held.id]
    assert pg_store.get(held.id).state == State.QUEUED
    assert pg_store.beat().recovered is None  # no sweep asked for
    gone.close()


def test_a_read_on_a_connection_the_server_dropped_is_sent_again_on_a_new_one(pg_url, pg_store):
    import time

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


def test_every_claim_function_is_planned_once_per_session(pg_store):
    """The claim's functions take parameters; PL/pgSQL plans such statements again on each
    call while a generic plan prices above the values' own, and the view's always did
    (pgpasssql.py, 14): a worker of one slot planned on every job. Each function of the
    claim's path says force_generic_plan, with the planner settings its plans rely on."""
    rows = pg_store._conn().execute(
        "SELECT proname, proconfig FROM pg_proc WHERE proname LIKE 'queickd\\_%' ORDER BY proname").fetchall()
    names = {name for name, _ in rows}
    assert {"queickd_claim", "queickd_claim_view", "queickd_candidates", "queickd_candidates_after",
            "queickd_start"} <= names
    for name, config in rows:
        assert "plan_cache_mode=force_generic_plan" in (config or []), name
        assert "enable_seqscan=off" in config, name


class _CountingConnection:
    """A store connection that counts the statements sent through it."""

    def __init__(self, conn):
        self._conn, self.sent = conn, []

    def execute(self, query, params=None, **kw):
        self.sent.append(str(query).split("(")[0])
        return self._conn.execute(query, params, **kw)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_a_claim_with_no_group_or_budget_in_play_is_one_statement(pg_store, monkeypatch):
    # A worker of one slot claims once per job: its claim's round trips are per job too.
    pg_store.submit([job(), job()], T0)
    counting = _CountingConnection(pg_store._bookkeeping_conn())
    monkeypatch.setattr(pg_store, "_bookkeeping_conn", lambda: counting)
    with pg_store.batch(bookkeeping=True):
        (claimed,) = pg_store.claim_available(1, T0)
    assert len(counting.sent) == 1 and pg_store.get(claimed.id).state == State.RUNNING


def test_the_fast_path_leaves_the_claim_to_the_selection_when_a_grouped_job_waits(pg_store):
    from queickd.store.pgclaim import _BUDGET_LOCK

    plain, grouped = pg_store.submit([job(), job(concurrency_group="g", concurrency_limit=1)], T0)
    c = pg_store._bookkeeping_conn()
    with c.transaction(force_rollback=True):
        rows = c.execute("SELECT id, state FROM queickd_claim(%s, %s, 1, NULL, true, 5)", (_BUDGET_LOCK, T0)).fetchall()
        assert rows == [(None, None)]  # nothing claimed: the selection's turn
    assert pg_store.get(plain.job_id).state == State.QUEUED
    got = pg_store.claim_available(5, T0)
    assert sorted(j.id for j in got) == sorted([plain.job_id, grouped.job_id])


def test_the_fast_path_leaves_the_claim_to_the_selection_when_a_served_pool_has_a_budget(pg_store):
    from queickd.core.policy.claim import Limits

    pg_store.adopt_budgets(Limits(pools={"b": 2}))
    pg_store.submit([job(pool="b", cost_units=1.0) for _ in range(3)], T0)
    got = pg_store.claim_available(5, T0, pools=["b"])
    assert len(got) == 2  # the budget held: the selection claimed, not the fast path


def _listen(url):
    import psycopg

    from queickd.store.pgchannels import CHANNEL, FINISHED_CHANNEL

    c = psycopg.connect(url, autocommit=True)
    c.execute(f"LISTEN {CHANNEL}; LISTEN {FINISHED_CHANNEL}")
    return c


def _heard(c) -> list[tuple[str, str]]:
    return sorted((n.channel, n.payload.split(":")[0]) for n in c.notifies(timeout=0.5, stop_after=10))


def _finish_and_claim_both_ways(store, one_step: bool, outcomes, now):
    if one_step:
        got = store.finish_and_claim(outcomes, now, 2)
        assert got is not None
        return got
    with store.batch(bookkeeping=True):
        store.finish_if_running(outcomes, now)
        return store.claim_available(2, now)


@pytest.mark.parametrize("one_step", [False, True], ids=["finish_then_claim", "one_statement"])
def test_a_pass_in_one_statement_stores_what_the_finish_and_the_claim_store(pg, one_step):
    # The steady state's pass restates finish_if_running for successes (pgpasssql.py, 16):
    # the rows, the streaks and pauses, and the notifications must be the same either way.
    from queickd.store.postgres import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    try:
        _trip_bad(store)  # m:bad paused, its probe due at T0 + 60; k:1 has a failure streak
        store.submit([job(func="m:f", key="k1")], T0)
        (keyed,) = store.claim_available(1, T0)
        store.finish_if_running([Outcome.dead(keyed.id, {"type": "E", "message": "no"})], T0)
        store.submit([job(func="m:bad"), job(func="m:f", key="k1"), job(func="m:g")], T0)
        running = store.claim_available(5, T0 + 60)  # the probe, the keyed job, the plain one
        assert len(running) == 3
        store.submit([job(func="m:next") for _ in range(3)], T0 + 60)
        ears = _listen(url)
        claimed = _finish_and_claim_both_ways(
            store, one_step, [Outcome.succeeded(j.id, {"n": j.id}, output=f"out {j.id}") for j in running], T0 + 61)
        rows = admin.execute("SELECT func, state, result, error, output, finished_at, worker_id, attempts"
                             " FROM jobs WHERE id = ANY(%s) ORDER BY id", ([j.id for j in running],)).fetchall()
        assert [r[1] for r in rows] == ["succeeded"] * 3
        assert [(r[2], r[4], r[5], r[6], r[7]) for r in rows] == [
            (f'{{"n":{j.id}}}', f"out {j.id}", T0 + 61, None, 1) for j in running]
        assert all(r[3] is None for r in rows)
        assert store.pauses() == [] and admin.execute("SELECT count(*) FROM streaks").fetchone()[0] == 0
        assert [j.func for j in claimed] == ["m:next", "m:next"]
        assert _heard(ears) == [("queickd", "fk"), ("queickd", "r")]
    finally:
        store.close()


def _finish_one(store, one_step: bool, job_id: int) -> None:
    if one_step:
        assert store.finish_and_claim([Outcome.succeeded(job_id, None)], T0, 1) == []
    else:
        store.finish_if_running([Outcome.succeeded(job_id, None)], T0)


@pytest.fixture
def running(pg):
    """(URL, an admin connection, a store of its own, a job it claimed)."""
    from queickd.store.postgres import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    try:
        store.submit([job()], T0)
        (j,) = store.claim_available(1, T0)
        yield url, admin, store, j
    finally:
        store.close()


@pytest.mark.parametrize("one_step", [False, True], ids=["finish", "one_statement"])
def test_a_finish_that_frees_nothing_and_nobody_waits_on_tells_no_one(running, one_step):
    # PostgreSQL 15 wakes every listening backend of the database on each notifying commit.
    url, _, store, j = running
    ears = _listen(url)
    _finish_one(store, one_step, j.id)
    assert store.get(j.id).state == State.SUCCEEDED and _heard(ears) == []


@pytest.mark.parametrize("one_step", [False, True], ids=["finish", "one_statement"])
def test_a_finish_of_a_job_a_client_waits_on_tells_the_finished_channel(running, one_step):
    url, _, store, j = running
    store.watch_finish(j.id)
    ears = _listen(url)
    _finish_one(store, one_step, j.id)
    assert _heard(ears) == [("queickd_finished", "f")]


@pytest.mark.parametrize("one_step", [False, True], ids=["finish", "one_statement"])
def test_a_finish_made_while_a_wait_is_being_marked_sees_the_mark(running, one_step):
    # The mark and the finish update one row: the finish waits for the mark's commit and
    # reads it from the row's newest version.
    url, admin, store, j = running
    ears = _listen(url)
    admin.autocommit = False
    try:
        admin.execute("UPDATE jobs SET waited = true WHERE id = %s", (j.id,))  # the mark, not yet committed
        finishing = threading.Thread(target=_finish_one, args=(store, one_step, j.id))
        finishing.start()
        finishing.join(0.5)
        assert finishing.is_alive()  # held by the mark's row lock
        admin.commit()
        finishing.join(10)
        assert not finishing.is_alive() and store.get(j.id).state == State.SUCCEEDED
        assert _heard(ears) == [("queickd_finished", "f")]
    finally:
        admin.rollback()
        admin.autocommit = True


def test_a_mark_made_while_the_finish_is_uncommitted_leaves_the_job_as_finished(pg_store):
    # The daemon's look after the mark then sees the finish: nothing needs telling.
    import threading

    pg_store.submit([job()], T0)
    (j,) = pg_store.claim_available(1, T0)
    with pg_store.batch(bookkeeping=True):
        pg_store.finish_if_running([Outcome.succeeded(j.id, None)], T0)
        marking = threading.Thread(target=pg_store.watch_finish, args=(j.id,))
        marking.start()
        marking.join(0.5)
        assert marking.is_alive()  # held by the finish's row lock
    marking.join(10)
    assert not marking.is_alive() and pg_store.get(j.id).state == State.SUCCEEDED


@pytest.mark.parametrize("outcome", ["dead", "retry", "workflow_step"])
def test_a_pass_in_one_statement_is_only_for_successes_outside_workflows(pg_store, outcome):
    pg_store.submit([job(), job()], T0)
    j, _ = pg_store.claim_available(1, T0) + [None]
    o = {"dead": lambda: Outcome.dead(j.id, {"type": "E", "message": "no"}),
         "retry": lambda: Outcome.retry_at(j.id, T0 + 5, {"type": "E", "message": "no"}),
         "workflow_step": lambda: Outcome.succeeded(j.id, None, workflow_run=1)}[outcome]()
    assert pg_store.finish_and_claim([o], T0, 1) is None
    assert pg_store.get(j.id).state == State.RUNNING and pg_store.counts()["queued"] == 1  # nothing done


def test_a_pass_in_one_statement_does_nothing_when_the_selection_must_claim(pg_store):
    pg_store.submit([job()], T0)
    (j,) = pg_store.claim_available(1, T0)
    pg_store.submit([job(concurrency_group="g", concurrency_limit=1)], T0)
    assert pg_store.finish_and_claim([Outcome.succeeded(j.id, None)], T0, 1) is None
    assert pg_store.get(j.id).state == State.RUNNING and pg_store.counts()["queued"] == 1


def test_jobs_a_pass_in_one_statement_claimed_but_cannot_read_are_given_back(pg_store, monkeypatch):
    # Its transaction has committed: jobs left `running` under a worker that beats on
    # without them would never run.
    from queickd.store import pgclaim

    (s,) = pg_store.submit([job()], T0)

    def unreadable(row):
        raise ValueError("a row this worker cannot read")

    monkeypatch.setattr(pgclaim.dbrows, "row_to_job", unreadable)
    with pytest.raises(ValueError, match="cannot read"):
        pg_store.finish_and_claim([], T0, 1)
    monkeypatch.undo()
    back = pg_store.get(s.job_id)
    assert back.state == State.SCHEDULED and back.attempts == 0 and back.run_at == T0


# --- a pass whose answer was lost --------------------------------------------------------------
def test_jobs_running_under_our_claims_that_we_do_not_hold_go_back_to_wait(pg_store):
    pg_store.register_worker("worker", ["default"], 2, 10.0)
    pg_store.submit([job(), job()], T0)
    held, lost = pg_store.claim_available(2, T0)
    assert pg_store.release_unheld({held.id}, T0 + 1) == 1
    assert pg_store.get(held.id).state == State.RUNNING
    back = pg_store.get(lost.id)
    assert (back.state, back.attempts) == (State.SCHEDULED, 0)  # its attempt given back


def test_jobs_another_process_claimed_are_not_given_back(pg_url, pg_store):
    from queickd.store.postgres import PostgresStore

    other = PostgresStore(pg_url)
    try:
        other.register_worker("worker", ["default"], 1, 10.0)
        pg_store.register_worker("worker", ["default"], 1, 10.0)
        pg_store.submit([job()], T0)
        (theirs,) = other.claim_available(1, T0)
        assert pg_store.release_unheld(set(), T0) == 0
        assert pg_store.get(theirs.id).state == State.RUNNING
    finally:
        other.close()


def test_a_pass_still_running_in_the_server_after_its_connection_broke_is_ended_before_the_give_back(pg):
    # The client saw its connection fail while the server was still running the pass
    # (waiting for a row lock): left alone, it would commit its claims afterwards, with
    # nobody to run them.
    import os
    import socket
    import time

    import psycopg

    from queickd.store.postgres import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    locker = psycopg.connect(url)
    try:
        store.register_worker("worker", ["default"], 1, 10.0)
        store.submit([job(), job()], T0)
        (first,) = store.claim_available(1, T0)
        locker.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (first.id,))  # the finish will wait
        store._bookkeeping_conn()
        pid = store._bk_backend[0]
        failed: list[BaseException] = []

        def lost_pass() -> None:
            try:
                store.finish_and_claim([Outcome.succeeded(first.id, None)], T0, 1)
            except BaseException as e:
                failed.append(e)

        passing = threading.Thread(target=lost_pass)
        passing.start()
        deadline = time.monotonic() + 10
        while admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                            (pid,)).fetchone()[0] != "Lock":
            assert time.monotonic() < deadline, "the pass never waited for the row lock"
            time.sleep(0.01)  # pg_stat_activity has no event to wait on
        sock = socket.socket(fileno=os.dup(store._bk.pgconn.socket))
        sock.shutdown(socket.SHUT_RDWR)  # the client's side of the connection breaks
        sock.close()
        passing.join(10)
        assert failed and not passing.is_alive()
        releasing = threading.Thread(target=store.release_unheld, args=(set(), T0))
        releasing.start()
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
            assert time.monotonic() < deadline + 10, "the lost pass's server process was not ended"
            time.sleep(0.01)
        locker.commit()  # the lock is let go: a pass still running would now commit its claim
        releasing.join(10)
        assert not releasing.is_alive()
        states = dict(admin.execute("SELECT id, state FROM jobs").fetchall())
        assert states[first.id] == State.SCHEDULED and State.RUNNING not in states.values()
    finally:
        locker.close()
        store.close()


def test_marking_a_waited_job_that_is_still_queued_announces_it_again(pg):
    # The mark holds the row's lock until it commits, and a claim skips locked rows.
    from queickd.store.postgres import PostgresStore

    url, _ = pg
    store = PostgresStore(url)
    try:
        (s,) = store.submit([job(pool="gpu")], T0)
        ears = _listen(url)
        ears.execute("LISTEN queickd_queued")
        store.watch_finish(s.job_id)
        assert [(n.channel, n.payload) for n in ears.notifies(timeout=1, stop_after=1)] == [("queickd_queued", "q:gpu")]
    finally:
        store.close()


def test_a_wait_is_marked_after_the_server_ended_the_shared_connection(pg):
    from queickd.store.postgres import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    try:
        (s,) = store.submit([job()], T0)
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
                      ("%-shared",))
        store.watch_finish(s.job_id)  # sent again once on a new connection
        assert admin.execute("SELECT waited FROM jobs WHERE id = %s", (s.job_id,)).fetchone()[0] is True
    finally:
        store.close()


def test_a_daemon_whose_listener_reconnects_has_its_waiting_clients_look_again(pg):
    # A finish told while the listener was away is missed: the waits read their jobs again.
    import queue

    from queickd.run.loader import FunctionLoader
    from queickd.services.fleet import FleetMember
    from queickd.services.worker import WorkerPool
    from queickd.store.postgres import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    looked: queue.Queue[str] = queue.Queue()
    front = FleetMember(store, WorkerPool(store, FunctionLoader("."), 0), kind="daemon",
                        on_finished_ids=lambda ids: None, on_listening=lambda: looked.put("look"))
    front.start()
    try:
        assert looked.get(timeout=10) == "look"  # listening for the first time
        assert admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                             " WHERE application_name LIKE 'queickd-listener-%'").fetchone()[0] == 1
        assert looked.get(timeout=10) == "look"  # listening again
    finally:
        front.stop()
        store.close()
