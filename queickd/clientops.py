"""Every client operation as a plan, apart from any connection: the one place that says
which requests an operation sends and what it makes of their replies. JobQueue (client.py)
carries plans out over its blocking socket, AsyncJobQueue (aclient.py) over asyncio.

A plan is a generator. It yields a request (a dict) and is sent back the reply when the
daemon answered ok; a refused reply is thrown into it as QueueError
and a broken connection as ConnectionError / RequestLostError, so a plan may catch them and
decide (resend, wait and try again). It yields a list of requests to pipeline them and is
sent back their replies as they are, refused ones included. It yields a Pause to be resumed
after that many seconds. What it returns is the operation's result.

Builds plain JSON only (validation is the daemon's), does no I/O and never sleeps itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, TypeVar

from .clientwire import RequestLostError, _auto_key, _unknown_outcome, func_name
from .core import fields, protocol
from .core.cron import SchedulingTime
from .core.protocol import QueueError
from .core.retry import RETRY_TYPE

T = TypeVar("T")
Plan = Generator[Any, Any, T]
FuncLike = Callable[..., Any] | str

_RESENDS = 2  # times a request whose outcome is unknown is sent again (with its idempotency key)
_RESEND_PAUSE = 0.5  # seconds before a resend, times the resends so far: a failing store may recover
# job()'s keywords sent as given: its `plain` tuple lists them in this order.
_PLAIN_ORDER = ("run_at", "key", "idempotency_key", "pool", "concurrency_group", "concurrency_limit",
                "cost_units", "fair_by", "isolation", "timeout", "memory_mb", "output_kb", "stalled_after",
                "on_stall")
if tuple(name for name, _ in fields.CLIENT_PLAIN) != _PLAIN_ORDER:
    raise ImportError("JobQueue.job's plain keywords no longer match fields.CLIENT_PLAIN")
_PLAIN_WIRE = tuple(wire for _, wire in fields.CLIENT_PLAIN)
_NO_PLAIN = (None,) * len(_PLAIN_WIRE)
# An accepted enqueue's reply may carry warnings (a pool no live worker serves): logged here
# at WARNING, so they show on stderr even where the application configured no logging.
log = logging.getLogger("queickd.client")


class Pause(float):
    """Yielded by a plan: resume it after this many seconds."""


class Steps:
    """A client's driver loop, the part every transport shares: iterate for the plan's
    steps, setting `outcome` to each one's outcome (an exception is thrown into the plan);
    `result` is what the plan returned."""

    __slots__ = ("plan", "outcome", "result")

    def __init__(self, plan: Plan[Any]) -> None:
        self.plan = plan
        self.outcome: Any = None
        self.result: Any = None

    def __iter__(self) -> Steps:
        return self

    def __next__(self) -> Any:
        outcome = self.outcome
        try:
            return self.plan.throw(outcome) if isinstance(outcome, BaseException) else self.plan.send(outcome)
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None


def job(
    func: FuncLike,
    args: Iterable[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    priority: int = 0,
    retry: bool = False,
    retry_interval: float | None = None,
    max_retry_interval: float | None = None,
    retry_type: str = RETRY_TYPE.EXPONENTIAL,
    max_attempts: int | None = None,
    retry_on_network_available: bool = False,
    key: str | None = None,
    idempotency_key: str | None = None,
    delay: float | None = None,
    run_at: float | None = None,
    manual: bool = False,
    max_workers: int | None = None,  # accepted for Queick compatibility; the daemon decides
    pool: str | None = None,
    concurrency_group: str | None = None,
    concurrency_limit: int | None = None,
    cost_units: float | None = None,
    fair_by: str | None = None,
    isolation: str | None = None,  # "thread" or "process"
    timeout: float | None = None,  # seconds of wall time (runs it in a process)
    memory_mb: int | None = None,  # peak resident memory (runs it in a process)
    output_kb: int | None = None,  # captured stdout+stderr and result (runs it in a process)
    stalled_after: float | None = None,  # seconds without progress (or a process's CPU time): stalled
    on_stall: str | None = None,  # "mark" (the default) or "kill"
    rate_limit: tuple[str, int, float] | dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The wire form of one job, for enqueue_many. concurrency_group/concurrency_limit:
    at most that many jobs of the group run at once; cost_units: what it takes of its
    pool's and group's budgets (default 1). fair_by: the fair key (a tenant) it shares its
    pool's claims by. stalled_after/on_stall: a running job that
    says no progress for that long (a process job: nor uses CPU time) is marked stalled,
    or with on_stall="kill" stopped and retried per its policy. rate_limit: (key, limit,
    per) or {"key", "limit", "per"}, at most `limit` jobs of the key start per `per` seconds."""
    spec: dict[str, Any] = {"func": func_name(func)}
    if args:
        spec["args"] = list(args)
    if kwargs:
        spec["kwargs"] = kwargs
    if priority:
        spec["priority"] = priority
    if retry:
        r = {"policy": retry_type, "interval": retry_interval, "max_interval": max_retry_interval,
             "max_attempts": max_attempts}
        spec["retry"] = {k: v for k, v in r.items() if v is not None}
    if retry_on_network_available:
        spec["retry_on_network"] = True
    if manual:
        spec["manual"] = True
    if delay is not None:
        spec["delay"] = delay
    if rate_limit is not None:
        spec["rate_limit"] = (dict(zip(("key", "limit", "per"), rate_limit, strict=True))
                              if isinstance(rate_limit, tuple | list) else rate_limit)
    # Keywords sent as given, when given, in _PLAIN_ORDER (checked against CLIENT_PLAIN at
    # import; this tuple against the wire form by test_fields). A tuple compared with
    # all-None, not locals() and a lookup each: cheaper for the common job, which
    # enqueue_many callers build per job.
    plain = (run_at, key, idempotency_key, pool, concurrency_group, concurrency_limit, cost_units,
             fair_by, isolation, timeout, memory_mb, output_kb, stalled_after, on_stall)
    if plain != _NO_PLAIN:
        for wire, value in zip(_PLAIN_WIRE, plain, strict=True):
            if value is not None:
                spec[wire] = value
    return spec


def hello(token: str | None) -> dict[str, Any]:
    """A connection's first request; its reply is the daemon's server info."""
    return {"op": "hello"} if token is None else {"op": "hello", "token": token}


def one(req: dict[str, Any], field: str | None = None) -> Plan[Any]:
    """Send req; the reply's `field` (or the whole reply, less "ok")."""
    reply = yield req
    if field is not None:
        return reply[field]
    reply.pop("ok", None)
    return reply


def resend_pause(e: Exception, resends: int) -> Pause | None:
    """After e, with `resends` resends so far, of a request whose jobs all carry idempotency
    keys: the pause before sending it again, or None when e is to be raised (its outcome is
    known, or the resends are spent)."""
    if resends < _RESENDS and _unknown_outcome(e):
        return Pause(_RESEND_PAUSE * (resends + 1))
    return None


def resending(req: dict[str, Any]) -> Plan[dict[str, Any]]:
    """Send a request whose jobs all carry idempotency keys, again when its outcome is
    unknown, so a job stored the first time is returned rather than stored twice."""
    resends = 0
    while True:
        try:
            return (yield req)
        except (RequestLostError, QueueError) as e:
            pause = resend_pause(e, resends)
            if pause is None:
                raise
        resends += 1
        yield pause


def enqueue(func: FuncLike, args: Iterable[Any] | None, block: bool, block_timeout: float,
            options: dict[str, Any]) -> Plan[int]:
    req = {"op": "enqueue", **job(func, args, **options)}
    req.setdefault("idempotency_key", _auto_key())
    deadline = time.monotonic() + block_timeout if block else 0.0
    resends = 0
    while True:
        # resending()'s loop written out, with queue_full's pauses: one generator per
        # enqueue, not two (the client's CPU per enqueue is what an asyncio caller feels).
        try:
            return _warned((yield req))["job_id"]
        except (RequestLostError, QueueError) as e:
            pause = resend_pause(e, resends)
            if pause is not None:
                resends += 1
            else:
                if not block or not isinstance(e, QueueError) or e.code != protocol.Code.QUEUE_FULL:
                    raise
                pause = Pause(e.retry_after or 1.0)
                if time.monotonic() + pause > deadline:
                    raise
                resends = 0  # the daemon asked us to wait this long; a resend after it is a new try
        yield pause


def _warned(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply, its warnings logged (an older daemon sends none)."""
    for w in reply.get("warnings") or ():
        log.warning("queickd: %s", w)
    return reply


def run_at(start_at: float | SchedulingTime) -> float | None:
    return start_at.start_at if isinstance(start_at, SchedulingTime) else start_at


def enqueue_many(jobs: Sequence[dict[str, Any]]) -> Plan[list[int]]:
    if len(jobs) > protocol.MAX_BATCH:
        raise ValueError(f"at most {protocol.MAX_BATCH} jobs per enqueue_many (it is all or none); "
                         "split them, or use enqueue_pipelined")
    req = {"op": "enqueue_many", "jobs": list(jobs)}
    if all("idempotency_key" in j for j in jobs):  # safe to resend: the daemon dedupes each job
        return _warned((yield from resending(req)))["job_ids"]
    # No automatic keys here: a key per job costs the daemon a lookup and an index entry
    # per job, a large part of a batch's cost. An unknown outcome raises (RequestLostError, or
    # QueueError with maybe_committed) and the caller decides, or gives keys to be resent.
    return _warned((yield req))["job_ids"]


def enqueue_pipelined(jobs: Sequence[dict[str, Any]]) -> Plan[list[int]]:
    replies = yield [{"op": "enqueue", **j} for j in jobs]
    for r in replies:
        if not r.get("ok"):
            raise QueueError.from_reply(r)
    return [_warned(r)["job_id"] for r in replies]


def each(reqs: Sequence[dict[str, Any]]) -> Plan[list[dict[str, Any]]]:
    """Send the requests pipelined; their replies as they are, each accepted or refused on its own."""
    return (yield list(reqs))


def cron(schedule: SchedulingTime | str, func: FuncLike, args: Iterable[Any] | None, name: str | None,
         options: dict[str, Any]) -> Plan[dict[str, Any]]:
    req: dict[str, Any] = {"op": "cron", **job(func, args, **options)}
    if isinstance(schedule, SchedulingTime):
        req.update(schedule.to_dict())
        if req.get("start_at") is None:
            del req["start_at"]
    else:
        req["cron"] = schedule
    if name is not None:
        req["name"] = name
    return (yield req)["cron"]


def emit_event(event_id: str, func: FuncLike, args: Iterable[Any] | None, kwargs: dict[str, Any] | None,
               key: str | None, options: dict[str, Any]) -> Plan[dict[str, Any]]:
    return (yield from one({"op": "event", "event_id": event_id, **job(func, args, kwargs, key=key, **options)}))


def dead(limit: int) -> Plan[dict[str, list[dict[str, Any]]]]:
    reply = yield {"op": "dead", "limit": limit}
    return {"jobs": reply["jobs"], "events": reply["events"]}


def _request(op: str, **given: Any) -> dict[str, Any]:
    """A request of `op` with the fields given, those None left out (the daemon's default)."""
    return {"op": op, **{k: v for k, v in given.items() if v is not None}}


def target(op: str, key: str | None, func: FuncLike | None, pool: str | None) -> dict[str, Any]:
    return _request(op, key=key, func=None if func is None else func_name(func), pool=pool)


def drain(wait: float, off: bool) -> dict[str, Any]:
    return {"op": "drain", "off": True} if off else {"op": "drain", "wait": wait}


def cancel_waiting(state: str, func: FuncLike | None, key: str | None, pool: str | None,
                   dry_run: bool) -> Plan[int]:
    reply = yield _request("cancel", state=state, func=None if func is None else func_name(func), key=key,
                           pool=pool, dry_run=dry_run or None)
    return reply["matching"] if dry_run else reply["cancelled"]


def wait(job_id: int, timeout: float, states: Iterable[str] | None, reply_timeout: float) -> Plan[dict[str, Any]]:
    """Until the job is final (or in one of `states`): TimeoutError after `timeout` s. Each
    request holds well inside `reply_timeout` (the client's wait for a reply); longer waits loop."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        hold = min(remaining, max(1.0, reply_timeout - 5.0), 3600.0)
        req: dict[str, Any] = {"op": "wait", "job_id": job_id, "timeout": hold}
        if states is not None:
            req["states"] = list(states)
        reply = yield req
        if not reply.get("timed_out"):
            return reply["job"]
        if remaining <= 0:
            raise TimeoutError(f"job {job_id} is still {reply['job']['state']} after {timeout} s")


def set_pool(pool: str, key: str | None, job_id: int | None, cron: str | None) -> dict[str, Any]:
    return _request("set_pool", pool=pool, key=key, job_id=job_id, cron=cron)


def jobs(state: str | None, limit: int, func: FuncLike | None, key: str | None, pool: str | None) -> dict[str, Any]:
    return _request("jobs", limit=limit, state=state, func=None if func is None else func_name(func),
                    key=key, pool=pool)


def workflow_start(definition: dict[str, Any] | None, name: str, state: dict[str, Any] | None,
                   idempotency_key: str | None) -> Plan[int]:
    req: dict[str, Any] = {"op": "workflow_start", "state": state or {}}
    if definition is not None:
        req["definition"] = definition
    else:
        req["name"] = name
    if idempotency_key is not None:
        req["idempotency_key"] = idempotency_key
    return (yield req)["run_id"]


def workflows(state: str | None, limit: int) -> dict[str, Any]:
    return _request("workflows", limit=limit, state=state)


def workflow_wait(run_id: int, timeout: float, reply_timeout: float) -> Plan[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        hold = min(remaining, max(1.0, reply_timeout - 5.0), 3600.0)
        reply = yield {"op": "workflow_wait", "run_id": run_id, "timeout": hold}
        if not reply.get("timed_out"):
            return reply["run"]
        if remaining <= 0:
            raise TimeoutError(f"workflow run {run_id} is still running after {timeout} s")


def held(req: dict[str, Any] | list[Any]) -> bool:
    """Whether the daemon may hold this request's reply (a wait): every reply after it on
    the same connection waits behind it, so a client that shares one connection among
    many callers sends these on a connection of their own."""
    return type(req) is dict and (req["op"] in ("wait", "workflow_wait") or (req["op"] == "drain"
                                                                            and bool(req.get("wait"))))
