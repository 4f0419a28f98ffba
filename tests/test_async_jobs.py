"""Async jobs against real daemons: an `async def` job (or a plain function's returned
awaitable) is awaited, in a thread job's place on the daemon's event loop and in a process
job's child; its awaited value is its result (never a coroutine object); a timeout and a
cancel cancel its task; and many run at once beside the worker threads, which they leave to
sync jobs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import read_lines

from queickd.core.job import State


def test_an_async_job_result_is_its_awaited_value(daemon):
    with daemon.client() as q:
        job = q.wait(q.enqueue("asyncjobs:aadd", [1, 2]), 20)
    assert (job["state"], job["result"]) == (State.SUCCEEDED, 3)


def test_a_sync_function_returning_an_awaitable_is_awaited(daemon):
    with daemon.client() as q:
        job = q.wait(q.enqueue("asyncjobs:returns_a_coroutine", [1, 2]), 20)
    assert (job["state"], job["result"]) == (State.SUCCEEDED, 3)
    daemon.terminate()
    assert not any("never awaited" in line for line in daemon.lines)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_coroutine_object_is_never_stored_as_a_result(start_daemon, isolation):
    d = start_daemon(None, "--isolation", isolation)
    with d.client() as q:
        job = q.wait(q.enqueue("asyncjobs:gives_a_coroutine", [2, 3]), 20)
    assert (job["state"], job["result"]) == (State.SUCCEEDED, 5)  # the coroutine it gave, awaited too


def test_an_async_job_in_a_process_is_awaited(start_daemon):
    d = start_daemon(None, "--isolation", "process")
    with d.client() as q:
        job = q.wait(q.enqueue("asyncjobs:aadd", [1, 2]), 20)
        assert (job["state"], job["result"]) == (State.SUCCEEDED, 3)
        job = q.wait(q.enqueue("asyncjobs:returns_a_coroutine", [3, 4]), 20)
        assert (job["state"], job["result"]) == (State.SUCCEEDED, 7)
        assert q.stats()["sandbox"]["runs"]["process"] == 2


def test_an_async_job_times_out_dead_timeout(daemon, gate, tmp_path):
    out = tmp_path / "out"
    with daemon.client() as q:
        job = q.enqueue("asyncjobs:announce_then_sleep", (gate.port, str(out)), isolation="thread", timeout=0.5)
        assert gate.arrival() == f"sleeping {job}"
        done = q.wait(job, 30)
    assert (done["state"], done["error"]["type"]) == (State.DEAD, "timeout")
    assert "timeout of 0.5 s" in done["error"]["message"] and "announce_then_sleep" in done["error"]["traceback"]
    assert read_lines(out) == ["stopped CancelledError cancelled=False"]
    assert daemon.wait_for_line(rf"job {job} asyncjobs:announce_then_sleep failed .*: timeout: .* -> dead")


def test_cancel_cancels_a_running_async_job(start_daemon, gate, tmp_path):
    out = tmp_path / "out"
    d = start_daemon(workers=1)
    with d.client() as q:
        first = q.enqueue("asyncjobs:announce_then_sleep", (gate.port, str(out)))
        assert gate.arrival() == f"sleeping {first}"
        again = q.enqueue("asyncjobs:announce_then_sleep", (gate.port, str(out)))  # on the loop at once
        assert gate.arrival() == f"sleeping {again}"
        for job in (first, again):
            assert q.cancel(job)["state"] == State.CANCELLED
            d.wait_for_line(rf"job {job} asyncjobs:announce_then_sleep cancelled: its run ended")
        assert q.wait(q.enqueue("testjobs:add", (2, 3)), 20)["result"] == 5
    assert read_lines(out) == ["stopped CancelledError cancelled=True"] * 2


def test_a_cancel_that_comes_before_the_async_job_starts_still_stops_it(start_daemon, gate, tmp_path):
    d = start_daemon(workers=1, env={"QUEICKD_TEST_IMPORT_GATE": str(gate.port)})
    out = tmp_path / "out"
    with d.client() as q:
        job = q.enqueue("slowimport:aloop", (str(out), 600))
        assert gate.arrival() == "importing"  # claimed, its worker importing the module
        assert q.cancel(job)["state"] == State.CANCELLED
        gate.release_all()
        d.wait_for_line(rf"job {job} slowimport:aloop cancelled: its run ended")
        assert q.wait(q.enqueue("testjobs:add", (2, 3)), 20)["result"] == 5
    assert not out.exists()  # stopped before its function was called


def test_200_async_sleeps_run_at_once_on_4_slots(start_daemon):
    # Each job returns only once all 200 have arrived: they ran at once, not 4 at a time.
    d = start_daemon(None, "--async-jobs", "200", workers=4)
    with d.client() as q:
        ids = [q.enqueue("asyncjobs:meet", ["all", 200]) for _ in range(200)]
        done = [q.wait(i, 90) for i in ids]
    assert {j["state"] for j in done} == {State.SUCCEEDED}
    assert {j["result"] for j in done} == {200}


def test_async_jobs_do_not_take_thread_slots_from_sync_jobs(start_daemon):
    d = start_daemon(None, "--async-jobs", "20", workers=1)
    with d.client() as q:
        waiting = [q.enqueue("asyncjobs:wait_open", ["door"]) for _ in range(20)]
        for job in waiting:  # all 20 claimed and running with one worker thread
            assert q.wait(job, 20, states=[State.RUNNING])["state"] == State.RUNNING
        # The one thread is free: the sync job that lets them through runs.
        assert q.wait(q.enqueue("asyncjobs:open_door", ["door"]), 20)["result"] == "opened"
        assert {q.wait(j, 20)["result"] for j in waiting} == {"through"}


def test_an_async_task_takes_no_thread_slot(start_daemon):
    d = start_daemon(None, "--async-jobs", "5", workers=1)
    with d.client() as q:
        waiting = [q.enqueue("taskjobs:wait_open", ["task door"]) for _ in range(3)]
        for job in waiting:  # all 3 running with one worker thread, as plain async defs are
            assert q.wait(job, 20, states=[State.RUNNING])["state"] == State.RUNNING
        assert q.wait(q.enqueue("asyncjobs:open_door", ["task door"]), 20)["result"] == "opened"
        assert {q.wait(j, 20)["result"] for j in waiting} == {"through"}


def test_async_jobs_beyond_their_room_wait_in_threads(start_daemon):
    d = start_daemon(None, "--async-jobs", "2", workers=2)
    with d.client() as q:
        ids = [q.enqueue("asyncjobs:meet", ["four", 4]) for _ in range(4)]  # 2 on the loop, 2 in threads
        assert {q.wait(i, 60)["result"] for i in ids} == {4}


@pytest.mark.parametrize("where", ["flag", "config file"])
def test_a_negative_async_jobs_setting_is_refused_at_start(tmp_path, where):
    config = tmp_path / "q.toml"
    config.write_text("async-jobs = -1\n")
    how = ["--async-jobs", "-1"] if where == "flag" else ["--config", str(config)]
    proc = subprocess.run([sys.executable, "-m", "queickd", "--store", f"sqlite:///{tmp_path / 'q.db'}",
                           "--port", "0", *how], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78 and "async_jobs must be 0 or more" in proc.stderr


def test_async_jobs_from_the_config_file_give_their_room(start_daemon, tmp_path):
    config = tmp_path / "q.toml"
    config.write_text("async-jobs = 120\n")  # above the default 100
    d = start_daemon(None, "--config", str(config), workers=1)
    with d.client() as q:
        ids = [q.enqueue("asyncjobs:meet", ["many", 121]) for _ in range(121)]  # 120 on the loop, 1 in the thread
        assert {q.wait(i, 90)["result"] for i in ids} == {121}


def test_a_queick_worker_runs_async_jobs_beside_its_thread(pg, start_daemon, start_worker):
    url, _ = pg
    d = start_daemon(url, "--heartbeat", "0.5", workers=0)
    start_worker(url, workers=1, extra=("--async-jobs", "10"))
    with d.client() as q:
        waiting = [q.enqueue("asyncjobs:wait_open", ["pg"]) for _ in range(10)]
        for job in waiting:
            assert q.wait(job, 20, states=[State.RUNNING])["state"] == State.RUNNING
        assert q.wait(q.enqueue("asyncjobs:open_door", ["pg"]), 20)["result"] == "opened"
        assert {q.wait(j, 20)["result"] for j in waiting} == {"through"}


def test_the_daemon_never_imports_a_process_jobs_module_to_tell_if_it_is_async(start_daemon, tmp_path):
    app, imports = tmp_path / "app", tmp_path / "imports"
    app.mkdir()
    (app / "watched.py").write_text(f"import os\nwith open({str(imports)!r}, 'a') as f:\n"
                                    "    f.write(f'{os.getpid()}\\n')\n\n\nasync def f():\n    return 1\n")
    d = start_daemon(None, "--app-dir", str(app), "--isolation", "process")
    with d.client() as q:
        assert q.wait(q.enqueue("watched:f"), 20)["result"] == 1
    assert str(d.proc.pid) not in read_lines(imports)  # its child imported it, the daemon did not
