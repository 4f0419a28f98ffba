"""The adaptive worker pool: it grows to its maximum under a backlog, on the events that
wake it, and shrinks back to its minimum once the queue has been quiet for the grace
(an injected clock), with no timer left at the minimum; the flags on a real daemon."""

from __future__ import annotations

import threading
from pathlib import Path

from store_contract import T0, job

from queickd.core.job import State
from queickd.run.loader import FunctionLoader
from queickd.services.pool_config import DEFAULT_CONFIG, PoolHooks
from queickd.services.pool_size import PoolSize, adaptive_size
from queickd.services.worker import WorkerPool
from queickd.store import open_store

JOBS = str(Path(__file__).parent / "jobs")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _timer_alive() -> bool:
    return any(t.name == "queickd-pool-size" and t.is_alive() for t in threading.enumerate())


def test_flags_alone_give_a_fixed_size_and_bounds_an_adaptive_one():
    assert not adaptive_size(4, None, None, 60).adaptive
    s = adaptive_size(4, 1, 8, 60)
    assert (s.min, s.max, s.adaptive) == (1, 8, True)
    assert (adaptive_size(2, 3, None, 60).min, adaptive_size(2, 3, None, 60).max) == (3, 3)


def test_the_pool_grows_to_its_maximum_under_a_backlog_and_back_to_its_minimum_after_the_grace(gate):
    clock = Clock()
    store = open_store("memory://")
    finished = threading.Semaphore(0)
    pool = WorkerPool(store, FunctionLoader(JOBS), DEFAULT_CONFIG,
                      PoolHooks(on_finished=lambda outcomes: [finished.release() for _ in outcomes]),
                      clock=clock, size=PoolSize(1, 4, 30, clock=clock))
    pool.start()
    try:
        assert pool.workers == 1
        store.submit([job(func="testjobs:gate", args=[gate.port, f"g{i}"], run_at=clock.now) for i in range(6)],
                     clock.now)
        pool.wake()
        arrived = {gate.arrival() for _ in range(4)}  # four run at once: it grew, one by one
        assert len(arrived) == 4 and pool.workers == 4
        assert pool.size_info()["last_resize"]["to"] == 4
        gate.release_all()
        assert {gate.arrival(), gate.arrival()} == {"g0", "g1", "g2", "g3", "g4", "g5"} - arrived
        gate.release_all()
        for _ in range(6):
            assert finished.acquire(timeout=20)
        clock.now += 29
        assert pool.shrink_if_idle(clock.now) == 4  # not quiet for the grace yet
        clock.now += 2
        sizes = [pool.shrink_if_idle(clock.now) for _ in range(4)]
        assert sizes[-1] == 1 and pool.size_info()["last_resize"]["reason"] == "idle for the grace"
    finally:
        pool.stop(10)
    assert [j.state for j in store.list_jobs(None, 10)] == [State.SUCCEEDED] * 6


def test_a_pool_at_its_minimum_keeps_no_timer():
    clock = Clock()
    store = open_store("memory://")
    done = threading.Event()
    pool = WorkerPool(store, FunctionLoader(JOBS), DEFAULT_CONFIG, PoolHooks(on_finished=lambda outcomes: done.set()),
                      clock=clock, size=PoolSize(2, 4, 30, clock=clock))
    pool.start()
    try:
        store.submit([job(func="testjobs:noop", run_at=clock.now)], clock.now)
        pool.wake()
        assert done.wait(10)
        assert pool.workers == 2 and not _timer_alive()  # never grew: nothing to shrink
    finally:
        pool.stop(10)


def test_the_daemon_grows_under_a_backlog_and_shrinks_after_the_idle_grace(start_daemon, gate):
    d = start_daemon(None, "--min-workers", "1", "--max-workers", "3", "--idle-grace", "0.5")
    with d.client() as q:
        assert q.stats()["workers"]["size"] == 1
        ids = [q.enqueue("testjobs:gate", [gate.port, f"g{i}"]) for i in range(3)]
        assert len({gate.arrival() for _ in ids}) == 3
        w = q.stats()["workers"]
        assert (w["size"], w["min"], w["max"], w["busy"]) == (3, 1, 3, 3)
        gate.release_all()
        for i in ids:
            q.wait(i, 20)
        d.wait_for_line(r"worker pool shrinks to 1", timeout=20)
        assert q.stats()["workers"]["size"] == 1


def test_the_pool_does_not_grow_when_one_more_typical_job_would_not_fit(gate, tmp_path):
    from test_memory_gate import MB, fake_tree

    from queickd.services.memory_gate import MemoryGate

    fake_tree(tmp_path, v2=(1000 * MB, 900 * MB, 0))  # 100 MB free, 64 reserved
    clock = Clock()
    store = open_store("memory://")
    store.record_runs([("testjobs:gate", 200 * MB, 1.0, False, False)], clock.now)  # a big function
    pool = WorkerPool(store, FunctionLoader(JOBS), clock=clock, size=PoolSize(1, 4, 30, clock=clock),
                      memory=MemoryGate(store, root=str(tmp_path)))
    pool.start()
    try:
        store.submit([job(func="testjobs:gate", args=[gate.port, f"g{i}"], run_at=clock.now) for i in range(2)],
                     clock.now)
        pool.wake()
        assert gate.arrival() == "g0"  # alone on the worker: it starts although it may not fit
        assert pool.workers == 1 and not pool._can_grow()
        assert pool.memory.snapshot()["deferred"] == {"memory": 1}  # the one asked for a new worker
    finally:
        gate.release_all()
        pool.stop(10)


class _GrowsAsItReachesItsMinimum:
    """A pool for a PoolSize's timer: the first time a shrink takes it to its minimum, it
    grows by one on another thread after the shrink read its size and before the timer
    looks at it (a pass's growth, landing in that window)."""

    def __init__(self, size: PoolSize, workers: int) -> None:
        self.size, self.workers = size, workers
        self.grew = False
        self.back_at_minimum = threading.Event()  # set when a shrink after the growth reaches it

    def shrink(self, now: float) -> int:
        if self.size.due(self.workers, now):
            self.workers -= 1
        seen = self.workers
        if seen == self.size.min and not self.grew:
            self.grew = True
            grow = threading.Thread(target=self._grow)
            grow.start()
            grow.join()
        elif seen == self.size.min:
            self.back_at_minimum.set()
        return seen  # read before the growth

    def _grow(self) -> None:
        self.workers += 1
        self.size.start_timer(self.shrink)


def test_a_growth_while_the_timer_shrinks_to_the_minimum_keeps_the_timer_until_it_is_back_there():
    clock = Clock()
    size = PoolSize(1, 3, 0, clock=clock)
    pool = _GrowsAsItReachesItsMinimum(size, 2)
    size.start_timer(pool.shrink)
    timer = size._thread
    try:
        assert pool.back_at_minimum.wait(10)  # the growth was shrunk again
        assert timer is not None
        timer.join(10)
        assert not _timer_alive() and pool.workers == 1
    finally:
        size.stop()
