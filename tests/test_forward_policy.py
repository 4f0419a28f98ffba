"""The pure rules of forwarding (core/policy/forward.py) and the [upstream] section's checks."""

from __future__ import annotations

import pytest

from queickd.core.job import NewJob, new_record
from queickd.core.policy import forward as policy
from queickd.core.retry import make_spec
from queickd.services.forwarder.settings import parse

T0 = 1_700_000_000.0


def _job(**kw):
    return new_record(7, "held", T0, NewJob("app:punch", held=True, **kw))


@pytest.mark.parametrize(("reply", "meaning"), [
    ({"ok": True, "job_id": 3}, policy.ACCEPTED),
    ({"ok": False, "error": {"code": "unauthorized"}}, policy.STOP),
    ({"ok": False, "error": {"code": "not_allowed"}}, policy.REFUSED),
    ({"ok": False, "error": {"code": "bad_request"}}, policy.REFUSED),
    ({"ok": False, "error": {"code": "not_found"}}, policy.REFUSED),
    ({"ok": False, "error": {"code": "queue_full", "retry_after": 5}}, policy.LATER),
    ({"ok": False, "error": {"code": "internal"}}, policy.LATER),
])
def test_an_upstream_reply_means_what_it_says(reply, meaning):
    assert policy.meaning(reply) == meaning


def test_a_forward_request_carries_the_jobs_fields_its_key_and_the_delay_left():
    job = _job(args=[1], kwargs={"b": 2}, key="badge", priority=-1, run_at=T0 + 30, idempotency_key="mine",
               retry=make_spec(), pool="slack")
    req = policy.request(job, "office-1", T0 + 10)
    assert req["idempotency_key"] == f"{policy.KEY_PREFIX}office-1:7:{T0:.6f}"
    assert (req["func"], req["args"], req["kwargs"], req["key"], req["priority"], req["pool"]) == (
        "app:punch", [1], {"b": 2}, "badge", -1, "slack")
    assert req["delay"] == pytest.approx(20) and "run_at" not in req
    assert req["retry"] == make_spec().to_dict()


def test_a_due_job_is_forwarded_without_a_delay_or_its_defaults():
    req = policy.request(_job(run_at=T0), "e", T0 + 5)
    assert set(req) == {"op", "func", "idempotency_key"}


def test_a_batch_takes_at_most_its_jobs_and_bytes_but_always_one():
    assert policy.cut([10] * 9, 4, 1000) == 4
    assert policy.cut([10] * 9, 100, 25) == 2
    assert policy.cut([500, 10], 100, 25) == 1
    assert policy.cut([], 10, 10) == 0


def test_pacing_lets_a_seconds_worth_through_then_spaces_the_rest():
    p = policy.Pacing(rate=1000)
    assert p.take(1000, T0) > 0  # an empty bucket at the start
    p = policy.Pacing(rate=1000, tokens=1000, at=T0)
    assert p.take(600, T0) == 0
    assert p.take(600, T0) == pytest.approx(0.2)
    assert policy.Pacing(rate=0).take(10**9, T0) == 0


def test_reconnects_back_off_doubling_to_their_most_and_reset_on_success():
    b = policy.Backoff(first=1, most=60)
    assert [b.failed() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    b.succeeded()
    assert b.failed() == 1


def test_routes_match_functions_by_fnmatch():
    r = policy.Route(("app:*", "queickd.attendance.*"))
    assert r.upstream("app:x") and r.upstream("queickd.attendance.slack:post_punch")
    assert not r.upstream("other:app")


def test_an_upstream_section_parses_with_its_defaults():
    s = parse({"url": "queickd+tls://central:9000", "functions": ["app:*"], "identity": "pi-1"})
    assert (s.host, s.port, s.tls, s.identity, s.batch_jobs, s.retry_max) == ("central", 9000, True, "pi-1", 500, 60.0)
    assert parse({}) is None


@pytest.mark.parametrize(("section", "says"), [
    ({"functions": ["a:*"]}, "url is required"),
    ({"url": "http://c:1", "functions": ["a:*"]}, "must be queickd"),
    ({"url": "queickd://c:1"}, "functions must be"),
    ({"url": "queickd://c:1", "functions": ["a:*"], "batch_jobs": 0}, "above 0"),
    ({"url": "queickd://c:1", "functions": ["a:*"], "timeout": -1}, "timeout must be"),
    ({"url": "queickd://c:1", "functions": ["a:*"], "colour": "red"}, "unknown setting"),
])
def test_a_bad_upstream_section_is_refused_naming_it(section, says):
    with pytest.raises(ValueError, match=says):
        parse(section)
