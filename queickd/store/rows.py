"""Rows of the SQL stores (SQLite, PostgreSQL) to and from queickd's objects: one column
order and one encoding (JSON text for args, kwargs, retry, result, error) for both.

The job's select list, its row decoder, the insert's columns and values and the cron
template's JSON are derived from the job record's declaration (core/fields.py), by name;
nothing here lists a job field. Executes no SQL."""

from __future__ import annotations

import json
from typing import Any

from ..core import fields, jsontext
from ..core import retry as retry_mod
from ..core.job import Job, NewJob, State
from .records import CronRecord, Pause

dumps = jsontext.dumps  # the stores' JSON text (args, kwargs, results, errors)

EVENT_COLS = "event_id, state, func, key, created_at, attempts, next_attempt_at, job_id, last_error"


# --- derived from the job record's declaration (core/fields.py) ------------------------------
# How a stored value is decoded from its column `r` (an expression) and encoded from a value `v`.
_DECODE = {
    None: "{r}",
    "json": "loads({r}) if {r} else {empty}",
    "retry": "spec_from_dict(loads({r})) if {r} else None",
    "bool": "bool({r})",
}
_ENCODE = {
    None: "{v}",
    "json": "dumps({v}) if {v} else None",
    "retry": "dumps({v}.to_dict()) if {v} else None",
    "bool": "{v}",  # sqlite3 binds a bool as 0/1; PostgreSQL's column is boolean
}
_NS = {"loads": jsontext.loads, "dumps": dumps, "spec_from_dict": retry_mod.spec_from_dict, "Job": Job}
# PostgreSQL array types of the insert's unnest, by declared SQL type.
_PG_ARRAY = {"BIGINT": "bigint[]", "INTEGER": "int[]", "REAL": "float8[]", "TEXT": "text[]",
             "BOOLEAN": "bool[]"}

JOB_COLS = ", ".join(f.name for f in fields.JOB_FIELDS)  # the select list row_to_job reads


def _row_decoder() -> Any:
    parts = []
    for i, f in enumerate(fields.JOB_FIELDS):  # the position of each name in JOB_COLS
        empty = repr(f.fresh_default()) if f.codec == "json" else "None"
        parts.append((f.name, _DECODE[f.codec].format(r=f"r[{i}]", empty=empty)))
    src = "def row_to_job(r):\n    return " + fields.positional_call("Job", parts)  # Job's order
    return fields.build_function("row_to_job", src, _NS)


row_to_job = _row_decoder()
row_to_job.__doc__ = "A row of JOB_COLS as a Job."

INSERT_COLS = tuple(f.name for f in fields.INSERTED)  # the columns of insert_values, in order
PG_INSERT_TYPES = tuple(_PG_ARRAY[f.sql] for f in fields.INSERTED)  # type: ignore[index]


_FROM = {fields.FROM_ID: "job_id", fields.FROM_STATE: "state", fields.FROM_NOW: "now"}


def _value(f: fields.Field) -> str:
    return _ENCODE[f.codec].format(v=_FROM.get(f.insert, f"j.{f.name}"))  # type: ignore[arg-type]


def _insert_encoder() -> Any:
    src = ("def insert_values(job_id, state, now, j):\n    return ("
           + ", ".join(_value(f) for f in fields.INSERTED) + ",)\n")
    return fields.build_function("insert_values", src, _NS)


insert_values = _insert_encoder()
insert_values.__doc__ = "The values of INSERT_COLS for a new job, encoded for either SQL store."


def insert_splitter(*shapes: tuple[str, ...]) -> Any:
    """split(ids, inserts, now) -> (rows of each shape..., full rows), for (_, _, NewJob)
    `inserts` as admission plans them. A job whose stored fields outside a shape's columns
    are all at their declared defaults (max_attempts follows retry) is a row of the first
    such shape, which leaves the other columns to their defaults; the others are rows of
    INSERT_COLS. One generated loop: a call or two per job would cost a few percent of the
    insert."""
    by_name = {f.name: f for f in fields.INSERTED}
    ns = {**_NS, "QUEUED": State.QUEUED, "SCHEDULED": State.SCHEDULED, "HELD": State.HELD}
    lists = [f"s{k}" for k in range(len(shapes))]
    branches = []
    for k, cols in enumerate(shapes):
        tests = []
        for f in fields.NEW_FIELDS:
            if f.job and f.name not in cols:
                if f.default is None:  # 0.0 or '' is a value here, not the default
                    tests.append(f"j.{f.name} is None")
                    continue
                falsy = f.default in (list, dict) or (not callable(f.default) and f.default in (0, False, ""))
                tests.append(f"not j.{f.name}" if falsy else f"j.{f.name} == d_{f.name}")
                ns[f"d_{f.name}"] = f.default
        row = ", ".join(_value(by_name[n]) for n in cols)
        branches.append(f"        {'if' if k == 0 else 'elif'} {' and '.join(tests) or 'True'}:\n"
                        f"            {lists[k]}.append(({row},))\n")
    full = ", ".join(_value(f) for f in fields.INSERTED)
    src = ("def split(ids, inserts, now):\n"
           + "".join(f"    {name} = []\n" for name in lists) + "    full = []\n"
           "    for job_id, (_, _, j) in zip(ids, inserts, strict=True):\n"
           "        state = HELD if j.held else QUEUED if j.run_at <= now else SCHEDULED\n"  # job.insert_state
           + "".join(branches)
           + f"        else:\n            full.append(({full},))\n"
           f"    return {', '.join(lists)}, full\n")
    return fields.build_function("split", src, ns)


# The narrow shapes of an insert, for both SQL stores. Binding (or formatting for COPY) 5
# values instead of 26 is most of an insert's cost in Python: a job with its other fields at
# their declared defaults, which both schemas' column defaults equal, is a row of these.
PLAIN_COLS = ("id", "state", "func", "run_at", "created_at")
# ... a job in a concurrency group: these and its group's three.
GROUPED_COLS = (*PLAIN_COLS, "concurrency_group", "concurrency_limit", "cost_units")
# ... a job with arguments and an idempotency key (every JobQueue.enqueue gives one).
KEYED_COLS = (*PLAIN_COLS, "args", "kwargs", "key", "idempotency_key")
# ... a job under a rate limit (core/policy/rates.py), with or without those.
RATED_COLS = (*KEYED_COLS, "rate_limit")
SHAPES = (PLAIN_COLS, GROUPED_COLS, KEYED_COLS, RATED_COLS, INSERT_COLS)  # split_inserts' lists, in order
split_inserts = insert_splitter(PLAIN_COLS, GROUPED_COLS, KEYED_COLS, RATED_COLS)
split_inserts.__doc__ = ("split_inserts(ids, inserts, now) -> (plain, grouped, keyed, rated, full): the rows of each"
                         " of SHAPES, for (_, _, NewJob) inserts as admission plans them.")


def _template_encoder() -> Any:
    parts = [f'"{f.name}": ' + ("t.retry.to_dict() if t.retry else None" if f.codec == "retry" else f"t.{f.name}")
             for f in fields.TEMPLATE_FIELDS]
    src = "def template_to_json(t):\n    return dumps({" + ", ".join(parts) + "})\n"
    return fields.build_function("template_to_json", src, _NS)


template_to_json = _template_encoder()
template_to_json.__doc__ = "A cron's (or an event's) job template as stored."
_TEMPLATE_RETRY = tuple(f.name for f in fields.TEMPLATE_FIELDS if f.codec == "retry")


def template_from_json(s: str) -> NewJob:
    d = json.loads(s)
    for name in _TEMPLATE_RETRY:
        d[name] = retry_mod.spec_from_dict(d.get(name))
    return NewJob(**d)


def row_to_cron(r: tuple) -> CronRecord:
    """A row of (name, schedule, template, next_run_at, last_fired_at, created_at, folded)."""
    return CronRecord(name=r[0], schedule=json.loads(r[1]), template=template_from_json(r[2]),
                      next_run_at=r[3], last_fired_at=r[4], created_at=r[5], folded=r[6])


def row_to_pause(r: tuple) -> Pause:
    """A row of (kind, name, since, failures, last_error, probe_at, trips, probe_job)."""
    return Pause(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None, *r[5:8])


PAUSE_COLS = "kind, name, paused_at, failures, last_error, probe_at, trips, probe_job"
