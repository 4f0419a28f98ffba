"""The async runner (run/aio.py) on its real event loop thread: what a run of an awaitable
reports, and a cancel that comes before its task has taken a step."""

from __future__ import annotations

import asyncio
import queue
import threading
from pathlib import Path

from test_fate import make_job

from queickd.run.aio import LoopRunner
from queickd.run.base import RunReport
from queickd.run.loader import FunctionLoader
from queickd.run.thread import ThreadRunner

JOBS = str(Path(__file__).parent / "jobs")


def _started(runner: LoopRunner, call, timeout=None, job_id=7) -> queue.SimpleQueue[RunReport]:
    reports: queue.SimpleQueue[RunReport] = queue.SimpleQueue()
    runner.start(make_job(id=job_id), call, timeout, reports.put)
    return reports


def test_a_cancel_before_the_task_has_run_still_ends_it_cancelled():
    runner = LoopRunner()
    reports = _started(runner, lambda: asyncio.sleep(600))
    assert runner.cancel(7)  # queued on the loop right behind its start
    report = reports.get(timeout=20)
    assert (report.ok, report.error_type) == (False, "cancelled")
    assert runner.stopping() == frozenset()


def test_a_timeout_cancels_the_task_and_reports_timeout():
    runner = LoopRunner()
    report = _started(runner, lambda: asyncio.sleep(600), timeout=0.05).get(timeout=20)
    assert (report.error_type, report.permanent) == ("timeout", False)
    assert "CancelledError" in report.traceback


def test_an_awaited_coroutine_that_gives_a_coroutine_is_awaited_again():
    async def inner():
        return 5

    async def outer():
        return inner()

    report = _started(LoopRunner(), outer).get(timeout=20)
    assert (report.ok, report.result) == (True, 5)


def test_a_job_that_swallows_its_cancel_is_cancelled_again():
    swallowed = []
    began = threading.Event()

    async def stubborn():
        began.set()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            swallowed.append(True)
        await asyncio.sleep(600)  # the next cancel ends it here

    runner = LoopRunner()
    reports = _started(runner, stubborn)
    assert began.wait(20)  # its cancel comes while it runs, not before its first step
    runner.cancel(7)
    assert reports.get(timeout=20).error_type == "cancelled" and swallowed == [True]


def test_a_thread_run_awaits_what_a_plain_function_returned_within_its_timeout():
    runner = ThreadRunner(FunctionLoader(JOBS))
    assert runner.run(make_job(func="asyncjobs:returns_a_coroutine", args=[1, 2])).result == 3
    report = runner.run(make_job(func="asyncjobs:returns_a_long_sleep"), timeout=0.05)
    assert (report.ok, report.error_type) == (False, "timeout")
    assert runner.stopping() == frozenset()


def test_an_early_cancel_stops_the_run_before_its_function_is_called_however_the_threads_interleave():
    runner = LoopRunner()
    called = threading.Event()

    def early(job_id: int) -> bool:
        # The starting thread is slow here: everything the loop has queued so far runs first
        # (as when that thread is descheduled right there).
        caught_up = threading.Event()
        runner._started().call_soon_threadsafe(caught_up.set)
        assert caught_up.wait(20)
        return True

    runner.cancelled_early = early

    async def job():
        called.set()
        await asyncio.sleep(600)

    report = _started(runner, job).get(timeout=20)
    assert (report.ok, report.error_type) == (False, "cancelled")
    assert not called.is_set()


def test_a_task_that_blocks_the_loop_past_its_timeout_is_reported_timed_out():
    import time

    async def blocking():
        time.sleep(0.3)  # blocks the loop: its timeout's timer cannot fire meanwhile
        return "done"

    report = _started(LoopRunner(), blocking, timeout=0.05).get(timeout=20)
    assert (report.ok, report.error_type) == (False, "timeout")
