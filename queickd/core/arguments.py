"""The arguments of the wire protocol's operations other than submitting jobs (core/protocol.py
checks those): job and run ids, state and job filters, pause and pool targets, a `wait`'s
states, list limits, a `workflow_start`. Each reader takes the request object and returns
the checked value, or raises the protocol's bad_request."""

from __future__ import annotations

from typing import Any

from .job import State
from .protocol import MAX_ID, bad, normalize_func, opt_str, ranged, text_field


def job_id(obj: dict[str, Any]) -> int:
    return ranged("job_id", obj.get("job_id"), 1, MAX_ID, integer=True)


def state_filter(obj: dict[str, Any]) -> str | None:
    s = obj.get("state")
    if s is not None and s not in State.ALL:
        raise bad(f"state must be one of {', '.join(State.ALL)}")
    return s


def job_filters(obj: dict[str, Any]) -> dict[str, str | None]:
    """The func, key and pool filters of `jobs` and of a bulk `cancel` (absent: any)."""
    func = obj.get("func")
    return {"func": None if func is None else normalize_func(func), "key": opt_str(obj, "key"),
            "pool": opt_str(obj, "pool")}


def pause_target(obj: dict[str, Any]) -> tuple[str, str]:
    """A `pause` or `resume` request -> (kind, name): exactly one of key, func or pool."""
    given = [k for k in ("key", "func", "pool") if obj.get(k) is not None]
    if len(given) != 1:
        raise bad("give exactly one of key, func or pool")
    kind = given[0]
    return kind, normalize_func(obj[kind]) if kind == "func" else opt_str(obj, kind)  # type: ignore[return-value]


def states(obj: dict[str, Any]) -> frozenset[str]:
    """The `states` a `wait` waits for; the final states when absent."""
    v = obj.get("states")
    if v is None:
        return frozenset(State.FINAL)
    if not isinstance(v, list) or not v or any(s not in State.ALL for s in v):
        raise bad(f"states must be a non-empty list of {', '.join(State.ALL)}")
    return frozenset(v)


def limit(obj: dict[str, Any], default: int = 100, maximum: int = 10_000) -> int:
    return ranged("limit", obj.get("limit", default), 1, maximum, integer=True)


def pool_target(obj: dict[str, Any]) -> tuple[str, str, str]:
    """A `set_pool` request -> (kind, name, pool): exactly one of job_id, key or cron."""
    given = [k for k in ("job_id", "key", "cron") if obj.get(k) is not None]
    if len(given) != 1:
        raise bad("give exactly one of job_id, key or cron")
    pool = opt_str(obj, "pool")
    if pool is None:
        raise bad("pool is required")
    if given[0] == "job_id":
        return "job", str(job_id(obj)), pool
    return given[0], opt_str(obj, given[0]), pool  # type: ignore[return-value]


def run_id(obj: dict[str, Any]) -> int:
    return ranged("run_id", obj.get("run_id"), 1, MAX_ID, integer=True)


def workflow_start(obj: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None, dict[str, Any], str | None]:
    """A `workflow_start` -> (definition or None, name or None, state, idempotency_key):
    a definition (validated later, by core.workflow) or the name of a declared one."""
    definition, name = obj.get("definition"), obj.get("name")
    if definition is None and name is None:
        raise bad("give a definition, or the name of a workflow declared in the config")
    if definition is not None and not isinstance(definition, dict):
        raise bad("definition must be an object")
    if name is not None and (not isinstance(name, str) or not name):
        raise bad("name must be a non-empty string")
    state = obj.get("state", {})
    if not isinstance(state, dict):
        raise bad("state must be a JSON object")
    return definition, name, state, text_field("idempotency_key")(obj.get("idempotency_key"))

