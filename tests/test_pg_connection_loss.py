"""PostgreSQL connections killed while jobs finish (pg_terminate_backend, as a server restart
or a failover does): a lost connection is the store's trouble, never an outcome's, so every
job that succeeded is recorded as succeeded once the daemon has reconnected."""

from __future__ import annotations

import threading

from queickd.core.protocol import QueueError


def test_no_succeeded_job_is_recorded_dead_when_the_daemons_connections_are_killed(pg, start_daemon, tmp_path):
    url, admin = pg
    d = start_daemon(url, "--sweep", "0.5", workers=4)
    done = tmp_path / "runs.txt"
    stop = threading.Event()
    kills = []

    def kill_the_daemons_connections() -> None:
        # Every backend of this test's database but our own: the daemon's writers, its
        # bookkeeping connection, its per-thread readers and its listener.
        while not stop.wait(0.15):
            kills.append(admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0])

    killer = threading.Thread(target=kill_the_daemons_connections)
    acked: list[int] = []
    with d.client() as q:
        killer.start()
        try:
            i = 0
            while len(kills) < 25:  # jobs finish all through 25 kills
                i += 1
                try:
                    acked.append(q.enqueue("testjobs:span", [str(done), str(i), 0.005]))
                except (QueueError, OSError):
                    pass  # refused while the store was away: not acknowledged, not counted
        finally:
            stop.set()
            killer.join()
        assert sum(kills) > 0
        jobs = []
        for job_id in acked:
            try:
                jobs.append(q.wait(job_id, 60))
            except TimeoutError:
                raise AssertionError(f"job {q.get(job_id)} never ended:\n{database_view(admin)}\n"
                                     f"{d.stacks()}") from None
    ran = {line.split()[0] for line in done.read_text().splitlines()}
    succeeded_but_dead = [(j["id"], j["error"]) for j in jobs if j["state"] == "dead" and j["args"][1] in ran]
    assert succeeded_but_dead == []
    assert {j["state"] for j in jobs} == {"succeeded"}


def database_view(admin) -> str:
    """The queue's backends and the locks they hold or wait for."""
    rows = admin.execute(
        "SELECT a.pid, a.state, a.wait_event_type, a.wait_event, now() - a.xact_start, left(a.query, 120),"
        " (SELECT string_agg(l.locktype || ' ' || l.mode || CASE WHEN l.granted THEN '' ELSE ' (waits)' END, ', ')"
        "  FROM pg_locks l WHERE l.pid = a.pid AND l.locktype <> 'virtualxid')"
        " FROM pg_stat_activity a WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()").fetchall()
    return "\n".join(map(str, rows))


def test_a_job_claimed_by_a_pass_whose_answer_was_lost_goes_back_and_runs(pg_fresh_database):
    # The server committed a pass (finishing jobs or not, claiming the next), then the connection
    # broke before its answer came: the claimed job runs under this worker's claims with
    # no thread to run it, and the worker goes on beating, so no orphan sweep frees it.
    import time

    import psycopg
    from helpers import JOBS_DIR
    from store_contract import job

    from queickd.core.job import State
    from queickd.run.loader import FunctionLoader
    from queickd.services.pool_config import PoolConfig, PoolHooks
    from queickd.services.worker import WorkerPool
    from queickd.store.postgres.store import PostgresStore

    class AnswerLost(PostgresStore):
        lost: list[int] = []

        def finish_and_claim(self, outcomes, now, limit, network_up=True, pools=None):
            claimed = super().finish_and_claim(outcomes, now, limit, network_up, pools)
            if claimed and not self.lost:  # the first pass that claims, finishing or not
                self.lost.extend(j.id for j in claimed)
                raise psycopg.OperationalError("the connection broke before the answer came")
            return claimed

    store = AnswerLost(pg_fresh_database)
    store.register_worker("worker", ["default"], 1, 10.0)
    ids = [s.job_id for s in store.submit([job(func="testjobs:noop") for _ in range(3)], time.time())]
    left, all_done = set(ids), threading.Event()

    def finished(outcomes) -> None:
        left.difference_update(o.job_id for o in outcomes if o.state == State.SUCCEEDED)
        if not left:
            all_done.set()

    pool = WorkerPool(store, FunctionLoader(str(JOBS_DIR)), PoolConfig(1), PoolHooks(on_finished=finished))
    pool.start()
    try:
        pool.wake()
        deadline = time.monotonic() + 20
        while not all_done.wait(0.05) and time.monotonic() < deadline:
            store.promote_due(time.time())  # the scheduler's part: a job given back waits until due
            pool.wake()
        assert store.lost, f"no pass lost its answer: nothing was tested (jobs {sorted(left)} not done)"
        assert all_done.is_set(), f"jobs {sorted(left)} never ran"
        assert [store.get(i).state for i in ids] == [State.SUCCEEDED] * 3
        assert store.get(store.lost[0]).attempts == 1  # the lost claim's attempt was given back
    finally:
        assert pool.stop(10)
        store.close()
