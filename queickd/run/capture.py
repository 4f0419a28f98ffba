"""Turns what a job's call did into a `RunReport`, for every runner (in a thread or in
another process): the stored form of its result, or its exception read once (text,
traceback, the `permanent`/`retry_after` hints, network class). Pure; the traceback is
formatted on failure only, so a successful run costs no more than its result's check.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from ..core.fate import CANCELLED, error_info, is_network_error, is_resource_exhaustion, storable_result
from ..core.policy.liveness import STALLED
from .base import RunReport

MAX_TEXT = 16 * 1024  # characters of a process run's error message (and traceback) kept
# An awaitable a job's call gives is awaited by its runner (run/aio.py) before its report is
# made; one that still reaches succeeded() is a runner's slip, failed here, never stored.
UNAWAITED = "unawaited"  # the error type of such a run


def succeeded(value: Any, runtime: float) -> RunReport:
    """The report of a call that returned `value`; an awaitable is no result."""
    if awaitable(value):
        return unawaited(value, runtime)
    return RunReport(True, storable_result(value), runtime=runtime)


_PLAIN = frozenset({dict, list, str, int, float, bool, tuple})  # what most results are: never awaitable


def awaitable(value: Any) -> bool:
    return value is not None and type(value) not in _PLAIN and inspect.isawaitable(value)


def unawaited(value: Any, runtime: float) -> RunReport:
    """A run that ended with an awaitable not awaited: a permanent failure, its coroutine
    closed unrun (no "never awaited" warning in the log)."""
    close = getattr(value, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # a foreign awaitable's close(): the failure stands
            pass
    name = getattr(value, "__qualname__", None)
    what = f"{type(value).__name__} {name}()" if isinstance(name, str) else type(value).__name__
    return RunReport(False, None, UNAWAITED, f"the job's run ended with an awaitable ({what}) that was "
                     "not awaited; it is not stored as a result", None, permanent=True, runtime=runtime)


def stopped(why: str, error: BaseException | None, runtime: float, timeout: float | None, how: str,
            stalled_after: float | None = None) -> RunReport:
    """The report of a run told to stop (`why`: fate.CANCELLED, "timeout" or liveness
    STALLED) that has ended, for a thread's run and an async task's alike; `how` says how
    it was stopped."""
    report = failed(error, runtime) if error is not None else RunReport(False, runtime=runtime)
    if why == CANCELLED:
        report.error_type, report.error_message = CANCELLED, "cancelled by an operator while it ran"
        return report
    report.error_type = why
    if why == STALLED:
        report.error_message = (f"{stall_text(stalled_after)} and {how} (it ended after {runtime:.1f} s)")
    else:
        report.error_message = (f"the job ran past its timeout of {timeout or 0:g} s and {how} "
                                f"(it ended after {runtime:.1f} s)")
    report.permanent = report.network = report.resource = False
    report.retry_after = None
    return report


def failed(exc: BaseException, runtime: float) -> RunReport:
    """The report of a run that raised `exc`. Its `retry_after`, a finite number, is kept as
    given (fate judges its range); anything else is no hint (and would not be JSON)."""
    err = error_info(exc)
    hint = getattr(exc, "retry_after", None)
    return RunReport(False, None, err["type"], err["message"], err["traceback"],
                     permanent=getattr(exc, "permanent", False) is True,
                     retry_after=float(hint) if finite(hint) else None,
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


def finite(v: object) -> bool:
    """Whether `v` is a finite int or float (not a bool): a number JSON holds."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def stall_text(stalled_after: float | None, cpu: bool = False) -> str:
    """Why a stalled run was stopped, the start of its error message."""
    said = "reported no progress and used no CPU time" if cpu else "reported no progress"
    return f"the job was stalled: it {said} for {stalled_after or 0:g} s (its stalled_after)"
