"""The event loop's inbox: calls from other threads run on the loop's thread, in order,
and calls made before the loop gets to them share one wake-up."""

import asyncio
import threading

import pytest

from queickd.api.inbox import Inbox


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _counting_wakeups(loop, monkeypatch) -> list[int]:
    wakeups: list[int] = []
    real = loop.call_soon_threadsafe

    def counted(*a, **kw):
        wakeups.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    return wakeups


def test_calls_from_another_thread_run_on_the_loop_thread_in_order(loop):
    inbox, ran, all_ran = Inbox(loop), [], threading.Event()

    def record(i: int) -> None:
        ran.append((i, threading.get_ident()))
        if len(ran) == 100:
            all_ran.set()

    for i in range(100):
        inbox.call(record, i)
    assert all_ran.wait(10)
    assert [i for i, _ in ran] == list(range(100))
    loop_thread = next(t for t in threading.enumerate() if t.ident == ran[0][1])
    assert {t for _, t in ran} == {loop_thread.ident} and loop_thread is not threading.current_thread()


def test_calls_made_before_the_loop_drains_share_one_wakeup(loop, monkeypatch):
    inbox, ran, done = Inbox(loop), [], threading.Event()
    held = threading.Event()
    loop.call_soon_threadsafe(held.wait, 10)  # the loop is busy while the calls come
    wakeups = _counting_wakeups(loop, monkeypatch)
    for i in range(12):  # a commit's dozen answers
        inbox.call(ran.append, i)
    inbox.call(done.set)
    held.set()
    assert done.wait(10)
    assert ran == list(range(12))
    assert len(wakeups) == 1


def test_a_call_after_a_drain_wakes_the_loop_again(loop, monkeypatch):
    inbox, first, second = Inbox(loop), threading.Event(), threading.Event()
    wakeups = _counting_wakeups(loop, monkeypatch)
    inbox.call(first.set)
    assert first.wait(10)
    inbox.call(second.set)
    assert second.wait(10)
    assert len(wakeups) == 2


def test_a_closed_loop_refuses_calls_as_call_soon_threadsafe_does():
    loop = asyncio.new_event_loop()
    loop.close()
    inbox = Inbox(loop)
    with pytest.raises(RuntimeError):
        inbox.call(print)
    with pytest.raises(RuntimeError):  # not left believing a drain is on its way
        inbox.call(print)
