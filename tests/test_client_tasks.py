"""Tasks (`@q.task(**options)`) and job handles, against a real daemon: the task stays the
plain function, enqueues with its options (overridable per call), and its handle gives the
job's result or raises what became of it. tests/jobs/taskjobs.py declares the tasks; the
daemon imports it as it imports any job module."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
import taskjobs
from helpers import JOBS_DIR

from queickd import JobCancelled, JobFailed, JobHandle, JobQueue, QueueError
from queickd.tasks import Task


@pytest.fixture
def tasks_queue(daemon):
    """taskjobs' module-level queue, pointed at this test's daemon."""
    q = taskjobs.queue
    q.close()
    q.host, q.port = "127.0.0.1", daemon.port
    yield q
    q.close()


class RecordingQueue(JobQueue):
    """A JobQueue that notes the ops of each exchange it has with the daemon."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.exchanges: list[list[str]] = []

    def _exchange(self, reqs):
        self.exchanges.append([r["op"] for r in reqs])
        return super()._exchange(reqs)


def test_a_decorated_task_is_still_a_plain_function():
    assert taskjobs.add(1, 2) == 3
    assert taskjobs.report("q3", copies=2) == "q3 x2"
    assert (taskjobs.add.__module__, taskjobs.add.__name__) == ("taskjobs", "add")
    assert JobQueue.job(taskjobs.add, (1, 2)) == {"func": "taskjobs:add", "args": [1, 2]}  # nothing new on the wire


def test_task_enqueue_returns_a_handle_whose_result_is_the_value(tasks_queue):
    job = taskjobs.add.enqueue(1, 2)
    assert isinstance(job, JobHandle) and isinstance(job.id, int)
    assert job.result(timeout=20) == 3
    assert job.get()["state"] == "succeeded"
    assert job.wait(timeout=20)["result"] == 3


def test_existing_enqueue_calls_run_a_task_as_before(tasks_queue):
    job_id = tasks_queue.enqueue(taskjobs.add, args=(2, 3))
    assert tasks_queue.wait(job_id, timeout=20)["result"] == 5
    job_id = tasks_queue.enqueue("taskjobs:add", args=(4, 5))
    assert tasks_queue.wait(job_id, timeout=20)["result"] == 9


def test_result_raises_job_failed_with_the_stored_error(tasks_queue):
    job = taskjobs.fail.enqueue("disk on fire")
    with pytest.raises(JobFailed) as info:
        job.result(timeout=20)
    assert (info.value.job_id, info.value.error_type, info.value.message) == (job.id, "ValueError", "disk on fire")
    assert "raise ValueError(message)" in info.value.traceback


def test_result_raises_job_cancelled(tasks_queue):
    job = taskjobs.add.enqueue_in(3600, 1, 2)
    job.cancel()
    with pytest.raises(JobCancelled) as info:
        job.result(timeout=20)
    assert info.value.job_id == job.id


def test_result_times_out(tasks_queue):
    job = taskjobs.add.enqueue_in(3600, 1, 2)
    with pytest.raises(TimeoutError, match=f"job {job.id} is still scheduled"):
        job.result(timeout=0)


def test_enqueue_at_schedules_the_job_at_that_time(tasks_queue):
    when = time.time() + 3600
    job = taskjobs.add.enqueue_at(when, 1, 2)
    got = job.get()
    assert got["state"] == "scheduled" and abs(got["run_at"] - when) < 1e-3


def test_task_options_are_overridable_per_call(tasks_queue):
    default = taskjobs.report.enqueue_in(3600, "q3").get()
    assert (default["priority"], default["key"]) == (5, "reports")
    changed = taskjobs.report.enqueue_in(3600, "q4", priority=9, kwargs={"copies": 2}).get()
    assert (changed["priority"], changed["key"], changed["kwargs"]) == (9, "reports", {"copies": 2})
    assert taskjobs.report.enqueue("q5", kwargs={"copies": 3}).result(timeout=20) == "q5 x3"


def test_a_misspelt_option_is_a_type_error_and_sends_nothing(tasks_queue):
    with pytest.raises(TypeError, match="prio"):
        taskjobs.add.enqueue(1, 2, prio=3)
    with pytest.raises(TypeError, match="prio"):
        tasks_queue.task(prio=3)(taskjobs.add.func)
    assert tasks_queue.jobs(func="taskjobs:add") == []


def test_task_many_is_one_request(daemon):
    with RecordingQueue("127.0.0.1", daemon.port) as q:
        add = Task(q, taskjobs.add.func, {"priority": 2})
        jobs = add.many([((1, 2), {}), ((3,), {"b": 4}), ((5, 6), {})])
        assert q.exchanges[1:] == [["enqueue_many"]]  # the first is the hello
        assert [j.result(timeout=20) for j in jobs] == [3, 7, 11]
        assert {j.get()["priority"] for j in jobs} == {2}


def test_task_cron_registers_the_function_on_the_schedule(tasks_queue):
    cron = taskjobs.report.cron("0 3 * * *", "nightly", name="nightly-report")
    assert (cron["name"], cron["func"], cron["args"], cron["schedule"]) == (
        "nightly-report", "taskjobs:report", ["nightly"], {"cron": "0 3 * * *"})
    assert [c["name"] for c in tasks_queue.crons()] == ["nightly-report"]


def test_refused_option_raises_queue_error_with_the_daemons_code(tasks_queue):
    with pytest.raises(QueueError) as info:
        taskjobs.add.enqueue(1, 2, isolation="nowhere")
    assert info.value.code == "bad_request"
    assert "isolation" in info.value.message
    with pytest.raises(QueueError) as info:
        taskjobs.add.enqueue(1, 2, cost_units=-1)
    assert info.value.code == "bad_request" and "cost_units" in info.value.message
    assert tasks_queue.jobs(func="taskjobs:add") == []


class Holder:
    def method(self):
        return 1


def _nested_function_of_a_test():
    def inner():
        return 1
    return inner


def test_decorating_a_lambda_nested_function_or_method_raises_type_error():
    q = JobQueue(port=1)  # never connected: decorating opens no connection
    with pytest.raises(TypeError, match="lambda"):
        q.task(lambda: 1)
    with pytest.raises(TypeError, match="inside a function"):
        q.task(priority=1)(_nested_function_of_a_test())
    with pytest.raises(TypeError, match="method Holder.method"):
        q.task(Holder.method)
    with pytest.raises(TypeError, match="top level of a module"):
        q.task(Holder().method)  # a bound method is no function
    with pytest.raises(TypeError, match="inside a function"):
        class Local:
            @q.task
            def method(self):
                return 1


def test_decorating_a_function_of_the_script_being_run_raises_type_error(tmp_path):
    script = tmp_path / "enqueue_own.py"
    script.write_text("from queickd import JobQueue\nq = JobQueue(port=1)\n"
                      "@q.task\ndef add(a, b):\n    return a + b\n")
    env = {"PYTHONPATH": ":".join(sys.path)}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("TypeError: @task cannot decorate add of the script being run (__main__)")
    assert "cannot import" in last and "import it from there" in last


def test_a_script_calls_and_enqueues_a_task_it_imports(tasks_queue, tmp_path):
    script = tmp_path / "use_tasks.py"
    script.write_text("import sys, taskjobs\nassert taskjobs.add(1, 2) == 3\n"
                      "print(taskjobs.add.enqueue(2, 3).result(timeout=30))\n")
    env = {"QUEICKD_PORT": str(tasks_queue.port), "PYTHONPATH": f"{JOBS_DIR}:{':'.join(sys.path)}"}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "5"), r.stderr


def test_importing_a_module_with_tasks_opens_no_connection():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code = "import taskjobs; assert taskjobs.add(1, 2) == 3; assert taskjobs.queue.server_info is None"
        env = {"QUEICKD_PORT": str(port), "PYTHONPATH": f"{JOBS_DIR}:{':'.join(sys.path)}"}
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # a connection made would wait here to be accepted
            listener.accept()


def test_a_task_runs_isolated_in_a_process_of_its_own(tasks_queue):
    # the child imports taskjobs too: its queue, still unconnected, is no obstacle
    assert taskjobs.add.enqueue(1, 2, isolation="process").result(timeout=30) == 3
