"""Stopping thread jobs against a real daemon: a cancel and a timeout interrupt a job's
Python code in its thread, the job can see its cancel (queickd.current_job()), a call
blocked in C holds its worker until it returns (and a stop does not wait for it), and a
cancelled process job is logged as cancelled."""

from __future__ import annotations

import re

import pytest
from helpers import read_lines

from queickd.core.job import State


@pytest.fixture
def one_worker(start_daemon):
    return start_daemon(workers=1)


def test_cancel_interrupts_a_running_thread_job(one_worker, gate, tmp_path):
    out = tmp_path / "out"
    with one_worker.client() as q:
        job = q.enqueue("testjobs:python_loop", (gate.port, str(out), 600))
        assert gate.arrival() == "looping"
        assert q.cancel(job)["state"] == State.CANCELLED
        one_worker.wait_for_line(rf"job {job} testjobs:python_loop cancelled: its run ended")
        # Its one worker is free again: the next job runs (the loop had ten minutes to go).
        assert q.wait(q.enqueue("testjobs:add", (2, 3)), 20)["result"] == 5
        assert read_lines(out) == ["interrupted JobInterrupted"]
        assert q.get(job)["state"] == State.CANCELLED


def test_a_cancel_that_comes_before_the_thread_job_is_called_still_stops_it(start_daemon, gate, tmp_path):
    d = start_daemon(workers=1, env={"QUEICKD_TEST_IMPORT_GATE": str(gate.port)})
    out = tmp_path / "out"
    with d.client() as q:
        job = q.enqueue("slowimport:loop", (str(out), 600))
        assert gate.arrival() == "importing"  # claimed, its worker importing the module
        assert q.cancel(job)["state"] == State.CANCELLED
        gate.release_all()
        d.wait_for_line(rf"job {job} slowimport:loop cancelled: its run ended")
        assert q.wait(q.enqueue("testjobs:add", (2, 3)), 20)["result"] == 5  # its worker is free
    assert read_lines(out) == ["interrupted JobInterrupted"]


def test_thread_job_timeout_records_dead_timeout(daemon, gate, tmp_path):
    out = tmp_path / "out"
    with daemon.client() as q:
        job = q.enqueue("testjobs:python_loop", (gate.port, str(out), 600), isolation="thread", timeout=0.5)
        assert gate.arrival() == "looping"
        done = q.wait(job, 30)
    assert (done["state"], done["error"]["type"]) == (State.DEAD, "timeout")
    assert "timeout of 0.5 s" in done["error"]["message"] and "python_loop" in done["error"]["traceback"]
    assert read_lines(out) == ["interrupted JobInterrupted"]
    assert daemon.wait_for_line(rf"job {job} testjobs:python_loop failed .*: timeout: .* -> dead")


def test_a_thread_job_that_swallows_the_interruption_is_interrupted_again(daemon, gate, tmp_path):
    out = tmp_path / "out"
    with daemon.client() as q:
        job = q.enqueue("testjobs:stubborn", (gate.port, str(out), 600), isolation="thread", timeout=0.3)
        assert gate.arrival() == "looping"
        done = q.wait(job, 30)
    assert (done["state"], done["error"]["type"]) == (State.DEAD, "timeout")
    assert read_lines(out) == ["interrupted JobInterrupted"]  # the second one ended it in stubborn's loop
    assert "stubborn" in done["error"]["traceback"]


def test_a_function_table_gives_its_thread_jobs_a_timeout(start_daemon, gate, tmp_path):
    config = tmp_path / "q.toml"
    config.write_text('[functions."testjobs:python_loop"]\nisolation = "thread"\ntimeout = 0.3\n')
    d = start_daemon(None, "--config", str(config))
    with d.client() as q:
        job = q.enqueue("testjobs:python_loop", (gate.port, str(tmp_path / "out"), 600))
        assert gate.arrival() == "looping"
        done = q.wait(job, 30)
        assert done["error"]["type"] == "timeout"
        assert q.stats()["sandbox"]["runs"] == {"thread": 1, "process": 0}


def test_current_job_cancelled_lets_a_job_stop_itself(daemon, gate, tmp_path):
    out = tmp_path / "out"
    with daemon.client() as q:
        job = q.enqueue("testjobs:until_cancelled", (gate.port, str(out), 600))
        assert gate.arrival() == "checking"
        q.cancel(job)
        daemon.wait_for_line(rf"job {job} testjobs:until_cancelled cancelled")
        assert read_lines(out) == [f"job {job} attempt 1 saw cancelled"]
        assert q.get(job)["state"] == State.CANCELLED


def test_current_job_tells_a_job_its_id_attempt_and_deadline(daemon):
    with daemon.client() as q:
        untimed = q.wait(q.enqueue("testjobs:current"), 20)
        timed = q.wait(q.enqueue("testjobs:current", isolation="thread", timeout=60), 20)
        in_process = q.wait(q.enqueue("testjobs:current", isolation="process", timeout=60), 30)
    assert untimed["result"] == [untimed["id"], 1, None, False]
    for done in (timed, in_process):
        job_id, attempt, deadline, cancelled = done["result"]
        assert (job_id, attempt, cancelled) == (done["id"], 1, False)
        assert done["started_at"] < deadline <= done["started_at"] + 61


def test_a_cancelled_thread_job_blocked_in_c_holds_its_worker_as_stopping_until_it_returns(one_worker, gate):
    with one_worker.client() as q:
        job = q.enqueue("testjobs:gate", (gate.port, "held"))  # blocked in a socket read: C
        assert gate.arrival() == "held"
        q.cancel(job)
        nxt = q.enqueue("testjobs:add", (2, 3))
        w = q.stats()["workers"]
        assert (w["busy"], w["stopping"]) == (1, 1)
        assert q.get(nxt)["state"] == State.QUEUED  # its slot is still taken
        gate.release_all()  # the read returns; the interruption comes there
        assert q.wait(nxt, 20)["result"] == 5
        one_worker.wait_for_line(rf"job {job} testjobs:gate cancelled")
        assert q.stats()["workers"]["stopping"] == 0


def test_stop_does_not_wait_for_a_cancelled_thread_job(start_daemon, gate, tmp_path):
    db = f"sqlite:///{tmp_path / 'queue.db'}"
    d = start_daemon(db, "--stop-timeout", "600")
    with d.client() as q:
        job = q.enqueue("testjobs:gate", (gate.port, "held"))  # blocked in C: no interruption lands
        assert gate.arrival() == "held"
        q.cancel(job)
    d.terminate(timeout=60)  # the stop would wait its ten minutes for a job still counted running
    log = "".join(d.lines)
    assert "1 cancelled job(s) still in their call at exit" in log
    assert "recovered as orphans" not in log
    again = start_daemon(db)
    with again.client() as q:
        after = q.get(job)
    assert (after["state"], after["orphaned"]) == (State.CANCELLED, 0)
    assert "recovered jobs left running" not in "".join(again.lines)


def test_a_thread_job_still_running_at_the_stop_timeout_is_logged_and_recovered_as_an_orphan(
        start_daemon, gate, tmp_path):
    db = f"sqlite:///{tmp_path / 'queue.db'}"
    d = start_daemon(db, "--stop-timeout", "0.2")
    with d.client() as q:
        job = q.enqueue("testjobs:gate", (gate.port, "held"))
        assert gate.arrival() == "held"
    d.terminate(timeout=60)
    assert re.search(r"1 job\(s\) still running at the stop timeout; they stay running in the store and are "
                     r"recovered as orphans on the next start", "".join(d.lines))
    again = start_daemon(db)
    again.wait_for_line(r"recovered jobs left running by a previous run: 1 re-queued")
    with again.client() as q:
        assert q.get(job)["orphaned"] == 1


def test_cancelled_process_job_logs_cancelled(daemon, gate, tmp_path):
    with daemon.client() as q:
        job = q.enqueue("testjobs:python_loop", (gate.port, str(tmp_path / "out"), 600), isolation="process")
        assert gate.arrival() == "looping"
        q.cancel(job)
        daemon.wait_for_line(rf"job {job} testjobs:python_loop cancelled: its run ended", 30)
        assert q.wait(q.enqueue("testjobs:noop", isolation="process"), 30)["state"] == State.SUCCEEDED
    assert not [line for line in daemon.lines if f"job {job} " in line and "-> " in line]


def test_cancel_interrupts_a_running_thread_job_on_postgresql(pg_fresh_database, start_daemon, gate, tmp_path):
    d = start_daemon(pg_fresh_database, workers=1)
    with d.client() as q:
        job = q.enqueue("testjobs:python_loop", (gate.port, str(tmp_path / "out"), 600))
        assert gate.arrival() == "looping"
        q.cancel(job)
        d.wait_for_line(rf"job {job} testjobs:python_loop cancelled: its run ended")
        assert q.wait(q.enqueue("testjobs:add", (2, 3)), 20)["result"] == 5
        after = q.get(job)
    assert (after["state"], after["error"], after["result"]) == (State.CANCELLED, None, None)
