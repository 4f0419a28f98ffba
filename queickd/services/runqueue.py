"""The worker pool's run queue: claimed jobs handed to idle worker threads, one wake-up per
job.

queue.SimpleQueue wakes two threads for each item put while several wait: the getter that
takes it releases the queue's lock on its way out, which wakes the next waiter, who finds
nothing and sleeps again. On a pool of idle threads that second thread takes the GIL
from the one about to run the job (measured here: the job of a lone enqueue started
0.2-0.3 ms later for it). Here each idle thread waits on a lock of its own, and a put
releases exactly one: the thread that went idle last (its stack and caches are the
warmest). Items are taken in the order they were put; None is an item like any other
(the pool's "one thread exits").
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class _Waiter:
    __slots__ = ("lock", "item")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()  # held until a put hands this waiter its item
        self.item: object = None


class RunQueue(Generic[T]):
    """A FIFO of items for threads that block in get(); safe from any thread."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._items: deque[T] = deque()
        self._idle: list[_Waiter] = []  # waiting threads, the last to go idle at the end

    def put(self, item: T) -> None:
        with self._mutex:
            if not self._idle:
                self._items.append(item)
                return
            waiter = self._idle.pop()
            waiter.item = item
        waiter.lock.release()  # wakes that one thread, and no other

    def get(self) -> T:
        with self._mutex:
            if self._items:
                return self._items.popleft()
            waiter = _Waiter()
            self._idle.append(waiter)
        waiter.lock.acquire()
        return waiter.item  # type: ignore[return-value]

    def qsize(self) -> int:
        with self._mutex:
            return len(self._items)
