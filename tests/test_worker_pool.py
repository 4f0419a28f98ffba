"""The worker pool's dispatching: who claims a committed job, and that none is lost."""

import threading
import time
from pathlib import Path

from store_contract import job

from queickd.core.job import State
from queickd.run.loader import FunctionLoader
from queickd.services.worker import WorkerPool
from queickd.store.memory import MemoryStore

JOBS = str(Path(__file__).parent / "jobs")


class ClaimWatch(MemoryStore):
    """A real memory store that records which thread claimed each batch."""

    def __init__(self) -> None:
        super().__init__()
        self.claimers: list[tuple[int, list[int]]] = []

    def claim_available(self, limit, now, network_up=True, pools=None, **limits):
        jobs = super().claim_available(limit, now, network_up, pools=pools, **limits)
        if jobs:
            self.claimers.append((threading.get_ident(), [j.id for j in jobs]))
        return jobs


def _pool(store, workers=2):
    finished = threading.Event()
    pool = WorkerPool(store, FunctionLoader(JOBS), workers, on_finished=lambda outcomes: finished.set())
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
    store = MemoryStore()
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

    pool = WorkerPool(store, FunctionLoader(JOBS), 1, on_finished=on_finished)
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
