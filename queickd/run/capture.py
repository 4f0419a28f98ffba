"""Turns what a job's call did into a `RunReport`, for every runner (in a thread or in
another process): the stored form of its result, or its exception read once (text,
traceback, the `permanent`/`retry_after` hints, network class). Pure; the traceback is
formatted on failure only, so a successful run costs no more than its result's check.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from ..core.fate import error_info, is_network_error, is_resource_exhaustion, storable_result
from .base import RunReport

MAX_TEXT = 16 * 1024  # characters of a process run's error message (and traceback) kept
# Jobs are called, never awaited (yet): a coroutine function is refused at enqueue where the
# loader can tell (run/definitions.py), and a run that returned an awaitable fails here.
# Running them instead changes succeeded() and the loader's coroutine refusal alone.
ASYNC_UNSUPPORTED = "async_unsupported"  # the error type of such a run
ASYNC_HINT = ("queickd does not run async jobs yet; make the job a plain def "
              "(one that calls asyncio.run(...) if it must await)")


def succeeded(value: Any, runtime: float) -> RunReport:
    """The report of a call that returned `value`; a returned awaitable is no success."""
    if awaitable(value):
        return unawaited(value, runtime)
    return RunReport(True, storable_result(value), runtime=runtime)


_PLAIN = frozenset({dict, list, str, int, float, bool, tuple})  # what most results are: never awaitable


def awaitable(value: Any) -> bool:
    return value is not None and type(value) not in _PLAIN and inspect.isawaitable(value)


def unawaited(value: Any, runtime: float) -> RunReport:
    """A run whose call returned an awaitable (an async def's coroutine): a permanent
    failure, its coroutine closed unrun (no "never awaited" warning in the log)."""
    close = getattr(value, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # a foreign awaitable's close(): the refusal stands
            pass
    name = getattr(value, "__qualname__", None)
    what = f"{type(value).__name__} {name}()" if isinstance(name, str) else type(value).__name__
    return RunReport(False, None, ASYNC_UNSUPPORTED, f"the job returned an awaitable ({what}), which was "
                     f"not run: {ASYNC_HINT}", None, permanent=True, runtime=runtime)


def failed(exc: BaseException, runtime: float) -> RunReport:
    """The report of a run that raised `exc`."""
    err = error_info(exc)
    return RunReport(False, None, err["type"], err["message"], err["traceback"],
                     permanent=getattr(exc, "permanent", False) is True,
                     retry_after=_retry_hint(getattr(exc, "retry_after", None)),
                     network=is_network_error(exc), resource=is_resource_exhaustion(exc), runtime=runtime)


def refused(error_type: str, message: str, runtime: float = 0.0) -> RunReport:
    """A run that could not start and never will (the function is no longer allowed)."""
    return RunReport(False, None, error_type, message, None, permanent=True, runtime=runtime)


def fit(report: RunReport) -> RunReport:
    """The report with its error text cut to what always crosses to the daemon (a socket
    packet, a capped pipe): the message's head and the traceback's tail, MAX_TEXT
    characters each (fate.error_info has cut the traceback to 8 KB already)."""
    msg, tb = report.error_message, report.traceback
    if msg is not None and len(msg) > MAX_TEXT:
        report.error_message = msg[:MAX_TEXT] + f"… [{len(msg)} characters in all]"
    if tb is not None and len(tb) > MAX_TEXT:
        report.traceback = "…" + tb[-MAX_TEXT:]
    return report


def _retry_hint(v: object) -> float | None:
    """A number the job gave as its retry delay, kept as given (fate judges its range);
    anything that is not a finite number is no hint (and would not be JSON)."""
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None
