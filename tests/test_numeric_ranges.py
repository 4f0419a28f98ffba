"""Every field of every op, given a number no field can hold (10**309, -10**309, 1e309,
NaN, Infinity, an integer of 5000 digits), over a real TCP connection: the reply is
bad_request naming the field, and the daemon logs no traceback. The fields come from the
protocol's own tables (protocol.OPS, the job record's enqueue fields, retry's, a
workflow's budgets and step fields), so a field added there is covered here."""

from __future__ import annotations

import json
import socket

import pytest

from queickd.core import fields, protocol
from queickd.core.workflow import model

HUGE = ["1" + "0" * 309, "-1" + "0" * 309, "1e309", "-1e309", "NaN", "Infinity", "-Infinity",
        "9" * 5000, "-9" * 1 + "9" * 4999]
PLACEHOLDER = "__value_under_test__"
# A request each op accepts as it stands (the field under test replaces one of its values).
BASE: dict[str, dict] = {
    "hello": {}, "enqueue": {"func": "testjobs:noop"}, "enqueue_many": {"jobs": [{"func": "testjobs:noop"}]},
    "event": {"event_id": "e1", "func": "testjobs:noop"}, "get": {"job_id": 1},
    "wait": {"job_id": 1, "timeout": 0}, "cancel": {"state": "queued", "dry_run": True}, "retry": {"job_id": 1}, "dead": {},
    "purge": {"older_than": 3600}, "resume": {"key": "k"}, "pause": {"key": "k"}, "drain": {"off": True},
    "jobs": {}, "stats": {}, "cron": {"every": 60, "func": "testjobs:noop"}, "crons": {},
    "cron_delete": {"name": "c"}, "set_pool": {"job_id": 1, "pool": "p"},
    "workflow_start": {"definition": {"name": "w", "steps": [{"func": "testjobs:noop"}]}},
    "workflow_get": {"run_id": 1}, "workflow_wait": {"run_id": 1, "timeout": 0},
    "workflow_cancel": {"run_id": 1}, "workflows": {},
}
# Fields that take any JSON value and read a number as "not true" or as text: they never
# do arithmetic on it. Every other field refuses these numbers by name.
ANY_VALUE = {("hello", "client"), ("hello", "token"), ("stats", "detail"), ("drain", "wait"),
             ("drain", "off"), ("retry", "all"), ("cancel", "dry_run")}


def _cases() -> list[tuple[str, str, dict]]:
    """(op, the field's path as the message names it, the request with PLACEHOLDER in it)."""
    cases = []
    for op, names in protocol.OPS.items():
        for name in sorted(names):
            if (op, name) not in ANY_VALUE:
                cases.append((op, name, {"op": op, **BASE[op], name: PLACEHOLDER}))
    for name in sorted(fields.ENQUEUE_WIRE | {"delay"}):
        cases.append(("enqueue_many", name, {"op": "enqueue_many",
                                             "jobs": [{"func": "testjobs:noop", name: PLACEHOLDER}]}))
    for name in sorted(protocol._RETRY_FIELDS - {"policy"}):
        cases.append(("enqueue", name, {"op": "enqueue", "func": "testjobs:noop", "retry": {name: PLACEHOLDER}}))
    for name in model.BUDGETS:
        cases.append(("workflow_start", name, {"op": "workflow_start", "definition": {
            "name": "w", "steps": [{"func": "testjobs:noop"}], "budget": {name: PLACEHOLDER}}}))
    for name in sorted(model.JOB_WIRE | {"n"}):
        step = {"func": "testjobs:noop", name: PLACEHOLDER}
        if name == "n":
            step = {"kind": "for_each", "items": "xs", "mode": "quorum", "func": "testjobs:noop", "n": PLACEHOLDER}
        cases.append(("workflow_start", name, {"op": "workflow_start", "definition": {"name": "w", "steps": [step]}}))
    return cases


CASES = _cases()


@pytest.mark.parametrize("op", sorted({op for op, _, _ in CASES}))
def test_a_number_no_field_can_hold_is_refused_naming_the_field(start_daemon, op):
    d = start_daemon(None)
    sent, lines = [], []
    for case_op, name, request in CASES:
        if case_op != op:
            continue
        text = json.dumps(request)
        for value in HUGE:
            sent.append((name, value[:12]))
            lines.append(text.replace(json.dumps(PLACEHOLDER), value).encode() + b"\n")
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as s:
        s.sendall(b"".join(lines))
        f = s.makefile("rb")
        replies = [json.loads(f.readline()) for _ in lines]
    wrong = [(name, value, r) for (name, value), r in zip(sent, replies, strict=True)
             if r.get("ok") is not False or r["error"]["code"] != "bad_request" or name not in r["error"]["message"]]
    assert wrong == []
    with d.client() as q:
        q.stats()  # the daemon still serves, and has logged all it will about these
    assert not [line for line in d.lines if "Traceback" in line or "internal error" in line]


# Finite numbers far before 1970: a time no job or schedule can have, and one a cron's next
# tick overflowed on (start_at -1.7e308 every 0.1 s: OverflowError; every 100 years: a tick
# near 1e292, so it never fired).
TIMES_BEFORE_1970 = [
    ("run_at", {"op": "enqueue", "func": "testjobs:noop", "run_at": -1.7e308}),
    ("run_at", {"op": "enqueue_many", "jobs": [{"func": "testjobs:noop", "run_at": -1.7e308}]}),
    ("start_at", {"op": "cron", "name": "c1", "func": "testjobs:noop", "every": 0.1, "start_at": -1.7e308}),
    ("start_at", {"op": "cron", "name": "c2", "func": "testjobs:noop", "every": 3162240000, "start_at": -1.7e308}),
]


def test_a_time_before_1970_is_refused_naming_the_field(start_daemon):
    d = start_daemon(None)
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as s:
        s.sendall(b"".join(json.dumps(request).encode() + b"\n" for _, request in TIMES_BEFORE_1970))
        f = s.makefile("rb")
        replies = [json.loads(f.readline()) for _ in TIMES_BEFORE_1970]
    wrong = [(name, r) for (name, _), r in zip(TIMES_BEFORE_1970, replies, strict=True)
             if r.get("ok") is not False or r["error"]["code"] != "bad_request" or name not in r["error"]["message"]]
    assert wrong == []
    with d.client() as q:
        assert q.crons() == []
    assert not [line for line in d.lines if "Traceback" in line or "internal error" in line]
