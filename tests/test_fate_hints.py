"""Exceptions that tell the queue how to treat them: `permanent` and `retry_after`."""

from __future__ import annotations

from test_fate import NOW, failed, make_job, raised

from queickd.core.fate import after_failure
from queickd.core.job import State


class RejectedError(Exception):
    permanent = True


class RateLimitedError(Exception):
    def __init__(self, retry_after: object) -> None:
        super().__init__("slow down")
        self.retry_after = retry_after


class RejectedConnectionError(ConnectionError):
    permanent = True


def test_a_permanent_error_is_dead_at_once_with_retries_left():
    o = after_failure(make_job(), failed(raised(RejectedError("invalid_auth"))), NOW)
    assert o.state == State.DEAD and o.error["message"] == "invalid_auth"


def test_a_permanent_error_is_not_parked_even_when_network_class():
    o = after_failure(make_job(retry_on_network=True), failed(raised(RejectedConnectionError())), NOW, network_checker=True)
    assert o.state == State.DEAD


def test_retry_after_replaces_the_policys_delay():
    o = after_failure(make_job(), failed(raised(RateLimitedError(3))), NOW)  # the policy would wait 10 s
    assert o.state == State.SCHEDULED and o.run_at == NOW + 3


def test_retry_after_still_counts_against_max_attempts():
    o = after_failure(make_job(attempts=3), failed(raised(RateLimitedError(3))), NOW)
    assert o.state == State.DEAD


def test_a_nonsensical_retry_after_falls_back_to_the_policy():
    for bad in ("3", -1, True, float("nan"), 10**9):
        o = after_failure(make_job(), failed(raised(RateLimitedError(bad))), NOW)
        assert o.run_at == NOW + 10, bad
