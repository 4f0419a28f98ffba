"""Unmodified Queick 1.2.1 clients (PyPI `queick==1.2.1`) on the TCP port.

Queick ships a `queick` console script, as we do, so it is never installed into the test
interpreter: it goes into .test-cache/ with `pip install --target --no-deps` and is put on
sys.path only for these tests. Its client connects to a hard-coded port, patched here.
"""

from __future__ import annotations

import os
import pickle
import runpy
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import webjobs
from attackhelpers import (
    BIG_ALLOCATION,
    bystander_enqueue_seconds,
    deep_nesting_bomb,
    rss_mb,
    shared_reference_bomb,
)

from queickd.core.protocol import QueueError

QUEICK_DIR = Path(__file__).resolve().parent.parent / ".test-cache" / "queick-1.2.1"


@pytest.fixture(scope="session")
def queick_dir():
    if not (QUEICK_DIR / "queick" / "job_queue.py").exists():
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                            str(QUEICK_DIR), "queick==1.2.1"], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip(f"cannot install queick==1.2.1 from PyPI: {r.stderr.strip()[-300:]}")
    return QUEICK_DIR


@pytest.fixture
def legacy_daemon(start_daemon):
    return start_daemon(None, "--accept-queick-clients")


@pytest.fixture
def queick(queick_dir, legacy_daemon, monkeypatch):
    """Queick 1.2.1's package, its client pointed at the test daemon's port."""
    monkeypatch.syspath_prepend(str(queick_dir))
    for name in [m for m in sys.modules if m == "queick" or m.startswith("queick.")]:
        monkeypatch.delitem(sys.modules, name)
    import queick
    import queick.job_queue

    assert queick.job_queue.TCP_SERVER_PORT == 9999  # what is being patched, as shipped
    monkeypatch.setattr(queick.job_queue, "TCP_SERVER_PORT", legacy_daemon.port)
    yield queick
    for name in [m for m in sys.modules if m == "queick" or m.startswith("queick.")]:
        del sys.modules[name]


def only_job(daemon):
    with daemon.client() as q:
        jobs = q.jobs()
    assert len(jobs) == 1
    return jobs[0]


def test_queick_client_enqueue_runs_the_job(queick, legacy_daemon, tmp_path):
    out = tmp_path / "ran.txt"
    reply = queick.JobQueue().enqueue(webjobs.record, args=(str(out), "a", 1))
    assert reply == {"success": True, "error": None}
    job = only_job(legacy_daemon)
    assert job["func"] == "webjobs:record"
    with legacy_daemon.client() as q:
        assert q.wait(job["id"], 20)["state"] == "succeeded"
    assert out.read_text() == "('a', 1)\n"


def test_queick_enqueue_at_becomes_a_scheduled_job(queick, legacy_daemon, tmp_path):
    at = time.time() + 3600
    assert queick.JobQueue().enqueue_at(at, webjobs.record, args=(str(tmp_path / "x"),))["success"]
    job = only_job(legacy_daemon)
    assert job["state"] == "scheduled"
    assert job["run_at"] == pytest.approx(at)


def test_queick_retry_options_map_onto_the_jobs_retry_policy(queick, legacy_daemon, tmp_path):
    queick.JobQueue().enqueue(webjobs.record, args=(str(tmp_path / "x"),), retry=True, retry_interval=7,
                              max_retry_interval=60, retry_type=queick.RETRY_TYPE.CONSTANT,
                              retry_on_network_available=True)
    job = only_job(legacy_daemon)
    assert job["retry"]["policy"] == "constant"
    assert (job["retry"]["interval"], job["retry"]["max_interval"]) == (7, 60)
    assert job["retry_on_network"] is True


def test_queick_cron_becomes_a_recurring_job(queick, legacy_daemon, tmp_path):
    start = time.time() + 3600
    st = queick.SchedulingTime().every(minutes=2).starting_from(start)
    assert queick.JobQueue().cron(st, webjobs.record, args=(str(tmp_path / "x"),))["success"]
    with legacy_daemon.client() as q:
        (cron,) = q.crons()
    assert cron["func"] == "webjobs:record"
    assert cron["schedule"]["every"] == 120
    assert cron["next_run_at"] == pytest.approx(start)


def test_queick_client_is_refused_a_function_outside_the_allowlist(queick, legacy_daemon):
    reply = queick.JobQueue().enqueue(os.getpid)
    assert reply["success"] is False
    assert "not_allowed" in reply["error"]
    with legacy_daemon.client() as q:
        assert q.jobs() == []


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def legacy_exchange(port: int, data: bytes) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    return pickle.loads(reply)  # the daemon under test is trusted; its reply is plain data


def test_a_pickle_naming_os_system_is_refused_and_logged(legacy_daemon, tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"func_name": "webjobs.record", "args": (_Exploit(marker),)})
    reply = legacy_exchange(legacy_daemon.port, payload)
    assert reply["success"] is False
    assert "refused" in reply["error"]
    legacy_daemon.wait_for_line(r"refused a Queick request .* names the global (posix|os)\.system")
    assert not marker.exists()
    with legacy_daemon.client() as q:
        assert q.jobs() == []


def test_an_oversized_queick_request_is_refused(legacy_daemon):
    payload = pickle.dumps({"func_name": "webjobs.record", "args": ("x" * 100_000,)})
    reply = legacy_exchange(legacy_daemon.port, payload)
    assert reply["success"] is False
    legacy_daemon.wait_for_line("refused a Queick request .* over")


def test_a_queick_request_with_arguments_json_cannot_hold_is_refused(legacy_daemon):
    reply = legacy_exchange(legacy_daemon.port, pickle.dumps({"func_name": "webjobs.record", "args": (b"raw",)}))
    assert reply["success"] is False
    assert "JSON" in reply["error"]
    with legacy_daemon.client() as q:
        assert q.jobs() == []


def test_queick_requests_are_not_served_unless_enabled(daemon):
    payload = pickle.dumps({"func_name": "webjobs.record", "args": ()}) + b"\n"
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as s:
        s.sendall(payload)
        daemon.wait_for_line("start with --accept-queick-clients")
    with daemon.client() as q:
        assert q.jobs() == []


def test_json_clients_are_unaffected_when_enabled(legacy_daemon):
    with legacy_daemon.client() as q:
        assert q.wait(q.enqueue("testjobs:add", [1, 2]), 20)["result"] == 3


def test_accepting_queick_clients_with_a_token_is_refused_at_start(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    r = subprocess.run([sys.executable, "-m", "queickd", "run", "--store", "memory://", "--port", "0",
                        "--app-dir", str(tmp_path), "--token-file", str(token), "--accept-queick-clients"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 78 and "cannot present a token" in r.stderr


@pytest.mark.parametrize("bomb", [BIG_ALLOCATION, shared_reference_bomb(), deep_nesting_bomb(),
                                  b"\x80\x03B\xff\xff\xff\x7f"],
                         ids=["memo-index", "shared-references", "deep-nesting", "huge-length"])
def test_a_pickle_bomb_is_refused_while_memory_stays_bounded_and_others_are_served(legacy_daemon, bomb):
    before = rss_mb(legacy_daemon)
    with socket.create_connection(("127.0.0.1", legacy_daemon.port), timeout=20) as s:
        s.sendall(bomb)
        assert bystander_enqueue_seconds(legacy_daemon, timeout=20) < 2.0
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    answer = pickle.loads(reply)
    assert answer["success"] is False and "pickle refused" in answer["error"]
    assert rss_mb(legacy_daemon, "VmHWM") - before < 60
    with legacy_daemon.client() as q:
        assert [j["func"] for j in q.jobs()] == ["testjobs:noop"]  # the bystander's, and nothing else


QUEICK_README_JOBFUNC = "import time\ndef function(arg):\n    time.sleep(1)\n    print(arg)\n"
QUEICK_README_TEST = '''from queick import JobQueue
from jobfunc import function
from time import time

q = JobQueue()
q.enqueue(function, args=("hello",))
q.enqueue_at(time() + 5, function, args=("world",)) # Run after 5 seconds
'''


def test_queicks_readme_layout_runs_with_accept_queick_clients(queick_dir, start_daemon, tmp_path, monkeypatch):
    """Queick's README followed literally: jobfunc.py and test.py side by side (test.py named
    like the standard library's test package, which no job names), its test.py run as is."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "jobfunc.py").write_text(QUEICK_README_JOBFUNC)
    (app / "test.py").write_text(QUEICK_README_TEST)
    d = start_daemon(None, "--app-dir", str(app), "--accept-queick-clients")
    monkeypatch.syspath_prepend(str(queick_dir))
    monkeypatch.syspath_prepend(str(app))  # `python test.py` runs beside jobfunc.py
    for name in [m for m in sys.modules if m in ("queick", "jobfunc") or m.startswith("queick.")]:
        monkeypatch.delitem(sys.modules, name)
    import queick.job_queue

    monkeypatch.setattr(queick.job_queue, "TCP_SERVER_PORT", d.port)
    try:
        runpy.run_path(str(app / "test.py"), run_name="__main__")
    finally:
        for name in [m for m in sys.modules if m in ("queick", "jobfunc") or m.startswith("queick.")]:
            del sys.modules[name]
    with d.client() as q:
        later, now = q.jobs()
        assert (now["func"], now["args"], later["state"]) == ("jobfunc:function", ["hello"], "scheduled")
        assert q.wait(now["id"], 20)["state"] == "succeeded"
        with pytest.raises(QueueError) as info:  # the app's test.py is no job: `import test` is the stdlib's
            q.enqueue("test:function")
    assert info.value.code == "not_allowed" and "the standard library's test" in info.value.message


def test_a_queick_request_followed_by_a_half_close_is_answered(legacy_daemon):
    """A client that shuts its sending side after the pickle still reads: it gets its one reply."""
    payload = pickle.dumps({"func_name": "testjobs.add", "args": (1, 2)})
    with socket.create_connection(("127.0.0.1", legacy_daemon.port), timeout=10) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert pickle.loads(reply) == {"success": True, "error": None}
    assert only_job(legacy_daemon)["args"] == [1, 2]


def test_a_truncated_queick_request_then_a_half_close_is_refused_at_once(legacy_daemon):
    payload = pickle.dumps({"func_name": "testjobs.add", "args": (1, 2)})
    with socket.create_connection(("127.0.0.1", legacy_daemon.port), timeout=10) as s:
        s.sendall(payload[:-5])
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    answer = pickle.loads(reply)
    assert answer["success"] is False and "incomplete" in answer["error"]
    with legacy_daemon.client() as q:
        assert q.jobs() == []
