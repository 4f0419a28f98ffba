"""The one place that decides a job's fate after it ran: succeeded, retry, park, or dead.

Pure functions of (job, what happened, now). What happened is a runner's report
(`run.base.RunReport`: plain data, so a run in another process is judged the same way);
the helpers that read an exception (network class, error text, storable result) are
here too, for the runners that build such a report. The worker pool calls these from
worker threads and hands the resulting Outcome to the store; nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import random
import socket
import sys
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import retry as retry_mod
from .job import Job, Outcome
from .policy import liveness
from .protocol import MAX_DEPTH, too_deep

if TYPE_CHECKING:
    from ..run.base import RunReport

CANCELLED = "cancelled"  # the error type of a run an operator's cancel stopped (thread or process)
# The error types of a run stopped by its own limits: its timeout, or found stalled.
STOPPED = frozenset({"timeout", liveness.STALLED})
MAX_RESULT_BYTES = 64 * 1024
MAX_TRACEBACK_CHARS = 8 * 1024
RESOURCE_ATTEMPTS = 5  # runs in all a job failed only by the host's fd limit gets, whatever its policy
RESOURCE_DELAY = 30.0  # seconds before such a run is tried again, times the attempts so far
# A retry_on_network job whose network-class failure came while the checker said the network
# was up: its own server is unreachable (or the checker has not noticed the outage yet). It
# runs again, its attempt spent, at least this many runs in all whatever its policy...
NETWORK_ATTEMPTS = 10
NETWORK_DELAY = 60.0  # ... this many seconds apart without a policy (a safety sweep's default)
RATE_WAIT_MAX = 86400.0  # seconds a rate key may be told to wait (a longer Retry-After is no rate)
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})

_NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ENETDOWN", "ENETUNREACH", "ENETRESET", "ECONNABORTED", "ECONNRESET", "ECONNREFUSED",
        "EHOSTDOWN", "EHOSTUNREACH", "ETIMEDOUT", "EPIPE", "ENOTCONN", "EADDRNOTAVAIL",
    )
    if hasattr(errno, name)
)
_NETWORK_TYPES = (ConnectionError, TimeoutError, socket.gaierror, socket.herror)
# And, from modules this one does not import (they would weigh on every process job's
# zygote): looked up where a job has imported them, as a job raising one of them has.
_HTTP_NETWORK = ("RemoteDisconnected", "IncompleteRead", "BadStatusLine")


def _network_types() -> tuple[type[BaseException], ...]:
    types = _NETWORK_TYPES
    if (ue := sys.modules.get("urllib.error")) is not None:
        types += (ue.URLError,)
    if (hc := sys.modules.get("http.client")) is not None:
        types += tuple(getattr(hc, name) for name in _HTTP_NETWORK)
    return types


def is_network_error(exc: BaseException) -> bool:
    """True for failures that mean "the network is not there": connection, timeout, DNS,
    URLError and http.client's disconnects, also when wrapped (its __cause__/__context__).
    A plain OSError counts only with a network errno (a missing file is not a network)."""
    types = _network_types()
    ue = sys.modules.get("urllib.error")
    for e in _chain(exc):
        if ue is not None and isinstance(e, ue.HTTPError):
            return False  # the server answered: that is not a network failure
        if isinstance(e, types):
            return True
        if isinstance(e, OSError) and e.errno in _NETWORK_ERRNOS:
            return True
    return False


def is_resource_exhaustion(exc: BaseException) -> bool:
    """True when the run failed because the process or the system ran out of file
    descriptors (EMFILE, ENFILE), also when wrapped: the host's fault, not the job's."""
    return any(isinstance(e, OSError) and e.errno in _RESOURCE_ERRNOS for e in _chain(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it wraps (its __cause__, else its __context__): at most 8 errors."""
    e: BaseException | None = exc
    for _ in range(8):
        if e is None:
            return
        yield e
        # `raise X from None` says the earlier error does not explain this one.
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def clean(text: str) -> str:
    """Text that can be stored and sent as UTF-8: lone surrogates (from file names decoded
    with surrogateescape, say) become backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # an exception whose __str__ fails must still be recorded
        return f"<unprintable {type(exc).__name__}>"


def error_info(exc: BaseException) -> dict[str, Any]:
    try:
        tb = "".join(traceback.format_exception(exc))
    except Exception:
        tb = "<traceback could not be formatted>"
    if len(tb) > MAX_TRACEBACK_CHARS:
        tb = "…" + tb[-MAX_TRACEBACK_CHARS:]
    return {"type": type(exc).__name__, "message": clean(_safe_str(exc)), "traceback": clean(tb)}


_strict_json = json.JSONEncoder(ensure_ascii=False, allow_nan=False)  # built once, not per result


def storable_result(value: Any, limit: int = MAX_RESULT_BYTES) -> Any:
    """A result as it can be stored: itself if it is JSON within the limit, else a string
    that says what it was (the job still succeeded)."""
    if value is None:  # most jobs return nothing
        return None
    deep = f"<result nested more than {MAX_DEPTH} levels deep; not stored>"  # it could not be read back
    try:
        text = _strict_json.encode(value)
        size = len(text.encode("utf-8"))
        if text.count("[") + text.count("{") > MAX_DEPTH and too_deep(value, MAX_DEPTH):
            return deep
    except RecursionError:
        return deep
    except (TypeError, ValueError):  # not JSON (UnicodeEncodeError, a lone surrogate, included)
        try:
            text = repr(value)
        except Exception:
            text = f"<unprintable {type(value).__name__}>"
        value = clean(text[:limit])
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    if size > limit:
        return f"<result of {size} bytes, over the {limit}-byte limit; not stored>"
    return value


def after_success(job: Job, report: RunReport) -> Outcome:
    return Outcome.succeeded(job.id, report.result, job.workflow_run, report.output)


def after_failure(
    job: Job,
    report: RunReport,
    now: float,
    network_checker: bool = False,
    rand: random.Random | None = None,
    network_up: bool = False,
) -> Outcome:
    """A failed attempt: park it for the network, retry it later, or give up (dead).

    `job.attempts` already counts the attempt that failed; runs lost to a crash (the job's
    `orphaned` count, bounded by --max-orphan-requeues) are not held against it (`_spent`).
    A network-class failure of a
    job that asked for network replay is parked without spending its retries when a
    network checker runs to release it and does not say the network is up (`network_up`).
    While it says up, the failure is the job's own server's: the job runs again with its
    attempt spent (at least NETWORK_ATTEMPTS runs in all, NETWORK_DELAY s apart without a
    policy), so a server gone for good ends in a dead letter, not in a park and release at
    every sweep for ever. Without a checker it follows its retry policy.

    The job's exception may have said more about itself, for errors the job knows better
    than the policy (the runner put it in the report): `permanent = True` (bad
    credentials, a missing channel) makes the job dead at once, since retrying cannot
    help; `retry_after` (seconds, e.g. an HTTP 429's Retry-After) replaces the policy's
    delay for the next attempt.

    A run failed by the host running out of file descriptors (`report.resource`) is not
    the job's fault: it is tried again later (up to RESOURCE_ATTEMPTS runs even without a
    retry policy) and its outcome is blameless, so it never grows a failure streak nor
    pauses the job's key or function.

    A job with a rate_limit whose run says `retry_after` (queickd.RateLimited, an HTTP
    429's Retry-After) was refused for its key's rate: it waits again in its place, queued,
    its attempt not counted, and its key starts nothing before then (core/policy/rates.py).

    A run an operator's cancel stopped (error type CANCELLED) is cancelled: its job was
    made so in the store before the run was stopped, and neither retries nor dies.

    A run stopped at its timeout or found stalled by its liveness watch (error types in
    STOPPED: policy/liveness.py's `stalled` is judged as a timeout) follows its retry
    policy alone: what the job raised as it was stopped says nothing of it (no
    `permanent`, `retry_after` or network hint is read).

    Whatever the fate, the run's captured output (report.output) goes with it.
    """
    err, out = report.error(), report.output
    if report.error_type == CANCELLED:
        return Outcome.cancelled(job.id, err, out)
    if report.error_type in STOPPED:
        if job.retry is not None and _spent(job) < job.max_attempts:
            return Outcome.retry_at(job.id, now + _retry_delay(job, None, rand), err, out)
        return Outcome.dead(job.id, err, job.workflow_run, out)
    if report.resource and not report.permanent:
        if _spent(job) < max(job.max_attempts, RESOURCE_ATTEMPTS):
            return dataclasses.replace(Outcome.retry_at(job.id, now + RESOURCE_DELAY * _spent(job), err, out),
                                       blameless=True)
        return dataclasses.replace(Outcome.dead(job.id, err, output=out), blameless=True)
    if report.permanent:
        return Outcome.dead(job.id, err, job.workflow_run, out)
    if job.rate_limit is not None and report.retry_after is not None and 0 <= report.retry_after <= RATE_WAIT_MAX:
        # Its service's rate, not the job's failure: its key waits, the job keeps its place.
        return Outcome.rate_limited(job.id, now + report.retry_after, err, out)
    if job.retry_on_network and network_checker and report.network:
        if not network_up:
            return Outcome.waiting_network(job.id, err, out)
        if _spent(job) < max(job.max_attempts, NETWORK_ATTEMPTS):
            delay = _retry_delay(job, report.retry_after, rand) if job.retry is not None else NETWORK_DELAY
            return Outcome.retry_at(job.id, now + delay, err, out)
        return Outcome.dead(job.id, err, job.workflow_run, out)
    if job.retry is not None and _spent(job) < job.max_attempts:
        return Outcome.retry_at(job.id, now + _retry_delay(job, report.retry_after, rand), err, out)
    return Outcome.dead(job.id, err, job.workflow_run, out)


def _retry_delay(job: Job, asked: float | None, rand: random.Random | None) -> float:
    if asked is not None and 0 <= asked <= 86400:
        return asked
    return retry_mod.delay(job.retry, _spent(job), rand)  # type: ignore[arg-type]


def _spent(job: Job) -> int:
    """The attempts that count against max_attempts: the runs started, less those lost to a
    crash of their daemon or worker (re-queued as orphans: not the job's failure)."""
    return max(1, job.attempts - job.orphaned)
