"""The worker pool's dispatching: who claims a committed job, and that none is lost."""

import os
import threading
import time
from pathlib import Path

import pytest
from store_contract import job

from queickd.core.job import State
from queickd.core.policy.claim import Request
from queickd.run.loader import FunctionLoader
from queickd.services.pool_config import DEFAULT_CONFIG, PoolConfig, PoolHooks
from queickd.services.worker import WorkerPool
from queickd.store import open_store
from queickd.store.sqlite.inmemory import IN_MEMORY
from queickd.store.sqlite.store import SQLiteStore

JOBS = str(Path(__file__).parent / "jobs")


class ClaimWatch(SQLiteStore):
    """A real memory store that records which thread claimed each batch."""

    def __init__(self) -> None:
        super().__init__(IN_MEMORY)
        self.claimers: list[tuple[int, list[int]]] = []

    def _claim_in(self, c, request):  # the claim of every pass: each is made in a transaction
        jobs = super()._claim_in(c, request)
        if jobs:
            self.claimers.append((threading.get_ident(), [j.id for j in jobs]))
        return jobs


def _pool(store, workers=2):
    finished = threading.Event()
    pool = WorkerPool(store, FunctionLoader(JOBS), PoolConfig(workers), PoolHooks(on_finished=lambda outcomes: finished.set()))
    pool.start()
    return pool, finished


def _submit(store, **kw):
    return store.submit_requests([[job(func="testjobs:noop", **kw)]], time.time())[0][0].job_id


def test_dispatch_now_claims_in_the_calling_thread_when_the_dispatcher_is_idle():
    store = ClaimWatch()
    pool, finished = _pool(store)
    try:
        job_id = _submit(store)
        pool.dispatch_now()
        assert store.claimers and store.claimers[0] == (threading.get_ident(), [job_id])
        assert finished.wait(10)
    finally:
        pool.stop(10)


def test_a_job_dispatched_now_runs_once_and_succeeds():
    store = open_store("memory://")
    pool, finished = _pool(store)
    try:
        job_id = _submit(store)
        pool.dispatch_now()
        assert finished.wait(10)
    finally:
        assert pool.stop(10)
    assert store.get(job_id).state == State.SUCCEEDED and store.get(job_id).attempts == 1


def test_dispatch_now_with_every_worker_busy_leaves_the_claim_to_the_worker_that_frees_up(gate):
    store = ClaimWatch()
    done_ids: list[int] = []
    second_done = threading.Event()
    second: list[int] = []

    def on_finished(outcomes):
        done_ids.extend(o.job_id for o in outcomes)
        if second and second[0] in done_ids:
            second_done.set()

    pool = WorkerPool(store, FunctionLoader(JOBS), PoolConfig(1), PoolHooks(on_finished=on_finished))
    pool.start()
    try:
        first = store.submit_requests([[job(func="testjobs:gate", args=[gate.port, "t"])]], time.time())
        pool.dispatch_now()
        assert gate.arrival() == "t"  # the only worker is held inside the job
        second.append(_submit(store))
        pool.dispatch_now()
        assert [ids for _, ids in store.claimers] == [[first[0][0].job_id]]  # no claim beyond the free workers
        gate.release_all()
        assert second_done.wait(10)
        # the worker whose job ended recorded it and claimed the next job itself
        assert store.claimers[-1] == (pool._threads[0].ident, second)
    finally:
        pool.stop(10)


# --- the claim made inside the submit's own transaction ------------------------------------
class _SqlitePool:
    """A real SQLite store, a started pool of two workers, a batcher that dispatches to it,
    and the COMMITs of the store's writing connection."""

    def __init__(self, tmp_path) -> None:
        from queickd.services.batcher import SubmitBatcher
        self.store = SQLiteStore(str(tmp_path / "q.db"))
        self.pool, self.finished = _pool(self.store, 2)
        self.commits: list[str] = []
        self.sql: list[str] = []  # every statement of the writing connection, in order

        def traced(sql: str) -> None:
            self.sql.append(sql)
            if sql == "COMMIT":
                self.commits.append(sql)

        self.store._writer().set_trace_callback(traced)
        self.batcher = SubmitBatcher(self.store, dispatch=self.pool)


@pytest.fixture
def sq(tmp_path):
    it = _SqlitePool(tmp_path)
    yield it
    it.pool.stop(10)
    it.store.close()


def _submit_through(batcher, func="testjobs:noop", **kw):
    got: list = []
    batcher.submit([[job(func=func, **kw)]], got.append, inline=True)
    return got[0][0][0].job_id


def test_a_lone_submit_and_the_claim_of_its_job_share_one_commit(sq):
    store, finished, batcher = sq.store, sq.finished, sq.batcher
    job_id = _submit_through(batcher)
    first = sq.sql[:sq.sql.index("COMMIT")]  # its job may have ended (another commit) before the ack
    assert any(q.startswith("INSERT INTO jobs") for q in first)  # stored ...
    assert any(q.startswith("UPDATE jobs SET state = 'running'") for q in first)  # ... and claimed: one commit
    assert store.get(job_id).state in (State.RUNNING, State.SUCCEEDED)
    assert finished.wait(10)
    assert store.get(job_id).state == State.SUCCEEDED


def test_a_claim_that_fails_inside_a_submit_leaves_the_submit_stored_and_the_job_to_the_dispatcher(sq):
    store, finished, batcher = sq.store, sq.finished, sq.batcher
    real = store._claim_in  # the claim of every pass: each is made in a transaction
    calls = []

    def fails_once(*a, **kw):
        calls.append(threading.get_ident())
        if len(calls) == 1:
            store._writer().execute("UPDATE jobs SET attempts = attempts + 100")  # a write to undo
            raise RuntimeError("a claim that breaks")
        return real(*a, **kw)

    store._claim_in = fails_once
    job_id = _submit_through(batcher)
    assert finished.wait(10)  # claimed by a later pass
    job_now = store.get(job_id)
    assert job_now.state == State.SUCCEEDED and job_now.attempts == 1  # the failed claim's write undone
    assert sum(store.counts().values()) == 1  # stored once, not once per try
    assert calls[0] == threading.get_ident()  # the first try was the submitter's, inside its submit


def test_a_submit_that_finds_a_pass_running_leaves_its_claim_to_that_pass(sq):
    store, pool, finished, batcher = sq.store, sq.pool, sq.finished, sq.batcher
    with pool._dispatch_lock:  # another thread's pass is running
        job_id = _submit_through(batcher)
        assert store.get(job_id).state == State.QUEUED
    pool.dispatch_now()  # what that pass does on its way out, seeing it was asked again
    assert finished.wait(10)
    assert store.get(job_id).state == State.SUCCEEDED


def test_the_claim_inside_a_submit_leaves_waiting_outcomes_to_a_pass_after_its_commit(sq, tmp_path):
    store, pool, batcher, commits = sq.store, sq.pool, sq.batcher, sq.commits
    real = store._finish_in  # the finish of every pass: each is made in a transaction
    finishes: list[tuple[int, int]] = []  # (thread, commits made) when each finish began
    store._finish_in = lambda *a, **kw: finishes.append((threading.get_ident(), len(commits))) or real(
        *a, **kw)
    first = _submit_through(batcher, args=[str(tmp_path / "out"), "a", 0.3], func="testjobs:span")
    with pool._dispatch_lock:  # its worker cannot store its outcome: it leaves it waiting
        deadline = time.monotonic() + 10
        while pool._done.empty():
            assert time.monotonic() < deadline, "the first job never ended"
            time.sleep(0.01)
    before = len(commits)
    second = _submit_through(batcher)
    assert (threading.get_ident(), before) not in finishes  # not inside the submit's transaction
    deadline = time.monotonic() + 10
    while {store.get(first).state, store.get(second).state} != {State.SUCCEEDED}:
        assert time.monotonic() < deadline, "an outcome was left behind"
        time.sleep(0.01)


def test_a_job_that_ends_before_its_submit_is_acknowledged_leaves_its_outcome_to_the_submitter(sq, tmp_path,
                                                                                               monkeypatch):
    store, batcher = sq.store, sq.batcher
    flushing, release = threading.Event(), threading.Event()
    real_fdatasync = os.fdatasync

    def slow_flush(fd: int) -> None:  # the disk holds the submit's flush until the job has ended
        flushing.set()
        assert release.wait(10)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_flush)
    finishers: list[int] = []
    real_finish = store._finish_in  # the finish of every pass
    store._finish_in = lambda *a, **kw: finishers.append(threading.get_ident()) or real_finish(*a, **kw)
    out = tmp_path / "ran"
    got: list = []
    submitter = threading.Thread(target=lambda: got.append(_submit_through(
        batcher, func="testjobs:append", args=[str(out), "x"])))
    submitter.start()
    assert flushing.wait(10)
    deadline = time.monotonic() + 10
    while sq.pool._done.empty():  # the job runs while its submit is flushed, ends, and its
        assert time.monotonic() < deadline, "the job did not end"  # outcome waits, not stored
        time.sleep(0.005)
    assert out.exists() and finishers == []
    release.set()
    submitter.join(10)
    assert store.get(got[0]).state == State.SUCCEEDED  # stored by the time the submit returned
    assert finishers == [submitter.ident]  # by the submitting thread, after its ack


# --- the pass as one store call (store.finish_and_claim) -------------------------------------
class OneStep(SQLiteStore):
    """A real memory store that also passes in one call, as PostgreSQL does: successes only;
    `fail` calls raise as a lost connection would (a PassInOneCall by its finish_and_claim)."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__(IN_MEMORY)
        self.one_step: list[tuple[list[int], list[int]]] = []  # (finished ids, claimed ids) per call
        self.fail = fail

    def finish_and_claim(self, outcomes, now, limit, network_up=True, pools=None):
        if any(o.state != State.SUCCEEDED for o in outcomes):
            return None
        if self.fail:
            self.fail -= 1
            raise OSError("connection lost")
        with self.transaction() as tx:
            tx.finish_if_running(outcomes, now)
            claimed = tx.claim_available(Request.of(limit, network_up, pools=pools, now=now))
        self.one_step.append(([o.job_id for o in outcomes], [j.id for j in claimed]))
        return claimed


def _run_all(store, ids, workers=1):
    left = set(ids)
    all_done = threading.Event()

    def on_finished(outcomes):
        left.difference_update(o.job_id for o in outcomes)
        if not left:
            all_done.set()

    pool = WorkerPool(store, FunctionLoader(JOBS), PoolConfig(workers), PoolHooks(on_finished=on_finished))
    pool.start()
    try:
        pool.wake()
        assert all_done.wait(20)
    finally:
        assert pool.stop(10)
    return pool


def test_a_store_that_passes_in_one_call_finishes_and_claims_the_steady_state_in_it():
    store = OneStep()
    ids = [_submit(store) for _ in range(5)]
    _run_all(store, ids)
    assert all(store.get(i).state == State.SUCCEEDED for i in ids)
    finished = [i for done, _ in store.one_step for i in done]
    assert sorted(finished) == ids  # every success was stored by the one call
    assert sum(1 for done, claimed in store.one_step if done and claimed) >= 3  # finish and next claim together


def test_a_failure_is_stored_the_general_way_and_the_pool_goes_on():
    store = OneStep()
    bad = store.submit_requests([[job(func="testjobs:fail")]], time.time())[0][0].job_id
    ids = [bad] + [_submit(store) for _ in range(3)]
    _run_all(store, ids)
    assert store.get(bad).state == State.DEAD
    assert all(store.get(i).state == State.SUCCEEDED for i in ids[1:])
    assert bad not in [i for done, _ in store.one_step for i in done]


def test_a_one_call_pass_that_fails_leaves_its_outcomes_to_a_later_pass():
    store = OneStep(fail=1)
    ids = [_submit(store) for _ in range(3)]
    _run_all(store, ids)
    assert all(store.get(i).state == State.SUCCEEDED and store.get(i).attempts == 1 for i in ids)


def test_a_one_call_pass_writes_the_per_minute_counts_when_the_pool_goes_idle():
    store = OneStep()
    ids = [_submit(store) for _ in range(3)]
    _run_all(store, ids)
    assert sum(m.completed for m in store.minutes(0)) == 3


def test_a_job_that_ends_while_the_pool_is_counted_for_the_status_page_has_its_outcome_stored(tmp_path):
    store = SQLiteStore(str(tmp_path / "q.db"))
    stored = threading.Event()
    pool = WorkerPool(store, FunctionLoader(JOBS), PoolConfig(1), PoolHooks(on_finished=lambda outcomes: stored.set()))
    pool.start()
    try:
        job_id = _submit(store)

        def count_running() -> int:  # the status page's read; the job ends and asks for a pass meanwhile
            n = store.counts()[State.RUNNING]
            deadline = time.monotonic() + 10
            while not pool._again:  # its worker found the pool's lock held: it left the pass to us
                assert time.monotonic() < deadline
                time.sleep(0.001)
            return n

        pool.dispatch_now()
        pool.running_elsewhere(count_running)
        assert stored.wait(10)  # not left 'running' with the pool full of a job that ended
        assert store.get(job_id).state == State.SUCCEEDED
    finally:
        pool.stop(10)


def test_jobs_claimed_for_a_worker_that_cannot_be_started_still_run():
    from queickd.services.pool_size import PoolSize

    store = open_store("memory://")
    done = threading.Condition()
    finished: list[int] = []

    def on_finished(outcomes) -> None:
        with done:
            finished.extend(o.job_id for o in outcomes)
            done.notify_all()

    pool = WorkerPool(store, FunctionLoader(JOBS), DEFAULT_CONFIG, PoolHooks(on_finished=on_finished), size=PoolSize(1, 3))
    pool.start()

    def no_thread() -> None:  # the OS refuses a new thread (a pids or process limit)
        raise RuntimeError("can't start new thread")

    pool._add_thread = no_thread
    try:
        ids = [_submit(store) for _ in range(3)]
        pool.dispatch_now()
        with done:
            assert done.wait_for(lambda: sorted(finished) == ids, 10)
        assert pool.workers == 1 and [store.get(i).state for i in ids] == [State.SUCCEEDED] * 3
    finally:
        pool.stop(10)
