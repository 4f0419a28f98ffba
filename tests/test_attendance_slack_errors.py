"""How each Slack answer maps onto the queue's treatment of the post job."""

from __future__ import annotations

import pytest
from test_fate import NOW, failed, make_job, raised

from queickd.attendance.slack import (
    SlackError,
    SlackRateLimitedError,
    SlackRejectedError,
    SlackTarget,
    SlackUnavailableError,
    _classify,
)
from queickd.core.fate import after_failure, is_network_error
from queickd.core.job import State


@pytest.mark.parametrize(("status", "headers", "error", "kind"), [
    (429, {"Retry-After": "7"}, "ratelimited", SlackRateLimitedError),
    (200, {}, "ratelimited", SlackRateLimitedError),
    (503, {}, "", SlackUnavailableError),
    (500, {}, "internal_error", SlackUnavailableError),
    (200, {}, "service_unavailable", SlackUnavailableError),
    (200, {}, "invalid_auth", SlackRejectedError),
    (200, {}, "channel_not_found", SlackRejectedError),
    (404, {}, "channel_not_found", SlackRejectedError),  # what a webhook answers
    (403, {}, "invalid_token", SlackRejectedError),
    (200, {}, "something_new", SlackError),
])
def test_each_slack_answer_has_its_kind(status, headers, error, kind):
    assert type(_classify(status, headers, error)) is kind


def test_a_rate_limit_waits_what_retry_after_says():
    e = _classify(429, {"retry-after": "7"}, "")
    o = after_failure(make_job(), failed(raised(e)), NOW)
    assert o.state == State.SCHEDULED and o.run_at == NOW + 7


def test_an_unavailable_slack_parks_a_network_job():
    e = _classify(503, {}, "")
    assert is_network_error(e)
    o = after_failure(make_job(retry_on_network=True), failed(raised(e)), NOW, network_checker=True)
    assert o.state == State.WAITING_NETWORK and o.error["type"] == "SlackUnavailableError"


def test_a_refusal_is_a_dead_letter_that_names_the_error():
    o = after_failure(make_job(retry_on_network=True), failed(raised(_classify(200, {}, "invalid_auth"))), NOW, True)
    assert o.state == State.DEAD and "invalid_auth" in o.error["message"] and "queick retry" in o.error["message"]


def test_an_unknown_error_follows_the_retry_policy():
    o = after_failure(make_job(), failed(raised(_classify(200, {}, "something_new"))), NOW)
    assert o.state == State.SCHEDULED and o.run_at == NOW + 10


@pytest.mark.parametrize(("target", "message"), [
    (SlackTarget(token_file="/x", webhook_file="/y", channel="C"), "not both"),
    (SlackTarget(token_file=__file__), "needs a channel"),
    (SlackTarget(webhook_file=__file__, base_url="http://127.0.0.1/api"), "must end in '/'"),
    (SlackTarget(token_file="/nonexistent/token", channel="C"), "does not exist"),
])
def test_slack_settings_are_checked_before_the_terminal_starts(target, message):
    with pytest.raises(ValueError, match=message):
        target.validate()
