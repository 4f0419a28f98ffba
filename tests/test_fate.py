"""Unit tests for queickd.core.fate: network-error classification, result storage, and the
outcomes it decides from a run's report (built from the exception as the runners do)."""

from __future__ import annotations

import dataclasses
import errno
import http.client
import random
import socket
import urllib.error

import pytest

from queickd.core.fate import after_failure, after_success, is_network_error, storable_result
from queickd.core.job import Job, State
from queickd.core.retry import RETRY_TYPE, delay, make_spec
from queickd.run import capture
from queickd.run.base import RunReport

NOW = 1_750_000_000.0


def make_job(**overrides) -> Job:
    """A running job with every field set; retries: constant 10 s, 3 attempts, 1 spent."""
    retry = make_spec(RETRY_TYPE.CONSTANT, interval=10.0, max_attempts=3)
    fields = dict(
        id=7,
        func="m:f",
        args=[],
        kwargs={},
        state=State.RUNNING,
        priority=0,
        run_at=NOW - 5,
        created_at=NOW - 10,
        attempts=1,
        max_attempts=3,
        retry=retry,
        retry_on_network=False,
        key=None,
        idempotency_key=None,
        cron=None,
        orphaned=0,
        started_at=NOW - 1,
        finished_at=None,
        result=None,
        error=None,
    )
    fields.update(overrides)
    return Job(**fields)


def raised(exc: BaseException) -> BaseException:
    """The exception after it was actually raised (so it carries a traceback)."""
    try:
        raise exc
    except BaseException as e:
        return e


def failed(exc: BaseException) -> RunReport:
    """The report a runner makes of a run that raised `exc`."""
    return capture.failed(exc, 0.0)


def chained(outer: BaseException, inner: BaseException, explicit: bool = True) -> BaseException:
    """`outer` raised while handling `inner` (`from inner` when explicit)."""
    try:
        try:
            raise inner
        except BaseException as e:
            if explicit:
                raise outer from e
            raise outer  # noqa: B904 - implicit chaining is what is being tested
    except BaseException as e:
        return e


# --- is_network_error -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        ConnectionResetError(),
        ConnectionError("down"),
        TimeoutError("timed out"),
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        urllib.error.URLError("no route"),
        http.client.RemoteDisconnected("closed"),
        http.client.IncompleteRead(b"partial"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_is_network_error_true_for_network_exception_types(exc):
    assert is_network_error(exc) is True


@pytest.mark.parametrize("code", [errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN])
def test_is_network_error_true_for_plain_oserror_with_network_errno(code):
    exc = OSError(code, "network trouble")
    assert type(exc) is OSError  # no dedicated subclass: the errno alone decides
    assert is_network_error(exc) is True


def test_is_network_error_false_for_a_missing_file():
    assert is_network_error(FileNotFoundError(errno.ENOENT, "no such file")) is False


def test_is_network_error_false_for_plain_oserror_with_other_errno():
    assert is_network_error(OSError(errno.EACCES, "denied")) is False


def test_is_network_error_false_for_an_http_error_reply():
    exc = urllib.error.HTTPError("http://example.invalid/", 503, "Unavailable", None, None)
    assert is_network_error(exc) is False


def test_is_network_error_false_for_value_error():
    assert is_network_error(ValueError("bad input")) is False


def test_is_network_error_true_for_error_raised_from_connection_error():
    assert is_network_error(chained(RuntimeError("fetch failed"), ConnectionError("down"))) is True


def test_is_network_error_true_for_error_raised_while_handling_a_timeout():
    exc = chained(KeyError("x"), TimeoutError(), explicit=False)
    assert is_network_error(exc) is True


def test_is_network_error_false_for_error_raised_from_an_http_error():
    http_error = urllib.error.HTTPError("http://example.invalid/", 500, "boom", None, None)
    assert is_network_error(chained(RuntimeError("api failed"), http_error)) is False


def test_is_network_error_false_for_error_raised_from_a_non_network_error():
    assert is_network_error(chained(RuntimeError("x"), ValueError("y"))) is False


# --- storable_result ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [None, True, 3, 2.5, "text", [1, "a", None], {"k": [1, 2], "n": {"x": 1.5}}]
)
def test_storable_result_keeps_json_values(value):
    assert storable_result(value) == value


def test_storable_result_turns_a_non_json_value_into_its_repr():
    assert storable_result({1, 2}) == repr({1, 2})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), [1.0, float("-inf")]])
def test_storable_result_turns_non_finite_floats_into_their_repr(value):
    assert storable_result(value) == repr(value)


def test_storable_result_turns_a_nested_non_json_value_into_a_repr_string():
    value = {"when": object()}
    result = storable_result(value)
    assert isinstance(result, str)
    assert result == repr(value)


def test_storable_result_over_the_limit_becomes_a_string_naming_the_limit():
    result = storable_result("x" * 100, limit=50)
    assert isinstance(result, str)
    assert "50-byte limit" in result
    assert "x" * 50 not in result


def test_storable_result_exactly_at_the_limit_is_kept():
    value = "x" * 48  # 50 bytes once quoted as JSON
    assert storable_result(value, limit=50) == value


def test_storable_result_limit_counts_utf8_bytes_not_characters():
    value = "é" * 30  # 30 characters, 62 bytes as JSON
    result = storable_result(value, limit=50)
    assert result != value
    assert "50-byte limit" in result


def test_storable_result_over_limit_non_json_value_names_the_limit():
    result = storable_result({i for i in range(1000)}, limit=100)
    assert "100-byte limit" in result


def test_after_success_stores_the_result():
    out = after_success(make_job(), capture.succeeded({"n": 1}, 0.0))
    assert (out.job_id, out.state, out.result) == (7, State.SUCCEEDED, {"n": 1})


# --- after_failure ----------------------------------------------------------------------------


def test_after_failure_retries_at_now_plus_the_policy_delay():
    out = after_failure(make_job(attempts=1), failed(ValueError("boom")), NOW)
    assert (out.job_id, out.state, out.run_at) == (7, State.SCHEDULED, NOW + 10.0)


def test_after_failure_retry_delay_uses_the_attempt_count():
    retry = make_spec(RETRY_TYPE.LINEAR_INCREASING, interval=5.0, max_attempts=5)
    out = after_failure(make_job(retry=retry, max_attempts=5, attempts=3), failed(ValueError()), NOW)
    assert out.run_at == NOW + 15.0


def test_after_failure_exponential_retry_uses_the_given_rand():
    retry = make_spec(RETRY_TYPE.EXPONENTIAL, interval=2.0, max_attempts=5)
    job = make_job(retry=retry, max_attempts=5, attempts=2)
    out = after_failure(job, failed(ValueError()), NOW, rand=random.Random(11))
    assert out.run_at == NOW + delay(retry, 2, random.Random(11))


def test_after_failure_records_the_error():
    out = after_failure(make_job(), failed(raised(ValueError("boom"))), NOW)
    assert out.error["type"] == "ValueError"
    assert out.error["message"] == "boom"
    assert "ValueError: boom" in out.error["traceback"]


def test_after_failure_is_dead_when_attempts_are_exhausted():
    out = after_failure(make_job(attempts=3, max_attempts=3), failed(ValueError("boom")), NOW)
    assert out.state == State.DEAD
    assert out.run_at is None


def test_a_run_lost_to_a_crash_does_not_count_against_max_attempts():
    job = make_job(attempts=3, max_attempts=3, orphaned=1)  # one of the three runs was an orphan
    out = after_failure(job, failed(ValueError("boom")), NOW)
    assert (out.state, out.run_at) == (State.SCHEDULED, NOW + 10.0)


def test_runs_lost_to_crashes_do_not_grow_the_backoff():
    retry = make_spec(RETRY_TYPE.LINEAR_INCREASING, interval=5.0, max_attempts=5)
    out = after_failure(make_job(retry=retry, max_attempts=5, attempts=3, orphaned=2), failed(ValueError()), NOW)
    assert out.run_at == NOW + 5.0  # the first failure's delay: the two runs before it were lost


def test_after_failure_is_dead_without_a_retry_spec():
    out = after_failure(make_job(retry=None, max_attempts=1, attempts=1), failed(ValueError()), NOW)
    assert out.state == State.DEAD


def test_after_failure_parks_network_failure_when_asked_and_checker_runs():
    job = make_job(retry_on_network=True)
    out = after_failure(job, failed(ConnectionRefusedError()), NOW, network_checker=True)
    assert out.state == State.WAITING_NETWORK
    assert out.error["type"] == "ConnectionRefusedError"


def test_after_failure_parks_network_failure_even_with_attempts_exhausted():
    job = make_job(retry_on_network=True, attempts=3, max_attempts=3)
    out = after_failure(job, failed(TimeoutError()), NOW, network_checker=True)
    assert out.state == State.WAITING_NETWORK


def test_a_network_failure_while_the_checker_says_up_is_retried_with_its_attempt_spent():
    # Its own server is unreachable, not the network: not parked, which would give the
    # attempt back and release it at every sweep for ever.
    job = make_job(retry_on_network=True, attempts=1, max_attempts=3)
    out = after_failure(job, failed(ConnectionRefusedError()), NOW, network_checker=True, network_up=True)
    assert (out.state, out.run_at) == (State.SCHEDULED, NOW + 10.0)


def test_a_network_failure_while_up_gets_ten_runs_a_minute_apart_without_a_policy():
    job = make_job(retry=None, retry_on_network=True, attempts=1, max_attempts=1)
    out = after_failure(job, failed(ConnectionRefusedError()), NOW, network_checker=True, network_up=True)
    assert (out.state, out.run_at) == (State.SCHEDULED, NOW + 60.0)


def test_a_network_failure_while_up_is_a_dead_letter_once_its_runs_are_spent():
    job = make_job(retry=None, retry_on_network=True, attempts=10, max_attempts=1)
    out = after_failure(job, failed(ConnectionRefusedError()), NOW, network_checker=True, network_up=True)
    assert out.state == State.DEAD and out.error["type"] == "ConnectionRefusedError"


def test_after_failure_does_not_park_without_a_network_checker():
    job = make_job(retry_on_network=True)
    out = after_failure(job, failed(ConnectionRefusedError()), NOW, network_checker=False)
    assert (out.state, out.run_at) == (State.SCHEDULED, NOW + 10.0)


def test_after_failure_does_not_park_when_the_job_did_not_ask():
    job = make_job(retry_on_network=False)
    out = after_failure(job, failed(ConnectionRefusedError()), NOW, network_checker=True)
    assert out.state == State.SCHEDULED


def test_after_failure_non_network_error_with_retry_on_network_follows_retry_policy():
    job = make_job(retry_on_network=True)
    out = after_failure(job, failed(ValueError("bad data")), NOW, network_checker=True)
    assert (out.state, out.run_at) == (State.SCHEDULED, NOW + 10.0)


def test_after_failure_non_network_error_with_retry_on_network_dies_when_exhausted():
    job = make_job(retry_on_network=True, attempts=3, max_attempts=3)
    out = after_failure(job, failed(ValueError("bad data")), NOW, network_checker=True)
    assert out.state == State.DEAD


def test_after_failure_parks_a_wrapped_network_failure():
    job = make_job(retry_on_network=True)
    exc = chained(RuntimeError("sync failed"), ConnectionResetError())
    assert after_failure(job, failed(exc), NOW, network_checker=True).state == State.WAITING_NETWORK


def test_after_failure_does_not_change_the_job():
    job = make_job()
    before = dataclasses.asdict(job)
    after_failure(job, failed(ValueError()), NOW)
    assert dataclasses.asdict(job) == before


def test_an_error_raised_from_none_inside_a_network_handler_is_not_a_network_error():
    try:
        try:
            raise ConnectionError("down")
        except ConnectionError:
            raise ValueError("bad reply") from None
    except ValueError as e:
        assert is_network_error(e) is False


# --- running out of file descriptors is the host's fault ----------------------------------------
@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE])
def test_a_run_failed_by_the_fd_limit_is_retried_blameless_even_without_a_policy(code):
    job = make_job(retry=None, max_attempts=1, attempts=1)
    o = after_failure(job, failed(raised(OSError(code, "Too many open files"))), NOW)
    assert (o.state, o.blameless) == (State.SCHEDULED, True) and o.run_at > NOW


def test_an_fd_limit_failure_wrapped_by_the_job_is_still_the_hosts():
    exc = chained(RuntimeError("could not open the report"), OSError(errno.EMFILE, "Too many open files"))
    assert after_failure(make_job(), failed(exc), NOW).blameless is True


def test_an_fd_limit_failure_gives_up_blameless_after_its_runs():
    job = make_job(retry=None, max_attempts=1, attempts=5)
    o = after_failure(job, failed(raised(OSError(errno.EMFILE, "Too many open files"))), NOW)
    assert (o.state, o.blameless) == (State.DEAD, True)


def test_a_missing_file_is_still_the_jobs_fault():
    o = after_failure(make_job(retry=None, max_attempts=1), failed(raised(FileNotFoundError(2, "gone"))), NOW)
    assert (o.state, o.blameless) == (State.DEAD, False)


@pytest.mark.parametrize("stopped", ["timeout", "stalled"])
def test_a_run_stopped_by_its_timeout_or_stall_retries_per_its_policy_whatever_it_raised(stopped):
    job = make_job()
    report = RunReport(False, None, stopped, "stopped", None, permanent=True, retry_after=999.0, network=True)
    out = after_failure(job, report, NOW, network_checker=True)
    assert out.state == State.SCHEDULED and out.run_at == NOW + 10.0
    assert out.error["type"] == stopped


def test_a_stalled_run_with_its_attempts_spent_is_dead():
    job = make_job(attempts=3)
    out = after_failure(job, RunReport(False, None, "stalled", "stopped", None), NOW)
    assert out.state == State.DEAD and out.error["type"] == "stalled"


# --- rate limits ------------------------------------------------------------------------
_RATED = {"key": "slack:#general", "limit": 1, "per": 1.0}


def test_a_rate_limited_job_told_to_wait_goes_back_to_its_place_with_its_key_blocked():
    from queickd import RateLimited

    job = make_job(rate_limit=_RATED, attempts=3)  # its last attempt by its policy
    out = after_failure(job, capture.failed(RateLimited(retry_after=2.5), 0.1), NOW)
    assert (out.state, out.rate_until, out.blameless, out.run_at) == (State.QUEUED, NOW + 2.5, True, None)


def test_a_429s_retry_after_on_any_exception_blocks_a_rate_limited_jobs_key():
    class TooManyRequestsError(Exception):
        retry_after = 30

    out = after_failure(make_job(rate_limit=_RATED), capture.failed(TooManyRequestsError("429"), 0.1), NOW)
    assert out.state == State.QUEUED and out.rate_until == NOW + 30


def test_a_job_without_a_rate_limit_told_to_wait_is_retried_by_its_policy():
    from queickd import RateLimited

    out = after_failure(make_job(), capture.failed(RateLimited(retry_after=2.5), 0.1), NOW)
    assert (out.state, out.run_at, out.rate_until) == (State.SCHEDULED, NOW + 2.5, None)


def test_a_rate_limited_job_failing_without_a_retry_after_follows_its_policy():
    out = after_failure(make_job(rate_limit=_RATED), capture.failed(ValueError("no"), 0.1), NOW)
    assert (out.state, out.run_at, out.rate_until) == (State.SCHEDULED, NOW + 10.0, None)
