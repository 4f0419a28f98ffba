"""Unit tests for queickd.core.protocol: request decoding, job/cron validation and error replies."""

from __future__ import annotations

import json
import math

import pytest
from protocol_asserts import NOW, bad_request

from queickd.core import arguments
from queickd.core.job import NewJob
from queickd.core.protocol import (
    MAX_BATCH,
    MAX_KEY_LEN,
    Code,
    QueueError,
    decode_line,
    encode,
    parse_job,
    parse_jobs,
)
from queickd.core.retry import RETRY_TYPE, make_spec

# --- decode_line ------------------------------------------------------------------------------


def test_decode_line_returns_the_request_object():
    assert decode_line('{"op":"get","job_id":3}') == {"op": "get", "job_id": 3}


def test_decode_line_accepts_utf8_bytes():
    assert decode_line(b'{"op":"hello","client":"caf\xc3\xa9"}') == {"op": "hello", "client": "café"}


def test_decode_line_rejects_text_that_is_not_json():
    e = bad_request(decode_line, "{op: get}")
    assert "not JSON" in e.message


def test_decode_line_rejects_bytes_that_are_not_utf8():
    bad_request(decode_line, b'{"op":"\xff"}')


@pytest.mark.parametrize("line", ["[1, 2]", '"stats"', "3", "null"])
def test_decode_line_rejects_json_that_is_not_an_object(line):
    e = bad_request(decode_line, line)
    assert "object" in e.message


@pytest.mark.parametrize("line", ['{"job_id": 1}', '{"op": 5}', '{"op": null}'])
def test_decode_line_rejects_a_request_without_an_op_string(line):
    e = bad_request(decode_line, line)
    assert "'op'" in e.message


def test_decode_line_rejects_an_unknown_op():
    e = bad_request(decode_line, '{"op":"explode"}')
    assert "explode" in e.message


def test_decode_line_rejects_an_unknown_field_and_names_it():
    e = bad_request(decode_line, '{"op":"get","job_id":1,"color":"red"}')
    assert "color" in e.message


def test_decode_line_rejects_a_field_of_another_op():
    bad_request(decode_line, '{"op":"stats","job_id":1}')


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_decode_line_rejects_numbers_that_are_not_strict_json(number):
    e = bad_request(decode_line, '{"op":"enqueue","func":"m:f","delay":' + number + "}")
    assert e.message.startswith(f"delay: {number} is not a number queickd can hold")


def test_decode_line_an_integer_too_large_for_a_float_reaches_parse_job_intact():
    req = decode_line('{"op":"enqueue","func":"m:f","run_at":1' + "0" * 400 + "}")
    assert req["run_at"] == 10**400


# --- encode -----------------------------------------------------------------------------------


def test_encode_ends_with_a_single_newline():
    out = encode({"ok": True})
    assert out.endswith(b"\n")
    assert out.count(b"\n") == 1


def test_encode_is_compact_json():
    assert encode({"ok": True, "job_ids": [1, 2]}) == b'{"ok":true,"job_ids":[1,2]}\n'


def test_encode_writes_non_ascii_as_utf8():
    assert encode({"s": "é"}) == '{"s":"é"}\n'.encode()


def test_encode_round_trips_through_json():
    reply = {"ok": False, "error": {"code": "x", "message": "y"}, "retry_after": 1.5}
    assert json.loads(encode(reply)) == reply


# --- QueueError ---------------------------------------------------------------------------------


def test_queue_error_to_reply_without_retry_after_has_no_such_key():
    reply = QueueError(Code.NOT_FOUND, "no job 3").to_reply()
    assert reply == {"ok": False, "error": {"code": "not_found", "message": "no job 3"}}


def test_queue_error_to_reply_includes_retry_after_when_set():
    reply = QueueError(Code.QUEUE_FULL, "full", retry_after=2.5).to_reply()
    assert reply["retry_after"] == 2.5


def test_queue_error_to_reply_includes_a_zero_retry_after():
    assert "retry_after" in QueueError(Code.QUEUE_FULL, "full", retry_after=0.0).to_reply()


def test_queue_error_from_reply_round_trips():
    e = QueueError.from_reply(QueueError(Code.QUEUE_FULL, "full", retry_after=2.5).to_reply())
    assert (e.code, e.message, e.retry_after) == ("queue_full", "full", 2.5)


def test_queue_error_from_reply_without_error_is_internal():
    e = QueueError.from_reply({"ok": False})
    assert e.code == Code.INTERNAL
    assert e.retry_after is None


def test_queue_error_str_shows_code_and_message():
    assert str(QueueError(Code.CONFLICT, "busy")) == "conflict: busy"


# --- parse_job: func, args, kwargs -------------------------------------------------------------


def test_parse_job_minimal_spec_gets_defaults():
    assert parse_job({"func": "m:f"}, NOW) == NewJob(func="m:f", run_at=NOW)


def test_parse_job_keeps_colon_func():
    assert parse_job({"func": "pkg.mod:fn"}, NOW).func == "pkg.mod:fn"


def test_parse_job_normalizes_dotted_func_to_colon():
    assert parse_job({"func": "pkg.mod.fn"}, NOW).func == "pkg.mod:fn"


@pytest.mark.parametrize(
    "func",
    [None, 5, "", "fn", "m:", ":f", "m:f:g", "m:f.g", "1m:f", "m:1f", "m f:g", "m-x:f", "m..x:f"],
)
def test_parse_job_rejects_a_func_that_is_not_module_and_function(func):
    e = bad_request(parse_job, {"func": func}, NOW)
    assert "func" in e.message


def test_parse_job_rejects_a_func_with_a_trailing_newline():
    bad_request(parse_job, {"func": "m:f\n"}, NOW)


def test_parse_job_keeps_args_and_kwargs():
    job = parse_job({"func": "m:f", "args": [1, "a"], "kwargs": {"x": None}}, NOW)
    assert (job.args, job.kwargs) == ([1, "a"], {"x": None})


def test_parse_job_null_args_and_kwargs_are_empty():
    job = parse_job({"func": "m:f", "args": None, "kwargs": None}, NOW)
    assert (job.args, job.kwargs) == ([], {})


@pytest.mark.parametrize("args", [{"a": 1}, "abc", 3, (1, 2)])
def test_parse_job_args_must_be_a_list(args):
    e = bad_request(parse_job, {"func": "m:f", "args": args}, NOW)
    assert "args" in e.message


@pytest.mark.parametrize("kwargs", [[1], "abc", 3])
def test_parse_job_kwargs_must_be_a_dict(kwargs):
    e = bad_request(parse_job, {"func": "m:f", "kwargs": kwargs}, NOW)
    assert "kwargs" in e.message


def test_parse_job_rejects_an_unknown_field():
    e = bad_request(parse_job, {"func": "m:f", "deadline": 3}, NOW)
    assert "deadline" in e.message


def test_parse_job_ignores_the_op_field():
    assert parse_job({"op": "enqueue", "func": "m:f"}, NOW).func == "m:f"


def test_parse_job_rejects_a_job_that_is_not_an_object():
    bad_request(parse_job, ["m:f"], NOW)


# --- parse_job: run_at, delay, priority --------------------------------------------------------


def test_parse_job_without_time_runs_now():
    assert parse_job({"func": "m:f"}, NOW).run_at == NOW


def test_parse_job_keeps_run_at():
    assert parse_job({"func": "m:f", "run_at": NOW + 99}, NOW).run_at == NOW + 99


def test_parse_job_delay_is_added_to_now():
    assert parse_job({"func": "m:f", "delay": 30}, NOW).run_at == NOW + 30


def test_parse_job_zero_delay_runs_now():
    assert parse_job({"func": "m:f", "delay": 0}, NOW).run_at == NOW


def test_parse_job_rejects_both_run_at_and_delay():
    e = bad_request(parse_job, {"func": "m:f", "run_at": NOW, "delay": 1}, NOW)
    assert "not both" in e.message


def test_parse_job_rejects_a_negative_delay():
    e = bad_request(parse_job, {"func": "m:f", "delay": -1}, NOW)
    assert "negative" in e.message


@pytest.mark.parametrize("field", ["run_at", "delay"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_parse_job_rejects_non_finite_times(field, value):
    e = bad_request(parse_job, {"func": "m:f", field: value}, NOW)
    assert "finite" in e.message


@pytest.mark.parametrize("field", ["run_at", "delay"])
@pytest.mark.parametrize("value", [True, False, "10", [1]])
def test_parse_job_rejects_times_that_are_not_numbers(field, value):
    bad_request(parse_job, {"func": "m:f", field: value}, NOW)


def test_parse_job_rejects_an_integer_time_too_large_for_a_float():
    bad_request(parse_job, {"func": "m:f", "run_at": 10**400}, NOW)


def test_parse_job_keeps_an_integer_priority():
    assert parse_job({"func": "m:f", "priority": -5}, NOW).priority == -5


@pytest.mark.parametrize("priority", [1.5, "1", True, None, 2**31 + 1, -(2**31) - 1])
def test_parse_job_rejects_a_priority_that_is_not_a_bounded_integer(priority):
    e = bad_request(parse_job, {"func": "m:f", "priority": priority}, NOW)
    assert f"priority must be an integer from {-(2**31 - 1)} to {2**31 - 1}" in e.message


def test_a_run_at_in_milliseconds_is_refused_naming_seconds():
    e = bad_request(parse_job, {"func": "m:f", "run_at": NOW * 1000}, NOW)
    assert "unix seconds" in e.message

def test_a_delay_that_lands_past_the_year_9999_is_refused():
    bad_request(parse_job, {"func": "m:f", "delay": 1e300}, NOW)


# --- parse_job: retry ---------------------------------------------------------------------------


def test_parse_job_retry_true_is_the_default_spec():
    assert parse_job({"func": "m:f", "retry": True}, NOW).retry == make_spec()


@pytest.mark.parametrize("retry", [False, None])
def test_parse_job_retry_false_or_null_is_no_retry(retry):
    job = parse_job({"func": "m:f", "retry": retry}, NOW)
    assert job.retry is None
    assert job.max_attempts == 1


def test_parse_job_retry_object_fills_in_defaults_for_its_policy():
    job = parse_job({"func": "m:f", "retry": {"policy": "constant", "max_attempts": 3}}, NOW)
    assert job.retry == make_spec(RETRY_TYPE.CONSTANT, max_attempts=3)
    assert job.max_attempts == 3


def test_parse_job_retry_object_keeps_all_given_fields():
    retry = {"policy": "linear_increasing", "interval": 2, "max_interval": 9, "max_attempts": 4}
    assert parse_job({"func": "m:f", "retry": retry}, NOW).retry == make_spec(**retry)


def test_parse_job_rejects_an_unknown_retry_field():
    e = bad_request(parse_job, {"func": "m:f", "retry": {"backoff": 2}}, NOW)
    assert "backoff" in e.message


def test_parse_job_rejects_an_unknown_retry_policy():
    e = bad_request(parse_job, {"func": "m:f", "retry": {"policy": "fibonacci"}}, NOW)
    assert "policy" in e.message


def test_parse_job_rejects_zero_max_attempts():
    e = bad_request(parse_job, {"func": "m:f", "retry": {"max_attempts": 0}}, NOW)
    assert "max_attempts" in e.message


@pytest.mark.parametrize("attempts", [2.0, "3", True])
def test_parse_job_rejects_max_attempts_that_is_not_an_integer(attempts):
    e = bad_request(parse_job, {"func": "m:f", "retry": {"max_attempts": attempts}}, NOW)
    assert "max_attempts" in e.message


@pytest.mark.parametrize("field", ["interval", "max_interval"])
@pytest.mark.parametrize("value", [math.nan, math.inf, True, "5"])
def test_parse_job_rejects_retry_intervals_that_are_not_finite_numbers(field, value):
    e = bad_request(parse_job, {"func": "m:f", "retry": {field: value}}, NOW)
    assert field in e.message


def test_parse_job_rejects_a_non_positive_retry_interval():
    bad_request(parse_job, {"func": "m:f", "retry": {"interval": 0}}, NOW)


@pytest.mark.parametrize("retry", [[1], "yes", 3])
def test_parse_job_rejects_a_retry_that_is_not_object_or_bool(retry):
    e = bad_request(parse_job, {"func": "m:f", "retry": retry}, NOW)
    assert "retry" in e.message


def test_parse_job_keeps_retry_on_network():
    assert parse_job({"func": "m:f", "retry_on_network": True}, NOW).retry_on_network is True


@pytest.mark.parametrize("value", [1, "true", None])
def test_parse_job_retry_on_network_must_be_a_bool(value):
    e = bad_request(parse_job, {"func": "m:f", "retry_on_network": value}, NOW)
    assert "retry_on_network" in e.message


# --- parse_job: key, idempotency_key -------------------------------------------------------


@pytest.mark.parametrize("field", ["key", "idempotency_key"])
def test_parse_job_accepts_a_key_of_max_length(field):
    job = parse_job({"func": "m:f", field: "k" * MAX_KEY_LEN}, NOW)
    assert getattr(job, field) == "k" * MAX_KEY_LEN


@pytest.mark.parametrize("field", ["key", "idempotency_key"])
def test_parse_job_rejects_a_key_longer_than_max_length(field):
    e = bad_request(parse_job, {"func": "m:f", field: "k" * (MAX_KEY_LEN + 1)}, NOW)
    assert field in e.message


@pytest.mark.parametrize("field", ["key", "idempotency_key"])
@pytest.mark.parametrize("value", ["", 5, ["k"]])
def test_parse_job_rejects_a_key_that_is_not_a_non_empty_string(field, value):
    bad_request(parse_job, {"func": "m:f", field: value}, NOW)


# --- parse_job: resource control's fields -------------------------------------------------------


def test_parse_job_reads_a_grouped_job_as_it_reads_one_with_any_other_field():
    # A job with only func, args, kwargs and resource control's fields takes a shorter
    # way through parse_job; with one field more (priority 0, its default) it takes the
    # general one. Both give the same job, or the same error.
    import random

    rnd = random.Random(3)
    values = {"concurrency_group": ["api", "", None, 7, "x" * (MAX_KEY_LEN + 1)],
              "concurrency_limit": [1, 1000, 0, -2, None, True, 2.5, "3"],
              "cost_units": [1, 0.5, 2.0, 0, -1, None, True, float("inf"), "1"],
              "args": [None, [1], "no"], "kwargs": [None, {"a": 1}, [1]]}
    for _ in range(500):
        spec = {"func": rnd.choice(["m:f", "pkg.m.f", "bad"])}
        spec.update({k: rnd.choice(v) for k, v in values.items() if rnd.random() < 0.6})
        outcomes = []
        for s in (spec, {**spec, "priority": 0}):
            try:
                outcomes.append(parse_job(s, NOW))
            except QueueError as e:
                outcomes.append((e.code, e.message))
        assert outcomes[0] == outcomes[1], spec


# --- parse_jobs -----------------------------------------------------------------------------------


def test_parse_jobs_parses_every_job_in_order():
    jobs = parse_jobs({"jobs": [{"func": "a:f"}, {"func": "b:g", "delay": 5}]}, NOW)
    assert [(j.func, j.run_at) for j in jobs] == [("a:f", NOW), ("b:g", NOW + 5)]


@pytest.mark.parametrize("jobs", [[], None, {"func": "m:f"}])
def test_parse_jobs_needs_a_non_empty_list(jobs):
    e = bad_request(parse_jobs, {"jobs": jobs}, NOW)
    assert "non-empty" in e.message


def test_parse_jobs_rejects_more_than_max_batch():
    e = bad_request(parse_jobs, {"jobs": [{"func": "m:f"}] * (MAX_BATCH + 1)}, NOW)
    assert str(MAX_BATCH) in e.message


def test_parse_jobs_accepts_exactly_max_batch():
    assert len(parse_jobs({"jobs": [{"func": "m:f"}] * MAX_BATCH}, NOW)) == MAX_BATCH


def test_parse_jobs_error_names_the_index_of_the_bad_job():
    e = bad_request(parse_jobs, {"jobs": [{"func": "m:f"}, {"func": "m:f"}, {"func": "nope"}]}, NOW)
    assert e.message.startswith("jobs[2]: ")
    assert "func" in e.message


@pytest.mark.parametrize("job_id", [0, -5, 2**63, "7", True])
def test_a_job_id_out_of_range_is_refused_naming_the_range(job_id):
    e = bad_request(arguments.job_id, {"job_id": job_id})
    assert e.message == f"job_id must be an integer from 1 to {2**63 - 1}"
