"""A PostgreSQL store's listeners and what a lost answer leaves: which listener hears what,
jobs running under this store's claims that it does not hold given back, a pass still
running in the server after its connection broke, waits marked across a broken shared
connection or a reconnecting listener (skips without a server)."""

import threading

from pgfixtures import conninfo, listen_for_queickd
from store_contract import T0, job

from queickd.core.job import Outcome, State
from queickd.core.policy.claim import Request


# --- which listener hears what -----------------------------------------------------------------
def test_a_worker_listener_hears_wake_ups_but_not_the_finishes_that_free_nothing(pg_fresh_database):
    import queue

    from queickd.services.fleet import Listener
    from queickd.store.postgres.store import PostgresStore

    store = PostgresStore(pg_fresh_database)
    heard = {"worker": queue.Queue(), "daemon": queue.Queue()}
    listeners = [Listener(store, heard["worker"].put, lambda: None, finished=False),
                 Listener(store, heard["daemon"].put, lambda: None)]
    for listener in listeners:
        listener.start()
        assert listener.connected.wait(10)
    try:
        (plain,) = store.submit([job()], T0)
        (one,) = store.claim_available(Request.of(1, now=T0))
        store.watch_finish(one.id)
        store.finish_if_running([Outcome.succeeded(one.id, None)], T0)
        (keyed,) = store.submit([job(key="k")], T0)
        (two,) = store.claim_available(Request.of(1, now=T0))
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
    from queickd.store.postgres.store import PostgresStore

    store = PostgresStore(pg_fresh_database)
    heard: queue.Queue[str] = queue.Queue()
    listener = Listener(store, heard.put, lambda: None, queued=False)
    listener.start()
    try:
        assert listener.connected.wait(10)
        store.submit([job()], T0)
        (one,) = store.claim_available(Request.of(1, now=T0))
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
    from queickd.services.pool_config import PoolConfig
    from queickd.services.worker import WorkerPool
    from queickd.store.postgres.store import PostgresStore

    store = PostgresStore(pg_fresh_database)
    front = FleetMember(store, WorkerPool(store, FunctionLoader("."), PoolConfig(0)), kind="daemon",
                        on_finished_ids=lambda ids: None)
    heard: queue.Queue[str] = queue.Queue()
    front.listener._on_notify = heard.put  # what its listener hears
    front.start()
    try:
        assert front.listener.connected.wait(10)
        store.submit([job()], T0)
        (one,) = store.claim_available(Request.of(1, now=T0))
        store.watch_finish(one.id)
        store.finish_if_running([Outcome.succeeded(one.id, None)], T0)
        assert heard.get(timeout=10) == f"f:{one.id}"  # the finish, for its waiting clients, and no q: before it
    finally:
        front.stop()
        store.close()


# --- a pass whose answer was lost --------------------------------------------------------------
def test_jobs_running_under_our_claims_that_we_do_not_hold_go_back_to_wait(pg_store):
    pg_store.register_worker("worker", ["default"], 2, 10.0)
    pg_store.submit([job(), job()], T0)
    held, lost = pg_store.claim_available(Request.of(2, now=T0))
    assert pg_store.release_unheld({held.id}, T0 + 1) == 1
    assert pg_store.get(held.id).state == State.RUNNING
    back = pg_store.get(lost.id)
    assert (back.state, back.attempts) == (State.SCHEDULED, 0)  # its attempt given back


def test_jobs_another_process_claimed_are_not_given_back(pg_url, pg_store):
    from queickd.store.postgres.store import PostgresStore

    other = PostgresStore(pg_url)
    try:
        other.register_worker("worker", ["default"], 1, 10.0)
        pg_store.register_worker("worker", ["default"], 1, 10.0)
        pg_store.submit([job()], T0)
        (theirs,) = other.claim_available(Request.of(1, now=T0))
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

    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    locker = psycopg.connect(conninfo(url))
    try:
        store.register_worker("worker", ["default"], 1, 10.0)
        store.submit([job(), job()], T0)
        (first,) = store.claim_available(Request.of(1, now=T0))
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
    from queickd.store.postgres.store import PostgresStore

    url, _ = pg
    store = PostgresStore(url)
    try:
        (s,) = store.submit([job(pool="gpu")], T0)
        ears = listen_for_queickd(url)
        ears.execute("LISTEN queickd_queued")
        store.watch_finish(s.job_id)
        assert [(n.channel, n.payload) for n in ears.notifies(timeout=1, stop_after=1)] == [("queickd_queued", "q:gpu")]
    finally:
        store.close()


def test_a_wait_is_marked_after_the_server_ended_the_shared_connection(pg):
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    try:
        (s,) = store.submit([job()], T0)
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE datname = current_database() AND application_name LIKE %s", ("%-shared",))
        store.watch_finish(s.job_id)  # sent again once on a new connection
        assert admin.execute("SELECT waited FROM jobs WHERE id = %s", (s.job_id,)).fetchone()[0] is True
    finally:
        store.close()


def test_a_daemon_whose_listener_reconnects_has_its_waiting_clients_look_again(pg):
    # A finish told while the listener was away is missed: the waits read their jobs again.
    import queue

    from queickd.run.loader import FunctionLoader
    from queickd.services.fleet import FleetMember
    from queickd.services.pool_config import PoolConfig
    from queickd.services.worker import WorkerPool
    from queickd.store.postgres.store import PostgresStore

    url, admin = pg
    store = PostgresStore(url)
    looked: queue.Queue[str] = queue.Queue()
    front = FleetMember(store, WorkerPool(store, FunctionLoader("."), PoolConfig(0)), kind="daemon",
                        on_finished_ids=lambda ids: None, on_listening=lambda: looked.put("look"))
    front.start()
    try:
        assert looked.get(timeout=10) == "look"  # listening for the first time
        # This test's database only: tests beside it under xdist have listeners of their own.
        assert admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                             " WHERE datname = current_database() AND application_name LIKE 'queickd-listener-%'"
                             ).fetchone()[0] == 1
        assert looked.get(timeout=10) == "look"  # listening again
    finally:
        front.stop()
        store.close()
