"""The worker pool's run queue: FIFO hand-off to idle threads, one wake-up per item."""

from __future__ import annotations

import threading
import time

from queickd.services.runqueue import RunQueue


def _switches(tid: int) -> int:
    """Voluntary context switches of one thread of this process (a wake-up from a wait)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def _wait_until(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_items_put_before_any_get_come_out_in_order_none_included():
    q: RunQueue[int | None] = RunQueue()
    for item in (1, 2, None, 3):
        q.put(item)
    assert q.qsize() == 4
    assert [q.get() for _ in range(4)] == [1, 2, None, 3]


def test_a_put_wakes_exactly_one_of_several_idle_threads():
    q: RunQueue[int | None] = RunQueue()
    got: dict[int, list[int | None]] = {}
    ready = threading.Barrier(5)

    def worker() -> None:
        mine = got.setdefault(threading.get_native_id(), [])
        ready.wait()
        while (item := q.get()) is not None:
            mine.append(item)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    ready.wait()
    _wait_until(lambda: len(q._idle) == 4)  # all four blocked in get()
    before = {tid: _switches(tid) for tid in got}
    q.put(7)
    _wait_until(lambda: sum(len(v) for v in got.values()) == 1)
    _wait_until(lambda: len(q._idle) == 4)  # the taker is back waiting
    woken = [tid for tid in got if _switches(tid) != before[tid]]
    assert len(woken) == 1 and got[woken[0]] == [7]  # no other thread was woken to find nothing
    for _ in threads:
        q.put(None)
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)


def test_each_item_goes_to_one_thread_only_under_concurrent_puts():
    q: RunQueue[int | None] = RunQueue()
    taken: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        while (item := q.get()) is not None:
            with lock:
                taken.append(item)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    putters = [threading.Thread(target=lambda base=b: [q.put(base + i) for i in range(500)]) for b in (0, 1000)]
    for p in putters:
        p.start()
    for p in putters:
        p.join()
    for _ in threads:
        q.put(None)
    for t in threads:
        t.join(5)
    assert sorted(taken) == [*range(500), *range(1000, 1500)]
