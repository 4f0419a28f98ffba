"""The alarm clock of `queick worker` (services/alarm.py): calls its action at the times it
is given, earliest first, once for times due together, and never after stop()."""

from __future__ import annotations

import threading
import time

from queickd.services.alarm import Alarm


def test_a_time_that_has_passed_fires_at_once():
    fired = threading.Event()
    a = Alarm(fired.set)
    a.at(time.time() - 5)
    try:
        assert fired.wait(5)
    finally:
        a.stop()


def test_times_fire_in_order_whatever_order_they_were_given_in():
    now = [100.0]
    seen: list[float] = []
    fired = threading.Semaphore(0)
    a = Alarm(lambda: (seen.append(now[0]), fired.release()), clock=lambda: now[0])
    try:
        a.at(103.0)
        a.at(101.0)
        assert not fired.acquire(timeout=0.2)  # nothing is due yet at 100
        for t in (101.0, 103.0):
            now[0] = t
            with a._cond:
                a._cond.notify()  # a fake clock does not end the wait by itself
            assert fired.acquire(timeout=5)
        assert seen == [101.0, 103.0]
    finally:
        a.stop()


def test_times_due_together_fire_once():
    calls = []
    done = threading.Event()
    now = [50.0]
    a = Alarm(lambda: (calls.append(1), done.set()), clock=lambda: now[0])
    try:
        for t in (10.0, 20.0, 30.0):  # all before now, given before the thread looks
            a._times.append(t)
        a.at(40.0)
        assert done.wait(5)
        a.at(10_000.0)  # not due: the thread waits again, nothing more fires
        assert calls == [1]
    finally:
        a.stop()


def test_nothing_fires_after_stop():
    fired = threading.Event()
    now = [0.0]
    a = Alarm(fired.set, clock=lambda: now[0])
    a.at(1.0)
    a.stop()
    now[0] = 2.0
    assert not fired.wait(0.2)


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_only_a_time_earlier_than_every_pending_one_wakes_the_thread():
    # A rate key's claims report its next opening at every pass, hundreds a second: a wake
    # of the alarm's thread for each would cost the daemon more than the claims themselves.
    a = Alarm(lambda: None, clock=lambda: 0.0)
    a._cond = cond = _CountingCondition()
    try:
        a.at(100.0)
        for i in range(100):
            a.at(100.0)  # pending already
            a.at(200.0 + i)  # later than the earliest: the thread's wait stands
        assert cond.notified == 1
        a.at(50.0)
        assert cond.notified == 2
    finally:
        a.stop()
