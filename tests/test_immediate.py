"""Immediate mode: JobQueue.immediate() runs what it enqueues in the calling process,
through the daemon's own fate logic, with no daemon, no socket and its own clock."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import immediatejobs
import pytest
import testjobs
import wfsteps

from queickd import JobQueue, QueueError

JOBS = str(Path(__file__).parent / "jobs")
ROOT = Path(__file__).parent.parent
START = 1_000_000.0  # the immediate queue's clock at the start of each test


@pytest.fixture
def q():
    immediatejobs.RUNS.clear()
    immediatejobs.LOG.clear()
    queue = JobQueue.immediate(app_dir=JOBS, start=START)
    immediatejobs.QUEUE = queue
    yield queue
    immediatejobs.QUEUE = None


@pytest.fixture
def no_sleeping(monkeypatch):
    def refuse(seconds):
        raise AssertionError(f"slept {seconds} s")

    monkeypatch.setattr(time, "sleep", refuse)


def test_immediate_enqueue_runs_the_job_at_once(q):
    job_id = q.enqueue(immediatejobs.record, args=("ran",))
    assert immediatejobs.LOG == ["ran"]
    job = q.get(job_id)
    assert (job["state"], job["result"], job["attempts"]) == ("succeeded", "ran", 1)


def test_immediate_wait_answers_the_result(q):
    job = q.wait(q.enqueue(testjobs.add, args=(2, 3)))
    assert (job["state"], job["result"]) == ("succeeded", 5)


def test_immediate_awaits_an_async_job_even_inside_a_running_loop(q):
    import asyncio

    assert q.get(q.enqueue("asyncjobs:aadd", [1, 2]))["result"] == 3

    async def caller():  # a test that is itself a coroutine: the job's loop is not the caller's
        return q.get(q.enqueue("asyncjobs:returns_a_coroutine", [2, 5]))["result"]

    assert asyncio.run(caller()) == 7


def test_an_immediate_async_job_may_use_its_queue(q):
    box: list = []
    caller = threading.Thread(target=lambda: box.append(q.wait(q.enqueue(immediatejobs.enqueue_from_async,
                                                                         args=("from async",)), 5)),
                              daemon=True)
    caller.start()
    caller.join(20)  # a deadlock leaves it blocked
    assert box, "the async job's request never got the queue"
    child, state = box[0]["result"]
    assert state == "running" and q.get(child)["result"] == "from async"
    assert immediatejobs.LOG == ["from async"]


def test_an_immediate_queues_task_awaits_without_a_daemon(monkeypatch):
    import asyncio

    import taskjobs

    monkeypatch.setenv("QUEICKD_PORT", "1")  # a connection attempt would be refused
    queue = JobQueue.immediate(app_dir=JOBS, start=START)
    monkeypatch.setattr(taskjobs.add, "queue", queue)  # the task's queue, in test mode

    async def caller():
        job = await taskjobs.add.aenqueue(2, 3)
        return await job.result(5), (await job.get())["state"]

    assert asyncio.run(caller()) == (5, "succeeded")


def test_immediate_retries_follow_the_policy_without_sleeping(q, no_sleeping):
    job_id = q.enqueue(immediatejobs.flaky, args=("f", 2), retry=True, retry_type="constant",
                       retry_interval=7, max_attempts=5)
    job = q.get(job_id)
    assert (job["state"], job["attempts"], job["result"]) == ("succeeded", 3, 3)
    assert immediatejobs.RUNS == {"f": 3}
    # Two backoffs of 7 s, on the queue's clock: it moved by exactly those.
    assert job["finished_at"] == START + 14 and q.advance(0) == START + 14


def test_immediate_sleeps_the_backoffs_when_asked():
    immediatejobs.RUNS.clear()
    slept: list[float] = []
    q = JobQueue.immediate(app_dir=JOBS, start=START, sleep=slept.append)
    q.enqueue(immediatejobs.flaky, args=("s", 2), retry=True, retry_type="linear_increasing", retry_interval=3,
              max_attempts=3)
    assert slept == [3.0, 6.0]


def test_immediate_dead_letter_after_attempts(q, no_sleeping):
    job_id = q.enqueue(immediatejobs.flaky, args=("d", 99), retry=True, retry_type="constant", retry_interval=1,
                       max_attempts=3)
    job = q.get(job_id)
    assert (job["state"], job["attempts"], job["error"]["type"]) == ("dead", 3, "ConnectionError")
    assert [j["id"] for j in q.dead()["jobs"]] == [job_id]
    # Sent back, it runs again at once, with its attempts anew.
    assert q.retry(job_id)["state"] == "queued" and q.get(job_id)["state"] == "dead"
    assert immediatejobs.RUNS == {"d": 6}


def test_immediate_breaker_pauses_a_failing_function_and_its_probe_runs_on_the_clock(q, no_sleeping):
    for _ in range(5):  # the daemon's default: 5 dead jobs in a row pause the function
        q.enqueue(testjobs.fail)
    assert [p["name"] for p in q.stats()["paused"]] == ["testjobs:fail"]
    sixth = q.enqueue(testjobs.fail)
    # It waited for the pause's probe, 300 s on; the clock moves no further with nothing waiting.
    assert (q.get(sixth)["state"], q.get(sixth)["started_at"]) == ("dead", START + 300)
    assert q.advance(0) == START + 300


def test_immediate_idempotency_key_holds(q):
    first = q.enqueue(immediatejobs.record, args=("once",), idempotency_key="order-17")
    again = q.enqueue(immediatejobs.record, args=("once",), idempotency_key="order-17")
    assert again == first and immediatejobs.LOG == ["once"]


def test_immediate_serial_key_holds(q):
    job_id = q.enqueue(immediatejobs.enqueue_behind_me, args=("k",), key="k")
    second, refused = q.get(job_id)["result"]
    # The key's second job waited for the first to end; a manual job was refused while it ran.
    assert immediatejobs.LOG == ["first starts", "first ends", "second"]
    assert refused == "conflict" and q.get(second)["state"] == "succeeded"


def test_immediate_workflow_runs_to_the_end(q):
    run_id = (q.workflow("research").then(wfsteps.plan).for_each("tasks", wfsteps.square, "results")
              .then("wfsteps:total").start(state={"n": 10}))
    run = q.workflow_get(run_id)
    assert run["state"] == "succeeded" and run["data"]["total"] == 285
    assert q.workflow_wait(run_id)["state"] == "succeeded"


def test_immediate_workflow_step_retries_run_to_the_end(q, no_sleeping):
    run_id = q.workflow("w").then(immediatejobs.flaky_step, retry={"policy": "constant", "interval": 2,
                                                                  "max_attempts": 3}).start()
    run = q.workflow_get(run_id)
    assert (run["state"], run["data"]) == ("succeeded", {"runs": 3})
    assert q.advance(0) == START + 4


class _NoSocket(socket.socket):  # a class: modules imported meanwhile may subclass socket.socket
    def __init__(self, *args, **kwargs):
        raise AssertionError("immediate mode opened a socket")


def test_immediate_opens_no_socket(monkeypatch):
    for name in ("socket", "socketpair", "create_connection"):
        monkeypatch.setattr(socket, name, _NoSocket)
    q = JobQueue.immediate(app_dir=JOBS)
    assert q.wait(q.enqueue(testjobs.add, args=(1, 1)))["result"] == 2
    run_id = q.workflow("w").then(wfsteps.count_up, name="count").budget(max_transitions=3).start()
    assert q.workflow_wait(run_id)["state"] == "budget_exceeded"
    assert q._sock is None


def test_immediate_starts_no_thread(q):
    threads = set(threading.enumerate())
    q.enqueue(immediatejobs.flaky, args=("t", 1), retry=True)
    q.workflow("w").then(wfsteps.noop).start()
    assert set(threading.enumerate()) == threads


def test_immediate_enqueue_at_runs_when_the_clock_advances(q):
    job_id = q.enqueue_at(START + 60, immediatejobs.record, args=("late",))
    assert q.get(job_id)["state"] == "scheduled"
    assert q.advance(59.5) == START + 59.5 and immediatejobs.LOG == []
    assert q.advance(0.5) == START + 60 and immediatejobs.LOG == ["late"]
    assert q.get(job_id)["started_at"] == START + 60


def test_immediate_wait_lets_its_timeout_pass_on_the_clock(q):
    job_id = q.enqueue(immediatejobs.record, args=("later",), delay=100)
    with pytest.raises(TimeoutError, match="still scheduled after 30 s"):
        q.wait(job_id)
    assert q.advance(0) == START + 30
    assert q.wait(job_id, timeout=600)["state"] == "succeeded"
    assert q.advance(0) == START + 100  # the wait ended with the job


def test_immediate_cron_fires_each_tick_as_the_clock_advances(q):
    q.cron("*/10 * * * *", immediatejobs.record, args=("tick",))
    q.advance(3600)
    assert immediatejobs.LOG == ["tick"] * 6


def test_immediate_a_job_cannot_wait_for_a_job_it_enqueued(q):
    job = q.get(q.enqueue(immediatejobs.wait_for_my_child))
    assert job["state"] == "dead" and job["error"]["type"] == "TimeoutError"
    assert immediatejobs.LOG == ["child"]  # it ran once its parent had returned


def test_immediate_refuses_what_a_daemon_refuses(q):
    with pytest.raises(QueueError) as e:
        q.enqueue("json:dumps", args=([1],))
    assert e.value.code == "not_allowed"
    with pytest.raises(QueueError, match="priority"):
        q.enqueue(testjobs.noop, priority="high")


def test_advance_is_for_an_immediate_queue_only():
    with pytest.raises(TypeError, match="immediate"):
        JobQueue("127.0.0.1", 1).advance(1)


def test_importing_queickd_loads_the_daemon_only_for_immediate_mode():
    code = ("import sys, queickd\n"
            "before = sorted(m for m in sys.modules if m.startswith(('queickd.services', 'queickd.store')))\n"
            f"queickd.JobQueue.immediate(app_dir={JOBS!r})\n"
            "print(before, 'queickd.services.worker' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert out.strip() == "[] True"


def test_the_pytest_fixture_of_the_testing_docs_works(tmp_path):
    """docs/how-to/testing.md's example files, each a ```python block opening with `# file: NAME`,
    written out as a project and its test suite run."""
    blocks = re.findall(r"```python\n# file: (\S+)\n(.*?)```", (ROOT / "docs" / "how-to" / "testing.md").read_text(), re.S)
    assert {name for name, _ in blocks} >= {"conftest.py", "myapp/jobs.py", "test_signup.py"}
    for name, text in blocks:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b[2-9] passed\b", done.stdout), done.stdout


def test_immediate_progress_is_visible_in_get_while_the_job_runs(q):
    job = q.wait(q.enqueue(immediatejobs.report_progress))
    assert job["result"] == [1, 2, "half"]
    assert (job["progress"]["done"], job["progress"]["total"]) == (2, 2)
