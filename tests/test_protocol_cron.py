"""Unit tests for queickd.core.protocol.parse_cron: a cron registration's schedule, name and job template."""

from __future__ import annotations

from protocol_asserts import NOW, bad_request

from queickd.core.protocol import MAX_KEY_LEN, parse_cron


def test_parse_cron_with_expression_returns_name_schedule_and_template():
    name, schedule, template = parse_cron({"func": "m.f", "cron": "*/5 * * * *", "args": [1]}, NOW)
    assert schedule == {"cron": "*/5 * * * *"}
    assert (template.func, template.args) == ("m:f", [1])
    assert name == "m:f */5 * * * *"


def test_parse_cron_with_every_keeps_the_start():
    _, schedule, _ = parse_cron({"func": "m:f", "every": 60, "start_at": NOW + 10}, NOW)
    assert schedule == {"every": 60.0, "start_at": NOW + 10}


def test_parse_cron_every_without_start_starts_one_interval_after_now():
    _, schedule, _ = parse_cron({"func": "m:f", "every": 60}, NOW)
    assert schedule["start_at"] == NOW + 60


def test_parse_cron_needs_cron_or_every():
    e = bad_request(parse_cron, {"func": "m:f"}, NOW)
    assert "exactly one" in e.message


def test_parse_cron_rejects_both_cron_and_every():
    e = bad_request(parse_cron, {"func": "m:f", "cron": "* * * * *", "every": 60}, NOW)
    assert "exactly one" in e.message


def test_parse_cron_rejects_a_bad_expression_as_bad_request():
    bad_request(parse_cron, {"func": "m:f", "cron": "* * *"}, NOW)


def test_parse_cron_rejects_a_bad_every_as_bad_request():
    bad_request(parse_cron, {"func": "m:f", "every": -5}, NOW)


def test_parse_cron_rejects_an_every_too_large_for_a_float_as_bad_request():
    bad_request(parse_cron, {"func": "m:f", "every": 10**400, "start_at": NOW}, NOW)


def test_parse_cron_refuses_an_expression_that_never_fires_as_bad_request():
    e = bad_request(parse_cron, {"func": "m:f", "cron": "0 0 30 2 *"}, NOW)
    assert "never fires" in e.message


def test_parse_cron_refuses_a_start_past_the_year_9999_as_bad_request():
    bad_request(parse_cron, {"func": "m:f", "every": 60, "start_at": 1e20}, NOW)


def test_parse_cron_refuses_an_interval_over_a_century_as_bad_request():
    bad_request(parse_cron, {"func": "m:f", "every": 1e12}, NOW)


def test_parse_cron_validates_the_job_template():
    bad_request(parse_cron, {"func": "not a func", "cron": "* * * * *"}, NOW)


def test_parse_cron_uses_the_given_name():
    name, _, _ = parse_cron({"name": "nightly", "func": "m:f", "cron": "@daily"}, NOW)
    assert name == "nightly"


def test_parse_cron_rejects_a_name_longer_than_max_key_len():
    bad_request(parse_cron, {"name": "n" * (MAX_KEY_LEN + 1), "func": "m:f", "cron": "@daily"}, NOW)


def test_parse_cron_default_name_is_stable_for_identical_registrations():
    req = {"func": "m:f", "every": 60, "start_at": NOW}
    assert parse_cron(dict(req), NOW)[0] == parse_cron(dict(req), NOW + 500)[0]


def test_parse_cron_default_name_mentions_func_and_interval():
    name, _, _ = parse_cron({"func": "m:f", "every": 60, "start_at": NOW}, NOW)
    assert name == "m:f every 60s"


def test_parse_cron_default_name_differs_for_another_schedule():
    a = parse_cron({"func": "m:f", "cron": "@daily"}, NOW)[0]
    b = parse_cron({"func": "m:f", "cron": "@hourly"}, NOW)[0]
    assert a != b


def test_parse_cron_default_name_is_cut_to_max_key_len():
    func = "m" * 150 + ":" + "f" * 100
    name, _, _ = parse_cron({"func": func, "cron": "@daily"}, NOW)
    assert len(name) == MAX_KEY_LEN
