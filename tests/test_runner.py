"""The runner seam: the in-thread runner's reports, their JSON form, and fate judging them."""

from __future__ import annotations

import json
import time
from pathlib import Path

from test_fate import NOW, failed, make_job, raised
from test_fate_hints import RateLimitedError, RejectedError

from queickd.core.fate import after_failure, after_success
from queickd.core.job import State
from queickd.run.base import RunReport
from queickd.run.loader import FunctionLoader
from queickd.run.thread import ThreadRunner

JOBS = str(Path(__file__).parent / "jobs")


def _through_json(report: RunReport) -> RunReport:
    return RunReport.from_dict(json.loads(json.dumps(report.to_dict(), allow_nan=False)))


def _run(func: str, *args, **kwargs) -> RunReport:
    return ThreadRunner(FunctionLoader(JOBS)).run(make_job(func=func, args=list(args), kwargs=kwargs))


def test_thread_runner_reports_the_result_and_the_runtime():
    r = _run("testjobs:add", 2, 3)
    assert (r.ok, r.result, r.error_type) == (True, 5, None)
    assert r.runtime >= 0


def test_thread_runner_measures_no_memory_or_cpu_time():
    r = _run("testjobs:noop")
    assert (r.peak_memory, r.cpu_time) == (None, None)


def test_a_thread_run_reports_its_rss_growth_only_when_asked_to_measure_itself():
    asked: list[str] = []

    def measure(func: str) -> bool:
        asked.append(func)
        return len(asked) == 1  # the first run measures itself, the second does not

    runner = ThreadRunner(FunctionLoader(JOBS), measure=measure)
    measured = runner.run(make_job(func="testjobs:hold_memory", args=[16]))
    unmeasured = runner.run(make_job(func="testjobs:hold_memory", args=[16]))
    assert asked == ["testjobs:hold_memory"] * 2
    assert measured.peak_estimated and measured.peak_memory >= 12 << 20  # 16 MB touched and kept
    assert (unmeasured.peak_memory, unmeasured.peak_estimated) == (None, False)


def test_thread_runner_reports_the_error_with_its_traceback():
    r = _run("testjobs:fail", "broken")
    assert (r.ok, r.error_type, r.error_message) == (False, "ValueError", "broken")
    assert "ValueError: broken" in r.traceback


def test_thread_runner_reports_a_network_class_failure():
    assert _run("testjobs:refuse_connection").network is True


def test_thread_runner_catches_a_jobs_system_exit():
    r = _run("testjobs:exit_job")
    assert (r.ok, r.error_type) == (False, "SystemExit")


def test_thread_runner_reports_a_function_no_longer_allowed_as_permanent_without_traceback():
    r = _run("json:dumps", 1)
    assert (r.ok, r.error_type, r.permanent, r.traceback) == (False, "not_allowed", True, None)
    assert after_failure(make_job(), r, NOW).error == {"type": "not_allowed", "message": r.error_message}


def test_thread_runner_stores_a_non_json_result_as_its_repr():
    result = _run("testjobs:unserializable").result
    assert isinstance(result, str) and result.startswith("<object object at")


def test_a_failure_report_round_trips_through_json():
    r = failed(raised(RateLimitedError(3)))
    assert _through_json(r) == r


def test_a_success_report_round_trips_through_json():
    r = _run("testjobs:kwargs_echo", a=[1, "x"], b={"n": None})
    assert _through_json(r) == r


def test_a_report_from_a_newer_runner_with_unknown_keys_still_reads():
    d = failed(raised(ValueError("x"))).to_dict() | {"gpu_seconds": 1.5}
    assert RunReport.from_dict(d).error_type == "ValueError"


def test_fate_decides_the_same_outcome_from_a_report_that_crossed_json():
    cases = [
        (make_job(), failed(raised(ValueError("boom")))),
        (make_job(), failed(raised(RejectedError("invalid_auth")))),
        (make_job(), failed(raised(RateLimitedError(3)))),
        (make_job(retry_on_network=True), failed(raised(ConnectionRefusedError()))),
        (make_job(attempts=3), failed(raised(ValueError("last")))),
    ]
    for job, r in cases:
        assert after_failure(job, _through_json(r), NOW, True) == after_failure(job, r, NOW, True)
    ok = _run("testjobs:add", 1, 1)
    assert after_success(make_job(), _through_json(ok)) == after_success(make_job(), ok)


def test_fate_parks_a_network_failure_reported_from_another_process():
    d = {"ok": False, "error_type": "ConnectionResetError", "error_message": "", "traceback": "...",
         "network": True, "runtime": 0.5}
    out = after_failure(make_job(retry_on_network=True), RunReport.from_dict(d), NOW, network_checker=True)
    assert out.state == State.WAITING_NETWORK


def test_a_thread_run_past_its_timeout_reports_timeout_with_where_it_was_interrupted():
    r = ThreadRunner(FunctionLoader(JOBS)).run(make_job(func="testjobs:spin_for", args=[600]), 0.2)
    assert (r.ok, r.error_type, r.permanent) == (False, "timeout", False)
    assert "timeout of 0.2 s" in r.error_message and "spin_for" in r.traceback
    assert after_failure(make_job(), r, NOW).state == State.SCHEDULED  # its retry policy, as a process run's timeout
    assert after_failure(make_job(retry=None), r, NOW).state == State.DEAD


def test_no_interruption_outlives_the_run_it_was_sent_to():
    # Runs that end just at their deadline: the stopping thread may be sending as the call
    # returns. Whatever it sent must not surface in the worker's own code after the run
    # (the window is narrow: a broken hand-over fails here now and then, not every time).
    runner = ThreadRunner(FunctionLoader(JOBS))
    for _ in range(60):
        report = runner.run(make_job(func="testjobs:spin_for", args=[0.002]), 0.002)
        assert report.ok or report.error_type == "timeout"
        end = time.monotonic() + 0.002
        while time.monotonic() < end:  # the worker's code after a run: a stray exception lands here
            pass
    assert runner.stopping() == frozenset()


def test_a_cancel_of_a_job_no_thread_runs_here_is_ignored():
    runner = ThreadRunner(FunctionLoader(JOBS))
    runner.cancel(12345)
    assert runner.run(make_job(id=12345, func="testjobs:add", args=[2, 3])).result == 5
