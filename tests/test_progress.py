"""A running job's progress (queickd.progress) against real daemons: what a job reports is
visible in `get` while it runs, in a thread or in a process; repeats are dropped before
they reach the store; `queick show` and `queick jobs` show it; current_job() in a process
job."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import queickd
from queickd.core.job import State

ISOLATIONS = ["thread", "process"]


def _until_progress(q, job_id, done, timeout=20.0):
    """`get` until the job's progress says `done` (the daemon writes it within a fraction of
    a second); a bounded wait on the daemon's answers, no sleep."""
    end = time.monotonic() + timeout
    while True:
        got = q.get(job_id)
        if got["progress"] is not None and got["progress"]["done"] == done:
            return got
        assert time.monotonic() < end, f"no progress {done} after {timeout} s: {got['progress']}"


def test_progress_outside_a_job_returns_false():
    assert queickd.current_job() is None
    assert queickd.progress(1, 10, "not in a job") is False


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_progress_is_visible_in_get_while_the_job_runs(daemon, gate, isolation):
    with daemon.client() as q:
        before = time.time()
        job = q.enqueue("progressjobs:report_then_gate", (gate.port, 42, 100, "copying é"), isolation=isolation)
        assert gate.arrival() == "reported"
        got = _until_progress(q, job, 42)
        assert got["state"] == State.RUNNING
        p = got["progress"]
        assert (p["done"], p["total"], p["note"], p["attempt"]) == (42, 100, "copying é", 1)
        assert before <= p["at"] <= time.time()
        gate.release_all()
        done = q.wait(job, 30)
    assert done["result"] is True  # progress() said it was handed over
    assert done["progress"]["done"] == 42  # kept once the run is over


def test_progress_of_an_async_job_is_visible_in_get_while_it_runs(daemon, gate):
    with daemon.client() as q:
        job = q.enqueue("progressjobs:areport_then_gate", (gate.port, 7, 9, "awaiting"))
        assert gate.arrival() == "reported"
        p = _until_progress(q, job, 7)["progress"]
        assert (p["done"], p["total"], p["note"]) == (7, 9, "awaiting")
        gate.release_all()
        assert q.wait(job, 30)["result"] is True


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_finished_job_keeps_the_last_progress_it_said(daemon, isolation):
    with daemon.client() as q:
        done = q.wait(q.enqueue("progressjobs:count_up", (1000,), isolation=isolation), 30)
    assert done["state"] == State.SUCCEEDED
    p = done["progress"]
    assert (p["done"], p["total"]) == (1000, 1000)  # not the first step, written while the rest came


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_unchanged_progress_is_not_written_again(daemon, gate, isolation):
    with daemon.client() as q:
        job = q.enqueue("progressjobs:repeat_then_gate", (gate.port, 1000), isolation=isolation)
        assert gate.arrival() == "first"
        _until_progress(q, job, 1)
        assert q.stats()["progress"] == {"offered": 1, "written": 1, "batches": 1}
        gate.release_first()
        assert gate.arrival() == "second"
        _until_progress(q, job, 2)
        # 2,001 calls, two changes: two values reached the daemon, two rows were written.
        assert q.stats()["progress"] == {"offered": 2, "written": 2, "batches": 2}
        gate.release_all()
        assert q.wait(job, 30)["state"] == State.SUCCEEDED


def test_a_job_reporting_every_step_is_written_a_few_times_a_second(daemon):
    with daemon.client() as q:
        done = q.wait(q.enqueue("progressjobs:count_up", (200_000,)), 60)
        stats = q.stats()["progress"]
    assert done["result"] == 200_000
    assert stats["offered"] == 200_000  # each a change
    runtime = done["finished_at"] - done["started_at"]
    # One write, then at most one per 0.25 s of the run (and one that came after it).
    assert 1 <= stats["batches"] <= 2 + runtime / 0.25


def _queick(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_queick_show_and_jobs_show_progress(daemon, gate):
    with daemon.client() as q:
        job = q.enqueue("progressjobs:report_then_gate", (gate.port, 3, 4, "third file"))
        assert gate.arrival() == "reported"
        _until_progress(q, job, 3)
        shown = _queick("show", str(job), "--port", str(daemon.port))
        listed = _queick("jobs", "--state", "running", "--port", str(daemon.port))
        gate.release_all()
        q.wait(job, 30)
    assert "progress: 3/4 (75%) third file  (said " in shown
    (row,) = [line for line in listed.splitlines() if line.strip().startswith(str(job))]
    assert row.endswith("progressjobs:report_then_gate  3/4 (75%) third file")


def test_current_job_gives_id_attempt_and_deadline_in_a_process_job(daemon):
    with daemon.client() as q:
        job = q.enqueue("progressjobs:current_on_attempt", (2,), isolation="process", timeout=60,
                        retry=True, retry_type="constant", max_attempts=3)
        done = q.wait(job, 60)
    job_id, attempt, deadline = done["result"]
    assert (job_id, attempt) == (job, 2)
    assert done["started_at"] < deadline <= done["started_at"] + 61


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_progress_on_postgresql_is_visible_while_the_job_runs_and_kept_after(start_daemon, pg_url, gate, isolation):
    d = start_daemon(pg_url)
    with d.client() as q:
        job = q.enqueue("progressjobs:report_then_gate", (gate.port, 5, 8, "pg"), isolation=isolation)
        assert gate.arrival() == "reported"
        assert _until_progress(q, job, 5)["state"] == State.RUNNING
        gate.release_all()
        assert q.wait(job, 30)["progress"]["note"] == "pg"
        counted = q.wait(q.enqueue("progressjobs:count_up", (1000,), isolation=isolation), 30)
    assert (counted["progress"]["done"], counted["state"]) == (1000, State.SUCCEEDED)


def test_a_queick_worker_stores_the_progress_of_the_jobs_it_runs(start_daemon, start_worker, pg_url, gate):
    d = start_daemon(pg_url, workers=0)  # the jobs run in the worker process only
    start_worker(pg_url)
    with d.client() as q:
        job = q.enqueue("progressjobs:report_then_gate", (gate.port, 1, 2, "in a worker"))
        assert gate.arrival() == "reported"
        assert _until_progress(q, job, 1)["progress"]["note"] == "in a worker"
        gate.release_all()
        assert q.wait(job, 30)["state"] == State.SUCCEEDED
