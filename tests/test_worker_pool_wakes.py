"""A wake-up that comes while every worker of the pool is busy is never lost: the pass of
the run that frees a slot may have claimed before the new work was stored, and still the
freed slot leads to a look at it, whatever the run's outcome (one the store ignores, as
a cancelled run's, included). On a real SQLite file and a real PostgreSQL schema."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import read_lines
from store_contract import job

from queickd.run.loader import FunctionLoader
from queickd.services.pool_config import PoolConfig, PoolHooks
from queickd.services.worker import WorkerPool
from queickd.store.contract.capabilities import PassInOneCall

JOBS = str(Path(__file__).parent / "jobs")


def _slipping(base: type) -> type:
    """`base` (a real store) with `slip` called once, armed, right after the next pass's
    store calls have committed: where the pass has made its claim and its pool has not yet
    freed the slot of the run it stored. A client's enqueue landing there is what a
    cancel's log line invites (the operator sees the run end and enqueues at once)."""

    class Slipping(base):
        slip: Callable[[], None] | None = None

        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self._depth = threading.local()

        @contextlib.contextmanager
        def transaction(self, *a, **kw):
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            try:
                with super().transaction(*a, **kw) as tx:
                    yield tx
            finally:
                self._depth.n = depth
            if depth == 0:  # the outermost transaction has committed
                self._slipped()

        def finish_and_claim(self, *a, **kw):
            claimed = super().finish_and_claim(*a, **kw)
            if claimed is not None:  # the pass's own transaction has committed
                self._slipped()
            return claimed

        def _slipped(self) -> None:
            slip, self.slip = self.slip, None
            if slip is not None:
                slip()

    if not issubclass(base, PassInOneCall):  # a pass of this store is always a batch
        del Slipping.finish_and_claim
    return Slipping


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        from queickd.store.sqlite.store import SQLiteStore

        s = _slipping(SQLiteStore)(str(tmp_path / "q.db"))
    else:
        from queickd.store.postgres.store import PostgresStore

        s = _slipping(PostgresStore)(request.getfixturevalue("pg_url"))
    yield s
    s.close()


def _submit(store, func: str, *args) -> int:
    return store.submit_requests([[job(func=func, args=list(args))]], time.time())[0][0].job_id


def _pool_of_one(store) -> tuple[WorkerPool, Callable[[int], bool]]:
    """A started pool of one worker, and ended(job_id): waits up to 10 s for that job's
    outcome to be stored (this pool has no safety sweep: nothing else looks again)."""
    ended: set[int] = set()
    cond = threading.Condition()

    def on_finished(outcomes) -> None:
        with cond:
            ended.update(o.job_id for o in outcomes)
            cond.notify_all()

    def wait_ended(job_id: int) -> bool:
        with cond:
            return cond.wait_for(lambda: job_id in ended, 10)

    pool = WorkerPool(store, FunctionLoader(JOBS), PoolConfig(1), PoolHooks(on_finished=on_finished))
    pool.start()
    return pool, wait_ended


def _enqueue_in_the_window(store, pool: WorkerPool) -> list[int]:
    """Arms the store: once the next pass has committed, a job is stored and the pool told,
    as a submit's thread tells it (dispatch_now: with every worker busy, only a wake)."""
    second: list[int] = []

    def slip() -> None:
        second.append(_submit(store, "testjobs:add", 2, 3))
        pool.dispatch_now()

    store.slip = slip
    return second


def test_a_job_enqueued_as_a_cancelled_run_frees_the_only_worker_runs(store, gate, tmp_path):
    pool, wait_ended = _pool_of_one(store)
    try:
        first = _submit(store, "testjobs:python_loop", gate.port, str(tmp_path / "out"), 600)
        pool.dispatch_now()
        assert gate.arrival() == "looping"
        second = _enqueue_in_the_window(store, pool)
        store.cancel_running(first, time.time())  # as an operator's cancel does
        pool.cancel_running(first)
        assert wait_ended(first) and second, "the pass that applied the cancelled run did not commit"
        assert read_lines(tmp_path / "out") == ["interrupted JobInterrupted"]
        assert wait_ended(second[0]), "the job enqueued as the slot freed was never claimed"
        assert store.get(second[0]).result == 5
    finally:
        pool.stop(10)


def test_a_job_enqueued_as_a_finished_run_frees_the_only_worker_runs(store, gate):
    pool, wait_ended = _pool_of_one(store)
    try:
        first = _submit(store, "testjobs:gate", gate.port, "held")
        pool.dispatch_now()
        assert gate.arrival() == "held"
        second = _enqueue_in_the_window(store, pool)
        gate.release_all()
        assert wait_ended(first) and second, "the pass that stored the first job did not commit"
        assert wait_ended(second[0]), "the job enqueued as the slot freed was never claimed"
        assert store.get(second[0]).result == 5
    finally:
        pool.stop(10)

