"""Where and under which limits a job runs: the isolation values, the bounds of each limit,
and the one rule that picks thread or process for a job from its own fields, its
function's defaults (config file) and the daemon's flags.

Pure: no I/O, no processes. The protocol, the config file and the flags all check limits
through `check`, so a value refused at enqueue is refused in a config file too; the
runners read the decision from `decide`. A limit is never dropped silently: a job that
asks for `thread` and sets a limit a thread cannot hold (memory_mb, output_kb) is refused,
as is a limit out of its bounds. A thread holds a timeout (run/interrupt.py): a job or
function table may ask for `thread` with one. A bare limit, with no isolation asked for,
sends a job to a process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .numbers import in_range

THREAD = "thread"
PROCESS = "process"
ISOLATIONS = (THREAD, PROCESS)
LIMITS = ("timeout", "memory_mb", "output_kb")
PROCESS_LIMITS = ("memory_mb", "output_kb")  # the limits only a process can hold

MAX_TIMEOUT = 86400.0  # seconds: a day; longer is a service, not a job
MIN_MEMORY_MB = 32  # below this an interpreter cannot start its job
MAX_MEMORY_MB = 1 << 20  # a terabyte
MAX_OUTPUT_KB = 64 * 1024  # captured output kept in memory while the job runs
DEFAULT_OUTPUT_KB = 1024  # a process job's output cap when nothing sets one
FUNCTION_KEYS = frozenset({"isolation", *LIMITS, "credentials"})  # a [functions."m:f"] table


@dataclass(frozen=True, slots=True)
class Limits:
    """What a run may use; None: not limited (a process's output is always capped). A
    thread run (`isolation` THREAD) has a timeout and nothing else."""

    timeout: float | None = None
    memory_mb: int | None = None
    output_kb: int = DEFAULT_OUTPUT_KB
    credentials: tuple[str, ...] = ()  # systemd credentials passed on by name
    isolation: str = PROCESS


def check(name: str, v: Any) -> Any:
    """The value of one setting (`isolation` or a limit) as stored, or ValueError saying why."""
    if v is None:
        return None
    if name == "isolation":
        if v not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {v!r}")
        return v
    if name == "timeout":
        return in_range(name, v, 0, MAX_TIMEOUT, above=True,
                        message=f"timeout must be seconds above 0 and at most {MAX_TIMEOUT:.0f} (a day)")
    bounds = {"memory_mb": (MIN_MEMORY_MB, MAX_MEMORY_MB), "output_kb": (1, MAX_OUTPUT_KB)}.get(name)
    if bounds is None:
        raise ValueError(f"unknown sandbox setting {name!r}")
    why = " (what an interpreter needs)" if name == "memory_mb" else ""
    return in_range(name, v, *bounds, integer=True,
                    message=f"{name} must be an integer from {bounds[0]}{why} to {bounds[1]}")


def check_job(isolation: str | None, limits: Mapping[str, Any]) -> None:
    """A job (or function table) that asks for a thread and sets memory_mb or output_kb
    contradicts itself: a thread cannot be held to them, and running it in a process would
    ignore what it asked. A timeout a thread holds."""
    if isolation == THREAD and any(limits.get(k) is not None for k in PROCESS_LIMITS):
        raise ValueError("a job with memory_mb or output_kb runs in a process: "
                         "drop isolation = thread or the limit (a thread job may have a timeout)")


def check_functions(table: Any) -> dict[str, dict[str, Any]]:
    """The sandbox keys (FUNCTION_KEYS) of the `[functions."module:func"]` tables, checked."""
    if not isinstance(table, dict):
        raise ValueError("functions must be tables, [functions.\"module:func\"]")
    out: dict[str, dict[str, Any]] = {}
    for func, spec in table.items():
        if not isinstance(spec, dict):
            raise ValueError(f"functions.{func} must be a table")
        # The table's other keys are the function's job defaults: core/policy/resources.py
        # checks those (and refuses a key that is neither).
        try:
            d = {k: check(k, spec.get(k)) for k in ("isolation", *LIMITS)}
            check_job(d["isolation"], d)
        except ValueError as e:
            raise ValueError(f"functions.{func}: {e}") from None
        creds = spec.get("credentials", [])
        if not isinstance(creds, list) or not all(isinstance(c, str) and c and "/" not in c for c in creds):
            raise ValueError(f"functions.{func}: credentials must be a list of credential names")
        d["credentials"] = tuple(creds)
        module, _, name = func.rpartition(":" if ":" in func else ".")  # "pkg.mod.fn" is "pkg.mod:fn"
        out[f"{module}:{name}"] = d
    return out


@dataclass(frozen=True, slots=True)
class Defaults:
    """The daemon's (or worker's) own settings for every job, and the per-function tables."""

    isolation: str = THREAD
    timeout: float | None = None
    memory_mb: int | None = None
    output_kb: int | None = None
    functions: Mapping[str, Mapping[str, Any]] | None = None  # from check_functions


def decide(job: Any, d: Defaults) -> Limits | None:
    """None: run the job in a thread, untimed; else its limits, a thread's timeout when
    `isolation` is THREAD. The job's own fields win over its function's table, which wins
    over the daemon's flags. Where neither the job nor its function asks for an isolation,
    any limit from any of them means a process; where they ask for a thread, its timeout is
    theirs (the daemon's limits are for process jobs)."""
    fn = (d.functions or {}).get(job.func) or {}
    if (not fn and d.isolation == THREAD and d.timeout is None and d.memory_mb is None and d.output_kb is None
            and getattr(job, "isolation", None) is None
            and all(getattr(job, k, None) is None for k in LIMITS)):
        return None  # the common case, on every job: nothing asks for a process

    def pick(name: str) -> Any:
        v = getattr(job, name, None)
        if v is None:
            v = fn.get(name)
        return getattr(d, name) if v is None else v

    isolation = getattr(job, "isolation", None) or fn.get("isolation")
    own = [getattr(job, k, None) for k in LIMITS] + [fn.get(k) for k in LIMITS]
    if isolation is None:
        limited = any(v is not None for v in own) or any(getattr(d, k) is not None for k in LIMITS)
        isolation = PROCESS if limited else d.isolation
    if isolation == THREAD and all(getattr(job, k, None) is None and fn.get(k) is None for k in PROCESS_LIMITS):
        # The job (or function) asked for a thread; the daemon's limits stay off it.
        timeout = getattr(job, "timeout", None)
        timeout = fn.get("timeout") if timeout is None else timeout
        return None if timeout is None else Limits(timeout, isolation=THREAD)
    # A thread asked for with memory_mb or output_kb: protocol.check refused this at
    # enqueue, but a job and its function table may each say one half; a limit is never dropped.
    return Limits(pick("timeout"), pick("memory_mb"), pick("output_kb") or DEFAULT_OUTPUT_KB,
                  tuple(fn.get("credentials", ())))


def settings(c: object) -> Defaults:
    """The sandbox settings of a daemon's or worker's config, checked (ValueError: exit 78)."""
    values = {k: check(k, getattr(c, k)) for k in ("isolation", *LIMITS)}
    if values["isolation"] is None:
        raise ValueError("isolation must be thread or process")
    if values["isolation"] == THREAD and any(values[k] is not None for k in LIMITS):
        raise ValueError("the daemon's limits (timeout, memory_mb, output_kb) are for jobs that run in a "
                         "process: set isolation = process, or give a thread job its timeout on the job "
                         "or its function's table")
    for name in getattr(c, "sandbox_env", []):
        if not name or "=" in name or name.startswith("QUEICKD_"):
            raise ValueError(f"--sandbox-env {name!r}: give a variable's name (never a QUEICKD_ one)")
    return Defaults(**values, functions=check_functions(getattr(c, "functions", {}) or {}))
