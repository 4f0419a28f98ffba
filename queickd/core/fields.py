"""The job record, declared once: every field's name, type, default, wire name, who may set
it, how the SQL stores keep it, and which shapes (NewJob, Job, cron template) carry it.

This module owns that table and the code derived from it that is not about SQL: the Job
and NewJob dataclasses (built in job.py from `dataclass_fields`), the wire field sets of
the protocol, the client's plain keyword copies and the building of a new stored record
from a NewJob. The SQL side (column lists, row decoding, insert tuples) is derived in
store/rows.py. It does no I/O and imports nothing of queickd.

Hot paths (a NewJob per enqueued job, a Job per decoded row) use functions generated
once at import from this table (`build_function`), never a loop over fields per record.

Adding a field: one `Field(...)` line here, one migration per SQL store (store/sqlite/
schema.py, store/postgres/schema.py), and the code that uses it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

DEFAULT_POOL = "default"  # the worker pool a job goes to when it names none


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()  # a field every record must be given

# Where a stored field's value comes from when a job is inserted.
FROM_NEW = "new"  # the NewJob attribute of the same name (a field or a property)
FROM_ID = "id"  # the id the store gave the job
FROM_STATE = "state"  # queued or scheduled, from run_at and now
FROM_NOW = "now"  # the time of the submit


@dataclass(frozen=True, slots=True)
class Field:
    """One field of the job record."""

    name: str
    type: str  # the annotation of the dataclass attribute
    default: Any = NO_DEFAULT  # list and dict mean a fresh empty one per record
    new: bool = True  # a NewJob attribute
    job: bool = True  # a Job attribute (a column of the SQL stores)
    enqueue: bool = False  # a client may set it in an enqueue request (its wire name)
    wire: str | None = None  # its name on the wire; the field's name when None
    client: bool = False  # JobQueue.job(...) copies its keyword of the same name as is
    template: bool = False  # a cron's (and an event's) job template keeps it
    sql: str | None = None  # INTEGER, BIGINT, REAL, TEXT or BOOLEAN; None for NewJob-only fields
    codec: str | None = None  # None: stored as is; "json": JSON text, NULL when empty;
    #                           "retry": a RetrySpec as JSON text; "bool": 0/1 or a boolean
    insert: str | None = None  # FROM_*: written by the insert; None: the column's default

    @property
    def wire_name(self) -> str:
        return self.wire or self.name

    def fresh_default(self) -> Any:
        d = self.default
        return d() if d in (list, dict) else d


_NEW = dict(insert=FROM_NEW)
# In Job order: the order of Job's attributes, of the wire form of a job (`get`, `jobs`)
# and of the SQL stores' select list. NewJob takes its fields in the same order.
FIELDS: tuple[Field, ...] = (
    Field("id", "int", new=False, sql="BIGINT", insert=FROM_ID),
    Field("func", "str", enqueue=True, template=True, sql="TEXT", **_NEW),
    Field("args", "list", list, enqueue=True, template=True, sql="TEXT", codec="json", **_NEW),
    Field("kwargs", "dict", dict, enqueue=True, template=True, sql="TEXT", codec="json", **_NEW),
    Field("state", "str", new=False, sql="TEXT", insert=FROM_STATE),
    Field("priority", "int", 0, enqueue=True, template=True, sql="INTEGER", **_NEW),  # smaller first
    Field("run_at", "float", 0.0, enqueue=True, client=True, sql="REAL", **_NEW),  # <= now: queued at once
    Field("created_at", "float", new=False, sql="REAL", insert=FROM_NOW),
    Field("attempts", "int", 0, new=False, sql="INTEGER"),
    Field("max_attempts", "int", new=False, sql="INTEGER", **_NEW),  # NewJob: a property of retry
    Field("retry", "RetrySpec | None", None, enqueue=True, template=True, sql="TEXT", codec="retry",
          **_NEW),  # None: one attempt only
    Field("retry_on_network", "bool", False, enqueue=True, template=True, sql="BOOLEAN", codec="bool",
          **_NEW),
    Field("key", "str | None", None, enqueue=True, client=True, template=True, sql="TEXT", **_NEW),
    Field("idempotency_key", "str | None", None, enqueue=True, client=True, sql="TEXT", **_NEW),
    Field("cron", "str | None", None, sql="TEXT", **_NEW),  # the cron that fired it
    Field("manual", "bool", False, job=False, enqueue=True),  # an operator's run: refused if its key
    #                                                          is busy; resumes a pause
    Field("orphaned", "int", 0, new=False, sql="INTEGER"),
    Field("started_at", "float | None", None, new=False, sql="REAL"),
    Field("finished_at", "float | None", None, new=False, sql="REAL"),
    Field("result", "Any", None, new=False, sql="TEXT", codec="json"),
    Field("error", "dict | None", None, new=False, sql="TEXT", codec="json"),
    # A process run's captured stdout+stderr (run/process.py: capped, a marker when cut),
    # success or failure, of its last run; None for a thread run or a run that wrote nothing.
    Field("output", "str | None", None, new=False, sql="TEXT"),
    Field("pool", "str", DEFAULT_POOL, enqueue=True, client=True, template=True, sql="TEXT",
          **_NEW),  # only workers serving this pool run it
    # Resource control (core/policy/claim.py). None: the function's configured default, if
    # any (api/resources.py), else no group and a cost of 1.
    Field("concurrency_group", "str | None", None, enqueue=True, client=True, template=True, sql="TEXT",
          **_NEW),  # at most concurrency_limit jobs of a group run at once
    Field("concurrency_limit", "int | None", None, enqueue=True, client=True, template=True, sql="INTEGER",
          **_NEW),
    Field("cost_units", "float | None", None, enqueue=True, client=True, template=True, sql="REAL",
          **_NEW),  # what it takes of its pool's and group's budgets
    # {"key", "limit", "per"}: at most `limit` jobs of the key start per `per` seconds
    # (core/policy/rates.py); None: the function's configured default, if any, else none.
    Field("rate_limit", "dict | None", None, enqueue=True, template=True, sql="TEXT", codec="json", **_NEW),
    # Fair shares within its pool (core/policy/fair.py): the claim takes jobs round-robin
    # across the fair keys with work waiting, weighted by [fair_shares]; None: the pool's
    # jobs without one, which share as one key of their own.
    Field("fair_by", "str | None", None, enqueue=True, client=True, template=True, sql="TEXT",
          **_NEW),  # its fair key (a tenant): its pool's claims take turns across fair keys
    # Where it runs and its limits (core/sandbox.py); None: the function's or daemon's setting.
    Field("isolation", "str | None", None, enqueue=True, client=True, template=True, sql="TEXT", **_NEW),
    Field("timeout", "float | None", None, enqueue=True, client=True, template=True, sql="REAL", **_NEW),
    Field("memory_mb", "int | None", None, enqueue=True, client=True, template=True, sql="INTEGER", **_NEW),
    Field("output_kb", "int | None", None, enqueue=True, client=True, template=True, sql="INTEGER", **_NEW),
    # A workflow run's step job: its run, step index, item and loop (the times the step was
    # entered before). Set by the run's transition, never by a client; None for other jobs.
    Field("workflow_run", "int | None", None, sql="BIGINT", **_NEW),
    Field("workflow_step", "int | None", None, sql="INTEGER", **_NEW),
    Field("workflow_item", "int | None", None, sql="INTEGER", **_NEW),
    Field("workflow_loop", "int | None", None, sql="INTEGER", **_NEW),
    # A cron's run: the last tick folded into it while it waited (None when none was).
    Field("cron_until", "float | None", None, new=False, sql="REAL"),
    # What the running job last said of its progress (queickd.progress): {"done", "total",
    # "note", "at", "attempt"}; None until it says any. Kept after the run ends.
    Field("progress", "dict | None", None, new=False, sql="TEXT", codec="json"),
    Field("held", "bool", False, job=False),  # an edge daemon's job for its upstream, set by the daemon
    #                                           (never a client): stored `held`, forwarded, not run here
    Field("upstream_id", "int | None", None, new=False, sql="BIGINT"),  # a forwarded job's id upstream
    # Liveness (core/policy/liveness.py): stalled once it has said no progress (nor, in a
    # process, used CPU time) for stalled_after seconds; on_stall "mark" (None) or "kill".
    # None: the function's configured default, if any, else never watched.
    Field("stalled_after", "float | None", None, enqueue=True, client=True, template=True, sql="REAL", **_NEW),
    Field("on_stall", "str | None", None, enqueue=True, client=True, template=True, sql="TEXT", **_NEW),
    # When the worker running it found it stalled (None: it is not). Written by that worker
    # (services/liveness.py); cleared when it says progress again and when its run ends.
    Field("stalled_at", "float | None", None, new=False, sql="REAL"),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
BY_WIRE: dict[str, Field] = {f.wire_name: f for f in FIELDS}
NEW_FIELDS: tuple[Field, ...] = tuple(f for f in FIELDS if f.new)
JOB_FIELDS: tuple[Field, ...] = tuple(f for f in FIELDS if f.job)
INSERTED: tuple[Field, ...] = tuple(f for f in JOB_FIELDS if f.insert)  # columns an insert writes
# Wire names an enqueue request may carry (besides "op" and "delay", which is run_at - now).
ENQUEUE_WIRE: frozenset[str] = frozenset(f.wire_name for f in FIELDS if f.enqueue)
# Wire names a job template (cron, event) keeps: an enqueue's fields that outlive one job.
TEMPLATE_WIRE: frozenset[str] = frozenset(f.wire_name for f in FIELDS if f.enqueue and f.template)
TEMPLATE_FIELDS: tuple[Field, ...] = tuple(f for f in NEW_FIELDS if f.template)
CLIENT_PLAIN: tuple[tuple[str, str], ...] = tuple((f.name, f.wire_name) for f in FIELDS if f.client)


def dataclass_fields(part: tuple[Field, ...]) -> list[tuple[str, str, Any]]:
    """(name, type, dataclasses.field) for make_dataclass. A field keeps its default only
    where every later field of the same class has one too (dataclasses require it), so
    Job's defaults are its trailing ones (pool, and fields added after it)."""
    out: list[tuple[str, str, Any]] = []
    tail = True
    for f in reversed(part):
        tail = tail and f.default is not NO_DEFAULT
        if not tail:
            spec = dataclasses.field()
        elif f.default in (list, dict):
            spec = dataclasses.field(default_factory=f.default)
        else:
            spec = dataclasses.field(default=f.default)
        out.append((f.name, f.type, spec))
    return out[::-1]


def build_function(name: str, source: str, namespace: dict[str, Any]) -> Any:
    """Compile one generated function: code written once at import, not a loop over FIELDS
    per record."""
    scope = dict(namespace)
    exec(compile(source, f"<queickd.fields {name}>", "exec"), scope)  # noqa: S102 - our own text
    fn = scope[name]
    fn.__source__ = source  # for reading what was generated
    return fn


def frozen_init(cls: type) -> Any:
    """An __init__ for a frozen, slotted dataclass that stores each field through its slot
    directly. The one dataclasses writes calls object.__setattr__ per field (a frozen class
    refuses its own), a cost paid for every job a store records or reads. The class stays
    frozen: assigning to a field still raises. A default factory, a field left out of
    __init__ or a __post_init__ needs dataclasses' own (Job has none): refused, not ignored."""
    params, ns = [], {}
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}.__post_init__ needs dataclasses' own __init__")
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: a default factory or init=False needs dataclasses' own __init__")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            ns[f"d_{f.name}"] = f.default
            params.append(f"{f.name}=d_{f.name}")
        ns[f"s_{f.name}"] = cls.__dict__[f.name].__set__  # the slot's own setter
    body = "".join(f"    s_{f.name}(self, {f.name})\n" for f in dataclasses.fields(cls))
    init = build_function("__init__", f"def __init__(self, {', '.join(params)}):\n{body}", ns)
    init.__qualname__, init.__module__ = f"{cls.__qualname__}.__init__", cls.__module__
    init.__annotations__ = dict(cls.__init__.__annotations__)  # help() shows the types as before
    return init


def record_builder(job_cls: type) -> Any:
    """new_record(job_id, state, now, new) -> Job: the record a store keeps for a new job.
    Lists and dicts are copied, so the record shares nothing with the caller's NewJob.
    job_cls takes JOB_FIELDS positionally, in their order."""
    from_insert = {FROM_ID: "job_id", FROM_STATE: "state", FROM_NOW: "now"}
    parts, ns = [], {"job_cls": job_cls}
    for f in JOB_FIELDS:
        if f.insert == FROM_NEW:
            v = f"new.{f.name}"
            expr = f"{f.default.__name__}({v})" if f.default in (list, dict) else v
        elif f.insert is not None:
            expr = from_insert[f.insert]
        else:
            ns[f"d_{f.name}"] = f.default
            expr = f"d_{f.name}"
        parts.append((f.name, expr))
    src = "def new_record(job_id, state, now, new):\n    return " + positional_call("job_cls", parts)
    return build_function("new_record", src, ns)


def positional_call(callee: str, args: list[tuple[str, str]]) -> str:
    """The source of `callee(expr, ...)` for generated code, one (field name, expression)
    a line, passed by position (cheaper than keywords), in the callee's field order."""
    return f"{callee}(\n" + "".join(f"        {expr},  # {name}\n" for name, expr in args) + "    )\n"
