"""Liveness of long jobs against real daemons: a job with `stalled_after` that reports no
progress (nor, in a process, uses CPU time) for that long is marked stalled, shown so in
`queick jobs`, `queick show` and /metrics, and unmarked when it reports again; with
on_stall = "kill" its run is stopped as at a timeout and retried per its policy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from httphelpers import scrape, start_web

from queickd.core.job import State

KINDS = {"thread": {}, "process": {"isolation": "process"}}
MARGIN = 3.0  # seconds past stalled_after the mark may take on a busy test machine


def _queick(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "queickd", *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _until(q, job_id, cond, timeout=20.0):
    """`get` until cond(job): a bounded wait on the daemon's answers, no sleep."""
    end = time.monotonic() + timeout
    while True:
        got = q.get(job_id)
        if cond(got):
            return got
        assert time.monotonic() < end, f"job {job_id} never got there: {got}"


def _marked(daemon, job_id, timeout):
    return daemon.wait_for_line(rf"job {job_id}: no progress.* marked stalled", timeout)


@pytest.mark.parametrize("kind", ["thread", "process", "async"])
def test_a_job_that_reports_regularly_is_never_marked_stalled(daemon, kind):
    func = "livejobs:areport_every" if kind == "async" else "livejobs:report_every"
    with daemon.client() as q:
        job = q.enqueue(func, (12, 0.2), stalled_after=1, **KINDS.get(kind, {}))
        done = q.wait(job, 60)
    assert done["state"] == State.SUCCEEDED and done["result"] == 12
    assert done["stalled_at"] is None
    assert not [line for line in daemon.lines if f"job {job}: no progress" in line]


@pytest.mark.parametrize("kind", ["thread", "process", "async"])
def test_a_quiet_job_is_marked_stalled_within_stalled_after_and_unmarked_when_it_reports(daemon, gate, kind):
    func = "livejobs:aquiet_then_report" if kind == "async" else "livejobs:quiet_then_report"
    with daemon.client() as q:
        job = q.enqueue(func, (gate.port,), stalled_after=1, **KINDS.get(kind, {}))
        assert gate.arrival() == "quiet"
        quiet_at = time.time()
        _marked(daemon, job, 1 + MARGIN)
        got = _until(q, job, lambda j: j["stalled_at"] is not None)
        assert got["state"] == State.RUNNING
        assert quiet_at - 1 <= got["stalled_at"] <= quiet_at + 1 + MARGIN
        gate.release_first()
        assert gate.arrival() == "reported"
        again = _until(q, job, lambda j: j["stalled_at"] is None)
        assert again["state"] == State.RUNNING and again["progress"]["done"] == 2
        gate.release_all()
        assert q.wait(job, 30)["state"] == State.SUCCEEDED


def test_a_stalled_job_is_shown_in_queick_jobs_show_status_the_status_page_and_the_metrics(
        start_daemon, tmp_path, gate):
    web = start_web(start_daemon, tmp_path)
    port = str(web.daemon.port)
    with web.daemon.client() as q:
        job = q.enqueue("livejobs:quiet_then_report", (gate.port,), stalled_after=1)
        assert gate.arrival() == "quiet"
        _marked(web.daemon, job, 1 + MARGIN)
        _until(q, job, lambda j: j["stalled_at"] is not None)
        listed = _queick("jobs", "--state", "running", "--port", port)
        shown = _queick("show", str(job), "--port", port)
        status = _queick("status", "--port", port)
        page = web.get("/").body.decode()
        metrics = scrape(web)
        gate.release_first()
        assert gate.arrival() == "reported"
        gate.release_all()
        q.wait(job, 30)
        after = scrape(web)
    (row,) = [line for line in listed.splitlines() if line.strip().startswith(str(job))]
    assert re.search(rf"^\s*{job}\s+stalled\s", row) and "(STALLED since " in row
    assert "stalled_at: " in shown and "(running, stalled" in shown
    assert re.search(rf"^\s*{job}\s.*livejobs:quiet_then_report\s+STALLED since ", status, re.M)
    assert "<td>STALLED since " in page
    assert metrics[("queickd_jobs_stalled", ())] == 1
    assert metrics[("queickd_stalls_total", (("on_stall", "mark"),))] == 1
    assert after[("queickd_jobs_stalled", ())] == 0


def test_on_stall_kill_kills_a_quiet_process_job_which_is_retried_and_counted(start_daemon, tmp_path):
    web = start_web(start_daemon, tmp_path)
    with web.daemon.client() as q:
        job = q.enqueue("livejobs:hang", isolation="process", stalled_after=1, on_stall="kill",
                        retry=True, retry_interval=0.1, max_attempts=2)
        done = q.wait(job, 60)  # two runs killed: not two sleeps of 300 s
        # The mark goes with the run: its clear is stored after the run's end, maybe after
        # the wait answered.
        cleared = _until(q, job, lambda j: j["stalled_at"] is None)
    assert done["state"] == State.DEAD and done["attempts"] == 2
    assert done["error"]["type"] == "stalled"
    assert "no progress and used no CPU time for 1 s" in done["error"]["message"]
    m = scrape(web)
    assert m[("queickd_stalls_total", (("on_stall", "kill"),))] == 2
    assert m[("queickd_limit_kills_total", (("kind", "stalled"),))] == 2
    assert cleared["state"] == State.DEAD and cleared["stalled_at"] is None


def test_on_stall_kill_cancels_a_quiet_async_job(daemon, tmp_path):
    path = tmp_path / "attempts"
    with daemon.client() as q:
        job = q.enqueue("livejobs:ahang", (str(path),), stalled_after=1, on_stall="kill")
        done = q.wait(job, 30)  # cancelled: not a sleep of 300 s
    assert done["state"] == State.DEAD and done["error"]["type"] == "stalled"
    assert "its task was cancelled" in done["error"]["message"]


def test_on_stall_kill_interrupts_a_quiet_thread_job_in_python_code(daemon, tmp_path):
    path = tmp_path / "attempts"
    with daemon.client() as q:
        job = q.enqueue("livejobs:python_wait", (str(path),), stalled_after=1, on_stall="kill")
        done = q.wait(job, 30)
    assert done["state"] == State.DEAD and done["error"]["type"] == "stalled"
    assert "was interrupted in its thread" in done["error"]["message"]


def test_a_process_job_burning_cpu_without_progress_is_not_stalled(daemon):
    with daemon.client() as q:
        job = q.enqueue("livejobs:burn", (4,), isolation="process", stalled_after=1, on_stall="kill")
        done = q.wait(job, 60)
    assert done["state"] == State.SUCCEEDED and done["result"] > 0
    assert not [line for line in daemon.lines if f"job {job}: no progress" in line]


def test_a_functions_stalled_after_from_the_config_file_applies_to_its_jobs(start_daemon, tmp_path):
    path = tmp_path / "queickd.toml"
    path.write_text('[functions."livejobs:ahang"]\nstalled_after = 1\non_stall = "kill"\n')
    d = start_daemon(None, "--config", str(path))
    with d.client() as q:
        job = q.enqueue("livejobs:ahang", (str(tmp_path / "a"),))
        done = q.wait(job, 30)
    assert (done["stalled_after"], done["on_stall"]) == (1.0, "kill")
    assert done["error"]["type"] == "stalled"


def test_another_host_sees_the_stalled_mark_on_postgresql(start_daemon, pg_url, gate):
    from queickd.store.postgres.store import PostgresStore

    d = start_daemon(pg_url)
    with d.client() as q:
        job = q.enqueue("livejobs:quiet_then_report", (gate.port,), stalled_after=1)
        assert gate.arrival() == "quiet"
        _marked(d, job, 1 + MARGIN)
        other = PostgresStore(pg_url)  # a second connection, as another host's
        try:
            seen = other.get(job)
            assert seen.state == State.RUNNING and seen.stalled_at is not None
            assert other.count_stalled() == 1
            gate.release_first()
            assert gate.arrival() == "reported"
            _until(q, job, lambda j: j["stalled_at"] is None)
            assert other.get(job).stalled_at is None and other.count_stalled() == 0
        finally:
            other.close()
        gate.release_all()
        q.wait(job, 30)
