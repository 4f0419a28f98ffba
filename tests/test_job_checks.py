"""What enqueue tells of a job that cannot run, against real daemons: a function its
module does not define is refused (reload-aware), and the deaths of jobs whose function
went missing do not pause it; a job for a pool no live worker serves is accepted with a
warning. (Async jobs run: tests/test_async_jobs.py.)"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys

import pytest

from queickd.core.job import State
from queickd.core.protocol import Code, QueueError


def refused(q, func, code):
    with pytest.raises(QueueError) as info:
        q.enqueue(func, [1, 2])
    assert info.value.code == code
    return info.value.message


# --- a function the module does not define ------------------------------------------------------


def test_enqueue_refuses_a_function_the_module_lacks(daemon):
    with daemon.client() as q:
        assert "module testjobs defines no function 'nope'" in refused(q, "testjobs:nope", Code.NOT_FOUND)
        q.wait(q.enqueue("testjobs:add", [1, 2]), 20)  # the module imported: told from it now
        assert "defines no function 'nope'" in refused(q, "testjobs:nope", Code.NOT_FOUND)
        assert [j["func"] for j in q.jobs()] == ["testjobs:add"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_function_added_before_sighup_is_found(start_daemon, tmp_path, isolation):
    app = tmp_path / "app"
    app.mkdir()
    (app / "growing.py").write_text("def f():\n    return 1\n")
    d = start_daemon(None, "--app-dir", str(app), "--isolation", isolation, workers=1)
    with d.client() as q:
        assert q.wait(q.enqueue("growing:f"), 20)["result"] == 1
        refused(q, "growing:g", Code.NOT_FOUND)
        (app / "growing.py").write_text("def f():\n    return 1\n\n\ndef g(a, b):\n    return a * b\n")
        if isolation == "thread":  # the daemon imported growing: its code changes on reload
            refused(q, "growing:g", Code.NOT_FOUND)
        else:  # never imported here: the file is read again, as the zygote imports it afresh
            assert q.wait(q.enqueue("growing:g", [2, 3]), 20)["result"] == 6
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for_line(r"reload: \d+ module\(s\) imported afresh")
        assert q.wait(q.enqueue("growing:g", [3, 4]), 20)["result"] == 12


def test_missing_function_deaths_do_not_pause(start_daemon, tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "shrinking.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    d = start_daemon(None, "--app-dir", str(app), "--pause-after", "2", workers=1)
    with d.client() as q:
        assert q.wait(q.enqueue("shrinking:f"), 20)["result"] == 1
        q.pause(pool="default")  # the jobs wait while g is taken out
        ids = [q.enqueue("shrinking:g", key="k") for _ in range(3)]
        (app / "shrinking.py").write_text("def f():\n    return 1\n")
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for_line(r"reload: \d+ module\(s\) imported afresh")
        q.resume(pool="default")
        for job_id in ids:
            job = q.wait(job_id, 20)
            assert job["state"] == State.DEAD and job["error"]["type"] == "not_found"
            assert "defines no function 'g'" in job["error"]["message"]
        assert q.stats()["paused"] == []
        assert q.wait(q.enqueue("shrinking:f", key="k"), 20)["state"] == State.SUCCEEDED


# --- a pool no live worker serves ---------------------------------------------------------------


def raw(port: int, request: dict) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(json.dumps(request).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def test_enqueue_to_an_unserved_pool_warns(daemon, caplog):
    reply = raw(daemon.port, {"op": "enqueue", "func": "testjobs:noop", "pool": "nosuchpool"})
    assert reply["ok"] is True and reply["state"] == State.QUEUED
    assert reply["warnings"] == ["no live worker serves pool 'nosuchpool': the job waits until one does "
                                 "(a daemon or 'queick worker' started with --pool nosuchpool)"]
    many = raw(daemon.port, {"op": "enqueue_many", "jobs": [{"func": "testjobs:noop", "pool": "gpu"},
                                                             {"func": "testjobs:noop"}]})
    assert len(many["job_ids"]) == 2 and len(many["warnings"]) == 1 and "'gpu'" in many["warnings"][0]
    assert "warnings" not in raw(daemon.port, {"op": "enqueue", "func": "testjobs:noop"})
    daemon.wait_for_line("accepted job\\(s\\) for pool 'nosuchpool', which no live worker serves")
    with caplog.at_level(logging.WARNING, logger="queickd.client"), daemon.client() as q:
        q.enqueue("testjobs:noop", pool="nosuchpool")
    assert "no live worker serves pool 'nosuchpool'" in caplog.text


def test_queick_enqueue_says_the_pool_is_unserved(daemon):
    r = subprocess.run([sys.executable, "-m", "queickd", "enqueue", "testjobs:noop", "--pool", "nosuchpool",
                        "--port", str(daemon.port)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().isdigit()
    assert "no live worker serves pool 'nosuchpool'" in r.stderr


def test_the_warning_ends_once_a_live_worker_serves_the_pool(pg_fresh_database, start_daemon):
    pytest.importorskip("psycopg")
    from fleethelpers import WorkerProcess

    d = start_daemon(pg_fresh_database, "--heartbeat", "0.5", workers=0)  # it serves no pool itself
    first = raw(d.port, {"op": "enqueue", "func": "testjobs:add", "args": [1, 2], "pool": "gpu"})
    assert first["ok"] is True and "'gpu'" in first["warnings"][0]
    worker = WorkerProcess(pg_fresh_database, "gpu", workers=1).start()
    try:
        with d.client() as q:
            assert q.wait(first["job_id"], 30)["result"] == 3  # served as soon as a worker came
        d.wait_for_line("pools served by live workers: gpu")  # read after a heartbeat
        assert "warnings" not in raw(d.port, {"op": "enqueue", "func": "testjobs:noop", "pool": "gpu"})
    finally:
        worker.close()


def test_a_function_of_a_module_being_imported_is_not_refused(start_daemon, gate):
    # slowimport's import blocks on the gate before its functions are defined: a worker is
    # importing it for the first job while the second is enqueued.
    d = start_daemon(None, env={"QUEICKD_TEST_IMPORT_GATE": str(gate.port)}, workers=1)
    with d.client() as q:
        first = q.enqueue("slowimport:loop", ("/dev/null", 0))
        assert gate.arrival() == "importing"
        second = q.enqueue("slowimport:aloop", ("/dev/null", 0))  # was not_found: half a module
        gate.release_all()
        assert [q.wait(j, 30)["state"] for j in (first, second)] == [State.SUCCEEDED, State.SUCCEEDED]
