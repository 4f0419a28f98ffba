"""Wire protocol v1: newline-delimited JSON over TCP, shared by the server and the client.

One request object per line, one reply per request, replies in request order. This module
owns the error codes, the per-op field lists and the validation of job specs; it does no
I/O. Nothing here ever unpickles or evaluates bytes from the network.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

from . import fields, jsontext, sandbox
from . import retry as retry_mod
from .cron import LATEST, parse_schedule, schedule_to_dict
from .job import DEFAULT_POOL, NewJob
from .numbers import in_range
from .policy import liveness, rates

VERSION = 1
DEFAULT_PORT = 9999
MAX_LINE = 1 << 20  # bytes per request line, newline excluded
# A Queick 1.2.1 client's first byte: the PROTO opcode every pickle of protocol 2 or later
# starts with (api/legacy.py serves such clients; no line of this protocol starts with it).
QUEICK_FIRST_BYTE = 0x80
MAX_KEY_LEN = 200
MAX_BATCH = 10_000  # jobs in one enqueue_many
MAX_INT = 2**31 - 1  # counts (max_attempts)
MAX_ID = 2**63 - 1  # ids are SQLite/PostgreSQL bigints
MAX_COST_UNITS = 1e15  # a job's cost: far above any budget, and exact in a float
# Levels of arrays and objects in a request, the request itself included. Every later path
# handles far deeper values (the first to fail, at about 495 levels of args, is the reply
# to `get`; json.loads fails near 990), so a stored job can always be read back.
MAX_DEPTH = 64


class Code:
    """Stable error codes; a client may branch on these, never on messages."""

    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    NOT_ALLOWED = "not_allowed"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    QUEUE_FULL = "queue_full"
    INTERNAL = "internal"


class QueueError(Exception):
    """An error with a protocol code. Raised by validation, the server and the client."""

    def __init__(self, code: str, message: str, retry_after: float | None = None,
                 job_id: int | None = None, maybe_committed: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.job_id = job_id  # the job a conflict is with
        # The store failed at or after COMMIT: the request may be stored all the same, so a
        # client resends it only with the same idempotency key.
        self.maybe_committed = maybe_committed

    def to_reply(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.job_id is not None:
            err["job_id"] = self.job_id
        if self.maybe_committed:
            err["maybe_committed"] = True
        reply: dict[str, Any] = {"ok": False, "error": err}
        if self.retry_after is not None:
            reply["retry_after"] = self.retry_after
        return reply

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> QueueError:
        err = reply.get("error") or {}
        return cls(err.get("code", Code.INTERNAL), err.get("message", "unknown error"),
                   reply.get("retry_after"), err.get("job_id"), bool(err.get("maybe_committed")))

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def bad(message: str) -> QueueError:
    return QueueError(Code.BAD_REQUEST, message)


# A job's fields come from its declaration (fields.py); "delay" is run_at relative to now.
_JOB_FIELDS = fields.ENQUEUE_WIRE | {"delay"}
_EVENT_FIELDS = fields.TEMPLATE_WIRE | {"event_id"}
_CRON_FIELDS = fields.TEMPLATE_WIRE | {"name", "cron", "every", "start_at"}
# op -> the fields it accepts besides "op". One table; the server rejects anything else.
OPS: dict[str, frozenset] = {
    "hello": frozenset({"token", "client"}),
    "enqueue": _JOB_FIELDS,
    "enqueue_many": frozenset({"jobs"}),
    "event": _EVENT_FIELDS,
    "get": frozenset({"job_id"}),
    "wait": frozenset({"job_id", "timeout", "states"}),
    "cancel": frozenset({"job_id", "state", "func", "key", "pool", "dry_run"}),
    "retry": frozenset({"job_id", "event_id", "all"}),
    "dead": frozenset({"limit"}),
    "purge": frozenset({"state", "older_than"}),
    "resume": frozenset({"key", "func", "pool"}),
    "pause": frozenset({"key", "func", "pool"}),
    "drain": frozenset({"wait", "off"}),
    "jobs": frozenset({"state", "limit", "func", "key", "pool"}),
    "stats": frozenset({"detail"}),
    "cron": _CRON_FIELDS,
    "crons": frozenset(),
    "cron_delete": frozenset({"name"}),
    "set_pool": frozenset({"job_id", "key", "cron", "pool"}),
    "workflow_start": frozenset({"definition", "name", "state", "idempotency_key"}),
    "workflow_get": frozenset({"run_id"}),
    "workflow_wait": frozenset({"run_id", "timeout"}),
    "workflow_cancel": frozenset({"run_id"}),
    "workflows": frozenset({"state", "limit"}),
}

_OPS_WITH_OP = {op: fields | {"op"} for op, fields in OPS.items()}
_JOB_FIELDS_WITH_OP = _JOB_FIELDS | {"op"}
_PLAIN_JOB_FIELDS = frozenset({"op", "func", "args", "kwargs"})
# ... and with resource control's fields (a grouped or budgeted job): a fast path too.
_GROUPED_JOB_FIELDS = _PLAIN_JOB_FIELDS | {"concurrency_group", "concurrency_limit", "cost_units"}

_FUNC_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*([:.])[A-Za-z_]\w*$")
_RETRY_FIELDS = frozenset({"policy", "interval", "max_interval", "max_attempts"})


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number out of range: {text}")
    return v


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Strict JSON: NaN, Infinity and 1e999 would be stored as non-JSON and break readers.
_decoder = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)
_loads = jsontext.loader(_decoder)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests arrays and objects more than `limit` levels deep (a scalar is
    0 levels, [] is 1). Walks one level at a time, without recursion."""
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):
        if not level:
            return False
        level = [x for v in level for x in (v.values() if type(v) is dict else v)
                 if type(x) is dict or type(x) is list]
    return bool(level)


def decode_line(line: bytes | str) -> dict[str, Any]:
    """One line (no newline) to a request dict, or QueueError(bad_request)."""
    try:
        text = line if isinstance(line, str) else line.decode("utf-8")
        obj = _loads(text)
    except UnicodeDecodeError:
        raise bad("request is not UTF-8") from None
    except ValueError as e:
        unfit = jsontext.unfit_number(text)  # a number no field can hold: name where it is
        if unfit is not None:
            raise bad(f"{unfit[0] or 'the request'}: {unfit[1]} is not a number queickd can hold "
                      "(finite, at most 4300 digits)") from None
        raise bad(f"request is not JSON: {e}") from None
    except RecursionError:
        raise bad(f"request nests arrays and objects more than {MAX_DEPTH} levels deep") from None
    if not isinstance(obj, dict):
        raise bad("request must be a JSON object")
    # Fewer brackets than levels allowed cannot nest too deep: most requests skip the walk.
    if text.count("[") + text.count("{") > MAX_DEPTH and too_deep(obj):
        raise bad(f"request nests arrays and objects more than {MAX_DEPTH} levels deep")
    if "\\ud" in text or "\\uD" in text:  # a \uD800-\uDFFF escape: is it a valid pair?
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise bad("request holds a lone surrogate (\\ud800-\\udfff): not valid Unicode") from None
    op = obj.get("op")
    if not isinstance(op, str):
        raise bad("request needs an 'op' string")
    allowed = _OPS_WITH_OP.get(op)
    if allowed is None:
        raise bad(f"unknown op {op!r}")
    if not obj.keys() <= allowed:
        raise bad(f"unknown field(s) for {op}: {', '.join(sorted(obj.keys() - allowed))}")
    return obj


def encode(message: dict[str, Any]) -> bytes:
    """A request or reply as one line."""
    return (jsontext.dumps(message) + "\n").encode()


def decode_reply(line: bytes) -> dict[str, Any]:
    """A reply line from the daemon (the client side); ValueError if it is not a JSON
    object (a port that is not queickd's may answer anything)."""
    reply = jsontext.loads(line[:-1].decode() if line.endswith(b"\n") else line.decode())
    if not isinstance(reply, dict):
        raise ValueError(f"the reply is JSON but not an object: {line[:80]!r}")
    return reply


def normalize_func(func: Any) -> str:
    """'pkg.mod:fn' or 'pkg.mod.fn' → 'pkg.mod:fn'."""
    if not isinstance(func, str):
        raise bad("func must be 'module:function' (or 'module.function')")
    return _normalize_func(func)


@functools.lru_cache(maxsize=4096)  # a daemon sees a handful of function names, many times
def _normalize_func(func: str) -> str:
    if not _FUNC_RE.fullmatch(func):
        raise bad("func must be 'module:function' (or 'module.function')")
    if ":" in func:
        return func
    module, _, name = func.rpartition(".")
    return f"{module}:{name}"


def ranged(name: str, v: Any, *bounds: float, **kw: Any) -> Any:
    """numbers.in_range (the one range check), refusing with bad_request naming `name`."""
    try:
        return in_range(name, v, *bounds, **kw)
    except ValueError as e:
        raise bad(str(e)) from None


def number(obj: dict, name: str, *bounds: float, **kw: Any) -> float | None:
    """obj[name] checked by `ranged` (by default: any finite number), or None if absent."""
    v = obj.get(name)
    return None if v is None else ranged(name, v, *bounds, **kw)


def opt_str(obj: dict, name: str) -> str | None:
    return text_field(name)(obj.get(name))


def parse_retry(v: Any) -> Any:
    if v is None or v is False:
        return None
    if v is True:
        return retry_mod.make_spec()
    if not isinstance(v, dict):
        raise bad("retry must be an object, true or false")
    extra = v.keys() - _RETRY_FIELDS
    if extra:
        raise bad(f"unknown retry field(s): {', '.join(sorted(extra))}")
    for name in ("interval", "max_interval"):
        if v.get(name) is not None:
            ranged(f"retry.{name}", v[name], 0, LATEST, above=True)
    if v.get("max_attempts") is not None:
        ranged("retry.max_attempts", v["max_attempts"], 1, MAX_INT, integer=True)
    try:
        return retry_mod.make_spec(**{k: v[k] for k in _RETRY_FIELDS if v.get(k) is not None})
    except (ValueError, TypeError) as e:
        raise bad(str(e)) from None


def _container(kind: type, name: str, what: str) -> Any:
    def check(v: Any) -> Any:
        if v is None:
            return kind()
        if not isinstance(v, kind):
            raise bad(f"{name} must be a JSON {what}")
        return v
    return check


def _priority(v: Any) -> int:
    return ranged("priority", v, -MAX_INT, MAX_INT, integer=True)


def _flag(name: str) -> Any:
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise bad(f"{name} must be true or false")
        return v
    return check


def text_field(name: str) -> Any:
    def check(v: Any) -> str | None:
        if v is not None and (not isinstance(v, str) or not v or len(v) > MAX_KEY_LEN):
            raise bad(f"{name} must be a non-empty string of at most {MAX_KEY_LEN} characters")
        return v
    return check


def _bytes_field(name: str) -> Any:
    def check(v: Any) -> str | None:
        if v is not None and (not isinstance(v, str) or not v or len(v.encode()) > MAX_KEY_LEN):
            raise bad(f"{name} must be a non-empty string of at most {MAX_KEY_LEN} bytes")
        return v
    return check


_group = _bytes_field("concurrency_group")


def _concurrency_limit(v: Any) -> int | None:
    return None if v is None else ranged("concurrency_limit", v, 1, MAX_INT, integer=True)


def _cost_units(v: Any) -> float | None:
    return None if v is None else ranged("cost_units", v, 0, MAX_COST_UNITS, above=True)


def rate_limit(v: Any) -> dict[str, Any] | None:
    """{"key", "limit", "per"} (or [key, limit, per]) -> its stored form; a limit of at
    least one start, a window of a millisecond to a day (rates.py)."""
    if v is None:
        return None
    if isinstance(v, list | tuple) and len(v) == 3:
        v = dict(zip(("key", "limit", "per"), v, strict=True))
    if not isinstance(v, dict) or v.keys() != {"key", "limit", "per"}:
        raise bad('rate_limit must be {"key": text, "limit": starts, "per": seconds}')
    key = _bytes_field("rate_limit.key")(v["key"] or "")  # null is refused as "" is
    return {"key": key, "limit": ranged("rate_limit.limit", v["limit"], 1, rates.MAX_LIMIT, integer=True),
            "per": float(ranged("rate_limit.per", v["per"], rates.MIN_PER, rates.MAX_PER))}


def _refusing(check: Any) -> Any:
    """check, its ValueError refused as bad_request."""
    def checked(v: Any) -> Any:
        try:
            return check(v)
        except ValueError as e:
            raise bad(str(e)) from None
    return checked


_pool_text = text_field("pool")
# Each settable field's own check, by wire name: the value given -> the value stored, or
# QueueError. Called only for the fields a request gives; the others keep their defaults.
# func and run_at (with delay) are checked in parse_job itself.
_CHECKS: dict[str, Any] = {
    "args": _container(list, "args", "array"),
    "kwargs": _container(dict, "kwargs", "object"),
    "priority": _priority,
    "retry": lambda v: parse_retry(v),
    "retry_on_network": _flag("retry_on_network"),
    "key": text_field("key"),
    "idempotency_key": text_field("idempotency_key"),
    "manual": _flag("manual"),
    "pool": lambda v: _pool_text(v) or DEFAULT_POOL,
    "concurrency_group": _group,
    "concurrency_limit": _concurrency_limit,
    "cost_units": _cost_units,
    "rate_limit": rate_limit,
    "fair_by": _bytes_field("fair_by"),
    **{name: _refusing(functools.partial(sandbox.check, name)) for name in ("isolation", *sandbox.LIMITS)},
    "stalled_after": _refusing(liveness.check_stalled_after),
    "on_stall": _refusing(liveness.check_on_stall),
}
if _CHECKS.keys() | {"func", "run_at"} != fields.ENQUEUE_WIRE:  # a new settable field needs its check
    raise ImportError(f"protocol checks differ from the job fields: {sorted(_CHECKS.keys() ^ fields.ENQUEUE_WIRE)}")


def check_field(wire_name: str, v: Any) -> Any:
    """One settable field's check (the value given -> the value stored, or QueueError), for
    values that come from elsewhere than a request (a function's defaults in the config)."""
    return _CHECKS[wire_name](v)


def _job_builder() -> Any:
    """_build(obj, keys, func, run_at) -> NewJob: each field the request gives through its
    check, in the declaration's order (so errors come in a fixed order), the others at
    their defaults. Generated from the declaration; a loop per job would cost a third more."""
    parts, ns = [], {"NewJob": NewJob}
    for f in fields.NEW_FIELDS:
        if f.name in ("func", "run_at"):
            parts.append(f.name)
            continue
        default = "[]" if f.default is list else "{}" if f.default is dict else f"d_{f.name}"
        ns[f"d_{f.name}"] = f.default
        if f.wire_name in _CHECKS:
            ns[f"c_{f.name}"] = _CHECKS[f.wire_name]
            parts.append(f"c_{f.name}(obj[{f.wire_name!r}]) if {f.wire_name!r} in keys else {default}")
        else:
            parts.append(default)
    src = "def _build(obj, keys, func, run_at):\n    return NewJob(" + ", ".join(parts) + ")\n"
    return fields.build_function("_build", src, ns)


_build = _job_builder()
# parse_job's fast path passes NewJob's first fields by position (cheaper than keywords).
if [f.name for f in fields.NEW_FIELDS[:5]] != ["func", "args", "kwargs", "priority", "run_at"]:
    raise ImportError("parse_job's fast path needs NewJob(func, args, kwargs, priority, run_at, ...)")


def parse_job(obj: dict[str, Any], now: float) -> NewJob:
    """Validate one job spec (an `enqueue` request or an item of `enqueue_many`)."""
    if not isinstance(obj, dict):
        raise bad("a job must be a JSON object")
    keys = obj.keys()
    if keys <= _PLAIN_JOB_FIELDS:  # the common job, a function and its arguments: fast path
        args, kwargs = obj.get("args"), obj.get("kwargs")
        if (args is None or type(args) is list) and (kwargs is None or type(kwargs) is dict):
            return NewJob(normalize_func(obj.get("func")), args or [], kwargs or {}, 0, now)
    elif keys <= _GROUPED_JOB_FIELDS:  # checked as _build checks them, in the same order
        args, kwargs = obj.get("args"), obj.get("kwargs")
        if (args is None or type(args) is list) and (kwargs is None or type(kwargs) is dict):
            return NewJob(normalize_func(obj.get("func")), args or [], kwargs or {}, 0, now,
                          concurrency_group=_group(obj.get("concurrency_group")),
                          concurrency_limit=_concurrency_limit(obj.get("concurrency_limit")),
                          cost_units=_cost_units(obj.get("cost_units")))
    if not keys <= _JOB_FIELDS_WITH_OP:
        raise bad(f"unknown job field(s): {', '.join(sorted(keys - _JOB_FIELDS_WITH_OP))}")
    func = normalize_func(obj.get("func"))
    run_at = number(obj, "run_at", 0, message="run_at must be unix seconds: a finite number, 0 or later")
    delay = number(obj, "delay")
    if run_at is not None and delay is not None:
        raise bad("give run_at or delay, not both")
    if delay is not None:
        if delay < 0:
            raise bad("delay must not be negative")
        run_at = now + delay
    if run_at is not None and run_at > LATEST:
        raise bad(f"the job would run after {LATEST:.0f} (the year 9999): run_at is unix seconds, not milliseconds")
    job = _build(obj, keys, func, now if run_at is None else run_at)
    if job.isolation == sandbox.THREAD:
        try:
            sandbox.check_job(job.isolation, {k: getattr(job, k) for k in sandbox.LIMITS})
        except ValueError as e:
            raise bad(str(e)) from None
    return job


def parse_jobs(obj: dict[str, Any], now: float) -> list[NewJob]:
    jobs = obj.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise bad("jobs must be a non-empty array")
    if len(jobs) > MAX_BATCH:
        raise bad(f"at most {MAX_BATCH} jobs per enqueue_many")
    out = []
    for i, j in enumerate(jobs):
        try:
            out.append(parse_job(j, now))
        except QueueError as e:
            raise bad(f"jobs[{i}]: {e.message}") from None
    return out


def parse_cron(obj: dict[str, Any], now: float) -> tuple[str, dict, NewJob]:
    """Validate a `cron` request → (name, schedule dict, job template)."""
    sched_fields = {k: obj[k] for k in ("cron", "every", "start_at") if k in obj}
    if ("cron" in sched_fields) == ("every" in sched_fields):
        raise bad("a cron needs exactly one of 'cron' (expression) or 'every' (seconds)")
    try:
        schedule = parse_schedule(sched_fields, now)
        schedule.next_after(now)  # a cron expression that never fires (30 February) says so
    except ValueError as e:
        raise bad(str(e)) from None
    template = parse_job({k: v for k, v in obj.items() if k in _JOB_FIELDS}, now)
    name = opt_str(obj, "name") or _default_cron_name(template, sched_fields)
    return name, schedule_to_dict(schedule), template


def _default_cron_name(job: NewJob, sched: dict) -> str:
    # Re-registering the same function on the same schedule must not add a second cron.
    spec = sched.get("cron") or f"every {sched['every']}s"
    return f"{job.func} {spec}"[:MAX_KEY_LEN]


def parse_event(obj: dict[str, Any], now: float) -> tuple[str, NewJob]:
    """Validate an `event` request → (event_id, job template)."""
    event_id = opt_str(obj, "event_id")
    if event_id is None:
        raise bad("an event needs an event_id")
    return event_id, parse_job({k: v for k, v in obj.items() if k in _EVENT_FIELDS - {"event_id"}}, now)
