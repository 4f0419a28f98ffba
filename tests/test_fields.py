"""The job record's declaration (core/fields.py) and what is derived from it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from queickd.core import fields, protocol
from queickd.core.job import Job, NewJob, RetrySpec, new_record
from queickd.store import rows

NOW = 1_700_000_000.0


def test_the_job_dataclasses_have_the_declared_fields_in_order():
    assert [f.name for f in dataclasses.fields(Job)] == [f.name for f in fields.FIELDS if f.job]
    assert [f.name for f in dataclasses.fields(NewJob)] == [f.name for f in fields.FIELDS if f.new]


def test_a_stored_row_is_decoded_by_column_name():
    spec = RetrySpec("constant", 2.0, 2.0, 3)
    stored = {"id": 7, "func": "m:f", "args": "[1]", "kwargs": '{"a":2}', "state": "dead", "priority": 4,
              "run_at": NOW, "created_at": NOW - 1, "attempts": 3, "max_attempts": 3,
              "retry": json.dumps(spec.to_dict()), "retry_on_network": 1, "key": "k", "idempotency_key": "i",
              "cron": "c", "orphaned": 1, "started_at": NOW + 1, "finished_at": NOW + 2, "result": None,
              "error": '{"type":"E"}', "pool": "gpu"}
    names = [n.strip() for n in rows.JOB_COLS.split(",")]
    job = rows.row_to_job(tuple(stored.get(n) for n in names))  # columns added later: NULL
    assert {n: getattr(job, n) for n in stored} == dict(
        id=7, func="m:f", args=[1], kwargs={"a": 2}, state="dead", priority=4, run_at=NOW, created_at=NOW - 1,
        attempts=3, max_attempts=3, retry=spec, retry_on_network=True, key="k", idempotency_key="i", cron="c",
        orphaned=1, started_at=NOW + 1, finished_at=NOW + 2, result=None, error={"type": "E"}, pool="gpu")


def test_insert_values_name_each_inserted_column():
    new = NewJob("m:f", [1], {}, 2, NOW + 5, key="k", pool="gpu")
    values = dict(zip(rows.INSERT_COLS, rows.insert_values(9, "scheduled", NOW, new), strict=True))
    assert values.items() >= {"id": 9, "func": "m:f", "args": "[1]", "kwargs": None, "state": "scheduled",
                      "priority": 2, "run_at": NOW + 5, "created_at": NOW, "max_attempts": 1, "retry": None,
                      "retry_on_network": False, "key": "k", "idempotency_key": None, "cron": None,
                      "pool": "gpu"}.items()


def test_a_new_record_copies_the_jobs_arguments():
    new = NewJob("m:f", [1], {"a": 1}, 0, NOW)
    job = new_record(3, "queued", NOW, new)
    new.args.append(2)
    assert (job.id, job.state, job.created_at, job.args, job.attempts, job.pool) == (3, "queued", NOW, [1], 0,
                                                                                       "default")


def test_a_cron_template_is_stored_in_the_same_json_as_before():
    t = NewJob("m:f", [1], {"a": 1}, 2, NOW, retry=RetrySpec("constant", 1.0, 1.0, 2), key="k", manual=True)
    assert rows.template_to_json(t).startswith(  # fields added later come after these
        '{"func":"m:f","args":[1],"kwargs":{"a":1},"priority":2,"retry":{"policy":"constant","interval":1.0,'
        '"max_interval":1.0,"max_attempts":2},"retry_on_network":false,"key":"k","pool":"default"')
    assert rows.template_from_json(rows.template_to_json(t)) == dataclasses.replace(t, run_at=0.0, manual=False)


def test_the_protocol_accepts_the_declared_settable_fields_and_delay():
    assert protocol.OPS["enqueue"] == {f.name for f in fields.FIELDS if f.enqueue} | {"delay"}
    assert protocol.OPS["event"] - {"event_id"} == {f.name for f in fields.FIELDS if f.enqueue and f.template}


def test_only_the_fields_a_request_gives_are_checked():
    job = protocol.parse_job({"func": "m:f", "priority": 3, "pool": None}, NOW)
    assert (job.priority, job.pool, job.key, job.run_at) == (3, "default", None, NOW)


def test_the_client_sends_each_plain_keyword_given_under_its_wire_name_and_no_other():
    from queickd import JobQueue

    assert JobQueue.job("m:f") == {"func": "m:f"}
    given = {name: f"v-{name}" for name, _ in fields.CLIENT_PLAIN}
    spec = JobQueue.job("m:f", **given)
    assert {k: v for k, v in spec.items() if k != "func"} == {wire: f"v-{name}" for name, wire in fields.CLIENT_PLAIN}
    for name, wire in fields.CLIENT_PLAIN:
        assert JobQueue.job("m:f", **{name: 0}) == {"func": "m:f", wire: 0}  # given, though falsy


def _dataclasses_own_job() -> type:
    """Job as dataclasses alone builds it, __init__ included: the reference for Job's own."""
    return dataclasses.make_dataclass("Job", fields.dataclass_fields(fields.JOB_FIELDS), frozen=True, slots=True)


def test_a_job_takes_the_same_arguments_as_the_dataclass_it_is():
    import inspect

    assert inspect.signature(Job) == inspect.signature(_dataclasses_own_job())


def test_a_job_holds_every_argument_it_was_given_as_the_dataclass_would():
    reference = _dataclasses_own_job()
    values = {f.name: f"value of {f.name}" for f in dataclasses.fields(Job)}
    built, expected = Job(**values), reference(**values)
    assert {n: getattr(built, n) for n in values} == {n: getattr(expected, n) for n in values}
    positional = Job(*values.values())
    assert positional == built


def test_a_job_left_without_its_optional_fields_gets_their_declared_defaults():
    reference = _dataclasses_own_job()
    required = {f.name: 1 for f in dataclasses.fields(Job) if f.default is dataclasses.MISSING}
    built, expected = Job(**required), reference(**required)
    assert [getattr(built, f.name) for f in dataclasses.fields(Job)] == \
        [getattr(expected, f.name) for f in dataclasses.fields(Job)]
    assert built.pool == fields.DEFAULT_POOL


def test_a_job_cannot_be_changed_in_place():
    job = new_record(7, "queued", NOW, protocol.parse_job({"func": "m:f", "args": [1]}, NOW))
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = "running"
    assert dataclasses.replace(job, state="running").state == "running" and job.state == "queued"


@pytest.mark.parametrize("extra", ["a default factory", "a field left out of __init__", "a __post_init__"])
def test_a_dataclass_that_needs_dataclasses_own_init_is_refused_one(extra):
    spec = {"a default factory": dataclasses.field(default_factory=list),
            "a field left out of __init__": dataclasses.field(default=0, init=False)}.get(extra)
    ns = {"__post_init__": lambda self: None} if extra == "a __post_init__" else {}
    cls = dataclasses.make_dataclass("C", [("x", int), *([("y", int, spec)] if spec else [])],
                                     frozen=True, slots=True, namespace=ns)
    with pytest.raises(TypeError, match="dataclasses' own __init__"):
        fields.frozen_init(cls)
